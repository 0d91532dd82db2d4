"""Prompt text for the llm policy: a compact, bounded view of what was measured, and a compact reply schema.

Everything the model sees is built here, so its size is easy to reason about:

- the trimmed top-k profile text and the failure lines (``kernel_assets.profile``, which the sweep's summary
  shares);
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

from typing import TYPE_CHECKING, Any, Sequence

from kernel_assets.profile import _fmt, failure_lines, metric_unit, row_metric, row_p50, summarize_history, trim_table, values

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
