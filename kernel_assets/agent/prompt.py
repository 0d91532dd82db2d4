"""Prompt text for the llm policy: a compact, bounded view of what was measured, and a compact reply schema.

Everything the model sees is built here, so its size is easy to reason about:

- ``summarize_history(history, top_k, metric)``: a header plus one line per row (variant_id, config values in
  the space's key order, measured speedup over the baseline, the forecast it was proposed with, the family's
  headline metric in its own unit, registers, shared memory, occupancy, error), best first. The trimmed
  top-k profile text.
- ``failure_lines(history)``: one line per failed row.
- ``build_suggest_messages(ctx, rows)``: the system prompt and the structured user task. ``rows`` is how
  many history rows (and failure lines) to show; the gateway retries with fewer rows when a prompt does
  not fit the round's token budget.

The reply schema is compact because output tokens are the expensive ones: each proposal is
``{"id", "c": [values in the space's key order], "x": [speedup, low, high], "b", "s"}``, where ``x`` is the
forecast (baseline p50 / variant p50, with an 80% interval), ``b`` the bottleneck it attacks and ``s`` a
summary of at most 120 characters. ``kernel_assets.agent.llm`` parses it (and the long form, for models
that insist on it).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Sequence

from kregress.core.records import VariantResult

if TYPE_CHECKING:
    from kernel_assets.agent.base import AgentContext

SUGGEST_SYSTEM_PROMPT = """\
You tune GPU kernel launch configurations. Reply with a JSON array only: no prose, no markdown, no code.
Each element: {"id":"r2_v1","c":[...],"x":[speedup,low,high],"b":"compute","s":"..."}
 c: the config's values, in the order of the tunables in SPACE.
 x: your forecast of baseline p50 / this variant's p50, and your 80% interval for it (low <= speedup <= high).
 b: the bottleneck it attacks: compute, memory or latency.
 s: what changes and why, at most 120 characters.
Every config must be inside SPACE, satisfy its rules and the constraints, and differ from every measured one.
If the constraints cannot be met, reply []"""

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


def _shape_text(spec: Any, family: Any) -> str:
    try:
        return ", ".join(family.shape_label(s) for s in spec.shape_matrix)
    except Exception:  # noqa: BLE001 - a family without shape_label: show the raw dicts
        return ", ".join("x".join(str(v) for v in s.values()) for s in spec.shape_matrix)


def _metric(ctx: AgentContext) -> str:
    return getattr(ctx.family, "headline_metric", "tflops") or "tflops"


def _baseline_text(ctx: AgentContext, keys: Sequence[str]) -> str:
    base = next((r for r in ctx.history if r.round == 0), None)
    cfg = values(ctx.spec.baseline, keys)
    if base is None:
        return f"c {cfg}"
    p50 = row_p50(base)
    metric = _metric(ctx)
    return (f"c {cfg}; p50 {_fmt(p50)} ms; {_fmt(row_metric(base, metric))} {metric_unit(metric)}"
            + (f"; regs {base.compile.regs_per_thread}" if base.compile else ""))


def feedback_lines(ctx: AgentContext) -> list[str]:
    """What went wrong with the previous answers, one line each (the dropped proposals' reasons), newest last."""
    return list(getattr(ctx, "feedback", []) or [])


def build_suggest_user_prompt(ctx: AgentContext, rows: int) -> str:
    """The structured user task. ``rows`` bounds the history and failure lines shown."""
    spec = ctx.spec
    c = spec.constraints
    keys = list(ctx.family.space.params)
    metric = _metric(ctx)
    profile = summarize_history(ctx.history, spec.search.top_k, metric, keys)
    profile = trim_table(profile, rows)
    failures = [" ".join(f.split())[:200] for f in failure_lines(ctx.history, keys=keys)][-rows:] if rows > 0 else []
    measured = sorted({values(r.config, keys) for r in ctx.history})
    if len(measured) > 64:
        measured = measured[:64] + [f"... +{len(measured) - 64} more"]
    parts = [
        f"TASK: {ctx.n} new variants for round {ctx.round} of {spec.kernel_family} ({spec.dtype}, {spec.hardware.arch}), "
        f"ids r{ctx.round}_v1..r{ctx.round}_v{ctx.n}.",
        f"OBJECTIVE: {spec.objective.direction} {spec.objective.metric} ({spec.objective.aggregate} over shapes {_shape_text(spec, ctx.family)}).",
        f"CONSTRAINTS: regs/thread <= {c.max_registers_per_thread}; smem <= {c.max_shared_memory_bytes} B; "
        f"spills <= {c.max_spill_bytes} B; tolerance {c.numeric_tolerance:g}.",
        f"SPACE: {ctx.family.space.describe()}",
        f"BASELINE: {_baseline_text(ctx, keys)}",
    ]
    if profile:
        parts.append(f"MEASURED (top {rows}; speedup = baseline p50 / p50; fc = its forecast):\n{profile}")
    if failures:
        parts.append("FAILURES:\n" + "\n".join(failures))
    fb = feedback_lines(ctx)
    if fb:
        parts.append("YOUR LAST ANSWER:\n" + "\n".join(fb[-4:]))
    if measured:
        parts.append("DO NOT REPEAT (c): " + " ".join(measured))
    parts.append(f"Reply with a JSON array of at most {ctx.n} objects.")
    return "\n".join(parts)


def build_suggest_messages(ctx: AgentContext, rows: int) -> list[dict[str, str]]:
    system, extra = SUGGEST_SYSTEM_PROMPT, ""
    if ctx.spec.search.patches:  # the editable source and the patch rules (kernel_assets/judge.py)
        from kernel_assets.judge import patch_prompt

        system, extra = patch_prompt(ctx, system)
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": build_suggest_user_prompt(ctx, rows) + extra},
    ]
