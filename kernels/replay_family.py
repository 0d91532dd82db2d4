"""The ``replay`` family: a recorded Kernel Tuner search space served as if it were a GPU.

Every evaluation answers with the real runs recorded for that configuration (32 per config in the
shipped CLBlast SGEMM file on an RTX 3090), so the search policies, the statistics and the whole
pipeline run on real GPU measurements on a machine with no GPU. There is no Triton source: nothing is
compiled, and correctness is not re-checked (the recorded kernel was validated when it was tuned).
Configurations absent from the file are invalid (the kernel's own restrictions ruled them out);
recorded failures (string times) come back as rows with their error class.
"""

from __future__ import annotations

import hashlib

from kregress.core.family import Family, Space, register
from kregress.core.recorded import DEFAULT_FILE, ReplayTable, replay_path, to_measurements


class _LazySpace(Space):
    """The space is read from the file on first use, so importing the registry stays cheap."""

    def __init__(self, family: "ReplayFamily"):
        object.__setattr__(self, "_family", family)
        object.__setattr__(self, "_space", None)

    def _resolved(self) -> Space:
        if self._space is None:  # read the file once per process, on first use
            object.__setattr__(self, "_space", self._family.table().space)
        return self._space

    @property
    def params(self):  # type: ignore[override]
        return self._resolved().params

    @property
    def rules(self):  # type: ignore[override]
        return self._resolved().rules


class ReplayFamily(Family):
    dtypes = ("fp32",)
    recorded = True

    def table(self, params: dict | None = None) -> ReplayTable:
        name = (params or {}).get("cache_file", DEFAULT_FILE)
        return ReplayTable.load(replay_path(name))

    def check_params(self, params):
        extra = [k for k in params if k != "cache_file"]
        if extra:
            return f"unknown params {', '.join(extra)}; allowed: cache_file (a Kernel Tuner cache in the replay folder)"
        try:
            self.table(params)
        except Exception as exc:  # a missing or corrupt file is a spec problem, said once
            return str(exc)
        return None

    def check_shape(self, shape):
        problem = super().check_shape(shape)
        if problem:
            return problem
        t = self.table()
        m, n = t.problem_size[:2]
        want = {"M": m, "N": n, "K": m}
        if shape != want:
            return f"the recorded file {t.path.name} holds one problem only: {want}"
        return None

    def flops(self, shape, params):
        return 2.0 * shape["M"] * shape["N"] * shape["K"]

    def bytes_moved(self, shape, dtype_bytes, params):
        return float(dtype_bytes * (shape["M"] * shape["K"] + shape["K"] * shape["N"] + shape["M"] * shape["N"]))

    def replay(self, config: dict[str, int], shape: dict, params: dict):
        """(measurements, error, detail) for one config: the recorded runs, or the recorded failure."""
        t = self.table(params)
        rec = t.lookup(config)
        if not rec.ok:
            return [], rec.error, f"recorded failure: {rec.failure}"
        return to_measurements(t, rec, bytes_moved=self.bytes_moved(shape, 4, params)), None, ""

    def source_hash(self) -> str:
        p = replay_path()
        stamp = f"{p.name}:{p.stat().st_size}" if p.exists() else p.name
        return hashlib.sha256(stamp.encode()).hexdigest()[:16]


FAMILY = ReplayFamily(name="replay", space=None, shape_keys=("M", "N", "K"), headline_metric="tflops")
FAMILY.space = _LazySpace(FAMILY)
register(FAMILY)
