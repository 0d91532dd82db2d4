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
from kernel_assets.usage import budget_report, format_table
from kregress.core.budget import BudgetScope, budget_scope
from kregress.core.records import UsageRecord
from kregress.core.spec import Budget, TaskSpec
from resources.ledger import (
    Ledger,
    LedgerConfigError,
    LedgerResource,
    RoundRow,
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
    led.usage.record(rec(), sweep="run1")
    led.usage.record(rec(key_alias="suggest#bbbb", status="error", error_class="rate_limited:429", prompt_tokens=0, completion_tokens=0, total_tokens=0), sweep="run1")
    led.usage.record(rec(key_alias="suggest#bbbb", attempt=2, round=2, task="round_2_suggestions", model="m2"), sweep="run1")
    led.usage.record(rec(role="report", key_alias="report#cccc", round=0, task="verdict_report", prompt_tokens=300, completion_tokens=50, total_tokens=350), sweep="run1")
    led.usage.record(rec(key_alias="(cache)", cache_hit=True, prompt_tokens=0, completion_tokens=0, total_tokens=0, partition="p2", run_id="run2"), sweep="run2")
    return led


def test_rows_round_trip_usage_records(ledger):
    rows = ledger.usage.rows()
    assert len(rows) == 5 and all(isinstance(r, UsageRecord) for r in rows)
    assert rows[1].error_class == "rate_limited:429" and rows[4].cache_hit is True
    assert [r.key_alias for r in ledger.usage.rows(partition="p1", round=1)] == ["suggest#aaaa", "suggest#bbbb"]
    with pytest.raises(ValueError, match="cannot filter on 'nope'"):
        ledger.usage.rows(nope=1)


def test_reconciliation_by_role_and_key(ledger):
    table = ledger.usage.reconcile()
    assert table == [
        {"role": "report", "key_alias": "report#cccc", "calls": 1, "ok": 1, "errors": 0, "cache_hits": 0, "input": 300, "output": 50, "total": 350},
        {"role": "suggest", "key_alias": "(cache)", "calls": 1, "ok": 1, "errors": 0, "cache_hits": 1, "input": 0, "output": 0, "total": 0},
        {"role": "suggest", "key_alias": "suggest#aaaa", "calls": 1, "ok": 1, "errors": 0, "cache_hits": 0, "input": 100, "output": 20, "total": 120},
        {"role": "suggest", "key_alias": "suggest#bbbb", "calls": 2, "ok": 1, "errors": 1, "cache_hits": 0, "input": 100, "output": 20, "total": 120},
    ]
    by_model = ledger.usage.reconcile(["model"], partition="p1")
    assert [(r["model"], r["calls"], r["total"]) for r in by_model] == [("m1", 3, 470), ("m2", 1, 120)]
    by_round = ledger.usage.reconcile(["round", "partition"])
    assert [(r["round"], r["partition"], r["total"]) for r in by_round] == [(0, "p1", 350), (1, "p1", 120), (1, "p2", 0), (2, "p1", 120)]
    assert [r["task"] for r in ledger.usage.reconcile(["task"])] == ["round_1_suggestions", "round_2_suggestions", "verdict_report"]
    with pytest.raises(ValueError, match="cannot group by secret"):
        ledger.usage.reconcile(["secret"])


def test_exports(ledger, tmp_path):
    n = ledger.usage.export_jsonl(tmp_path / "out" / "usage.jsonl", partition="p1")
    lines = (tmp_path / "out" / "usage.jsonl").read_text().splitlines()
    assert n == 4 == len(lines)
    first = json.loads(lines[0])
    assert set(first) == set(UsageRecord.model_fields) and first["key_alias"] == "suggest#aaaa"
    ledger.usage.export_usage_csv(tmp_path / "usage.csv")
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
    led.usage.record(rec())
    assert (tmp_path / "dh" / "ledger.sqlite").is_file()
    import sqlite3

    assert sqlite3.connect(tmp_path / "dh" / "ledger.sqlite").execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_reserve_and_settle_states(tmp_path):
    led = Ledger(tmp_path / "l.sqlite")
    b = Budget(max_input_tokens_per_round=1000, max_output_tokens_per_round=500, max_total_tokens=1200)
    r1 = led.usage.reserve(BudgetScope("s"), round=1, est_input=600, est_output=300, budget=b)
    assert led.usage.spend_by_round("s") == [RoundRow(1, 600, 300, in_flight=1, refused=0, calls=1)]
    led.usage.settle(r1, 400, 100)
    led.usage.settle(r1, 999, 999)  # settling twice changes nothing
    assert led.usage.spend("s").rounds == {1: (400, 100)} and led.usage.spend("s").total == 500
    r2 = led.usage.reserve(BudgetScope("s"), round=2, est_input=100, est_output=100, budget=b)
    led.usage.settle(r2, 0, 0)  # a call that failed without usage releases its reservation
    assert led.usage.spend_by_round("s")[1] == RoundRow(2, 0, 0, in_flight=0, refused=0, calls=1)
    from resources.ledger import BudgetExceeded

    # 100 tokens are left for the output after the prompt; the least worth sending is 150
    with pytest.raises(BudgetExceeded, match=r"sweep total: 500 used \+ 750 requested > max_total_tokens 1200 \(by 50\)") as exc:
        led.usage.reserve(BudgetScope("s"), round=3, est_input=600, est_output=200, min_output=150, budget=b)
    (breach,) = exc.value.breaches  # typed: which limit, by how much
    assert (breach.kind, breach.limit, breach.used, breach.requested, breach.allowed, breach.by) == (
        "sweep", "max_total_tokens", 500, 600 + 150, 1200, 50)
    refusal = led.usage.refusals("s")[0]
    assert refusal["round"] == 3 and refusal["breach"] == breach  # stored as the typed breach, read back equal
    led.usage.reserve(BudgetScope("s"), round=3, est_input=5000, est_output=5000, budget=None)  # no budget: always fits


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


def sweep_graph(tmp_path, budget: Budget, calls):
    """A stand-in for the sweep's graph: an upstream asset makes ``calls(ledger, scope)`` in its run's budget scope,
    then the token assets judge that run (as in sweep_job, where they follow verdict_report)."""

    url = str(tmp_path / "ledger.sqlite")

    @dg.asset(name="verdict_report", partitions_def=dg.StaticPartitionsDefinition(["p1", "p2"]))
    def fake_report(context):
        calls(Ledger(url), budget_scope(context.run_id, context.partition_key))

    defs = build_token_assets(dg.StaticPartitionsDefinition(["p1", "p2"]), lambda key: toy_spec(budget), deps=["verdict_report"])
    return dg.materialize([fake_report, *defs], partition_key="p1", resources={"ledger": LedgerResource(url=url)},
                          raise_on_error=True)


def one_call(led, scope):
    r = led.usage.reserve(scope, round=1, est_input=100, est_output=50, budget=None, role="suggest")
    led.usage.settle(r, 100, 20)
    led.usage.record(rec(run_id=scope.run_id, partition=scope.partition), sweep=scope.sweep, reservation_id=r.id)


@pytest.mark.parametrize("limit,passed", [(10_000, True), (90, False)])
def test_token_assets_materialize_with_table_and_check(tmp_path, limit, passed):
    led = Ledger(tmp_path / "ledger.sqlite")
    one_call(led, BudgetScope("an-earlier-sweep", "p1"))  # another sweep of the partition: shown in the all-sweeps table only
    budget = Budget(max_input_tokens_per_round=limit, max_output_tokens_per_round=limit, max_total_tokens=limit)
    result = sweep_graph(tmp_path, budget, one_call)
    assert result.success
    meta = result.asset_materializations_for_node("token_usage")[0].metadata
    assert meta["total_tokens"].value == 120 and meta["calls"].value == 1 and meta["sweep"].value == result.run_id
    assert meta["total_tokens_all_sweeps"].value == 240
    table = meta["reconciliation"].value
    assert [rec_.data["key_alias"] for rec_ in table.records] == ["suggest#aaaa", ""] and table.records[-1].data["role"] == "TOTAL"
    evals = result.get_asset_check_evaluations()
    assert len(evals) == 1 and evals[0].check_name == "token_budget" and evals[0].passed is passed
    assert evals[0].metadata["total_tokens"].value == 120
    if not passed:
        assert evals[0].metadata["result"].value == ("over budget: round 1 input 100 > max_input_tokens_per_round 90 (by 10); "
                                                     "sweep total 120 > max_total_tokens 90 (by 30)")


def test_budget_report_of_a_sweep_without_calls(tmp_path):
    rep = budget_report(Ledger(tmp_path / "l.sqlite"), Budget(), "nothing")
    assert rep.sweep == "nothing" and rep.passed and rep.total == 0 and rep.breaches == []
    assert budget_report(Ledger(tmp_path / "l.sqlite"), Budget(), None).passed


def test_an_overshoot_fails_the_budget_check_and_blocks_the_sweep(tmp_path):
    from resources.ledger import BudgetExceeded

    budget = Budget(max_input_tokens_per_round=10_000, max_output_tokens_per_round=10_000, max_total_tokens=100_000)
    seen = {}

    def overshoot(led, scope):
        r = led.usage.reserve(scope, round=1, est_input=100, est_output=50, budget=budget, role="suggest")
        led.usage.settle(r, 400, 50)  # the server billed 300 input tokens more than reserved: far inside every limit, still an overshoot
        led.usage.record(rec(prompt_tokens=400, completion_tokens=50, total_tokens=450), sweep=scope.sweep, reservation_id=r.id)
        with pytest.raises(BudgetExceeded, match="sweep blocked") as exc:
            led.usage.reserve(scope, round=2, est_input=1, est_output=1, budget=budget, role="suggest", record_refusal=False)
        seen["breaches"] = exc.value.breaches
        seen["refusal"] = led.usage.refusals(scope.sweep)[0]  # recorded even when the caller would not
        led.usage.reserve(BudgetScope("run2"), round=1, est_input=1, est_output=1, budget=budget)  # other sweeps are not affected
        seen["report"] = budget_report(led, budget, scope.sweep)

    result = sweep_graph(tmp_path, budget, overshoot)
    (b,) = seen["breaches"]
    assert b.kind == "overshoot" and b.by == 300 and b.overshoot.input == 300 and b.overshoot.first_round == 1
    assert seen["refusal"]["reason"].startswith("sweep blocked") and seen["refusal"]["breach"] == b
    assert [x.kind for x in seen["report"].breaches] == ["overshoot"]
    (ev,) = result.get_asset_check_evaluations()
    assert ev.passed is False and ev.metadata["overshoot_tokens"].value == 300
    assert ev.metadata["result"].value.startswith("over budget: overshoot: 1 call(s) from round 1 on were billed 300 tokens")
    assert "OVERSHOOT" in ev.metadata["per_round"].value


# --- a process killed mid-call, an older ledger, the budget from `kregress usage` ----------------------


def _reserve_send_and_die(db: str, with_attempt: bool) -> None:
    """In a child process: reserve, write an attempt as sent (or not), then die without settling (as kill -9 would)."""
    import os

    led = Ledger(db)
    r = led.usage.reserve(BudgetScope("killed", "p1"), round=0, est_input=300, est_output=200, budget=Budget(), role="report",
                          task="verdict_report")
    if with_attempt:
        led.usage.begin_attempt(rec(role="report", round=0, task="verdict_report"), sweep="killed", reservation_id=r.id)
    os._exit(0)


@pytest.mark.parametrize("with_attempt,state,charged", [(True, "settled", (300, 200)), (False, "released", (0, 0))])
def test_a_dead_process_reservation_is_settled_or_released_by_the_next_caller(tmp_path, with_attempt, state, charged):
    import multiprocessing as mp

    db = str(tmp_path / "ledger.sqlite")
    p = mp.get_context("spawn").Process(target=_reserve_send_and_die, args=(db, with_attempt))
    p.start()
    p.join(60)
    led = Ledger(db)
    (left,) = led.usage.in_flight()
    assert left["owner"].split(":")[1] == str(p.pid)
    live = led.usage.reserve(BudgetScope("alive"), round=1, est_input=1, est_output=1, budget=None)  # this process: alive
    (done,) = led.usage.recover()
    assert (done.state, done.input, done.output, done.interrupted_attempts) == (state, *charged, int(with_attempt))
    assert [r["id"] for r in led.usage.in_flight()] == [live.id]  # a live owner's call is left alone
    assert led.usage.spend("killed").rounds == {0: charged}  # an attempt may have been billed: charged at its estimate
    if with_attempt:
        (row,) = led.usage.rows(sweep="killed")
        assert (row.status, row.error_class) == ("error", "interrupted")
    assert led.usage.recover() == []  # once


def test_a_ledger_made_by_an_older_version_gets_the_new_columns(tmp_path):
    import sqlite3

    db = tmp_path / "old.sqlite"
    con = sqlite3.connect(db)
    con.executescript("""
        CREATE TABLE reservations (id INTEGER PRIMARY KEY AUTOINCREMENT, ts FLOAT NOT NULL, sweep TEXT NOT NULL,
            run_id TEXT DEFAULT '' NOT NULL, partition TEXT DEFAULT '' NOT NULL, round INTEGER DEFAULT '0' NOT NULL,
            role TEXT DEFAULT '' NOT NULL, task TEXT DEFAULT '' NOT NULL, est_input INTEGER NOT NULL, est_output INTEGER NOT NULL,
            input_tokens INTEGER DEFAULT '0' NOT NULL, output_tokens INTEGER DEFAULT '0' NOT NULL, state TEXT NOT NULL,
            reason TEXT DEFAULT '' NOT NULL, settled_ts FLOAT);
        INSERT INTO reservations (ts, sweep, round, est_input, est_output, input_tokens, output_tokens, state)
            VALUES (1.0, 'old-sweep', 1, 100, 50, 90, 40, 'settled');
    """)
    con.commit()
    con.close()
    led = Ledger(db)
    assert led.usage.spend("old-sweep").rounds == {1: (90, 40)}  # the old rows still count
    from resources.ledger import BudgetExceeded

    with pytest.raises(BudgetExceeded, match="max_input_tokens_per_round 100"):
        led.usage.reserve(BudgetScope("old-sweep"), round=1, est_input=20, est_output=5, budget=Budget(max_input_tokens_per_round=100))
    assert led.usage.refusals("old-sweep")[0]["breach"].limit == "max_input_tokens_per_round"  # the new column, filled
    cols = {r[1] for r in sqlite3.connect(db).execute("PRAGMA table_info(reservations)")}
    assert {"owner", "breach"} <= cols


def test_kregress_usage_judges_a_sweep_with_the_same_rule(tmp_path, capsys):
    import yaml

    led = Ledger(tmp_path / "ledger.sqlite")
    one = led.usage.reserve(BudgetScope("run-a", "gemm_smoke"), round=1, est_input=100, est_output=50, budget=None, role="suggest")
    led.usage.settle(one, 5000, 40)
    spec = yaml.safe_load(open("specs/gemm_smoke.yaml"))
    spec["budget"] = {"max_input_tokens_per_round": 4000, "max_output_tokens_per_round": 2000, "max_total_tokens": 20000}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec))
    parser = argparse.ArgumentParser(prog="kregress")
    register(parser.add_subparsers(dest="command"))
    out = io.StringIO()
    rc = run_usage(parser.parse_args(["usage", "--dagster-home", str(tmp_path), "--spec", str(tmp_path / "s.yaml")]), out)
    text = out.getvalue()
    assert rc == 3, text
    assert "sweep run-a (its latest)" in text
    assert "over budget: round 1 input 5000 > max_input_tokens_per_round 4000 (by 1000); overshoot: 1 call(s) from round 1" in text
    out = io.StringIO()
    assert run_usage(parser.parse_args(["usage", "--dagster-home", str(tmp_path), "--spec", str(tmp_path / "s.yaml"),
                                        "--sweep", "never"]), out) == 0
    assert "within budget" in out.getvalue()
