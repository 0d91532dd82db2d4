"""The model's side: the prompt for one diff slice, and its answer parsed into validated findings (untrusted data)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Callable

from pydantic import ValidationError

from kernel_assets.review.diff import FileDiff
from kernel_assets.review.records import CompileDelta, ReviewFinding

MAX_RESPONSE_CHARS = 32_000
MAX_FINDINGS_PER_SLICE = 50
_DANGEROUS = re.compile(r"\b(rm\s+-|git\s+push|kubectl|psql|mysql|docker\s+push|curl|wget|dd\s+if=|mkfs|shutdown|chmod\s+-R)\b", re.IGNORECASE)

SYSTEM_PROMPT = """\
You review one slice of a diff of a Triton GPU kernel file for kernel engineers. Judge the change only
against the acceptance checklist you are given. Output a JSON array only, no prose: one element per problem,
{"checklist_item": "<one of the checklist ids>", "risk": "low|medium|high", "file": "<the file path given>",
 "line": <a new-side line number printed at the left of the diff>, "evidence": "<the code at that line and
why it is wrong, at most 400 characters>", "verify_command": "<one local, read-only command that would show
it, e.g. a pytest invocation or a kregress command>"}.
Cite only line numbers printed in the diff. Never suggest destructive commands. Return [] when this slice has
no problem against the checklist."""


def offline_facts(cd: CompileDelta | None, coverage: dict[str, list[str]]) -> list[str]:
    """The offline facts the model sees next to the diff."""
    facts: list[str] = []
    if cd is not None:
        if cd.base is None:
            facts.append("base version of the module could not be materialised: no compile comparison")
        for side in (cd.base, cd.new):
            if side is None:
                continue
            if side.ok and side.stats:
                s = side.stats
                facts.append(f"{side.label}: baseline config compiles: {s['regs_per_thread']} regs/thread, {s['spill_bytes']} spill bytes, "
                             f"{s['smem_bytes']} B shared memory, occupancy {s['occupancy']:.3f}"
                             + (f", {s['sass_instructions']} SASS instructions" if s.get("sass_instructions") is not None else ""))
            else:
                facts.append(f"{side.label}: baseline config does not compile: {side.error}: {side.detail}")
            if side.space_check:
                facts.append(f"{side.label}: baseline config violates the space: {side.space_check}")
    covered = [k for k, v in coverage.items() if v]
    missing = [k for k, v in coverage.items() if not v]
    if coverage:
        facts.append(f"tests mention: {', '.join(covered) or 'nothing'}; no test mentions: {', '.join(missing) or 'nothing'} (keyword match)")
    return facts


def build_messages(spec: Any, checklist: dict[str, str], fd: FileDiff, slice_text: str, part: tuple[int, int], facts: list[str]) -> list[dict[str, str]]:
    items = "\n".join(f"- {k}: {v}" for k, v in checklist.items())
    fact_text = "\n".join(f"- {f}" for f in facts) or "- none"
    user = (
        f"Spec {spec.task_id}: kernel family {spec.kernel_family}, dtype {spec.dtype}, target {spec.hardware.arch} "
        f"({spec.hardware.device}); baseline config {json.dumps(dict(spec.baseline), sort_keys=True)}.\n\n"
        f"Acceptance checklist (ids):\n{items}\n\n"
        f"Facts measured without a model for this file:\n{fact_text}\n\n"
        f"File {fd.path} ({fd.status}), diff slice {part[0]} of {part[1]}; each line: new-side line number, then "
        f"' ' context, '+' added or '-' removed (removed lines have no new-side number):\n{slice_text}"
    )
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


def parse_findings(text: str, fd: FileDiff, scrub: Callable[[str], str]) -> tuple[list[ReviewFinding], list[str]]:
    """Model text -> validated findings for this file (each checked against the diff), and notes on what was dropped."""
    from kernel_assets.agent.llm import extract_json

    notes: list[str] = []
    if len(text or "") > MAX_RESPONSE_CHARS:
        return [], [f"{fd.path}: response over {MAX_RESPONSE_CHARS} characters; nothing in it was used"]
    value, problem = extract_json(text)
    if problem:
        return [], [f"{fd.path}: {problem}"]
    if isinstance(value, dict):
        value = value.get("findings", [value]) if isinstance(value.get("findings", None), list) or "checklist_item" in value else []
    if not isinstance(value, list):
        return [], [f"{fd.path}: expected a JSON array of findings, got {type(value).__name__}"]
    if len(value) > MAX_FINDINGS_PER_SLICE:
        notes.append(f"{fd.path}: {len(value)} findings, only the first {MAX_FINDINGS_PER_SLICE} read")
        value = value[:MAX_FINDINGS_PER_SLICE]
    in_diff = fd.lines_in_diff()
    out: list[ReviewFinding] = []
    for item in value:
        if not isinstance(item, dict):
            notes.append(f"{fd.path}: dropped a {type(item).__name__} (a finding is an object)")
            continue
        raw = {k: item.get(k) for k in ("checklist_item", "risk", "file", "line", "evidence", "verify_command")}
        for k in ("evidence", "verify_command", "file"):
            if isinstance(raw[k], str):
                raw[k] = scrub(" ".join(raw[k].split()))[: {"evidence": 800, "verify_command": 400, "file": 300}[k]]
        if isinstance(raw["risk"], str):
            raw["risk"] = raw["risk"].strip().lower()
        if isinstance(raw["line"], str) and raw["line"].strip().isdigit():
            raw["line"] = int(raw["line"].strip())
        raw["file"] = raw["file"] or fd.path
        raw["verify_command"] = raw["verify_command"] or ""
        try:
            f = ReviewFinding.model_validate({**raw, "source": "model"})
        except ValidationError as e:
            errs = "; ".join(f"{'.'.join(map(str, er['loc']))}: {er['msg']}" for er in e.errors()[:2])
            notes.append(f"{fd.path}: dropped a finding ({errs})")
            continue
        flags = []
        if f.file != fd.path:
            if Path(f.file).name == Path(fd.path).name:
                f.file = fd.path
            else:
                flags.append(f"cites {f.file}, a file outside this slice ({fd.path})")
        if f.line is not None:
            f.in_diff = f.file == fd.path and f.line in in_diff
            if not f.in_diff:
                flags.append(f"line {f.line} is outside the diff of {fd.path} (the diff shows lines {fd.spans()})")
        if f.verify_command and _DANGEROUS.search(f.verify_command):
            flags.append("the suggested command is not a read-only check; do not run it")
        f.flag = "; ".join(flags)
        out.append(f)
    return out, notes
