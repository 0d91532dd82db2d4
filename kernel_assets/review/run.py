"""One review: pick the base revision, diff the family's files, run the offline checks, ask the model slice by
slice, write the report, remember the reviewed revision."""

from __future__ import annotations

import datetime as _dt
import json
import os
from pathlib import Path
from typing import Any, Callable

from kernel_assets.review.diff import (
    FileDiff,
    family_sources,
    git,
    kernel_diff,
    last_commit_touching,
    render_slices,
    resolve_ref,
    worktree_dirty,
)
from kernel_assets.review.offline import compile_deltas, compile_findings, coverage_by_item, delta_rows, patched_compile_deltas
from kernel_assets.review.prompt import build_messages, offline_facts, parse_findings
from kernel_assets.review.records import RISK_ORDER, CompileDelta, CompileSide, ReviewError, ReviewResult, spec_checklist
from kernel_assets.review.report import render_report
from kregress.core import paths
from kregress.core.family import RecordedFamily
from resources.ledger import BudgetExceeded
from resources.taotoken import CallContext, ContentError, CredentialsError, GatewayError, KeyPool, RequestError, RetriesExhausted

ASSET_NAME = "kernel_source_review"
DEFAULT_SLICE_CHARS = 16_000


# --- state: the last reviewed revision ---------------------------------------------------------------------


def state_path(home: Path, task_id: str) -> Path:
    return home / "review" / f"{task_id}.json"


def load_state(home: Path, task_id: str, repo: Path) -> dict[str, Any]:
    p = state_path(home, task_id)
    try:
        data = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return (data.get("repos") or {}).get(str(repo), {})


def save_state(home: Path, task_id: str, repo: Path, entry: dict[str, Any]) -> None:
    p = state_path(home, task_id)
    p.parent.mkdir(parents=True, exist_ok=True)
    try:
        data = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError):
        data = {}
    data.setdefault("repos", {})[str(repo)] = entry
    tmp = p.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
    os.replace(tmp, p)


# --- the review --------------------------------------------------------------------------------------------


def _verify_command(repo: Path, family_name: str, module_path: str, spec_path: str) -> str:
    for cand in (f"tests/test_{family_name}.py", f"tests/test_{Path(module_path).stem}.py"):
        if (repo / cand).is_file():
            return f"python -m pytest {cand} -q"
    return f"kregress sweep {spec_path or 'specs/<spec>.yaml'}"


def choose_base(repo: Path, files: list[str], base_ref: str, home: Path, task_id: str, head_sha: str) -> tuple[str, str, list[str]]:
    """(base sha, how to name it, notes): the given ref; else the revision last reviewed for this spec; else HEAD when
    the family's files have uncommitted changes; else (a clean checkout) the parent of the last commit touching them."""
    if base_ref:
        return resolve_ref(repo, base_ref, "base_ref"), base_ref, []
    notes: list[str] = []
    remembered = load_state(home, task_id, repo).get("last_reviewed", "")
    if remembered and git(repo, "cat-file", "-e", f"{remembered}^{{commit}}", check=False).returncode == 0:
        return remembered, f"last reviewed {remembered[:10]}", []
    if remembered:
        notes.append(f"the last reviewed revision {remembered[:10]} is gone from this repository (rebased?); reviewing "
                     "without it: set base_ref to review the committed history")
    if worktree_dirty(repo, files):
        notes.append("first review of this spec in this repository: reviewing the uncommitted changes against HEAD; "
                     "set base_ref (e.g. origin/main) to review committed history too")
        return head_sha, "HEAD", notes
    last = last_commit_touching(repo, files)
    if last is None:
        notes.append(f"no commit touches {', '.join(files)} and nothing is uncommitted: nothing to compare")
        return head_sha, "HEAD", notes
    sha, subject = last
    parent = git(repo, "rev-parse", "--verify", "--quiet", f"{sha}^", check=False).stdout.strip()
    if not parent:
        notes.append(f"clean checkout: the last commit touching {', '.join(files)} is {sha[:10]} ({subject[:80]}), the first "
                     "commit of the repository, so there is nothing before it to compare")
        return head_sha, "HEAD", notes
    notes.append(f"clean checkout (no uncommitted changes to {', '.join(files)}): comparing with the commit before "
                 f"{sha[:10]} ({subject[:80]}), the last commit that touched them")
    return parent, f"before {sha[:10]} (last commit touching the kernel: {subject[:60]})", notes


def run_review(
    spec: Any,
    *,
    repo_dir: str | Path = "",
    base_ref: str = "",
    gateway: Any = None,
    no_model_reason: str = "",
    run_id: str = "",
    partition: str = "",
    spec_path: str = "",
    compile: bool = True,
    max_slice_chars: int = DEFAULT_SLICE_CHARS,
    remember: bool = True,
    home: Path | None = None,
    log: Any = None,
    patch_variant: str = "",
) -> ReviewResult:
    """Review the kernel changes that matter to ``spec``; write the report; remember the reviewed revision.

    The family's own files (``Family.source_files()`` and the modules of its package it imports) are reviewed, in
    the checkout that holds them (``repo_dir``, else ``$KREGRESS_REVIEW_REPO``, else the file's own repository).
    ``gateway``: a ``resources.taotoken.Gateway`` (or None: offline, and ``no_model_reason`` says why).
    Raises ReviewError when git cannot give a diff (no git, not a repository, an unknown base ref).
    ``patch_variant``: review the patch ``kregress judge`` judged under that variant id (its diff against
    the working tree, with the judgement's verdict and compile statistics as facts) instead of a git diff.
    """
    say = (lambda m: log.info(m)) if log is not None else (lambda m: None)
    home = Path(home) if home is not None else paths.home()
    scrub = KeyPool.from_env().scrub
    from kregress.core.bind import BoundSpec, family_for

    # A review looks at a change that may well break the spec (a tile size the new source no longer allows):
    # the family is looked up, not validated against the spec; the compile comparison reports what broke.
    if isinstance(spec, BoundSpec):
        spec, family = spec.spec, spec.family
    else:
        family = family_for(spec.kernel_family, spec.params or {})
    src = family_sources(family, repo_dir or os.environ.get("KREGRESS_REVIEW_REPO", ""))
    repo, module_path = src.repo, src.module_path

    head_sha = resolve_ref(repo, "HEAD", "HEAD")
    patched_texts: dict[str, str] | None = None
    if patch_variant:
        diffs, base_label, notes = judged_patch_diff(spec, family, repo, patch_variant, home)
        base_sha, dirty, remember = head_sha, worktree_dirty(repo, src.dirs), False
        patched_texts = patched_files(spec, family, repo, patch_variant, home) if compile else None
    else:
        base_sha, base_label, notes = choose_base(repo, src.files, base_ref, home, spec.task_id, head_sha)
        dirty = worktree_dirty(repo, src.dirs)
        diffs = kernel_diff(repo, base_sha, src.dirs)
    say(f"review {spec.task_id}: {repo} {base_label} ({base_sha[:10]}) -> working tree")

    mine = [d for d in diffs if d.path in src.files or d.old_path in src.files]
    elsewhere = [d.path for d in diffs if d not in mine]
    result = ReviewResult(task_id=spec.task_id, repo=str(repo), base_ref=base_label, base_sha=base_sha, head_sha=head_sha,
                          worktree_dirty=dirty, files_reviewed=[d.path for d in mine], files_changed_elsewhere=elsewhere, notes=notes)
    verify = _verify_command(repo, family.name, module_path, spec_path)

    if not mine:
        result.reviewed_by = f"nothing to review: no change to {', '.join(src.files)} since {base_label}"
        result.notes.append(result.reviewed_by + (f" (other kernel files changed: {', '.join(elsewhere)})" if elsewhere else ""))
    else:
        if compile and isinstance(family, RecordedFamily):
            result.notes.append(f"family {family.name} serves recorded runs: nothing to compile, no compile comparison")
        elif compile and patched_texts is not None:
            say(f"review: AOT-compiling the baseline config without and with the judged patch ({spec.hardware.arch})")
            result.compile = patched_compile_deltas(src, head_sha, patched_texts, spec, home)
            judged = judged_compile_side(spec, patch_variant, home)
            if not result.compile.new.ok and judged is not None:
                # the family's own compile units do not know what the patch changed (a new constexpr the wrapper
                # passes, say); the judgement compiled it from the patched launch: its figures stand for the new side
                judged.note = (f"the family's compile units could not compile the patched kernel ({result.compile.new.error}: "
                               f"{result.compile.new.detail[:160]}); these are the judgement's own compile figures")
                result.compile = CompileDelta(config=result.compile.config, base=result.compile.base, new=judged,
                                              rows=delta_rows(result.compile.base, judged))
            result.findings += compile_findings(result.compile, spec, module_path, f"kregress judge {spec_path or 'SPEC'} PATCH")
        elif compile and patch_variant:
            result.notes.append(f"the judged patch {patch_variant} no longer applies to the working tree: no compile comparison")
        elif compile:
            say(f"review: AOT-compiling the baseline config with the base and the new source ({spec.hardware.arch})")
            has_base = git(repo, "cat-file", "-e", f"{base_sha}:{module_path}", check=False).returncode == 0
            result.compile = compile_deltas(src, base_sha if has_base else None, spec, home)
            base = result.compile.base
            if base is not None and not base.ok:
                result.notes.append(f"the base revision {base_sha[:10]} could not be compiled for comparison ({base.error}: {base.detail}); "
                                    "only the new side's compile statistics are shown")
            result.findings += compile_findings(result.compile, spec, module_path, f"kregress sweep {spec_path}" if spec_path else verify)
        result.coverage = coverage_by_item(repo, family.name, module_path)
        facts = offline_facts(result.compile, result.coverage) + (list(notes) if patch_variant else [])
        _ask_model(result, spec, family, mine, facts, gateway, no_model_reason, run_id, partition, max_slice_chars, scrub)
    result.findings.sort(key=lambda f: (RISK_ORDER[f.risk], f.file, f.line or 0))
    report = home / "reports" / spec.task_id / "review.md"
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text(scrub(render_report(result)), encoding="utf-8")
    result.report_path = str(report)
    if remember:
        save_state(home, spec.task_id, repo, {"last_reviewed": head_sha, "reviewed_at": _dt.datetime.now(_dt.timezone.utc).isoformat(),
                                              "run_id": run_id, "base": base_sha, "model_reviewed": result.model_reviewed})
    say(f"review {spec.task_id}: {len(result.findings)} finding(s); {result.reviewed_by}")
    return result


def judged_compile_side(spec: Any, variant_id: str, home: Path) -> CompileSide | None:
    """The judgement's own AOT compile of the patched kernel (verdicts.parquet), as a compile side; None without one."""
    from kernel_assets.judge import load_judged_patch

    _, row = load_judged_patch(spec.task_id, variant_id, home)
    regs = row.get("regs_per_thread")
    if regs is None or regs != regs:
        return None
    stats = {k: (int(row[k]) if k != "occupancy" else float(row[k])) for k in ("regs_per_thread", "spill_bytes", "smem_bytes", "occupancy")
             if row.get(k) is not None and row[k] == row[k]}
    return CompileSide(label=f"new (the judged patch, as judgement {row.get('judgement_id', '?')} compiled it)", ok=True, stats=stats)


def patched_files(spec: Any, family: Any, repo: Path, variant_id: str, home: Path) -> dict[str, str] | None:
    """The family's editable files (paths relative to the checkout) as the working tree has them, with the
    judged patch applied; None when it does not apply any more (the tree changed since the judgement)."""
    from kernel_assets.judge import load_judged_patch
    from kregress.core.patch import PatchApplyError, apply_and_check, editable_set, parse_patch, read_sources

    text, _ = load_judged_patch(spec.task_id, variant_id, home)
    es = editable_set(family)
    sources = read_sources(es)
    try:
        applied = apply_and_check(parse_patch(text), sources)
    except (PatchApplyError, ValueError):
        return None
    out = {}
    for rel, body in {**sources, **applied.new_texts}.items():
        try:
            out[(es.root / rel).resolve().relative_to(repo).as_posix()] = body
        except ValueError:
            continue  # outside this checkout: not part of the compile comparison
    return out


def judged_patch_diff(spec: Any, family: Any, repo: Path, variant_id: str, home: Path) -> tuple[list[FileDiff], str, list[str]]:
    """(file diffs, base label, notes) of a patch ``kregress judge`` judged: its diff with paths relative to the
    checkout, what the judgement found as notes. Raises ReviewError when there is no such judged patch."""
    from kernel_assets.judge import load_judged_patch
    from kernel_assets.review.diff import parse_unified_diff
    from kregress.core.patch import editable_set

    try:
        text, row = load_judged_patch(spec.task_id, variant_id, home)
    except ValueError as exc:
        raise ReviewError(str(exc)) from None
    root = editable_set(family).root
    diffs = parse_unified_diff(text)
    for d in diffs:  # patch paths are relative to the family package's root; the review's, to the checkout
        for attr in ("path", "old_path"):
            p = getattr(d, attr)
            if p:
                try:
                    setattr(d, attr, (root / p).resolve().relative_to(repo).as_posix())
                except ValueError:
                    pass
    facts = [f"judged patch {variant_id} (sha256 {str(row.get('patch_sha256'))[:12]}): {row.get('verdict')} "
             f"{row.get('cause') or ''}: {' '.join(str(row.get('reasons') or '').split())[:300]}"]
    if row.get("regs_per_thread") is not None and row["regs_per_thread"] == row["regs_per_thread"]:
        facts.append(f"the judgement's AOT compile of the patched kernel ({spec.hardware.arch}): {int(row['regs_per_thread'])} "
                     f"registers/thread, {int(row['spill_bytes'])} B spills, {int(row['smem_bytes'])} B shared memory, "
                     f"occupancy {row['occupancy']:.2f}")
    return diffs, f"judged patch {variant_id}", facts


def _ask_model(result: ReviewResult, spec: Any, family: Any, mine: list[FileDiff], facts: list[str], gateway: Any,
               no_model_reason: str, run_id: str, partition: str, max_slice_chars: int, scrub: Callable[[str], str]) -> None:
    """The model, one slice at a time; a credentials or request error stops the rest, a per-slice error is a note."""
    slices = [(fd, text) for fd in mine if not fd.binary for text in render_slices(fd, max_slice_chars)]
    result.slices = len(slices)
    tokens = {"prompt": 0, "completion": 0, "total": 0}
    stop = "" if gateway is not None else (no_model_reason or "no gateway")
    checklist = spec_checklist(spec, family) if not stop else {}
    aliases: list[str] = []
    per_file_count: dict[str, int] = {}
    for fd, text in slices:
        per_file_count[fd.path] = per_file_count.get(fd.path, 0) + 1
        if stop:
            continue
        part = (per_file_count[fd.path], sum(1 for f2, _ in slices if f2 is fd))
        msgs = build_messages(spec, checklist, fd, text, part, facts)
        try:
            res = gateway.chat("review", msgs, ctx=CallContext(run_id=run_id, partition=partition or spec.task_id, round=0,
                                                               task=ASSET_NAME), budget=spec.budget)
        except (CredentialsError, RequestError) as e:
            stop = f"{e.category} error: {scrub(str(e))[:400]}"
            continue
        except BudgetExceeded as e:
            result.notes.append(f"{fd.path} slice {part[0]}: not reviewed: BudgetExceeded: {e.reason}")
            continue
        except (ContentError, RetriesExhausted, GatewayError) as e:
            result.notes.append(f"{fd.path} slice {part[0]}: not reviewed: {scrub(str(e))[:300]}")
            continue
        found, drop_notes = parse_findings(res.text, fd, scrub)
        result.findings += found
        result.notes += drop_notes
        result.slices_model_reviewed += 1
        if res.key_alias not in aliases:
            aliases.append(res.key_alias)
        tokens["prompt"] += res.prompt_tokens
        tokens["completion"] += res.completion_tokens
        tokens["total"] += res.total_tokens
        if res.finish_reason == "length":
            result.notes.append(f"{fd.path} slice {part[0]}: the model hit max_tokens; its answer may be cut short")
    result.tokens = tokens
    model = getattr(gateway, "model", "") if gateway is not None else ""
    if result.slices_model_reviewed == result.slices and result.slices:
        result.model_reviewed = True
        result.reviewed_by = f"model {model} ({', '.join(aliases)}), {result.slices} slice(s), plus the offline checks"
    elif result.slices_model_reviewed:
        result.reviewed_by = (f"model {model} reviewed {result.slices_model_reviewed} of {result.slices} slice(s)"
                              f"{f' (stopped: {stop})' if stop else ''}; the rest had only the offline checks")
    else:
        result.reviewed_by = f"no model reviewed this ({stop or 'every model call failed; see notes'}); offline checks only"
