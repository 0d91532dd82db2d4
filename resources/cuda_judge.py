"""Patches to a CUDA family's ``.cu`` files: judged through ``kregress judge`` and a sweep's patch path.

A patch is a unified diff against the family's ``.cu`` files (paths relative to the family package's
root, as for Triton patches). In order, each stage putting its cause on the row:

1. **Region** (REGRESS ``rejected``): the patch applies and reverts exactly, touches only the listed
   ``.cu`` files, changes lines only inside the family's ``kernel_functions`` (their ``__global__`` and
   ``__device__`` definitions, template heads included; comments and blank lines elsewhere are free),
   leaves the code between them as it was, and stays under ``patches.max_changed_lines``.
2. **Advice** (REGRESS ``rejected``): the added C++ reaches for no host I/O, processes, sockets, the
   environment, raw system calls or device timers, and adds no ``#include``
   (``kregress.core.cuda_source.advice``). Advice, not the boundary: native code can make any system call.
3. **Compile** (REGRESS ``infeasible``): the patched copy compiled by nvcc for the spec's arch; ptxas's
   over-limit error (``uses too much shared data``) and any other nvcc error are the row's error, in the
   tool's own words; the spec's register, spill and shared-memory constraints apply to its facts.
4. **CPU host**: nothing can run the kernel, so the row has compile facts only and says so
   (NEEDS_REVIEW, never PASS), with ptxas's facts of the patched kernel beside the unpatched one's.
   **GPU host**: the patched cubin is checked against the float64 reference on the correctness shapes and
   a hidden odd shape with a secret seed, then timed in one batch beside the baseline, in a child process
   whose environment is an allowlist (no credentials) and which is killed past its time limit.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from kernels.compile import CompileError
from kernels.cuda import confine
from kernels.cuda.nvcc import compile_variant
from kernels.cuda.rules import patch_findings
from kregress.core.cuda_source import local_headers, region_findings
from kregress.core.family import CUDA_SOURCE_KEY, CudaFamily
from kregress.core.gate import GateReport
from kregress.core.patch import Finding, NotAPatch, PatchApplyError, PatchFormatError, apply_and_check, parse_patch
from kregress.core.records import CompileStats, Correctness, Measurement, VariantResult

COMPILE_FACTS_ONLY = "compile facts only: correctness and timing need a GPU"

# What a GPU child judging a .cu patch inherits from this process's environment: nothing else (no keys).
ENV_ALLOW = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "PYTHONPATH", "PYTHONWARNINGS", "PYTHONHASHSEED", "LD_LIBRARY_PATH",
             "CUDA_VISIBLE_DEVICES", "CUDA_HOME", "CUDA_PATH", "KREGRESS_NVCC", "KREGRESS_CUDA_CACHE", "TRITON_CACHE_DIR",
             "TRITON_DEFAULT_FP_FUSION", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def package_root(family: CudaFamily) -> Path:
    """The folder that holds the family's top-level package (the project for a built-in, a plugin's root)."""
    mod_file = Path(family.module.__file__).resolve()
    depth = len(family.module.__name__.split(".")) - (0 if mod_file.name == "__init__.py" else 1)
    return mod_file.parents[depth] if depth < len(mod_file.parents) else mod_file.parent


def editable_files(family: CudaFamily) -> tuple[Path, dict[str, Path]]:
    """(package root, {path as a patch names it: the .cu file}) of the family's ``cuda_sources``."""
    root = package_root(family)
    out = {}
    for f in family.cu_files():
        try:
            out[f.relative_to(root).as_posix()] = f
        except ValueError:
            out[f.as_posix()] = f
    return root, out


def patched_copy(family: CudaFamily, root: Path, new_texts: dict[str, str], dest: Path) -> Path:
    """The family's .cu files and local headers copied under ``dest`` with the patched texts written in;
    returns the folder that stands for the family's module folder (``compile_variant``'s ``source_dir``)."""
    mod_dir = Path(family.module.__file__).resolve().parent
    files = family.cu_files() + local_headers(family.cu_files())
    top = Path(os.path.commonpath([str(mod_dir)] + [str(f.parent) for f in files]))
    for f in files:
        target = dest / f.relative_to(top)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f, target)
    for rel, text in new_texts.items():
        target = dest / (root / rel).resolve().relative_to(top)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    return dest / mod_dir.relative_to(top)


def facts_line(stats: CompileStats) -> str:
    return (f"{stats.regs_per_thread} regs, {stats.spill_stores or 0}/{stats.spill_loads or 0} B spill stores/loads, "
            f"{stats.smem_static_bytes or 0} B static + {stats.smem_dynamic_bytes or 0} B dynamic smem, "
            f"{stats.barriers or 0} barrier(s)")


def _reject(row: VariantResult, report: GateReport, findings: list[Finding], error: str = "patch_rejected") -> VariantResult:
    report.findings = findings
    row.error = error
    row.error_detail = "; ".join(f.text() for f in findings)[:1200]
    return row


def static_and_compile(backend: Any, bound: Any, s: Any, tmp: Path, log: Callable[[str], None]) -> tuple[VariantResult, Path | None]:
    """Stages 1-3 for one patch suggestion: the row (with its gate report) and the patched copy's folder
    (None when the patch did not get as far as a compile that succeeded)."""
    from kregress.core.records import base_row

    spec, family = bound.spec, bound.family
    row = base_row(s, backend.kind)
    report = GateReport(patch_sha256=row.patch_sha256, base_hash=bound.kernel_hash)
    row.gate = report
    t0 = time.perf_counter()
    try:
        try:
            patch = parse_patch(s.patch)
        except (NotAPatch, PatchFormatError, ValueError) as exc:
            return _reject(row, report, [Finding(rule="format", file="-", message=str(exc)[:300])], "patch_failed"), None
        report.changed_lines = patch.changed_lines
        root, files = editable_files(family)
        names = {rel: tuple(family.kernel_functions) for rel in files}
        old_texts = {rel: f.read_text(encoding="utf-8") for rel, f in files.items()}
        limit = spec.patches.max_changed_lines
        outside = region_findings(names, [fp for fp in patch.files if fp.path not in files or fp.status != "modified"],
                                  old_texts, {}, limit, patch.changed_lines)
        if outside:
            return _reject(row, report, [Finding(rule=r, file=f, line=n, message=m) for r, f, n, m in outside]), None
        try:
            applied = apply_and_check(patch, old_texts)
        except PatchApplyError as exc:
            return _reject(row, report, [Finding(rule="apply", file=exc.file, line=exc.line, message=exc.reason)],
                           "patch_failed"), None
        report.round_trip_ok = applied.round_trip_ok
        found = [Finding(rule=r, file=f, line=n, message=m)
                 for r, f, n, m in region_findings(names, patch.files, old_texts, applied.new_texts, limit, patch.changed_lines)]
        if found:
            return _reject(row, report, found), None
        problem = family.space.check(s.config, spec.params, spec.hardware.limits)
        if problem:
            row.error, row.error_detail = "invalid_config", problem
            return row, None
        why = confine.problem()
        if why:  # never an unconfined nvcc on a patch
            return _reject(row, report, [Finding(rule="confinement", file="-", message=f"not judged: {why}")]), None
        source_dir = patched_copy(family, root, applied.new_texts, tmp)
        try:
            ruled = patch_findings(family, family.cuda_units(s.config, spec.dtype, spec.params), spec.hardware.arch,
                                   source_dir)
        except CompileError as exc:  # the preprocessor's own error, any file outside named but not quoted
            row.error, row.error_detail = exc.error, exc.detail
            log(f"  patch {s.variant_id}: {exc.error}: {exc.detail[:200]}")
            return row, None
        if ruled:
            return _reject(row, report, [Finding(rule=r, file=f, line=n, message=m) for r, f, n, m in ruled]), None
        report.notes.append("rules read nvcc's preprocessed unit: includes inside the family, the toolkit and the system "
                            "headers; no timer, SM identity, environment, file or process call; the code outside the "
                            "kernel functions token-identical to the unpatched unit's")
        from kregress.core.cuda_source import sources_hash

        report.patched_hash = sources_hash([source_dir / c for c in family.cuda_sources])
        cache = backend.cache_root() / "cuda"
        try:
            stats, _ = compile_variant(family, s.config, spec.dtype, spec.params, spec.hardware.arch, spec.hardware.limits,
                                       source_dir=source_dir, cache=cache)
        except CompileError as exc:
            row.error, row.error_detail = exc.error, exc.detail
            log(f"  patch {s.variant_id}: {exc.error}: {exc.detail[:200]}")
            return row, None
        row.compile = stats
        try:
            base, _ = compile_variant(family, s.config, spec.dtype, spec.params, spec.hardware.arch, spec.hardware.limits,
                                      cache=cache)
            report.notes.append(f"ptxas, unpatched: {facts_line(base)}; patched: {facts_line(stats)}")
        except CompileError as exc:
            report.notes.append(f"ptxas, unpatched: {exc.error}: {exc.detail[:200]}; patched: {facts_line(stats)}")
        log(f"  patch {s.variant_id}: compiled for {spec.hardware.arch}: {facts_line(stats)}")
        return row, source_dir
    finally:
        report.seconds = time.perf_counter() - t0


def child_env(backend: Any) -> dict[str, str]:
    """A GPU child's environment for patched native code: the worker environment, allowlisted."""
    env = backend.env(False)
    return {k: v for k, v in env.items() if k in ENV_ALLOW}


def hidden_shape(family: CudaFamily, spec: Any, rng: secrets.SystemRandom) -> dict[str, int] | None:
    """A shape no spec names: each dimension of the first correctness shape moved to a nearby odd value, or
    doubled where the family refuses odd ones (K of a block-scaled GEMM); None when nothing changed."""
    base = spec.correctness_shapes[0]
    cand = dict(base)
    for k, v in base.items():
        for value in (v + 2 * rng.randrange(1, 32) + 1, 2 * v):
            if family.check_shape({**cand, k: value}) is None:
                cand[k] = value
                break
    return cand if cand != base else None


def run_on_gpu(backend: Any, bound: Any, rows: list[VariantResult], dirs: list[Path], log: Callable[[str], None]) -> None:
    """Correctness (secret seed, a hidden shape) and same-batch timing of the patched cubins in an
    allowlisted child; a failure is the row's error."""
    from resources.workers import WorkerPool

    spec, family = bound.spec, bound.family
    rng = secrets.SystemRandom()
    seed = backend.patch_seed or rng.randrange(1, 2**31)
    shapes = list(spec.correctness_shapes)
    hidden = hidden_shape(family, spec, rng)
    if hidden:
        shapes.append(hidden)
    timeout = backend.timeout_s or spec.benchmark.timeout_s
    name = family.lookup or family.name
    with WorkerPool(1, child_env(backend)) as pool:
        for row, d in zip(rows, dirs):
            cfg = {**row.config, CUDA_SOURCE_KEY: str(d)}
            (res,) = pool.run([{"op": "correctness", "family": name, "config": cfg, "dtype": spec.dtype, "shapes": shapes,
                                "tolerance": spec.constraints.numeric_tolerance, "params": spec.params, "device": "cuda",
                                "interpret": False, "seed": seed}], timeout)
            row.gate.seeds, row.gate.cases = 1, len(shapes)
            row.gate.hidden_shapes = [family.shape_label(hidden)] if hidden else []
            if "correctness" not in res:
                row.error, row.error_detail = res.get("error", "runtime_error"), res.get("detail", "")
                continue
            row.correctness = Correctness(**res["correctness"])
            if not row.correctness.ok:
                row.error = "nan_inf" if row.correctness.nan_inf else "numeric_mismatch"
                row.error_detail = row.correctness.mismatch_sample[:600]
                continue
            (res,) = pool.run([{"op": "measure_batch", "family": name, "baseline": spec.baseline, "configs": {"v": cfg},
                                "dtype": spec.dtype, "shapes": spec.shape_matrix, "params": spec.params,
                                "warmup_ms": spec.benchmark.warmup_ms, "rep_ms": spec.benchmark.rep_ms,
                                "batch_id": f"{spec.task_id}/patch/{row.variant_id}", "rounds": 4, "order": "interleaved"}],
                              timeout * 2)
            if "batch" not in res:
                row.error, row.error_detail = res.get("error", "runtime_error"), res.get("detail", "")
                continue
            row.batch_baseline = [Measurement(**m) for m in res["batch"]["baseline"]]
            row.measurements = [Measurement(**m) for m in res["batch"]["v"]]
            row.evidence = "cuda"
            log(f"  patch {row.variant_id}: correct on {len(shapes)} shape(s) (secret seed), timed beside the baseline")


def evaluate_cuda_patches(backend: Any, bound: Any, suggestions: list, log: Callable[[str], None], stats: Any) -> list[VariantResult]:
    """A backend's ``evaluate`` for a CUDA family when some suggestions carry a patch: config-only ones as
    usual, patched ones through the stages above."""
    rows: list[Any] = [None] * len(suggestions)
    plain = [i for i, s in enumerate(suggestions) if not s.patch]
    if plain:
        for i, row in zip(plain, backend._evaluate(bound, [suggestions[i] for i in plain], log, stats)):
            rows[i] = row
    patched = [i for i, s in enumerate(suggestions) if s.patch]
    with tempfile.TemporaryDirectory(prefix="kregress-cu-patch-") as tmp:
        compiled: list[tuple[VariantResult, Path]] = []
        for n, i in enumerate(patched):
            row, d = static_and_compile(backend, bound, suggestions[i], Path(tmp) / f"p{n}", log)
            rows[i] = row
            if d is not None and row.error is None:
                compiled.append((row, d))
        if backend.interpret:
            for row, _ in compiled:
                row.error_detail = f"{COMPILE_FACTS_ONLY} ({row.gate.notes[-1] if row.gate.notes else facts_line(row.compile)})"
        elif compiled:
            run_on_gpu(backend, bound, [r for r, _ in compiled], [d for _, d in compiled], log)
    return rows


# --- the llm policy's patches to .cu files (search.patches: true) -------------------------------------------

CUDA_PATCH_ADDENDUM = """\
This task also accepts source patches to the CUDA C++ kernel. An element may carry the key "patch":
SEARCH/REPLACE blocks that edit only the EDITABLE SOURCE shown (the kernel functions of the .cu file),
each block written as
  PATH
  <<<<<<< SEARCH
  exact lines copied from the source
  =======
  the lines to put instead
  >>>>>>> REPLACE
At most {max_lines} changed lines. Keep each kernel's name, template parameters and arguments; no #include,
no host I/O, processes, sockets, environment reads, system calls or clock reads. Static shared memory
over 48 KiB does not compile on sm_90. A patch is compiled, then checked on secret inputs on a GPU."""


def cuda_sources(family: CudaFamily) -> tuple[dict[str, str], str]:
    """({path as a patch names it: text} of the family's .cu files, the first one's path)."""
    _root, files = editable_files(family)
    texts = {rel: f.read_text(encoding="utf-8") for rel, f in files.items()}
    return texts, next(iter(files))


def cuda_source_text(family: CudaFamily, max_chars: int) -> str:
    """The kernel functions of the .cu files with line numbers, cut at ``max_chars``: what a model sees."""
    from kregress.core.cuda_source import kernel_regions

    texts, _first = cuda_sources(family)
    parts = []
    for rel, text in texts.items():
        lines = text.splitlines()
        for r in kernel_regions(text, rel, tuple(family.kernel_functions)):
            body = "\n".join(f"{n:>4} {lines[n - 1]}" for n in range(r.start, r.end + 1))
            parts.append(f"// {rel} lines {r.start}-{r.end} ({r.name})\n{body}")
    out = "\n\n".join(parts)
    if len(out) > max_chars:
        out = out[: max(0, max_chars - 60)].rsplit("\n", 1)[0] + "\n// (editable source cut here to fit the prompt)"
    return out
