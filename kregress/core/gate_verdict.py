"""The gate's one verdict rule (``gate_verdict``): after the evidence rule's REGRESS causes, precision and
plausibility as NEEDS_REVIEW. Pure; no callback."""

from __future__ import annotations

from typing import Any

from kregress.core.gate_report import GateReport, plausibility_findings, precision_finding


def gate_verdict(row: Any, report: GateReport | None, per_shape_sol:
                 list[tuple[str, float, float | None, float]] | None = None) -> Any:
    """The gate's own say on a judged patch variant, or None where it has none and the evidence rule
    (``kernel_assets.sweep.verdict_for``) decides alone: a config-only row (no report) and a failed row
    (rejected, patch_failed, wrong, crashed, did not compile: REGRESS with the cause its error gives) have
    none; otherwise precision, then plausibility, give NEEDS_REVIEW with their cause. One rule, no callback:
    the caller writes ``gate_verdict(...) or verdict_for(...)``."""
    from kregress.core.records import Verdict

    if report is None or row.error:
        return None
    if report.precision is not None:
        why = precision_finding(report.precision, report.precision_factor)
        if why:
            return Verdict(variant_id=row.variant_id, verdict="NEEDS_REVIEW", cause="precision", reasons=[why],
                           evidence=row.evidence)
    if per_shape_sol:
        why = plausibility_findings(per_shape_sol, report.plausibility_factor)
        if why:
            return Verdict(variant_id=row.variant_id, verdict="NEEDS_REVIEW", cause="implausible", reasons=why,
                           evidence=row.evidence)
    return None
