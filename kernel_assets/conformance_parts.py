"""What every kind's conformance checks share (``kernel_assets.conformance`` and ``conformance_cuda``): the
``Check`` record, the smallest and largest tile of a space, and running jobs in one worker process."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from kregress.core.family import Family
from kregress.core.spec import TaskSpec

ENUMERATE_CAP = 200_000


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # PASS, FAIL or SKIP
    detail: str
    fix: str = ""

    @property
    def ok(self) -> bool:
        return self.status != "FAIL"

    def line(self) -> str:
        return f"{self.status:<4} {self.name}: {self.detail}" + (f". Fix: {self.fix}" if self.fix and not self.ok else "")


def _tiles(family: Family, spec: TaskSpec) -> list[dict[str, int]]:
    """The smallest and the largest tile (product of the BLOCK_* values, else of every value)."""
    keys = [k for k in family.space.params if k.upper().startswith("BLOCK")] or list(family.space.params)
    best: dict[str, tuple[int, dict]] = {}
    for n, cfg in enumerate(family.space.enumerate(spec.params, spec.hardware.limits)):
        if n >= ENUMERATE_CAP:
            break
        size = math.prod(cfg[k] for k in keys)
        if "min" not in best or size < best["min"][0]:
            best["min"] = (size, cfg)
        if "max" not in best or size > best["max"][0]:
            best["max"] = (size, cfg)
    out = [best["min"][1]] if best else []
    if best and best["max"][1] != best["min"][1]:
        out.append(best["max"][1])
    return out


def _run_jobs(jobs: list[dict], interpret: bool, timeout: float) -> list[dict]:
    import tempfile

    from resources.workers import WorkerPool, worker_env

    with tempfile.TemporaryDirectory(prefix="kregress-check-") as cache, \
            WorkerPool(1, worker_env(Path(cache), interpret=interpret)) as pool:
        return pool.run(jobs, timeout)
