"""The ledger: rows, reconciliation, exports, URLs, the `kregress usage` CLI, token_usage and token_budget."""

from __future__ import annotations

import argparse
import csv
import io
import json
import time

import dagster as dg
import pytest

from kernel_assets.cli_usage import register, run_usage
from kernel_assets.tokens import build_token_assets
from kregress.core.records import UsageRecord
from kregress.core.spec import Budget, TaskSpec
from kernel_assets.usage import budget_report, format_table
from resources.ledger import (
    Ledger,
    LedgerConfigError,
    LedgerResource,
    default_ledger_path,
    sqlite_path_from_url,
)


def rec(**kw) -> UsageRecord:
    base = dict(ts=time.time(), role="suggest", key_alias="suggest#aaaa", model="m1", partition="p1", run_id="run1", round=1,
                task="round_1_suggestions", status="ok", prompt_tokens=100, completion_tokens=20, total_tokens=120, attempt=1)
    base.update(kw)
    return UsageRecord(**base)


@pytest.fixture
def ledger(tmp_path):
    led = Ledger(tmp_path / "ledger.sqlite")
    led.record(rec(), sweep="run1")
    led.record(rec(key_alias="suggest#bbbb", status="error", error_class="rate_limited:429", prompt_tokens=0, completion_tokens=0, total_tokens=0), sweep="run1")
    led.record(rec(key_alias="suggest#bbbb", attempt=2, round=2, task="round_2_suggestions", model="m2"), sweep="run1")
    led.record(rec(role="report", key_alias="report#cccc", round=0, task="verdict_report", prompt_tokens=300, completion_tokens=50, total_tokens=350), sweep="run1")
    led.record(rec(key_alias="(cache)", cache_hit=True, prompt_tokens=0, completion_tokens=0, total_tokens=0, partition="p2", run_id="run2"), sweep="run2")
    return led


def test_rows_round_trip_usage_records(ledger):
    rows = ledger.rows()
    assert len(rows) == 5 and all(isinstance(r, UsageRecord) for r in rows)
    assert rows[1].error_class == "rate_limited:429" and rows[4].cache_hit is True
    assert [r.key_alias for r in ledger.rows(partition="p1", round=1)] == ["suggest#aaaa", "suggest#bbbb"]
    with pytest.raises(ValueError, match="cannot filter on 'nope'"):
        ledger.rows(nope=1)


def test_reconciliation_by_role_and_key(ledger):
    table = ledger.reconcile()
    assert table == [
        {"role": "report", "key_alias": "report#cccc", "calls": 1, "ok": 1, "errors": 0, "cache_hits": 0, "input": 300, "output": 50, "total": 350},
        {"role": "suggest", "key_alias": "(cache)", "calls": 1, "ok": 1, "errors": 0, "cache_hits": 1, "input": 0, "output": 0, "total": 0},
        {"role": "suggest", "key_alias": "suggest#aaaa", "calls": 1, "ok": 1, "errors": 0, "cache_hits": 0, "input": 100, "output": 20, "total": 120},
        {"role": "suggest", "key_alias": "suggest#bbbb", "calls": 2, "ok": 1, "errors": 1, "cache_hits": 0, "input": 100, "output": 20, "total": 120},
    ]
    by_model = ledger.reconcile(["model"], partition="p1")
    assert [(r["model"], r["calls"], r["total"]) for r in by_model] == [("m1", 3, 470), ("m2", 1, 120)]
    by_round = ledger.reconcile(["round", "partition"])
    assert [(r["round"], r["partition"], r["total"]) for r in by_round] == [(0, "p1", 350), (1, "p1", 120), (1, "p2", 0), (2, "p1", 120)]
    assert [r["task"] for r in ledger.reconcile(["task"])] == ["round_1_suggestions", "round_2_suggestions", "verdict_report"]
    with pytest.raises(ValueError, match="cannot group by secret"):
        ledger.reconcile(["secret"])


def test_exports(ledger, tmp_path):
    n = ledger.export_jsonl(tmp_path / "out" / "usage.jsonl", partition="p1")
    lines = (tmp_path / "out" / "usage.jsonl").read_text().splitlines()
    assert n == 4 == len(lines)
    first = json.loads(lines[0])
    assert set(first) == set(UsageRecord.model_fields) and first["key_alias"] == "suggest#aaaa"
    ledger.export_usage_csv(tmp_path / "usage.csv")
    with open(tmp_path / "usage.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 5 and rows[3]["total_tokens"] == "350"


def test_url_resolution(tmp_path, monkeypatch):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dh"))
    assert default_ledger_path() == tmp_path / "dh" / "ledger.sqlite"
    assert sqlite_path_from_url("") == tmp_path / "dh" / "ledger.sqlite"
    assert sqlite_path_from_url("sqlite:////var/x/ledger.sqlite") == __import__("pathlib").Path("/var/x/ledger.sqlite")
    assert str(sqlite_path_from_url("sqlite:///rel/ledger.sqlite")) == "rel/ledger.sqlite"
    assert sqlite_path_from_url("/abs/l.sqlite").name == "l.sqlite"
    with pytest.raises(LedgerConfigError, match="postgresql ledgers are not supported yet"):
        sqlite_path_from_url("postgresql://u:p@host/db")
    with pytest.raises(LedgerConfigError, match="in-memory"):
        sqlite_path_from_url("sqlite:///:memory:")
    with pytest.raises(LedgerConfigError, match="unsupported scheme 'mysql'"):
        sqlite_path_from_url("mysql://x/y")
    led = LedgerResource().get_ledger()
    led.record(rec())
    assert (tmp_path / "dh" / "ledger.sqlite").is_file()
    import sqlite3

    assert sqlite3.connect(tmp_path / "dh" / "ledger.sqlite").execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_reserve_and_settle_states(tmp_path):
    led = Ledger(tmp_path / "l.sqlite")
    b = Budget(max_input_tokens_per_round=1000, max_output_tokens_per_round=500, max_total_tokens=1200)
    r1 = led.reserve(sweep="s", round=1, est_input=600, est_output=300, budget=b)
    assert led.spend("s")[1] == {"input": 600, "output": 300, "total": 900, "in_flight": 1, "refused": 0, "calls": 1}
    led.settle(r1, 400, 100)
    led.settle(r1, 999, 999)  # settling twice changes nothing
    assert led.spend("s")[1]["total"] == 500
    r2 = led.reserve(sweep="s", round=2, est_input=100, est_output=100, budget=b)
    led.settle(r2, 0, 0)  # a call that failed without usage releases its reservation
    assert led.spend("s")[2]["total"] == 0 and led.spend("s")[2]["calls"] == 1
    from resources.ledger import BudgetExceeded

    with pytest.raises(BudgetExceeded, match="sweep total: 500 used"):
        led.reserve(sweep="s", round=3, est_input=600, est_output=200, budget=b)
    assert led.refusals("s")[0]["round"] == 3
    led.reserve(sweep="s", round=3, est_input=5000, est_output=5000, budget=None)  # no budget: always fits


def test_cli_prints_and_exports(ledger, tmp_path):
    parser = argparse.ArgumentParser(prog="kregress")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["usage", "--ledger-url", f"sqlite:///{ledger.path}", "--csv", str(tmp_path / "t.csv"), "--jsonl", str(tmp_path / "u.jsonl")])
    out = io.StringIO()
    assert args.func(args, out) == 0
    text = out.getvalue()
    assert "suggest#bbbb" in text and "TOTAL" in text and "report#cccc" in text
    total_line = next(ln for ln in text.splitlines() if ln.startswith("TOTAL"))
    assert total_line.split()[-3:] == ["500", "90", "590"]
    with open(tmp_path / "t.csv") as f:
        table = list(csv.DictReader(f))
    assert table[-1]["role"] == "TOTAL" and table[-1]["total"] == "590" and list(table[0])[:2] == ["role", "key_alias"]
    assert len((tmp_path / "u.jsonl").read_text().splitlines()) == 5

    args = parser.parse_args(["usage", "--dagster-home", str(ledger.path.parent), "--group-by", "task,model", "--partition", "p1"])
    out = io.StringIO()
    run_usage(args, out)
    assert "round_2_suggestions" in out.getvalue() and "m2" in out.getvalue()
    with pytest.raises(SystemExit):
        parser.parse_args(["usage", "--group-by", "role,bogus"])
    out = io.StringIO()
    run_usage(parser.parse_args(["usage", "--dagster-home", str(tmp_path / "empty")]), out)
    assert "no model calls recorded yet" in out.getvalue()


def test_format_table_aligns_numbers():
    text = format_table([{"role": "suggest", "total": 5}, {"role": "report", "total": 12345}])
    lines = text.splitlines()
    assert lines[0].split() == ["role", "total"] and lines[2].endswith("    5") and lines[3].endswith("12345")


# --- Dagster: token_usage and token_budget -------------------------------------------------------------


def toy_spec(budget: Budget) -> TaskSpec:
    return TaskSpec.model_construct(task_id="p1", kernel_family="gemm", shape_matrix=[{"M": 1}], correctness_shapes=[{"M": 1}],
                                    baseline={}, budget=budget)


@pytest.mark.parametrize("limit,passed", [(10_000, True), (90, False)])
def test_token_assets_materialize_with_table_and_check(tmp_path, limit, passed):
    led = Ledger(tmp_path / "ledger.sqlite")
    r = led.reserve(sweep="run1", round=1, est_input=100, est_output=50, budget=None, partition="p1", role="suggest")
    led.settle(r, 100, 20)
    led.record(rec(), sweep="run1", reservation_id=r.id)
    budget = Budget(max_input_tokens_per_round=limit, max_output_tokens_per_round=limit, max_total_tokens=limit)
    parts = dg.StaticPartitionsDefinition(["p1", "p2"])
    defs = build_token_assets(parts, lambda key: toy_spec(budget))
    assert [d.key for d in defs[:1]] == [dg.AssetKey("token_usage")]
    result = dg.materialize(defs, partition_key="p1", resources={"ledger": LedgerResource(url=str(tmp_path / "ledger.sqlite"))},
                            raise_on_error=True)
    assert result.success
    mats = result.asset_materializations_for_node("token_usage")
    meta = mats[0].metadata
    assert meta["total_tokens"].value == 120 and meta["calls"].value == 1 and meta["sweep"].value == "run1"
    table = meta["reconciliation"].value
    assert [rec_.data["key_alias"] for rec_ in table.records] == ["suggest#aaaa", ""] and table.records[-1].data["role"] == "TOTAL"
    evals = result.get_asset_check_evaluations()
    assert len(evals) == 1 and evals[0].check_name == "token_budget" and evals[0].passed is passed
    assert evals[0].metadata["total_tokens"].value == 120
    if not passed:
        assert "over budget: rounds 1 and sweep total" in evals[0].metadata["result"].value


def test_budget_report_on_an_empty_partition(tmp_path):
    rep = budget_report(Ledger(tmp_path / "l.sqlite"), Budget(), partition="nothing")
    assert rep.sweep is None and rep.passed and rep.total == 0


def test_an_overshoot_fails_the_budget_check_and_blocks_the_sweep(tmp_path):
    from resources.ledger import BudgetExceeded

    led = Ledger(tmp_path / "ledger.sqlite")
    budget = Budget(max_input_tokens_per_round=10_000, max_output_tokens_per_round=10_000, max_total_tokens=100_000)
    r = led.reserve(sweep="run1", round=1, est_input=100, est_output=50, budget=budget, partition="p1", role="suggest")
    led.settle(r, 400, 50)  # the server billed 300 input tokens more than reserved: far inside every limit, still an overshoot
    led.record(rec(prompt_tokens=400, completion_tokens=50, total_tokens=450), sweep="run1", reservation_id=r.id)
    assert led.overshoot("run1").input == 300 and led.exceeded("run1", budget) == [
        "1 call(s) billed 300 tokens beyond their reservation (from round 1)"]
    with pytest.raises(BudgetExceeded, match="sweep blocked"):
        led.reserve(sweep="run1", round=2, est_input=1, est_output=1, budget=budget, partition="p1", role="suggest", record_refusal=False)
    assert led.refusals("run1")[0]["reason"].startswith("sweep blocked")  # recorded even when the caller would not
    led.reserve(sweep="run2", round=1, est_input=1, est_output=1, budget=budget)  # other sweeps are not affected
    result = dg.materialize(build_token_assets(dg.StaticPartitionsDefinition(["p1"]), lambda key: toy_spec(budget)), partition_key="p1",
                            resources={"ledger": LedgerResource(url=str(tmp_path / "ledger.sqlite"))}, raise_on_error=True)
    (ev,) = result.get_asset_check_evaluations()
    assert ev.passed is False and ev.metadata["overshoot_tokens"].value == 300
    assert "overshoot: 300 tokens billed beyond reservations" in ev.metadata["result"].value
    assert "OVERSHOOT" in ev.metadata["per_round"].value
