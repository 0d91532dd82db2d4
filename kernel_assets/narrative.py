"""The verdict report's narrative: written once per sweep, never every round."""

from __future__ import annotations

from kernels.records import Verdict


def plain_summary(spec, state, verdicts: dict[str, Verdict]) -> str:
    """A written summary from the numbers alone (used when no model writes the narrative)."""
    counts: dict[str, int] = {}
    for v in verdicts.values():
        counts[v.verdict] = counts.get(v.verdict, 0) + 1
    evidence = sorted({str(v.evidence) for v in verdicts.values() if v.evidence})
    best = state.best_id
    lines = [
        f"{len(verdicts)} variants of `{spec.kernel_family}` were measured over {state.round or 0} round(s); "
        f"{counts.get('PASS', 0)} PASS, {counts.get('REGRESS', 0)} REGRESS, {counts.get('NEEDS_REVIEW', 0)} NEEDS_REVIEW.",
        f"Latency evidence: {', '.join(evidence) or 'none'}."
        + (" Model evidence cannot PASS or REGRESS on latency; re-run on a GPU host to confirm." if "model" in evidence else ""),
        f"Best so far: `{best}`" + (f" at {state.best_value:.4g} ms." if state.best_value else "."),
    ]
    regress = [v for v in verdicts.values() if v.verdict == "REGRESS"]
    if regress:
        reasons: dict[str, int] = {}
        for v in regress:
            key = v.reasons[0].split(":")[1].strip() if ":" in v.reasons[0] else v.reasons[0]
            reasons[key] = reasons.get(key, 0) + 1
        lines.append("Regressions by cause: " + ", ".join(f"{k} x{n}" for k, n in sorted(reasons.items(), key=lambda kv: -kv[1])) + ".")
    if state.stopped:
        lines.append(f"The search stopped: {state.stopped}.")
    return " ".join(lines)


def narrative_for(context, spec, state, verdicts):
    """(narrative, source, token_table)."""
    return plain_summary(spec, state, verdicts), "plain summary written from the numbers (no model call)", None
