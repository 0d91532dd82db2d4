"""`kregress replay import FILE`: a valid spec for any Kernel Tuner cache file, then a sweep on it.

The shipped file is never skipped; the four benchmark files of ../shared/data/replay/ (or
$KREGRESS_REPLAY_DIR) are each imported and swept end to end, skipped with a reason when absent."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from kernel_assets.cli import main
from kernel_assets.cli_replay import import_file, task_id_for
from kregress.core.bind import load_bound
from kregress.core.recorded import ENV_DIR, ReplayTable, replay_dir, shipped_path
from kregress.core.spec import load_spec

# From shared/data/replay/README.md: file -> (configs, failures, runs per valid config, device)
SHARED = {
    "gemm_clblast_RTX_3090.json.gz": (17956, 0, 32, "NVIDIA GeForce RTX 3090"),
    "convolution_milo_A4000.json.gz": (4362, 161, 32, "NVIDIA RTX A4000"),
    "dedispersion_milo_A4000.json.gz": (11130, 0, 32, "NVIDIA RTX A4000"),
    "pnpoly_RTX_3090.json.gz": (4092, 330, 10, "NVIDIA GeForce RTX 3090"),
}


def shared(name: str):
    p = replay_dir() / name
    return pytest.param(p, marks=pytest.mark.skipif(
        not p.is_file(), reason=f"benchmark file {p} is absent (set {ENV_DIR} to the folder holding it)"), id=name)


def test_import_the_shipped_file(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["replay", "import", str(shipped_path())]) == 0
    out = tmp_path / "specs" / "gemm_clblast_rtx_3090_trimmed.yaml"
    assert f"wrote {Path('specs') / out.name}" in capsys.readouterr().out
    text = out.read_text()
    data = yaml.safe_load(text)
    table = ReplayTable.load(shipped_path())
    assert data["task_id"] == "gemm_clblast_rtx_3090_trimmed" == task_id_for(shipped_path())
    assert data["kernel_family"] == "replay" and data["params"] == {"cache_file": shipped_path().name}
    assert data["baseline"] == table.median().config
    assert data["shape_matrix"] == data["correctness_shapes"] == [{"x": 4096, "y": 4096}]
    assert data["hardware"]["device"] == "NVIDIA GeForce RTX 3090" and data["hardware"]["arch"] == "sm_86"
    assert "median recorded time among the 754 valid ones" in data["description"]
    assert "# Baseline: the configuration of median recorded time" in text and "&id" not in text
    assert main(["specs", "validate", str(out)]) == 0
    assert main(["replay", "import", str(shipped_path())]) == 2  # never overwrites without --force
    assert "exists; pass --force" in capsys.readouterr().err
    assert main(["replay", "import", str(shipped_path()), "--force", "--task-id", "mine"]) == 0


@pytest.mark.parametrize("edit, assumed", [
    (lambda d: d.pop("objective"), "the objective is taken to be time"),  # older Kernel Tuner: no objective key
    (lambda d: d.update(device_name=""), "recorded as 'unknown GPU'"),  # a file that names no device
], ids=["no-objective", "empty-device-name"])
def test_import_assumes_what_older_files_leave_out_and_says_so(tmp_path, monkeypatch, capsys, edit, assumed):
    data = json.loads(gzip.decompress(shipped_path().read_bytes()))
    edit(data)
    src = tmp_path / "old_cache.json"
    src.write_text(json.dumps(data))
    monkeypatch.chdir(tmp_path)
    assert main(["replay", "import", str(src), "--out", "specs/old.yaml"]) == 0
    out = capsys.readouterr().out
    assert "note: " in out and assumed in out  # the assumption is printed ...
    text = (tmp_path / "specs" / "old.yaml").read_text()
    assert "# Assumed: " in text and assumed in text  # ... and kept in the spec's header
    spec = load_spec(tmp_path / "specs" / "old.yaml")
    assert main(["specs", "validate", str(tmp_path / "specs" / "old.yaml")]) == 0
    table = ReplayTable.load(src)
    assert table.objective == "time" and table.device_name
    assert spec.hardware.device == table.device_name


def test_imported_spec_limits_are_the_recorded_devices(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = load_spec(import_file(shipped_path(), "specs/s.yaml"))
    assert spec.hardware.device == "NVIDIA GeForce RTX 3090"
    assert spec.constraints.max_shared_memory_bytes == spec.hardware.limits.max_shared_memory_per_block == 101376
    shipped = load_spec(Path(__file__).resolve().parent.parent / "specs" / "replay_clblast_rtx3090.yaml")
    assert shipped.constraints.max_shared_memory_bytes == 101376  # not an H100's 232448


def test_cache_file_is_relative_to_the_spec_when_beside_it(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_DIR, str(tmp_path / "empty"))
    data = json.loads(gzip.decompress(shipped_path().read_bytes()))
    (tmp_path / "proj" / "data").mkdir(parents=True)
    src = tmp_path / "proj" / "data" / "Mine v2.json"
    src.write_text(json.dumps(data))
    spec = import_file(src, tmp_path / "proj" / "mine.yaml")
    assert yaml.safe_load(spec.read_text())["params"]["cache_file"] == "data/Mine v2.json"
    assert yaml.safe_load(spec.read_text())["task_id"] == "mine_v2"
    monkeypatch.chdir(tmp_path)
    assert load_spec(spec).params["cache_file"] == "data/Mine v2.json"  # the schema keeps the text
    assert load_bound(spec).spec.params["cache_file"] == str(src.resolve())  # the binding resolves it
    far = import_file(src, tmp_path / "elsewhere" / "mine.yaml")
    assert yaml.safe_load(far.read_text())["params"]["cache_file"] == str(src.resolve())


def test_import_of_a_bad_file_is_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.json.gz"
    bad.write_bytes(b"\x1f\x8b\x08\x00garbage")
    assert main(["replay", "import", str(bad), "--out", str(tmp_path / "x.yaml")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and str(bad) in err and "not a readable Kernel Tuner cache file" in err
    assert not (tmp_path / "x.yaml").exists()
    assert main(["replay", "import", str(tmp_path / "nope.json.gz"), "--out", str(tmp_path / "x.yaml")]) == 2
    assert "not found" in capsys.readouterr().err


@pytest.mark.parametrize("path", [shared(n) for n in SHARED])
def test_each_benchmark_file_imports_and_sweeps(path: Path, tmp_path, dagster_home, capsys):
    configs, failures, runs, device = SHARED[path.name]
    table = ReplayTable.load(path)
    assert (len(table), len(table.failures()), table.runs_per_config) == (configs, failures, runs)
    spec_file = import_file(path, tmp_path / "specs" / f"{task_id_for(path)}.yaml")
    assert main(["specs", "validate", str(spec_file)]) == 0
    spec = load_spec(spec_file)
    assert spec.baseline == table.median().config and spec.hardware.device == device
    assert list(spec.shape_matrix[0].values()) == table.problem_size
    assert main(["sweep", str(spec_file)]) == 0
    out = dagster_home / "reports" / spec.task_id
    v = pd.read_parquet(out / "verdicts.parquet")
    assert set(v["evidence"].dropna()) == {"replay"}
    assert {"PASS", "REGRESS"} <= set(v["verdict"])  # measured verdicts both ways from the median baseline
    m = pd.read_parquet(out / "measurements.parquet")
    assert set(m["device"]) == {device} and (m["samples"] == runs).all()
    assert set(m["shape"]) == {table.shape_label}
    variants = pd.read_parquet(out / "variants.parquet")
    assert variants.iloc[0]["variant_id"] == "baseline"
    assert v["latency_p50_ms"].min() < variants.iloc[0]["latency_p50_ms"]  # the search improved on the median
