"""Child processes that compile, check and time variants (``python -m kernels.worker``).

A ``WorkerPool`` keeps up to ``size`` workers alive for as long as its owner (a benchmark backend, for
the duration of one Dagster step) and runs JSON jobs on them. A job past its timeout kills its worker
(the row says ``timeout``) and a worker that dies mid-job is ``crashed``; the pool spawns a fresh one
for the next job, so one bad variant never loses the round. The protocol (one JSON job per line on
stdin, one ``kernels.worker.PREFIX``-marked JSON line back) is defined in ``kernels/worker.py``.
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import subprocess
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Callable

from kernels.worker import PREFIX
from kregress.core.paths import REPO_ROOT


class WorkerDied(Exception):
    pass


def worker_env(cache_root: Path, interpret: bool) -> dict[str, str]:
    """The environment of a worker: this process's, plus the project and every import root on
    ``sys.path`` (so plugin and import-path families resolve in the child), Triton's cache under
    ``cache_root``, one BLAS/OpenMP thread, and, for the interpreter, TRITON_INTERPRET=1 with no GPU visible."""
    env = dict(os.environ)
    roots = [str(REPO_ROOT)] + [p for p in sys.path if p and Path(p).is_dir()]
    roots += [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(roots))
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    # One thread per worker: the pools run a worker per core, and a worker's own BLAS/OpenMP threads (the
    # interpreter's numpy dots, torch's float64 reference) would only spin against its neighbours; on two
    # cores a single-threaded interpreter check takes half the CPU and less wall time. A value the user set wins.
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env.setdefault(var, "1")
    env["TRITON_CACHE_DIR"] = str(cache_root / "triton")
    env["KREGRESS_CUDA_CACHE"] = str(cache_root / "cuda")  # cubins of CUDA families (kernels/cuda/nvcc.py)
    env["PYTHONWARNINGS"] = "ignore"
    if interpret:
        env["TRITON_INTERPRET"] = "1"
        env["CUDA_VISIBLE_DEVICES"] = ""
    else:
        env.pop("TRITON_INTERPRET", None)
    return env


class Worker:
    """One child process running ``python -m kernels.worker``."""

    def __init__(self, env: dict[str, str], cwd: Path | None = None):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kernels.worker"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            text=True, bufsize=1, cwd=str(cwd or REPO_ROOT), env=env,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.ready = False  # its "ready" line has been read (a worker handed on after a job is)
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
        if not self.ready:
            self._read(timeout)
            self.ready = True

    def call(self, job: dict, timeout: float) -> dict:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(job) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            raise WorkerDied(str(exc)) from None
        return self._read(timeout)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


# Workers started before their pool exists, by environment: the CLI starts a CPU sweep's workers while it
# imports Dagster, and the first pool with the same environment adopts them (``reserve``).
_RESERVE: dict[str, list[Worker]] = {}
_RESERVE_LOCK = threading.Lock()


def _env_key(env: dict[str, str]) -> str:
    return json.dumps(sorted(env.items()))


def reserve(env: dict[str, str], n: int) -> None:
    """Start ``n`` workers with ``env`` now (no waiting: each imports in its own process); a WorkerPool
    created later with the same environment takes them before it starts any. Those left unclaimed end
    when this process exits."""
    workers = [Worker(env) for _ in range(max(0, n))]
    with _RESERVE_LOCK:
        _RESERVE.setdefault(_env_key(env), []).extend(workers)


def _claim(env: dict[str, str]) -> Worker | None:
    with _RESERVE_LOCK:
        waiting = _RESERVE.get(_env_key(env)) or []
        return waiting.pop(0) if waiting else None


# Jobs run ahead on reserved workers (``run_ahead``), by environment and job: the first pool that submits the
# same job with the same environment gets that run's answer instead of running it again.
_AHEAD: dict[str, Future] = {}
_AHEAD_BUSY: set[Worker] = set()  # workers running a job ahead right now (ended at exit like the reserve)


def _job_identity(env: dict[str, str], job: dict) -> str:
    """What makes two jobs the same run: the worker's environment and the job, less the caller's own keys
    (``_``-prefixed: a cache key, say, which the worker never reads)."""
    return json.dumps([_env_key(env), {k: v for k, v in job.items() if not k.startswith("_")}], sort_keys=True, default=str)


def _call(worker: Worker, job: dict, timeout: float) -> tuple[dict, bool]:
    """(the answer, whether the worker can take another job): a timeout or a dead worker is an answer too."""
    try:
        return worker.call(job, timeout), True
    except TimeoutError:
        worker.kill()
        return {"error": "timeout", "detail": f"no answer within {timeout:.0f} s; child process killed"}, False
    except WorkerDied as exc:
        worker.kill()
        return {"error": "crashed", "detail": f"child process died: {exc}"}, False


def run_ahead(env: dict[str, str], job: dict, timeout: float, startup_timeout: float = 120.0) -> None:
    """Run ``job`` now, in a thread of its own, on a worker reserved with ``env`` (``reserve``; a new one if
    none is left), and hand the worker back to the reserve afterwards. The CLI runs the baseline's compile
    and check this way while it imports Dagster: the first ``WorkerPool`` with the same environment that
    submits the same job is answered by this run (``wall_s`` is this run's) instead of running it again."""
    ident = _job_identity(env, job)
    fut: Future = Future()
    with _RESERVE_LOCK:
        if ident in _AHEAD:
            return
        _AHEAD[ident] = fut

    def go() -> None:
        worker = _claim(env) or Worker(env)
        with _RESERVE_LOCK:
            _AHEAD_BUSY.add(worker)
        try:
            worker.wait_ready(startup_timeout)
            t0 = time.perf_counter()  # the job's own time, as a pool's job with a ready worker counts it
            res, reusable = _call(worker, job, timeout)
        except BaseException as exc:  # noqa: BLE001 - a worker that never started: the pool runs the job itself
            worker.kill()
            with _RESERVE_LOCK:
                _AHEAD.pop(ident, None)
            fut.set_exception(exc)
            return
        finally:
            with _RESERVE_LOCK:
                _AHEAD_BUSY.discard(worker)
        res["wall_s"] = time.perf_counter() - t0
        if reusable:
            with _RESERVE_LOCK:
                _RESERVE.setdefault(_env_key(env), []).append(worker)
        fut.set_result(res)

    threading.Thread(target=go, daemon=True, name="kregress-ahead").start()


def _take_ahead(env: dict[str, str], job: dict) -> Future | None:
    with _RESERVE_LOCK:
        return _AHEAD.pop(_job_identity(env, job), None)


@atexit.register
def _end_reserve() -> None:
    with _RESERVE_LOCK:
        left = [w for ws in _RESERVE.values() for w in ws] + list(_AHEAD_BUSY)
        _RESERVE.clear()
        _AHEAD.clear()
        _AHEAD_BUSY.clear()
    for w in left:
        w.kill()


class WorkerPool:
    """Runs jobs on up to ``size`` long-lived child processes; ``close()`` ends them.

    ``submit`` queues one job and returns a Future, so a caller can chain work as each job finishes (a
    variant's correctness check starts the moment its compile is done, on another pool); ``run`` is the
    batch form. At most ``size`` jobs run at once, each on a worker of its own. ``prestart`` spawns workers
    ahead of the jobs: a worker's imports (torch, Triton) take seconds, which then overlap other work.
    """

    def __init__(self, size: int, env: dict[str, str], startup_timeout: float = 120.0):
        self.size = max(1, size)
        self.env = env
        self.startup_timeout = startup_timeout
        self._idle: list[Worker] = []
        self._all: set[Worker] = set()  # every live worker, busy or idle (close() ends them all)
        self._alive = 0  # workers alive or starting; never above size
        self._starting = 0  # of those, started by prestart and not ready yet
        self._waiting = 0  # jobs waiting for one of those
        self._cond = threading.Condition()
        self._executor = ThreadPoolExecutor(max_workers=self.size, thread_name_prefix="kregress-worker")
        self.spawned = 0  # workers started over the pool's life (a warm re-run should start none)
        self.adopted = 0  # of those, how many were already started by ``reserve``
        self.answered_ahead = 0  # jobs answered by a run ahead (``run_ahead``) instead of a worker of this pool

    def _spawn(self) -> Worker:
        """A ready worker (a reserved one if any, else a new one); the caller has counted it in ``_alive``."""
        try:
            w = _claim(self.env)
            if w is not None:
                self.adopted += 1
            else:
                w = Worker(self.env)
        except BaseException:
            self._forget(None)
            raise
        with self._cond:
            self._all.add(w)
        try:
            w.wait_ready(self.startup_timeout)
        except BaseException:
            w.kill()
            self._forget(w)
            raise
        return w

    def _forget(self, w: Worker | None) -> None:
        with self._cond:
            if w is not None:
                self._all.discard(w)
            self._alive -= 1
            self._cond.notify_all()

    def _take(self) -> Worker:
        with self._cond:
            while True:
                while self._idle:
                    w = self._idle.pop()
                    if w.alive():
                        return w
                    self._all.discard(w)
                    self._alive -= 1
                if self._starting > self._waiting:  # a prestarted worker is still importing: wait for it
                    self._waiting += 1
                    self._cond.wait()
                    self._waiting -= 1
                    continue
                if self._alive < self.size:
                    self._alive += 1
                    self.spawned += 1
                    break
                self._cond.wait()  # every worker is busy: the next one free is ours
        return self._spawn()

    def _give_back(self, w: Worker) -> None:
        with self._cond:
            self._idle.append(w)
            self._cond.notify_all()

    def prestart(self, n: int) -> None:
        """Spawn workers in the background until ``min(n, size)`` are alive or starting."""
        def start() -> None:
            try:
                w = self._spawn()
            except BaseException:  # noqa: BLE001 - a job that needs a worker spawns (and reports) its own
                w = None
            with self._cond:
                self._starting -= 1
                if w is not None:
                    self._idle.append(w)
                self._cond.notify_all()

        with self._cond:
            missing = max(0, min(n, self.size) - self._alive)
            self._alive += missing
            self._starting += missing
            self.spawned += missing
        for _ in range(missing):
            threading.Thread(target=start, daemon=True).start()

    def _run_one(self, job: dict, timeout: float, on_done: Callable[[dict], None] | None) -> dict:
        t0 = time.perf_counter()
        try:
            worker = self._take()
        except TimeoutError:  # a fresh worker that never got ready (the pool has already forgotten it)
            worker, res = None, {"error": "timeout", "detail": f"worker not ready within {self.startup_timeout:.0f} s"}
        except WorkerDied as exc:
            worker, res = None, {"error": "crashed", "detail": f"child process died: {exc}"}
        if worker is not None:
            try:
                res, reusable = _call(worker, job, timeout)
            except BaseException:
                self._give_back(worker)
                raise
            if reusable:
                self._give_back(worker)
            else:
                self._forget(worker)
        res["wall_s"] = time.perf_counter() - t0
        if on_done is not None:
            on_done(res)
        return res

    def _answer_from(self, ahead: Future, job: dict, timeout: float, on_done: Callable[[dict], None] | None) -> dict:
        try:
            res = dict(ahead.result())
        except BaseException:  # noqa: BLE001 - the run ahead never got a worker: run the job here
            return self._run_one(job, timeout, on_done)
        with self._cond:
            self.answered_ahead += 1
        if on_done is not None:
            on_done(res)
        return res

    def submit(self, job: dict, timeout: float, on_done: Callable[[dict], None] | None = None) -> Future:
        """Queue one job; the Future's result is the worker's answer (``error`` set for a timeout or crash).
        ``on_done(result)`` runs on the pool's thread before the Future completes. A job already run ahead
        with this pool's environment (``run_ahead``) is answered by that run."""
        ahead = _take_ahead(self.env, job)
        if ahead is not None:
            return self._executor.submit(self._answer_from, ahead, job, timeout, on_done)
        return self._executor.submit(self._run_one, job, timeout, on_done)

    def run(self, jobs: list[dict], timeout: float, on_done: Callable[[int, dict], None] | None = None) -> list[dict]:
        """Results in job order; ``on_done(i, result)`` is called as each job finishes (from a pool thread)."""
        futures = [self.submit(job, timeout, None if on_done is None else (lambda res, i=i: on_done(i, res)))
                   for i, job in enumerate(jobs)]
        return [f.result() for f in futures]

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        with self._cond:
            workers, self._all, self._idle = list(self._all), set(), []
        for w in workers:
            w.kill()

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
