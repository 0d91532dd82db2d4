"""A check that could not run on this evidence is not a failure (issue 55): on a real instance, a replay sweep's
constraints checks (recorded runs carry no compile facts) resolve SKIPPED, the status the UI draws as
"Skipped", not FAILED; the reason is in the asset's metadata and printed once by the CLI."""

from __future__ import annotations

import asyncio
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.loader import LoadingContextForTest
from dagster._core.storage.asset_check_execution_record import (
    AssetCheckExecutionRecordStatus,
    AssetCheckExecutionResolvedStatus,
)

from kernel_assets.assets import NO_COMPILE_FACTS, NotChecked, not_checked, not_checked_key
from kernel_assets.cli import main

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
SPEC = REPO / "specs" / "replay_clblast_rtx3090.yaml"
TASK = "replay_clblast_rtx3090"


def test_not_checked_is_neither_a_pass_nor_a_failure():
    res = not_checked("round_1_constraints", NO_COMPILE_FACTS, TASK, variants=8)
    assert isinstance(res, NotChecked) and not isinstance(res, dg.AssetCheckResult)
    assert res.line == f"check round_1_constraints not checked: {NO_COMPILE_FACTS}"
    assert not_checked_key("round_1_constraints") == "round_1_constraints: not checked"


def _resolved(instance, key: dg.AssetCheckKey):
    rec = instance.event_log_storage.get_latest_asset_check_execution_by_key([key])[key]
    status = asyncio.run(rec.resolve_status(LoadingContextForTest(instance)))
    return rec, status


def test_replay_constraints_checks_are_skipped_not_failed(dagster_home, monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("KREGRESS_REPLAY_DIR", str(tmp_path))  # empty: the shipped file is enough
    assert main(["sweep", str(SPEC)]) == 0
    err = capsys.readouterr().err
    # the CLI says it once per reason, not once per round
    assert err.count(f"not checked: {NO_COMPILE_FACTS}") == 1, err
    instance = dg.DagsterInstance.get()
    (run,) = instance.get_runs(limit=1)
    assert run.status == dg.DagsterRunStatus.SUCCESS
    evaluated = {}
    for rec in instance.all_logs(run.run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION):
        ev = rec.dagster_event.event_specific_data
        evaluated[ev.asset_check_key.name] = ev
    not_run = ["baseline_correct", "baseline_constraints", "round_1_constraints"]
    for name in not_run:
        asset = "baseline_metrics" if name.startswith("baseline") else "round_1_variants"
        key = dg.AssetCheckKey(dg.AssetKey(asset), name)
        assert name not in evaluated  # no evaluation: no "passed", no "failed"
        rec, status = _resolved(instance, key)
        assert rec.run_id == run.run_id and rec.partition == TASK
        assert rec.status == AssetCheckExecutionRecordStatus.PLANNED
        assert status == AssetCheckExecutionResolvedStatus.SKIPPED, (name, status)
        # the reason, one click away: the asset's materialization metadata
        mat = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=dg.AssetKey(asset), asset_partitions=[TASK]),
                                              limit=1).records[0].asset_materialization
        assert mat.metadata[not_checked_key(name)].value, name
    assert mat.metadata[not_checked_key("round_1_constraints")].value == NO_COMPILE_FACTS
    # the checks that did run on the replay evidence are evaluated as before
    assert "regression_guard" in evaluated
    _, status = _resolved(instance, dg.AssetCheckKey(dg.AssetKey("verdict_report"), "regression_guard"))
    assert status in (AssetCheckExecutionResolvedStatus.SUCCEEDED, AssetCheckExecutionResolvedStatus.FAILED)
