"""kernels/replay.py: the recorded RTX 3090 GEMM space served from ../shared, and bad files."""

from __future__ import annotations

import gzip
import itertools
import json
import os
from pathlib import Path

import numpy as np
import pytest

from kregress.core.records import Measurement
from kregress.core.family import Space
from kregress.core.recorded import (
    HEADER_KEYS,
    ReplayError,
    ReplayLookupError,
    ReplayTable,
    measure,
    replay_dir,
    replay_path,
    to_measurements,
)

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


# --- the real file ----------------------------------------------------------------------------------


def test_default_path_is_next_to_the_repo_not_inside(monkeypatch):
    monkeypatch.delenv("KREGRESS_REPLAY_DIR", raising=False)
    assert replay_dir() == ROOT.parent / "shared" / "data" / "replay"
    assert replay_path().name == "gemm_clblast_RTX_3090.json.gz"
    copied = []
    for _here, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in (".venv", ".git", "node_modules")]
        copied += [f for f in files if f.endswith(".json.gz")]
    assert not copied, "replay files are read from ../shared, never copied in"


def test_header(table):
    assert table.device_name == "NVIDIA GeForce RTX 3090"
    assert table.kernel_name == "Xgemm"
    assert table.problem_size == [4096, 4096]
    assert table.shape_label == "4096x4096"
    assert table.objective == "time"


def test_all_recorded_configs_are_valid(table):
    assert len(table) == 17956
    assert table.failures() == []  # this file records no failed configuration
    valid = table.valid_configs()
    assert len(valid) == 17956
    assert len({table.key(c) for c in valid}) == 17956
    assert all(table.space.check(c) is None for c in valid[:500])


def test_space_matches_the_readme(table):
    assert isinstance(table.space, Space)
    assert table.space.params == README_SPACE
    assert np.prod([len(v) for v in table.space.params.values()]) == 82944
    assert len(table.space.rules) == 1
    assert sum(1 for _ in table.space.enumerate()) == 17956


def test_absent_config_is_invalid_with_a_clear_reason(table):
    cfg = absent_config(table)
    why = table.space.check(cfg)
    assert why is not None and "recorded cache" in why and "17,956 of 82,944" in why
    with pytest.raises(ReplayLookupError) as err:
        table.lookup(cfg)
    assert "no replay record for" in str(err.value) and "recorded cache" in str(err.value)


def test_out_of_space_values_name_the_tunable(table):
    cfg = dict(table.valid_configs()[0], MWG=256)
    assert "MWG=256 is not allowed" in table.check(cfg)
    with pytest.raises(ReplayLookupError, match="MWG=256 is not allowed"):
        table.lookup(cfg)
    with pytest.raises(ReplayLookupError, match="missing PRECISION"):
        table.lookup({k: v for k, v in table.valid_configs()[0].items() if k != "PRECISION"})


def test_lookup_returns_the_recorded_runs(table):
    raw = json.load(gzip.open(replay_path()))
    key, entry = next(iter(raw["cache"].items()))
    cfg = dict(zip(raw["tune_params_keys"], map(int, key.split(","))))
    rec = table.lookup(cfg)
    assert rec.ok and rec.error is None and rec.failure is None
    assert rec.config == cfg
    assert rec.times == entry["times"] and len(rec.times) == 32
    assert rec.time == entry["time"]
    assert rec.gflops == entry["GFLOP/s"]
    assert rec.compile_time == entry["compile_time"]


def test_best_is_the_fastest_recorded(table):
    best = table.best()
    assert best.time == min(r.time for r in table.records())
    assert best.time == pytest.approx(5.657844)
    assert best.config["MWG"] == 128 and best.config["NWG"] == 128


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
    # 2 * 4096^3 FLOP at p50
    assert m.tflops == pytest.approx(2 * 4096**3 / (m.p50_ms / 1e3) / 1e12, rel=1e-3)
    assert m.gbps == 0.0
    assert measure(table, rec.config)[0] == m
    with_bytes = to_measurements(table, rec, bytes_moved=3 * 4096 * 4096 * 4)[0]
    assert with_bytes.gbps == pytest.approx(3 * 4096 * 4096 * 4 / (m.p50_ms / 1e3) / 1e9)


def test_load_is_cached_per_file(table):
    assert ReplayTable.load() is table
    assert ReplayTable.load(replay_path()) is table


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
    t = ReplayTable.load()
    assert t.device_name == "Test GPU" and len(t) == 4


def test_rewritten_file_is_reloaded(tmp_path):
    p = write(tmp_path / "mini.json.gz", minimal())
    first = ReplayTable.load(p)
    data = minimal()
    del data["cache"]["2,16"]
    write(p, data)
    os.utime(p, ns=(first_ns := p.stat().st_mtime_ns + 10**9, first_ns))
    second = ReplayTable.load(p)
    assert second is not first and len(second) == 3


@pytest.mark.parametrize("key", HEADER_KEYS)
def test_missing_header_key_names_file_and_key(tmp_path, key):
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
        (gzip.compress(b'{"device_name": "x", "cache": {'), "not a readable Kernel Tuner cache file"),
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


def test_missing_file(tmp_path, monkeypatch):
    with pytest.raises(ReplayError, match="not found"):
        ReplayTable.load(tmp_path / "nope.json.gz")
    monkeypatch.setenv("KREGRESS_REPLAY_DIR", str(tmp_path))
    with pytest.raises(ReplayError, match="KREGRESS_REPLAY_DIR"):
        ReplayTable.load()


def test_no_successful_record(tmp_path):
    t = ReplayTable.load(write(tmp_path / "f.json.gz", minimal({"1,8": {"time": "RuntimeFailedConfig"}})))
    assert t.valid_configs() == []
    with pytest.raises(ReplayError, match="no configuration has recorded runs"):
        t.best()
