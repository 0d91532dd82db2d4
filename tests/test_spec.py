"""Spec validation: every bad spec gives one clear message (file, field, value, allowed); nothing runs."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kernel_assets.cli import main as cli_main
from kregress.core.spec import SpecError, load_spec

REPO = Path(__file__).resolve().parent.parent
SMOKE = yaml.safe_load((REPO / "specs" / "gemm_smoke.yaml").read_text())


def write(tmp_path: Path, data: dict, name: str = "bad.yaml") -> Path:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(data))
    return p


def test_shipped_specs_validate():
    for p in sorted((REPO / "specs").glob("*.yaml")):
        spec = load_spec(p)
        assert spec.task_id and spec.shape_matrix and spec.correctness_shapes


def test_default_spec_is_realistic():
    spec = load_spec(REPO / "specs" / "gemm_h100_bf16.yaml")
    shapes = {(s["M"], s["N"], s["K"]) for s in spec.shape_matrix}
    assert {(4096, 4096, 4096), (8192, 8192, 4096)} <= shapes
    assert {"M": 257, "N": 193, "K": 131} in spec.correctness_shapes
    assert spec.hardware.arch == "sm_90" and spec.constraints.numeric_tolerance == 1e-2


@pytest.mark.parametrize(
    "mutate, field, value, allowed",
    [
        (lambda d: d.update(colour="blue"), "colour", '"blue"', "allowed keys here"),
        (lambda d: d["search"].update(variants_per_round="eight"), "search.variants_per_round", '"eight"', "integer"),
        (lambda d: d.update(kernel_family="conv3d"), "kernel_family", '"conv3d"', "allowed: attention"),
        (lambda d: d["baseline"].update(BLOCK_M=48), "baseline", "BLOCK_M", "allowed: 16, 32, 64, 128, 256"),
        (lambda d: d.update(shape_matrix=[]), "shape_matrix", "[]", "at least 1"),
        (lambda d: d["search"].update(strategy="greedy"), "search.strategy", '"greedy"', "'local', 'llm' or 'hybrid'"),
        (lambda d: d["search"].update(extra_knob=1), "search.extra_knob", "1", "strategy"),
        (lambda d: d.update(correctness_shapes=[{"M": 4, "N": 4}]), "correctness_shapes", "K", "shape keys must be exactly M, N, K"),
    ],
)
def test_bad_spec_messages(tmp_path, mutate, field, value, allowed):
    import copy

    data = copy.deepcopy(SMOKE)
    mutate(data)
    path = write(tmp_path, data)
    with pytest.raises(SpecError) as exc:
        load_spec(path)
    msg = str(exc.value)
    assert str(path) in msg, msg
    assert f"field '{field}" in msg, msg
    assert value in msg, msg
    if allowed == "allowed: attention":
        assert "allowed:" in msg and "gemm" in msg, msg
    else:
        assert allowed in msg, msg


def test_baseline_rule_violation_names_the_rule(tmp_path):
    import copy

    data = copy.deepcopy(SMOKE)
    data["baseline"].update(BLOCK_M=256, BLOCK_N=256)  # accumulator too large for registers
    with pytest.raises(SpecError, match="tile_not_huge"):
        load_spec(write(tmp_path, data))


def test_not_a_mapping_and_missing_file(tmp_path):
    p = tmp_path / "list.yaml"
    p.write_text("- 1\n- 2\n")
    with pytest.raises(SpecError, match="YAML mapping"):
        load_spec(p)
    with pytest.raises(SpecError, match="no such spec file"):
        load_spec(tmp_path / "nope.yaml")


def test_cli_validate_exit_codes(tmp_path, capsys):
    import copy

    good = REPO / "specs" / "gemm_smoke.yaml"
    assert cli_main(["specs", "validate", str(good)]) == 0
    data = copy.deepcopy(SMOKE)
    data["dtype"] = "fp8"
    bad = write(tmp_path, data)
    assert cli_main(["specs", "validate", str(good), str(bad)]) == 1
    err = capsys.readouterr().err
    assert "field 'dtype'" in err and "'fp16', 'bf16' or 'fp32'" in err


def test_sweep_refuses_bad_spec_and_runs_nothing(tmp_path, dagster_home, capsys):
    import copy

    data = copy.deepcopy(SMOKE)
    data["search"]["max_rounds"] = 99
    bad = write(tmp_path, data)
    assert cli_main(["sweep", str(bad)]) == 2
    assert "search.max_rounds" in capsys.readouterr().err
    assert not (dagster_home / "storage").exists() and not (dagster_home / "reports").exists()


def test_content_hash_changes_with_content(tmp_path):
    import copy

    a = load_spec(write(tmp_path, SMOKE, "a.yaml"))
    data = copy.deepcopy(SMOKE)
    data["search"]["seed"] = 7
    b = load_spec(write(tmp_path, data, "b.yaml"))
    assert a.content_hash() != b.content_hash()
    assert a.content_hash() == load_spec(write(tmp_path, SMOKE, "c.yaml")).content_hash()
