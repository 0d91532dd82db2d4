"""The trimmed profile: what a sweep measured, as compact text (no Dagster, no model).

The sweep keeps it as each round's summary (``kernel_assets.sweep.summarize``) and the llm policy's prompt
shows it to the model (``kernel_assets.agent.prompt``), so both read the same lines:

- ``summarize_history(history, top_k, metric)``: a header plus one line per row (variant_id, config values in
  the space's key order, measured speedup over the baseline, the forecast it was proposed with, the family's
  headline metric in its own unit, registers, shared memory, occupancy, error), best first.
- ``failure_lines(history)``: one line per failed row.
- ``trim_table(text, rows)``: the first rows of such a table, saying what was cut.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from kregress.core.records import VariantResult

# the headline metric of a family, as the prompt names it (its own unit)
METRIC_UNITS = {"tflops": "TFLOP/s", "gbps": "GB/s"}


def metric_unit(metric: str) -> str:
    return METRIC_UNITS.get(metric, metric)


def header(metric: str = "tflops") -> str:
    return f"variant|c|speedup|fc|{metric_unit(metric)}|regs|smem_kb|occ|error"


HEADER = header()


def _fmt(x: float | None, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    if x == 0:
        return "0"
    mag = math.floor(math.log10(abs(x)))
    decimals = max(0, digits - 1 - mag)
    return f"{x:.{decimals}f}"


def values(config: dict[str, Any], keys: Sequence[str] | None = None) -> str:
    """A config as its values in the space's key order, e.g. ``128/256/64/8/3/8`` (the reply's ``c``)."""
    keys = list(keys) if keys is not None else list(config)
    return "/".join(str(config.get(k, "?")) for k in keys)


def row_p50(row: VariantResult) -> float | None:
    """Geometric mean of the per-shape p50 latencies (ms); None when nothing was timed."""
    if not row.measurements:
        return None
    ps = [max(m.p50_ms, 1e-12) for m in row.measurements]
    return math.exp(sum(math.log(p) for p in ps) / len(ps))


def row_metric(row: VariantResult, metric: str = "tflops") -> float | None:
    """The family's headline metric (``tflops`` or ``gbps``), averaged over the shapes."""
    if not row.measurements:
        return None
    return sum(float(getattr(m, metric, 0.0) or 0.0) for m in row.measurements) / len(row.measurements)


def row_tflops(row: VariantResult) -> float | None:
    return row_metric(row, "tflops")


def speedup(row: VariantResult, baseline: VariantResult | None) -> float | None:
    """baseline p50 / row p50, geomean over the shapes both timed (what a forecast predicts); None when not timed."""
    if baseline is None or not row.measurements or not baseline.measurements:
        return None
    base = {m.shape: m.p50_ms for m in baseline.measurements}
    logs = [math.log(base[m.shape] / m.p50_ms) for m in row.measurements if m.shape in base and m.p50_ms > 0 and base[m.shape] > 0]
    return math.exp(sum(logs) / len(logs)) if logs else None


def history_line(row: VariantResult, baseline: VariantResult | None = None, keys: Sequence[str] | None = None,
                 metric: str = "tflops") -> str:
    """One compact line for one measured (or failed) variant."""
    cs = row.compile
    fc = _fmt(row.expected_speedup) if row.expected_speedup is not None else "-"
    return "|".join(
        [
            row.variant_id,
            values(row.config, keys),
            _fmt(speedup(row, baseline)),
            fc,
            _fmt(row_metric(row, metric)),
            str(cs.regs_per_thread) if cs else "-",
            _fmt(cs.smem_bytes / 1024, 3) if cs else "-",
            _fmt(cs.occupancy, 2) if cs else "-",
            row.error or "-",
        ]
    )


def summarize_history(history: list[VariantResult], top_k: int, metric: str = "tflops", keys: Sequence[str] | None = None) -> str:
    """The trimmed top-k: header + one line per row, best p50 first; errored rows after timed ones.

    The baseline (round 0) is always shown, even when it is not in the top k, so the model can compare.
    A final line counts what was left out.
    """
    def key(r: VariantResult) -> tuple[int, float]:
        p = row_p50(r)
        return (1 if (r.error or p is None) else 0, p if p is not None else math.inf)

    baseline = next((r for r in history if r.round == 0), None)
    ranked = sorted(history, key=key)
    shown = ranked[: max(top_k, 0)]
    if baseline is not None and baseline not in shown:
        shown.append(baseline)
    lines = [header(metric)] + [history_line(r, baseline, keys, metric) for r in shown]
    left = len(history) - len(shown)
    if left > 0:
        failed = sum(1 for r in history if r.error and r not in shown)
        lines.append(f"(+{left} more rows not shown, {failed} of them failed)")
    return "\n".join(lines)


def failure_lines(history: list[VariantResult], max_chars: int = 160, keys: Sequence[str] | None = None) -> list[str]:
    """One line per failed row: id, config values, error class, first words of the detail."""
    out = []
    for r in history:
        if r.error:
            detail = " ".join(r.error_detail.split())[:max_chars]
            out.append(f"{r.variant_id} [{values(r.config, keys)}]: {r.error}: {detail}".rstrip(": "))
    return out


def trim_table(text: str, rows: int) -> str:
    """Keep the header line and the first ``rows`` data lines of a summary table; say what was cut."""
    lines = [ln for ln in (text or "").splitlines() if ln.strip()]
    if not lines:
        return ""
    head, body = lines[0], lines[1:]
    tail = [ln for ln in body if ln.startswith("(+")]
    body = [ln for ln in body if not ln.startswith("(+")]
    if rows <= 0:
        return ""
    kept = body[:rows]
    out = [head] + kept
    if len(body) > rows:
        out.append(f"(+{len(body) - rows} more rows trimmed)")
    out += tail
    return "\n".join(out)
