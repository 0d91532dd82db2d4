"""Budgets: reservations before a call, shrinking the prompt, refusal, settlement, and parallel processes."""

from __future__ import annotations

import multiprocessing as mp

import pytest
from gateway_helpers import budget_race_worker, make_gateway, run_spawned

from kernel_assets.usage import budget_report
from kregress.core.budget import BudgetScope
from kregress.core.spec import Budget
from kregress.testing.fake_gateway import prompt_tokens_of
from resources.ledger import BudgetExceeded, Ledger
from resources.taotoken import CallContext, estimate_messages_tokens, estimate_tokens

KEY = "sk" "-budget-test-key-000000000000"
ENV = {"TAOTOKEN_API_KEY": KEY}




def builder(rows: int):
    lines = "\n".join(f"r{i}|BM128-BN128-BK64-G8-s3-w8|0.{i:03d}|612.5|168|96.0|0.25|-" for i in range(rows))
    return [{"role": "system", "content": "JSON array only."}, {"role": "user", "content": f"history:\n{lines}\npropose"}]


def test_estimate_is_not_below_what_the_server_counts():
    for rows in (0, 3, 10):
        msgs = builder(rows)
        assert estimate_messages_tokens(msgs) >= prompt_tokens_of({"messages": msgs})
    assert estimate_tokens("") == 0 and estimate_tokens("hello world") == 6  # 11 UTF-8 bytes / 2, rounded up
    assert estimate_tokens("BLOCK_M=128, num_stages") == 12
    assert estimate_tokens("{}[],:") == 6  # punctuation: one token a character, more than bytes / 2
    assert estimate_tokens("\u6570\u636e") == 4  # two CJK characters: two tokens each


def test_prompt_is_shrunk_to_fit_the_round_budget(srv, ledger):
    g = make_gateway(srv, ledger, ENV)
    full = estimate_messages_tokens(builder(8))
    # room for the output and for a prompt with about 3 rows, not for 8
    limit_in = estimate_messages_tokens(builder(3)) + 1
    assert full > limit_in
    budget = Budget(max_input_tokens_per_round=limit_in, max_output_tokens_per_round=500, max_total_tokens=10_000)
    res = g.chat("suggest", builder, max_rows=8, max_tokens=200, budget=budget, ctx=CallContext(run_id="s1", round=1))
    assert res.rows == 3
    sent = srv.chat_requests()[0].body["messages"][1]["content"]
    assert sent.count("|BM128") == 3
    assert ledger.usage.refusals("s1") == []  # the larger attempts were not calls and are not recorded as refusals


def test_nothing_fits_no_call_and_a_budget_reason(srv, ledger):
    g = make_gateway(srv, ledger, ENV)
    budget = Budget(max_input_tokens_per_round=5, max_output_tokens_per_round=500, max_total_tokens=10_000)
    with pytest.raises(BudgetExceeded) as ei:
        g.chat("suggest", builder, max_rows=4, max_tokens=200, budget=budget, ctx=CallContext(run_id="s1", round=1))
    assert "round 1 input" in ei.value.reason and "max_input_tokens_per_round 5" in ei.value.reason
    assert "tried 4..0 history rows" in ei.value.reason
    assert srv.chat_requests() == [] and ledger.usage.rows() == []
    rep = budget_report(ledger, budget, "s1")
    # every prompt refused, none sent: the budget rule says so (kind "refused"), and the CLI exits 3 on it
    assert [b.kind for b in rep.breaches] == ["refused"] and rep.breaches[0].refusal.limit == "max_input_tokens_per_round"
    assert len(rep.refusals) == 1 and rep.rounds[0].refused == 1 and rep.total == 0


def test_output_budget_counts_max_tokens(srv, ledger):
    g = make_gateway(srv, ledger, ENV)
    budget = Budget(max_input_tokens_per_round=10_000, max_output_tokens_per_round=300, max_total_tokens=10_000)
    ctx = CallContext(run_id="s2", round=1)
    srv.push(content="[]", completion_tokens=250)
    g.chat("suggest", builder(1), max_tokens=300, budget=budget, ctx=ctx)
    with pytest.raises(BudgetExceeded, match=r"round 1 output: 250 used \+ 256 requested > max_output_tokens_per_round 300 \(by 206\)"):
        g.chat("suggest", builder(2), max_tokens=300, budget=budget, ctx=ctx)
    # the next round has its own per-round budget
    g.chat("suggest", builder(2), max_tokens=300, budget=budget, ctx=CallContext(run_id="s2", round=2))
    assert len(srv.chat_requests()) == 2


def test_sweep_total_applies_across_rounds_and_roles(srv, ledger):
    g = make_gateway(srv, ledger, ENV)
    budget = Budget(max_input_tokens_per_round=10_000, max_output_tokens_per_round=10_000, max_total_tokens=600)
    srv.default.prompt_tokens, srv.default.completion_tokens = 50, 150  # within each reservation: no overshoot
    g.chat("suggest", builder(1), max_tokens=200, budget=budget, ctx=CallContext(run_id="s3", round=1))
    g.chat("suggest", builder(2), max_tokens=200, budget=budget, ctx=CallContext(run_id="s3", round=2))
    with pytest.raises(BudgetExceeded, match="sweep total: 400 used") as exc:
        g.chat("report", builder(3), max_tokens=200, budget=budget, ctx=CallContext(run_id="s3", round=0))
    assert exc.value.breaches[0].limit == "max_total_tokens" and exc.value.breaches[0].round == 0
    rep = budget_report(ledger, budget, "s3")
    assert rep.total == 400 and rep.passed and not rep.overshoot
    assert [(r.round, r.input, r.output) for r in rep.rounds] == [(0, 0, 0), (1, 50, 150), (2, 50, 150)]
    assert "400 / 600 tokens" in rep.markdown()


def test_settlement_uses_reported_usage_not_the_estimate(srv, ledger):
    g = make_gateway(srv, ledger, ENV)
    srv.push(content="[]", prompt_tokens=7, completion_tokens=3)
    res = g.chat("suggest", builder(5), max_tokens=400, budget=Budget(), ctx=CallContext(run_id="s4", round=1))
    assert res.estimated_prompt_tokens > 7
    assert ledger.usage.spend("s4").rounds == {1: (7, 3)} and ledger.usage.spend_by_round("s4")[0].calls == 1


def test_budget_report_of_the_latest_sweep_of_a_partition(srv, ledger):
    g = make_gateway(srv, ledger, ENV)
    srv.default.prompt_tokens, srv.default.completion_tokens = 10, 10
    g.chat("suggest", builder(1), budget=Budget(), ctx=CallContext(run_id="old", partition="p", round=1))
    g.chat("suggest", builder(2), budget=Budget(), ctx=CallContext(run_id="new", partition="p", round=1))
    g.chat("suggest", builder(3), budget=Budget(), ctx=CallContext(run_id="new", partition="p", round=2))
    assert ledger.usage.latest_sweep("p") == "new"  # what `kregress usage --spec` judges when no --sweep is given
    rep = budget_report(ledger, Budget(), "new")
    assert rep.sweep == "new" and rep.total == 40 and [r.round for r in rep.rounds] == [1, 2]
    over = budget_report(ledger, Budget(max_input_tokens_per_round=5), "new")
    assert not over.passed and "NO" in over.markdown()
    assert [(b.kind, b.round, b.limit, b.by) for b in over.breaches] == [
        ("round", 1, "max_input_tokens_per_round", 5), ("round", 2, "max_input_tokens_per_round", 5)]


# --- several processes share one budget -----------------------------------------------------------


def test_parallel_processes_never_exceed_the_shared_budget(srv, tmp_path):
    db = str(tmp_path / "ledger.sqlite")
    Ledger(db).usage.rows()  # create the schema once
    srv.default.completion_tokens = 100  # every call uses all of its max_tokens
    srv.default.delay_s = 0.02  # calls overlap in time
    total = 2_000  # about 15 calls' worth
    results = run_spawned(budget_race_worker, [(srv.root, db, w, total) for w in range(4)])
    ledger = Ledger(db)
    rows = ledger.usage.rows()
    spent = sum(r.total_tokens for r in rows)
    assert spent <= total
    ok = sum(r[1] for r in results)
    assert ok == len(srv.chat_requests()) == len(rows) and ok >= 10
    assert all(r[2] >= 1 for r in results)  # every process ran into the limit
    assert spent > total - 2 * 140  # the budget was used, not left idle: less than two calls' worth remains
    rep = budget_report(ledger, Budget(max_total_tokens=total), "shared")
    assert rep.total == spent and rep.passed


def _reserver(db: str, wid: int, out: mp.Queue) -> None:
    try:
        led = Ledger(db)
        budget = Budget(max_input_tokens_per_round=10**9, max_output_tokens_per_round=10**9, max_total_tokens=50)
        got = 0
        for sweep in range(SWEEPS):  # each sweep's last tokens are a fresh race between the processes
            for _ in range(8):
                try:
                    led.usage.reserve(BudgetScope(f"tight-{sweep}"), round=1, est_input=7, est_output=3, budget=budget, record_refusal=False)
                    got += 1
                except BudgetExceeded:
                    pass
        out.put(got)
    except Exception as e:  # noqa: BLE001 - report, do not hang the parent
        out.put(f"{type(e).__name__}: {e}")


SWEEPS = 100


def test_reservations_are_atomic_under_contention(tmp_path):
    """Processes race for the last tokens of many small budgets: exactly budget / cost reservations succeed in each."""
    db = str(tmp_path / "ledger.sqlite")
    Ledger(db).usage.rows()
    results = run_spawned(_reserver, [(db, w) for w in range(6)])
    assert all(isinstance(r, int) for r in results), results
    led = Ledger(db)
    over = {s: led.usage.spend(f"tight-{s}").total for s in range(SWEEPS)}
    assert all(v == 50 for v in over.values()), {s: v for s, v in over.items() if v != 50}
    assert sum(results) == 5 * SWEEPS  # 50 tokens / 10 per reservation in every sweep, never more
