"""Patches to a CUDA family's ``.cu`` files: judged through ``kregress judge`` and a sweep's patch path.

A patch is a unified diff against the family's ``.cu`` files (paths relative to the family package's
root, as for Triton patches). In order, each stage putting its cause on the row:

1. **Region** (REGRESS ``rejected``): the patch applies and reverts exactly, touches only the listed
   ``.cu`` files, changes lines only inside the family's ``kernel_functions`` (their ``__global__`` and
   ``__device__`` definitions, template heads included; comments and blank lines elsewhere are free),
   leaves the code between them as it was, and stays under ``patches.max_changed_lines``.
2. **Confinement** (REGRESS ``rejected``, "not judged"): without bubblewrap (``kernels.cuda.confine``) no
   patch is preprocessed, compiled or run: the row says ``apt-get install bubblewrap``.
3. **Rules on the preprocessed unit** (REGRESS ``rejected``; ``kernels.cuda.rules``): ``nvcc -E`` of the
   patched copy and of the family's own files, confined, with the compile's arch, flags and macros. Every
   included file lies in the family's sources, the toolkit or the system headers (named, never quoted);
   the family's tokens hold no timer, SM identity or special-register read in inline asm, no environment,
   file, process or dynamic-loading call, and no ``#line``; outside the kernel functions the tokens are the
   unpatched unit's, token for token. Macros, token pasting, digraphs, comments and split literals change
   none of it: the rules read what the compiler reads.
4. **Compile** (REGRESS ``infeasible``): the patched copy compiled by nvcc for the spec's arch, confined;
   ptxas's over-limit error (``uses too much shared data``) and any other nvcc error are the row's error,
   in the tool's own words; the spec's register, spill and shared-memory constraints apply to its facts.
5. **CPU host**: nothing can run the kernel, so the row has compile facts only and says so
   (NEEDS_REVIEW, never PASS), with ptxas's facts of the patched kernel beside the unpatched one's.
   **GPU host**: a confined child (``kernels.cuda.gpu_child``: bwrap, no network namespace means no
   judgement, allowlisted environment, killed past its time limit) checks the patched cubin against the
   float64 reference with output memory NaN-poisoned on every case of ``gpu_cases`` (every timed shape,
   the correctness shapes, a hidden odd shape, a shape just past every timed value of every dimension, a
   large one, the least shape; secret seed), then times it in one batch beside the baseline.
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
from kernels.cuda.nvcc import compile_variant, sources_root
from kernels.cuda.rules import patch_findings
from kregress.core.cuda_source import local_headers, region_findings
from kregress.core.family import CUDA_SOURCE_KEY, CudaFamily
from kregress.core.gate import GateReport
from kregress.core.patch import SEARCH_REPLACE_FORMAT, Finding, NotAPatch, PatchApplyError, PatchFormatError, apply_and_check, parse_patch
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
    """A GPU child's environment for patched native code: the worker environment, allowlisted (no keys);
    ``KREGRESS_NVCC`` set to the toolkit's own nvcc (its ``--version`` is part of the cubin cache key)."""
    env = backend.env(False)
    out = {k: v for k, v in env.items() if k in ENV_ALLOW}
    from kregress.core.cuda_source import find_nvcc

    nvcc = find_nvcc()
    if nvcc:
        out["KREGRESS_NVCC"] = str(confine.real_nvcc(nvcc))
    return out


def gpu_job(bound: Any, cfg: dict, cases: list, seed: int, batch_id: str) -> dict:
    """The GPU child's job for one patched variant: every case (timed, hidden, structure) checked, then the
    timed shapes measured beside the baseline."""
    spec, family = bound.spec, bound.family
    return {"family": family.lookup or family.name, "params": spec.params, "config": cfg, "dtype": spec.dtype,
            "tolerance": spec.constraints.numeric_tolerance, "seed": seed,
            "cases": [{"kind": c.kind, "shape": c.shape} for c in cases],
            "measure": {"baseline": spec.baseline, "shapes": spec.shape_matrix, "warmup_ms": spec.benchmark.warmup_ms,
                        "rep_ms": spec.benchmark.rep_ms, "batch_id": batch_id, "rounds": 4}}


def run_child(job: dict, work: Path, ro: list[Path], env: dict[str, str], family_root: Path | None,
              timeout: float) -> dict:
    """One confined GPU child (``kernels.cuda.gpu_child``): its answer, or the row's error."""
    import json
    import subprocess

    from kernels.cuda.gpu_child import PREFIX, child_command

    why = confine.problem()
    if why:
        return {"error": "patch_rejected", "detail": f"not judged: {why}"}
    cmd, _ = child_command(work, ro, env, family_root)
    try:
        proc = confine.run_prepared(cmd, json.dumps(job), timeout)
    except subprocess.TimeoutExpired:
        return {"error": "timeout", "detail": f"the GPU child ran past {timeout:.0f} s and was killed"}
    except confine.ConfinementError as exc:
        return {"error": "patch_rejected", "detail": f"not judged: {exc}"}
    for line in proc.stdout.splitlines():
        if line.startswith(PREFIX):
            return json.loads(line[len(PREFIX):])
    if proc.returncode != 0 and proc.stderr.startswith("bwrap:"):
        return {"error": "patch_rejected", "detail": f"not judged: bwrap could not start the GPU child: {proc.stderr[:200]}"}
    return {"error": "crashed", "detail": f"the GPU child exited {proc.returncode} with no answer: {proc.stderr.strip()[-300:]}"}


def run_on_gpu(backend: Any, bound: Any, rows: list[VariantResult], dirs: list[Path], log: Callable[[str], None]) -> None:
    """Every case of ``gpu_cases`` (the timed shapes, hidden odd, past-timed and large shapes, the structure
    case; secret seed; output memory NaN-poisoned) and same-batch timing of the patched cubins, each in its
    own confined child (bwrap: no network, allowlisted environment); a failure is the row's error. No
    bwrap, no judgement."""
    from kernels.cuda.gpu_child import gpu_cases

    spec, family = bound.spec, bound.family
    why = confine.problem()
    if why:
        for row in rows:
            row.error, row.error_detail = "patch_rejected", f"not judged on the GPU: {why}"
        return
    rng = secrets.SystemRandom()
    seed = backend.patch_seed or rng.randrange(1, 2**31)
    cases = gpu_cases(family, spec, rng)
    timeout = backend.timeout_s or spec.benchmark.timeout_s
    cache = backend.cache_root() / "cuda"
    try:  # the baseline's cubin, built here (trusted), for the child to load: the child compiles nothing
        compile_variant(family, spec.baseline, spec.dtype, spec.params, spec.hardware.arch, spec.hardware.limits, cache=cache)
    except CompileError as exc:
        log(f"  the baseline did not compile for the GPU stage: {exc.error}: {exc.detail[:200]}")
    env = child_env(backend)
    env["KREGRESS_CUDA_CACHE"] = str(cache)
    root = package_root(family)
    for row, d in zip(rows, dirs):
        cfg = {**row.config, CUDA_SOURCE_KEY: str(d)}
        with tempfile.TemporaryDirectory(prefix="kregress-cu-gpu-") as work:
            res = run_child(gpu_job(bound, cfg, cases, seed, f"{spec.task_id}/patch/{row.variant_id}"), Path(work),
                            [sources_root(family, d), cache], env, root, timeout * 3)
        row.gate.seeds, row.gate.cases = 1, len(cases)
        row.gate.hidden_shapes = [f"{c.kind} {family.shape_label(c.shape)}" for c in cases if c.kind not in ("timed", "correctness")]
        row.gate.notes.append("GPU cases: " + ", ".join(f"{c.kind} {family.shape_label(c.shape)}" for c in cases))
        if res.get("correctness"):
            row.correctness = Correctness(**res["correctness"])
        if "error" in res:
            row.error, row.error_detail = res["error"], res.get("detail", "")
            continue
        if res.get("failed"):
            f = res["failed"]
            row.error = "nan_inf" if row.correctness and row.correctness.nan_inf else "numeric_mismatch"
            row.error_detail = (f"{f['kind']} shape {family.shape_label(f['shape'])}: "
                                f"{row.correctness.mismatch_sample[:500] if row.correctness else ''}")
            continue
        if "batch" not in res:
            row.error, row.error_detail = "runtime_error", "the GPU child returned no timing"
            continue
        row.batch_baseline = [Measurement(**m) for m in res["batch"]["baseline"]]
        row.measurements = [Measurement(**m) for m in res["batch"]["v"]]
        row.evidence = "cuda"
        log(f"  patch {row.variant_id}: correct on {len(cases)} case(s) incl. every timed shape (secret seed, "
            f"poisoned outputs), timed beside the baseline")


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
""" + SEARCH_REPLACE_FORMAT + """At most {max_lines} changed lines. Keep each kernel's name, template parameters and arguments; no #include,
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
