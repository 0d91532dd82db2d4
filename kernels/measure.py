"""Correctness against the float64 reference, and latency on each backend.

- correctness: run the variant on every correctness shape and compare with the family's float64
  reference using a tolerance by dtype and reduction length; a failure keeps the mismatch count and
  the first few mismatches as text (that text is what the agent sees).
- cuda: ``triton.testing.do_bench`` (L2 flushed between runs, warmup, every sample kept) or
  ``do_bench_cudagraph`` for families with short launches; p20/p50/p80 from the samples.
- model: the family's analytic estimate from the real compile stats, labelled evidence=model.
"""

from __future__ import annotations

import platform
from typing import Any

import torch
import triton

from kregress.core.records import CompileStats, Correctness, Measurement
from kregress.core.family import Family

TORCH_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
DTYPE_BYTES = {"fp16": 2, "bf16": 2, "fp32": 4}


def compare(out: torch.Tensor, ref: torch.Tensor, atol: float, rtol: float, show: int = 5) -> dict[str, Any]:
    """Elementwise |out - ref| <= atol + rtol * |ref|, in float64; NaN/Inf in out is a mismatch."""
    out64 = out.detach().to("cpu", torch.float64)
    ref64 = ref.detach().to("cpu", torch.float64)
    if out64.shape != ref64.shape:
        return {"ok": False, "max_abs": float("inf"), "max_rel": float("inf"), "nan_inf": False, "mismatches": -1,
                "sample": f"shape {tuple(out64.shape)} != reference {tuple(ref64.shape)}"}
    finite_ref = torch.isfinite(ref64)
    bad_vals = ~torch.isfinite(out64) & finite_ref
    diff = (out64 - ref64).abs()
    diff = torch.where(bad_vals, torch.full_like(diff, float("inf")), diff)
    allowed = atol + rtol * ref64.abs()
    mism = (diff > allowed) & finite_ref
    n_mism = int(mism.sum())
    rel = diff / ref64.abs().clamp_min(atol)
    sample = ""
    if n_mism:
        idx = mism.nonzero()[:show]
        parts = [f"{tuple(i.tolist())}: got {out64[tuple(i)].item():.5g}, want {ref64[tuple(i)].item():.5g}" for i in idx]
        sample = f"{n_mism} of {mism.numel()} elements outside atol={atol:.3g} rtol={rtol:.3g}; first: " + "; ".join(parts)
    return {
        "ok": n_mism == 0,
        "max_abs": float(diff[finite_ref].max()) if diff.numel() else 0.0,
        "max_rel": float(rel[finite_ref].max()) if rel.numel() else 0.0,
        "nan_inf": bool(bad_vals.any()),
        "mismatches": n_mism,
        "sample": sample,
    }


def check_correctness(family: Family, config: dict, shapes: list[dict], dtype: str, base_tol: float,
                      params: dict, device: str, interpret: bool, seed: int = 0) -> Correctness:
    max_abs = max_rel = 0.0
    nan_inf = False
    mismatches = 0
    samples = []
    tols = []
    for shape in shapes:
        inputs = family.make_inputs(shape, TORCH_DTYPES[dtype], device, seed, params)
        out = family.run(inputs, config, params)
        ref = family.reference({k: v.cpu() if torch.is_tensor(v) else v for k, v in inputs.items()}, params)
        atol, rtol = family.tolerance(shape, dtype, base_tol, params)
        tols.append(max(atol, rtol))
        res = compare(out, ref, atol, rtol)
        max_abs = max(max_abs, res["max_abs"])
        max_rel = max(max_rel, res["max_rel"])
        nan_inf |= res["nan_inf"]
        if res["mismatches"]:
            mismatches += max(res["mismatches"], 1)
            samples.append(f"[{family.shape_label(shape)}] {res['sample']}")
    return Correctness(
        ok=mismatches == 0 and not nan_inf,
        max_abs_err=max_abs,
        max_rel_err=max_rel,
        nan_inf=nan_inf,
        mismatches=mismatches,
        tolerance=max(tols) if tols else base_tol,
        shapes_checked=[family.shape_label(s) for s in shapes],
        mismatch_sample=" | ".join(samples)[:1200],
    )


def _versions() -> dict[str, str]:
    return {"torch_version": torch.__version__, "triton_version": triton.__version__}


def measurement_from_samples(family: Family, shape: dict, samples: list[float], dtype: str, params: dict,
                             evidence: str, device: str) -> Measurement:
    s = sorted(samples)

    def q(p: float) -> float:
        # linear interpolation between order statistics, as numpy's default quantile
        pos = p * (len(s) - 1)
        lo = int(pos)
        hi = min(lo + 1, len(s) - 1)
        return s[lo] + (s[hi] - s[lo]) * (pos - lo)

    p50 = q(0.5)
    return Measurement(
        shape=family.shape_label(shape),
        samples_ms=list(samples),
        p20_ms=q(0.2),
        p50_ms=p50,
        p80_ms=q(0.8),
        tflops=family.flops(shape, params) / (p50 * 1e-3) / 1e12 if p50 > 0 else 0.0,
        gbps=family.bytes_moved(shape, DTYPE_BYTES[dtype], params) / (p50 * 1e-3) / 1e9 if p50 > 0 else 0.0,
        evidence=evidence,
        device=device,
        **_versions(),
    )


def model_measurements(family: Family, config: dict, shapes: list[dict], dtype: str, params: dict,
                       stats: CompileStats, hardware: Any) -> list[Measurement]:
    """Analytic estimates (evidence=model): one 'sample' per shape, never a measured time."""
    out = []
    for shape in shapes:
        est = family.model_latency_ms(shape, config, stats, hardware, DTYPE_BYTES[dtype], params)
        out.append(measurement_from_samples(family, shape, [est], dtype, params, "model",
                                            f"model of {hardware.device} ({platform.machine()} host)"))
    return out


def cuda_measurements(family: Family, config: dict, shapes: list[dict], dtype: str, params: dict,
                      warmup_ms: int, rep_ms: int, seed: int = 0) -> list[Measurement]:
    """Time each shape on the current CUDA device; every sample is kept (return_mode='all')."""
    from triton.testing import do_bench, do_bench_cudagraph

    device_name = torch.cuda.get_device_name()
    out = []
    for shape in shapes:
        inputs = family.make_inputs(shape, TORCH_DTYPES[dtype], "cuda", seed, params)
        fn = lambda: family.run(inputs, config, params)  # noqa: E731
        if family.use_cudagraph():
            samples = do_bench_cudagraph(fn, rep=rep_ms, return_mode="all")
        else:
            samples = do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="all")
        out.append(measurement_from_samples(family, shape, list(map(float, samples)), dtype, params, "cuda", device_name))
    return out
