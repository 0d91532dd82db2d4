"""The gate's sampled runs, process side of a child (reference or candidate): the interpreter hooks that run only
chosen programs of each launch and count what each wrote (``_ProgramSampler``), the sampled runs' bookkeeping
(``_ran``, ``_merged_stats``), the programs a candidate is handed (``_handed_programs``), and the reference
child's interpreter budget for a case (``_deadline``). Imported by ``kernels.gate_child``; no candidate code."""

from __future__ import annotations

import contextlib
import copy
import threading
import time
from typing import Any, Callable, Iterator

from kernels.gate_cases import _nan_mask, _outputs, _written_where, sample_programs


class _ProgramProxy:
    """Stands in for a kernel's Python function in the interpreter's grid loop: runs it only for the
    sampled programs, and counts, per program, how many elements of each floating tensor argument it
    turned from NaN into a value (what it wrote)."""

    def __init__(self, fn: Any, launch: dict, builder: Any):
        import inspect

        self.fn, self.launch, self.builder = fn, launch, builder
        self.__signature__ = inspect.signature(fn)
        self.__name__ = fn.__name__
        self.__globals__ = fn.__globals__

    def __call__(self, **args: Any) -> None:
        if tuple(self.builder.grid_idx) not in self.launch["sample"]:
            return None
        tensors = self.launch["tensors"]
        # the programs of a launch run one after another and nothing else writes between them, so one
        # program's count after is the next one's before: a count per program, not two (a scan of every
        # floating argument each; on a timed attention shape they were a quarter of a judgement)
        before = self.launch["nan_after"] or [_nan_mask(t) for t in tensors]
        # CPU seconds of this process, not wall seconds: what a program costs decides how many programs a candidate
        # runs and whether a suspicion escalates to a full run, and that must not change with the machine's load
        # (under a second job on the same cores the wall clock doubled, fewer programs were drawn, and a cheat
        # that skips the programs past 40 went unseen). The sandboxed child runs one thread (OMP_NUM_THREADS=1).
        t0 = time.process_time()
        self.fn(**args)
        self.launch["seconds"] += time.process_time() - t0
        after = [_nan_mask(t) for t in tensors]
        self.launch["nan_after"] = after
        self.launch["programs"].append([b[1] - a[1] for b, a in zip(before, after)])
        self.launch["where"].append([_written_where(b, a) for b, a in zip(before, after)])
        self.launch["pids"].append(",".join(map(str, self.builder.grid_idx)))
        self.launch["times"].append(time.process_time() - t0)
        return None


class _ProgramSampler:
    """While active, every interpreted launch runs only the programs ``sample_programs`` draws from
    ``seed`` (stratified by program id), NaN-poisoned outputs showing what they wrote. A timed shape costs the
    interpreter seconds per program; a few programs of it still show a launch that skips programs past a
    count, a wrapper that truncates work on large shapes, or a kernel that cheats on large program ids,
    which the small checked shapes never reach. Relies on the interpreter's grid loop (``GridExecutor``,
    ``interpreter_builder``); where those are not as expected it raises, and the case is not used."""

    def __init__(self, chooser: Callable[[int, tuple[int, int, int]], set]):
        self.chooser = chooser  # (launch index, grid) -> the programs of that launch to run
        self.launches: list[dict] = []

    def __enter__(self) -> "_ProgramSampler":
        import torch
        from triton.runtime import interpreter as interp

        builder = interp.interpreter_builder
        if not (hasattr(interp, "GridExecutor") and hasattr(builder, "set_grid_dim")):
            raise RuntimeError("the Triton interpreter has no GridExecutor / interpreter_builder.set_grid_dim")
        sampler, original_dim = self, builder.set_grid_dim

        def set_grid_dim(nx: int, ny: int, nz: int) -> None:
            original_dim(nx, ny, nz)
            sampler._choose(nx, ny, nz)

        class Sampled(interp.GridExecutor):  # type: ignore[misc, valid-type]
            def __call__(ex, *args_dev: Any, **kwargs: Any) -> Any:  # noqa: N805
                tensors = [t for t in list(args_dev) + list(kwargs.values()) if torch.is_tensor(t)]
                launch = {"tensors": tensors, "programs": [], "pids": [], "times": [], "grid": 0, "dims": (0, 0, 0),
                          "sample": set(), "seconds": 0.0, "nan_after": None, "where": []}
                sampler.launches.append(launch)
                real = ex.fn
                ex.fn = _ProgramProxy(real, launch, builder)
                try:
                    return super().__call__(*args_dev, **kwargs)
                finally:
                    ex.fn = real

        self._restore = (interp, interp.GridExecutor, builder)
        builder.set_grid_dim = set_grid_dim
        interp.GridExecutor = Sampled
        return self

    def _choose(self, nx: int, ny: int, nz: int) -> None:
        launch = self.launches[-1]
        launch["grid"] = nx * ny * nz
        launch["dims"] = (nx, ny, nz)
        launch["sample"] = set(self.chooser(len(self.launches) - 1, (nx, ny, nz)))

    def __exit__(self, *exc: object) -> None:
        interp, cls, builder = self._restore
        interp.GridExecutor = cls
        builder.__dict__.pop("set_grid_dim", None)

    def stats(self, out: Any) -> dict:
        """Per output tensor, the launches that wrote into it: grid size and per sampled program the
        elements it wrote there; and the estimated seconds of a full run."""
        import torch

        per_out = []
        for o in _outputs(out):
            entry: dict[str, Any] = {"launches": []}
            if torch.is_tensor(o):
                ptr = o.untyped_storage().data_ptr()
                for n, launch in enumerate(self.launches):
                    idx = [i for i, t in enumerate(launch["tensors"]) if t.untyped_storage().data_ptr() == ptr]
                    if idx:
                        entry["launches"].append({"grid": launch["grid"], "index": n,
                                                  "filled": [sum(p[i] for i in idx) for p in launch["programs"]],
                                                  "where": ["|".join(w[i] for i in idx) for w in launch["where"]],
                                                  "pids": list(launch["pids"])})
            per_out.append(entry)
        full = sum(la["seconds"] / max(1, len(la["programs"])) * la["grid"] for la in self.launches)
        ran = [{"dims": list(la["dims"]), "pids": list(la["pids"]), "wrote": [sum(p) for p in la["programs"]],
                "times": list(la["times"])} for la in self.launches]
        return {"outputs": per_out, "launches": len(self.launches), "full_seconds": full, "ran": ran,
                "programs": sum(len(la["programs"]) for la in self.launches), "grid": sum(la["grid"] for la in self.launches)}


class _OverBudget(Exception):
    """A budgeted case's baseline run went past its interpreter seconds (``_deadline``)."""


@contextlib.contextmanager
def _deadline(seconds: float | None) -> Iterator[None]:
    """Raise ``_OverBudget`` in the reference child's main thread once ``seconds`` have passed (None: no limit);
    whatever the interrupted code raises once the time is up (the interpreter wraps the alarm's exception in its
    InterpreterError) leaves as ``_OverBudget``.
    Every case a judgement keeps runs once per candidate, so a hidden shape drawn past the interpreter's means
    (MLA 13x7x67x617: ~60 s a candidate, twelve candidates) costs minutes; the next shape of its group, with
    fewer dimensions mutated, is tried instead."""
    import signal

    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    expired = False

    def expire(signum: int, frame: Any) -> None:
        nonlocal expired
        expired = True
        raise _OverBudget()

    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    except Exception:
        if expired:
            raise _OverBudget() from None
        raise
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _ran(stats: dict) -> list[dict[tuple, tuple[int, float]]]:
    """Per launch: program -> (elements it wrote, seconds it took)."""
    return [{tuple(int(x) for x in pid.split(",")): (w, t) for pid, w, t in zip(la["pids"], la["wrote"], la["times"])}
            for la in stats["ran"]]


def _merged_stats(stats: list[dict]) -> dict:
    """The sampled runs' stats as one: per output and launch the programs of every run."""
    out = copy.deepcopy(stats[0])
    for st in stats[1:]:
        for mine, theirs in zip(out["outputs"], st["outputs"]):
            for la, lb in zip(mine["launches"], theirs["launches"]):
                la["filled"] += lb["filled"]
                la["where"] += lb["where"]
                la["pids"] += lb["pids"]
        for ra, rb in zip(out["ran"], st["ran"]):
            for key in ("pids", "wrote", "times"):
                ra[key] += rb[key]
        out["programs"] += st["programs"]
    return out


def _handed_programs(case: dict) -> Callable[[int, tuple[int, int, int]], set]:
    """Candidate child: the programs of each launch the reference child chose for this candidate (all of them
    ran in the baseline); a launch the baseline did not make (another count or grid) runs the first choices
    of a draw."""
    import random

    progs = case.get("programs") or []

    def chooser(j: int, dims: tuple[int, int, int]) -> set:
        if j < len(progs) and tuple(progs[j]["dims"]) == tuple(dims):
            return {tuple(p) for p in progs[j]["pids"]}
        return sample_programs(dims, random.Random(f"{int(case['sample'])}:{j}"))

    return chooser
