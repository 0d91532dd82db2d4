"""How the token ledger is shown: spend against a budget per round, the reconciliation table, CSV.

Used by ``kregress usage`` (kernel_assets/cli_usage.py), ``kregress sweep``'s exit code (kernel_assets/cli.py)
and the token assets (kernel_assets/tokens.py). Whether a sweep is over budget is decided in one place,
``kregress.core.budget.breaches``; this module only lays its typed breaches out beside the spend.
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from kregress.core.budget import Breach, Overshoot, breaches, round_breaches
from kregress.core.spec import Budget
from resources.ledger import RECONCILE_COLUMNS, Ledger


@dataclass
class RoundSpend:
    round: int
    input: int
    output: int
    input_limit: int | None  # None: no per-round limit (round 0: the report/review calls)
    output_limit: int | None
    in_flight: int = 0
    refused: int = 0
    calls: int = 0
    breaches: list[Breach] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.breaches


@dataclass
class BudgetReport:
    sweep: str | None
    rounds: list[RoundSpend] = field(default_factory=list)
    total: int = 0
    total_limit: int = 0
    refusals: list[dict[str, Any]] = field(default_factory=list)
    overshoot: Overshoot = field(default_factory=Overshoot)  # usage billed beyond the reservations
    breaches: list[Breach] = field(default_factory=list)  # kregress.core.budget.breaches: what is over, by how much

    @property
    def passed(self) -> bool:
        return not self.breaches

    def table(self) -> list[dict[str, Any]]:
        return [
            {"round": r.round, "input": r.input, "input_limit": r.input_limit if r.input_limit is not None else -1,
             "output": r.output, "output_limit": r.output_limit if r.output_limit is not None else -1,
             "calls": r.calls, "refused": r.refused, "ok": r.ok}
            for r in self.rounds
        ]

    def markdown(self) -> str:
        lines = [
            f"Sweep `{self.sweep}`: {self.total} / {self.total_limit} tokens ({'within' if self.total <= self.total_limit else 'OVER'} budget)",
            "",
            "| round | input | input limit | output | output limit | calls | refused | ok |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in self.rounds:
            lim_in = "-" if r.input_limit is None else str(r.input_limit)
            lim_out = "-" if r.output_limit is None else str(r.output_limit)
            lines.append(f"| {r.round} | {r.input} | {lim_in} | {r.output} | {lim_out} | {r.calls} | {r.refused} | {'yes' if r.ok else 'NO'} |")
        for b in self.breaches:
            if b.kind == "overshoot":
                lines.append(f"- OVERSHOOT: {b.text}; every later call of the sweep was refused")
            elif b.kind != "round":
                lines.append(f"- OVER: {b.text}")
        for ref in self.refusals:
            lines.append(f"- refused (round {ref['round']}, {ref['role']}): {ref['reason']}")
        return "\n".join(lines)


def budget_report(ledger: Ledger, budget: Budget, sweep: str | None) -> BudgetReport:
    """Spend against budget per round for one sweep (a budget scope's ``sweep``), with the typed breaches.

    Spend counts settled usage plus in-flight reservations at their estimate. A sweep with no calls (or
    ``sweep=None``) reports zero spend and passes; an overshoot, or a budget that refused every prompt, fails.
    """
    rep = BudgetReport(sweep=sweep, total_limit=budget.max_total_tokens)
    if sweep is None:
        return rep
    spend = ledger.usage.spend(sweep)
    rep.breaches = breaches(budget, spend)
    for r in ledger.usage.spend_by_round(sweep):
        per_round = r.round >= 1
        rep.rounds.append(RoundSpend(
            round=r.round, input=r.input, output=r.output,
            input_limit=budget.max_input_tokens_per_round if per_round else None,
            output_limit=budget.max_output_tokens_per_round if per_round else None,
            in_flight=r.in_flight, refused=r.refused, calls=r.calls, breaches=round_breaches(rep.breaches, r.round),
        ))
    rep.total = spend.total
    rep.refusals = ledger.usage.refusals(sweep)
    rep.overshoot = spend.overshoot
    return rep


def write_csv(path: str | os.PathLike, rows: list[dict[str, Any]], columns: Sequence[str] | None = None) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    cols = list(columns or (rows[0].keys() if rows else []))
    with p.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        for r in rows:
            w.writerow({c: r.get(c) for c in cols})


def totals_row(table: list[dict[str, Any]], group_by: Sequence[str]) -> dict[str, Any]:
    row: dict[str, Any] = {g: "" for g in group_by}
    if group_by:
        row[group_by[0]] = "TOTAL"
    for k in RECONCILE_COLUMNS:
        row[k] = sum(int(r.get(k) or 0) for r in table)
    return row


def format_table(rows: list[dict[str, Any]], columns: Sequence[str] | None = None) -> str:
    """Plain-text table (right-aligned numbers), for the CLI and logs."""
    if not rows:
        return "(no model calls recorded)"
    cols = list(columns or rows[0].keys())
    cells = [[("" if r.get(c) is None else str(r.get(c))) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    numeric = [all(isinstance(r.get(c), (int, float)) and not isinstance(r.get(c), bool) or r.get(c) in ("", None) for r in rows) for c in cols]

    def fmt(vals: list[str]) -> str:
        return "  ".join(v.rjust(w) if num else v.ljust(w) for v, w, num in zip(vals, widths, numeric)).rstrip()

    out = [fmt(cols), "  ".join("-" * w for w in widths)]
    out += [fmt(r) for r in cells]
    return "\n".join(out)
