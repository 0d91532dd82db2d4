"""kregress/core/recorded.py: the shipped (trimmed) RTX 3090 GEMM file, the full benchmark file from
../shared (skipped with a reason when absent), path resolution, and bad files made here."""

from __future__ import annotations

import gzip
import hashlib
import itertools
import json
import os
from pathlib import Path

import numpy as np
import pytest

from kregress.core.family import Space
from kregress.core.recorded import (
    DEFAULTED_KEYS,
    ENV_DIR,
    HEADER_KEYS,
    SHIPPED_DIR,
    ReplayError,
    ReplayLookupError,
    ReplayTable,
    replay_dir,
    replay_path,
    resolve_cache_file,
    shipped_path,
    to_measurements,
)
from kregress.core.records import Measurement

ROOT = Path(__file__).resolve().parents[1]

# From shared/data/replay/README.md
README_SPACE = {
    "MWG": (16, 32, 64, 128),
    "NWG": (16, 32, 64, 128),
    "KWG": (32,),
    "MDIMC": (8, 16, 32),
    "NDIMC": (8, 16, 32),
    "MDIMA": (8, 16, 32),
    "NDIMB": (8, 16, 32),
    "KWI": (2,),
    "VWM": (1, 2, 4, 8),
    "VWN": (1, 2, 4, 8),
    "STRM": (0,),
    "STRN": (0,),
    "SA": (0, 1),
    "SB": (0, 1),
    "PRECISION": (32,),
}
# The cut scripts/trim_replay.py makes (data/replay/NOTICE)
TRIM_CUT = {"SA": (1,), "SB": (1,), "MDIMC": (16,), "NDIMC": (8,)}
FULL = replay_path()
needs_full = pytest.mark.skipif(
    not FULL.is_file(),
    reason=f"the full RTX 3090 GEMM file {FULL} is absent (benchmark data; set {ENV_DIR} to the folder holding it)")


@pytest.fixture(scope="module")
def table() -> ReplayTable:
    return ReplayTable.load()


def absent_config(table: ReplayTable) -> dict[str, int]:
    keys = list(table.space.params)
    for values in itertools.product(*table.space.params.values()):
        cfg = dict(zip(keys, values))
        if table.key(cfg) not in table._entries:
            return cfg
    raise AssertionError("every Cartesian point is recorded")


# --- the shipped file ----------------------------------------------------------------------------------


def test_shipped_file_is_small_with_its_licence_beside_it():
    p = shipped_path()
    assert p.parent == ROOT / "data" / "replay" == SHIPPED_DIR
    assert p.is_file() and p.stat().st_size < 1024 * 1024
    notice = (p.parent / "NOTICE").read_text()
    for needed in ("MIT License", "Copyright (c) 2025 AutoTuningAssociation", "10.5281/zenodo.15364124",
                   "8eeb99e7179e6838af95d392ac6c60cebfd8c434", p.name, "scripts/trim_replay.py"):
        assert needed in notice
    assert ReplayTable.load().path == p  # the default is the shipped file, not ../shared


def test_benchmark_dir_is_next_to_the_repo(monkeypatch, tmp_path):
    monkeypatch.delenv(ENV_DIR, raising=False)
    assert replay_dir() == ROOT.parent / "shared" / "data" / "replay"
    assert replay_path().name == "gemm_clblast_RTX_3090.json.gz"
    monkeypatch.setenv(ENV_DIR, str(tmp_path))
    assert replay_path() == tmp_path / "gemm_clblast_RTX_3090.json.gz"


def test_header(table):
    assert table.device_name == "NVIDIA GeForce RTX 3090"
    assert table.kernel_name == "Xgemm"
    assert table.problem_size == [4096, 4096]
    assert table.shape_label == "4096x4096"
    assert table.objective == "time"
    assert table.content_hash == hashlib.sha256(shipped_path().read_bytes()).hexdigest()


def test_shipped_space_is_the_readme_space_cut(table):
    assert isinstance(table.space, Space)
    assert table.space.params == {k: TRIM_CUT.get(k, v) for k, v in README_SPACE.items()}
    assert len(table) == 754 and table.failures() == []
    assert sum(1 for _ in table.space.enumerate()) == 754
    assert table.runs_per_config == 32
    assert all(len(r.times) == 32 for r in table.records())


def test_absent_config_is_invalid_with_a_clear_reason(table):
    cfg = absent_config(table)
    why = table.space.check(cfg)
    total = int(np.prod([len(v) for v in table.space.params.values()]))
    assert why is not None and "recorded cache" in why and f"754 of {total:,}" in why
    with pytest.raises(ReplayLookupError) as err:
        table.lookup(cfg)
    assert "no replay record for" in str(err.value) and "recorded cache" in str(err.value)


def test_out_of_space_values_name_the_tunable(table):
    cfg = dict(table.valid_configs()[0], MWG=256)
    assert "MWG=256 is not allowed" in table.check(cfg)
    with pytest.raises(ReplayLookupError, match="MWG=256 is not allowed"):
        table.lookup(cfg)
    with pytest.raises(ReplayLookupError, match="SA=0 is not allowed"):  # cut away by the trim
        table.lookup(dict(table.valid_configs()[0], SA=0))
    with pytest.raises(ReplayLookupError, match="missing PRECISION"):
        table.lookup({k: v for k, v in table.valid_configs()[0].items() if k != "PRECISION"})


def test_lookup_returns_the_recorded_runs(table):
    raw = json.load(gzip.open(shipped_path()))
    assert raw["kregress_trim"]["kept"] == 754 and raw["kregress_trim"]["of"] == 17956
    for key, entry in itertools.islice(raw["cache"].items(), 0, None, 97):
        cfg = dict(zip(raw["tune_params_keys"], map(int, key.split(","))))
        rec = table.lookup(cfg)
        assert rec.ok and rec.error is None and rec.failure is None
        assert rec.config == cfg
        assert rec.times == entry["times"] and len(rec.times) == 32
        assert rec.time == entry["time"]
        assert rec.gflops == entry["GFLOP/s"]
        assert rec.compile_time == entry["compile_time"]


def test_best_and_median(table):
    best = table.best()
    times = sorted(r.time for r in table.records())
    assert best.time == times[0] == pytest.approx(5.657844)  # the optimum of the full file is kept
    assert best.config["MWG"] == 128 and best.config["NWG"] == 128
    med = table.median()
    assert med.time == times[(len(times) - 1) // 2] == pytest.approx(11.418971)
    assert med.time > 2 * best.time  # room to improve from the median baseline


def test_measurements_carry_32_replay_samples(table):
    rec = table.best()
    ms = to_measurements(table, rec)
    assert len(ms) == 1
    m = ms[0]
    assert isinstance(m, Measurement)
    assert m.evidence == "replay"
    assert m.device == "NVIDIA GeForce RTX 3090"
    assert m.shape == "4096x4096"
    assert m.samples_ms == rec.times and len(m.samples_ms) == 32
    assert m.p50_ms == pytest.approx(float(np.median(rec.times)))
    assert m.p20_ms <= m.p50_ms <= m.p80_ms
    # 2 * 4096^3 FLOP at p50, recovered from the recorded GFLOP/s
    assert m.tflops == pytest.approx(2 * 4096**3 / (m.p50_ms / 1e3) / 1e12, rel=1e-3)
    assert m.gbps == 0.0
    assert to_measurements(table, table.lookup(rec.config))[0] == m
    with_bytes = to_measurements(table, rec, bytes_moved=3 * 4096 * 4096 * 4)[0]
    assert with_bytes.gbps == pytest.approx(3 * 4096 * 4096 * 4 / (m.p50_ms / 1e3) / 1e9)


def test_load_is_cached_per_file(table):
    assert ReplayTable.load() is table
    assert ReplayTable.load(shipped_path()) is table


# --- the full file (benchmark data beside the repository) ------------------------------------------------


@needs_full
def test_full_file_matches_the_readme():
    full = ReplayTable.load(FULL)
    assert len(full) == 17956 and full.failures() == []
    assert full.space.params == README_SPACE
    assert np.prod([len(v) for v in full.space.params.values()]) == 82944
    assert full.content_hash.startswith("a829d92217a8fc04")


@needs_full
def test_trim_script_reproduces_the_shipped_file_byte_for_byte(tmp_path):
    import subprocess
    import sys

    out = tmp_path / "t.json.gz"
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "trim_replay.py"), "--source", str(FULL),
                          "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "754 of 17956 configurations" in res.stdout
    assert out.read_bytes() == shipped_path().read_bytes()
    full, cut = ReplayTable.load(FULL), ReplayTable.load(out)
    for rec in cut.records():  # every kept record is the full file's, unchanged
        assert full.lookup(rec.config).times == rec.times


# --- where a cache_file is found ------------------------------------------------------------------------


def test_resolution_order_spec_dir_then_env_then_shipped(tmp_path, monkeypatch):
    spec_dir, env_dir = tmp_path / "specs", tmp_path / "env"
    spec_dir.mkdir()
    env_dir.mkdir()
    monkeypatch.setenv(ENV_DIR, str(env_dir))
    name = shipped_path().name
    assert resolve_cache_file(name, spec_dir) == shipped_path()
    write(env_dir / name, minimal())
    assert resolve_cache_file(name, spec_dir) == env_dir / name
    write(spec_dir / name, minimal())
    assert resolve_cache_file(name, spec_dir) == spec_dir / name
    assert resolve_cache_file(str(env_dir / name), spec_dir) == env_dir / name  # absolute: as given
    (spec_dir / "sub").mkdir()
    write(spec_dir / "sub" / "f.json", minimal(), gz=False)
    assert resolve_cache_file("sub/f.json", spec_dir) == spec_dir / "sub" / "f.json"


def test_missing_cache_file_is_one_line_naming_file_and_env(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_DIR, str(tmp_path))
    with pytest.raises(ReplayError) as err:
        resolve_cache_file("nope.json.gz", tmp_path / "specs")
    msg = str(err.value)
    assert "\n" not in msg and "'nope.json.gz' not found" in msg
    assert ENV_DIR in msg and str(tmp_path) in msg and str(SHIPPED_DIR) in msg
    monkeypatch.delenv(ENV_DIR)
    with pytest.raises(ReplayError, match=f"{ENV_DIR} is unset"):
        resolve_cache_file("nope.json.gz")
    with pytest.raises(ReplayError, match="absolute path"):
        resolve_cache_file(tmp_path / "nope.json.gz")


# --- small files made here --------------------------------------------------------------------------


def write(path: Path, data, gz: bool = True) -> Path:
    blob = json.dumps(data).encode()
    path.write_bytes(gzip.compress(blob) if gz else blob)
    return path


def minimal(cache: dict | None = None) -> dict:
    return {
        "device_name": "Test GPU",
        "kernel_name": "k",
        "problem_size": [64, 64],
        "tune_params_keys": ["A", "B"],
        "tune_params": {"A": [1, 2], "B": [8, 16]},
        "objective": "time",
        "cache": cache
        if cache is not None
        else {
            "1,8": {"A": 1, "B": 8, "time": 2.0, "times": [2.1, 1.9, 2.0], "GFLOP/s": 10.0, "compile_time": 0.5},
            "2,8": {"A": 2, "B": 8, "time": 1.5, "times": [1.5, 1.4, 1.6], "GFLOP/s": 13.3, "compile_time": 0.4},
            "1,16": {"A": 1, "B": 16, "time": "RuntimeFailedConfig", "compile_time": 0.3},
            "2,16": {"A": 2, "B": 16, "time": "CompilationFailedConfig"},
        },
    }


def test_string_times_are_failures(tmp_path):
    t = ReplayTable.load(write(tmp_path / "mini.json.gz", minimal()))
    run = t.lookup({"A": 1, "B": 16})
    assert not run.ok and run.failure == "RuntimeFailedConfig" and run.error == "runtime_error"
    assert run.times == [] and run.time is None and run.compile_time == 0.3
    comp = t.lookup({"A": 2, "B": 16})
    assert comp.failure == "CompilationFailedConfig" and comp.error == "compile_failed"
    assert to_measurements(t, comp) == []
    assert len(t) == 4
    assert t.valid_configs() == [{"A": 1, "B": 8}, {"A": 2, "B": 8}]
    assert len(t.valid_configs(include_failed=True)) == 4
    assert {r.failure for r in t.failures()} == {"RuntimeFailedConfig", "CompilationFailedConfig"}
    assert t.best().config == {"A": 2, "B": 8}
    assert t.space.check({"A": 1, "B": 16}) is None  # recorded, so inside the space; its run failed


def test_plain_json_and_env_dir(tmp_path, monkeypatch):
    write(tmp_path / "gemm_clblast_RTX_3090.json.gz", minimal(), gz=False)
    monkeypatch.setenv("KREGRESS_REPLAY_DIR", str(tmp_path))
    assert replay_dir() == tmp_path
    t = ReplayTable.load(replay_path())
    assert t.device_name == "Test GPU" and len(t) == 4
    assert t.content_hash == hashlib.sha256(replay_path().read_bytes()).hexdigest()


def test_problem_size_may_be_one_integer(tmp_path):
    t = ReplayTable.load(write(tmp_path / "p.json.gz", {**minimal(), "problem_size": 20000000}))
    assert t.problem_size == [20000000] and t.shape_label == "20000000"
    for bad in ([], [0, 4], "64", [1.5]):
        with pytest.raises(ReplayError, match="'problem_size' must be a positive integer or a list"):
            ReplayTable.load(write(tmp_path / f"bad{len(str(bad))}.json.gz", {**minimal(), "problem_size": bad}))


def test_median_and_runs_per_config(tmp_path):
    t = ReplayTable.load(write(tmp_path / "m.json.gz", minimal()))
    assert t.median().config == {"A": 2, "B": 8}  # lower median of the two valid ones (1.5 and 2.0 ms)
    assert t.runs_per_config == 3


def test_rewritten_file_is_reloaded(tmp_path):
    p = write(tmp_path / "mini.json.gz", minimal())
    first = ReplayTable.load(p)
    data = minimal()
    del data["cache"]["2,16"]
    write(p, data)
    os.utime(p, ns=(first_ns := p.stat().st_mtime_ns + 10**9, first_ns))
    second = ReplayTable.load(p)
    assert second is not first and len(second) == 3


@pytest.mark.parametrize("key", [k for k in HEADER_KEYS if k not in DEFAULTED_KEYS])
def test_missing_header_key_names_file_and_key(tmp_path, key):
    """Required keys; the defaulted ones (objective, device_name) are assumed with a note instead."""
    data = minimal()
    del data[key]
    p = write(tmp_path / "bad.json.gz", data)
    with pytest.raises(ReplayError) as err:
        ReplayTable.load(p)
    msg = str(err.value)
    assert str(p) in msg and f"missing key '{key}'" in msg


@pytest.mark.parametrize(
    "blob, match",
    [
        (b"\x1f\x8b\x08\x00garbage", "not a readable Kernel Tuner cache file"),
        (gzip.compress(b'{"device_name": "x", "cache": {', mtime=0), "not a readable Kernel Tuner cache file"),
        (b"[1, 2, 3]", "top level is list"),
        (b"", "not a readable Kernel Tuner cache file"),
    ],
)
def test_corrupt_file_is_a_clear_error(tmp_path, blob, match):
    p = tmp_path / "corrupt.json.gz"
    p.write_bytes(blob)
    with pytest.raises(ReplayError, match=match) as err:
        ReplayTable.load(p)
    assert str(p) in str(err.value)


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda d: d["cache"].update({"1,8,3": {"time": 1.0}}), "has 3 values"),
        (lambda d: d["cache"].update({"4,8": {"time": 1.0}}), "A=4, which 'tune_params' does not list"),
        (lambda d: d["cache"].update({"x,8": {"time": 1.0}}), "not a list of integers"),
        (lambda d: d["cache"].update({"1,8": {"times": [1.0]}}), "not a record with a 'time'"),
        (lambda d: d["tune_params"].pop("B"), "no values for 'B'"),
        (lambda d: d["tune_params"].update({"A": [1.5, 2]}), "list of integers"),
        (lambda d: d.update({"tune_params_keys": []}), "non-empty list"),
        (lambda d: d.update({"device_name": 3}), "'device_name' must be a non-empty string"),
    ],
)
def test_malformed_content_is_a_clear_error(tmp_path, mutate, match):
    data = minimal()
    mutate(data)
    p = write(tmp_path / "bad.json.gz", data)
    with pytest.raises(ReplayError, match=match) as err:
        ReplayTable.load(p)
    assert str(p) in str(err.value)


def test_missing_file(tmp_path):
    with pytest.raises(ReplayError, match="not found.*KREGRESS_REPLAY_DIR") as err:
        ReplayTable.load(tmp_path / "nope.json.gz")
    assert str(tmp_path / "nope.json.gz") in str(err.value)


def test_no_successful_record(tmp_path):
    t = ReplayTable.load(write(tmp_path / "f.json.gz", minimal({"1,8": {"time": "RuntimeFailedConfig"}})))
    assert t.valid_configs() == []
    with pytest.raises(ReplayError, match="no configuration has recorded runs"):
        t.best()
    with pytest.raises(ReplayError, match="no configuration has recorded runs"):
        t.median()
