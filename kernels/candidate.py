"""The judging parent of the patch gate: static stage, the sandboxed children's jobs, the comparison
and the verdict's inputs, for a judgement's patches.

The gate's home: pure decisions in ``kregress.core`` (``patch``: the patch format and region; ``gate``:
the static policy, the gate report and the verdict; ``checks``: the named run-time checks and error
kinds); process machinery in ``kernels`` (``sandbox``: confinement, zygote, wire protocol;
``gate_child``: what a sandboxed child runs; ``gate_cases``: the secret cases; ``gate_compare``: the
comparisons; ``gate_compile``: compile units of a patched kernel; this module: the judging parent).

The judging process (``judge_patches``) never imports a candidate. It:

1. checks each patch statically (``kregress.core.patch`` and ``kregress.core.gate``) and applies it to
   a temporary copy of the family's package (the working tree is only read);
2. draws a secret seed (``secrets``; never shown to the agent, never written to a report) and builds the
   cases: every correctness shape, an odd shape (no multiple of any tile) and a shape of ones, a shape
   aligned to every tile, and hidden shapes larger than every correctness shape (one aligned, one odd)
   that the agent never saw; on a GPU the timed shapes too. Each shape runs on >= 3 seeds across four
   value distributions (normal, uniform, large magnitudes, outliers), twice: the second call puts other
   values in the same buffers, so a result cached by pointer or shape fails;
3. has a sandboxed child of the *pristine* package (``kernels.sandbox``) make the inputs, the float64
   reference and the baseline's own outputs (its error is the precision yardstick, and the aten ops it
   runs are the audit's allowlist). A case the baseline itself fails is dropped and said so;
4. for each candidate, forks a sandboxed child of the *patched* copy that AOT-compiles the kernel for the
   spec's arch (the compile units follow the patched signature: a new ``tl.constexpr`` takes its value
   from the wrapper's own launch, or its default), and another that runs the cases: candidate-allocated
   memory is poisoned (``torch.empty`` fills NaN; freed blocks are NaN-filled first) and no reference
   result ever existed in that process; each call runs under a ``TorchDispatchMode`` that records the aten
   ops, and the audit hook's refusals and new Python threads are recorded;
5. compares in the judging process: outputs against the reference (tolerance by dtype and shape), inputs
   against their values before the call (they must not change), the error against the baseline's
   (precision), the ops against the baseline's (torch computing instead of the kernel), and times on a
   GPU with the baseline re-timed in the same batch, interleaved, then checks correctness again after the
   timing loop.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from kernels import sandbox as _sandbox
from kernels.gate_cases import DISTRIBUTIONS, shape_groups
from kernels.gate_compare import (
    _structure_problem,
    _Tally,
    _where,
    base_writes,
    buffer_problems,
    grids_of,
    input_problems,
    program_differences,
    sampled_suspicions,
)
from kregress.core.checks import (
    ErrorKind,
    Evidence,
    RunSeen,
    Settlement,
    SettlingCheck,
    Suspicion,
    decide_sampled,
    reduced_run_check,
    run_problems,
)
from kregress.core.gate import GateReport, PrecisionMetrics, static_gate
from kregress.core.gate_verdict import JudgedReport
from kregress.core.patch import (
    EditableSet,
    NotAPatch,
    PatchApplyError,
    PatchFormatError,
    apply_and_check,
    check_region,
    editable_set,
    materialize,
    parse_patch,
    read_sources,
)
from kregress.core.records import base_row



# --- the judging process ----------------------------------------------------------------------------------


@dataclass
class Candidate:
    """One patch on its way through the gate."""

    index: int
    suggestion: Any
    report: GateReport
    new_texts: dict[str, str] = field(default_factory=dict)
    error: str | None = None
    detail: str = ""


@dataclass
class JudgeOptions:
    """How the gate runs. ``static`` False skips the static policy: only tests use it, to show that the
    run-time layers catch a cheat on their own."""

    seed: int | None = None  # the secret; None draws one
    static: bool = True
    isolate_network: bool = True
    mem_bytes: int | None = 16 << 30  # address-space limit of a CPU child (None on a GPU host)
    max_changed_lines: int = 60
    precision_factor: float = 4.0
    plausibility_factor: float = 2.0
    seeds: int = 3
    keep_dirs: bool = False

    @classmethod
    def for_spec(cls, spec: Any, **kw: Any) -> "JudgeOptions":
        p = spec.patches
        return cls(max_changed_lines=p.max_changed_lines, precision_factor=p.precision_factor,
                   plausibility_factor=p.plausibility_factor, seeds=p.seeds, **kw)


_MODULE_NAMES: dict[str, str | None] = {}


def module_resolver() -> Callable[[str], str | None]:
    """For the static gate: the name of the module a dotted name under torch, triton or math really is
    (``triton.language.core.builtins`` -> ``builtins``), None when it is no module. Asks the module
    objects of this (the judging) process, so a re-export a later Triton adds is found too; no
    candidate code is involved, only the names the candidate wrote."""
    import importlib
    import types

    def resolve(name: str) -> str | None:
        if name in _MODULE_NAMES:
            return _MODULE_NAMES[name]
        parts = name.split(".")
        out = None
        if parts[0] in ("torch", "triton", "math") and not any(p.startswith("_") or not p.isidentifier() for p in parts):
            try:
                obj: Any = importlib.import_module(parts[0])
                for p in parts[1:]:
                    obj = getattr(obj, p)
                out = obj.__name__ if isinstance(obj, types.ModuleType) else None
            except Exception:  # noqa: BLE001 - no such attribute (or one that fails): not a module
                out = None
        _MODULE_NAMES[name] = out
        return out

    return resolve


def static_stage(family: Any, es: EditableSet, texts: dict[str, str], base_hash: str, s: Any,
                 opts: JudgeOptions) -> Candidate:
    """Parse, apply (with the revert checked), region and static policy: the judgement of a patch that
    needs no process. ``error`` is patch_failed (does not apply) or patch_rejected (refused)."""
    from kregress.core.records import patch_sha256

    rep = JudgedReport(patch_sha256=patch_sha256(s.patch), base_hash=base_hash, precision_factor=opts.precision_factor,
                     plausibility_factor=opts.plausibility_factor)
    cand = Candidate(index=-1, suggestion=s, report=rep)
    try:
        patch = parse_patch(s.patch)
    except (NotAPatch, PatchFormatError) as exc:
        cand.error, cand.detail = ErrorKind.PATCH_FAILED.value, f"not a usable diff: {exc}"
        return cand
    rep.changed_lines = patch.changed_lines
    region = check_region(es, patch, texts, {}, opts.max_changed_lines)  # files, statuses and size, before applying
    if region:
        rep.findings = region
        cand.error, cand.detail = ErrorKind.PATCH_REJECTED.value, "; ".join(f.text() for f in region)[:1500]
        return cand
    try:
        applied = apply_and_check(patch, texts)
    except PatchApplyError as exc:
        cand.error, cand.detail = ErrorKind.PATCH_FAILED.value, f"does not apply to the kernel source {base_hash}: {exc}"
        return cand
    rep.round_trip_ok = applied.round_trip_ok
    new_texts = {**texts, **applied.new_texts}
    rep.patched_hash = family.source_hash({es.files[rel]: t for rel, t in new_texts.items()})
    findings = check_region(es, patch, texts, new_texts, opts.max_changed_lines)
    if opts.static:
        findings += static_gate(es.wrappers, [f for f in patch.files if f.path in es.files], texts, new_texts,
                                module_resolver())
    rep.findings = findings
    if findings:
        cand.error, cand.detail = ErrorKind.PATCH_REJECTED.value, "; ".join(f.text() for f in findings)[:1500]
        return cand
    cand.new_texts = new_texts
    return cand


def judge_patches(spec: Any, family: Any, suggestions: list[Any], *, backend: str, cache_root: Path,
                  timeout_s: float, log: Callable[[str], None] = print, options: JudgeOptions | None = None,
                  workers: int = 0, time_rows: Callable[[list, dict], None] | None = None) -> list[tuple[Any, GateReport]]:
    """Rows (``VariantResult``) and gate reports for patch suggestions, in order. ``backend`` is
    ``interpreter`` (CPU: correctness in the Triton interpreter, latency from the family's model) or
    ``cuda`` (correctness and timing on the GPU, the baseline re-timed in the same batch). ``workers``:
    candidates judged at once (0: one per CPU core, at most 4, on the interpreter; always 1 on a GPU).
    ``time_rows(rows, timers)``: on a GPU, times the patches that passed correctness (a ``PatchTimer`` per
    row index), their children still alive: ``resources.gpu.CudaBackend`` times them with its config
    variants on one plan; by default ``time_patch_rows`` (the same groups and looks, patches only)."""
    opts = options or JudgeOptions.for_spec(spec)
    t_all = time.perf_counter()
    es = editable_set(family)
    texts = read_sources(es)
    base_hash = family.source_hash({es.files[rel]: t for rel, t in texts.items()})
    out: list[tuple[Any, GateReport]] = []
    live: list[tuple[int, Candidate]] = []
    for i, s in enumerate(suggestions):
        row = base_row(s, backend)
        row.patch_base_hash = base_hash
        problem = family.space.check(s.config, spec.params, spec.hardware.limits)
        if problem:
            row.error, row.error_detail = "invalid_config", problem
            out.append((row, GateReport(base_hash=base_hash, patch_sha256=row.patch_sha256)))
            continue
        cand = static_stage(family, es, texts, base_hash, s, opts)
        if cand.error:
            row.error, row.error_detail = cand.error, cand.detail
        else:
            live.append((i, cand))
        out.append((row, cand.report))
    if live:
        work = Path(tempfile.mkdtemp(prefix="kregress-judge-"))
        try:
            judgement = _Judgement(spec, family, es, texts, backend, cache_root, timeout_s, log, opts, work)
            if time_rows is not None:
                judgement.time_rows = time_rows
            judgement.run(live, out, workers)
        finally:
            if not opts.keep_dirs:
                shutil.rmtree(work, ignore_errors=True)
    log(f"judged {len(suggestions)} patch(es) in {time.perf_counter() - t_all:.1f}s")
    return out


# A candidate's cases may take this many times the reference child's preparation of them (see _prepare).
CASE_BUDGET_FACTOR = 3.0


class _Judgement:
    """One judgement's processes and secret cases: the zygote, the reference child, the candidates."""

    def __init__(self, spec, family, es, texts, backend, cache_root, timeout_s, log, opts, work):
        import kregress
        from kregress.core.paths import REPO_ROOT

        self.spec, self.family, self.es, self.texts = spec, family, es, texts
        self.on_gpu = backend == "cuda"
        self.device = "cuda" if self.on_gpu else "cpu"
        self.cache_root, self.timeout_s, self.log, self.opts, self.work = Path(cache_root), timeout_s, log, opts, work
        kregress_root = str(Path(kregress.__file__).resolve().parents[1])
        self.env = _sandbox.sandbox_env(interpret=not self.on_gpu, pythonpath=[str(REPO_ROOT), kregress_root])
        self.limits = {"cpu_s": max(60.0, 4 * timeout_s), "mem_bytes": None if self.on_gpu else opts.mem_bytes,
                       "fsize_bytes": 1 << 30}
        self.purge = sorted(set(es.packages()) | ({Path(es.module_file).stem} if len(Path(es.module_file).parts) == 1 else set()))
        self.tools = _sandbox.compiler_tools()
        self.ref_lock = threading.Lock()  # the baseline's child answers one job at a time (candidates run side by side)
        self.pending: list[PatchTimer] = []  # on a GPU: the patches that passed correctness, to be timed
        self.time_rows: Callable[[list, dict], None] = lambda rows, timers: time_patch_rows(rows, timers, log)

    def child_spec(self, root: Path, name: str, interpret: bool) -> dict:
        d = self.work / name
        d.mkdir(parents=True, exist_ok=True)
        return {"root": str(root), "work": str(d), "interpret": interpret,
                "watch": [str(root / rel) for rel in self.es.files],
                "watch_wrappers": {str(root / rel): list(self.es.wrappers.get(rel, ())) for rel in self.es.files},
                "family": self.family.lookup or self.family.name, "params": self.spec.params, "purge": self.purge,
                "arch": self.spec.hardware.arch,
                "limits": self.limits, "exec_allowed": self.tools, "allow_ctypes": self.on_gpu,
                "isolate_network": self.opts.isolate_network, "sandbox": True}

    def run(self, live: list[tuple[int, Candidate]], out: list, workers: int) -> None:
        import random
        from concurrent.futures import ThreadPoolExecutor

        spec, opts = self.spec, self.opts
        secret = opts.seed if opts.seed is not None else secrets.randbits(62)
        self.secret = secret
        rng = random.Random(secret)
        seeds = [rng.randrange(1, 2**62) for _ in range(max(3, opts.seeds))]
        self.decoy_seed = rng.randrange(1, 2**31)
        groups = shape_groups(self.family, spec.correctness_shapes, spec.shape_matrix, self.on_gpu, rng, seeds, spec.params)
        self.log(f"judging {len(live)} patch(es) in sandboxed children ({'cuda' if self.on_gpu else 'interpreter'}); "
                 f"{len(groups)} case group(s), {len(seeds)} secret seeds, distributions {', '.join(DISTRIBUTIONS)}")
        try:
            with _sandbox.Zygote(self.env, cwd=self.work) as zyg:
                self.zyg = zyg
                for g in groups:  # one draw of slots and pool per case, run by the baseline; each candidate its own pick
                    if g.get("sample"):
                        g["sample_seed"] = self._sample_seed(g, "sampled")
                        g["candidate_seeds"] = [self._sample_seed(g, f"cand{i}") for i, _ in live]
                self.groups = {g["id"]: g for g in groups if "id" in g}
                self._prepare(groups)
                lanes = 1 if self.on_gpu else max(1, min(len(live), workers or min(4, os.cpu_count() or 1)))
                with ThreadPoolExecutor(max_workers=lanes) as pool:
                    list(pool.map(lambda ic: self._one(ic[0], ic[1], *out[ic[0]]), live))
                self._time_pending()
                self.ref.end()
        except _sandbox.ChildFailed as exc:
            for i, _ in live:
                row, _rep = out[i]
                if row.error is None and row.correctness is None:
                    row.error = exc.error if exc.error in (ErrorKind.TIMEOUT.value, ErrorKind.CRASHED.value) else ErrorKind.RUNTIME_ERROR.value
                    row.error_detail = exc.detail

    def _prepare(self, groups: list[dict]) -> None:
        """The reference child: inputs, float64 reference and baseline outputs of every case."""
        spec = self.spec
        pristine = materialize(self.es, self.texts, self.work / "pristine")
        self.ref = self.zyg.fork(self.child_spec(pristine, "reference", interpret=not self.on_gpu))
        t0 = time.perf_counter()
        head, blobs = self.ref.call({"job": "prepare", "groups": groups, "config": spec.baseline, "params": spec.params,
                                     "correctness": spec.correctness_shapes,
                                     "dtype": spec.dtype, "tolerance": spec.constraints.numeric_tolerance,
                                     "device": self.device, "reference_device": self.device, "keep": self.on_gpu},
                                    timeout=max(self.timeout_s, 60.0) * 4)
        if head.get("error"):
            raise _sandbox.ChildFailed("runtime_error", f"the reference child failed: {head.get('detail')}")
        self.cases = head["cases"]
        self.base_ops = set(head["ops"])
        self.base_op_count = int(head.get("op_count", 0))
        self.base_threads = int(head.get("threads", 0))
        self.dropped = head["dropped"]
        self.data = {c["id"]: _sandbox.unpack(c["payload"], blobs) for c in self.cases}
        self.base_tally = _Tally(self.family, spec.dtype)
        for c in self.cases:
            d = self.data[c["id"]]
            if c.get("sampled"):
                continue  # compared by sampled_problems; the baseline ran only sampled programs of it
            self.base_tally.add(f"{c['label']} {c['dist']}", d["base"], d["ref"], c["tol"])
            if "ref2" in d:
                self.base_tally.add(f"{c['label']} {c['dist2']}", d["base2"], d["ref2"], c["tol"])
        # the candidate's cases are budgeted from what the baseline needed for them (the same cases, plus the
        # reference), not only from the spec's per-variant limit: the gate's own hidden cases (long sequences,
        # sampled launches) are never charged to a patch as a timeout
        self.case_timeout = max(self.timeout_s, CASE_BUDGET_FACTOR * (time.perf_counter() - t0))
        self.limits["cpu_s"] = max(self.limits["cpu_s"], 2 * self.case_timeout)
        self.log(f"  reference: {len(self.cases)} case group(s) with the float64 reference and the baseline's outputs "
                 f"({time.perf_counter() - t0:.1f}s){'; dropped: ' + '; '.join(self.dropped) if self.dropped else ''}")

    def _one(self, i: int, cand: Candidate, row: Any, rep: GateReport) -> None:
        """Compile (one child) and the cases (another), side by side; then compare and time."""
        from concurrent.futures import ThreadPoolExecutor

        t1 = time.perf_counter()
        cases = self.cases
        rep.cases = sum(2 if "inputs2" in self.data[c["id"]] else 1 for c in cases)
        rep.cases_dropped = list(self.dropped)
        rep.hidden_shapes = [c["label"] for c in cases if c["kind"] in ("odd", "ones", "aligned", "hidden_odd") or c["kind"].startswith(("structure", "past_"))
                             or c["kind"].startswith("stretched")]
        rep.seeds = len({c["seed_index"] for c in cases})
        rep.distributions = sorted({c["dist"] for c in cases} | {c["dist2"] for c in cases if "dist2" in c})
        root = materialize(self.es, cand.new_texts, self.work / f"cand{i}")
        try:
            with ThreadPoolExecutor(max_workers=2) as pool:
                fc = pool.submit(self._compile, row, rep, root, f"cand{i}-compile")
                fr = pool.submit(self._cases, row, rep, root, f"cand{i}")
                compiled, ran = fc.result(), fr.result()
            self._conclude(row, rep, compiled, ran)
        except _sandbox.ChildFailed as exc:
            row.error, row.error_detail = exc.error, exc.detail
        rep.seconds = time.perf_counter() - t1
        self.log(f"  {row.variant_id}: {row.error or 'correct'} ({rep.seconds:.1f}s)")

    def _compile(self, row: Any, rep: GateReport, root: Path, name: str) -> dict:
        """AOT compile of the patched kernels for the spec's arch in a child (no interpreter), cached by
        the patched kernel hash: {"stats"} or {"error", "detail"}, with the child's violations."""
        import json

        from kernels.compile import cache_key
        from kregress.core.records import variant_hash

        spec, hw = self.spec, self.spec.hardware
        key = cache_key(self.family.name, rep.patched_hash, variant_hash(row.config, row.patch), spec.dtype, hw.arch,
                        spec.params)
        cfile = self.cache_root / "compile" / f"{key}.json"
        try:
            hit = json.loads(cfile.read_text())
            hit["notes"] = hit.get("notes", []) + ["compile: from the cache"]
            return hit
        except (OSError, ValueError):
            pass
        t0 = time.perf_counter()
        try:
            comp = self.zyg.fork(self.child_spec(root, name, interpret=False))
        except _sandbox.ChildFailed as exc:
            return {"error": "compile_failed" if exc.error == "compile_failed" else exc.error, "detail": exc.detail}
        try:
            head, _ = comp.call({"job": "compile", "config": row.config, "params": spec.params, "dtype": spec.dtype,
                                 "arch": hw.arch, "limits": hw.limits.model_dump(), "shapes": spec.shape_matrix,
                                 "fallback_shapes": spec.correctness_shapes}, timeout=self.timeout_s)
        except _sandbox.ChildFailed as exc:
            head = {"error": exc.error if exc.error == "timeout" else "compile_failed", "detail": exc.detail}
        finally:
            comp.end()
        violations = comp.hello.get("violations", []) + head.get("violations", [])
        if head.get("error") not in (None, "compile_failed", "out_of_resources", "timeout"):
            head["error"] = "compile_failed"  # anything that stops the compile (an exception in the wrapper, say)
        res = {k: head[k] for k in ("stats", "error", "detail", "notes") if k in head}
        res["notes"] = res.get("notes", []) + [f"compile {time.perf_counter() - t0:.1f}s"]
        if violations:
            res["violations"] = violations
        elif "stats" in res or res.get("error") in ("compile_failed", "out_of_resources"):
            cfile.parent.mkdir(parents=True, exist_ok=True)
            tmp = cfile.with_suffix(f".tmp{os.getpid()}-{threading.get_ident()}")
            tmp.write_text(json.dumps({k: v for k, v in res.items() if k != "notes"} | {"notes": res["notes"][:-1]}))
            tmp.replace(cfile)
        return res

    def _cases(self, row: Any, rep: GateReport, root: Path, name: str) -> dict:
        """The secret cases in a sandboxed child of the patched copy: outputs, inputs after each call, ops."""
        blobs: list[bytes] = []
        job_cases = []
        for c in self.cases:
            d = self.data[c["id"]]
            payload = {"inputs": d["inputs"]}
            if "inputs2" in d:
                payload["inputs2"] = d["inputs2"]
            job_cases.append({"id": c["id"], "payload": _sandbox.pack(payload, blobs), "keep": c["kind"] == "timed",
                              "decoy_seed": self.decoy_seed + len(job_cases),
                              "params": c.get("params", {}),
                              **({"sample": self._sample_seed(c, name),
                                  "programs": (c.get("programs") or {}).get(str(self._sample_seed(c, name)))}
                                 if c.get("sampled") else {})})
        t0 = time.perf_counter()
        try:
            child = self.zyg.fork(self.child_spec(root, name, interpret=not self.on_gpu))
        except _sandbox.ChildFailed as exc:
            return {"error": exc.error, "detail": exc.detail}
        try:
            head, rblobs = child.call({"job": "run", "cases": job_cases, "config": row.config, "params": self.spec.params,
                                       "device": self.device}, blobs, timeout=self.case_timeout)
        except _sandbox.ChildFailed as exc:
            child.end()
            return {"error": exc.error, "detail": exc.detail, "violations": child.hello.get("violations", [])}
        head["violations"] = child.hello.get("violations", []) + head.get("violations", [])
        head["seconds"] = time.perf_counter() - t0
        if (self.on_gpu or any(c.get("sampled") for c in self.cases)) and not head.get("error"):
            head["child"] = child  # kept for the timing loop, or a full run of a sampled case
        else:
            child.end()
        return {"head": head, "blobs": rblobs}

    def _conclude(self, row: Any, rep: GateReport, compiled: dict, ran: dict) -> None:
        """The gate's order: sandbox refusals (rejected), compile (infeasible), correctness (wrong),
        then precision metrics and latency."""
        from kernels.measure import model_measurements
        from kregress.core.records import CompileStats

        spec = self.spec
        rep.notes += compiled.get("notes", [])
        rep.runtime_violations += compiled.get("violations", [])
        head = ran.get("head") or {}
        rep.runtime_violations += head.get("violations", []) + ran.get("violations", [])
        child = head.pop("child", None)
        try:
            seen = RunSeen(ops=frozenset(head.get("ops", [])), op_count=int(head.get("op_count", 0)),
                           threads=int(head.get("threads", 0)), base_ops=frozenset(self.base_ops),
                           base_op_count=self.base_op_count, base_threads=self.base_threads)
            rep.runtime_violations += run_problems(seen, self.family.name, "cuda" if self.on_gpu else "interpreter")
            if rep.runtime_violations:
                row.error, row.error_detail = ErrorKind.PATCH_REJECTED.value, "sandbox: " + "; ".join(rep.runtime_violations)[:1200]
                return
            if "stats" not in compiled:
                row.error, row.error_detail = compiled.get("error", ErrorKind.COMPILE_FAILED.value), compiled.get("detail", "")
                return
            row.compile = CompileStats(**compiled["stats"])
            if "head" not in ran:
                row.error, row.error_detail = ran.get("error", ErrorKind.CRASHED.value), ran.get("detail", "")
                return
            if head.get("error"):
                row.error, row.error_detail = ErrorKind.RUNTIME_ERROR.value, head.get("detail", "")
                return
            crashes = self._compare(row, rep, head, ran["blobs"], child)
            rep.notes.append(f"cases {head.get('seconds', 0.0):.1f}s")
            if crashes:  # the candidate raised where the baseline ran: a crash, said as one
                row.error, row.error_detail = ErrorKind.CRASHED.value, "; ".join(crashes)[:600]
                return
            if not row.correctness.ok:
                row.error = ErrorKind.NAN_INF.value if row.correctness.nan_inf else ErrorKind.NUMERIC_MISMATCH.value
                row.error_detail = row.correctness.mismatch_sample[:600]
                return
            if not self.on_gpu:
                row.measurements = model_measurements(self.family, row.config, spec.shape_matrix, spec.dtype, spec.params,
                                                      row.compile, spec.hardware)
                row.evidence = "model"
                return
            self.pending.append(PatchTimer(child, self.ref, row, rep, spec, self.family, self.cases, self.timeout_s))
            child = None  # timed with the others (``_time_pending``), then ended
        finally:
            if child is not None:
                child.end()

    def _time_pending(self) -> None:
        """The patches that passed correctness on a GPU: timed together (``time_rows``), then checked again
        after the timing loop (``PatchTimer.finish``); then their children end."""
        if not self.pending:
            return
        try:
            self.time_rows([t.row for t in self.pending], dict(enumerate(self.pending)))
        finally:
            for t in self.pending:
                try:
                    t.finish(self.data)
                except _sandbox.ChildFailed as exc:
                    t.fail(exc.error, exc.detail)
                finally:
                    t.child.end()

    def _settle(self, settle: list[dict], child: Any, config: dict) -> dict[str, SettlingCheck]:
        """A full (unsampled) run of each sampled case whose sampled run left something to settle, in the
        same child, compared element by element: a split-K or persistent design is slow to judge, never
        wrong; a kernel that skips work on the timed shape is wrong. Per case id its ``SettlingCheck``."""
        if child is None:
            return {c["id"]: SettlingCheck("full run", Settlement.NONE, "the candidate's child is gone") for c in settle}
        blobs: list[bytes] = []
        job_cases = [{"id": c["id"], "payload": _sandbox.pack({"inputs": self.data[c["id"]]["inputs"]}, blobs)} for c in settle]
        budget = max(self.case_timeout, sum(4 * c.get("full_seconds", 0.0) + 30 for c in settle))
        head, rblobs = child.call({"job": "full", "cases": job_cases, "config": config, "params": self.spec.params,
                                   "device": self.device}, blobs, timeout=budget)
        if head.get("error"):
            raise _sandbox.ChildFailed("runtime_error", f"the full run of a sampled case failed: {head.get('detail')}")
        out: dict[str, SettlingCheck] = {}
        for res in head.get("results", []):
            c = next(c for c in settle if c["id"] == res["id"])
            if res.get("error"):
                out[c["id"]] = SettlingCheck("full run", Settlement.DIFFERED, f"the call raised {res['error']}")
                continue
            got = _sandbox.unpack(res["payload"], rblobs)
            t = _Tally(self.family, self.spec.dtype)
            t.add(f"{c['label']} {c['dist']} (full run)", got["out"], self.data[c["id"]]["ref"], c["tol"])
            for p in res.get("problems", []):
                t.problem(f"[{c['label']}] {p}")
            ok = t.correctness().ok
            out[c["id"]] = SettlingCheck("full run", Settlement.MATCHED if ok else Settlement.DIFFERED,
                                         "" if ok else t.correctness().mismatch_sample)
        vio = head.get("violations") or []
        if vio:
            raise _sandbox.ChildFailed(ErrorKind.PATCH_REJECTED.value, "sandbox: " + "; ".join(vio)[:300])
        return out

    def _reduced(self, c: dict, st: dict, child: Any, config: dict, wrong_ids: set[str]) -> SettlingCheck:
        """The settling check of a sampled case whose full run is past this host's budget (``reduced_run_check``):
        the wide case of the same timed shape (its launches' programs, the least work each), which the candidate
        ran whole beside the other cases, and the candidate's sampled programs run on its inputs again, in the
        candidate's child and in the baseline's."""
        groups = getattr(self, "groups", {})
        wide = next((w for w in self.cases if w["kind"] == "wide" and groups.get(w["id"], {}).get("wide_of") == c["shape"]),
                    None)
        if wide is None:
            return SettlingCheck("reduced run", Settlement.NONE, "no reduced case with the timed launch's programs "
                                 "(the wide case was not derived, or dropped: see cases_dropped)")
        if child is None:
            return SettlingCheck("reduced run", Settlement.NONE, "the candidate's child is gone")
        progs = [{"dims": list(la["dims"]), "pids": [[int(x) for x in p.split(",")] for p in la["pids"]]} for la in st["ran"]]
        replies = []
        for proc in (child, self.ref):
            blobs: list[bytes] = []
            job = {"id": wide["id"], "payload": _sandbox.pack({"inputs": self.data[wide["id"]]["inputs"]}, blobs),
                   "params": wide.get("params", {}), "sample": self._sample_seed(wide, "reduced"), "programs": progs}
            try:
                with self.ref_lock if proc is self.ref else contextlib.nullcontext():
                    head, _ = proc.call({"job": "run", "cases": [job], "config": config if proc is child else self.spec.baseline,
                                         "params": self.spec.params, "device": self.device}, blobs, timeout=self.case_timeout)
            except _sandbox.ChildFailed as exc:
                if proc is child:
                    raise  # the candidate's own child died or ran past its time: its error
                return SettlingCheck("reduced run", Settlement.NONE, f"the baseline's child failed ({exc.error}: {exc.detail[:200]})")
            res = (head.get("results") or [{}])[0]
            if head.get("error") or res.get("error") or not res.get("sampled"):
                return SettlingCheck("reduced run", Settlement.NONE if proc is self.ref else Settlement.DIFFERED,
                                     f"the sampled run of the reduced case {wide['label']} failed: "
                                     f"{head.get('detail') or res.get('error') or 'no sampling statistics'}")
            replies.append(res["sampled"])
        mine, theirs = replies
        timed = program_differences(st, c.get("base_writes") or [])
        return reduced_run_check(timed, grids_of(st), program_differences(mine, base_writes(theirs)), grids_of(mine),
                                 wide["id"] not in wrong_ids, wide["label"])

    def _sample_seed(self, case: dict, name: str) -> int:
        """A seed drawn from the judgement's secret for ``name`` and the case: the slots and pool of the
        case's sampled run (``name`` "sampled", run by the baseline), and per candidate its own pick from
        them (and the draw for a launch the baseline did not make)."""
        import random

        return random.Random(f"{self.secret}:{name}:{case['id']}").randrange(1, 2**31)

    def _compare(self, row: Any, rep: JudgedReport, head: dict, blobs: list[bytes], child: Any = None) -> list[str]:
        tally = _Tally(self.family, self.spec.dtype)
        prec = _Tally(self.family, self.spec.dtype)
        by_id = {c["id"]: c for c in self.cases}
        suspects: list[tuple[dict, list[Suspicion], dict]] = []
        wrong_ids: set[str] = set()  # the cases the candidate got wrong (a reduced case settles nothing then)
        crashes: list[str] = []
        for res in head["results"]:
            c = by_id[res["id"]]
            d = self.data[c["id"]]
            before = (tally.mismatches, tally.nan_inf)
            if res.get("error"):
                tally.problem(f"[{c['label']}] the call raised {res['error']}")
                crashes.append(f"[{c['label']}] the call raised {res['error']}{_where(res.get('traceback', ''))}")
                continue
            got = _sandbox.unpack(res["payload"], blobs)
            for p in res.get("problems", []):
                tally.problem(f"[{c['label']}] {p}")
            buffers = c.get("buffers") or {}
            if c.get("sampled"):
                for why in input_problems(got["after"], d["inputs"], buffers):
                    tally.problem(f"[{c['label']}] {why}")
                st = res.get("sampled") or {}
                sus = (sampled_suspicions(got["out"], d["ref"], st, *c["tol"], base=c.get("base_writes"))
                       if st else [Suspicion(Evidence.NO_LAUNCH, "no sampling statistics")])
                rep.notes.append(f"sampled {c['label']}: {st.get('programs', 0)} of {st.get('grid', 0)} programs"
                                 + (f"; to settle: {'; '.join(s.text for s in sus)[:300]}" if sus else ""))
                if sus:
                    suspects.append((c, sus, st))
                continue
            for key, base_key in (("out", "base"), ("out2", "base2")):
                why = _structure_problem(got.get(key), d.get(base_key)) if key in got else None
                if why:
                    tally.problem(f"[{c['label']}] {why}")
            for why in input_problems(got["after"], d["inputs"], buffers):  # first: the telling reason
                tally.problem(f"[{c['label']}] {why}")
            tally.add(f"{c['label']} {c['dist']}", got["out"], d["ref"], c["tol"])
            prec.add(f"{c['label']} {c['dist']}", got["out"], d["ref"], c["tol"])
            for why in buffer_problems(got["out"], got["after"], d["inputs"], d["ref"], buffers, c["tol"], "NaN"):
                tally.problem(f"[{c['label']}] {why}")
            if "out2" in got:
                tally.add(f"{c['label']} {c['dist2']} (2nd call, same buffers)", got["out2"], d["ref2"], c["tol"])
                prec.add(f"{c['label']} {c['dist2']}", got["out2"], d["ref2"], c["tol"])
                for why in input_problems(got["after2"], d["inputs2"], buffers):
                    tally.problem(f"[{c['label']}] second call: {why}")
                for why in buffer_problems(got["out2"], got["after2"], d["inputs2"], d["ref2"], buffers, c["tol"],
                                           "random values"):
                    tally.problem(f"[{c['label']}] second call: {why}")
            if (tally.mismatches, tally.nan_inf) != before:
                wrong_ids.add(c["id"])
        secs = sorted(((float(r.get("seconds", 0.0)), by_id[r["id"]]["label"]) for r in head["results"] if r["id"] in by_id), reverse=True)
        if secs:
            rep.notes.append(f"case seconds: {sum(t for t, _ in secs):.1f} in all; slowest "
                             + ", ".join(f"{lab} {t:.1f}" for t, lab in secs[:3]))
        if suspects and tally.mismatches == 0 and not tally.nan_inf:
            checks = self._settling_checks(suspects, child, row.config, wrong_ids)
            for c, sus, _st in suspects:
                outcome = decide_sampled(c["label"], sus, checks.get(c["id"]))
                for w in outcome.wrong:
                    tally.problem(w)
                rep.unsettled.extend(outcome.unsettled)
        elif suspects:  # wrong already: a settling run could only add evidence to a REGRESS (minutes on the interpreter)
            rep.notes.append("not settled (the candidate is wrong on other cases): "
                             + "; ".join(f"{c['label']}: {sus[0].text[:120]}" for c, sus, _st in suspects))
        row.correctness = tally.correctness()
        rep.precision = PrecisionMetrics(candidate_max=prec.frac_max, baseline_max=self.base_tally.frac_max,
                                         candidate_rms=prec.rms, baseline_rms=self.base_tally.rms, worst_case=prec.worst)
        return crashes

    def _settling_checks(self, suspects: list[tuple[dict, list[Suspicion], dict]], child: Any, config: dict,
                         wrong_ids: set[str]) -> dict[str, SettlingCheck]:
        """Per sampled case with suspicions, the check that settles them: its full run where the reference
        child found one affordable (``settle``), else the reduced run (``_reduced``); a check that cannot run
        says why (``Settlement.NONE``: the evidence is then unsettled, never dropped)."""
        full = [c for c, _s, _st in suspects if c.get("settle", True)]
        checks = self._settle(full, child, config) if full else {}
        for c, _sus, st in suspects:
            if c["id"] in checks:
                continue
            check = self._reduced(c, st, child, config, wrong_ids)
            if check.outcome == Settlement.NONE:
                check = SettlingCheck(check.name, check.outcome, f"a full run estimated at ~{c.get('full_seconds', 0.0):.0f}s "
                                      f"is past this host's budget; {check.detail}")
            checks[c["id"]] = check
        return checks


CAND = "cand"  # the candidate's key in its timing batch (the baseline's is ``kregress.core.batching.BASELINE``)


class PatchTimer:
    """Times one judged patch on a GPU with the timing plan every variant gets (``TimingPlan``): its looks
    (``kregress.core.batching.run_looks``), each look a batch (``kernels.measure.time_slots``: baseline,
    candidate, baseline, ... ``rounds`` times in the plan's order) under the plan's clock lock
    (``kernels.measure.clock_lock``); each slot is a ``bench`` job in the candidate's sandboxed child or
    the baseline's, on the same GPU. Then ``finish`` checks correctness again after the timing loop."""

    def __init__(self, child: Any, ref: Any, row: Any, rep: GateReport, spec: Any, family: Any, cases: list[dict],
                 timeout_s: float):
        self.child, self.ref, self.row, self.rep, self.spec, self.family = child, ref, row, rep, spec, family
        self.timed = [c for c in cases if c["kind"] == "timed"]
        self.timeout_s = timeout_s
        self.error_kind = ErrorKind.RUNTIME_ERROR.value

    def _identity(self) -> dict:
        """The GPU's identity, read in the baseline's (pristine) child."""
        head, _ = self.ref.call({"job": "identity"}, timeout=self.timeout_s)
        return head.get("identity") or {}

    def _slot(self, plan: Any, si: int, key: str) -> list[float]:
        from kregress.core.batching import BASELINE

        who, proc, cfg = (("baseline", self.ref, self.spec.baseline) if key == BASELINE
                          else ("candidate", self.child, self.row.config))
        head, _ = proc.call({"job": "bench", "case": self.timed[si]["id"], "config": cfg, "params": self.spec.params,
                             "rep_ms": plan.slot_ms, "warmup_ms": plan.slot_warmup_ms}, timeout=self.timeout_s)
        if head.get("error"):
            raise _sandbox.ChildFailed(ErrorKind.RUNTIME_ERROR.value, f"{who}: {head.get('detail', '')}")
        if key != BASELINE and head.get("violations"):
            self.rep.runtime_violations += head["violations"]
        return head["samples"]

    def look(self, plan: Any, batch_id: str, look: int, rounds: int) -> dict | str:
        """One look: ``rounds`` rounds of the batch on every timed shape, {BASELINE: [...], CAND: [...]}
        Measurements per shape, or why it failed."""
        from kernels.measure import clock_lock, time_slots

        try:
            with clock_lock(plan.lock_clocks) as locked:
                return time_slots(self.family, [CAND], [c["shape"] for c in self.timed],
                                  lambda si, key, slot: self._slot(plan, si, key), self.spec.dtype, self.spec.params,
                                  rounds=rounds, order=plan.order, seed=look, batch_id=batch_id,
                                  identity=self._identity, device_name=self._identity().get("gpu_name", ""),
                                  clocks_locked=locked)
        except _sandbox.ChildFailed as exc:
            self.error_kind = exc.error
            return exc.detail

    def time(self, plan: Any, stats: Any = None, log: Callable[[str], None] = print) -> float:
        """Time the patch with ``plan``; the row gets its measurements, the baseline samples of its batch
        and the rounds and looks it took, or the error. Returns the seconds spent (also appended to
        ``stats.measure_seconds`` when given: the per-round GPU-seconds cap counts them)."""
        import uuid

        from kregress.core.batching import run_looks

        row, t_all = self.row, time.perf_counter()
        batch_id = f"{self.spec.task_id}/judge/{uuid.uuid4().hex[:8]}"
        log(f"timing {row.variant_id} on the GPU in batch {batch_id}, in its sandboxed child beside the baseline's: "
            f"{plan.describe()}")

        def measure(look: int, add: int, open_: list[str]) -> dict | str:
            t0 = time.perf_counter()
            try:
                return self.look(plan, batch_id, look, add)
            finally:
                if stats is not None:
                    stats.measure_seconds.append(time.perf_counter() - t0)

        looks = run_looks(plan, self.spec, [CAND], measure, log, label=f"batch {batch_id}")
        if looks.error is not None:
            self.fail(self.error_kind, f"timing failed ({looks.error})")
        else:
            looks.apply([row], {0: CAND})
        return time.perf_counter() - t_all

    def fail(self, error: str, detail: str) -> None:
        self.row.error, self.row.error_detail = error, detail[:600]
        self.row.measurements, self.row.batch_baseline, self.row.evidence = [], [], None

    def finish(self, data: dict) -> None:
        """After the timing loop: the sandbox's refusals during it, then correctness again on the second
        values in the same buffers."""
        from kernels.sandbox import pack, unpack

        row, rep, spec = self.row, self.rep, self.spec
        if row.error or not row.measurements:
            return
        if rep.runtime_violations:
            self.fail(ErrorKind.PATCH_REJECTED.value, "sandbox: " + "; ".join(rep.runtime_violations)[:1200])
            return
        blobs: list[bytes] = []
        job_cases = [{"id": c["id"], "payload": pack({"inputs": data[c["id"]]["inputs2"]}, blobs)} for c in self.timed
                     if "inputs2" in data[c["id"]]]
        if not job_cases:
            return
        head, rblobs = self.child.call({"job": "recheck", "cases": job_cases, "config": row.config,
                                        "params": spec.params, "device": "cuda"}, blobs, timeout=self.timeout_s)
        tally = _Tally(self.family, spec.dtype)
        by_id = {c["id"]: c for c in self.timed}
        for res in head.get("results", []):
            c = by_id[res["id"]]
            got = unpack(res["payload"], rblobs)
            tally.add(f"{c['label']} after timing", got["out"], data[c["id"]]["ref2"], c["tol"])
            for p in res.get("problems", []):
                tally.problem(f"[{c['label']}] after timing: {p}")
        if not tally.correctness().ok:
            self.fail(ErrorKind.NUMERIC_MISMATCH.value, "after the timing loop: " + tally.correctness().mismatch_sample)


def time_patch_rows(rows: list, timers: dict, log: Callable[[str], None] = print) -> None:
    """The default ``time_rows`` of ``judge_patches`` on a GPU (no backend around it): the patches alone,
    with the same plan, groups (forecast order, GPU-seconds cap) and looks as ``CudaBackend._time``."""
    from kregress.core.batching import TimingPlan, run_groups

    if not timers:
        return
    first = next(iter(timers.values()))
    plan = TimingPlan.from_spec(first.spec)
    run_groups(plan, rows, sorted(timers), lambda group: sum(timers[i].time(plan, log=log) for i in group), log,
               together=lambda i: False)


# Kept importable from here (tests, benches and older callers name them on this module).
from kernels.gate_cases import _fresh, poison_buffers, sample_programs, transform_inputs, wide_shape  # noqa: E402,F401
from kernels.gate_cases import _launch_grids  # noqa: E402,F401
from kernels.gate_child import child_main, preload  # noqa: E402,F401
from kregress.core.checks import HARMLESS_OPS, HOST_DATA_OPS  # noqa: E402,F401
