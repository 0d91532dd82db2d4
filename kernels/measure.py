"""Correctness against the float64 reference, and latency on each backend.

- correctness: run the variant on every correctness shape and compare with the family's float64
  reference using a tolerance by dtype and reduction length; a failure keeps the mismatch count and
  the first few mismatches as text (that text is what the agent sees).
- cuda: ``triton.testing.do_bench`` (L2 flushed between runs, warmup, every sample kept) or
  ``do_bench_cudagraph`` for families with short launches; p20/p50/p80 from the samples.
- model: the family's analytic estimate from the real compile stats, labelled evidence=model.
"""

from __future__ import annotations

import contextlib
import platform
from typing import Any, Iterator, Sequence

import torch
import triton

from kernels.dtypes import DTYPE_BYTES, TORCH_DTYPES  # noqa: F401  (re-exported for callers)
from kregress.core.family import Family
from kregress.core.records import CompileStats, Correctness, Measurement


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
    # An infinite reference value (e.g. lse = +inf of a row that sees no key) must be matched exactly.
    mism = ((diff > allowed) & finite_ref) | (torch.isinf(ref64) & (out64 != ref64))
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
    atols, rtols, round_abs, round_rel = [], [], [], []
    for shape in shapes:
        inputs = family.make_inputs(shape, TORCH_DTYPES[dtype], device, seed, params)
        out = family.run(inputs, config, params)
        ref = family.reference({k: v.cpu() if torch.is_tensor(v) else v for k, v in inputs.items()}, params)
        atol, rtol = family.tolerance(shape, dtype, base_tol, params)
        tols.append(max(atol, rtol))
        atols.append(atol)
        rtols.append(rtol)
        # A family may return several outputs (out, lse): each is compared with its reference.
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        refs = list(ref) if isinstance(ref, (tuple, list)) else [ref]
        if len(outs) != len(refs):
            mismatches += 1
            samples.append(f"[{family.shape_label(shape)}] {len(outs)} output(s), reference has {len(refs)}")
            continue
        for i, (o, r) in enumerate(zip(outs, refs)):
            if torch.is_tensor(o) and torch.is_tensor(r) and o.is_floating_point():
                rounded = compare(r.to(o.dtype), r, atol, rtol)  # the output format's own error
                round_abs.append(rounded["max_abs"])
                round_rel.append(rounded["max_rel"])
            res = compare(o, r, atol, rtol)
            max_abs = max(max_abs, res["max_abs"])
            max_rel = max(max_rel, res["max_rel"])
            nan_inf |= res["nan_inf"]
            if res["mismatches"]:
                mismatches += max(res["mismatches"], 1)
                which = f" output {i}" if len(outs) > 1 else ""
                samples.append(f"[{family.shape_label(shape)}{which}] {res['sample']}")
    return Correctness(
        ok=mismatches == 0 and not nan_inf,
        max_abs_err=max_abs,
        max_rel_err=max_rel,
        nan_inf=nan_inf,
        mismatches=mismatches,
        tolerance=max(tols) if tols else base_tol,
        shapes_checked=[family.shape_label(s) for s in shapes],
        mismatch_sample=" | ".join(samples)[:1200],
        atol=max(atols) if atols else base_tol,
        rtol=max(rtols) if rtols else base_tol,
        dtype=dtype,
        ref_rounding_abs=max(round_abs) if round_abs else None,
        ref_rounding_rel=max(round_rel) if round_rel else None,
    )


def _versions() -> dict[str, str]:
    return {"torch_version": torch.__version__, "triton_version": triton.__version__}


def measurement_from_samples(family: Family, shape: dict, samples: list[float], dtype: str, params: dict,
                             evidence: str, device: str, identity: dict | None = None,
                             batch: str = "") -> Measurement:
    """A Measurement from samples. Model evidence is one estimate: p20/p80 stay None."""
    s = sorted(samples)

    def q(p: float) -> float:
        # linear interpolation between order statistics, as numpy's default quantile
        pos = p * (len(s) - 1)
        lo = int(pos)
        hi = min(lo + 1, len(s) - 1)
        return s[lo] + (s[hi] - s[lo]) * (pos - lo)

    p50 = q(0.5)
    spread = evidence != "model" and len(s) > 1
    return Measurement(
        shape=family.shape_label(shape),
        samples_ms=list(samples),
        p20_ms=q(0.2) if spread else None,
        p50_ms=p50,
        p80_ms=q(0.8) if spread else None,
        tflops=family.flops(shape, params) / (p50 * 1e-3) / 1e12 if p50 > 0 else 0.0,
        gbps=family.bytes_moved(shape, DTYPE_BYTES[dtype], params) / (p50 * 1e-3) / 1e9 if p50 > 0 else 0.0,
        evidence=evidence,
        device=device,
        batch=batch,
        **(identity or {}),
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
        fn = lambda inputs=inputs: family.run(inputs, config, params)  # noqa: E731
        start = device_identity()
        if family.use_cudagraph():
            samples = do_bench_cudagraph(fn, rep=rep_ms, return_mode="all")
        else:
            samples = do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="all")
        out.append(measurement_from_samples(family, shape, list(map(float, samples)), dtype, params, "cuda", device_name,
                                            identity=measurement_identity(start, device_identity())))
    return out


# --- device identity, clock locking and same-batch timing ----------------------------------------

IDENTITY_FIELDS = ("gpu_name", "gpu_uuid", "host", "driver", "sm_clock_mhz", "mem_clock_mhz")


def _nvidia_smi(gpu: str) -> dict:
    """uuid, driver and current SM / memory clocks of ``gpu`` (a UUID, or an index when the UUID is
    unknown: CUDA_VISIBLE_DEVICES may renumber) from nvidia-smi ({} when it is absent or fails)."""
    import shutil
    import subprocess

    exe = shutil.which("nvidia-smi")
    if not exe:
        return {}
    try:
        out = subprocess.run(
            [exe, f"--id={gpu}", "--query-gpu=uuid,driver_version,clocks.sm,clocks.mem",
             "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip().splitlines()
    except (OSError, subprocess.SubprocessError):
        return {}
    if not out:
        return {}
    parts = [p.strip() for p in out[0].split(",")]
    if len(parts) < 4:
        return {}

    def num(x: str) -> float | None:
        try:
            return float(x)
        except ValueError:
            return None

    return {"gpu_uuid": parts[0], "driver": parts[1], "sm_clock_mhz": num(parts[2]), "mem_clock_mhz": num(parts[3])}


def device_identity() -> dict:
    """Which GPU this process times on: name, UUID, host, driver, current SM and memory clocks.

    torch.cuda gives the name and (torch >= 2.x) the UUID; nvidia-smi, where present, the driver and
    the clocks. Fields it cannot read are "" / None, never guessed.
    """
    ident: dict = {"gpu_name": "", "gpu_uuid": "", "host": platform.node(), "driver": "",
                   "sm_clock_mhz": None, "mem_clock_mhz": None}
    if not torch.cuda.is_available():
        return ident
    idx = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(idx)
    ident["gpu_name"] = props.name
    uuid = getattr(props, "uuid", None)
    if uuid is not None:
        ident["gpu_uuid"] = str(uuid) if str(uuid).startswith("GPU-") else f"GPU-{uuid}"
    smi = _nvidia_smi(ident["gpu_uuid"] or str(idx))
    for k, v in smi.items():
        if v not in (None, "") and (k != "gpu_uuid" or not ident["gpu_uuid"]):
            ident[k] = v
    if torch.version.cuda and not ident["driver"]:
        ident["driver"] = f"cuda runtime {torch.version.cuda}"
    return ident


def measurement_identity(start: dict, end: dict, clocks_locked: str = "") -> dict:
    """The Measurement fields of a batch's identity reads at its start and end."""
    return {"gpu_name": start.get("gpu_name", ""), "gpu_uuid": start.get("gpu_uuid", ""),
            "host": start.get("host", ""), "driver": start.get("driver", ""),
            "sm_clock_mhz_start": start.get("sm_clock_mhz"), "sm_clock_mhz_end": end.get("sm_clock_mhz"),
            "mem_clock_mhz_start": start.get("mem_clock_mhz"), "mem_clock_mhz_end": end.get("mem_clock_mhz"),
            "clocks_locked": clocks_locked}


def batch_measurements(family: Family, baseline: dict, configs: dict[str, dict], shapes: list[dict], dtype: str,
                       params: dict, warmup_ms: int, rep_ms: int, seed: int = 0, batch_id: str = "",
                       rounds: int = 4, order: str = "interleaved",
                       lock_clocks: tuple[int, int] | None = None) -> dict[str, list[Measurement]]:
    """Time the baseline and every config of ``configs`` in this process, interleaved per shape.

    For each shape, ``kregress.core.batching.run_batch`` lays out baseline, v1, baseline, v2, ...
    ``rounds`` times (or randomised blocks) and each slot runs ``do_bench`` for ``rep_ms / rounds``
    ms, so every config gets about ``rep_ms`` of samples and the baseline is timed between every two
    variants. Returns {"baseline": [...], key: [...]} with one Measurement per shape, each carrying
    the batch id and the device identity read at the start and end of the batch. With
    ``lock_clocks=(sm_mhz, mem_mhz)`` the GPU clocks are locked with ``triton.testing.set_gpu_clock``
    (needs root and nvidia-smi; it locks GPU 0 and resets the clocks afterwards) for the batch, and the
    Measurements say so in ``clocks_locked``.
    """
    from triton.testing import do_bench, do_bench_cudagraph

    device_name = torch.cuda.get_device_name()
    all_cfgs = {"baseline": baseline, **configs}
    slot_ms = max(1, int(round(rep_ms / rounds)))
    fns_by_shape: dict[int, dict] = {}

    def slot_timer(si: int, key: str, slot) -> list[float]:
        if si not in fns_by_shape:  # the shape's inputs, made once; every config warmed so no slot times a compile
            fns_by_shape.clear()
            inputs = family.make_inputs(shapes[si], TORCH_DTYPES[dtype], "cuda", seed, params)
            fns_by_shape[si] = {k: (lambda c=c, inputs=inputs: family.run(inputs, c, params)) for k, c in all_cfgs.items()}
            for fn in fns_by_shape[si].values():
                fn()
            torch.cuda.synchronize()
        fn = fns_by_shape[si][key]
        if family.use_cudagraph():
            return do_bench_cudagraph(fn, rep=slot_ms, return_mode="all")
        return do_bench(fn, warmup=max(1, warmup_ms // rounds), rep=slot_ms, return_mode="all")

    with clock_lock(lock_clocks) as locked:
        return time_slots(family, list(configs), shapes, slot_timer, dtype, params, rounds=rounds, order=order,
                          seed=seed, batch_id=batch_id, identity=device_identity, device_name=device_name,
                          clocks_locked=locked)


@contextlib.contextmanager
def clock_lock(lock_clocks: Sequence[int] | None) -> Iterator[str]:
    """The GPU clocks locked at ``(sm_mhz, mem_mhz)`` for the block with ``triton.testing.set_gpu_clock``
    (needs root and nvidia-smi; it locks GPU 0 and resets the clocks afterwards), or nothing when None.
    Yields what the Measurements say in ``clocks_locked`` ("" when not locked). Every timing batch, a
    config's or a patch's, locks through here."""
    if not lock_clocks:
        yield ""
        return
    from triton.testing import set_gpu_clock

    sm, mem = (int(x) for x in lock_clocks)
    with set_gpu_clock(sm, mem):
        yield f"sm {sm} MHz, mem {mem} MHz (triton.testing.set_gpu_clock)"


def time_slots(family: Family, keys: list[str], shapes: list[dict], slot_timer, dtype: str, params: dict,
               rounds: int, order: str, seed: int, batch_id: str, identity, device_name: str,
               clocks_locked: str = "", evidence: str = "cuda") -> dict[str, list[Measurement]]:
    """The batch protocol, device-free: per shape, ``kregress.core.batching.run_batch`` lays out the slots
    (baseline, v1, baseline, v2, ... ``rounds`` times, or randomised blocks) and ``slot_timer(shape index,
    key, slot) -> samples (ms)`` times each one (do_bench on a GPU; a fake device timer in the tests);
    returns {"baseline": [...], key: [...]} with one Measurement per shape, each carrying the batch id and
    the identity read at the start and end of its shape's batch."""
    from kregress.core.batching import BASELINE, run_batch

    out: dict[str, list[Measurement]] = {k: [] for k in [BASELINE, *keys]}
    for si, shape in enumerate(shapes):
        batch = run_batch(f"{batch_id}/s{si}" if len(shapes) > 1 else batch_id, keys,
                          lambda key, slot, si=si: slot_timer(si, key, slot), rounds=rounds, order=order,
                          seed=seed + si, identity=identity)
        ident = measurement_identity(batch.device, batch.device_end, clocks_locked)
        for k in out:
            out[k].append(measurement_from_samples(family, shape, batch.samples[k], dtype, params, evidence,
                                                   device_name, identity=ident, batch=batch_id))
    return out
