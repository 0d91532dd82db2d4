"""The token_usage asset and the token_budget asset check (the ledger, seen from Dagster).

``build_token_assets(partitions_def, load_spec)`` returns ``[token_usage, token_budget]``:

- ``token_usage`` (partitioned like the sweep): the reconciliation table of the partition's latest sweep
  (calls, ok, errors, cache hits, input, output, total per role and key alias) as table metadata, the same
  over every sweep of the partition, and the numbers (input/output/total tokens, calls, cache hits).
- ``token_budget`` (asset check on token_usage): spend against the spec's budget per round
  (``max_input_tokens_per_round``, ``max_output_tokens_per_round``) and per sweep (``max_total_tokens``).

Inside the sweep job (``report_key="verdict_report"``) both read the run's budget and budget scope from
the verdict report's output, where the bound spec put them: the spec is never read or validated again.
Standalone (``load_spec(partition_key) -> TaskSpec``) they read the spec and the partition's latest sweep.
"""


from typing import Any, Callable, Iterable, Sequence

import dagster as dg

from kregress.core.spec import TaskSpec
from kernel_assets.usage import budget_report, totals_row
from resources.ledger import RECONCILE_COLUMNS as NUMERIC
from resources.ledger import Ledger


def table_metadata(rows: list[dict[str, Any]], group_by: Sequence[str]) -> dg.TableMetadataValue:
    cols = [dg.TableColumn(g, "string") for g in group_by] + [dg.TableColumn(c, "int") for c in NUMERIC]
    records = [
        dg.TableRecord({**{g: ("" if r.get(g) is None else str(r.get(g))) for g in group_by}, **{c: int(r.get(c) or 0) for c in NUMERIC}})
        for r in rows
    ]
    return dg.MetadataValue.table(records=records, schema=dg.TableSchema(columns=cols))


def usage_metadata(ledger: Ledger, partition: str, group_by: Sequence[str] = ("role", "key_alias"),
                   sweep: str | None = None) -> dict[str, Any]:
    """What token_usage shows for one partition (usable without Dagster, e.g. in tests or the report);
    ``sweep``: the budget scope to show (default: the partition's latest)."""
    sweep = sweep or ledger.latest_sweep(partition)
    latest = ledger.reconcile(group_by, partition=partition, sweep=sweep) if sweep else []
    every = ledger.reconcile(group_by, partition=partition)
    by_round = ledger.reconcile(("round", "role"), partition=partition, sweep=sweep) if sweep else []
    t_latest = totals_row(latest, list(group_by))
    t_all = totals_row(every, list(group_by))
    return {
        "sweep": dg.MetadataValue.text(sweep or "(no model calls)"),
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


def budget_check_result(ledger: Ledger, spec: TaskSpec, partition: str, sweep: str | None = None) -> dg.AssetCheckResult:
    rep = budget_report(ledger, spec.budget, partition=partition, sweep=sweep or None)
    meta: dict[str, Any] = {
        "sweep": dg.MetadataValue.text(rep.sweep or "(no model calls)"),
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
    over = [r.round for r in rep.rounds if not r.ok]
    parts = ([f"rounds {', '.join(map(str, over))}"] if over else []) + (["sweep total"] if rep.total > rep.total_limit else []) + (
        [f"overshoot: {rep.overshoot.tokens} tokens billed beyond reservations"] if rep.overshoot else [])
    desc = "within budget" if rep.passed else "over budget: " + " and ".join(parts)
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

    def _run_spec(partition: str, report: dict | None) -> tuple[TaskSpec, str | None]:
        if report is not None:
            return report["spec"], report.get("budget_scope") or None
        return load_spec(partition), None

    def usage(context: dg.AssetExecutionContext, report: dict | None) -> dg.MaterializeResult:
        ledger: Ledger = getattr(context.resources, ledger_resource_key).get_ledger()
        partition = context.partition_key if context.has_partition_key else ""
        meta = usage_metadata(ledger, partition, sweep=report.get("budget_scope") if report else None)
        context.log.info(f"token usage for {partition or '(unpartitioned)'}: {meta['total_tokens'].value} tokens in {meta['calls'].value} calls")
        return dg.MaterializeResult(metadata=meta)

    def budget(context: dg.AssetCheckExecutionContext, report: dict | None) -> dg.AssetCheckResult:
        ledger: Ledger = getattr(context.resources, ledger_resource_key).get_ledger()
        partition = context.partition_key if context.has_partition_key else ""
        spec, scope = _run_spec(partition, report)
        return budget_check_result(ledger, spec, partition, sweep=scope)

    asset_args = dict(
        name="token_usage", partitions_def=partitions_def, group_name=group_name,
        required_resource_keys={ledger_resource_key}, deps=list(deps), ins=ins,
        description="The token ledger of this spec's latest sweep: calls and tokens per role and key alias (never keys).",
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
