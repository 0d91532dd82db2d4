"""A kernel engineer's first hour (issue 32), the fast parts: the progress clock counts from the launch, the
`next:` line can be pasted and says what the replay is, one ratio convention in words, honest columns for
model rows (samples 0, a geometric mean named as one), and a check that could not run says so."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kernel_assets.report import next_step, reading, tables
from kregress.core.forecast import ratio_words
from kregress.core.records import Measurement, VariantResult, Verdict
from kregress.core.spec import load_spec

REPO = Path(__file__).resolve().parents[1]


def test_the_progress_clock_counts_from_the_process_start():
    code = ("import time; time.sleep(1.5)\n"  # seconds of imports before the CLI module is even loaded
            "from kernel_assets.cli import process_started_at\n"
            "print(time.perf_counter() - process_started_at())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True).stdout
    assert 1.5 <= float(out) < 60


@pytest.mark.parametrize("argv0,expected", [
    (".venv/bin/kregress", ".venv/bin/kregress"),
    ("kregress", "kregress"),
])
def test_next_line_uses_the_invoked_path_and_names_the_replay(monkeypatch, argv0, expected):
    from kernel_assets import cli

    monkeypatch.chdir(REPO)
    monkeypatch.setattr(sys, "argv", [argv0, "sweep"])
    assert cli.invoked_as() == expected
    monkeypatch.setenv(cli.COMMAND_ENV, cli.invoked_as())
    spec = load_spec(REPO / "specs" / "gemm_h100_bf16.yaml")
    line = next_step("model", spec, "specs/gemm_h100_bf16.yaml")
    assert f"`{expected} sweep specs/gemm_h100_bf16.yaml --backend cuda`" in line
    assert f"`{expected} sweep specs/replay_clblast_rtx3090.yaml`" in line
    assert "CLBlast's fp32 SGEMM on an RTX 3090" in line and "says nothing about gemm_h100_bf16" in line
    assert next_step("measured", spec, "specs/gemm_h100_bf16.yaml") == ""


def test_python_m_invocation_is_pasteable(monkeypatch):
    from kernel_assets import cli

    monkeypatch.setattr(sys, "argv", [str(REPO / "kernel_assets" / "cli.py"), "sweep"])
    assert cli.invoked_as().endswith(" -m kernel_assets.cli")


@pytest.mark.parametrize("ratio,words", [
    (2.387, "2.39x slower"), (0.526, "47.4% faster"), (1.125, "12.5% slower"), (0.25, "4.00x faster"),
    (1.0, "same time"), (2.0, "2.00x slower"),
])
def test_one_ratio_convention_in_words(ratio, words):
    assert ratio_words(ratio) == words
    assert ratio_words(ratio, estimate=True) == words + " (model estimate)"


def test_verdict_reading_on_model_and_measured_evidence():
    model = Verdict(variant_id="v", verdict="NEEDS_REVIEW", reasons=["x"], ratio=2.387, evidence="model", method="model")
    assert reading(model) == "2.39x slower (model estimate)"
    measured = Verdict(variant_id="v", verdict="PASS", reasons=["x"], ratio=0.526, ratio_ci_low=0.52, ratio_ci_high=0.53,
                       evidence="cuda", method="hodges-lehmann/shift")
    assert reading(measured).startswith("47.4% faster [-48.0%, -47.0%]")
    far = Verdict(variant_id="v", verdict="REGRESS", reasons=["x"], ratio=4.225, ratio_ci_low=4.2, ratio_ci_high=4.25,
                  evidence="replay", method="aligned")
    assert reading(far) == "4.22x slower [4.20x, 4.25x]"  # beyond a factor of two, the interval in factors too


def _meas(shape: str, p50: float, evidence: str) -> Measurement:
    measured = evidence != "model"
    return Measurement(shape=shape, samples_ms=[p50] * (10 if measured else 1), p50_ms=p50,
                       p20_ms=p50 if measured else None, p80_ms=p50 if measured else None,
                       tflops=1.0, gbps=1.0, evidence=evidence, device="H100", torch_version="2", triton_version="3")


def test_model_rows_have_no_samples_and_the_geomean_is_named():
    rows = [VariantResult(variant_id=vid, round=r, source="local", config={"BLOCK_M": 64}, config_hash=vid, evidence=ev,
                          measurements=[_meas("a", 1.0, ev), _meas("b", 4.0, ev)])
            for vid, r, ev in (("baseline", 0, "model"), ("v1", 1, "model"), ("v2", 1, "replay"))]
    variants, _, meas = tables(rows, {}, ["BLOCK_M"])
    assert (meas.loc[meas["evidence"] == "model", "samples"] == 0).all()
    assert (meas.loc[meas["evidence"] == "replay", "samples"] == 10).all()
    by_id = variants.set_index("variant_id")
    assert by_id.loc["v1", "latency_p50_ms"] == pytest.approx(2.0)  # geomean of 1 and 4
    assert by_id.loc["v1", "latency_aggregate"] == "geometric mean over 2 shapes of the model estimates"
    assert by_id.loc["v2", "latency_aggregate"] == "geometric mean over 2 shapes of the measured p50s"


def test_not_checked_is_never_a_pass_nor_a_failure():
    from kernel_assets.assets import NotChecked, not_checked

    res = not_checked("round_1_constraints", "recorded runs carry no compile facts", "replay_clblast_rtx3090", variants=8)
    assert isinstance(res, NotChecked)  # no AssetCheckResult: Dagster resolves the check Skipped
    assert res.line == "check round_1_constraints not checked: recorded runs carry no compile facts"
