"""The whole pipeline on recorded real GPU runs: statistical PASS/REGRESS on replay evidence, from the
file shipped in the repository (never skipped)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from kernel_assets.cli import main
from kregress.core.recorded import ReplayTable, shipped_path
from kregress.core.spec import load_spec

REPO = Path(__file__).resolve().parent.parent
SPEC = REPO / "specs" / "replay_clblast_rtx3090.yaml"


def test_default_spec_uses_the_shipped_file_and_its_median_baseline():
    spec = load_spec(SPEC)
    assert spec.params["cache_file"] == shipped_path().name
    table = ReplayTable.load(shipped_path())
    assert spec.baseline == table.median().config
    assert spec.shape_matrix == [{"x": 4096, "y": 4096}]
    assert "median recorded time" in spec.description and "median recorded time" in SPEC.read_text().splitlines()[2]


def test_replay_sweep_gives_measured_verdicts(dagster_home, monkeypatch, tmp_path):
    monkeypatch.setenv("KREGRESS_REPLAY_DIR", str(tmp_path))  # empty: the shipped file is enough
    assert main(["sweep", str(SPEC)]) == 0
    out = dagster_home / "reports" / "replay_clblast_rtx3090"
    v = pd.read_parquet(out / "verdicts.parquet")
    assert len(v) == 24 and set(v["evidence"].dropna()) == {"replay"}
    assert {"PASS", "REGRESS"} <= set(v["verdict"])
    m = pd.read_parquet(out / "measurements.parquet")
    assert (m["samples"] == 32).all() and set(m["device"]) == {"NVIDIA GeForce RTX 3090"}
    assert set(m["shape"]) == {"4096x4096"}
    # the local policy improved on the (median) baseline using the recorded runs
    base = pd.read_parquet(out / "variants.parquet").iloc[0]["latency_p50_ms"]
    assert v["latency_p50_ms"].min() < 0.9 * base
    # the report says what recorded runs are, and keeps no column that recorded runs cannot fill
    text = (out / "report.md").read_text()
    assert "compile: none: recorded runs" in text and "not re-checked: recorded runs" in text
    rounds = text.split("## Rounds", 1)[1].split("## Failures", 1)[0]
    assert "### Round 1" in rounds and "regs_per_thread" not in rounds and "occupancy" not in rounds
    assert "None" not in text.split("## Baseline", 1)[1].split("## Rounds", 1)[0]
    table = ReplayTable.load(shipped_path())
    assert base == pytest.approx(float(pd.Series(table.median().times).median()), rel=0.05)
