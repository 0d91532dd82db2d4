"""Benchmark backends: compile, check and time variants the same way, one interface, three classes.

``BenchmarkBackend.evaluate(bound, suggestions, log) -> (rows, stats)`` is the one interface (``bound``: the
run's ``BoundSpec``, spec and family bound once); a failure is a row with ``error`` set, never an exception
that loses the round. Backends dispatch on the family's kind: recorded families replay, Triton and
external families go through the compiled backends (an external kernel has nothing to compile).

- ``CudaBackend``: correctness on the GPU, then ``triton.testing.do_bench`` per shape in a child process
  (one at a time: the GPU is measured by one variant only, and the Dagster pool ``gpu`` serializes steps).
- ``InterpreterBackend``: correctness with TRITON_INTERPRET=1 on the CPU (child processes); latency is the
  family's analytic estimate from the real compile stats, labelled evidence=model.
- ``ReplayBackend``: recorded families answer with their recorded GPU runs (evidence=replay).

On the two compiled backends every variant is first compiled ahead of time for the spec's arch, so
registers, spills, shared memory and occupancy are real. Compile results (and interpreter correctness,
which is deterministic) are cached on disk, one atomic JSON file per entry written as each variant
finishes, keyed by config hash, the family's kernel hash (its jit functions' cache keys), arch and
Triton version. Worker processes live as long as the resource does in Dagster
(``setup_for_execution``/``teardown_after_execution``: the whole run with the in-process executor, one step
with the multiprocess one); outside Dagster they end with each ``evaluate``. A pool's size is fixed when it is
made (one worker per core, at most 4), a step starts its compiling and checking workers together, and a
variant's correctness check starts as soon as its compile is done, so compiles and checks overlap.
"""

from __future__ import annotations

import json
import os
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar

import dagster as dg
from pydantic import Field, PrivateAttr

from kernels.compile import cache_key
from kernels.measure import model_measurements
from kregress.core import paths
from kregress.core.batching import TimingPlan, forecast_order, merge_looks, run_groups, run_looks  # noqa: F401 (re-exported)
from kregress.core.bind import BoundSpec
from kregress.core.family import CudaFamily, ExternalFamily, Family, KernelFamily, RecordedFamily, TritonFamily
from kregress.core.records import CompileStats, Correctness, Measurement, Suggestion, VariantResult, base_row, variant_hash  # noqa: F401
from kregress.core.spec import TaskSpec
from resources.workers import WorkerPool, worker_env


@dataclass
class EvaluationStats:
    compiles: int = 0
    compile_cache_hits: int = 0
    correctness_runs: int = 0
    correctness_cache_hits: int = 0
    correctness_shared: int = 0  # interpreter checks answered by another variant's identical run
    compile_seconds: list[float] = field(default_factory=list)
    correctness_seconds: list[float] = field(default_factory=list)
    measure_seconds: list[float] = field(default_factory=list)
    workers_spawned: int = 0
    workers_adopted: int = 0  # of those, started ahead by the CLI (resources.workers.reserve)
    answered_ahead: int = 0  # jobs answered by the CLI's run ahead (the baseline's compile and check)
    wall_s: float = 0.0  # the whole evaluate: compiles and checks overlap inside it

    def as_metadata(self) -> dict[str, Any]:
        def mean(xs: list[float]) -> float:
            return round(sum(xs) / len(xs), 3) if xs else 0.0

        return {
            "compiles": self.compiles,
            "compile_cache_hits": self.compile_cache_hits,
            "correctness_runs": self.correctness_runs,
            "correctness_cache_hits": self.correctness_cache_hits,
            "correctness_shared": self.correctness_shared,
            "compile_s_per_variant": mean(self.compile_seconds),
            "correctness_s_per_variant": mean(self.correctness_seconds),
            "workers_spawned": self.workers_spawned,
            "workers_adopted": self.workers_adopted,
            "answered_ahead": self.answered_ahead,
            "evaluate_s": round(self.wall_s, 3),
            "compile_s_total": round(sum(self.compile_seconds), 3),
            "correctness_s_total": round(sum(self.correctness_seconds), 3),
        }


def cache_get(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def cache_put(path: Path, value: dict) -> None:
    """Atomic per entry: a crashed run never leaves half an entry, and every finished one is kept."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}-{id(value)}")
    tmp.write_text(json.dumps(value))
    tmp.replace(path)


def gpu_visible() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


def cuda_unavailable() -> str:
    """Why the cuda backend cannot time on this host, '' when it can: torch built without CUDA, or no CUDA
    device visible to this process. Creates no CUDA context (``torch.cuda.is_available`` asks the driver for
    a device count), so a refusal costs an import, not a failed run."""
    try:
        import torch
    except Exception as exc:  # noqa: BLE001 - an unusable torch is an answer too
        return f"torch cannot be imported ({type(exc).__name__}: {exc})"
    if not getattr(torch.version, "cuda", None):
        return f"torch {torch.__version__} was built without CUDA"
    if not torch.cuda.is_available():
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        return ("no CUDA device is visible to this process" + (f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None
                                                               else f" (torch {torch.__version__}, CUDA {torch.version.cuda})"))
    return ""


class BenchmarkError(RuntimeError):
    """A spec that cannot run on this backend; the message says which backend to use instead."""


class BenchmarkBackend(dg.ConfigurableResource):
    """Compiles, checks and times kernel variants. Subclasses: CudaBackend, InterpreterBackend, ReplayBackend."""

    kind: ClassVar[str] = ""
    workers: int = Field(default=0, description="Child processes for compile and interpreter work; 0 = one per CPU core (at most 4).")
    cache_dir: str = Field(default="", description="Compile/correctness cache; empty = $DAGSTER_HOME/cache.")
    timeout_s: float = Field(default=0.0, description="Per-variant limit in seconds; 0 = the spec's benchmark.timeout_s.")
    patch_seed: int = Field(default=0, description="0: a fresh secret seed for the inputs of every patch judgement; "
                                                   "else this seed, to reproduce one (never shown to the agent).")

    _pools: dict = PrivateAttr(default_factory=dict)
    _pools_lock: Any = PrivateAttr(default_factory=threading.Lock)  # checks start pools from compile threads
    _managed: bool = PrivateAttr(default=False)

    # -- lifecycle: worker processes live as long as the step -------------------------------------
    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        self._managed = True

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        self.close()

    def close(self) -> None:
        with self._pools_lock:
            pools, self._pools = self._pools, {}
        for pool in pools.values():
            pool.close()

    def cache_root(self) -> Path:
        return Path(self.cache_dir) if self.cache_dir else paths.cache_dir()

    def env(self, interpret: bool) -> dict[str, str]:
        return worker_env(self.cache_root(), interpret)

    def pool(self, name: str, size: int, interpret: bool) -> WorkerPool:
        """The step's pool ``name`` (compile, correctness, cuda), created on first use with ``size`` workers
        at most; workers are spawned as jobs need them (or ahead, with ``prestart``)."""
        with self._pools_lock:
            if name not in self._pools:
                self._pools[name] = WorkerPool(size, self.env(interpret))
            return self._pools[name]

    def pool_size(self) -> int:
        """Workers per CPU pool: ``workers``, else one per CPU core (at most 4). Fixed for the pool's life:
        the first step (the baseline: one job) must not size the pool every later round shares."""
        return max(1, self.workers or min(4, os.cpu_count() or 1))

    # -- the interface ------------------------------------------------------------------------------
    def check_spec(self, spec: TaskSpec, family: Family) -> str | None:
        """None when this backend can run the spec, else what to do instead (one sentence)."""
        want = spec.benchmark.backend
        if not isinstance(family, KernelFamily):
            return f"family {family.name} serves recorded runs: it runs on the replay backend, not {self.kind}"
        if want not in ("auto", self.kind):
            return (f"spec {spec.task_id} asks for benchmark.backend={want} but this host runs the {self.kind} backend; "
                    f"run it where {want} is available (kregress sweep --backend {want}) or set benchmark.backend: auto")
        return None

    def evaluate(self, bound: BoundSpec, suggestions: list[Suggestion],
                 log: Callable[[str], None] = print) -> tuple[list[VariantResult], EvaluationStats]:
        """Compile, check and time every suggestion of the bound spec; failures come back as rows with
        ``error`` set."""
        problem = self.check_spec(bound.spec, bound.family)
        if problem:
            raise BenchmarkError(problem)
        stats = EvaluationStats()
        t0 = time.perf_counter()
        try:
            rows = self._evaluate(bound, suggestions, log, stats)
        finally:
            stats.wall_s = time.perf_counter() - t0
            stats.workers_spawned = sum(p.spawned for p in self._pools.values())
            stats.workers_adopted = sum(p.adopted for p in self._pools.values())
            stats.answered_ahead = sum(p.answered_ahead for p in self._pools.values())
            if not self._managed:
                self.close()
        return rows, stats

    def _evaluate(self, bound: BoundSpec, suggestions: list[Suggestion],
                  log: Callable[[str], None], stats: EvaluationStats) -> list[VariantResult]:
        raise NotImplementedError


def compile_key(family: Family, spec: TaskSpec, src_hash: str, config_hash: str) -> str:
    """The compile cache's key of one config (a file under ``<cache>/compile/``)."""
    if isinstance(family, CudaFamily):  # nvcc's version, flags, .cu files and headers (kernels/cuda/nvcc.py)
        from kernels.cuda.nvcc import compile_key as cuda_compile_key

        return cuda_compile_key(family, src_hash, config_hash, spec.dtype, spec.hardware.arch, spec.params)
    return cache_key(family.name, src_hash, config_hash, spec.dtype, spec.hardware.arch, spec.params)


def compile_job(family: Family, spec: TaskSpec, config: dict) -> dict:
    """The worker job that compiles ``config`` for the spec's arch (``kernels/worker.py``, op ``compile``):
    registers, spills, shared memory and occupancy, without the SASS disassembly (no sweep reads it)."""
    hw = spec.hardware
    return {"op": "compile", "family": family.lookup or family.name, "config": config, "dtype": spec.dtype,
            "arch": hw.arch, "limits": hw.limits.model_dump(), "params": spec.params, "sass": False}


def correctness_key(family: Family, spec: TaskSpec, src_hash: str, config: dict, interpret: bool,
                    patched: bool = False) -> str:
    """The correctness cache's key. In the interpreter, a config-only variant is keyed without the
    family's ``interpreter_ignores`` (launch options the interpreter drops): those checks are one run."""
    ignored = set(family.interpreter_ignores) if interpret and not patched else set()
    ident = variant_hash({k: v for k, v in config.items() if k not in ignored})
    return cache_key(family.name, src_hash, ident, spec.dtype, "interpreter" if interpret else spec.hardware.arch,
                     {"p": spec.params, "shapes": spec.correctness_shapes, "tol": spec.constraints.numeric_tolerance})


def correctness_job(family: Family, spec: TaskSpec, config: dict, interpret: bool) -> dict:
    """The worker job that checks ``config`` against the float64 reference on the correctness shapes."""
    return {"op": "correctness", "family": family.lookup or family.name, "config": config,
            "dtype": spec.dtype, "shapes": spec.correctness_shapes, "tolerance": spec.constraints.numeric_tolerance,
            "params": spec.params, "device": "cpu" if interpret else "cuda", "interpret": interpret}


def run_baseline_ahead(bound: BoundSpec, cache_root: Path) -> list[str]:
    """Start the baseline's compile and interpreter check now, on workers reserved for a CPU sweep
    (``resources.workers.reserve``), unless the cache already holds them: the sweep's first step then takes
    their answers instead of running them (``WorkerPool.submit``). Returns the ops started."""
    from resources.workers import run_ahead

    spec, family = bound.spec, bound.family
    if not isinstance(family, TritonFamily) or family.space.check(spec.baseline, spec.params, spec.hardware.limits):
        return []
    timeout = spec.benchmark.timeout_s
    started = []
    if cache_get(cache_root / "compile" / f"{compile_key(family, spec, bound.kernel_hash, variant_hash(spec.baseline))}.json") is None:
        run_ahead(worker_env(cache_root, interpret=False), compile_job(family, spec, spec.baseline), timeout)
        started.append("compile")
    key = correctness_key(family, spec, bound.kernel_hash, spec.baseline, interpret=True)
    if cache_get(cache_root / "correctness" / f"{key}.json") is None:
        run_ahead(worker_env(cache_root, interpret=True), correctness_job(family, spec, spec.baseline, True), timeout)
        started.append("correctness")
    return started


class CompiledBackend(BenchmarkBackend):
    """Shared stages of the Triton backends: validity, AOT compile (cached), correctness, then timing."""

    interpret: ClassVar[bool] = False

    def _evaluate(self, bound, suggestions, log, stats):
        if any(s.patch for s in suggestions):
            if isinstance(bound.family, CudaFamily):  # .cu patches: resources/cuda_judge.py
                from resources.cuda_judge import evaluate_cuda_patches

                return evaluate_cuda_patches(self, bound, suggestions, log, stats)
            return self._evaluate_patches(bound, suggestions, log, stats)
        rows, compiled, timed = self._checked(bound, suggestions, log, stats)
        if timed:
            self._time(bound.spec, bound.family, rows, compiled, timed, self.timeout_s or bound.spec.benchmark.timeout_s,
                       stats, log)
        return rows

    def _checked(self, bound, suggestions, log, stats):
        """Validity, compile and correctness of config variants: (rows, compile stats, the indices to time,
        best forecast first)."""
        spec, family = bound.spec, bound.family
        timeout = self.timeout_s or spec.benchmark.timeout_s
        root = self.cache_root()
        src_hash = bound.kernel_hash
        hw = spec.hardware
        rows = [base_row(s, self.kind) for s in suggestions]
        compiled: dict[int, CompileStats | None] = {}
        checks = _Checks(self, spec, family, suggestions, rows, src_hash, timeout, stats, log)
        if not isinstance(family, ExternalFamily):
            # Start this step's checking workers with its compiling ones: a worker's imports take seconds,
            # which then overlap the first compiles instead of following them. (The CLI starts them even
            # earlier, before it imports Dagster: resources.workers.reserve.)
            ahead = min(self.pool_size(), len(suggestions))
            self.pool("compile", self.pool_size(), interpret=False).prestart(ahead)
            if self.interpret and not isinstance(family, CudaFamily):
                self.pool("correctness", self.pool_size(), interpret=True).prestart(ahead)

        # 1. validity, then compile (cached per entry, written as each compile finishes); an external
        #    kernel has nothing to compile ahead of time and goes straight to the checks. A variant's
        #    correctness check starts as soon as it has compiled (step 2), on the correctness pool, while
        #    the other variants still compile.
        jobs, idx = [], []
        for i, s in enumerate(suggestions):
            problem = family.space.check(s.config, spec.params, hw.limits)
            if problem:
                rows[i].error, rows[i].error_detail = "invalid_config", problem
                continue
            if not isinstance(family, (TritonFamily, CudaFamily)):
                compiled[i] = None
                continue
            key = compile_key(family, spec, src_hash, s.config_hash)
            hit = cache_get(root / "compile" / f"{key}.json")
            if hit is not None:
                stats.compile_cache_hits += 1
                _apply_compile(rows[i], hit, compiled, i, cache_hit=True)
                continue
            jobs.append({**compile_job(family, spec, s.config), "_key": key})
            idx.append(i)
        if stats.compile_cache_hits:
            log(f"compile cache: {stats.compile_cache_hits} of {len(suggestions)} variant(s) already compiled for {hw.arch}")
        if jobs:
            log(f"compiling {len(jobs)} variant(s) for {hw.arch} ({len(suggestions) - len(jobs)} from cache)")
        checks.announce(sorted(compiled) + idx)
        for i in sorted(compiled):
            checks.start(i)
        if jobs:
            lock = threading.Lock()

            def done(j: int, res: dict) -> None:
                i = idx[j]
                if res.get("error") in ("compile_failed", "out_of_resources") or "stats" in res:
                    cache_put(root / "compile" / f"{jobs[j]['_key']}.json",
                              {k: v for k, v in res.items() if k in ("stats", "error", "detail")})
                what = res.get("error") or f"{res['stats']['regs_per_thread']} regs, {res['stats']['smem_bytes']} B smem"
                log(f"  compiled {suggestions[i].variant_id} ({res['wall_s']:.1f}s): {what}")
                with lock:
                    stats.compiles += 1
                    stats.compile_seconds.append(res.get("wall_s", 0.0))
                    _apply_compile(rows[i], res, compiled, i, cache_hit=False)
                if i in compiled:
                    checks.start(i)

            pool = self.pool("compile", self.pool_size(), interpret=False)
            pool.run(jobs, timeout, on_done=done)

        # 2. correctness on correctness_shapes against the float64 reference (started above, awaited here)
        ok = sorted(compiled)
        checks.wait()
        for i in ok:
            c = rows[i].correctness
            if rows[i].error is None and c is not None and not c.ok:
                rows[i].error = "nan_inf" if c.nan_inf else "numeric_mismatch"
                rows[i].error_detail = c.mismatch_sample[:600]

        # 3. latency on the shape matrix, best forecast first (``_time``, by the caller)
        return rows, compiled, forecast_order(rows, [i for i in ok if rows[i].error is None])

    def _evaluate_patches(self, bound, suggestions, log, stats):
        """Config-only variants as usual; patch variants through the gate (kernels/candidate.py): static
        policy, sandboxed compile and correctness on secret inputs, precision. On a GPU both kinds are then
        timed together by ``_time`` (one plan, one forecast order, one GPU-seconds cap): the gate hands its
        live patches over (``time_rows``), each timed in its sandboxed child beside the baseline's."""
        from kernels.candidate import JudgeOptions, judge_patches

        spec, family = bound.spec, bound.family
        timeout = self.timeout_s or spec.benchmark.timeout_s
        rows: list = [None] * len(suggestions)
        plain = [i for i, s in enumerate(suggestions) if not s.patch]
        prow, compiled, ptimed = self._checked(bound, [suggestions[i] for i in plain], log, stats) if plain else ([], {}, [])
        for i, row in zip(plain, prow):
            rows[i] = row
        timed_once: list[bool] = []

        def time_rows(patch_rows: list, timers: dict) -> None:
            both = prow + patch_rows
            self._time(spec, family, both, compiled, ptimed + [len(prow) + k for k in range(len(patch_rows))],
                       timeout, stats, log, patch_timers={len(prow) + k: t for k, t in timers.items()})
            timed_once.append(True)

        patched = [i for i, s in enumerate(suggestions) if s.patch]
        opts = JudgeOptions.for_spec(spec, seed=self.patch_seed or None)
        judged = judge_patches(spec, family, [suggestions[i] for i in patched], backend=self.kind,
                               cache_root=self.cache_root(), timeout_s=timeout, log=log, options=opts,
                               time_rows=time_rows if self.kind == "cuda" else None)
        if ptimed and not timed_once:  # no patch reached the timing: the configs alone
            self._time(spec, family, prow, compiled, ptimed, timeout, stats, log)
        for i, (row, report) in zip(patched, judged):
            row.gate = report
            rows[i] = row
        return rows

    def _time(self, spec, family, rows, compiled, timed, timeout, stats, log, patch_timers=None) -> None:
        raise NotImplementedError


class _Checks:
    """The correctness checks of one ``evaluate``: started one variant at a time (as each compiles), awaited
    together. The interpreter's results are cached on disk (they are deterministic). In the interpreter,
    config-only variants that differ only in the family's ``interpreter_ignores`` (launch options such as
    num_warps and num_stages, which Triton's interpreter drops) run the same computation: one check serves
    them all, and the others say whose result they share."""

    def __init__(self, backend: CompiledBackend, spec: TaskSpec, family: Family, suggestions: list[Suggestion],
                 rows: list[VariantResult], src_hash: str, timeout: float, stats: EvaluationStats,
                 log: Callable[[str], None]):
        self.backend, self.spec, self.family, self.suggestions, self.rows = backend, spec, family, suggestions, rows
        self.src_hash, self.timeout, self.stats, self.log = src_hash, timeout, stats, log
        self.interpret = backend.interpret
        self.root = backend.cache_root()
        self.lock = threading.Lock()
        self.futures: list[Future] = []
        self.running: dict[str, list[int]] = {}  # check key -> variants waiting on that one run
        self.owner: dict[str, int] = {}  # check key -> the variant whose run it is
        self.cached: set[int] = set()

    def _key(self, s: Suggestion) -> str:
        return correctness_key(self.family, self.spec, self.src_hash, s.config, self.interpret, patched=bool(s.patch))

    def announce(self, candidates: list[int]) -> None:
        """Answer what the cache holds, and say what will be checked."""
        if self.interpret and isinstance(self.family, CudaFamily):
            self.log("a CUDA family on a CPU host: compile facts only (correctness and timing need a GPU)")
            return
        if self.interpret:
            for i in candidates:
                hit = cache_get(self.root / "correctness" / f"{self._key(self.suggestions[i])}.json")
                if hit is not None:
                    self.stats.correctness_cache_hits += 1
                    self.rows[i].correctness = Correctness(**hit["correctness"])
                    self.cached.add(i)
        if self.cached:
            self.log(f"correctness cache: {len(self.cached)} variant(s) already checked on these shapes")
        if len(candidates) > len(self.cached):
            self.log(f"each variant is checked against the float64 reference on {len(self.spec.correctness_shapes)} "
                     f"shape(s) ({self.backend.kind}) as soon as it has compiled")

    def start(self, i: int) -> None:
        if i in self.cached or (self.interpret and isinstance(self.family, CudaFamily)):
            return  # a CUDA kernel does not run on a CPU host: compile facts only
        s = self.suggestions[i]
        key = self._key(s)
        with self.lock:
            if key in self.running:
                self.running[key].append(i)
                return
            if key in self.owner:  # that run already finished: share its result now
                self._share(self.owner[key], i)
                return
            self.running[key] = [i]
            self.owner[key] = i
        job = correctness_job(self.family, self.spec, s.config, self.interpret)
        size = self.backend.pool_size() if self.interpret else 1  # one GPU: one check at a time
        pool = self.backend.pool("correctness", size, interpret=self.interpret)
        self.futures.append(pool.submit(job, self.timeout, on_done=lambda res: self._done(key, i, res)))

    def _done(self, key: str, i: int, res: dict) -> None:
        if self.interpret and "correctness" in res:
            cache_put(self.root / "correctness" / f"{key}.json", {"correctness": res["correctness"]})
        c = res.get("correctness")
        what = res.get("error") or ("ok" if c and c["ok"] else f"{c['mismatches']} mismatches")
        self.log(f"  checked {self.suggestions[i].variant_id} ({res['wall_s']:.1f}s): {what}")
        with self.lock:
            self.stats.correctness_runs += 1
            self.stats.correctness_seconds.append(res.get("wall_s", 0.0))
            if "correctness" in res:
                self.rows[i].correctness = Correctness(**res["correctness"])
            else:
                self.rows[i].error, self.rows[i].error_detail = res["error"], res.get("detail", "")
            for j in self.running.pop(key, [])[1:]:
                self._share(i, j)

    def _share(self, owner: int, j: int) -> None:
        """Variant ``j`` takes variant ``owner``'s interpreter result (the caller holds the lock)."""
        src, dst = self.rows[owner], self.rows[j]
        self.stats.correctness_shared += 1
        if src.correctness is not None:
            dst.correctness = src.correctness.model_copy()
        elif dst.error is None:
            dst.error, dst.error_detail = src.error, src.error_detail
        differ = ", ".join(k for k in self.family.interpreter_ignores
                           if self.suggestions[owner].config.get(k) != self.suggestions[j].config.get(k))
        self.log(f"  checked {self.suggestions[j].variant_id}: the interpreter run of {src.variant_id} "
                 f"(they differ only in {differ or 'launch options'}, which the interpreter does not see)")

    def wait(self) -> None:
        for f in self.futures:
            f.result()


class InterpreterBackend(CompiledBackend):
    """TRITON_INTERPRET=1 correctness on the CPU; latency from the family's analytic model (evidence=model)."""

    kind: ClassVar[str] = "interpreter"
    interpret: ClassVar[bool] = True

    def check_spec(self, spec: TaskSpec, family: Family) -> str | None:
        if isinstance(family, ExternalFamily):
            return (f"family {family.name} wraps an external kernel (no Triton source to interpret, no AOT compile): "
                    "it needs the cuda backend on a GPU host (kregress sweep --backend cuda) or a recorded file "
                    "(kregress replay import); its reference and shapes are checked by `kregress family check`")
        return super().check_spec(spec, family)

    def _time(self, spec, family, rows, compiled, timed, timeout, stats, log, patch_timers=None) -> None:
        if isinstance(family, CudaFamily):  # nothing runs the kernel on a CPU host: never PASS, never timed
            from resources.cuda_judge import COMPILE_FACTS_ONLY

            for i in timed:
                rows[i].error_detail = COMPILE_FACTS_ONLY
            log(f"{len(timed)} CUDA variant(s) with compile facts only: correctness and timing need a GPU")
            return
        for i in timed:
            rows[i].measurements = model_measurements(family, rows[i].config, spec.shape_matrix, spec.dtype,
                                                      spec.params, compiled[i], spec.hardware)
            rows[i].evidence = "model"


class CudaBackend(CompiledBackend):
    """Correctness on the GPU, then the variants timed in one batch with the baseline re-timed beside them.

    The timing plan comes from the spec alone (``kregress.core.batching.TimingPlan.from_spec``: order,
    rounds, adaptive cap, clocks, GPU-seconds cap per round). One ``measure_batch`` job per look, in
    one worker process on one GPU, times baseline, v1, baseline, v2, ...; every row keeps the baseline
    samples of the looks it took part in (``batch_baseline``) and its verdict compares with those. With
    ``benchmark.max_batch_rounds`` above ``batch_rounds`` the sampling is sequential: after each look
    every variant whose verdict is still open (``kregress.core.stats.judge_look``) gets more rounds,
    the baseline re-timed beside it, up to the cap; the others stop. The row says how many rounds and
    looks it took (``timing_rounds``, ``timing_looks``).
    """

    kind: ClassVar[str] = "cuda"

    def _time(self, spec, family, rows, compiled, timed, timeout, stats, log, patch_timers=None) -> None:
        """Time the round's variants best-forecast first (``kregress.core.batching.run_groups``), configs and
        patches on one plan. ``patch_timers``: row index -> the gate's timer of a judged patch
        (``kernels.candidate.PatchTimer``), which times it slot by slot in its sandboxed child beside the
        baseline's, a batch of its own. With ``benchmark.max_gpu_seconds_per_round`` each variant is its own
        batch and the round stops once the cap is spent: the variants left get no timing and say why."""
        plan = TimingPlan.from_spec(spec)
        patch_timers = patch_timers or {}

        def time_group(group: list[int]) -> float:
            before = sum(stats.measure_seconds)
            if group[0] in patch_timers:
                patch_timers[group[0]].time(plan, stats, log)
            else:
                self._time_group(spec, family, plan, rows, group, timeout, stats, log)
            return sum(stats.measure_seconds) - before

        run_groups(plan, rows, timed, time_group, log, together=lambda i: i not in patch_timers)

    def _time_group(self, spec, family, plan: TimingPlan, rows, timed, timeout, stats, log) -> None:
        import uuid

        name = family.lookup or family.name
        batch_id = f"{spec.task_id}/r{rows[timed[0]].round}/{uuid.uuid4().hex[:8]}"
        keys = {i: f"v{i}" for i in timed if rows[i].config != spec.baseline}  # the baseline config: timed once, as the baseline
        log(f"timing {len(timed)} variant(s) on the GPU in batch {batch_id}: {plan.describe()}")

        def measure(look: int, add: int, open_: list[str]) -> dict | str:
            cfgs = {k: rows[i].config for i, k in keys.items() if k in open_}
            job = {"op": "measure_batch", "family": name, "baseline": spec.baseline, "configs": cfgs,
                   "dtype": spec.dtype, "shapes": spec.shape_matrix, "params": spec.params, "batch_id": batch_id,
                   "seed": look, **plan.job_fields(add)}
            (res,) = self._run_cuda([job], timeout * (len(cfgs) + 1))
            stats.measure_seconds.append(res.get("wall_s", 0.0))
            if "batch" not in res:
                return f"{res.get('error')}: {res.get('detail', '')[:160]}"
            return {k: [Measurement(**m) for m in ms] for k, ms in res["batch"].items()}

        looks = run_looks(plan, spec, list(keys.values()), measure, log, label=f"batch {batch_id}")
        if looks.error is not None:
            log(f"batch {batch_id} failed ({looks.error}); timing one at a time")
            return self._time_alone(spec, name, rows, timed, timeout, stats, log)
        looks.apply(rows, keys)
        for i in timed:
            if i not in keys:
                rows[i].measurements = rows[i].batch_baseline = looks.base_all
                rows[i].timing_rounds, rows[i].timing_looks = looks.done_rounds, 1
                rows[i].evidence = "cuda" if rows[i].measurements else rows[i].evidence

    def _time_alone(self, spec, name, rows, timed, timeout, stats, log) -> None:
        mjobs = [{"op": "measure_cuda", "family": name, "config": rows[i].config, "dtype": spec.dtype,
                  "shapes": spec.shape_matrix, "params": spec.params, "warmup_ms": spec.benchmark.warmup_ms,
                  "rep_ms": spec.benchmark.rep_ms} for i in timed]
        log(f"timing {len(mjobs)} variant(s) on the GPU, one at a time")
        for i, res in zip(timed, self._run_cuda(mjobs, timeout)):
            stats.measure_seconds.append(res.get("wall_s", 0.0))
            if "measurements" in res:
                rows[i].measurements = [Measurement(**m) for m in res["measurements"]]
                rows[i].evidence = "cuda"
            else:
                rows[i].error, rows[i].error_detail = res["error"], res.get("detail", "")

    def _run_cuda(self, jobs: list[dict], timeout: float) -> list[dict]:
        """Run timing jobs in the step's one GPU worker process (in order; one GPU is measured by one job at a time)."""
        return self.pool("cuda", 1, interpret=False).run(jobs, timeout)


class ReplayBackend(BenchmarkBackend):
    """Recorded families answer with their recorded runs (evidence=replay); nothing is compiled."""

    kind: ClassVar[str] = "replay"

    def check_spec(self, spec: TaskSpec, family: Family) -> str | None:
        if not isinstance(family, RecordedFamily):
            return f"family {family.name} compiles Triton kernels: it runs on the cuda or interpreter backend, not replay"
        return None

    def _replay(self, spec, family, config) -> tuple[list[Measurement], str | None, str]:
        measurements = []
        for shape in spec.shape_matrix:
            ms, error, detail = family.replay(config, shape, spec.params)
            if error:
                return [], error, detail
            measurements += ms
        return measurements, None, ""

    def _evaluate(self, bound, suggestions, log, stats):
        import uuid

        spec, family = bound.spec, bound.family  # bound to the recorded file the spec names

        # Same-batch emulation: each evaluate is one batch; the baseline's runs are drawn
        # again from the same recording for it, and every variant of the batch compares with those.
        batch_id = f"{spec.task_id}/r{suggestions[0].round if suggestions else 0}/{uuid.uuid4().hex[:8]}"
        base, base_err, _ = self._replay(spec, family, spec.baseline)
        base = [m.model_copy(update={"batch": batch_id}) for m in base]
        rows = []
        for s in suggestions:
            row = base_row(s, self.kind)
            problem = family.space.check(s.config, spec.params, spec.hardware.limits)
            if problem:
                row.error, row.error_detail = "invalid_config", problem
            else:
                measurements, error, detail = self._replay(spec, family, s.config)
                if error:
                    row.error, row.error_detail = error, detail
                else:
                    row.measurements = [m.model_copy(update={"batch": batch_id}) for m in measurements]
                    row.evidence = "replay"
                    if not base_err:
                        row.batch_baseline = base
            rows.append(row)
        log(f"replayed {len(rows)} variant(s) from the recorded runs in batch {batch_id} "
            f"({sum(1 for r in rows if r.error)} failed)")
        return rows


BACKENDS: dict[str, type[BenchmarkBackend]] = {"cuda": CudaBackend, "interpreter": InterpreterBackend, "replay": ReplayBackend}


def compiled_backend(choice: str = "auto", **kwargs: Any) -> CompiledBackend:
    """``auto`` (cuda when torch sees a GPU, else interpreter), ``cuda`` or ``interpreter``."""
    if choice == "auto":
        choice = "cuda" if gpu_visible() else "interpreter"
    if choice not in ("cuda", "interpreter"):
        raise ValueError(f"benchmark backend {choice!r} is unknown; allowed: auto, cuda, interpreter")
    return BACKENDS[choice](**kwargs)


def backend_for(family: Family, bench: BenchmarkBackend, replay: BenchmarkBackend) -> BenchmarkBackend:
    """The backend that serves ``family``, by its kind: recorded families replay, the others compile."""
    return replay if isinstance(family, RecordedFamily) else bench


def _apply_compile(row: VariantResult, res: dict, compiled: dict, i: int, cache_hit: bool) -> None:
    if "stats" in res:
        cs = CompileStats(**{**res["stats"], "cache_hit": cache_hit})
        row.compile = cs
        compiled[i] = cs
    else:
        row.error = res.get("error", "compile_failed")
        row.error_detail = res.get("detail", "")
