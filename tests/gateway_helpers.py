"""Gateway helpers for the tests: a real gateway on the fake server, and the spawned-process workers.

The fake server itself is ``kregress.testing.fake_gateway`` (shared with bench/); what here builds a gateway
imports ``resources`` and so stays with the tests.
"""

from __future__ import annotations

from typing import Any, Callable

from kregress.testing.fake_gateway import FakeClock, FakeOpenAI


def make_gateway(srv: FakeOpenAI, ledger: Any, env: dict[str, str], clock: FakeClock | None = None, **overrides: Any) -> Any:
    """A real gateway (real openai SDK) pointed at the fake server, with an injected clock and sleep."""
    import random

    from resources.taotoken import TaotokenResource

    fields = {"base_url": srv.root, "model_id": srv.models[0], "backoff_base_s": 1.0, "read_timeout_s": 5.0, "connect_timeout_s": 2.0}
    fields.update({k: v for k, v in overrides.items() if k not in ("log",)})
    res = TaotokenResource(**fields)
    clock = clock or FakeClock()
    return res.get_gateway(ledger, environ=env, sleep=clock.sleep, clock=clock, rng=random.Random(7), log=overrides.get("log"))


def run_spawned(target: Callable[..., None], arglists: list[tuple[Any, ...]], timeout_s: float = 120.0) -> list[Any]:
    """Run ``target(*args, queue)`` in one spawned process per ``args``; returns what each put on the queue."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args, q)) for args in arglists]
    for p in procs:
        p.start()
    results = [q.get(timeout=timeout_s) for _ in procs]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0, p.exitcode
    return results


def budget_race_worker(root: str, ledger_target: str, wid: int, total: int, out: Any) -> None:
    """One process of a shared-budget race: up to 40 suggest calls against ``total`` tokens of the sweep
    "shared" in the ledger at ``ledger_target`` (a SQLite path or a PostgreSQL URL). Puts
    ``(wid, ok, refused)`` on ``out``, or the error text, so the parent never hangs."""
    import random

    from kregress.core.budget import BudgetScope
    from kregress.core.spec import Budget
    from resources.ledger import BudgetExceeded, Ledger
    from resources.taotoken import CallContext, TaotokenResource

    try:
        g = TaotokenResource(base_url=root, model_id="kregress-test-model", verify_model=False).get_gateway(
            Ledger(ledger_target), environ={"TAOTOKEN_API_KEY": "sk" "-budget-test-key-000000000000"},
            sleep=FakeClock().sleep, rng=random.Random(wid))
        budget = Budget(max_input_tokens_per_round=10**6, max_output_tokens_per_round=10**6, max_total_tokens=total)
        ok = refused = 0
        for i in range(40):
            msgs = [{"role": "user", "content": f"worker {wid} call {i}: propose variants for the gemm sweep"}]
            try:
                g.chat("suggest", msgs, max_tokens=100, budget=budget, ctx=CallContext(scope=BudgetScope("shared"), round=1))
                ok += 1
            except BudgetExceeded:
                refused += 1
                if refused >= 3:
                    break
        out.put((wid, ok, refused))
    except Exception as e:  # noqa: BLE001 - report, do not hang the parent
        out.put(f"{type(e).__name__}: {e}")


def overshoot_worker(root: str, ledger_target: str, wid: int, out: Any) -> None:
    """One process of the over-reporting race: its own sweep ``over-<wid>``, 3 rounds of up to 5 suggest calls
    each, against a server that bills more than the gateway reserved. Puts ``(wid, sent, refused, reasons)``."""
    import random

    from kregress.core.budget import BudgetScope
    from kregress.core.spec import Budget
    from resources.ledger import BudgetExceeded, Ledger
    from resources.taotoken import CallContext, TaotokenResource

    try:
        g = TaotokenResource(base_url=root, model_id="kregress-test-model", verify_model=False, min_output_tokens=16).get_gateway(
            Ledger(ledger_target), environ={"TAOTOKEN_API_KEY": "sk" "-overshoot-test-key-0000000000"},
            sleep=FakeClock().sleep, rng=random.Random(wid))
        budget = Budget(max_input_tokens_per_round=1000, max_output_tokens_per_round=1000, max_total_tokens=100_000)
        sent = refused = 0
        reasons: list[str] = []
        for rnd in (1, 2, 3):
            for i in range(5):
                msgs = [{"role": "user", "content": f"worker {wid} round {rnd} call {i}: propose variants for the gemm sweep"}]
                try:
                    g.chat("suggest", msgs, max_tokens=100, budget=budget, ctx=CallContext(scope=BudgetScope(f"over-{wid}"), round=rnd))
                    sent += 1
                except BudgetExceeded as e:
                    refused += 1
                    reasons.append(e.reason)
        out.put((wid, sent, refused, reasons))
    except Exception as e:  # noqa: BLE001 - report, do not hang the parent
        out.put(f"{type(e).__name__}: {e}")


def cooldown_worker(root: str, ledger_target: str, keys: str, out: Any) -> None:
    """A second run: one suggest call with ``keys``; puts the alias that answered (or the error text)."""
    from resources.ledger import Ledger
    from resources.taotoken import TaotokenResource

    try:
        g = TaotokenResource(base_url=root, model_id="kregress-test-model", verify_model=False).get_gateway(
            Ledger(ledger_target), environ={"TAOTOKEN_KEY_SUGGEST": keys}, sleep=FakeClock().sleep)
        res = g.chat("suggest", [{"role": "user", "content": "second run"}], use_cache=False)
        out.put(res.key_alias)
    except Exception as e:  # noqa: BLE001 - report, do not hang the parent
        out.put(f"{type(e).__name__}: {e}")
