"""The whole pipeline on recorded real GPU runs: statistical PASS/REGRESS on replay evidence."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from kernel_assets.cli import main

REPO = Path(__file__).resolve().parent.parent


def test_replay_sweep_gives_measured_verdicts(dagster_home):
    assert main(["sweep", str(REPO / "specs" / "replay_clblast_rtx3090.yaml")]) == 0
    out = dagster_home / "reports" / "replay_clblast_rtx3090"
    v = pd.read_parquet(out / "verdicts.parquet")
    assert len(v) == 24 and set(v["evidence"].dropna()) == {"replay"}
    assert {"PASS", "REGRESS"} <= set(v["verdict"])
    passed = v[v["verdict"] == "PASS"]
    assert (passed["ratio_ci_high"] < 1.03).all() and (v[v["verdict"] == "REGRESS"]["ratio_ci_low"] > 1.03).all()
    m = pd.read_parquet(out / "measurements.parquet")
    assert (m["samples"] == 32).all() and set(m["device"]) == {"NVIDIA GeForce RTX 3090"}
    # the local policy improved on the (median) baseline using the recorded runs
    assert v["latency_p50_ms"].min() < 0.9 * pd.read_parquet(out / "variants.parquet").iloc[0]["latency_p50_ms"]
