"""The review as Markdown: findings, compile-stat deltas, test coverage, suggested commands (never run)."""

from __future__ import annotations

import json
from typing import Any

from kernel_assets.review.records import CHECKLIST, CompileDelta, ReviewFinding, ReviewResult


def _cell(v: Any) -> str:
    return str("" if v is None else v).replace("|", "\\|").replace("\n", " ")


def findings_markdown(findings: list[ReviewFinding]) -> str:
    if not findings:
        return "_no findings_"
    head = "| risk | checklist item | file:line | in diff | evidence | verify with (not run) | source | flag |\n|---|---|---|---|---|---|---|---|"
    rows = [
        f"| {f.risk} | {f.checklist_item} | {_cell(f.file)}{f':{f.line}' if f.line else ''} | "
        f"{'-' if f.in_diff is None else ('yes' if f.in_diff else '**no**')} | {_cell(f.evidence)} | `{_cell(f.verify_command)}` | {f.source} | {_cell(f.flag)} |"
        for f in findings
    ]
    return "\n".join([head, *rows])


def compile_markdown(cd: CompileDelta | None) -> str:
    if cd is None:
        return "_not compiled (the notes say why)_"
    lines = [f"Baseline config `{json.dumps(cd.config, sort_keys=True)}`."]
    for side in (cd.base, cd.new):
        if side is None:
            lines.append("- base: no base version to compare (new file, or not found at the base)")
            continue
        state = "compiles" if side.ok else f"**does not compile**: {side.error}: {_cell(side.detail)}"
        space = f"; **outside the space**: {side.space_check}" if side.space_check else ""
        note = f" ({_cell(side.note)})" if side.note else ""
        lines.append(f"- {side.label}: {state}{space}{note}")
    if cd.rows:
        lines += ["", "| metric | base | new | delta |", "|---|---|---|---|"]
        lines += [f"| {r['metric']} | {r['base']} | {r['new']} | {r['delta']:+} |" if isinstance(r["delta"], (int, float)) else
                  f"| {r['metric']} | {r['base']} | {r['new']} | {r['delta']} |" for r in cd.rows]
    return "\n".join(lines)


def coverage_markdown(cov: dict[str, list[str]]) -> str:
    if not cov:
        return "_not checked_"
    rows = ["| checklist item | tests that mention it (keyword match, not proof) |", "|---|---|"]
    for item in CHECKLIST:
        tests = cov.get(item, [])
        rows.append(f"| {item} | {_cell(', '.join(tests[:6]) + (f' (+{len(tests) - 6} more)' if len(tests) > 6 else '')) if tests else '**none**'} |")
    return "\n".join(rows)


def render_report(r: ReviewResult) -> str:
    cmds = r.suggested_commands
    lines = [
        f"# Kernel source review: {r.task_id}",
        "",
        f"- repository: `{r.repo}`",
        f"- diff: {r.base_ref} (`{r.base_sha[:12]}`) -> working tree at `{r.head_sha[:12]}`{' (uncommitted kernel changes)' if r.worktree_dirty else ''}",
        f"- files reviewed: {', '.join(f'`{f}`' for f in r.files_reviewed) or 'none'}",
        f"- other kernel files changed (not this spec's): {', '.join(f'`{f}`' for f in r.files_changed_elsewhere) or 'none'}",
        f"- reviewed by: **{r.reviewed_by}**",
        f"- tokens: {r.tokens.get('total', 0)} ({r.tokens.get('prompt', 0)} in, {r.tokens.get('completion', 0)} out)",
        "",
        "## Findings",
        "",
        findings_markdown(r.findings),
        "",
        "A finding whose line is not in the diff is kept and flagged: check it by hand.",
        "",
        "## Compile statistics, base vs new (AOT, no GPU needed)",
        "",
        compile_markdown(r.compile),
        "",
        "## Checklist items the tests touch",
        "",
        coverage_markdown(r.coverage),
        "",
        "## Suggested commands (listed, never executed)",
        "",
        "\n".join(f"- `{c}`" for c in cmds) or "_none_",
    ]
    if r.notes:
        lines += ["", "## Notes", "", *[f"- {n}" for n in r.notes]]
    return "\n".join(lines) + "\n"
