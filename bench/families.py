"""What each kernel family costs the pipeline on a CPU host: cold AOT compile and interpreter checks.

For every family and its shipped spec (gemm, gemm_fp8, grouped_gemm_fp8 contiguous and masked,
mla_decode, attention, attention on the DeepSeek 192/128 prefill spec):

* compile   seconds to compile one variant ahead of time for the spec's arch (sm_90), cold: a fresh
            TRITON_CACHE_DIR per family and configs that differ in their constexprs, so nothing is
            reused. The configs are the spec's baseline and one-step neighbours of it (the next
            allowed value of one tunable at a time, in space order), i.e. what the local agent
            proposes first. Registers, spills and shared memory come along.
* interp    seconds of one interpreter correctness check (TRITON_INTERPRET=1, float64 reference
            included) of the baseline on each of the spec's correctness_shapes, one job per shape.
            A first job on the first shape warms the worker (imports, AST rewrite) and is not counted.

Both run through ``python -m kernels.worker``, the child process the benchmark resource uses, so
the numbers are what a sweep pays per variant. Wall times on the interpreter mean nothing about the
GPU; they size correctness_shapes and the test suite. The FP8 families run for real in the
interpreter: Triton 3.9's CPU interpreter executes tl.dot on float8e4nv operands (nothing is
dequantized before the kernel).

With ``--cuda`` (a GPU host; scripts/gpu_check.sh) each spec's baseline is instead checked on the
GPU against the float64 reference (correctness_shapes and the cheapest timed shape whose reference
the host can afford, ``gpu_correctness_shapes``) and timed on every shape of its shape_matrix with the cuda
backend; the table gives TFLOP/s against the FP8 peak (fp8_e4m3 specs: params.fp8_peak_tflops or 2 x
hardware.limits.peak_tflops) or the BF16 peak, and GB/s against HBM for mla_decode.

    .venv/bin/python bench/families.py                 # every family, 3 configs each
    .venv/bin/python bench/families.py --configs 5 --families mla_decode --json out.json
    .venv/bin/python bench/families.py --cuda --families gemm_fp8 grouped_gemm_fp8
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# label -> spec; the family is the spec's kernel_family
SPECS = {
    "gemm": "specs/gemm_h100_bf16.yaml",
    "gemm_fp8": "specs/gemm_fp8_h100.yaml",
    "grouped_gemm_fp8": "specs/grouped_gemm_fp8_h100.yaml",
    "grouped_gemm_fp8_masked": "specs/grouped_gemm_fp8_masked_h100.yaml",
    "mla_decode": "specs/mla_decode_h100_bf16.yaml",
    "attention": "specs/attention_prefill_h100_bf16.yaml",
    "attention_deepseek": "specs/attention_prefill_deepseek_h100.yaml",
}


def neighbour_configs(family, baseline: dict, params: dict, n: int) -> list[dict]:
    """The baseline, then one-step-larger neighbours inside the space, up to n configs."""
    out = [dict(baseline)]
    for key, values in family.space.params.items():
        for step in (1, -1):
            if len(out) >= n:
                return out
            pos = values.index(baseline[key]) + step
            if 0 <= pos < len(values):
                cand = dict(baseline, **{key: values[pos]})
                if family.space.check(cand, params) is None and cand not in out:
                    out.append(cand)
                    break
    return out


def bench_family(name: str, n_configs: int) -> dict:
    from kregress.core.bind import load_bound
    from kregress.core.records import config_label
    from resources.workers import Worker, worker_env

    bound = load_bound(REPO / SPECS[name])
    spec, fam = bound.spec, bound.family
    label, name = name, spec.kernel_family
    result = {"family": label, "spec": SPECS[label], "compile": [], "interp": []}

    with tempfile.TemporaryDirectory(prefix=f"kregress-bench-{name}-") as cache:
        worker = Worker(worker_env(Path(cache), interpret=False))  # TRITON_CACHE_DIR=<cache>/triton, fresh
        worker.wait_ready(180)
        try:
            for cfg in neighbour_configs(fam, spec.baseline, spec.params, n_configs):
                job = {"op": "compile", "family": name, "config": cfg, "dtype": spec.dtype, "arch": spec.hardware.arch,
                       "limits": spec.hardware.limits.model_dump(), "params": spec.params}
                t0 = time.perf_counter()
                res = worker.call(job, 600)
                wall = time.perf_counter() - t0
                row = {"config": config_label(cfg), "wall_s": wall}
                if "stats" in res:
                    st = res["stats"]
                    row.update(compile_s=st["compile_seconds"], regs=st["regs_per_thread"], spill=st["spill_bytes"],
                               smem=st["smem_bytes"], error="")
                else:
                    row.update(compile_s=wall, regs=None, spill=None, smem=None, error=res.get("error", "?"))
                result["compile"].append(row)
        finally:
            worker.kill()

        worker = Worker(worker_env(Path(cache), interpret=True))
        worker.wait_ready(180)
        try:
            def check(shape: dict) -> tuple[dict, float]:
                job = {"op": "correctness", "family": name, "config": spec.baseline, "dtype": spec.dtype,
                       "shapes": [shape], "tolerance": spec.constraints.numeric_tolerance, "params": spec.params,
                       "device": "cpu", "interpret": True, "seed": 0}
                t0 = time.perf_counter()
                res = worker.call(job, 600)
                return res, time.perf_counter() - t0

            check(spec.correctness_shapes[0])  # warm-up, not counted
            for shape in spec.correctness_shapes:
                res, wall = check(shape)
                c = res.get("correctness") or {}
                result["interp"].append({"shape": fam.shape_label(shape), "seconds": wall, "ok": c.get("ok"),
                                         "max_abs_err": c.get("max_abs_err"), "error": res.get("error", "")})
        finally:
            worker.kill()
    return result


# The float64 reference runs on the host CPU; a shape_matrix shape joins the GPU correctness check only
# when its reference costs at most this many FLOPs (a few seconds; the attention prefill shapes would
# need hours and tens of GB for their score matrices).
REFERENCE_FLOP_CAP = 2e11


def gpu_correctness_shapes(spec, fam) -> list[dict]:
    """The spec's correctness_shapes plus its cheapest shape_matrix shape, when the float64 reference
    of that shape is affordable on the host (``REFERENCE_FLOP_CAP``)."""
    cheapest = min(spec.shape_matrix, key=lambda s: fam.flops(s, spec.params))
    extra = [cheapest] if fam.flops(cheapest, spec.params) <= REFERENCE_FLOP_CAP else []
    return list(spec.correctness_shapes) + extra


def peak_of(spec, fam) -> tuple[str, float]:
    """(unit, peak) the headline is set against: the family's own peak (FP8 or BF16 TFLOP/s, or HBM GB/s)."""
    _, _, unit = fam.headline(0.0, 0.0)
    return unit, fam.peak(spec.hardware, spec.params)


def cuda_family(label: str) -> list[str]:
    """Baseline of the spec on the GPU: correctness on device, then cuda-backend timing per shape."""
    from kregress.core.bind import load_bound
    from resources.workers import Worker, worker_env

    bound = load_bound(REPO / SPECS[label])
    spec, fam = bound.spec, bound.family
    unit, peak = peak_of(spec, fam)
    rows = []
    with tempfile.TemporaryDirectory(prefix=f"kregress-cuda-{label}-") as cache:
        worker = Worker(worker_env(Path(cache), interpret=False))
        worker.wait_ready(180)
        try:
            base = {"family": spec.kernel_family, "config": spec.baseline, "dtype": spec.dtype, "params": spec.params, "seed": 0}
            shapes = gpu_correctness_shapes(spec, fam)
            res = worker.call({**base, "op": "correctness", "shapes": shapes,
                               "tolerance": spec.constraints.numeric_tolerance, "device": "cuda", "interpret": False}, 900)
            c = res.get("correctness") or {}
            detail = res.get("error") or c.get("mismatch_sample", "")[:120] or "max_abs_err=%.2e" % c.get("max_abs_err", 0)
            rows.append(f"| {label} | correctness on GPU | {len(shapes)} shapes | {'ok' if c.get('ok') else 'FAIL'} | {detail} |")
            res = worker.call({**base, "op": "measure_cuda", "shapes": spec.shape_matrix,
                               "warmup_ms": spec.benchmark.warmup_ms, "rep_ms": spec.benchmark.rep_ms}, 1800)
            for m in res.get("measurements", []):
                _, value, _ = fam.headline(m["tflops"], m["gbps"])
                rows.append(f"| {label} | {m['shape']} | p50 {m['p50_ms']:.4f} ms | {value:.1f} {unit} | "
                            f"{value / peak:.1%} of {peak:.0f} |")
            if "error" in res:
                rows.append(f"| {label} | measure_cuda | - | {res['error']} | {res.get('detail', '')[:200]} |")
        finally:
            worker.kill()
    return rows


def table(results: list[dict]) -> str:
    lines = ["| family | what | config / shape | seconds | detail |", "|---|---|---|---|---|"]
    for r in results:
        for row in r["compile"]:
            detail = row["error"] or f"{row['regs']} regs, {row['spill']} B spill, {row['smem']} B smem"
            lines.append(f"| {r['family']} | compile sm_90 (cold) | {row['config']} | {row['compile_s']:.2f} | {detail} |")
        for row in r["interp"]:
            detail = row["error"] or f"ok={row['ok']}, max_abs_err={row['max_abs_err']:.2e}"
            lines.append(f"| {r['family']} | interpreter check | {row['shape']} | {row['seconds']:.2f} | {detail} |")
    summary = ["", "| family | compile s/variant (mean) | interpreter s/shape (mean) |", "|---|---|---|"]
    for r in results:
        cs = [x["compile_s"] for x in r["compile"]]
        ins = [x["seconds"] for x in r["interp"]]
        summary.append(f"| {r['family']} | {sum(cs) / len(cs):.2f} | {sum(ins) / len(ins):.2f} |")
    return "\n".join(lines + summary)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--families", nargs="+", default=list(SPECS), choices=list(SPECS))
    ap.add_argument("--configs", type=int, default=3, help="configs compiled per family (baseline first)")
    ap.add_argument("--json", default="", help="also write the raw numbers here")
    ap.add_argument("--cuda", action="store_true", help="GPU host: check and time each spec's baseline on the cuda backend")
    args = ap.parse_args(argv)
    if args.cuda:
        lines = ["| spec | shape | latency | headline | vs peak |", "|---|---|---|---|---|"]
        for name in args.families:
            print(f"timing {name} on the cuda backend ...", file=sys.stderr, flush=True)
            lines += cuda_family(name)
        print("\n".join(lines))
        return 0
    results = []
    for name in args.families:
        print(f"benchmarking {name} ...", file=sys.stderr, flush=True)
        results.append(bench_family(name, args.configs))
    print(table(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
