"""Sweep logic with no Dagster in it: objective, round state, stop rules, verdicts.

The assets in kernel_assets/assets.py are thin: they load the spec, call these functions and attach
metadata. Keeping the logic here makes it testable without an instance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from kernel_assets.profile import summarize_history
from kregress.core.bind import BoundSpec
from kregress.core.names import MEASURED_EVIDENCE
from kregress.core.records import DroppedSuggestion, VariantResult, Verdict, config_label
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
    """One line per failure, its detail whole: the report's and the verdict's reason (the prompt trims its own,
    ``profile.failure_lines``)."""
    detail = " ".join(row.error_detail.split())
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
    bound: BoundSpec | None = None  # the run's spec bound to its family, once, by baseline_metrics

    @property
    def spec(self) -> TaskSpec | None:
        return self.bound.spec if self.bound is not None else None

    @property
    def failures(self) -> list[str]:
        return [failure_line(r) for r in self.history if r.error]


def initial_state(baseline: VariantResult, bound: BoundSpec) -> RoundState:
    spec = bound.spec
    val = objective(baseline, spec)
    state = RoundState(round=0, history=[baseline], objective={}, best_id=baseline.variant_id, best_value=val, bound=bound)
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
        bound=prev.bound,
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
    return summarize_history(state.history, spec.search.top_k)


# --- verdicts -------------------------------------------------------------------------------


def _cause_of_error(row: VariantResult) -> str:
    from kregress.core.records import ERROR_CAUSES

    return ERROR_CAUSES.get(row.error or "", "wrong")


def _baseline_side(row: VariantResult, baseline: VariantResult) -> tuple[list, str | None, str]:
    """(baseline measurements, problem, where): the same batch's baseline when the backend re-timed it
    beside the variant, else the baseline row; ``problem`` when the samples must not be compared."""
    from kregress.core.batching import baseline_for

    if row.batch_baseline:
        base, where = row.batch_baseline, "same-batch baseline"
    else:
        base, where = baseline.measurements, "baseline timed in another step"
    by_shape = {m.shape: m for m in base}
    for m in row.measurements:
        b = by_shape.get(m.shape)
        if b is None:
            return base, f"shape {m.shape} was not timed for the baseline", where
        ident = lambda x: {"host": x.host, "gpu_uuid": x.gpu_uuid, "gpu_name": x.gpu_name or x.device}  # noqa: E731
        pair = baseline_for(m.batch, ident(m), m.samples_ms, b.batch if row.batch_baseline else m.batch, ident(b),
                            b.samples_ms)
        if not pair.ok:
            return base, pair.reason, where
    return [by_shape[m.shape] for m in row.measurements], None, where


_TIMING_IDENTITY = (("host", "hosts"), ("gpu", "GPUs"), ("driver", "drivers"), ("torch", "torch versions"),
                    ("triton", "Triton versions"))


def _timing_identity(m) -> dict[str, str]:
    """What a sample's time depends on beyond the kernel: the device (host + GPU UUID, else its name) and the
    toolchain (driver, torch, Triton)."""
    return {"host": m.host or "", "gpu": m.gpu_uuid or m.gpu_name or m.device or "", "driver": m.driver or "",
            "torch": m.torch_version or "", "triton": m.triton_version or ""}


def _identity_label(ident: dict[str, str]) -> str:
    return (f"{ident['gpu'] or '?'} on {ident['host'] or '?'} (driver {ident['driver'] or '?'}, torch "
            f"{ident['torch'] or '?'}, triton {ident['triton'] or '?'})")


def incomparable_reason(row: VariantResult, base: list) -> str | None:
    """Why ``row``'s samples may not be judged against ``base`` (the baseline samples it would be compared with),
    or None: a baseline timed on another device, driver or torch/Triton version never judges a variant."""
    by_shape = {m.shape: m for m in base}
    for m in row.measurements:
        b = by_shape.get(m.shape)
        if b is None:
            continue
        vi, bi = _timing_identity(m), _timing_identity(b)
        if vi != bi:
            what = [name for key, name in _TIMING_IDENTITY if vi[key] != bi[key] and key != "host"]
            if vi["host"] != bi["host"] and "GPUs" not in what:
                what.insert(0, "GPUs")  # the same model on another host is another GPU
            return (f"baseline and variant timed on different {' and '.join(what)}: variant on {_identity_label(vi)}, "
                    f"baseline on {_identity_label(bi)}; re-run both in one batch on one GPU with one toolchain")
    return None


def verdict_for(row: VariantResult, baseline: VariantResult, spec: TaskSpec) -> Verdict:
    """The evidence rule: correctness and constraints are real everywhere; latency needs cuda/replay.

    Every REGRESS has a cause: ``infeasible`` (did not compile, out of resources, over the register,
    spill or shared-memory limit), ``wrong`` (numerics, NaN/Inf, a launch that raises), ``crashed`` (the
    variant's process died) or ``slower``.
    Latency is judged shape by shape with ``stats.verdict_by_shape`` against the baseline samples of
    the variant's own batch; a variant is REGRESS/slower if any shape is, and names that shape.
    """
    from kregress.core import stats
    from kregress.core.batching import TimingPlan
    from kregress.core.records import ShapeVerdict

    if row.error:
        return Verdict(variant_id=row.variant_id, verdict="REGRESS", reasons=[failure_line(row)], evidence=row.evidence,
                       cause=_cause_of_error(row))
    violations = constraint_violations(row, spec)
    if violations:
        return Verdict(variant_id=row.variant_id, verdict="REGRESS", reasons=violations, evidence=row.evidence,
                       cause="infeasible")
    v_obj, b_obj = objective(row, spec), objective(baseline, spec)
    if v_obj is None or b_obj is None:
        return Verdict(variant_id=row.variant_id, verdict="NEEDS_REVIEW",
                       reasons=[row.error_detail or "no latency for the variant or the baseline"], evidence=row.evidence)
    point = v_obj / b_obj
    guard = spec.regression_guard.not_worse_than_baseline_ratio
    rg = spec.regression_guard
    if row.evidence in MEASURED_EVIDENCE and baseline.evidence in MEASURED_EVIDENCE:
        foreign = incomparable_reason(row, row.batch_baseline or baseline.measurements)
        if foreign:
            return Verdict(variant_id=row.variant_id, verdict="NEEDS_REVIEW", evidence=row.evidence, ratio=point,
                           cause="incomparable", reasons=[foreign])
        base, problem, where = _baseline_side(row, baseline)
        if problem:
            return Verdict(variant_id=row.variant_id, verdict="NEEDS_REVIEW", evidence=row.evidence, ratio=point,
                           reasons=[f"samples not comparable with the baseline's: {problem}"])
        names = [m.shape for m in row.measurements]
        # adaptive sampling: the confidence of the look the variant's sampling stopped at (the error budget is
        # spent over the looks, kregress.core.stats.SequentialDesign); one look (fixed rounds): the guard's own
        looks = row.timing_looks or 1
        confidence = TimingPlan.from_spec(spec).look_confidence(looks - 1) if row.timing_looks else rg.confidence
        draws = row.timing_rounds or min(min(len(m.samples_ms) for m in row.measurements),
                                         min((len(m.samples_ms) for m in base), default=0))
        try:
            res = stats.verdict_by_shape([m.samples_ms for m in row.measurements], [m.samples_ms for m in base],
                                         guard=guard, confidence=confidence, min_samples=rg.min_samples,
                                         seed=spec.search.seed, shape_names=names)
        except ValueError as exc:  # e.g. a shape timed on one side only
            return Verdict(variant_id=row.variant_id, verdict="NEEDS_REVIEW", evidence=row.evidence,
                           reasons=[f"samples not comparable with the baseline's: {exc}"], ratio=point)
        shapes = [ShapeVerdict(variant_id=row.variant_id, shape=names[i], verdict=k,
                               cause="slower" if k == "REGRESS" else None, reason=r, ratio=ci.ratio,
                               ratio_ci_low=ci.low, ratio_ci_high=ci.high, p50_ratio=ci.p50, n_variant=ci.n_variant,
                               n_baseline=ci.n_baseline, batch=row.measurements[i].batch, evidence=row.evidence)
                  for i, (k, r, ci) in enumerate(res.per_shape)]
        ci = res.combined
        return Verdict(variant_id=row.variant_id, verdict=res.verdict, reasons=[f"{res.reason} ({where})"],
                       ratio=ci.ratio, ratio_ci_low=ci.low, ratio_ci_high=ci.high, evidence=row.evidence,
                       cause="slower" if res.verdict == "REGRESS" else None, p50_ratio=ci.p50,
                       worst_shape=names[res.worst_shape] if res.worst_shape is not None else None,
                       shapes=shapes, method=f"{ci.method}/{stats.DEFAULT_RULE}", draws=draws, looks=looks)
    reason = (f"ratio {point:.3f} vs baseline is an analytic estimate (evidence={row.evidence}); "
              f"PASS or REGRESS against the {guard} guard needs cuda or replay evidence: re-run on a GPU host")
    by_shape = {m.shape: m for m in baseline.measurements}
    shapes = [ShapeVerdict(variant_id=row.variant_id, shape=m.shape, verdict="NEEDS_REVIEW",
                           reason=f"analytic estimate (evidence={row.evidence})",
                           ratio=(m.p50_ms / by_shape[m.shape].p50_ms) if m.shape in by_shape else None,
                           n_variant=0, n_baseline=0, evidence=row.evidence)
              for m in row.measurements]
    return Verdict(variant_id=row.variant_id, verdict="NEEDS_REVIEW", reasons=[reason], ratio=point,
                   evidence=row.evidence, shapes=shapes, method="model")


def cause_counts(verdicts) -> dict[str, int]:
    """REGRESS count per cause, every cause present: {"slower": 0, "wrong": 0, "infeasible": 6}."""
    from kregress.core.records import CAUSES

    out = {c: 0 for c in CAUSES}
    for v in verdicts:
        if v.verdict == "REGRESS":
            out[v.cause or "slower"] += 1
    return out


def summary_line(counts: dict[str, int], causes: dict[str, int]) -> str:
    """``PASS 0 / REGRESS 6 (slower 0, wrong 0, infeasible 6) / NEEDS_REVIEW 0``."""
    # the three causes a config-only sweep can have are always shown; `rejected` only once a patch was
    detail = ", ".join(f"{c} {n}" for c, n in causes.items() if n or c in ("slower", "wrong", "infeasible"))
    return (f"PASS {counts.get('PASS', 0)} / REGRESS {counts.get('REGRESS', 0)} ({detail}) / "
            f"NEEDS_REVIEW {counts.get('NEEDS_REVIEW', 0)}")


def best_measured(state: RoundState, verdicts: dict[str, Verdict], spec: TaskSpec) -> dict:
    """The headline best variant, honest about its evidence.

    Measured evidence (cuda, replay): the lowest objective among rows that are correct, within the
    constraints and not REGRESS; ``kind`` "best". Model evidence only: ``kind`` "estimated best",
    every variant tied at the lowest estimate listed in ``ties`` and ``tie_break`` stating the rule
    (the first one measured, i.e. lowest round then proposal order).
    """
    rows = []
    for order, r in enumerate(state.history):
        val = objective(r, spec)
        if val is None or constraint_violations(r, spec):
            continue
        v = verdicts.get(r.variant_id)
        if v is not None and v.verdict == "REGRESS":
            continue
        rows.append((val, order, r))
    if not rows:
        return {"kind": "none", "variant_id": None, "value": None, "ties": [], "tie_break": ""}
    measured = [x for x in rows if x[2].evidence in MEASURED_EVIDENCE]
    if measured:
        val, _, r = min(measured, key=lambda x: (x[0], x[1]))
        return {"kind": "best", "variant_id": r.variant_id, "value": val, "evidence": r.evidence, "ties": [],
                "tie_break": ""}
    best = min(x[0] for x in rows)
    ties = [x for x in rows if math.isclose(x[0], best, rel_tol=1e-9)]
    ties.sort(key=lambda x: x[1])
    return {"kind": "estimated best", "variant_id": ties[0][2].variant_id, "value": best,
            "evidence": ties[0][2].evidence, "ties": [x[2].variant_id for x in ties],
            "tie_break": "equal estimates: the first measured (lowest round, then proposal order) is named"}
