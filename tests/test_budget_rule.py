"""The one budget rule (kregress.core.budget): a spend in, typed breaches out; what a reservation is granted."""

from __future__ import annotations

from kregress.core.budget import Breach, BudgetScope, Overshoot, Request, Spend, admit, breaches, budget_scope
from kregress.core.spec import Budget

B = Budget(max_input_tokens_per_round=1000, max_output_tokens_per_round=500, max_total_tokens=2000)


def test_a_spend_within_budget_has_no_breach():
    assert breaches(B, Spend(rounds={0: (300, 100), 1: (1000, 500)}, calls=2, round_calls=1)) == []


def test_each_limit_is_a_typed_breach_with_how_much():
    spend = Spend(rounds={1: (1200, 400), 2: (900, 650), 0: (100, 50)}, calls=3, round_calls=2)
    found = breaches(B, spend)
    assert [(b.kind, b.limit, b.round, b.used, b.allowed, b.by) for b in found] == [
        ("round", "max_input_tokens_per_round", 1, 1200, 1000, 200),
        ("round", "max_output_tokens_per_round", 2, 650, 500, 150),
        ("sweep", "max_total_tokens", None, 3300, 2000, 1300),
    ]
    assert found[0].text == "round 1 input 1200 > max_input_tokens_per_round 1000 (by 200)"
    assert found[2].text == "sweep total 3300 > max_total_tokens 2000 (by 1300)"


def test_an_overshoot_is_a_breach_inside_every_limit_and_blocks_admission():
    over = Overshoot(calls=1, input=300, output=0, first_round=1)
    spend = Spend(rounds={1: (400, 50)}, overshoot=over, calls=1, round_calls=1)
    (b,) = breaches(B, spend)
    assert (b.kind, b.limit, b.by) == ("overshoot", "reservation", 300)
    assert b.text.startswith("overshoot: 1 call(s) from round 1 on were billed 300 tokens beyond their reservation")
    refused = admit(B, spend, Request(round=2, input=1, output=1))
    assert not refused.ok and refused.refused[0].kind == "overshoot"


def test_a_budget_that_refused_every_suggest_prompt_is_a_breach_a_refused_report_is_not():
    first = Breach("round", "max_input_tokens_per_round", 0, 50, requested=700, round=1)
    (b,) = breaches(B, Spend(rounds={0: (150, 20), 1: (0, 0)}, calls=1, round_calls=0, refusals=(first,)))
    assert b.kind == "refused" and b.refusal == first and b.calls == 1
    assert b.text.startswith("the budget refused every suggest prompt (1 refused, none sent): round 1 input: 0 used + 700 requested")
    # a suggest call went out: the budget held later prompts back, which is its job
    assert breaches(B, Spend(rounds={1: (10, 10)}, calls=1, round_calls=1, refusals=(first,))) == []
    report = Breach("sweep", "max_total_tokens", 1990, 2000, requested=300, round=0)
    assert breaches(B, Spend(rounds={1: (10, 10)}, calls=1, round_calls=1, refusals=(report,))) == []


def test_admission_lowers_max_tokens_to_what_is_left_and_refuses_below_the_floor():
    spend = Spend(rounds={1: (100, 300)})
    assert admit(B, spend, Request(round=1, input=100, output=400, min_output=100)).output == 200  # the round's output left
    assert admit(B, Spend(rounds={0: (1500, 0)}), Request(round=0, input=100, output=1000, min_output=100)).output == 400
    no = admit(B, spend, Request(round=1, input=100, output=400, min_output=250))
    (b,) = no.refused
    assert (b.kind, b.limit, b.used, b.requested, b.by) == ("round", "max_output_tokens_per_round", 300, 250, 50)
    assert b.text == "round 1 output: 300 used + 250 requested > max_output_tokens_per_round 500 (by 50)"
    assert admit(None, spend, Request(round=1, input=10**9, output=10**9)).ok  # no budget: always fits


def test_breaches_round_trip_as_records():
    over = Overshoot(calls=2, input=10, output=5, first_round=3)
    for b in (Breach("round", "max_input_tokens_per_round", 5, 4, requested=3, round=2),
              Breach("overshoot", "reservation", 15, 0, round=3, calls=2, overshoot=over)):
        assert Breach.from_json(b.to_json()) == b


def test_one_scope_per_run():
    assert budget_scope("run-1", "gemm") == BudgetScope(sweep="run-1", partition="gemm", run_id="run-1")
    assert budget_scope("", "gemm").sweep == "gemm" and budget_scope("", "").sweep == "default"
