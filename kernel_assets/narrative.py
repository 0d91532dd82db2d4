"""The verdict report's narrative (role report: once per sweep, never every round), token table and forecast section."""

from __future__ import annotations

import pandas as pd

from kernel_assets.report import _md_table, tables
from kregress.core import forecast
from kregress.core.budget import BudgetScope, budget_scope
from kregress.core.records import Verdict


def narrative_for(context, spec, state, verdicts: dict[str, Verdict],
                  scope: BudgetScope | None = None) -> tuple[str, str, pd.DataFrame | None]:
    """(narrative, source, token_table). With no report key the narrative is a plain written summary
    and its source says so; the token table reconciles this run's model calls by role and key alias.
    ``scope``: the run's budget scope (made once, by the run context); without one, the scope of the run's root."""
    from kernel_assets.agent.llm import write_narrative

    ledger = context.resources.ledger.get_ledger()
    gateway = context.resources.taotoken.get_gateway(ledger, log=context.log)
    _, verdict_df, _ = tables(state.history, verdicts, [])
    md = _md_table(verdict_df, ["variant_id", "config_label", "verdict", "ratio", "evidence", "reasons"]) if len(verdict_df) else ""
    try:
        scope = scope or budget_scope(context.run.root_run_id or context.run_id, context.partition_key)
        text, source = write_narrative(gateway, spec, md, scope=scope)
    finally:
        gateway.close()
    rows = ledger.usage.reconcile(group_by=("role", "key_alias", "model"), run_id=context.run_id)
    return text, source, pd.DataFrame(rows) if rows else None


def suggest_models(ledger, run_id: str) -> dict[int, str]:
    """round -> the model that answered that round's suggest call in this run (from the ledger's ok rows)."""
    return {r.round: r.model for r in ledger.usage.rows(run_id=run_id, role="suggest", status="ok") if r.model}


def forecast_section(context, state) -> str:
    """The report's forecast section: each forecast beside its measurement, and calibration per policy and model."""
    return forecast.section(state.history, suggest_models(context.resources.ledger.get_ledger(), context.run_id))
