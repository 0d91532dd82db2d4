"""The GPU check: everything that needs a GPU, in one budgeted call, with one JSON summary.

Run through ``scripts/gpu_check.sh`` (which first installs the carried wheels the machine lacks into a
temporary site dir and puts it, and this tree, on PYTHONPATH); no Dagster is imported by any part.

Parts, in the order they run (each in a child process of its own, with its own time limit, and every
item inside it with its own limit too, so a slow or hanging part cannot eat the rest; items are
written as they finish):

    env             versions, the GPU's identity and clocks (read, never locked), the C compiler
                    Triton's launcher needs, the carried wheels installed; the interpreter's fixes
    correct         every Triton family's spec (bench/families.py SPECS): the baseline and a few
                    one-step neighbours, checked against the float64 reference on the GPU at the
                    spec's correctness shapes and its cheapest timed shape the host can afford
    timing          per spec, one interleaved same-batch job (kernels/measure.py batch_measurements:
                    baseline, v1, baseline, v2, ... in one process) on the two cheapest timed shapes,
                    the device identity of each sample, and each variant's verdict against its
                    batch's baseline (kregress.core.stats, the sweep's rule)
    torch_sdpa      the external family: each PyTorch backend checked on the GPU, then timed in one batch
    pytest_gpu      ``pytest -m gpu`` over the test files that carry the marker, the CUDA C++ kind's among
                    them (tests/test_cuda_gpu.py: nvcc cubins launched through the driver, checked and
                    timed; tests/test_cuda_gpu_backend.py: the cuda backend and .cu patches) (a file that cannot be
                    imported here, e.g. for want of Dagster, is reported as such, not as a failure)
    aot             every family's configs compiled ahead of time for the spec's arch (sm_90) with the
                    machine's Triton: registers, spills, shared memory, or why it cannot compile
    bench_families  ``bench/families.py --cuda`` per spec: the baseline against the BF16/FP8 or HBM peak

``--dry-run`` goes through the same parts on a CPU host: correctness in Triton's interpreter on the
correctness shapes, the AOT compiles for real, torch_sdpa on the CPU, the gpu-marked tests collected
(and skipped), and each GPU-only job (the timing batches, bench/families.py --cuda) sent to the same
worker as on the GPU, where it stops at the missing device: such items are ``planned``.

``--rerun-failed SUMMARY`` runs again only the items of a previous summary that failed, errored or
timed out (or never ran), with a shorter budget, and writes a summary that keeps the previous results
of everything else.

Outputs in ``--out`` (at most 8 files, each under 16 MiB): summary.json, progress.log, parts.log,
setup.log (written by gpu_check.sh), nvidia-smi.txt, pytest_gpu.log, pytest_gpu.xml,
bench_families.log.

Item statuses: ok, failed (it ran and was wrong), error (the harness failed), timeout, skipped (not
run, with the reason: it cannot run on this machine), not_run (no time left in the budget, or no
device), planned (dry run: sent as far as a CPU host can take it). The check's status is ``ok`` when
every item is ok, planned or skipped, ``failed`` when one failed, errored or timed out, else
``incomplete``; ``--rerun-failed`` runs the failed, errored, timed-out and not-run items again.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # kregress, kernels, resources, bench: the tree is not installed there

SCHEMA = "kregress-gpu-check/1"
OUT_FILES = ("summary.json", "progress.log", "parts.log", "setup.log", "nvidia-smi.txt", "pytest_gpu.log",
             "pytest_gpu.xml", "bench_families.log")
MAX_FILE_BYTES = 16 * 2**20 - 4096
BAD = ("failed", "error", "timeout")
RERUN = BAD + ("not_run",)

# Part -> time limit (s) per mode. GPU: the sum fits the default budget; the budget is enforced as
# well (a part never gets more than what is left), so a part late in the order is cut, not the run.
PARTS: dict[str, dict[str, float]] = {
    "env": {"gpu": 15, "dry": 120},
    "correct": {"gpu": 80, "dry": 420},
    "timing": {"gpu": 85, "dry": 120},
    "torch_sdpa": {"gpu": 30, "dry": 90},
    "pytest_gpu": {"gpu": 84, "dry": 240},  # includes the CUDA kind's tests (tests/test_cuda_gpu*.py: nvcc + driver)
    "aot": {"gpu": 30, "dry": 420},
    "bench_families": {"gpu": 90, "dry": 120},  # last: the likeliest to overrun (every timed shape of every spec)
}
BUDGET_S = {"gpu": 449.0, "dry": 1500.0}  # GPU: + gpu_check.sh's site install (<= 30 s) and start-up < 8 minutes
RERUN_BUDGET_S = {"gpu": 180.0, "dry": 900.0}  # the re-run must fit what is left of 15 minutes of device time
RESERVE_S = 5.0  # kept back from every part for writing the summary

# What each mode checks: configs per spec (baseline first) and the timing settings.
N_CONFIGS = {"gpu": 3, "dry": 2}
TIMING = {"rep_ms": 60, "warmup_ms": 20, "rounds": 4, "order": "interleaved", "shapes": 2}


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


# --- the plan: which items each part runs ---------------------------------------------------------

def spec_labels() -> list[str]:
    from bench.families import SPECS

    return list(SPECS)


def load(label: str):
    """(spec, family) of a spec label of bench/families.py (SPECS) or ``torch_sdpa``."""
    from bench.families import SPECS
    from kregress.core.family import get_family
    from kregress.core.spec import load_spec

    path = SPECS.get(label) or f"specs/{label}_h100.yaml"
    spec = load_spec(REPO / path)
    return spec, get_family(spec.kernel_family)


def configs_for(label: str, mode: str) -> list[dict]:
    """The baseline, then one-step neighbours inside the space (bench/families.py's choice)."""
    from bench.families import neighbour_configs

    spec, fam = load(label)
    return neighbour_configs(fam, spec.baseline, spec.params, N_CONFIGS[mode])


def timing_shapes(spec, fam) -> list[dict]:
    """The cheapest timed shapes (most samples per slot), in the spec's order."""
    order = sorted(range(len(spec.shape_matrix)), key=lambda i: fam.flops(spec.shape_matrix[i], spec.params))
    return [spec.shape_matrix[i] for i in sorted(order[:TIMING["shapes"]])]


def sdpa_backends() -> list[str]:
    from kernels.torch_sdpa import BACKEND_NAMES

    return list(BACKEND_NAMES)


def gpu_test_files() -> list[str]:
    """Test files that carry the gpu marker (the patch gate's GPU-only checks join when they land)."""
    pat = re.compile(r"pytest\.mark\.gpu\b|mark\.gpu\b")
    return sorted(str(p.relative_to(REPO)) for p in (REPO / "tests").glob("test_*.py") if pat.search(p.read_text()))


def plan_items(part: str) -> list[str]:
    if part == "env":
        return ["versions", "device"]
    if part in ("correct", "timing", "bench_families", "aot"):
        return spec_labels()
    if part == "torch_sdpa":
        return sdpa_backends()
    if part == "pytest_gpu":
        return gpu_test_files()
    raise KeyError(part)


# --- helpers shared by the parts ---------------------------------------------------------------------

class Part:
    """What a part's child process has: its context, and a writer of items as they finish."""

    def __init__(self, ctx: dict):
        self.ctx = ctx
        self.mode = ctx["mode"]
        self.name = ctx["part"]
        self.items = ctx["items"]
        self.deadline = time.monotonic() + ctx["timeout_s"]
        self.out = Path(ctx["out"])
        self.cache = Path(ctx["cache"])

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def item_timeout(self, remaining_items: int, floor: float = 30.0) -> float:
        """An even share of what is left, so one item cannot take all of its successors' time, but at
        least ``floor`` (a cold JIT compile of an attention kernel and its timing), never past the part's
        own limit (the part is killed there anyway; what is left then is a timeout, re-run with
        --rerun-failed)."""
        return max(1.0, min(self.left() - 1.0, max(floor, self.left() / max(1, remaining_items) - 1.0)))

    def put(self, item: str, status: str, **data) -> None:
        rec = {"item": item, "status": status, **data}
        with open(self.ctx["items_file"], "a") as fh:
            fh.write(json.dumps(rec, default=str) + "\n")
        detail = data.get("detail") or data.get("reason") or ""
        progress(self.out, f"{self.name}/{item}: {status}" + (f" ({str(detail)[:160]})" if detail else ""))


def progress(out: Path, msg: str) -> None:
    line = f"{now()} {msg}"
    with open(out / "progress.log", "a") as fh:
        fh.write(line + "\n")
    print(line, flush=True)


def no_cuda_error(text: str) -> bool:
    """A worker's error that says there is no CUDA device (what a dry run's GPU-only job runs into)."""
    return bool(re.search(r"not compiled with CUDA|no CUDA GPUs|no NVIDIA driver|CUDA driver|CUDA is not available|"
                          r"no CUDA-capable device", text or "", re.IGNORECASE))


def pool(ctx_part: Part, size: int, interpret: bool):
    from resources.workers import WorkerPool, worker_env

    env = worker_env(ctx_part.cache, interpret)
    return WorkerPool(size, env, startup_timeout=120)


def cpus() -> int:
    return os.cpu_count() or 1


# --- the parts -------------------------------------------------------------------------------------------

def part_env(p: Part) -> None:
    import platform

    import numpy
    import torch
    import triton

    info = {"python": platform.python_version(), "executable": sys.executable, "host": platform.node(),
            "torch": torch.__version__, "torch_cuda": torch.version.cuda, "triton": triton.__version__,
            "numpy": numpy.__version__, "cpus": cpus(),
            "c_compiler": shutil.which(os.environ.get("CC", "")) if os.environ.get("CC") else
            (shutil.which("gcc") or shutil.which("cc") or shutil.which("clang"))}
    for mod in ("pydantic", "pandas", "pyarrow", "yaml", "scipy", "matplotlib", "pytest", "dagster"):
        try:
            m = __import__(mod)
            info[mod] = getattr(m, "__version__", "?")
        except ImportError:
            info[mod] = None
    site = os.environ.get("KREGRESS_CHECK_SITE", "")
    rec = Path(site) / "kregress_site.json" if site else None
    if rec and rec.is_file():
        info["site"] = json.loads(rec.read_text())
    if p.mode == "dry":
        w = pool(p, 1, interpret=True)
        try:
            (res,) = w.run([{"op": "versions", "family": "gemm"}], p.item_timeout(2))
        finally:
            w.close()
        info["interpreter"] = res
        ok = "interpreter_fixes" in res
        p.put("versions", "ok" if ok else "error", data=info,
              detail="" if ok else f"interpreter worker: {res.get('error')}: {res.get('detail', '')[:300]}")
    else:
        p.put("versions", "ok" if info["c_compiler"] else "failed", data=info,
              detail="" if info["c_compiler"] else "no C compiler (gcc, cc, clang or $CC): Triton builds its "
                                                    "launcher with one on the first kernel launch")

    from kernels.measure import device_identity

    smi = shutil.which("nvidia-smi")
    text = ""
    if smi:
        q = subprocess.run([smi, "--query-gpu=index,name,uuid,driver_version,memory.total,memory.used,clocks.sm,"
                            "clocks.mem,clocks.max.sm,clocks.max.mem,temperature.gpu,power.draw,persistence_mode",
                            "--format=csv"], capture_output=True, text=True, timeout=30)
        full = subprocess.run([smi], capture_output=True, text=True, timeout=30)
        text = q.stdout + q.stderr + "\n" + full.stdout + full.stderr
    else:
        text = "nvidia-smi: not on PATH\n"
    (p.out / "nvidia-smi.txt").write_text(text)
    ident = device_identity()
    dev = {"cuda_available": torch.cuda.is_available(), "device_count": torch.cuda.device_count(),
           "identity": ident, "clocks_locked": False}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        dev.update(capability=f"sm_{props.major}{props.minor}", sm_count=props.multi_processor_count,
                   memory_gib=round(props.total_memory / 2**30, 1))
    if p.mode == "gpu":
        ok = torch.cuda.is_available()
        p.put("device", "ok" if ok else "failed", data=dev,
              detail="" if ok else "torch sees no CUDA device: the GPU parts are skipped")
    else:
        p.put("device", "planned" if not torch.cuda.is_available() else "ok", data=dev,
              detail="dry run on a CPU host: no CUDA device" if not torch.cuda.is_available() else "")


def _corr_summary(res: dict) -> dict:
    c = res.get("correctness") or {}
    return {"ok": c.get("ok"), "max_abs_err": c.get("max_abs_err"), "max_rel_err": c.get("max_rel_err"),
            "ref_rounding_abs": c.get("ref_rounding_abs"), "mismatches": c.get("mismatches"),
            "nan_inf": c.get("nan_inf"), "shapes": c.get("shapes_checked"),
            "error": res.get("error"), "detail": (res.get("detail") or c.get("mismatch_sample") or "")[:600],
            "wall_s": round(res.get("wall_s", 0.0), 2)}


def part_correct(p: Part) -> None:
    from bench.families import gpu_correctness_shapes
    from kregress.core.records import config_label

    gpu = p.mode == "gpu"
    jobs, owners = [], []
    for label in p.items:
        spec, fam = load(label)
        shapes = gpu_correctness_shapes(spec, fam) if gpu else list(spec.correctness_shapes)
        for cfg in configs_for(label, p.mode):
            jobs.append({"op": "correctness", "family": spec.kernel_family, "config": cfg, "dtype": spec.dtype,
                         "shapes": shapes, "tolerance": spec.constraints.numeric_tolerance, "params": spec.params,
                         "device": "cuda" if gpu else "cpu", "interpret": not gpu, "seed": 0})
            owners.append((label, config_label(cfg), cfg == spec.baseline))
    size = min(4 if gpu else max(1, cpus()), len(jobs)) or 1
    results: dict[str, list] = {label: [] for label in p.items}
    expected = {label: sum(1 for o in owners if o[0] == label) for label in p.items}

    def done(i: int, res: dict) -> None:
        label, cfg, is_base = owners[i]
        results[label].append({"config": cfg, "baseline": is_base, **_corr_summary(res)})
        if len(results[label]) == expected[label]:
            rows = results[label]
            bad = [r for r in rows if not r["ok"]]
            status = "ok" if not bad else ("timeout" if all(r["error"] == "timeout" for r in bad) else "failed")
            p.put(label, status, configs=rows, device="cuda" if gpu else "interpreter",
                  detail="; ".join(f"{r['config']}: {r['error'] or 'mismatch'} {r['detail'][:120]}" for r in bad))

    # every job gets an even share of the part's time (jobs run `size` at a time)
    per_job = max(30.0, (p.left() - 2) * size / max(1, len(jobs)))
    w = pool(p, size, interpret=not gpu)
    try:
        w.run(jobs, per_job, on_done=done)
    finally:
        w.close()


def _verdicts(spec, batch: dict) -> dict:
    """Each variant against its batch's baseline, shape by shape, with the sweep's rule."""
    from kregress.core import stats

    rg = spec.regression_guard
    base = batch["baseline"]
    out = {}
    for key, ms in batch.items():
        if key == "baseline":
            continue
        res = stats.verdict_by_shape([m["samples_ms"] for m in ms], [m["samples_ms"] for m in base],
                                     guard=rg.not_worse_than_baseline_ratio, confidence=rg.confidence,
                                     min_samples=rg.min_samples, seed=spec.search.seed,
                                     shape_names=[m["shape"] for m in ms])
        out[key] = {"verdict": res.verdict, "reason": res.reason, "ratio": res.combined.ratio,
                    "ratio_ci": [res.combined.low, res.combined.high], "p50_ratio": res.combined.p50}
    return out


def _batch_summary(batch: dict) -> dict:
    keep = ("shape", "p20_ms", "p50_ms", "p80_ms", "tflops", "gbps", "batch", "gpu_name", "gpu_uuid", "host",
            "driver", "sm_clock_mhz_start", "sm_clock_mhz_end", "mem_clock_mhz_start", "mem_clock_mhz_end",
            "clocks_locked", "torch_version", "triton_version")
    return {k: [{**{f: m.get(f) for f in keep}, "n_samples": len(m.get("samples_ms", []))} for m in ms]
            for k, ms in batch.items()}


def _measure_batch_job(spec, baseline: dict, configs: dict, shapes: list[dict], batch_id: str) -> dict:
    # lock_clocks stays None: the lent machine's clocks are never locked (they are read and recorded)
    return {"op": "measure_batch", "family": spec.kernel_family, "baseline": baseline, "configs": configs,
            "dtype": spec.dtype, "shapes": shapes, "params": spec.params, "warmup_ms": TIMING["warmup_ms"],
            "rep_ms": TIMING["rep_ms"], "seed": 0, "batch_id": batch_id, "rounds": TIMING["rounds"],
            "order": TIMING["order"], "lock_clocks": None}


def _run_batch_item(p: Part, w, label: str, spec, fam, baseline: dict, variants: dict, shapes: list[dict],
                    timeout: float) -> tuple[str, dict]:
    """One batch on the worker pool ``w``; (status, data)."""
    import uuid

    batch_id = f"gpu-check/{label}/{uuid.uuid4().hex[:8]}"
    job = _measure_batch_job(spec, baseline, variants, shapes, batch_id)
    (res,) = w.run([job], timeout)
    data = {"batch_id": batch_id, "shapes": [fam.shape_label(s) for s in shapes], "variants": variants,
            "baseline_config": baseline, "wall_s": round(res.get("wall_s", 0.0), 2)}
    if "batch" in res:
        data["measurements"] = _batch_summary(res["batch"])
        data["verdicts"] = _verdicts(spec, res["batch"])
        ident = res["batch"]["baseline"][0] if res["batch"]["baseline"] else {}
        ok = bool(ident.get("gpu_name")) and not ident.get("clocks_locked")
        return ("ok" if ok else "failed"), data
    data.update(error=res.get("error"), detail=(res.get("detail") or "")[:600])
    if res.get("error") == "timeout":  # past its time in either mode (the part's limit can cut a job first)
        return "timeout", data
    if p.mode == "dry":
        return ("planned" if no_cuda_error(res.get("detail", "")) else "failed"), data
    return "failed", data


def part_timing(p: Part) -> None:
    from kregress.core.records import config_label

    w = pool(p, 1, interpret=False)
    try:
        for n, label in enumerate(p.items):
            spec, fam = load(label)
            cfgs = configs_for(label, p.mode)
            variants = {f"v{i}": c for i, c in enumerate(cfgs[1:], 1)}
            shapes = timing_shapes(spec, fam)
            status, data = _run_batch_item(p, w, label, spec, fam, cfgs[0], variants, shapes,
                                           p.item_timeout(len(p.items) - n))
            if status == "failed" and p.mode == "gpu" and variants:
                # which config broke the batch: the baseline with each variant alone
                data["alone"] = {}
                for key, cfg in variants.items():
                    st, d = _run_batch_item(p, w, label, spec, fam, cfgs[0], {key: cfg}, shapes[:1],
                                            p.item_timeout(len(p.items) - n))
                    data["alone"][config_label(cfg)] = {"status": st, "error": d.get("error"),
                                                        "detail": d.get("detail", "")[:300],
                                                        "verdicts": d.get("verdicts")}
            p.put(label, status, **data)
    finally:
        w.close()


def part_torch_sdpa(p: Part) -> None:
    from bench.families import gpu_correctness_shapes
    from kernels.torch_sdpa import BACKEND_NAMES

    spec, fam = load("torch_sdpa")
    gpu = p.mode == "gpu"
    shapes = gpu_correctness_shapes(spec, fam) if gpu else list(spec.correctness_shapes)
    names = [b for b in p.items if b in BACKEND_NAMES]
    jobs = [{"op": "correctness", "family": "torch_sdpa", "config": {"backend": BACKEND_NAMES.index(b)},
             "dtype": spec.dtype, "shapes": shapes, "tolerance": spec.constraints.numeric_tolerance,
             "params": spec.params, "device": "cuda" if gpu else "cpu", "interpret": False, "seed": 0} for b in names]
    w = pool(p, 1, interpret=False)
    try:
        corr = dict(zip(names, w.run(jobs, p.item_timeout(len(jobs) + 1))))
        runs = [b for b in names if (corr[b].get("correctness") or {}).get("ok")]
        timed: dict = {}
        base_name = BACKEND_NAMES[spec.baseline["backend"]]
        if runs:
            base = base_name if base_name in runs else runs[0]
            variants = {b: {"backend": BACKEND_NAMES.index(b)} for b in runs if b != base}
            st, d = _run_batch_item(p, w, "torch_sdpa", spec, fam, {"backend": BACKEND_NAMES.index(base)}, variants,
                                    timing_shapes(spec, fam), p.item_timeout(1))
            timed = {"status": st, "baseline_backend": base, **d}
    finally:
        w.close()
    for b in names:
        c = _corr_summary(corr[b])
        if c["ok"]:
            t_status = timed.get("status")
            status = "ok" if t_status == "ok" else t_status or "error"
            if timed.get("status") == "planned":
                status = "planned"
            p.put(b, status, correctness=c, timing={k: v for k, v in timed.items()
                                                     if k not in ("variants", "baseline_config")},
                  verdict=(timed.get("verdicts") or {}).get(b), detail=timed.get("detail", ""))
        elif not gpu and c["error"] == "runtime_error":
            p.put(b, "skipped", correctness=c, reason=f"PyTorch has no CPU kernel for the {b} backend here: "
                                                      f"{c['detail'][:200]}")
        else:
            p.put(b, "failed" if c["error"] != "timeout" else "timeout", correctness=c, detail=c["detail"][:300])


def part_pytest_gpu(p: Part) -> None:
    import xml.etree.ElementTree as ET

    files = list(p.items)
    xml = p.out / "pytest_gpu.xml"
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-rA", "-p", "no:cacheprovider", "-o", "addopts=",
           "--continue-on-collection-errors", f"--junitxml={xml}"]
    try:
        import pytest_timeout  # noqa: F401

        cmd.append(f"--timeout={int(max(30, min(300, p.left() - 10)))}")  # one hung test fails, the file goes on
    except ImportError:
        pass
    cmd += files
    with open(p.out / "pytest_gpu.log", "a") as log:
        log.write(f"$ {' '.join(cmd)}\n")
        log.flush()
        try:
            proc = subprocess.run(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, timeout=max(5.0, p.left() - 3))
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            rc = None
    cases: dict[str, list] = {f: [] for f in files}
    if xml.is_file():
        for tc in ET.parse(xml).getroot().iter("testcase"):
            cls, name = tc.get("classname", ""), tc.get("name", "")
            path = (cls or name).replace(".", "/")
            # the file's own module, or a class in it (tests/test_gpu is not a prefix of tests/test_gpu_timing)
            f = next((x for x in files if path == x[:-3] or path.startswith(x[:-3] + "/")), None)
            if f is None:
                continue
            outcome, msg = "passed", ""
            for kind in ("failure", "error", "skipped"):
                el = tc.find(kind)
                if el is not None:
                    outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[kind]
                    msg = (el.get("message") or "") + "\n" + (el.text or "")
                    break
            cases[f].append({"test": name if cls else "(collection)", "outcome": outcome,
                             "seconds": float(tc.get("time") or 0), "message": msg.strip()[:800]})
    for f in files:
        rows = cases[f]
        if not rows:
            p.put(f, "timeout" if rc is None else "error", tests=[],
                  detail="pytest ran past its time limit" if rc is None else f"pytest exit {rc}: see pytest_gpu.log")
            continue
        coll = [r for r in rows if r["test"] == "(collection)"]
        if coll and coll[0]["outcome"] == "skipped":  # the module skips itself, with its reason (pytest.importorskip)
            p.put(f, "skipped", tests=rows, reason=coll[0]["message"].splitlines()[-1][:300])
            continue
        if coll:
            missing = re.search(r"No module named '([\w.]+)'", coll[0]["message"])
            if missing:
                mod = missing.group(1).split(".")[0]
                p.put(f, "skipped", tests=rows, reason=f"cannot be imported without {mod} (not on this machine, not "
                                                       "carried: scripts/fetch_gpu_wheels.sh --with-dagster)")
            else:
                p.put(f, "error", tests=rows, detail=coll[0]["message"][:300])
            continue
        outcomes = {r["outcome"] for r in rows}
        if outcomes & {"failed", "error"}:
            bad = [r for r in rows if r["outcome"] in ("failed", "error")]
            p.put(f, "failed", tests=rows, detail="; ".join(f"{r['test']}: {r['message'][:150]}" for r in bad))
        elif outcomes == {"skipped"} and p.mode == "dry":
            p.put(f, "planned", tests=rows, detail=f"{len(rows)} gpu test(s) collected, skipped on this CPU host")
        elif outcomes == {"skipped"}:
            p.put(f, "skipped", tests=rows, reason=rows[0]["message"][:200])
        else:
            p.put(f, "ok", tests=rows)


def part_bench_families(p: Part) -> None:
    labels = list(p.items)
    # a dry run invokes the harness for the first spec only (the GPU-only path stops at the missing
    # device for every spec alike); the others are listed as planned
    run = labels if p.mode == "gpu" else labels[:1]
    with open(p.out / "bench_families.log", "a") as log:
        for label in labels:
            if label not in run:
                p.put(label, "planned", detail="dry run: bench/families.py --cuda invoked for the first spec only")
                continue
            cmd = [sys.executable, str(REPO / "bench" / "families.py"), "--cuda", "--families", label]
            log.write(f"$ {' '.join(cmd)}\n")
            log.flush()
            t0 = time.monotonic()
            try:
                proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True,
                                      timeout=p.item_timeout(len(run) - run.index(label)))
            except subprocess.TimeoutExpired as exc:
                log.write(str(exc.stdout or "") + str(exc.stderr or "") + "\n[timeout]\n")
                p.put(label, "timeout", detail=f"bench/families.py --cuda past {exc.timeout:.0f} s")
                continue
            log.write(proc.stdout + proc.stderr + "\n")
            log.flush()
            status, data = classify_bench(label, p.mode, proc.returncode, proc.stdout, proc.stderr)
            p.put(label, status, seconds=round(time.monotonic() - t0, 1), **data)


def classify_bench(label: str, mode: str, rc: int, stdout: str, stderr: str) -> tuple[str, dict]:
    """bench/families.py --cuda's table for one spec -> (status, data). GPU: ok when the baseline was
    correct on the GPU and every shape was timed; dry run: planned when the harness ran and its GPU
    jobs stopped at the missing device."""
    rows = [r for r in stdout.splitlines() if r.startswith(f"| {label} |")]
    table = [[c.strip() for c in r.strip().strip("|").split("|")] for r in rows]
    corr = next((r for r in table if r[1] == "correctness on GPU"), None)
    errs = [r for r in table if r[1] == "measure_cuda"]
    timed = [r for r in table if r[1] not in ("correctness on GPU", "measure_cuda")]
    data = {"rows": table, "rc": rc}
    if mode == "dry":
        ok = rc == 0 and corr is not None and corr[3] == "FAIL" and no_cuda_error(stdout + stderr)
        return ("planned" if ok else "failed"), {**data, "detail": "the harness ran; its GPU jobs stopped at the "
                                                 "missing device" if ok else f"exit {rc}: {stderr[-300:]}"}
    ok = rc == 0 and corr is not None and corr[3] == "ok" and bool(timed) and not errs
    if ok:
        return "ok", data
    why = [" | ".join(r) for r in (errs or ([corr] if corr and corr[3] != "ok" else []))]
    return "failed", {**data, "detail": f"exit {rc}; " + ("; ".join(why) or stderr[-300:] or "no table")}


def part_aot(p: Part) -> None:
    from kregress.core.records import config_label

    jobs, owners = [], []
    for label in p.items:
        spec, fam = load(label)
        for cfg in configs_for(label, p.mode):
            jobs.append({"op": "compile", "family": spec.kernel_family, "config": cfg, "dtype": spec.dtype,
                         "arch": spec.hardware.arch, "limits": spec.hardware.limits.model_dump(), "params": spec.params})
            owners.append((label, config_label(cfg), cfg == spec.baseline, spec.hardware.arch))
    results: dict[str, list] = {label: [] for label in p.items}
    expected = {label: sum(1 for o in owners if o[0] == label) for label in p.items}

    def done(i: int, res: dict) -> None:
        label, cfg, is_base, arch = owners[i]
        st = res.get("stats") or {}
        results[label].append({"config": cfg, "baseline": is_base, "arch": arch, "error": res.get("error"),
                               "detail": (res.get("detail") or "")[:400], "regs": st.get("regs_per_thread"),
                               "spill_bytes": st.get("spill_bytes"), "smem_bytes": st.get("smem_bytes"),
                               "compile_s": st.get("compile_seconds"), "wall_s": round(res.get("wall_s", 0.0), 2)})
        if len(results[label]) == expected[label]:
            rows = results[label]
            base = next((r for r in rows if r["baseline"]), None)
            # a neighbour may honestly be out of resources; the baseline must compile, nothing may crash
            bad = [r for r in rows if (r["baseline"] and r["error"]) or r["error"] not in (None, "out_of_resources")]
            status = "ok" if base and not bad else ("timeout" if bad and all(r["error"] == "timeout" for r in bad)
                                                   else "failed")
            p.put(label, status, configs=rows,
                  detail="; ".join(f"{r['config']}: {r['error']} {r['detail'][:200]}" for r in bad))

    size = min(max(1, cpus() // 2), 8, len(jobs)) or 1
    per_job = max(30.0, (p.left() - 2) * size / max(1, len(jobs)))
    w = pool(p, size, interpret=False)
    try:
        w.run(jobs, per_job, on_done=done)
    finally:
        w.close()


PART_FUNCS = {"env": part_env, "correct": part_correct, "timing": part_timing, "torch_sdpa": part_torch_sdpa,
              "pytest_gpu": part_pytest_gpu, "aot": part_aot, "bench_families": part_bench_families}
GPU_ONLY = ("correct", "timing", "torch_sdpa", "bench_families")


# --- the parent: runs the parts, keeps the budget, writes the summary ----------------------------------------

def run_part(name: str, items: list[str], timeout: float, ctx: dict, out: Path) -> dict:
    """Run one part in a child process (its own session: a timeout kills it with its workers)."""
    work = Path(ctx["work"])
    items_file = work / f"{name}.jsonl"
    items_file.unlink(missing_ok=True)
    cfile = work / f"{name}.ctx.json"
    cfile.write_text(json.dumps({**ctx, "part": name, "items": items, "timeout_s": timeout,
                                 "items_file": str(items_file)}))
    t0 = time.monotonic()
    progress(out, f"part {name}: {len(items)} item(s), limit {timeout:.0f} s")
    with open(out / "parts.log", "a") as log:
        log.write(f"\n===== {now()} part {name} (limit {timeout:.0f} s): {', '.join(items)}\n")
        log.flush()
        proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--part-child", str(cfile)], cwd=REPO,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            # the child also watches its own deadline (between items): a little grace, never more than the limit
            rc = proc.wait(timeout=timeout + min(2.0, timeout))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the part and every worker it started
            proc.wait()
            rc = None
    seconds = time.monotonic() - t0
    got: dict[str, dict] = {}
    if items_file.is_file():
        for line in items_file.read_text().splitlines():
            if line.strip():
                rec = json.loads(line)
                got[rec.pop("item")] = rec
    for it in items:
        if it not in got:
            got[it] = ({"status": "timeout", "detail": f"part {name} killed at its {timeout:.0f} s limit"} if rc is None
                       else {"status": "error", "detail": f"part {name} exited {rc} before this item: see parts.log"})
    statuses = [v["status"] for v in got.values()]
    status = next((s for s in ("timeout", "error", "failed") if s in statuses), "ok")
    progress(out, f"part {name}: {status} in {seconds:.1f} s")
    return {"status": status, "seconds": round(seconds, 1), "timeout_s": round(timeout, 1), "rc": rc,
            "items": got}


def part_child(cfile: str) -> int:
    ctx = json.loads(Path(cfile).read_text())
    p = Part(ctx)
    try:
        PART_FUNCS[ctx["part"]](p)
    except Exception as exc:  # the harness broke: the items not yet written become errors in the parent
        traceback.print_exc()
        progress(p.out, f"{p.name}: harness error {type(exc).__name__}: {str(exc)[:300]}")
        return 1
    return 0


def write_summary(out: Path, summary: dict) -> None:
    tmp = out / ".summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=1, default=str))
    os.replace(tmp, out / "summary.json")


def overall(parts: dict) -> tuple[str, list[str]]:
    """ok; failed (an item failed, errored or timed out); incomplete (only items not run: budget, no device)."""
    statuses = {f"{p}/{i}": v["status"] for p, rec in parts.items() for i, v in rec.get("items", {}).items()}
    bad = [k for k, st in statuses.items() if st in RERUN]
    if any(statuses[k] in BAD for k in bad):
        return "failed", bad
    return ("incomplete" if bad else "ok"), bad


def cap_outputs(out: Path) -> list[str]:
    """Keep $OUT within what comes back: the known files only, each under 16 MiB (a long log keeps its
    head and tail)."""
    notes = []
    for f in sorted(out.iterdir()):
        if f.name not in OUT_FILES:
            if f.is_file():
                f.unlink()
                notes.append(f"removed {f.name}: not one of the check's {len(OUT_FILES)} files")
            continue
        size = f.stat().st_size
        if size > MAX_FILE_BYTES:
            data = f.read_bytes()
            head, tail = data[: 2 * 2**20], data[-(MAX_FILE_BYTES - 2 * 2**20 - 200):]
            f.write_bytes(head + f"\n[... {size - len(head) - len(tail)} bytes cut ...]\n".encode() + tail)
            notes.append(f"{f.name}: cut from {size} bytes")
    return notes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="CPU host: the interpreter in place of the GPU")
    ap.add_argument("--out", default=os.environ.get("OUT") or "/tmp/kregress-gpu-check")
    ap.add_argument("--rerun-failed", metavar="SUMMARY", default=None,
                    help="run only what failed in this previous summary.json")
    ap.add_argument("--budget", type=float, default=0.0, help="seconds for all parts (default: per mode)")
    ap.add_argument("--only", default="", help="comma-separated parts to run (default: all)")
    ap.add_argument("--part-timeout", action="append", default=[], metavar="PART=S", help="override a part's limit")
    ap.add_argument("--part-child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.part_child:
        return part_child(args.part_child)

    mode = "dry" if args.dry_run else "gpu"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    prev = None
    if args.rerun_failed:
        prev = json.loads(Path(args.rerun_failed).read_text())
        if prev.get("schema") != SCHEMA:
            raise SystemExit(f"gpu_check: {args.rerun_failed} is not a summary of this check (schema {prev.get('schema')!r})")
        if prev.get("mode") != mode:
            raise SystemExit(f"gpu_check: {args.rerun_failed} is a {prev.get('mode')} summary; pass "
                             f"{'--dry-run' if prev.get('mode') == 'dry' else 'no --dry-run'} to re-run it")
    for f in OUT_FILES:  # a fresh run starts clean; setup.log belongs to gpu_check.sh
        if f != "setup.log":
            (out / f).unlink(missing_ok=True)
    budget = args.budget or (RERUN_BUDGET_S if prev else BUDGET_S)[mode]
    limits = {name: lim[mode] for name, lim in PARTS.items()}
    for spec in args.part_timeout:
        name, _, sec = spec.partition("=")
        if name not in limits:
            raise SystemExit(f"gpu_check: --part-timeout {spec}: unknown part {name!r}; parts: {', '.join(PARTS)}")
        limits[name] = float(sec)
    only = [x for x in args.only.split(",") if x]
    unknown = [x for x in only if x not in PARTS]
    if unknown:
        raise SystemExit(f"gpu_check: --only {args.only}: unknown part(s) {', '.join(unknown)}; parts: {', '.join(PARTS)}")

    t0 = time.monotonic()
    deadline = t0 + budget
    work = Path(tempfile.mkdtemp(prefix="kregress-check-"))
    ctx = {"mode": mode, "out": str(out), "work": str(work), "cache": str(work / "cache")}
    summary = {"schema": SCHEMA, "mode": mode, "status": "running", "started": now(), "finished": None,
               "budget_s": budget, "wall_s": None, "rerun_of": args.rerun_failed, "argv": sys.argv[1:],
               "limits_s": limits, "timing_settings": TIMING, "configs_per_spec": N_CONFIGS[mode],
               "parts": {}, "failed": [], "notes": []}
    progress(out, f"gpu check ({'dry run, interpreter in place of the GPU' if mode == 'dry' else 'GPU'}), "
                  f"budget {budget:.0f} s" + (f", re-running what failed in {args.rerun_failed}" if prev else ""))
    no_device = ""
    try:
        for name in PARTS:
            if only and name not in only:
                continue
            items = plan_items(name)
            if prev:
                old = prev.get("parts", {}).get(name, {}).get("items", {})
                keep = {i: {**v, "from_previous": True} for i, v in old.items() if v["status"] not in RERUN and i in items}
                items = [i for i in items if i not in keep]
            else:
                keep = {}
            if not items:
                summary["parts"][name] = {"status": "ok", "seconds": 0.0, "items": keep, "from_previous": True}
                continue
            if no_device and name in GPU_ONLY:  # not_run: a --rerun-failed on a working device runs them
                rec = {"status": "not_run", "seconds": 0.0,
                       "items": {i: {"status": "not_run", "reason": no_device} for i in items}}
            else:
                left = deadline - time.monotonic() - RESERVE_S
                if left < 5:
                    rec = {"status": "not_run", "seconds": 0.0,
                           "items": {i: {"status": "not_run", "reason": f"the check's {budget:.0f} s budget was spent"}
                                     for i in items}}
                    progress(out, f"part {name}: not run (budget spent)")
                else:
                    rec = run_part(name, items, min(limits[name], left), ctx, out)
            rec["items"] = {**keep, **rec["items"]}
            summary["parts"][name] = rec
            if name == "env":
                dev = rec["items"].get("device", {})
                ver = rec["items"].get("versions", {})
                summary["versions"] = ver.get("data")
                summary["device"] = dev.get("data")
                if mode == "gpu" and dev.get("status") != "ok":
                    no_device = "no CUDA device visible to torch (see env/device)"
            summary["status"], summary["failed"] = overall(summary["parts"])
            summary["wall_s"] = round(time.monotonic() - t0, 1)
            write_summary(out, summary)
    finally:
        if mode == "gpu":
            try:
                from kernels.measure import device_identity

                summary["device_end"] = device_identity()  # the clocks after the check (read, never set)
            except Exception as exc:  # noqa: BLE001 - the summary must still be written
                summary["notes"].append(f"device identity at the end: {type(exc).__name__}: {exc}")
        shutil.rmtree(work, ignore_errors=True)
        summary["status"], summary["failed"] = overall(summary["parts"])
        summary["finished"] = now()
        summary["wall_s"] = round(time.monotonic() - t0, 1)
        summary["notes"] += cap_outputs(out)
        write_summary(out, summary)
        counts: dict[str, int] = {}
        for rec in summary["parts"].values():
            for v in rec["items"].values():
                counts[v["status"]] = counts.get(v["status"], 0) + 1
        progress(out, f"gpu check {summary['status']} in {summary['wall_s']:.0f} s: "
                      + ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
                      + (f"; failed: {', '.join(summary['failed'])}" if summary["failed"] else ""))
    return 0 if summary["status"] == "ok" else 1


if __name__ == "__main__":
    raise SystemExit(main())
