"""The token_usage asset and the token_budget asset check (the ledger, seen from Dagster).

``build_token_assets(partitions_def, load_spec)`` returns ``[token_usage, token_budget]``:

- ``token_usage`` (partitioned like the sweep): the reconciliation table of this run's sweep (its budget scope:
  calls, ok, errors, cache hits, input, output, total per role and key alias) as table metadata, the same
  over every sweep of the partition, and the numbers (input/output/total tokens, calls, cache hits).
- ``token_budget`` (asset check on token_usage): spend against the spec's budget per round
  (``max_input_tokens_per_round``, ``max_output_tokens_per_round``) and per sweep (``max_total_tokens``), as
  ``kregress.core.budget.breaches`` judges it: the same rule as the CLI's exit code and ``kregress usage``.

Both read the run's budget scope, ``budget_scope(root run id, partition)``: the one every model call of the
sweep counted against. Materialized on its own (a run that made no calls), the check judges that run and
passes; the all-sweeps table still shows what the partition spent before.

Inside the sweep job (``report_key="verdict_report"``) both read the run's budget and budget scope from
the verdict report's output, where the bound spec put them: the spec is never read or validated again.
Standalone (``load_spec(partition_key) -> TaskSpec``) they read the spec and judge this run's own scope.
"""


from typing import Any, Callable, Iterable, Sequence

import dagster as dg

from kernel_assets.usage import budget_report, totals_row
from kregress.core.budget import BudgetScope, budget_scope
from kregress.core.spec import TaskSpec
from resources.ledger import RECONCILE_COLUMNS as NUMERIC
from resources.ledger import Ledger


def table_metadata(rows: list[dict[str, Any]], group_by: Sequence[str]) -> dg.TableMetadataValue:
    cols = [dg.TableColumn(g, "string") for g in group_by] + [dg.TableColumn(c, "int") for c in NUMERIC]
    records = [
        dg.TableRecord({**{g: ("" if r.get(g) is None else str(r.get(g))) for g in group_by}, **{c: int(r.get(c) or 0) for c in NUMERIC}})
        for r in rows
    ]
    return dg.MetadataValue.table(records=records, schema=dg.TableSchema(columns=cols))


def usage_metadata(ledger: Ledger, scope: BudgetScope, group_by: Sequence[str] = ("role", "key_alias")) -> dict[str, Any]:
    """What token_usage shows for one sweep's scope (usable without Dagster, e.g. in tests or the report)."""
    sweep, partition = scope.sweep, scope.partition
    latest = ledger.usage.reconcile(group_by, sweep=sweep)
    every = ledger.usage.reconcile(group_by, partition=partition)
    by_round = ledger.usage.reconcile(("round", "role"), sweep=sweep)
    t_latest = totals_row(latest, list(group_by))
    t_all = totals_row(every, list(group_by))
    return {
        "sweep": dg.MetadataValue.text(sweep + ("" if latest else " (no model calls)")),
        "reconciliation": table_metadata(latest + ([t_latest] if latest else []), group_by),
        "reconciliation_by_round": table_metadata(by_round, ("round", "role")),
        "reconciliation_all_sweeps": table_metadata(every + ([t_all] if every else []), group_by),
        "calls": dg.MetadataValue.int(t_latest["calls"]),
        "cache_hits": dg.MetadataValue.int(t_latest["cache_hits"]),
        "errors": dg.MetadataValue.int(t_latest["errors"]),
        "input_tokens": dg.MetadataValue.int(t_latest["input"]),
        "output_tokens": dg.MetadataValue.int(t_latest["output"]),
        "total_tokens": dg.MetadataValue.int(t_latest["total"]),
        "total_tokens_all_sweeps": dg.MetadataValue.int(t_all["total"]),
    }


def budget_check_result(ledger: Ledger, spec: TaskSpec, scope: BudgetScope) -> dg.AssetCheckResult:
    rep = budget_report(ledger, spec.budget, scope.sweep)
    meta: dict[str, Any] = {
        "sweep": dg.MetadataValue.text(scope.sweep),
        "total_tokens": dg.MetadataValue.int(rep.total),
        "max_total_tokens": dg.MetadataValue.int(rep.total_limit),
        "max_input_tokens_per_round": dg.MetadataValue.int(spec.budget.max_input_tokens_per_round),
        "max_output_tokens_per_round": dg.MetadataValue.int(spec.budget.max_output_tokens_per_round),
        "refused_calls": dg.MetadataValue.int(len(rep.refusals)),
        "overshoot_tokens": dg.MetadataValue.int(rep.overshoot.tokens),
        "per_round": dg.MetadataValue.md(rep.markdown()),
    }
    if rep.rounds:
        cols = [dg.TableColumn(c, t) for c, t in (("round", "int"), ("input", "int"), ("input_limit", "int"), ("output", "int"),
                                                  ("output_limit", "int"), ("calls", "int"), ("refused", "int"), ("ok", "bool"))]
        meta["spend_vs_budget"] = dg.MetadataValue.table(records=[dg.TableRecord(r) for r in rep.table()], schema=dg.TableSchema(columns=cols))
    desc = "within budget" if rep.passed else "over budget: " + "; ".join(b.text for b in rep.breaches)
    meta["result"] = dg.MetadataValue.text(desc + (f"; {len(rep.refusals)} call(s) refused before sending" if rep.refusals else ""))
    return dg.AssetCheckResult(passed=rep.passed, severity=dg.AssetCheckSeverity.ERROR, metadata=meta)


def build_token_assets(
    partitions_def: dg.PartitionsDefinition | None,
    load_spec: Callable[[str], TaskSpec] | None = None,
    *,
    ledger_resource_key: str = "ledger",
    group_name: str = "tokens",
    deps: Iterable[Any] = (),
    report_key: str | None = None,
) -> list[Any]:
    """[token_usage asset, token_budget asset check]; ``deps`` e.g. the verdict_report asset (run after the sweep).

    With ``report_key`` the asset and the check take that asset's output (a mapping with the run's
    ``spec`` and ``budget_scope``) as an input instead of calling ``load_spec``."""
    if (load_spec is None) == (report_key is None):
        raise ValueError("build_token_assets: pass exactly one of load_spec and report_key")
    ins = {"report": dg.AssetIn(report_key)} if report_key else {}

    def _scope(context, partition: str, report: dict | None) -> BudgetScope:
        """The run's budget scope: the one its binding carried (in the verdict report), else this run's."""
        return (report or {}).get("budget_scope") or budget_scope(context.run.root_run_id or context.run.run_id, partition)

    def _spec(partition: str, report: dict | None) -> TaskSpec:
        return report["spec"] if report is not None else load_spec(partition)

    def usage(context: dg.AssetExecutionContext, report: dict | None) -> dg.MaterializeResult:
        ledger: Ledger = getattr(context.resources, ledger_resource_key).get_ledger()
        partition = context.partition_key if context.has_partition_key else ""
        meta = usage_metadata(ledger, _scope(context, partition, report))
        context.log.info(f"token usage for {partition or '(unpartitioned)'}: {meta['total_tokens'].value} tokens in {meta['calls'].value} calls")
        return dg.MaterializeResult(metadata=meta)

    def budget(context: dg.AssetCheckExecutionContext, report: dict | None) -> dg.AssetCheckResult:
        ledger: Ledger = getattr(context.resources, ledger_resource_key).get_ledger()
        partition = context.partition_key if context.has_partition_key else ""
        return budget_check_result(ledger, _spec(partition, report), _scope(context, partition, report))

    asset_args = dict(
        name="token_usage", partitions_def=partitions_def, group_name=group_name,
        required_resource_keys={ledger_resource_key}, deps=list(deps), ins=ins,
        description="The token ledger of this run's sweep: calls and tokens per role and key alias (never keys).",
    )
    if report_key:
        @dg.asset(**asset_args)
        def token_usage(context: dg.AssetExecutionContext, report) -> dg.MaterializeResult:
            return usage(context, report)
    else:
        @dg.asset(**asset_args)
        def token_usage(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
            return usage(context, None)

    check_args = dict(
        asset=token_usage, name="token_budget", partitions_def=partitions_def,
        required_resource_keys={ledger_resource_key}, additional_ins=ins,
        description="Spend vs the spec's budget, per round and per sweep (settled usage + in-flight reservations).",
    )
    if report_key:
        @dg.asset_check(**check_args)
        def token_budget(context: dg.AssetCheckExecutionContext, report) -> dg.AssetCheckResult:
            return budget(context, report)
    else:
        @dg.asset_check(**check_args)
        def token_budget(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
            return budget(context, None)

    return [token_usage, token_budget]
