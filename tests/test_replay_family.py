"""The replay family follows the file the spec names: space, shapes, failures, identity, bad files."""

from __future__ import annotations

import copy
import gzip
import json
import os
from pathlib import Path

import pytest
import yaml

from kernel_assets.cli import main as cli_main
from kregress.core.bind import load_bound
from kregress.core.family import RecordedFamily, get_family
from kregress.core.recorded import ENV_DIR, ReplayTable, replay_dir, shipped_path
from kregress.core.records import Suggestion
from kregress.core.spec import SpecError
from resources.gpu import ReplayBackend

REPO = Path(__file__).resolve().parent.parent
DEFAULT_SPEC = REPO / "specs" / "replay_clblast_rtx3090.yaml"
CONV = replay_dir() / "convolution_milo_A4000.json.gz"


def tiny(cache: dict | None = None, problem_size=(64, 32, 2)) -> dict:
    """A Kernel Tuner cache with other parameter names than the GEMM file, and both failure kinds."""
    return {
        "device_name": "Test GPU", "kernel_name": "tiny", "problem_size": list(problem_size),
        "tune_params_keys": ["block_size_x", "tile"], "tune_params": {"block_size_x": [32, 64, 128], "tile": [1, 2]},
        "objective": "time",
        "cache": cache if cache is not None else {
            "32,1": {"time": 2.0, "times": [2.1, 1.9, 2.0, 2.0]},
            "64,1": {"time": 1.0, "times": [1.0, 1.1, 0.9, 1.0]},
            "64,2": {"time": "RuntimeFailedConfig", "compile_time": 3.0},
            "128,2": {"time": "CompilationFailedConfig"},
        },
    }


def write(path: Path, data: dict) -> Path:
    path.write_bytes(gzip.compress(json.dumps(data).encode()))
    return path


def spec_data(cache_file: str, shape=None, baseline=None) -> dict:
    return {"task_id": "tiny", "kernel_family": "replay", "dtype": "fp32",
            "shape_matrix": [shape or {"x": 64, "y": 32, "z": 2}], "correctness_shapes": [shape or {"x": 64, "y": 32, "z": 2}],
            "baseline": baseline or {"block_size_x": 32, "tile": 1}, "params": {"cache_file": cache_file}}


def write_spec(folder: Path, data: dict, name: str = "tiny.yaml") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(yaml.safe_dump(data, sort_keys=False))
    return folder / name


def sugg(vid: str, config: dict) -> Suggestion:
    return Suggestion(variant_id=vid, config=config, patch_summary="t", round=1)


def test_space_shapes_and_identity_follow_the_named_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path.parent)  # the spec's folder, not the current directory, resolves the name
    (tmp_path / "specs").mkdir()
    write(tmp_path / "specs" / "tiny.json.gz", tiny())
    bound = load_bound(write_spec(tmp_path / "specs", spec_data("tiny.json.gz")))
    spec = bound.spec
    assert spec.params["cache_file"] == str((tmp_path / "specs" / "tiny.json.gz").resolve())
    unbound = get_family("replay")
    fam = unbound.for_params(spec.params)
    assert fam is bound.family and isinstance(fam, RecordedFamily) and fam.name == "replay"
    assert dict(fam.space.params) == {"block_size_x": (32, 64, 128), "tile": (1, 2)}
    assert fam.shape_keys == ("x", "y", "z") and fam.shape_label(spec.shape_matrix[0]) == "64x32x2"
    assert "holds one problem only: {'x': 64, 'y': 32, 'z': 2}" in fam.check_shape({"x": 64, "y": 32, "z": 4})
    # the unbound family is the shipped GEMM file: other names, other shape
    assert "MWG" in unbound.space.params and unbound.check_shape({"x": 4096, "y": 4096}) is None
    assert fam.source_hash() != unbound.source_hash()
    # the identity is the file's content: rewriting the recording changes it
    before = fam.source_hash()
    data = tiny()
    data["cache"]["32,2"] = {"time": 3.0, "times": [3.0, 3.1, 2.9, 3.0]}
    p = write(tmp_path / "specs" / "tiny.json.gz", data)
    os.utime(p, ns=(p.stat().st_mtime_ns + 10**9,) * 2)
    again = get_family("replay").for_params(spec.params)
    assert again.source_hash() != before and len(again.table()) == 5
    assert [f.resolve() for f in again.source_files()] == [(tmp_path / "specs" / "tiny.json.gz").resolve()]


def test_a_spec_for_another_file_is_not_checked_against_the_default(tmp_path):
    write(tmp_path / "tiny.json.gz", tiny())
    spec = load_bound(write_spec(tmp_path, spec_data("tiny.json.gz"))).spec  # used to fail: "missing MWG, NWG, ..."
    assert spec.baseline == {"block_size_x": 32, "tile": 1}
    with pytest.raises(SpecError) as err:
        load_bound(write_spec(tmp_path, spec_data("tiny.json.gz", baseline={"block_size_x": 128, "tile": 1}), "b.yaml"))
    assert "field 'baseline'" in str(err.value) and "recorded cache" in str(err.value)
    with pytest.raises(SpecError) as err:
        load_bound(write_spec(tmp_path, spec_data("tiny.json.gz", shape={"x": 64, "y": 32}), "s.yaml"))
    assert "field 'shape_matrix.0'" in str(err.value) and "x, y, z" in str(err.value)


def test_recorded_failures_are_rows_with_their_error(tmp_path):
    write(tmp_path / "tiny.json.gz", tiny())
    bound = load_bound(write_spec(tmp_path, spec_data("tiny.json.gz")))
    rows, _ = ReplayBackend().evaluate(bound, [  # as the assets bind it
        sugg("ok", {"block_size_x": 64, "tile": 1}), sugg("run", {"block_size_x": 64, "tile": 2}),
        sugg("comp", {"block_size_x": 128, "tile": 2}), sugg("absent", {"block_size_x": 128, "tile": 1})],
        log=lambda m: None)
    by = {r.variant_id: r for r in rows}
    assert by["ok"].error is None and by["ok"].evidence == "replay"
    assert by["ok"].measurements[0].samples_ms == [1.0, 1.1, 0.9, 1.0]
    assert by["ok"].measurements[0].device == "Test GPU" and by["ok"].measurements[0].shape == "64x32x2"
    assert by["run"].error == "runtime_error" and "RuntimeFailedConfig" in by["run"].error_detail
    assert by["comp"].error == "compile_failed" and "CompilationFailedConfig" in by["comp"].error_detail
    assert by["absent"].error == "invalid_config" and "recorded cache" in by["absent"].error_detail
    assert not by["run"].measurements and not by["comp"].measurements


@pytest.mark.skipif(not CONV.is_file(), reason=f"{CONV} is absent (benchmark data; set {ENV_DIR} to the folder holding it)")
def test_every_recorded_failure_of_a_real_file_comes_back_with_its_error(tmp_path):
    from kernel_assets.cli_replay import import_file

    bound = load_bound(import_file(CONV, tmp_path / "conv.yaml"))
    table = ReplayTable.load(CONV)
    failures = table.failures()
    assert len(failures) == 161
    rows, _ = ReplayBackend().evaluate(bound, [sugg(f"f{i}", r.config) for i, r in enumerate(failures)], log=lambda m: None)
    want = {"RuntimeFailedConfig": "runtime_error", "CompilationFailedConfig": "compile_failed"}
    assert [r.error for r in rows] == [want[f.failure] for f in failures]
    assert sum(r.error == "compile_failed" for r in rows) == 6 and sum(r.error == "runtime_error" for r in rows) == 155


def test_missing_or_corrupt_file_is_one_line_in_validate(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(ENV_DIR, str(tmp_path / "empty"))
    missing = write_spec(tmp_path, spec_data("nope.json.gz"), "missing.yaml")
    (tmp_path / "bad.json.gz").write_bytes(b"\x1f\x8b\x08\x00garbage")
    corrupt = write_spec(tmp_path, spec_data("bad.json.gz"), "corrupt.yaml")
    assert cli_main(["specs", "validate", str(missing), str(corrupt), str(DEFAULT_SPEC)]) == 2
    out = capsys.readouterr()
    lines = out.err.strip().splitlines()
    assert len(lines) == 2 and "Traceback" not in out.err
    assert "missing.yaml: field 'params'" in lines[0] and "'nope.json.gz' not found" in lines[0]
    assert ENV_DIR in lines[0] and str(tmp_path / "empty") in lines[0]
    assert "corrupt.yaml: field 'params'" in lines[1] and "not a readable Kernel Tuner cache file" in lines[1]
    assert f"{DEFAULT_SPEC}: ok" in out.out  # the default spec uses the shipped file, whatever the env says


def test_missing_file_in_a_sweep_is_one_line(tmp_path, monkeypatch, capsys, dagster_home):
    monkeypatch.setenv(ENV_DIR, str(tmp_path / "empty"))
    spec = write_spec(tmp_path, spec_data("nope.json.gz"))
    assert cli_main(["sweep", str(spec)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "'nope.json.gz' not found" in err and ENV_DIR in err


def test_params_are_checked(tmp_path):
    fam = get_family("replay")
    assert "unknown param(s) file" in fam.check_params({"file": "x"})
    assert "must be a file name or path" in fam.check_params({"cache_file": 3})
    assert fam.check_params({}) is None and fam.for_params({}).table().path == shipped_path()
    data = copy.deepcopy(spec_data(shipped_path().name, {"x": 4096, "y": 4096}, ReplayTable.load().median().config))
    assert load_bound(write_spec(tmp_path, data)).spec.params["cache_file"] == shipped_path().name  # found in data/replay


def test_conformance_kit_passes_on_the_default_spec_and_another_file(tmp_path):
    from kernel_assets.conformance import run_checks

    write(tmp_path / "tiny.json.gz", tiny())
    for spec in (DEFAULT_SPEC, write_spec(tmp_path, spec_data("tiny.json.gz"))):
        checks = run_checks("replay", spec)
        assert [c.status for c in checks if c.status not in ("PASS", "SKIP")] == [], [(c.name, c.detail) for c in checks]
        space = next(c for c in checks if c.name == "space")
        assert ("754" if spec == DEFAULT_SPEC else "4 valid") in space.detail
