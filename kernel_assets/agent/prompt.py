"""Prompt text for the llm policy: a compact, bounded view of what was measured.

Everything the model sees is built here, so its size is easy to reason about:

- ``summarize_history(history, top_k)``: a header plus one line per row (variant_id, config label, p50,
  TFLOP/s, registers, shared memory, occupancy, error), best first. The trimmed top-k profile text.
- ``failure_lines(history)``: one line per failed row.
- ``build_suggest_messages(ctx, rows)``: the system prompt and the structured user task. ``rows`` is how
  many history rows (and failure lines) to show; the gateway retries with fewer rows when a prompt does
  not fit the round's token budget.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

from kregress.core.records import VariantResult, config_label

if TYPE_CHECKING:
    from kernel_assets.agent.base import AgentContext

SUGGEST_SYSTEM_PROMPT = """\
You tune GPU kernel launch configurations. Reply with a JSON array only: no prose, no markdown, no source code.
Each element is an object with exactly these keys:
  "variant_id": short unique id, letters/digits/_.:- only (e.g. "r2_v1"),
  "config": an object giving an integer value for every tunable listed in the space,
  "patch_summary": what changes versus the best variant so far (at most 120 characters),
  "expected_effect": why it should be faster (at most 300 characters),
  "risk": "low", "medium" or "high".
Every config must be inside the space, satisfy its rules and the constraints, and differ from every config already measured.
If the constraints cannot be met, reply with an empty array: []"""

HEADER = "variant|config|p50_ms|tflops|regs|smem_kb|occ|error"


def _fmt(x: float | None, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    if x == 0:
        return "0"
    mag = math.floor(math.log10(abs(x)))
    decimals = max(0, digits - 1 - mag)
    return f"{x:.{decimals}f}"


def row_p50(row: VariantResult) -> float | None:
    """Geometric mean of the per-shape p50 latencies (ms); None when nothing was timed."""
    if not row.measurements:
        return None
    ps = [max(m.p50_ms, 1e-12) for m in row.measurements]
    return math.exp(sum(math.log(p) for p in ps) / len(ps))


def row_tflops(row: VariantResult) -> float | None:
    if not row.measurements:
        return None
    return sum(m.tflops for m in row.measurements) / len(row.measurements)


def history_line(row: VariantResult) -> str:
    """One compact line for one measured (or failed) variant."""
    cs = row.compile
    return "|".join(
        [
            row.variant_id,
            config_label(row.config),
            _fmt(row_p50(row)),
            _fmt(row_tflops(row)),
            str(cs.regs_per_thread) if cs else "-",
            _fmt(cs.smem_bytes / 1024, 3) if cs else "-",
            _fmt(cs.occupancy, 2) if cs else "-",
            row.error or "-",
        ]
    )


def summarize_history(history: list[VariantResult], top_k: int) -> str:
    """The trimmed top-k: header + one line per row, best p50 first; errored rows after timed ones.

    The baseline (round 0) is always shown, even when it is not in the top k, so the model can compare.
    A final line counts what was left out.
    """
    def key(r: VariantResult) -> tuple[int, float]:
        p = row_p50(r)
        return (1 if (r.error or p is None) else 0, p if p is not None else math.inf)

    ranked = sorted(history, key=key)
    shown = ranked[: max(top_k, 0)]
    baseline = next((r for r in history if r.round == 0), None)
    if baseline is not None and baseline not in shown:
        shown.append(baseline)
    lines = [HEADER] + [history_line(r) for r in shown]
    left = len(history) - len(shown)
    if left > 0:
        failed = sum(1 for r in history if r.error and r not in shown)
        lines.append(f"(+{left} more rows not shown, {failed} of them failed)")
    return "\n".join(lines)


def failure_lines(history: list[VariantResult], max_chars: int = 160) -> list[str]:
    """One line per failed row: id, config label, error class, first words of the detail."""
    out = []
    for r in history:
        if r.error:
            detail = " ".join(r.error_detail.split())[:max_chars]
            out.append(f"{r.variant_id} [{config_label(r.config)}]: {r.error}: {detail}".rstrip(": "))
    return out


def trim_table(text: str, rows: int) -> str:
    """Keep the header line and the first ``rows`` data lines of a summary table; say what was cut."""
    lines = [ln for ln in (text or "").splitlines() if ln.strip()]
    if not lines:
        return ""
    header, body = lines[0], lines[1:]
    tail = [ln for ln in body if ln.startswith("(+")]
    body = [ln for ln in body if not ln.startswith("(+")]
    if rows <= 0:
        return ""
    kept = body[:rows]
    out = [header] + kept
    if len(body) > rows:
        out.append(f"(+{len(body) - rows} more rows trimmed)")
    out += tail
    return "\n".join(out)


def _shape_text(spec: Any, family: Any) -> str:
    try:
        return ", ".join(family.shape_label(s) for s in spec.shape_matrix)
    except Exception:  # noqa: BLE001 - a family without shape_label: show the raw dicts
        return json.dumps(spec.shape_matrix, separators=(",", ":"))


def label_legend(params: Any) -> str:
    """How config labels abbreviate the tunables, e.g. ``BM=BLOCK_M, s=num_stages`` (only where they differ)."""
    parts = []
    for k in params:
        short = config_label({k: 0})[:-1]
        if short != k:
            parts.append(f"{short}={k}")
    return ", ".join(parts)


def _baseline_text(ctx: AgentContext) -> str:
    base = next((r for r in ctx.history if r.round == 0), None)
    cfg = json.dumps(ctx.spec.baseline, separators=(",", ":"))
    if base is None:
        return f"config {cfg}"
    return f"config {cfg}; {history_line(base)} (columns: {HEADER})"


def build_suggest_user_prompt(ctx: AgentContext, rows: int) -> str:
    """The structured user task. ``rows`` bounds the history and failure lines shown."""
    spec = ctx.spec
    c = spec.constraints
    profile = ctx.profile_summary or summarize_history(ctx.history, spec.search.top_k)
    profile = trim_table(profile, rows)
    failures = [" ".join(f.split())[:200] for f in ctx.failures][-rows:] if rows > 0 else []
    measured = sorted({config_label(r.config) for r in ctx.history})
    if len(measured) > 64:
        measured = measured[:64] + [f"... +{len(measured) - 64} more"]
    ids = sorted({r.variant_id for r in ctx.history})
    parts = [
        f"TASK: propose {ctx.n} new variants for round {ctx.round} of kernel family {spec.kernel_family} "
        f"(task {spec.task_id}, dtype {spec.dtype}, target {spec.hardware.arch}). "
        f"Use variant_ids r{ctx.round}_v1 .. r{ctx.round}_v{ctx.n}.",
        f"OBJECTIVE: {spec.objective.direction} {spec.objective.metric} ({spec.objective.aggregate} over shapes: {_shape_text(spec, ctx.family)}).",
        f"CONSTRAINTS: registers/thread <= {c.max_registers_per_thread}; shared memory <= {c.max_shared_memory_bytes} bytes; "
        f"spill bytes <= {c.max_spill_bytes}; numeric tolerance {c.numeric_tolerance:g}.",
        f"SPACE: {ctx.family.space.describe()}",
        f"LABELS: config labels below abbreviate {label_legend(ctx.family.space.params)}; answer with full names in config.",
        f"BASELINE: {_baseline_text(ctx)}",
    ]
    if profile:
        parts.append(f"MEASURED (top {rows}, best first):\n{profile}")
    if failures:
        parts.append("FAILURES (one per line):\n" + "\n".join(failures))
    if measured:
        parts.append("ALREADY MEASURED (do not repeat): " + ", ".join(measured))
    if ids:
        parts.append("USED variant_ids (do not reuse): " + ", ".join(ids[:64]))
    parts.append(f"Reply with a JSON array of at most {ctx.n} objects, nothing else.")
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
