"""The gate's one verdict rule (``gate_verdict``): after the evidence rule's REGRESS causes, unsettled
evidence, precision and plausibility as NEEDS_REVIEW. Pure; no callback."""

from __future__ import annotations

from typing import Any

from kregress.core.checks import ReviewCause, Unsettled
from kregress.core.gate_report import GateReport, plausibility_findings, precision_finding

JudgedReport = GateReport  # the gate report of a judged patch; it carries ``unsettled`` itself


def unsettled(report: GateReport | None) -> list[Unsettled]:
    """The report's unsettled evidence (empty for a config-only row, which has no report)."""
    return list(report.unsettled) if report is not None else []


def gate_verdict(row: Any, report: GateReport | None, per_shape_sol:
                 list[tuple[str, float, float | None, float]] | None = None) -> Any:
    """The gate's own say on a judged patch variant, or None where it has none and the evidence rule
    (``kernel_assets.sweep.verdict_for``) decides alone: a config-only row (no report) and a failed row
    (rejected, patch_failed, wrong, crashed, did not compile: REGRESS with the cause its error gives) have
    none; otherwise unsettled evidence (NEEDS_REVIEW ``unsettled``: the gate saw a difference from the
    baseline that no check fitting this host settled; it names the program and the evidence), then precision,
    then plausibility, give NEEDS_REVIEW with their cause, the later findings added as reasons. A
    NEEDS_REVIEW without a cause means the gate saw nothing. One rule, no callback: the caller writes
    ``gate_verdict(...) or verdict_for(...)``."""
    from kregress.core.records import Verdict

    if report is None or row.error:
        return None
    found: list[tuple[ReviewCause, list[str]]] = []
    items = unsettled(report)
    if items:
        found.append((ReviewCause.UNSETTLED, [u.text() for u in items]))
    if report.precision is not None:
        why = precision_finding(report.precision, report.precision_factor)
        if why:
            found.append((ReviewCause.PRECISION, [why]))
    if per_shape_sol:
        why_all = plausibility_findings(per_shape_sol, report.plausibility_factor)
        if why_all:
            found.append((ReviewCause.IMPLAUSIBLE, why_all))
    if not found:
        return None
    return Verdict(variant_id=row.variant_id, verdict="NEEDS_REVIEW", cause=found[0][0].value,
                   reasons=[r for _c, rs in found for r in rs], evidence=row.evidence)
