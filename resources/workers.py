"""Child processes that compile, check and time variants (``python -m kernels.worker``).

A ``WorkerPool`` keeps up to ``size`` workers alive for as long as its owner (a benchmark backend, for
the duration of one Dagster step) and runs JSON jobs on them. A job past its timeout kills its worker
(the row says ``timeout``) and a worker that dies mid-job is ``crashed``; the pool spawns a fresh one
for the next job, so one bad variant never loses the round. The protocol (one JSON job per line on
stdin, one ``kernels.worker.PREFIX``-marked JSON line back) is defined in ``kernels/worker.py``.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from kregress.core.paths import REPO_ROOT
from kernels.worker import PREFIX


class WorkerDied(Exception):
    pass


def worker_env(cache_root: Path, interpret: bool) -> dict[str, str]:
    """The environment of a worker: this process's, plus the project and every import root on
    ``sys.path`` (so plugin and import-path families resolve in the child), Triton's cache under
    ``cache_root`` and, for the interpreter, TRITON_INTERPRET=1 with no GPU visible."""
    env = dict(os.environ)
    roots = [str(REPO_ROOT)] + [p for p in sys.path if p and Path(p).is_dir()]
    roots += [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(roots))
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    env["TRITON_CACHE_DIR"] = str(cache_root / "triton")
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

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


class WorkerPool:
    """Runs jobs on up to ``size`` long-lived child processes; ``close()`` ends them."""

    def __init__(self, size: int, env: dict[str, str], startup_timeout: float = 120.0):
        self.size = max(1, size)
        self.env = env
        self.startup_timeout = startup_timeout
        self._idle: list[Worker] = []
        self._lock = threading.Lock()
        self.spawned = 0  # workers started over the pool's life (a warm re-run should start none)

    def _take(self) -> Worker:
        with self._lock:
            while self._idle:
                w = self._idle.pop()
                if w.alive():
                    return w
            self.spawned += 1
        w = Worker(self.env)
        try:
            w.wait_ready(self.startup_timeout)
        except BaseException:
            w.kill()
            raise
        return w

    def _give_back(self, w: Worker) -> None:
        with self._lock:
            self._idle.append(w)

    def run(self, jobs: list[dict], timeout: float, on_done: Callable[[int, dict], None] | None = None) -> list[dict]:
        """Results in job order; ``on_done(i, result)`` is called as each job finishes (from a pool thread)."""
        results: list[dict | None] = [None] * len(jobs)
        todo: queue.Queue[int] = queue.Queue()
        for i in range(len(jobs)):
            todo.put(i)

        def slot() -> None:
            worker: Worker | None = None
            try:
                while True:
                    try:
                        i = todo.get_nowait()
                    except queue.Empty:
                        return
                    t0 = time.perf_counter()
                    try:
                        if worker is None:
                            worker = self._take()
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
                    self._give_back(worker)

        threads = [threading.Thread(target=slot, daemon=True) for _ in range(min(self.size, len(jobs)))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return [r if r is not None else {"error": "crashed", "detail": "no result"} for r in results]

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for w in idle:
            w.kill()

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
