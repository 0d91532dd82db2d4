"""The asset graph of one sweep, generated for rounds 1..MAX_GRAPH_ROUNDS.

baseline_metrics -> round_k_suggestions -> round_k_variants -> round_k_profiles -> ... -> verdict_report
Each asset is partitioned by spec (task_id). Rounds past the spec's max_rounds, or after a stop rule
fires, do not run: they materialize marked skipped (metadata ``skipped`` with the reason, tag
``kregress/round: skipped``, no counts), so every partition has the same graph.

The spec is bound once per run (read, validated, bound to its family, its kernel hash read), by
baseline_metrics, and the ``BoundSpec`` is handed on inside the outputs (RoundState.bound,
Proposal.bound): no later step reads or validates the file again, and an edit to it mid-run never
changes the run.
"""


import hashlib
import time
import warnings
from dataclasses import dataclass, field
from enum import Enum
from types import SimpleNamespace
from typing import Any

import dagster as dg
import pandas as pd

from kernel_assets import history, sweep
from kernel_assets.agent import policy_for
from kernel_assets.agent.base import AgentContext, Proposal
from kernel_assets.constants import GROUP_BASELINE, GROUP_REPORT, GROUP_ROUNDS, OWNERS, ROUNDS, SPECS_PARTITIONS
from kernel_assets.executors import benchmark_op_tags, benchmark_pool, needs_tags
from kernel_assets.report import _md_table, evidence_of, evidence_text, latency_label, md_image, narrative_origin, overview_markdown, tables, verdict_records, write_report
from kernel_assets.specs_resource import SpecStore
from kregress.core import paths
from kregress.core.bind import BoundSpec
from kregress.core.budget import budget_scope
from kregress.core.family import CudaFamily, RecordedFamily, families
from kregress.core.names import STRATEGIES
from kregress.core.records import Suggestion, VariantResult, config_label
from resources.gpu import BenchmarkBackend, ReplayBackend, backend_for
from resources.ledger import LedgerResource
from resources.taotoken import TaotokenResource

# Every check is partitioned like its asset (a Dagster preview API), so each spec's result is its own in the UI.
warnings.filterwarnings("ignore", message="Specifying a partitions_def on an AssetCheckSpec")

# Benchmark steps: one slot of the pool of the device they time on (gpu/<host>/<device>, one benchmark per
# GPU at a time) and, under the k8s executor, a one-GPU pod on a node of the chosen GPU model.
BENCH_POOL = benchmark_pool()
GPU_OP_TAGS = {**benchmark_op_tags(), **needs_tags()}  # needs_tags: what the launcher checks of the host


def kernels_code_version() -> str:
    """Changes when what a family compiles changes (its jit functions' cache keys, its declared kernel
    files), so the UI marks the sweep assets stale; a docstring edit changes nothing."""
    h = hashlib.sha256()
    for name, fam in sorted(families().items()):
        if fam.lookup and fam.lookup != name:  # an import-path family cached by this process only
            continue
        h.update(name.encode())
        h.update(fam.source_hash().encode())
    return h.hexdigest()[:16]


CODE_VERSION = kernels_code_version()

StrategyOverride = Enum("StrategyOverride", {"spec": "spec", **{s: s for s in STRATEGIES}}, type=str)


class SuggestConfig(dg.Config):
    """Launchpad override of the spec's search strategy (``spec`` = use the spec's)."""

    strategy: StrategyOverride = StrategyOverride.spec


def _rows_md(rows: list[VariantResult]) -> str:
    if not rows:
        return "_no variants this round_"
    df, _, _ = tables(rows, {}, [])
    # as in report.md: an analytic estimate is never called a p50, and a column with nothing in it (compile
    # facts of recorded runs, errors of a round where nothing failed) is left out
    est = evidence_of(rows) == "model"
    headers = {"latency_p50_ms": latency_label("model"), "tflops": "est_tflops"} if est else {}
    cols = [c for c in ("variant_id", "config_label", "error", "latency_p50_ms", "tflops", "regs_per_thread", "spill_bytes",
                        "smem_bytes", "occupancy", "max_abs_err", "evidence")
            if c in ("variant_id", "latency_p50_ms") or (c in df and df[c].notna().any() and df[c].astype(str).ne("").any())]
    return _md_table(df, cols, headers=headers)


# A round the sweep did not run (max_rounds reached, or a stop rule fired) still materializes, as every
# partition has the same graph; its assets say it did not run, carry this tag, and count nothing.
SKIPPED_TAGS = {"kregress/round": "skipped"}


def _skipped_md(k: int, reason: str) -> dict:
    return {"skipped": f"round {k} did not run: {reason}"}


@dataclass(frozen=True)
class NotChecked:
    """A check that could not run on this evidence. No ``AssetCheckResult`` is yielded for it (the assets with
    checks are ``asset_with_checks``: optional check outputs; and generators: a returned ``MaterializeResult``
    must carry every check's result): Dagster keeps the
    check's execution PLANNED and, once the run has succeeded, resolves it SKIPPED (the UI draws it "Skipped",
    neither passed nor failed; a run that failed leaves it "Execution failed"). The reason is one click away:
    the asset's materialization metadata (``<check>: not checked``) and the run's log line."""

    check_name: str
    why: str
    task_id: str
    metadata: dict = field(default_factory=dict)

    @property
    def line(self) -> str:
        return f"check {self.check_name} not checked: {self.why}"


def not_checked(check_name: str, why: str, task_id: str, **metadata) -> NotChecked:
    """A check that could not run: never a pass, never a failure; see ``NotChecked``."""
    return NotChecked(check_name, why, task_id, dict(metadata))


def not_checked_key(check_name: str) -> str:
    """The materialization metadata key that carries why ``check_name`` was not checked."""
    return f"{check_name}: not checked"


def check_results(context: dg.AssetExecutionContext, md: dict, checks: list) -> list[dg.AssetCheckResult]:
    """The results to yield: the checks that ran. Each one that could not run puts its reason in ``md`` (the
    asset's metadata) and in the run's log, and yields nothing (see ``NotChecked``)."""
    out = []
    for c in checks:
        if isinstance(c, NotChecked):
            md[not_checked_key(c.check_name)] = c.why
            context.log.info(c.line)
        else:
            out.append(c)
    return out


# Recorded runs carry no compile facts: the constraints checks cannot run on a replay family.
NO_COMPILE_FACTS = "recorded runs carry no compile facts (registers, spills, shared memory)"


def _log_fn(context: dg.AssetExecutionContext):
    return lambda msg: context.log.info(msg)


def _bound(bound: BoundSpec | None, step: str) -> BoundSpec:
    """The run's bound spec, handed on by the previous step."""
    if bound is None:
        raise dg.Failure(description=f"{step}: the previous step handed on no bound spec; re-run the sweep from baseline_metrics")
    return bound


def asset_with_checks(name: str, *, description: str, group_name: str, kinds: set[str],
                      check_specs: list[dg.AssetCheckSpec], ins: dict | None = None, pool: str | None = None,
                      op_tags: dict | None = None):
    """``@dg.asset`` for a spec-partitioned asset whose checks may go unevaluated: a one-asset ``multi_asset``
    with ``can_subset=True``, which makes the check outputs optional (``@asset``'s are required), so a check
    that could not run yields no result (``NotChecked``). The asset's own output is still required."""
    return dg.multi_asset(
        name=name, ins=ins, partitions_def=SPECS_PARTITIONS, pool=pool, op_tags=op_tags, check_specs=check_specs,
        can_subset=True, description=description,
        outs={name: dg.AssetOut(description=description, group_name=group_name, code_version=CODE_VERSION,
                                kinds=kinds, owners=OWNERS, is_required=True)},
    )


@asset_with_checks(
    "baseline_metrics",
    description="Compile, correctness and latency of the spec's baseline config.",
    group_name=GROUP_BASELINE,
    pool=BENCH_POOL,
    op_tags=GPU_OP_TAGS,
    kinds={"triton", "pytorch"},
    check_specs=[
        dg.AssetCheckSpec("baseline_correct", asset="baseline_metrics", blocking=True, partitions_def=SPECS_PARTITIONS,
                          description="Baseline compiles and matches the float64 reference (blocks the sweep)."),
        dg.AssetCheckSpec("baseline_constraints", asset="baseline_metrics", partitions_def=SPECS_PARTITIONS,
                          description="Baseline registers, spills and shared memory within the spec's constraints."),
    ],
)
def baseline_metrics(context: dg.AssetExecutionContext, specs: SpecStore, bench: BenchmarkBackend,
                     replay: ReplayBackend, run_context: dg.ResourceParam[Any]):
    """Compile, correctness and latency of the spec's baseline config."""
    # the run's context, made once: its one binding of the spec, its budget scope (from the ROOT run id, so a
    # retried run keeps it) and its evidence backend; the binding (with the scope) travels on with the output
    run = run_context.open(context, specs, bench, replay)
    bound = run.bound
    spec, fam = bound.spec, bound.family
    sugg = Suggestion(variant_id="baseline", config=spec.baseline, patch_summary="the spec's baseline config",
                      source="baseline", round=0, risk="low")
    (row,), ev = backend_for(fam, bench, replay).evaluate(bound, [sugg], log=_log_fn(context))
    state = sweep.initial_state(row, bound)
    c = row.correctness
    md = {
        "backend": row.backend, "evidence": str(row.evidence), "config": config_label(row.config),
        "spec_hash": bound.spec_hash, "kernel_hash": bound.kernel_hash, "error": row.error or "none", "results": dg.MetadataValue.md(_rows_md([row])),
        **ev.as_metadata(),
    }
    if row.compile:
        md.update(regs_per_thread=row.compile.regs_per_thread, smem_bytes=row.compile.smem_bytes,
                  spill_bytes=row.compile.spill_bytes, occupancy=row.compile.occupancy)
    if state.best_value is not None:
        md["estimated_ms (model)" if row.evidence == "model" else "objective_ms"] = dg.FloatMetadataValue(state.best_value)
    # A recorded (replay) family has no kernel to re-check: its runs were validated when recorded.
    # A CUDA family on a CPU host has compile facts only (kernels/cuda): nothing to check, nothing blocked.
    facts_only = c is None and isinstance(fam, CudaFamily) and row.evidence is None
    correct = row.error is None and ((c is not None and c.ok) or (c is None and isinstance(fam, RecordedFamily)) or facts_only)
    check_md = {"error": row.error or "none"}
    if c is not None:
        check_md.update(max_abs_err=c.max_abs_err, max_rel_err=c.max_rel_err, shapes=", ".join(c.shapes_checked))
    violations = sweep.constraint_violations(row, spec)
    task = context.partition_key
    recorded = isinstance(fam, RecordedFamily)
    correct_check = (not_checked("baseline_correct", "recorded runs are not re-checked (they were validated when recorded)",
                                 task, error=row.error or "none") if recorded and correct and c is None else
                     not_checked("baseline_correct", row.error_detail or "compile facts only: correctness needs a GPU", task)
                     if facts_only and correct else
                     dg.AssetCheckResult(check_name="baseline_correct", passed=correct, severity=dg.AssetCheckSeverity.ERROR,
                                         description=sweep.failure_line(row) if not correct else None,
                                         metadata={"task_id": task, **check_md}))
    constraints_check = (not_checked("baseline_constraints", NO_COMPILE_FACTS, task) if recorded and row.compile is None else
                         dg.AssetCheckResult(check_name="baseline_constraints", passed=not violations,
                                             severity=dg.AssetCheckSeverity.WARN,
                                             description="; ".join(violations)[:500] or None,
                                             metadata={"task_id": task, "violating": len(violations),
                                                       "violations": "; ".join(violations) or "within every limit"}))
    yield dg.MaterializeResult(value=state, metadata=md,
                               check_results=check_results(context, md, [correct_check, constraints_check]))


def build_round(k: int):
    prev_key = "baseline_metrics" if k == 1 else f"round_{k - 1}_profiles"

    @dg.asset(
        name=f"round_{k}_suggestions", partitions_def=SPECS_PARTITIONS, group_name=GROUP_ROUNDS, code_version=CODE_VERSION,
        ins={"prev": dg.AssetIn(prev_key)}, kinds={"optuna", "openai"}, owners=OWNERS,
        description=f"Round {k}: the agent's proposals (validated JSON), or why the search stopped.",
    )
    def suggestions(context: dg.AssetExecutionContext, config: SuggestConfig,
                    taotoken: TaotokenResource, ledger: LedgerResource, prev: sweep.RoundState):
        bound = _bound(prev.bound, f"round_{k}_suggestions")
        spec, fam = bound.spec, bound.family
        strategy = spec.search.strategy if config.strategy == StrategyOverride.spec else config.strategy.value
        if prev.stopped or k > spec.search.max_rounds:
            reason = prev.stopped or f"max_rounds reached ({spec.search.max_rounds})"
            context.log.info(f"round {k} skipped: {reason}")
            return dg.MaterializeResult(value=Proposal(suggestions=[], notes=[f"round {k} skipped: {reason}"], bound=bound,
                                                       skipped=reason),
                                        metadata=_skipped_md(k, reason), tags=SKIPPED_TAGS)
        scope = bound.budget_scope or budget_scope(context.run.root_run_id or context.run_id, context.partition_key)
        ctx = AgentContext(
            spec=spec, family=fam, round=k, n=spec.search.variants_per_round, history=prev.history,
            objective=prev.objective, profile_summary=prev.summary, failures=prev.failures,
            run_id=context.run_id, partition=context.partition_key, log=context.log, scope=scope,
            feedback=[f"{d.reason}: {d.raw[:80]}" for d in prev.dropped if d.round == k - 1 and d.source == "llm"],
        )
        policy = policy_for(strategy, spec, SimpleNamespace(taotoken=taotoken, ledger=ledger, log=context.log, scope=scope))
        t0 = time.perf_counter()
        proposal = policy.propose(ctx)
        proposal.bound = bound
        if proposal.unusable is not None and not proposal.suggestions:
            context.log.warning(proposal.unusable.line(k, strategy))  # the round's one line: the cause and the fix
        # the forecasts, on record here, before round_k_variants measures anything
        df = pd.DataFrame([{"variant_id": s.variant_id, "config": config_label(s.config), "patch_summary": s.patch_summary,
                            "expected_speedup": s.expected_speedup, "expected_speedup_low": s.expected_speedup_low,
                            "expected_speedup_high": s.expected_speedup_high, "bottleneck": s.bottleneck,
                            "risk": s.risk, "source": s.source}
                           for s in proposal.suggestions])
        md = {
            "proposals": len(proposal.suggestions), "dropped": len(proposal.dropped), "strategy": strategy,
            "model": proposal.model or "-",
            "forecasts": dg.MetadataValue.json({s.variant_id: [s.expected_speedup, s.expected_speedup_low, s.expected_speedup_high]
                                                for s in proposal.suggestions}),
            "policy_seconds": round(time.perf_counter() - t0, 3),
            "table": dg.MetadataValue.md(_md_table(df, list(df.columns)) if len(df) else "_none_"),
            "notes": dg.MetadataValue.md("\n".join(f"- {n}" for n in proposal.notes) or "_none_"),
        }
        if proposal.dropped:
            md["dropped_reasons"] = dg.MetadataValue.md("\n".join(f"- {d.reason}" for d in proposal.dropped))
        for key, val in proposal.tokens.items():
            md[f"tokens_{key}"] = val
        return dg.MaterializeResult(value=proposal, metadata=md)

    @asset_with_checks(
        f"round_{k}_variants", group_name=GROUP_ROUNDS,
        pool=BENCH_POOL, op_tags=GPU_OP_TAGS, ins={"proposal": dg.AssetIn(f"round_{k}_suggestions")},
        kinds={"triton", "pytorch"},
        description=f"Round {k}: compile stats, correctness and latency of every proposal; failures are rows.",
        check_specs=[dg.AssetCheckSpec(f"round_{k}_constraints", asset=f"round_{k}_variants", partitions_def=SPECS_PARTITIONS,
                                       description="Variants within the register, spill and shared-memory limits.")],
    )
    def variants(context: dg.AssetExecutionContext, bench: BenchmarkBackend, replay: ReplayBackend,
                 proposal: Proposal):
        bound = _bound(proposal.bound, f"round_{k}_variants")
        spec, fam = bound.spec, bound.family
        task = context.partition_key
        if proposal.skipped is not None:  # the round did not run: say so, and check nothing
            md = _skipped_md(k, proposal.skipped)
            yield dg.MaterializeResult(value=[], metadata=md, tags=SKIPPED_TAGS, check_results=check_results(
                context, md, [not_checked(f"round_{k}_constraints", f"round {k} did not run ({proposal.skipped})", task)]))
            return
        rows, ev = ([], None)
        if proposal.suggestions:
            rows, ev = backend_for(fam, bench, replay).evaluate(bound, proposal.suggestions, log=_log_fn(context))
        errors = pd.Series([r.error for r in rows if r.error], dtype="object").value_counts().to_dict()
        md = {"variants": len(rows), "failed": sum(1 for r in rows if r.error), "errors": str(errors or "none"),
              "results": dg.MetadataValue.md(_rows_md(rows))}
        if ev:
            md.update(ev.as_metadata())
        bad = {r.variant_id: v for r in rows if (v := sweep.constraint_violations(r, spec))}
        compiled = [r for r in rows if r.compile is not None]
        if isinstance(fam, RecordedFamily) and not compiled:
            check = not_checked(f"round_{k}_constraints", NO_COMPILE_FACTS, task, variants=len(rows))
        elif not compiled and not bad:
            why = (f"none of the round's {len(rows)} variant(s) compiled: no registers, spills or shared memory to check"
                   if rows else "the round had no variant to measure")
            check = not_checked(f"round_{k}_constraints", why, task, variants=len(rows))
        else:
            check = dg.AssetCheckResult(
                check_name=f"round_{k}_constraints", passed=not bad, severity=dg.AssetCheckSeverity.WARN,
                description="; ".join(f"{v}: {', '.join(x)}" for v, x in bad.items())[:500] or None,
                metadata={"task_id": task, "violating": len(bad), "checked": len(compiled),
                          "details": dg.MetadataValue.md("\n".join(f"- {v}: {'; '.join(x)}" for v, x in bad.items())
                                                         or f"all {len(compiled)} compiled variant(s) within the limits")},
            )
        yield dg.MaterializeResult(value=rows, metadata=md, check_results=check_results(context, md, [check]))

    @dg.asset(
        name=f"round_{k}_profiles", partitions_def=SPECS_PARTITIONS, group_name=GROUP_ROUNDS, code_version=CODE_VERSION,
        ins={"prev": dg.AssetIn(prev_key), "proposal": dg.AssetIn(f"round_{k}_suggestions"),
             "rows": dg.AssetIn(f"round_{k}_variants")},
        kinds={"python"}, owners=OWNERS,
        description=f"Round {k}: the trimmed top-k profile the next prompt sees, the best so far and the stop rules.",
    )
    def profiles(context: dg.AssetExecutionContext, prev: sweep.RoundState, proposal: Proposal,
                 rows: list[VariantResult]):
        spec = _bound(prev.bound, f"round_{k}_profiles").spec
        if proposal.skipped is not None:  # the state passes through unchanged
            return dg.MaterializeResult(value=prev, metadata={**_skipped_md(k, proposal.skipped), "best_so_far": prev.best_id},
                                        tags=SKIPPED_TAGS)
        stop = proposal.stop_reason(k, "llm" if proposal.unusable is not None else "agent")
        state = sweep.advance(prev, spec, k, rows, proposal.dropped, proposal.notes, stop)
        state.bound = prev.bound
        md = {"best_variant": state.best_id, "rounds_without_improvement": state.rounds_without_improvement,
              "stopped": state.stopped or "no", "measured_so_far": len(state.history),
              "profile_summary": dg.MetadataValue.md(f"```\n{state.summary}\n```")}
        if state.best_value is not None:
            est = evidence_of(state.history) == "model"
            md["best_estimated_ms (model)" if est else "best_objective_ms"] = dg.FloatMetadataValue(state.best_value)
        return dg.MaterializeResult(value=state, metadata=md)

    return [suggestions, variants, profiles]


def _last_profiles_key() -> str:
    return f"round_{ROUNDS[-1]}_profiles"


@asset_with_checks(
    "verdict_report", description="PASS / REGRESS / NEEDS_REVIEW per variant with its evidence; report.md and Parquet tables.",
    group_name=GROUP_REPORT, ins={"state": dg.AssetIn(_last_profiles_key())}, kinds={"pandas", "parquet"},
    check_specs=[dg.AssetCheckSpec("regression_guard", asset="verdict_report", partitions_def=SPECS_PARTITIONS,
                                   description="The sweep's best config is correct, within constraints and not a regression."),
                 dg.AssetCheckSpec("baseline_vs_history", asset="verdict_report", partitions_def=SPECS_PARTITIONS,
                                   description="Today's baseline against the last accepted one (same device and versions).")],
)
def verdict_report(context: dg.AssetExecutionContext, taotoken: TaotokenResource,
                   ledger: LedgerResource, state: sweep.RoundState):
    """PASS / REGRESS / NEEDS_REVIEW per variant with its evidence; report.md and Parquet tables."""
    from kernel_assets.judge import verdict_with_gate
    from kernel_assets.narrative import forecast_section, narrative_for

    bound = _bound(state.bound, "verdict_report")
    spec, fam = bound.spec, bound.family
    baseline = state.history[0]
    verdicts = {r.variant_id: verdict_with_gate(r, baseline, spec, fam) for r in state.history[1:]}  # gate, then the rule
    narrative, source, token_table = narrative_for(context, spec, state, verdicts, scope=bound.budget_scope)
    forecasts = forecast_section(context, state)
    past = history.compare_baseline(spec, baseline)
    history_file = history.append_sweep(spec, context.run_id, state.history, verdicts, past.verdict)
    past_text = (f"**{past.verdict}**: {past.reason}" + (f" (ratio {past.ratio:.3f})" if past.ratio else "")
                 + f"\n\nThis sweep was appended to `{history_file}`.")
    out_dir = paths.reports_dir(spec.task_id)
    res = write_report(out_dir, spec, str(bound.source or ""), state, verdicts, list(fam.space.params),
                       narrative=narrative, narrative_source=source, token_table=token_table,
                       extra_sections=[("Baseline vs history", past_text), ("Forecasts", forecasts)], family=fam)
    counts = {k: int(res["counts"].get(k, 0)) for k in ("PASS", "REGRESS", "NEEDS_REVIEW")}
    summary = {"task_id": spec.task_id, "report_dir": str(out_dir), "counts": counts, "best": state.best_id,
               "stopped": state.stopped, "variants": len(state.history) - 1,
               "sources": {src: sum(1 for r in state.history[1:] if r.source == src) for src in {r.source for r in state.history[1:]}},
               # REGRESS split by cause, the line to print, and the headline best on its evidence
               "causes": res["causes"], "summary_line": res["summary_line"], "best_kind": res["best"]["kind"],
               "best_ties": res["best"]["ties"],
               # what the token assets read: the run's spec (its budget) and budget scope, never the file again
               "spec": spec, "budget_scope": bound.budget_scope}
    summary.update(evidence=res["evidence"], next_step=res["next_step"])
    view, vcols, vheads = res["verdict_view"]
    kinds, records = verdict_records(view, vcols)
    overview = overview_markdown(res["variants"], spec.regression_guard.not_worse_than_baseline_ratio)
    md = {
        "summary": res["summary_line"],
        "evidence": evidence_text(state.history),
        **({"next_step": res["next_step"]} if res["next_step"] else {}),
        **({"latency_overview": dg.MetadataValue.md(overview)} if overview else {}),
        # a table with a schema: the asset page shows it as a table, not behind a markdown dialog
        "verdicts": dg.MetadataValue.table(
            records=[dg.TableRecord(r) for r in records],
            schema=dg.TableSchema(columns=[dg.TableColumn(c, kind, description=vheads.get(c)) for c, kind in kinds])),
        "latency_plot": dg.MetadataValue.md(md_image(res["png"], "each variant's time relative to the baseline")),
        "latency_png": dg.MetadataValue.path(str(out_dir / "latency.png")),
        "report": dg.MetadataValue.path(str(out_dir / "report.md")),
        **{f"n_{k}": v for k, v in counts.items()},
        **{f"n_REGRESS_{c}": n for c, n in res["causes"].items()},
        "best_kind": res["best"]["kind"],
        "best_variant": state.best_id,
        "narrative_source": source,
        "narrative_by": narrative_origin(source),
        "baseline_vs_history": past.verdict,
    }
    best = next((r for r in state.history if r.variant_id == state.best_id), baseline)
    best_verdict = verdicts.get(best.variant_id)
    problems = sweep.constraint_violations(best, spec) + ([best.error] if best.error else [])
    if best_verdict is not None and best_verdict.verdict == "REGRESS":
        problems += best_verdict.reasons
    history_md = {"verdict": past.verdict, "reference_run": past.reference_run or "none"}
    if past.ratio is not None:  # no placeholder number when there is no reference to compare with
        history_md["ratio"] = past.ratio
    task = context.partition_key
    guard_md = {"best": best.variant_id, "verdict": best_verdict.verdict if best_verdict else "BASELINE",
                **{f"n_{k}": v for k, v in counts.items()}}
    if problems or evidence_of(state.history) == "measured":
        guard = dg.AssetCheckResult(check_name="regression_guard", passed=not problems, severity=dg.AssetCheckSeverity.WARN,
                                    description="; ".join(problems)[:500] or None,
                                    metadata={"task_id": task, "problems": "; ".join(problems) or "no problem found", **guard_md})
    else:  # correct and within constraints, but the guard compares timings and nothing was timed
        guard = not_checked("regression_guard", "nothing was timed (analytic estimates only; the guard compares cuda or "
                            "replay timings); the best variant is correct and within constraints", task, **guard_md)
    yield dg.MaterializeResult(value=summary, metadata=md, check_results=check_results(context, md, [
        guard,
        # nothing to compare with (a first sweep, or no timing today): not checked; undecided is a warning, never a pass
        not_checked("baseline_vs_history", past.reason, task, **history_md)
        if past.verdict == "NO_HISTORY" or (past.verdict == "NEEDS_REVIEW" and evidence_of([baseline]) != "measured")
        else dg.AssetCheckResult(check_name="baseline_vs_history", passed=past.verdict in ("PASS", "ACKNOWLEDGED"),
                                 severity=dg.AssetCheckSeverity.WARN, description=past.reason,
                                 metadata={"task_id": task, **history_md}),
    ]))


def build_sweep_assets() -> list:
    out = [baseline_metrics]
    for k in ROUNDS:
        out += build_round(k)
    out.append(verdict_report)
    return out
