"""Spec validation: every bad spec gives one clear message (file, field, value, allowed); nothing runs."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kernel_assets.cli import main as cli_main
from kregress.core.bind import load_bound
from kregress.core.spec import SpecError
from kregress.core.spec import load_spec as load_schema


def load_spec(path):
    """What `kregress specs validate` checks: the schema and the family's checks, one pass."""
    return load_bound(path).spec

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
        assert "built in:" in msg and "gemm" in msg, msg
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
    data["dtype"] = "fp64"
    bad = write(tmp_path, data)
    assert cli_main(["specs", "validate", str(good), str(bad)]) == 2
    err = capsys.readouterr().err
    assert "field 'dtype'" in err and "'fp16', 'bf16', 'fp32'" in err


def test_sweep_refuses_bad_spec_and_runs_nothing(tmp_path, dagster_home, capsys):
    import copy

    data = copy.deepcopy(SMOKE)
    data["search"]["max_rounds"] = 99
    bad = write(tmp_path, data)
    assert cli_main(["sweep", str(bad)]) == 2
    assert "search.max_rounds" in capsys.readouterr().err
    assert not (dagster_home / "storage").exists() and not (dagster_home / "reports").exists()


def test_bad_spec_exits_2_from_validate_and_sweep_as_documented(tmp_path, dagster_home, capsys):
    """One exit code for a bad spec wherever a spec is read, and the help says which."""
    from kernel_assets.cli import EXIT_BAD_SPEC, build_parser

    text = (REPO / "specs" / "gemm_smoke.yaml").read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("variants_per_round: 3", "variants_per_round: eight"))  # unquoted in the YAML
    assert "variants_per_round: eight" in bad.read_text()
    assert cli_main(["specs", "validate", str(bad)]) == EXIT_BAD_SPEC == 2
    err = capsys.readouterr().err
    assert "field 'search.variants_per_round': value \"eight\"" in err
    assert "a word is not a number" in err and "remove the quotes" not in err  # it was never quoted
    assert cli_main(["sweep", str(bad)]) == 2
    assert "a word is not a number" in capsys.readouterr().err
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices
    assert "2 the spec is invalid" in sub["sweep"].epilog
    validate = next(a for a in sub["specs"]._actions if a.dest == "specs_command").choices["validate"]
    assert "2 at least one is not" in validate.epilog


def test_max_rounds_bound_says_why(tmp_path):
    import copy

    data = copy.deepcopy(SMOKE)
    data["search"]["max_rounds"] = 9
    with pytest.raises(SpecError) as exc:
        load_spec(write(tmp_path, data))
    line = str(exc.value)
    assert "field 'search.max_rounds': value 9" in line and "<= 4" in line
    assert "the asset graph has 4 rounds" in line and "MAX_GRAPH_ROUNDS" in line


def test_content_hash_changes_with_content(tmp_path):
    import copy

    a = load_spec(write(tmp_path, SMOKE, "a.yaml"))
    data = copy.deepcopy(SMOKE)
    data["search"]["seed"] = 7
    b = load_spec(write(tmp_path, data, "b.yaml"))
    assert a.content_hash() != b.content_hash()
    assert a.content_hash() == load_spec(write(tmp_path, SMOKE, "c.yaml")).content_hash()


# --- strict specs: at least 40 malformed specs, each reported with its field ---------


def _set(path: str, value):
    """Mutation setting a dotted path (creating mappings on the way; digits index lists)."""
    def mutate(d):
        cur = d
        parts = path.split(".")
        for part in parts[:-1]:
            cur = cur[int(part)] if part.isdigit() else cur.setdefault(part, {})
        last = parts[-1]
        if last.isdigit():
            cur[int(last)] = value
        else:
            cur[last] = value
    return mutate


MALFORMED = [
    # no coercion: a bool is not an int, a quoted number is not a number, a decimal is not a count
    ("search.variants_per_round", True, "a boolean is not a number"),
    ("search.variants_per_round", "3", "remove the quotes"),
    ("search.variants_per_round", "eight", "a word is not a number: write the number in digits"),
    ("search.variants_per_round", 2.5, "whole number"),
    ("search.max_rounds", False, "a boolean is not a number"),
    ("search.seed", "1", "remove the quotes"),
    ("baseline.BLOCK_M", "128", "remove the quotes"),
    ("baseline.num_warps", True, "a boolean is not a number"),
    ("constraints.numeric_tolerance", "0.01", "remove the quotes"),
    ("constraints.max_spill_bytes", True, "a boolean is not a number"),
    ("benchmark.timeout_s", "120", "remove the quotes"),
    ("hardware.limits.sm_count", "132", "remove the quotes"),
    ("regression_guard.min_samples", True, "a boolean is not a number"),
    ("budget.max_total_tokens", "100000", "remove the quotes"),
    ("task_id", 7, "needs text"),
    ("hardware.device", True, "needs text"),
    # bounds, with the reason
    ("shape_matrix.0.M", 10**12, "2^24"),
    ("correctness_shapes.0.K", 2**25, "2^24"),
    ("shape_matrix.0", {"M": 2**20, "N": 2**20, "K": 2**20}, "product"),
    ("budget.max_total_tokens", 10**30, "typo"),
    ("budget.max_input_tokens_per_round", 10**10, "1,000,000,000"),
    ("budget.max_output_tokens_per_round", -1, ">= 0"),
    ("search.variants_per_round", 0, ">= 1"),
    ("search.variants_per_round", 1000, "<= 64"),
    ("search.max_rounds", 99, "<= 4"),
    ("search.max_rounds", 9, "the asset graph has 4 rounds"),
    ("search.no_improve_rounds", 50, "<= 4"),
    ("search.top_k", 0, ">= 1"),
    ("search.seed", -1, ">= 0"),
    ("search.min_improvement", 5.0, "<= 1"),
    ("regression_guard.confidence", 1.5, "< 1"),
    ("regression_guard.not_worse_than_baseline_ratio", 0.5, ">= 1"),
    ("regression_guard.min_samples", 2, ">= 3"),
    ("constraints.numeric_tolerance", 0, "> 0"),
    ("constraints.max_registers_per_thread", 100000, "<= 1024"),
    ("benchmark.timeout_s", 10**7, "<= 86400"),
    ("benchmark.rep_ms", 0, "> 0"),
    ("hardware.limits.sm_count", 0, "> 0"),
    ("hardware.limits.peak_tflops", -3.0, "> 0"),
    # the known architectures only, with a suggestion
    ("hardware.arch", "sm_900", "did you mean 'sm_90'"),
    ("hardware.arch", "sm90", "did you mean 'sm_90'"),
    ("hardware.arch", "ampere", "sm_80"),
    # values from a closed list, with "did you mean"
    ("dtype", "fp64", "'fp16', 'bf16', 'fp32'"),
    ("dtype", "bf61", "did you mean 'bf16'"),
    ("search.strategy", "hybird", "did you mean 'hybrid'"),
    ("objective.aggregate", "geomaen", "did you mean 'geomean'"),
    ("benchmark.backend", "cdua", "did you mean 'cuda'"),
    ("kernel_family", "gem", "did you mean 'gemm'"),
    # unknown keys, with "did you mean"
    ("kernel_famly", "gemm", "did you mean 'kernel_family'"),
    ("search.varients_per_round", 3, "did you mean 'variants_per_round'"),
    ("budget.max_total_token", 10, "did you mean 'max_total_tokens'"),
    ("hardware.limits.sm_cout", 10, "did you mean 'sm_count'"),
    ("baseline.BLOCKM", 64, "did you mean 'BLOCK_M'"),
    # family checks
    ("baseline.BLOCK_M", 48, "allowed: 16, 32, 64, 128, 256"),
    ("shape_matrix.0", {"M": 0, "N": 4, "K": 4}, "positive integer"),
    ("correctness_shapes.0", {"M": 4, "N": 4}, "shape keys must be exactly M, N, K"),
    ("params", {"cache_file": "x.json"}, "takes no params"),
    ("task_id", "Has Spaces", "allowed: text matching"),
]


@pytest.mark.parametrize("field, value, fragment", MALFORMED, ids=[f"{f}={v!r}"[:60] for f, v, _ in MALFORMED])
def test_malformed_specs_name_the_field(tmp_path, field, value, fragment):
    import copy

    assert len(MALFORMED) >= 40
    data = copy.deepcopy(SMOKE)
    _set(field, value)(data)
    path = write(tmp_path, data)
    with pytest.raises(SpecError) as exc:
        load_spec(path)
    msg = str(exc.value)
    reported = field if not field.startswith("baseline.") or fragment.startswith(("remove", "a boolean")) else "baseline"
    line = next((ln for ln in msg.splitlines() if f"field '{reported}" in ln), None)
    assert line is not None, msg
    assert line.startswith(f"{path}: "), msg
    assert fragment in line, msg
    assert "Traceback" not in msg


def test_duplicate_yaml_key_is_refused(tmp_path):
    text = (REPO / "specs" / "gemm_smoke.yaml").read_text().replace("dtype: fp16", "dtype: bf16\ndtype: fp16")
    p = tmp_path / "dup.yaml"
    p.write_text(text)
    with pytest.raises(SpecError, match=r"key 'dtype' appears twice in one mapping \(lines 5 and 6\)"):
        load_spec(p)
    nested = (REPO / "specs" / "gemm_smoke.yaml").read_text().replace("  seed: 1", "  seed: 1\n  seed: 2")
    p.write_text(nested)
    with pytest.raises(SpecError, match="'seed' appears twice"):
        load_spec(p)


def test_every_problem_in_one_pass(tmp_path):
    """Schema errors and family checks together: a bad baseline shows beside a bad strategy and dtype."""
    import copy

    data = copy.deepcopy(SMOKE)
    data["search"]["strategy"] = "greedy"
    data["search"]["variants_per_round"] = True
    data["baseline"]["BLOCK_M"] = 48
    data["shape_matrix"][0]["M"] = 10**12
    data["hardware"] = {"arch": "sm_900"}
    data["colour"] = "blue"
    with pytest.raises(SpecError) as exc:
        load_spec(write(tmp_path, data))
    lines = str(exc.value).splitlines()
    fields = {ln.split("field '")[1].split("'")[0] for ln in lines}
    assert fields == {"search.strategy", "search.variants_per_round", "baseline", "shape_matrix.0.M",
                      "hardware.arch", "colour"}, lines


def test_family_check_that_raises_is_one_line(tmp_path, monkeypatch, capsys):
    """A family whose check raises (e.g. the recorded data folder is missing) is a line, not a traceback."""
    import copy

    from kregress.core.family import get_family

    fam = get_family("gemm")

    def boom(shape):
        raise FileNotFoundError("/nowhere/replay: no such directory")

    monkeypatch.setattr(type(fam), "check_shape", lambda self, shape: boom(shape))
    path = write(tmp_path, copy.deepcopy(SMOKE))
    with pytest.raises(SpecError, match=r"field 'shape_matrix.0'.*could not be checked: FileNotFoundError"):
        load_spec(path)
    assert cli_main(["specs", "validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "could not be checked" in err


def test_validate_never_tracebacks_on_unexpected_errors(tmp_path, monkeypatch, capsys):
    import kregress.core.bind as bind_mod

    def explode(path):
        raise RuntimeError("something internal")

    monkeypatch.setattr(bind_mod, "load_bound", explode)
    good = REPO / "specs" / "gemm_smoke.yaml"
    assert cli_main(["specs", "validate", str(good)]) == 2
    err = capsys.readouterr().err
    assert err.strip() == f"{good}: could not be validated: RuntimeError: something internal"


def test_binary_and_non_utf8_files(tmp_path):
    p = tmp_path / "bin.yaml"
    p.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(SpecError, match="cannot read the file|not valid YAML"):
        load_spec(p)


def test_schema_only_load_imports_no_family_torch_or_triton():
    """Loading and schema-checking every shipped spec with core alone imports neither torch nor Triton
    (nor Dagster, nor any kernels module); the family's checks run when the spec is bound."""
    import subprocess
    import sys

    code = ("import sys, glob; from kregress.core.spec import load_spec\n"
            "specs = [load_spec(f) for f in sorted(glob.glob('specs/*.yaml'))]\n"
            "assert len(specs) >= 10, len(specs)\n"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'triton', 'dagster', 'kernels'))\n"
            "print(','.join(bad) or 'none')")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "none", out.stdout


def test_schema_load_defers_family_checks_to_bind(tmp_path):
    import copy

    from kregress.core.bind import bind

    data = copy.deepcopy(SMOKE)
    data["kernel_family"] = "conv3d"
    spec = load_schema(write(tmp_path, data))  # the schema is fine: which families exist is bind's question
    assert spec.kernel_family == "conv3d" and spec.source == (tmp_path / "bad.yaml").resolve()
    with pytest.raises(SpecError, match=r"bad.yaml: field 'kernel_family'.*unknown kernel family 'conv3d'"):
        bind(spec)
