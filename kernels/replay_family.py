"""The ``replay`` family: any recorded Kernel Tuner search space served as if it were a GPU.

Every evaluation answers with the real runs recorded for that configuration (32 per config in the
CLBlast SGEMM file on an RTX 3090), so the search policies, the statistics and the whole pipeline run
on real GPU measurements on a machine with no GPU. There is no Triton source: nothing is compiled, and
correctness is not re-checked (the recorded kernel was validated when it was tuned).

Everything kernel-specific comes from the file the spec's ``params.cache_file`` names (a path: absolute,
or relative to the spec's folder, then ``$KREGRESS_REPLAY_DIR``, then the shipped ``data/replay/``;
default: the shipped trimmed RTX 3090 GEMM file):

* the space: the file's ``tune_params_keys`` and ``tune_params``; configurations absent from its cache
  are invalid (the kernel's own restrictions ruled them out); recorded failures are inside the space
  and come back as rows with their error (``runtime_error``, ``compile_failed``) and the recorded marker;
* the shapes: one, the file's ``problem_size``, under Kernel Tuner's dimension names ``x``, ``y``, ``z``;
* the identity: ``source_hash()`` is the hash of the file's bytes, so a changed recording is a changed
  kernel for the compile-free pipeline (code_version, the spec sensor).

``get_family("replay").for_params(spec.params)`` returns the family bound to that file; the
unbound family stands for the shipped default file.
"""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path
from typing import Any

from kregress.core.family import RecordedFamily, Space, check_param_keys, register
from kregress.core.recorded import (
    ENV_DIR,
    ReplayError,
    ReplayTable,
    resolve_cache_file,
    shipped_path,
    to_measurements,
)

PARAMS = ("cache_file",)
DIM_NAMES = ("x", "y", "z")  # Kernel Tuner's names for the problem_size dimensions


def shape_keys_for(table: ReplayTable) -> tuple[str, ...]:
    n = len(table.problem_size)
    return DIM_NAMES[:n] if n <= len(DIM_NAMES) else tuple(f"d{i}" for i in range(n))


def shape_for(table: ReplayTable) -> dict[str, int]:
    """The one problem the file records, as a spec shape (``{"x": 4096, "y": 4096}``)."""
    return dict(zip(shape_keys_for(table), table.problem_size))


def where(name: Any) -> str:
    """Where a cache_file name was looked for, for messages about a file that was found but is unusable."""
    import os

    env = os.environ.get(ENV_DIR, "").strip()
    return (f"cache_file {name!r} resolves against the spec's folder, ${ENV_DIR} "
            f"({repr(env) if env else 'unset'}), then the shipped data/replay/")


class _LazySpace(Space):
    """The unbound family's space, read from the shipped file on first use (importing stays cheap)."""

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


class ReplayFamily(RecordedFamily):
    dtypes = ("fp32",)
    _bound: ReplayTable | None = None  # set on the families for_params returns

    def table(self, params: dict | None = None) -> ReplayTable:
        """The recorded table: the file ``params['cache_file']`` names, else the bound one, else the
        shipped default. Raises ReplayError (one line) when the file is missing or unreadable."""
        name = (params or {}).get("cache_file")
        if name is not None:
            return ReplayTable.load(resolve_cache_file(name))
        if self._bound is not None:
            return self._bound
        return ReplayTable.load(shipped_path())

    def resolve_params(self, params: dict[str, Any], spec_dir: Path) -> dict[str, Any]:
        name = params.get("cache_file")
        if isinstance(name, str) and name and not Path(name).expanduser().is_absolute():
            local = Path(spec_dir) / name
            if local.is_file():  # beside the spec: keep the spec working from any current directory
                return {**params, "cache_file": str(local.resolve())}
        return params

    def check_params(self, params):
        problem = check_param_keys(params, PARAMS)
        if problem:
            return f"{problem} (cache_file: a Kernel Tuner cache file)"
        name = params.get("cache_file")
        if name is not None and (not isinstance(name, str) or not name.strip()):
            return f"cache_file={name!r} must be a file name or path"
        try:
            self.table(params)
        except ReplayError as exc:  # a missing or corrupt file is a spec problem, said once
            return str(exc) if ENV_DIR in str(exc) else f"{exc} ({where(name)})"
        return None

    def for_params(self, params) -> "ReplayFamily":
        table = self.table(params)
        key = (str(table.path.resolve()), table.content_hash)
        with _LOCK:
            fam = _BOUND.get(key)
            if fam is None or fam._bound is not table:
                fam = ReplayFamily(name=self.name, space=table.space, shape_keys=shape_keys_for(table),
                                   headline_metric="tflops", module=self.module)
                fam._bound = table
                _BOUND[key] = fam
        return fam

    def check_shape(self, shape):
        if self._bound is None:  # the unbound family checks against the shipped file
            return self.for_params({}).check_shape(shape)
        t = self._bound
        problem = super().check_shape(shape)
        if problem:
            return problem
        want = shape_for(t)
        if shape != want:
            return f"the recorded file {t.path.name} holds one problem only: {want} (its problem_size)"
        return None

    def flops(self, shape, params):
        """The FLOP count the file implies (``GFLOP/s`` x ``time`` of its records); 0.0 when it records no rate."""
        t = self.table(params) if params else self.table()
        for rec in t.records():
            if rec.gflops is not None and rec.time:
                return rec.gflops * 1e9 * rec.time / 1e3
        return 0.0

    def bytes_moved(self, shape, dtype_bytes, params):
        return 0.0  # a Kernel Tuner cache records no byte count

    def replay(self, config: dict[str, int], shape: dict, params: dict):
        """(measurements, error, detail) for one config: the recorded runs, or the recorded failure."""
        t = self.table(params)
        rec = t.lookup(config)
        if not rec.ok:
            return [], rec.error, f"recorded failure: {rec.failure} ({t.path.name})"
        return to_measurements(t, rec), None, ""

    def source_files(self) -> list[Path]:
        return [self._bound.path if self._bound is not None else shipped_path()]

    def source_hash(self) -> str:
        """The recorded file's content hash (what this family 'runs'); ``missing:`` when it cannot be read."""
        try:
            digest = self.table().content_hash
        except ReplayError:
            digest = f"missing:{self.source_files()[0]}"
        return hashlib.sha256(f"{self.name}:{digest}".encode()).hexdigest()[:16]


_BOUND: dict[tuple[str, str], ReplayFamily] = {}
_LOCK = threading.Lock()

# The unbound family stands for the shipped file; its shape keys are that file's (a 2-D problem_size).
FAMILY = ReplayFamily(name="replay", space=None, shape_keys=("x", "y"), headline_metric="tflops")
FAMILY.space = _LazySpace(FAMILY)
register(FAMILY)
