"""Serve recorded Kernel Tuner cache files: real GPU runs for a machine with no GPU (no Dagster import).

A Kernel Tuner cache file is JSON (optionally gzipped) with the header keys ``device_name``,
``kernel_name``, ``problem_size``, ``tune_params_keys``, ``tune_params``, ``objective`` and ``cache``;
``cache`` maps ``"v1,v2,..."`` (values in ``tune_params_keys`` order) to one record: ``time`` (mean ms,
or a string naming a failure such as ``RuntimeFailedConfig``), ``times`` (the individual runs, ms),
``GFLOP/s``, ``compile_time`` and timestamps. Any such file is read: its parameter names, values,
problem size and failures come from the file itself.

Where the files live:

* the project ships what its default spec and tests need in ``data/replay/`` (``SHIPPED_DIR``: a
  trimmed RTX 3090 GEMM file, MIT licensed, notice beside it);
* the larger benchmark sets live in ``$KREGRESS_REPLAY_DIR``, else ``../shared/data/replay/`` next to
  the repository (``replay_dir()``), and are never copied in;
* a spec's ``params.cache_file`` is a path: absolute, or relative to the spec's folder, then to
  ``$KREGRESS_REPLAY_DIR``, then to ``SHIPPED_DIR`` (``resolve_cache_file``).

    table = ReplayTable.load()                      # the shipped (trimmed) RTX 3090 CLBlast GEMM space
    table = ReplayTable.load(replay_path())         # the full 17,956-configuration file, from replay_dir()
    table.space.check(config)                       # None, or why the config is not in the space
    rec = table.lookup(config)                      # ReplayRecord: 32 runs, or a failure
    measurements = to_measurements(table, rec)      # kregress.core.records.Measurement, evidence "replay"

Parsed tables are cached per file in the process (keyed by path, size and mtime), so a second load is
free; the first takes about half a second for the 17,956-entry file.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import os
import threading
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kregress.core.family import Rule, Space
from kregress.core.paths import REPO_ROOT
from kregress.core.records import Measurement

ENV_DIR = "KREGRESS_REPLAY_DIR"
DEFAULT_FILE = "gemm_clblast_RTX_3090.json.gz"  # the full benchmark file, in replay_dir()
SHIPPED_DIR = REPO_ROOT / "data" / "replay"  # recorded files shipped with the project (MIT, see NOTICE there)
SHIPPED_FILE = "gemm_clblast_RTX_3090_trimmed.json.gz"  # cut by scripts/trim_replay.py
# The benchmark sets kept beside the repository (../shared/data/replay/README.md), never shipped
BENCHMARK_FILES = ("gemm_clblast_RTX_3090.json.gz", "convolution_milo_A4000.json.gz",
                   "dedispersion_milo_A4000.json.gz", "pnpoly_RTX_3090.json.gz")
HEADER_KEYS = ("device_name", "kernel_name", "problem_size", "tune_params_keys", "tune_params", "objective", "cache")
# Keys older or hand-written cache files leave out or empty, what is assumed then, and why it is safe to.
DEFAULTED_KEYS = {
    "objective": ("time", "the file names no objective (Kernel Tuner before objectives were recorded tuned for time): "
                          "the objective is taken to be time, lower is better"),
    "device_name": ("unknown GPU", "the file names no device (device_name is empty): the device is recorded as "
                                   "'unknown GPU'; its arch and limits are an H100's defaults, and replay verdicts do "
                                   "not depend on them"),
}

# Kernel Tuner failure markers -> the error classes of kregress.core.records.ERROR_CLASSES
FAILURE_ERROR_CLASS = {
    "CompilationFailedConfig": "compile_failed",
    "RuntimeFailedConfig": "runtime_error",
    "InvalidConfig": "invalid_config",
}


class ReplayError(ValueError):
    """A replay file that cannot be used; the message names the file and what is wrong."""


class ReplayLookupError(LookupError):
    """A configuration the replay table cannot answer; the message says why."""

    def __str__(self) -> str:  # LookupError would show the repr of the message
        return str(self.args[0]) if self.args else ""


def replay_dir() -> Path:
    """``$KREGRESS_REPLAY_DIR`` when set, else ``<repo>/../shared/data/replay``."""
    env = os.environ.get(ENV_DIR, "").strip()
    return Path(env).expanduser() if env else REPO_ROOT.parent / "shared" / "data" / "replay"


def replay_path(name: str = DEFAULT_FILE) -> Path:
    """``name`` in ``replay_dir()`` (the benchmark sets; the full RTX 3090 GEMM file by default)."""
    return replay_dir() / name


def shipped_path(name: str = SHIPPED_FILE) -> Path:
    """``name`` in the project's own ``data/replay/`` (the trimmed RTX 3090 GEMM file by default)."""
    return SHIPPED_DIR / name


def missing_benchmark_files() -> list[str]:
    """The benchmark files absent from ``replay_dir()`` (tests on them skip; benchmarks say so)."""
    return [n for n in BENCHMARK_FILES if not (replay_dir() / n).is_file()]


def search_dirs(spec_dir: str | os.PathLike[str] | None = None) -> list[Path]:
    """Where a relative ``cache_file`` is looked up, in order: the spec's folder, ``$KREGRESS_REPLAY_DIR``
    (else ``../shared/data/replay``), the shipped ``data/replay/``."""
    out = [Path(spec_dir)] if spec_dir is not None else []
    return out + [replay_dir(), SHIPPED_DIR]


def resolve_cache_file(name: str | os.PathLike[str], spec_dir: str | os.PathLike[str] | None = None) -> Path:
    """The file a spec's ``cache_file`` names; ReplayError (one line naming the file, the folders
    searched and KREGRESS_REPLAY_DIR) when there is none."""
    p = Path(name).expanduser()
    if p.is_absolute():
        if p.is_file():
            return p
        raise ReplayError(f"replay file {p} not found (cache_file is an absolute path; fix it, or give a name "
                          f"found in ${ENV_DIR} or {SHIPPED_DIR})")
    dirs = search_dirs(spec_dir)
    for d in dirs:
        if (d / p).is_file():
            return d / p
    env = os.environ.get(ENV_DIR, "").strip()
    where = ", ".join(str(d) for d in dirs)
    raise ReplayError(
        f"replay file {str(p)!r} not found in {where} (${ENV_DIR} is {repr(env) if env else 'unset'}; "
        f"set it to the folder that holds the file, or give cache_file as a path)"
    )


@dataclass(frozen=True)
class ReplayRecord:
    """One recorded configuration: the runs, or the failure Kernel Tuner recorded instead."""

    config: dict[str, int]
    times: list[float] = field(default_factory=list)  # the individual runs (ms), 32 in the RTX 3090 file
    time: float | None = None  # mean (ms) as recorded
    gflops: float | None = None
    compile_time: float | None = None
    failure: str | None = None  # e.g. "RuntimeFailedConfig", "CompilationFailedConfig"

    @property
    def ok(self) -> bool:
        return self.failure is None

    @property
    def error(self) -> str | None:
        """The records.ERROR_CLASSES value for a failure, None when the runs exist."""
        if self.failure is None:
            return None
        return FAILURE_ERROR_CLASS.get(self.failure, "runtime_error")


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    v = float(v)
    return v if math.isfinite(v) else None


class ReplayTable:
    """A parsed Kernel Tuner cache file. Use ``ReplayTable.load(path)``."""

    def __init__(self, path: Path, header: dict[str, Any], entries: dict[tuple[int, ...], dict[str, Any]],
                 content_hash: str = ""):
        self.path = path
        self.device_name: str = header["device_name"]
        self.kernel_name: str = header["kernel_name"]
        ps = header["problem_size"]
        self.problem_size: list[int] = [ps] if isinstance(ps, int) else list(ps)  # pnpoly records one int
        self.objective: str = header["objective"]
        self.tune_params_keys: tuple[str, ...] = tuple(header["tune_params_keys"])
        self.tune_params: dict[str, tuple[int, ...]] = {
            k: tuple(header["tune_params"][k]) for k in self.tune_params_keys
        }
        self._entries = entries
        self.content_hash: str = content_hash  # sha256 of the file's bytes as read
        self.assumed: list[str] = []  # what was assumed for header keys the file leaves out (DEFAULTED_KEYS)
        self._records: dict[tuple[int, ...], ReplayRecord] = {}
        entries_ref = entries
        keys = self.tune_params_keys
        rule = Rule(
            name="recorded_in_cache",
            text=(
                f"the configuration must be present in the recorded cache ({len(entries):,} of "
                f"{math.prod(len(v) for v in self.tune_params.values()):,} points of {self.kernel_name} on "
                f"{self.device_name}; points absent from it are ruled out by the kernel's restrictions)"
            ),
            predicate=lambda config, params, limits: tuple(config[k] for k in keys) in entries_ref,
        )
        self.space = Space(params=dict(self.tune_params), rules=(rule,))

    # ---------------------------------------------------------------------------------------------
    @classmethod
    def load(cls, path: str | os.PathLike[str] | None = None) -> "ReplayTable":
        """Load (or return the in-process cached) table of a Kernel Tuner cache file.

        ``path`` defaults to the trimmed RTX 3090 GEMM file shipped in ``data/replay/`` (``shipped_path()``);
        ``replay_path()`` is the full file among the benchmark sets.
        """
        p = Path(path) if path is not None else shipped_path()
        try:
            st = p.stat()
        except OSError:
            raise ReplayError(f"replay file {p} not found (set {ENV_DIR} to the folder that holds it, "
                              "or pass the file's path)") from None
        key = (str(p.resolve()), st.st_size, st.st_mtime_ns)
        with _LOCK:
            table = _CACHE.get(key)
        if table is None:
            table = cls._parse(p)
            with _LOCK:
                _CACHE[key] = table
        return table

    @classmethod
    def _parse(cls, p: Path) -> "ReplayTable":
        try:
            with open(p, "rb") as fh:
                raw = fh.read()
            digest = hashlib.sha256(raw).hexdigest()
            if raw[:2] == b"\x1f\x8b":
                raw = gzip.decompress(raw)
            data = json.loads(raw)
        except (OSError, EOFError, zlib.error, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ReplayError(f"{p}: not a readable Kernel Tuner cache file ({type(exc).__name__}: {exc})") from None
        if not isinstance(data, dict):
            raise ReplayError(
                f"{p}: not a Kernel Tuner cache file: the top level is {type(data).__name__}, not an object"
            )
        assumed = []
        for k, (default, note) in DEFAULTED_KEYS.items():  # absent or empty: assume, and say so
            if data.get(k) is None or data.get(k) == "":
                data[k] = default
                assumed.append(note)
        missing = [k for k in HEADER_KEYS if k not in data]
        if missing:
            raise ReplayError(
                f"{p}: not a Kernel Tuner cache file: missing key {', '.join(repr(k) for k in missing)} "
                f"(required: {', '.join(k for k in HEADER_KEYS if k not in DEFAULTED_KEYS)})"
            )
        for k in ("device_name", "kernel_name", "objective"):
            if not isinstance(data[k], str) or not data[k]:
                raise ReplayError(f"{p}: {k!r} must be a non-empty string, got {data[k]!r}")
        keys = data["tune_params_keys"]
        if not isinstance(keys, list) or not keys or not all(isinstance(k, str) for k in keys):
            raise ReplayError(f"{p}: 'tune_params_keys' must be a non-empty list of names")
        tp = data["tune_params"]
        if not isinstance(tp, dict):
            raise ReplayError(f"{p}: 'tune_params' must map each tunable to its values")
        for k in keys:
            vals = tp.get(k)
            if vals is None:
                raise ReplayError(f"{p}: 'tune_params' has no values for {k!r} named in 'tune_params_keys'")
            if (
                not isinstance(vals, list)
                or not vals
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in vals)
            ):
                raise ReplayError(f"{p}: 'tune_params' {k!r} must be a non-empty list of integers, got {vals!r}")
        ps = data["problem_size"]
        ps_list = [ps] if isinstance(ps, int) and not isinstance(ps, bool) else ps
        if (not isinstance(ps_list, list) or not ps_list
                or not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in ps_list)):
            raise ReplayError(f"{p}: 'problem_size' must be a positive integer or a list of them, got {ps!r}")
        cache = data["cache"]
        if not isinstance(cache, dict):
            raise ReplayError(f"{p}: 'cache' must map configuration keys to records")
        allowed = [set(tp[k]) for k in keys]
        entries: dict[tuple[int, ...], dict[str, Any]] = {}
        for ck, rec in cache.items():
            parts = ck.split(",")
            try:
                tup = tuple(int(x) for x in parts)
            except ValueError:
                raise ReplayError(f"{p}: cache key {ck!r} is not a list of integers") from None
            if len(tup) != len(keys):
                raise ReplayError(f"{p}: cache key {ck!r} has {len(tup)} values, 'tune_params_keys' names {len(keys)}")
            for name, v, ok in zip(keys, tup, allowed):
                if v not in ok:
                    raise ReplayError(f"{p}: cache key {ck!r} has {name}={v}, which 'tune_params' does not list")
            if not isinstance(rec, dict) or "time" not in rec:
                raise ReplayError(f"{p}: cache entry {ck!r} is not a record with a 'time'")
            entries[tup] = rec
        table = cls(p, data, entries, content_hash=digest)
        table.assumed = assumed
        return table

    # ---------------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"ReplayTable({self.kernel_name} on {self.device_name}, {len(self)} recorded, {self.path})"

    @property
    def shape_label(self) -> str:
        return "x".join(str(x) for x in self.problem_size)

    def key(self, config: dict[str, int]) -> tuple[int, ...]:
        return tuple(config[k] for k in self.tune_params_keys)

    def check(self, config: dict[str, Any]) -> str | None:
        """None when the configuration has a record, else the reason it has none."""
        return self.space.check(config)

    def lookup(self, config: dict[str, Any]) -> ReplayRecord:
        """The recorded runs of ``config``; raises ReplayLookupError (with the reason) outside the space."""
        why = self.space.check(config)
        if why is not None:
            raise ReplayLookupError(f"no replay record for {config}: {why}")
        return self._record(self.key(config))

    def _record(self, key: tuple[int, ...]) -> ReplayRecord:
        rec = self._records.get(key)
        if rec is None:
            rec = self._build(key, self._entries[key])
            self._records[key] = rec
        return rec

    def _build(self, key: tuple[int, ...], raw: dict[str, Any]) -> ReplayRecord:
        config = dict(zip(self.tune_params_keys, key))
        t = raw.get("time")
        compile_time = _num(raw.get("compile_time"))
        if isinstance(t, str):
            return ReplayRecord(config=config, failure=t, compile_time=compile_time)
        mean = _num(t)
        times_raw = raw.get("times", [])
        times = [float(x) for x in times_raw] if isinstance(times_raw, list) else []
        if mean is None or not all(math.isfinite(x) and x > 0 for x in times):
            return ReplayRecord(config=config, failure=f"malformed record (time={t!r})", compile_time=compile_time)
        return ReplayRecord(
            config=config,
            times=times,
            time=mean,
            gflops=_num(raw.get("GFLOP/s")),
            compile_time=compile_time,
        )

    @property
    def runs_per_config(self) -> int:
        """The fewest recorded runs of any valid configuration (32 in the RTX 3090 GEMM file, 10 in pnpoly)."""
        return min((len(r.times) for r in self.records()), default=0)

    def median(self) -> ReplayRecord:
        """The valid configuration of median recorded ``time`` (the lower median for an even count; ties by
        cache order): a baseline with room to improve and room to regress."""
        ok = sorted(self.records(), key=lambda r: r.time)  # type: ignore[arg-type, return-value]
        if not ok:
            raise ReplayError(f"{self.path}: no configuration has recorded runs")
        return ok[(len(ok) - 1) // 2]

    def records(self, include_failed: bool = False):
        """Every recorded configuration as a ReplayRecord (cache order)."""
        for key in self._entries:
            rec = self._record(key)
            if include_failed or rec.ok:
                yield rec

    def valid_configs(self, include_failed: bool = False) -> list[dict[str, int]]:
        """Configurations with recorded runs (the failed ones too with ``include_failed``)."""
        return [r.config for r in self.records(include_failed=include_failed)]

    def failures(self) -> list[ReplayRecord]:
        return [r for r in self.records(include_failed=True) if not r.ok]

    def best(self) -> ReplayRecord:
        """The recorded optimum of the file's objective: lowest ``time``, or highest throughput when the
        objective is a rate such as ``GFLOP/s``."""
        ok = list(self.records())
        if not ok:
            raise ReplayError(f"{self.path}: no configuration has recorded runs")
        if self.objective == "time":
            return min(ok, key=lambda r: r.time)  # type: ignore[arg-type, return-value]
        if self.objective.endswith("/s"):
            scored = [r for r in ok if r.gflops is not None] if self.objective == "GFLOP/s" else []
            if scored:
                return max(scored, key=lambda r: r.gflops)  # type: ignore[arg-type, return-value]
        raise ReplayError(f"{self.path}: objective {self.objective!r} is not supported (time or GFLOP/s)")


_CACHE: dict[tuple[str, int, int], ReplayTable] = {}
_LOCK = threading.Lock()


def to_measurements(
    table: ReplayTable,
    record: ReplayRecord,
    *,
    bytes_moved: float | None = None,
    torch_version: str = "n/a",
    triton_version: str = "n/a",
) -> list[Measurement]:
    """The recorded runs of one configuration as Measurements (evidence ``replay``, device the file's).

    One Measurement for the file's one problem size, carrying every recorded run as ``samples_ms``.
    ``tflops`` is at p50: the FLOP count is recovered from the record (``GFLOP/s`` x mean time).
    The file records no byte count, so ``gbps`` is 0.0 unless ``bytes_moved`` is given. The runs were
    not made with torch or Triton, hence the versions default to ``n/a``. A failed record yields no
    Measurement (an empty list); its ``error`` says which error class it is.
    """
    if not record.ok or not record.times:
        return []
    samples = np.asarray(record.times, dtype=float)
    p20, p50, p80 = (float(x) for x in np.percentile(samples, [20, 50, 80]))
    flops = record.gflops * 1e9 * (record.time / 1e3) if record.gflops is not None and record.time else None
    tflops = flops / (p50 / 1e3) / 1e12 if flops else 0.0
    gbps = bytes_moved / (p50 / 1e3) / 1e9 if bytes_moved else 0.0
    return [
        Measurement(
            shape=table.shape_label,
            samples_ms=[float(x) for x in record.times],
            p20_ms=p20,
            p50_ms=p50,
            p80_ms=p80,
            tflops=tflops,
            gbps=gbps,
            evidence="replay",
            device=table.device_name,
            torch_version=torch_version,
            triton_version=triton_version,
        )
    ]
