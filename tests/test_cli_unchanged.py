"""`kregress sweep` of a spec unchanged since its last successful sweep answers from that sweep's record
(run id, report path, verdict line) and runs nothing; anything that could change the outcome (the spec's
content, the kernels, the project's code, the backend or strategy overrides, the model) makes it run.
The records here are what a real sweep writes (cli._record_sweep with cli.sweep_fingerprint)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kernel_assets import cli
from kregress.core.spec import load_spec

REPO = Path(__file__).resolve().parent.parent


def _args(spec_file: Path, home: Path, **kw) -> argparse.Namespace:
    base = dict(spec=str(spec_file), dagster_home=str(home), env=None, backend=None, strategy=None, force=False,
                budget_overshoot="fail")
    return argparse.Namespace(**{**base, **kw})


def _family_files() -> dict[str, str]:
    from kregress.core.family import get_family

    return {str(f): cli._file_sha(f) for f in get_family("gemm").source_files()}


@pytest.fixture
def recorded(tmp_path, monkeypatch):
    monkeypatch.delenv("TAOTOKEN_MODEL_ID", raising=False)
    monkeypatch.delenv("TAOTOKEN_BASE_URL", raising=False)
    monkeypatch.delenv("KREGRESS_ENV", raising=False)
    home = tmp_path / "home"
    spec_file = tmp_path / "gemm_smoke.yaml"
    spec_file.write_text((REPO / "specs" / "gemm_smoke.yaml").read_text())
    report = home / "reports" / "gemm_smoke" / "report.md"
    report.parent.mkdir(parents=True)
    report.write_text("# report\n")
    spec = load_spec(spec_file)
    cli._record_sweep(home, "gemm_smoke", {
        "run_id": "run-0001", "ts": 1.0, "task_id": "gemm_smoke", "report": str(report),
        "report_sha256": cli._report_sha(report),  # the report the record names is the one it describes
        "fingerprint": cli.sweep_fingerprint(spec, _family_files(), _args(spec_file, home)),
        "verdicts": "verdicts: PASS 1, REGRESS 0, NEEDS_REVIEW 0 (1 variants; best r1-local-01; stopped: no)"})
    return home, spec_file, report


PROBE = """
import json, sys
from kernel_assets.cli import main
rc = main(sys.argv[1:])
print(json.dumps({"rc": rc, "heavy": sorted(m for m in ("dagster", "torch", "triton", "kernels") if m in sys.modules)}))
"""


def test_unchanged_spec_is_answered_without_importing_dagster_torch_or_triton(recorded):
    """One fingerprint path: the spec is schema-checked (no family import) and the family's files, as the
    last binding listed them, are hashed again; nothing heavy is imported."""
    home, spec_file, report = recorded
    p = subprocess.run([sys.executable, "-c", PROBE, "sweep", str(spec_file), "--dagster-home", str(home)], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    res = json.loads(p.stdout.strip().splitlines()[-1])
    assert res == {"rc": 0, "heavy": []}, p.stderr[-2000:]
    assert "unchanged since run run-0001" in p.stderr and "--force re-runs it" in p.stderr
    assert f"report: {report}" in p.stdout and "verdicts: PASS 1" in p.stdout


def test_a_comment_edit_counts_as_unchanged(recorded):
    home, spec_file, _ = recorded
    spec_file.write_text("# a comment changes the bytes, not the content\n" + spec_file.read_text())
    args = _args(spec_file, home)
    assert cli._unchanged(home, load_spec(spec_file), args)["run_id"] == "run-0001"
    assert cli._unchanged(home, load_spec(spec_file), _args(spec_file, home, force=True)) is None


@pytest.mark.parametrize("change", ["seed", "strategy_override", "backend_override", "model", "code", "no_report",
                                    "report_edited"])
def test_anything_that_can_change_the_outcome_runs_again(recorded, monkeypatch, change):
    home, spec_file, report = recorded
    kw = {}
    if change == "seed":
        data = yaml.safe_load(spec_file.read_text())
        data["search"]["seed"] = 7
        spec_file.write_text(yaml.safe_dump(data))
    elif change == "strategy_override":
        kw["strategy"] = "hybrid"
    elif change == "backend_override":
        kw["backend"] = "interpreter"
    elif change == "model":
        monkeypatch.setenv("TAOTOKEN_MODEL_ID", "another-model")
    elif change == "code":
        monkeypatch.setattr(cli, "_code_hash", lambda: "0123456789abcdef")
    elif change == "no_report":
        report.unlink()
    elif change == "report_edited":  # e.g. replaced by another command's report: not vouched for any more
        report.write_text("# kregress judge: gemm_smoke\n")
    assert cli._unchanged(home, load_spec(spec_file), _args(spec_file, home, **kw)) is None


def test_a_kernel_edit_runs_again(recorded, tmp_path):
    """The family's source files are part of the record: an edited kernel file is not unchanged."""
    home, spec_file, _ = recorded
    rec_file = home / "kregress_cli" / "last_sweep" / "gemm_smoke.json"
    rec = json.loads(rec_file.read_text())
    kernel_copy = tmp_path / "gemm.py"
    kernel_copy.write_text("# the recorded kernel file\n")
    rec["fingerprint"]["family_files"] = {str(kernel_copy): cli._file_sha(kernel_copy)}
    rec_file.write_text(json.dumps(rec))
    assert cli._unchanged(home, load_spec(spec_file), _args(spec_file, home)) is not None
    kernel_copy.write_text("# edited\n")
    assert cli._unchanged(home, load_spec(spec_file), _args(spec_file, home)) is None
