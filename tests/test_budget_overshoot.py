"""Budgets that hold against a server that bills more than the gateway reserved.

The old gateway reserved its estimate, settled with whatever the server reported and let the next call
through: 4 parallel sweeps each spent 2x their round budget, and a 5 MB reply recorded 1.3 M tokens with
later calls still allowed. Now a settlement above the reservation (an overshoot) blocks the sweep.
"""

from __future__ import annotations

import pytest
from gateway_helpers import make_gateway, overshoot_worker, run_spawned

from kernel_assets.usage import budget_report
from kregress.core.budget import BudgetScope
from kregress.core.spec import Budget
from kregress.testing.fake_gateway import Reply
from resources.ledger import BudgetExceeded, Ledger
from resources.taotoken import CallContext, estimate_messages_tokens

KEY = "sk" "-overshoot-test-key-0000000000"
ENV = {"TAOTOKEN_API_KEY": KEY}
MSG = [{"role": "user", "content": "propose 2 variants"}]


def test_four_parallel_sweeps_stop_after_the_first_overshoot(srv, tmp_path):
    db = str(tmp_path / "ledger.sqlite")
    Ledger(db).usage.rows()  # create the schema once
    # every reply bills 4x what the gateway estimated for the prompt (the estimate is an upper bound for honest servers)
    srv.handler = lambda seen: Reply(content="[]", prompt_tokens=4 * estimate_messages_tokens(seen.body["messages"]), completion_tokens=10)
    results = run_spawned(overshoot_worker, [(srv.root, db, w) for w in range(4)])
    assert all(isinstance(r, tuple) for r in results), results
    led = Ledger(db)
    budget = Budget(max_input_tokens_per_round=1000, max_output_tokens_per_round=1000, max_total_tokens=100_000)
    for wid, sent, refused, reasons in results:
        sweep = f"over-{wid}"
        assert (sent, refused) == (1, 14), (wid, sent, refused)  # the first call overshot; nothing after it was sent
        assert all(r.startswith("sweep blocked") for r in reasons)
        rows = led.usage.rows(sweep=sweep)
        assert len(rows) == 1  # one attempt reached the server for this sweep
        over = led.usage.overshoot(sweep)
        assert over.calls == 1 and over.input == rows[0].prompt_tokens - rows[0].prompt_tokens // 4 and over.first_round == 1
        assert led.usage.spend(sweep).total == rows[0].total_tokens  # spend stopped at the overshooting call
        rep = budget_report(led, budget, sweep)
        assert rep.overshoot.calls == 1 and not rep.passed and "OVERSHOOT" in rep.markdown()
        assert [b.kind for b in rep.breaches] == ["overshoot"] and rep.breaches[0].by == over.tokens
    assert len(srv.chat_requests()) == 4


def test_a_huge_reply_billed_as_huge_usage_blocks_further_calls(srv, ledger):
    g = make_gateway(srv, ledger, ENV, verify_model=False)
    budget = Budget(max_input_tokens_per_round=10_000, max_output_tokens_per_round=10_000, max_total_tokens=100_000)
    srv.push(content="x" * 5_000_000, completion_tokens=1_300_000)  # a 5 MB reply, billed as 1.3 M tokens
    res = g.chat("suggest", MSG, max_tokens=1000, budget=budget, ctx=CallContext(scope=BudgetScope("big"), round=1))
    assert res.truncated and res.completion_tokens == 1_300_000  # recorded as billed
    for rnd, role in ((1, "suggest"), (2, "suggest"), (0, "report")):
        with pytest.raises(BudgetExceeded, match="sweep blocked"):
            g.chat(role, [{"role": "user", "content": f"round {rnd}"}], max_tokens=100, budget=budget,
                   ctx=CallContext(scope=BudgetScope("big"), round=rnd))
    assert len(srv.chat_requests()) == 1
    over = ledger.usage.overshoot("big")
    assert over.output == 1_300_000 - 1000 and over.calls == 1
    # the CLI's question, through the same rule: did this sweep exceed its budget, which limit, by how much?
    assert [(b.kind, b.limit, b.by) for b in budget_report(ledger, budget, "big").breaches] == [
        ("round", "max_output_tokens_per_round", 1_300_000 - 10_000),
        ("sweep", "max_total_tokens", res.prompt_tokens + 1_300_000 - 100_000),
        ("overshoot", "reservation", over.tokens)]
    assert budget_report(ledger, budget, "never-ran").breaches == []


def test_max_tokens_is_lowered_to_what_the_round_has_left(srv, ledger):
    g = make_gateway(srv, ledger, ENV, min_output_tokens=100)
    budget = Budget(max_input_tokens_per_round=10_000, max_output_tokens_per_round=500, max_total_tokens=100_000)
    ctx = CallContext(scope=BudgetScope("s"), round=1)
    srv.push(content="[]", completion_tokens=300)
    g.chat("suggest", MSG, max_tokens=400, budget=budget, ctx=ctx)
    srv.push(content="[]", completion_tokens=150)
    res = g.chat("suggest", [{"role": "user", "content": "again"}], max_tokens=400, budget=budget, ctx=ctx)
    assert srv.chat_requests()[1].body["max_tokens"] == 200 == res.max_tokens  # 500 - 300 left in the round
    with pytest.raises(BudgetExceeded, match=r"round 1 output: 450 used \+ 100 requested > max_output_tokens_per_round 500 \(by 50\)"):
        g.chat("suggest", [{"role": "user", "content": "a third"}], max_tokens=400, budget=budget, ctx=ctx)


def test_max_tokens_is_lowered_to_what_the_sweep_has_left(srv, ledger):
    g = make_gateway(srv, ledger, ENV, min_output_tokens=50)
    budget = Budget(max_input_tokens_per_round=10_000, max_output_tokens_per_round=10_000, max_total_tokens=400)
    srv.push(content="[]", prompt_tokens=5, completion_tokens=200)
    g.chat("suggest", MSG, max_tokens=300, budget=budget, ctx=CallContext(scope=BudgetScope("t"), round=1))
    report = [{"role": "user", "content": "write the summary"}]
    g.chat("report", report, max_tokens=300, budget=budget, ctx=CallContext(scope=BudgetScope("t"), round=0))
    sent = srv.chat_requests()[1].body["max_tokens"]
    assert sent == 400 - 205 - estimate_messages_tokens(report)  # never more than the sweep has left
    assert sum(ledger.usage.spend("t").round_use(0)) <= sent + estimate_messages_tokens(report)
