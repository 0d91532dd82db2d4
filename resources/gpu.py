"""The benchmark resource: compile, check and time variants the same way on every backend.

Backends (``backend`` field, or ``auto``: cuda when a GPU is visible, else interpreter):
- cuda: correctness on the GPU, then ``triton.testing.do_bench`` per shape in a child process (one
  at a time: the GPU is measured by one variant only, and the Dagster pool ``gpu`` serializes steps).
- interpreter: correctness with TRITON_INTERPRET=1 on the CPU (child processes); latency is the
  family's analytic estimate from the real compile stats, labelled evidence=model.
On every backend the variant is first compiled ahead of time for the spec's arch, so registers,
spills, shared memory and occupancy are real. Compile results (and interpreter correctness, which is
deterministic) are cached on disk by config hash, kernel source hash, arch and Triton version.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import dagster as dg
from pydantic import Field

from kregress.core import paths
from kregress.core.paths import REPO_ROOT
from kernels.compile import cache_key
from kernels.measure import model_measurements
from kregress.core.records import CompileStats, Correctness, Measurement, Suggestion, VariantResult
from kregress.core.family import Family
from kregress.core.spec import TaskSpec

PREFIX = "@@kregress "


class WorkerDied(Exception):
    pass


class _Worker:
    """One child process running ``python -m kernels.worker``."""

    def __init__(self, env: dict[str, str]):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kernels.worker"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            text=True, bufsize=1, cwd=str(REPO_ROOT), env=env,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(PREFIX):
                self.lines.put(line[len(PREFIX):])
        self.lines.put(None)

    def _read(self, timeout: float) -> dict:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError from None
        if line is None:
            raise WorkerDied(f"worker exited with code {self.proc.wait()}")
        return json.loads(line)

    def wait_ready(self, timeout: float) -> None:
        self._read(timeout)

    def call(self, job: dict, timeout: float) -> dict:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(job) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            raise WorkerDied(str(exc)) from None
        return self._read(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


class WorkerPool:
    """Runs jobs on ``size`` child processes; a job past its timeout kills (and replaces) its worker."""

    def __init__(self, size: int, env: dict[str, str], startup_timeout: float = 120.0):
        self.size = max(1, size)
        self.env = env
        self.startup_timeout = startup_timeout

    def _spawn(self) -> _Worker:
        w = _Worker(self.env)
        w.wait_ready(self.startup_timeout)
        return w

    def run(self, jobs: list[dict], timeout: float, on_done: Callable[[int, dict], None] | None = None) -> list[dict]:
        results: list[dict | None] = [None] * len(jobs)
        todo: queue.Queue[int] = queue.Queue()
        for i in range(len(jobs)):
            todo.put(i)

        def slot() -> None:
            worker: _Worker | None = None
            try:
                while True:
                    try:
                        i = todo.get_nowait()
                    except queue.Empty:
                        return
                    t0 = time.perf_counter()
                    try:
                        if worker is None:
                            worker = self._spawn()
                        res = worker.call(jobs[i], timeout)
                    except TimeoutError:
                        res = {"error": "timeout", "detail": f"no answer within {timeout:.0f} s; child process killed"}
                        if worker is not None:
                            worker.kill()
                        worker = None
                    except WorkerDied as exc:
                        res = {"error": "crashed", "detail": f"child process died: {exc}"}
                        worker = None
                    res["wall_s"] = time.perf_counter() - t0
                    results[i] = res
                    if on_done:
                        on_done(i, res)
            finally:
                if worker is not None:
                    worker.kill()

        threads = [threading.Thread(target=slot, daemon=True) for _ in range(min(self.size, len(jobs)))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return [r if r is not None else {"error": "crashed", "detail": "no result"} for r in results]


@dataclass
class EvaluationStats:
    compiles: int = 0
    compile_cache_hits: int = 0
    correctness_runs: int = 0
    correctness_cache_hits: int = 0
    compile_seconds: list[float] = field(default_factory=list)
    correctness_seconds: list[float] = field(default_factory=list)
    measure_seconds: list[float] = field(default_factory=list)

    def as_metadata(self) -> dict[str, Any]:
        def mean(xs: list[float]) -> float:
            return round(sum(xs) / len(xs), 3) if xs else 0.0

        return {
            "compiles": self.compiles,
            "compile_cache_hits": self.compile_cache_hits,
            "correctness_runs": self.correctness_runs,
            "correctness_cache_hits": self.correctness_cache_hits,
            "compile_s_per_variant": mean(self.compile_seconds),
            "correctness_s_per_variant": mean(self.correctness_seconds),
        }


def _json_cache_get(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _json_cache_put(path: Path, value: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(value))
    tmp.replace(path)  # atomic: a crashed run never leaves half a cache entry


class BenchmarkResource(dg.ConfigurableResource):
    """Compiles, checks and times kernel variants; see the module docstring for the backends."""

    backend: str = Field(default="auto", description="auto | cuda | interpreter. auto picks cuda when torch sees a GPU.")
    workers: int = Field(default=0, description="Child processes for compile and interpreter work; 0 = one per CPU core (at most 4).")
    cache_dir: str = Field(default="", description="Compile/correctness cache; empty = $DAGSTER_HOME/cache.")
    timeout_s: float = Field(default=0.0, description="Per-variant limit in seconds; 0 = the spec's benchmark.timeout_s.")

    def resolved_backend(self, spec: TaskSpec | None = None) -> str:
        choice = self.backend if self.backend != "auto" else (spec.benchmark.backend if spec else "auto")
        if choice == "auto":
            try:
                import torch

                return "cuda" if torch.cuda.is_available() else "interpreter"
            except Exception:
                return "interpreter"
        if choice not in ("cuda", "interpreter"):
            raise ValueError(f"benchmark backend {choice!r} is unknown; allowed: auto, cuda, interpreter")
        return choice

    def _cache_root(self) -> Path:
        return Path(self.cache_dir) if self.cache_dir else paths.cache_dir()

    def _env(self, interpret: bool) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
        env["TRITON_CACHE_DIR"] = str(self._cache_root() / "triton")
        env["PYTHONWARNINGS"] = "ignore"
        if interpret:
            env["TRITON_INTERPRET"] = "1"
            env["CUDA_VISIBLE_DEVICES"] = ""
        else:
            env.pop("TRITON_INTERPRET", None)
        return env

    def _pool_size(self, n_jobs: int) -> int:
        size = self.workers or min(4, os.cpu_count() or 1)
        return max(1, min(size, n_jobs))

    def evaluate(
        self,
        spec: TaskSpec,
        family: Family,
        suggestions: list[Suggestion],
        log: Callable[[str], None] = print,
    ) -> tuple[list[VariantResult], EvaluationStats]:
        """Compile, check and time every suggestion; failures come back as rows with ``error`` set."""
        if family.recorded:
            return self._replay(spec, family, suggestions, log), EvaluationStats()
        backend = self.resolved_backend(spec)
        timeout = self.timeout_s or spec.benchmark.timeout_s
        stats = EvaluationStats()
        root = self._cache_root()
        src_hash = family.source_hash()
        hw = spec.hardware
        rows: dict[int, VariantResult] = {}
        compiled: dict[int, CompileStats] = {}

        def base_row(s: Suggestion) -> VariantResult:
            return VariantResult(
                variant_id=s.variant_id, round=s.round, source=s.source, config=s.config, config_hash=s.config_hash,
                patch_summary=s.patch_summary, expected_effect=s.expected_effect, risk=s.risk, parent=s.parent,
                backend=backend,
            )

        # 1. validity, then compile (cached)
        jobs, idx = [], []
        for i, s in enumerate(suggestions):
            row = rows[i] = base_row(s)
            problem = family.space.check(s.config, spec.params, spec.hardware.limits)
            if problem:
                row.error, row.error_detail = "invalid_config", problem
                continue
            key = cache_key(family.name, src_hash, s.config_hash, spec.dtype, hw.arch, spec.params)
            hit = _json_cache_get(root / "compile" / f"{key}.json")
            if hit is not None:
                stats.compile_cache_hits += 1
                self._apply_compile(row, hit, compiled, i, cache_hit=True)
                continue
            jobs.append({"op": "compile", "family": family.name, "config": s.config, "dtype": spec.dtype,
                         "arch": hw.arch, "limits": hw.limits.model_dump(), "params": spec.params, "_key": key})
            idx.append(i)
        if stats.compile_cache_hits:
            log(f"compile cache: {stats.compile_cache_hits} of {len(suggestions)} variant(s) already compiled for {hw.arch}")
        if jobs:
            log(f"compiling {len(jobs)} variant(s) for {hw.arch} ({len(suggestions) - len(jobs)} from cache)")
            pool = WorkerPool(self._pool_size(len(jobs)), self._env(interpret=False))

            def done(j: int, res: dict) -> None:
                s = suggestions[idx[j]]
                what = res.get("error") or f"{res['stats']['regs_per_thread']} regs, {res['stats']['smem_bytes']} B smem"
                log(f"  compiled {s.variant_id} ({res['wall_s']:.1f}s): {what}")

            for j, res in enumerate(pool.run(jobs, timeout, on_done=done)):
                i = idx[j]
                stats.compiles += 1
                stats.compile_seconds.append(res.get("wall_s", 0.0))
                if res.get("error") in ("compile_failed", "out_of_resources") or "stats" in res:
                    _json_cache_put(root / "compile" / f"{jobs[j]['_key']}.json",
                                    {k: v for k, v in res.items() if k in ("stats", "error", "detail")})
                self._apply_compile(rows[i], res, compiled, i, cache_hit=False)

        # 2. correctness on correctness_shapes
        ok = list(compiled)
        interpret = backend == "interpreter"
        cjobs, cidx = [], []
        for i in ok:
            s = suggestions[i]
            ckey = cache_key(family.name, src_hash, s.config_hash, spec.dtype, "interpreter" if interpret else hw.arch,
                             {"p": spec.params, "shapes": spec.correctness_shapes, "tol": spec.constraints.numeric_tolerance})
            hit = _json_cache_get(root / "correctness" / f"{ckey}.json") if interpret else None
            if hit is not None:
                stats.correctness_cache_hits += 1
                rows[i].correctness = Correctness(**hit["correctness"])
                continue
            cjobs.append({"op": "correctness", "family": family.name, "config": s.config, "dtype": spec.dtype,
                          "shapes": spec.correctness_shapes, "tolerance": spec.constraints.numeric_tolerance,
                          "params": spec.params, "device": "cpu" if interpret else "cuda", "interpret": interpret,
                          "_key": ckey})
            cidx.append(i)
        if stats.correctness_cache_hits:
            log(f"correctness cache: {stats.correctness_cache_hits} variant(s) already checked on these shapes")
        if cjobs:
            log(f"checking {len(cjobs)} variant(s) against the float64 reference on {len(spec.correctness_shapes)} shape(s) ({'interpreter' if interpret else 'cuda'})")
            pool = WorkerPool(self._pool_size(len(cjobs)) if interpret else 1, self._env(interpret=interpret))

            def cdone(j: int, res: dict) -> None:
                s = suggestions[cidx[j]]
                c = res.get("correctness")
                what = res.get("error") or ("ok" if c and c["ok"] else f"{c['mismatches']} mismatches")
                log(f"  checked {s.variant_id} ({res['wall_s']:.1f}s): {what}")

            for j, res in enumerate(pool.run(cjobs, timeout, on_done=cdone)):
                i = cidx[j]
                stats.correctness_runs += 1
                stats.correctness_seconds.append(res.get("wall_s", 0.0))
                if "correctness" in res:
                    rows[i].correctness = Correctness(**res["correctness"])
                    if interpret:
                        _json_cache_put(root / "correctness" / f"{cjobs[j]['_key']}.json", {"correctness": res["correctness"]})
                else:
                    rows[i].error, rows[i].error_detail = res["error"], res.get("detail", "")
        for i in ok:
            c = rows[i].correctness
            if rows[i].error is None and c is not None and not c.ok:
                rows[i].error = "nan_inf" if c.nan_inf else "numeric_mismatch"
                rows[i].error_detail = c.mismatch_sample[:600]

        # 3. latency on the shape matrix
        timed = [i for i in ok if rows[i].error is None]
        if backend == "cuda" and timed:
            mjobs = [{"op": "measure_cuda", "family": family.name, "config": suggestions[i].config, "dtype": spec.dtype,
                      "shapes": spec.shape_matrix, "params": spec.params, "warmup_ms": spec.benchmark.warmup_ms,
                      "rep_ms": spec.benchmark.rep_ms} for i in timed]
            log(f"timing {len(mjobs)} variant(s) on the GPU, one at a time")
            pool = WorkerPool(1, self._env(interpret=False))
            for i, res in zip(timed, pool.run(mjobs, timeout)):
                stats.measure_seconds.append(res.get("wall_s", 0.0))
                if "measurements" in res:
                    rows[i].measurements = [Measurement(**m) for m in res["measurements"]]
                    rows[i].evidence = "cuda"
                else:
                    rows[i].error, rows[i].error_detail = res["error"], res.get("detail", "")
        else:
            for i in timed:
                rows[i].measurements = model_measurements(family, rows[i].config, spec.shape_matrix, spec.dtype,
                                                          spec.params, compiled[i], hw)
                rows[i].evidence = "model"
        return [rows[i] for i in range(len(suggestions))], stats

    @staticmethod
    def _replay(spec: TaskSpec, family: Family, suggestions: list[Suggestion], log: Callable[[str], None]) -> list[VariantResult]:
        """Recorded families answer with their recorded runs (evidence=replay); nothing is compiled."""
        rows = []
        for s in suggestions:
            row = VariantResult(
                variant_id=s.variant_id, round=s.round, source=s.source, config=s.config, config_hash=s.config_hash,
                patch_summary=s.patch_summary, expected_effect=s.expected_effect, risk=s.risk, parent=s.parent,
                backend="replay",
            )
            problem = family.space.check(s.config, spec.params, spec.hardware.limits)
            if problem:
                row.error, row.error_detail = "invalid_config", problem
            else:
                measurements = []
                for shape in spec.shape_matrix:
                    ms, error, detail = family.replay(s.config, shape, spec.params)
                    if error:
                        row.error, row.error_detail = error, detail
                        break
                    measurements += ms
                if not row.error:
                    row.measurements, row.evidence = measurements, "replay"
            rows.append(row)
        log(f"replayed {len(rows)} variant(s) from the recorded runs ({sum(1 for r in rows if r.error)} failed)")
        return rows

    @staticmethod
    def _apply_compile(row: VariantResult, res: dict, compiled: dict, i: int, cache_hit: bool) -> None:
        if "stats" in res:
            cs = CompileStats(**{**res["stats"], "cache_hit": cache_hit})
            row.compile = cs
            compiled[i] = cs
        else:
            row.error = res.get("error", "compile_failed")
            row.error_detail = res.get("detail", "")
