"""Sweep logic with no Dagster in it: objective, round state, stop rules, verdicts.

The assets in kernel_assets/assets.py are thin: they load the spec, call these functions and attach
metadata. Keeping the logic here makes it testable without an instance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from kregress.core.records import DroppedSuggestion, Verdict, VariantResult, config_label
from kregress.core.names import MEASURED_EVIDENCE
from kregress.core.spec import TaskSpec



def objective(row: VariantResult, spec: TaskSpec) -> float | None:
    """Aggregate p50 latency (ms) over the shape matrix; None when the row failed or has no timing."""
    if row.error or not row.measurements:
        return None
    p50s = [m.p50_ms for m in row.measurements]
    if spec.objective.aggregate == "max":
        return max(p50s)
    if spec.objective.aggregate == "sum":
        return sum(p50s)
    return math.exp(sum(math.log(max(p, 1e-12)) for p in p50s) / len(p50s))


def constraint_violations(row: VariantResult, spec: TaskSpec) -> list[str]:
    c, cs = spec.constraints, row.compile
    if cs is None:
        return []
    out = []
    if cs.regs_per_thread > c.max_registers_per_thread:
        out.append(f"registers {cs.regs_per_thread}/thread > limit {c.max_registers_per_thread}")
    if cs.spill_bytes > c.max_spill_bytes:
        out.append(f"spills {cs.spill_bytes} B > limit {c.max_spill_bytes} B")
    if cs.smem_bytes > c.max_shared_memory_bytes:
        out.append(f"shared memory {cs.smem_bytes} B > limit {c.max_shared_memory_bytes} B")
    return out


def failure_line(row: VariantResult) -> str:
    """One line per failure: what the next prompt and the report show."""
    detail = " ".join(row.error_detail.split())[:160]
    return f"{row.variant_id} [{config_label(row.config)}]: {row.error}: {detail}"


@dataclass
class RoundState:
    """Everything a round hands to the next one (and finally to the report)."""

    round: int
    history: list[VariantResult]  # baseline first, then every measured variant in order
    objective: dict[str, float]  # config_hash -> objective (lower is better)
    best_id: str
    best_value: float | None
    rounds_without_improvement: int = 0
    stopped: str | None = None  # why the search stopped, once it has
    dropped: list[DroppedSuggestion] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    summary: str = ""  # trimmed top-k, the text the agent sees next round
    spec: TaskSpec | None = None  # the run's snapshot of the spec, read once by baseline_metrics

    @property
    def failures(self) -> list[str]:
        return [failure_line(r) for r in self.history if r.error]


def initial_state(baseline: VariantResult, spec: TaskSpec) -> RoundState:
    val = objective(baseline, spec)
    state = RoundState(round=0, history=[baseline], objective={}, best_id=baseline.variant_id, best_value=val, spec=spec)
    if val is not None:
        state.objective[baseline.config_hash] = val
    state.summary = summarize(state, spec)
    return state


def advance(prev: RoundState, spec: TaskSpec, round_index: int, rows: list[VariantResult],
            dropped: list[DroppedSuggestion], notes: list[str], stopped: str | None) -> RoundState:
    """Fold one round's results into the state and apply the stop rules."""
    state = RoundState(
        round=round_index, history=list(prev.history) + list(rows), objective=dict(prev.objective),
        best_id=prev.best_id, best_value=prev.best_value, rounds_without_improvement=prev.rounds_without_improvement,
        stopped=prev.stopped or stopped, dropped=list(prev.dropped) + list(dropped), notes=list(prev.notes) + list(notes),
        spec=prev.spec,
    )
    if prev.stopped or stopped:
        state.summary = summarize(state, spec)
        return state
    improved = False
    for r in rows:
        val = objective(r, spec)
        if val is None or constraint_violations(r, spec):
            continue
        state.objective[r.config_hash] = val
        if state.best_value is None or val < state.best_value * (1 - spec.search.min_improvement):
            state.best_value, state.best_id = val, r.variant_id
            improved = True
    state.rounds_without_improvement = 0 if improved else prev.rounds_without_improvement + 1
    if round_index >= spec.search.max_rounds:
        state.stopped = f"max_rounds reached ({spec.search.max_rounds})"
    elif state.rounds_without_improvement >= spec.search.no_improve_rounds:
        state.stopped = (f"no_improve_rounds reached: {state.rounds_without_improvement} round(s) without a "
                         f">= {spec.search.min_improvement:.0%} gain")
    state.summary = summarize(state, spec)
    return state


def summarize(state: RoundState, spec: TaskSpec) -> str:
    """Trimmed top-k of what was measured plus one line per failure (bounded size)."""
    from kernel_assets.agent.prompt import summarize_history

    return summarize_history(state.history, spec.search.top_k)


# --- verdicts -------------------------------------------------------------------------------


def _samples(row: VariantResult) -> list[list[float]]:
    return [m.samples_ms for m in row.measurements]


def verdict_for(row: VariantResult, baseline: VariantResult, spec: TaskSpec) -> Verdict:
    """The evidence rule: correctness and constraints are real everywhere; latency needs cuda/replay."""
    from kregress.core import stats

    if row.error:
        return Verdict(variant_id=row.variant_id, verdict="REGRESS", reasons=[failure_line(row)], evidence=row.evidence)
    violations = constraint_violations(row, spec)
    if violations:
        return Verdict(variant_id=row.variant_id, verdict="REGRESS", reasons=violations, evidence=row.evidence)
    v_obj, b_obj = objective(row, spec), objective(baseline, spec)
    if v_obj is None or b_obj is None:
        return Verdict(variant_id=row.variant_id, verdict="NEEDS_REVIEW",
                       reasons=["no latency for the variant or the baseline"], evidence=row.evidence)
    point = v_obj / b_obj
    guard = spec.regression_guard.not_worse_than_baseline_ratio
    if row.evidence in MEASURED_EVIDENCE and baseline.evidence in MEASURED_EVIDENCE:
        try:
            ci = stats.ratio_ci(_samples(row), _samples(baseline), confidence=spec.regression_guard.confidence,
                                seed=spec.search.seed)
        except ValueError as exc:  # e.g. a shape timed on one side only
            return Verdict(variant_id=row.variant_id, verdict="NEEDS_REVIEW", evidence=row.evidence,
                           reasons=[f"samples not comparable with the baseline's: {exc}"], ratio=point)
        kind, reason = stats.classify(ci, guard=guard, min_samples=spec.regression_guard.min_samples)
        return Verdict(variant_id=row.variant_id, verdict=kind, reasons=[reason], ratio=ci.ratio,
                       ratio_ci_low=ci.low, ratio_ci_high=ci.high, evidence=row.evidence)
    reason = (f"p50 ratio {point:.3f} vs baseline is an analytic estimate (evidence={row.evidence}); "
              f"PASS or REGRESS against the {guard} guard needs cuda or replay evidence: re-run on a GPU host")
    return Verdict(variant_id=row.variant_id, verdict="NEEDS_REVIEW", reasons=[reason], ratio=point, evidence=row.evidence)
