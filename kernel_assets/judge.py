"""Judging candidate patches from anyone (``kregress judge``), with the gate the sweep uses.

A patch from a person, Codex, Claude Code or ``git diff HEAD~1 -- kernels/`` becomes a ``Suggestion``
with ``patch`` set and goes through the same benchmark backend as a sweep's variants
(``resources.gpu``: config-only variants as usual, patch variants through ``kernels.candidate``'s gate),
next to the spec's baseline; each verdict is ``verdict_with_gate``: the gate's causes (rejected, wrong,
precision, implausible) in front of the sweep's own rule (``kernel_assets.sweep.verdict_for``). No
Dagster instance is involved: the backend resource is constructed directly, as tests do.

Each judgement keeps its own record, never the sweep's files:
``$DAGSTER_HOME/reports/<task_id>/judge/<judgement id>/`` holds report.md ("kregress judge"), the Parquet
tables of a sweep (verdicts.parquet carries variant_id, verdict, cause and patch_sha256), each judged
patch as ``patches/<variant_id>.patch`` (what ``kregress review --patch VARIANT_ID`` reads) and
``judgement.json``; ``reports/<task_id>/judge/index.md`` lists every judgement of the task, newest first.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from kregress.core import paths
from kregress.core.gate_verdict import gate_verdict
from kregress.core.patch import SEARCH_REPLACE_FORMAT, NotAPatch, parse_patch
from kregress.core.records import Suggestion, VariantResult, Verdict

MAX_PATCH_BYTES = 200_000


class BadArgument(ValueError):
    """An argument that is not a patch at all (no such file, not a diff), or an unreadable config."""


@dataclass
class PatchArg:
    """One patch to judge: where it came from, its text, the variant id (the file's stem) and its config."""

    path: Path
    text: str
    variant_id: str
    config: dict[str, int] | None = None
    config_source: str = ""


def _variant_id(stem: str, taken: set[str]) -> str:
    vid = re.sub(r"[^A-Za-z0-9_.:-]+", "_", stem).strip("_") or "patch"
    vid = vid[:60]
    base, n = vid, 2
    while vid in taken:
        vid = f"{base}-{n}"
        n += 1
    taken.add(vid)
    return vid


def _read_config(text_or_path: str, what: str) -> dict[str, Any]:
    p = Path(text_or_path)
    try:
        raw = p.read_text() if p.is_file() else text_or_path
    except OSError as exc:
        raise BadArgument(f"{what}: cannot read {p}: {exc}") from None
    try:
        data = json.loads(raw)
    except ValueError as exc:
        hint = "" if p.is_file() else " (no such file either)"
        raise BadArgument(f"{what}: {text_or_path!r} is not a JSON config{hint}: {exc}") from None
    if not isinstance(data, dict):
        raise BadArgument(f"{what}: a config is a JSON object of tunables, got {type(data).__name__}")
    bad = [k for k, v in data.items() if isinstance(v, bool) or not isinstance(v, int)]
    if bad:
        raise BadArgument(f"{what}: tunables are integers; not: {', '.join(f'{k}={data[k]!r}' for k in bad)}")
    return data


def read_patch_args(args: list[str], config: str | None = None) -> list[PatchArg]:
    """``PATCH`` or ``PATCH:CONFIG.json`` arguments -> patches to judge; ``config`` (JSON text or a file)
    applies to every patch without its own. Raises ``BadArgument`` naming the argument and why it is
    not a patch: a missing file, binary or non-UTF-8 content, text with no unified diff in it."""
    default = _read_config(config, "--config") if config else None
    out: list[PatchArg] = []
    taken: set[str] = {"baseline"}
    for arg in args:
        path_s, cfg_s = arg, None
        if not Path(arg).exists() and ":" in arg:
            head, _, tail = arg.rpartition(":")
            if tail.endswith(".json") or tail.lstrip().startswith("{"):
                path_s, cfg_s = head, tail
        path = Path(path_s)
        if not path.is_file():
            raise BadArgument(f"{arg}: no such file")
        raw = path.read_bytes()
        if len(raw) > MAX_PATCH_BYTES:
            raise BadArgument(f"{arg}: {len(raw)} bytes; a patch is at most {MAX_PATCH_BYTES} bytes")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise BadArgument(f"{arg}: not UTF-8 text, so not a unified diff") from None
        try:
            parse_patch(text)
        except NotAPatch as exc:
            raise BadArgument(f"{arg}: not a patch: {exc}") from None
        except ValueError:
            pass  # a diff with a malformed hunk is judged (patch_failed), not refused
        cfg = _read_config(cfg_s, f"{arg} (config)") if cfg_s else default
        out.append(PatchArg(path=path, text=text, variant_id=_variant_id(path.stem, taken), config=cfg,
                            config_source=cfg_s or ("--config" if cfg else "")))
    return out


def check_inputs(bound: Any, patches: list[PatchArg], spec_path: str | Path = "") -> None:
    """Refuse, before any judging, what is an input error rather than a patch to judge: a diff whose hunks are
    malformed or cut short, a patch that does not apply to the family's editable files as they are, a config
    outside the family's space (a value not allowed, an unknown key, a rule it breaks). Raises ``BadArgument``
    with one line naming the file, the field and the fix. What the patch does (outside the region, a cheat, a
    kernel that does not compile) is left to the judgement: that is a verdict. ``spec_path``: the spec's file, named
    where the spec is at fault (default: its task_id)."""
    from kregress.core.patch import PatchApplyError, PatchFormatError, apply_and_check, editable_set, read_sources

    spec, family = bound.spec, bound.family
    try:
        es = editable_set(family)
    except ValueError as exc:
        raise BadArgument(f"{spec_path or spec.task_id}: kernel_family: {exc}. Fix: judge a patch against a spec whose "
                          "family has source") from None
    texts = read_sources(es)
    for p in patches:
        try:
            patch = parse_patch(p.text)
        except PatchFormatError as exc:
            raise BadArgument(f"{p.path}: a malformed or truncated diff: {exc}. Fix: write it again with `git diff` "
                              "(every hunk whole, as its @@ header counts)") from None
        ours = [fp for fp in patch.files if fp.status == "modified" and fp.path in es.files]
        try:
            apply_and_check(type(patch)(text=patch.text, files=ours), texts)
        except PatchApplyError as exc:
            raise BadArgument(f"{p.path}: does not apply to {exc.file} line {exc.line or '-'}: {exc.reason}. Fix: make the "
                              "diff against the source as it is now (git diff), or judge it against the commit it was "
                              "made on (--base REF)") from None
        config = {**spec.baseline, **(p.config or {})}
        problem = family.space.check(config, spec.params, spec.hardware.limits)
        if problem:
            where = p.config_source or f"{spec_path or spec.task_id}: baseline"
            raise BadArgument(f"{where}: config for {p.path.name}: {problem}. Fix: a config inside the family's space "
                              f"({family.space.describe()})")


def per_shape_sol(row: VariantResult, baseline: VariantResult, spec: Any, family: Any) -> list[tuple[str, float, float | None, float]]:
    """(shape, variant p50, same-batch baseline p50, speed of light) per measured shape; [] on model
    evidence (an estimate is not a timing to doubt)."""
    from kernels.dtypes import DTYPE_BYTES
    from kregress.core.names import MEASURED_EVIDENCE

    if row.evidence not in MEASURED_EVIDENCE:
        return []
    shapes = {family.shape_label(s): s for s in spec.shape_matrix}
    base = {m.shape: m.p50_ms for m in (row.batch_baseline or baseline.measurements)}
    out = []
    for m in row.measurements:
        shape = shapes.get(m.shape)
        if shape is None:
            continue
        sol = family.speed_of_light_ms(shape, DTYPE_BYTES[spec.dtype], spec.hardware, spec.params)
        out.append((m.shape, m.p50_ms, base.get(m.shape), sol))
    return out


def verdict_with_gate(row: VariantResult, baseline: VariantResult, spec: Any, family: Any) -> Verdict:
    """A variant's verdict: for a patch variant the gate's causes first (rejected and wrong as REGRESS,
    then precision and implausible as NEEDS_REVIEW), then the sweep's rule; a config-only variant gets
    the sweep's rule unchanged."""
    from kernel_assets.sweep import verdict_for

    v = (None if row.gate is None else gate_verdict(row, row.gate, per_shape_sol(row, baseline, spec, family))) \
        or verdict_for(row, baseline, spec)
    if row.error and v.reasons:  # the sweep's failure line is cut for a prompt; a judgement's record keeps it whole
        from kregress.core.records import config_label

        v.reasons[0] = f"{row.variant_id} [{config_label(row.config)}]: {row.error}: {' '.join(row.error_detail.split())}"
    return v


@dataclass
class JudgeResult:
    rows: list[VariantResult]
    verdicts: dict[str, Verdict]
    report_dir: Path  # this judgement's own folder: reports/<task_id>/judge/<judgement id>/
    lines: list[str] = field(default_factory=list)
    judgement_id: str = ""
    index: Path | None = None  # reports/<task_id>/judge/index.md


TERMINAL_REASON_CHARS = 400  # a verdict line on the terminal; the record (judgement.json, report.md) keeps it whole


def verdict_line(v: Verdict, record: Path | None = None, max_chars: int | None = None) -> str:
    """``<variant_id> <VERDICT> <cause>: <reason>`` (cause ``-`` when the verdict has none). With ``max_chars``
    a longer reason is cut there and ends with ``...`` and where the whole text is (``record``)."""
    reason = " ".join((v.reasons[0] if v.reasons else "").split())
    if max_chars is not None and len(reason) > max_chars:
        reason = reason[:max_chars].rstrip() + "..." + (f" (whole reason: {record})" if record else "")
    return f"{v.variant_id} {v.verdict} {v.cause or '-'}: {reason}"


JUDGE_DIR = "judge"  # reports/<task_id>/judge/: one folder per judgement and the index; a sweep never writes here
BASE_ENV = "KREGRESS_JUDGE_BASE"  # set by `--base REF` for the judgement it re-runs in an export of REF


def judge_root(task_id: str, home: Path | None = None) -> Path:
    """``reports/<task_id>/judge/`` under ``home`` (default: the current DAGSTER_HOME)."""
    return ((Path(home) / "reports" / task_id) if home else paths.reports_dir(task_id)) / JUDGE_DIR


def new_judgement_dir(task_id: str) -> tuple[str, Path]:
    """(judgement id, its new folder): a UTC timestamp and a random suffix, so two judges never share one."""
    import secrets
    import time

    root = judge_root(task_id)
    root.mkdir(parents=True, exist_ok=True)
    while True:
        jid = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + secrets.token_hex(3)
        d = root / jid
        try:
            d.mkdir()
        except FileExistsError:
            continue
        return jid, d


def judgements(task_id: str, home: Path | None = None) -> list[dict[str, Any]]:
    """Every judgement recorded for ``task_id`` (each folder's judgement.json), newest first."""
    root = judge_root(task_id, home)
    out = []
    for f in sorted(root.glob("*/judgement.json"), reverse=True):
        try:
            rec = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        rec["dir"] = str(f.parent)
        out.append(rec)
    return out


def write_index(task_id: str) -> Path:
    """Rewrite ``reports/<task_id>/judge/index.md`` from the judgements on disk (a table, newest first):
    the index is derived, so two judges finishing together cannot lose each other's entry."""
    root = judge_root(task_id)
    rows = judgements(task_id)
    lines = [f"# kregress judge: every judgement of {task_id}", "",
             "Each judgement has its own folder here (report.md, verdicts.parquet, patches/); a sweep's files "
             f"(`reports/{task_id}/report.md` and its tables) are separate and never touched by a judge.", "",
             "| judgement | when (UTC) | base | spec | patch: verdict cause |", "|---|---|---|---|---|"]
    for r in rows:
        verdicts = "<br>".join(f"`{v['variant_id']}`: {v['verdict']} {v.get('cause') or '-'}" for v in r.get("verdicts", []))
        lines.append(f"| [{r['judgement_id']}]({r['judgement_id']}/report.md) | {r.get('when', '')} | "
                     f"{r.get('base', 'working tree')} | `{r.get('spec', '')}` | {verdicts} |")
    tmp = root / f".index.md.{os.getpid()}"
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(root / "index.md")
    return root / "index.md"


def judge(spec_path: str | Path, patches: list[PatchArg], *, backend: str = "auto", seed: int = 0,
          log: Callable[[str], None] = print, bound: Any = None) -> JudgeResult:
    """Judge ``patches`` against the spec's baseline with the sweep's backends and gate; write the
    judgement's own record (a new folder under ``reports/<task_id>/judge/``) and the task's index.
    ``bound``: the spec as ``load_bound(spec_path)`` binds it, when the caller has it already."""
    import time

    from kernel_assets.report import write_report
    from kernel_assets.sweep import RoundState
    from kregress.core.bind import load_bound
    from kregress.core.family import ExternalFamily
    from resources.gpu import compiled_backend

    bound = bound or load_bound(spec_path)  # the same binding a sweep makes: schema and the family's checks
    spec, family = bound.spec, bound.family
    choice = backend if backend != "auto" else (spec.benchmark.backend if spec.benchmark.backend != "auto" else "auto")
    bench = compiled_backend(choice, patch_seed=seed)
    suggestions = [Suggestion(variant_id="baseline", config=spec.baseline, patch_summary="the spec's baseline config",
                              source="baseline", round=0, risk="low")]
    for p in patches:
        cfg = {**spec.baseline, **(p.config or {})}
        suggestions.append(Suggestion(variant_id=p.variant_id, config=cfg, round=1, source="judge",
                                      patch_summary=f"patch {p.path.name}"[:120], patch=p.text))
    problem = bench.check_spec(spec, family)
    if problem and isinstance(family, ExternalFamily):  # an external kernel on a host with no GPU: static checks only
        log(f"static checks only: {problem}")
        rows = static_only_rows(bound, suggestions, bench.kind, problem)
    else:
        rows, _stats = bench.evaluate(bound, suggestions, log=log)
    base, judged = rows[0], rows[1:]
    verdicts = {r.variant_id: verdict_with_gate(r, base, spec, family) for r in judged}
    jid, out_dir = new_judgement_dir(spec.task_id)
    pdir = out_dir / "patches"
    pdir.mkdir(exist_ok=True)
    for p in patches:
        (pdir / f"{p.variant_id}.patch").write_text(p.text)
    base_src = os.environ.get(BASE_ENV) or "working tree"
    state = RoundState(round=1, history=[base] + judged, objective={}, best_id=base.variant_id, best_value=None,
                       stopped="judged with kregress judge (no search)",
                       notes=[f"judgement {jid}; the baseline and every patch were built from the {base_src}"
                              + ("" if base_src == "working tree" else " (an export of that commit; the working tree was not touched)")]
                       + [f"{p.variant_id}: {p.path}" + (f" with config {p.config_source}" if p.config_source else "")
                          for p in patches])
    write_report(out_dir, spec, str(spec_path), state, verdicts, list(family.space.params), judgement=True)
    lines = [verdict_line(verdicts[r.variant_id]) for r in judged]  # whole, as the record keeps them
    record = {"judgement_id": jid, "task_id": spec.task_id, "when": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
              "spec": str(spec_path), "spec_hash": spec.content_hash(), "base": base_src, "seed": seed,
              "backend": base.backend, "evidence": base.evidence,
              "verdicts": [{"variant_id": r.variant_id, "verdict": verdicts[r.variant_id].verdict,
                            "cause": verdicts[r.variant_id].cause, "reasons": list(verdicts[r.variant_id].reasons),
                            "patch_sha256": r.patch_sha256,
                            "patch_file": str(next(p.path for p in patches if p.variant_id == r.variant_id))}
                           for r in judged],
              "lines": lines}
    (out_dir / "judgement.json").write_text(json.dumps(record, indent=1))
    index = write_index(spec.task_id)
    terminal = [verdict_line(verdicts[r.variant_id], out_dir / "judgement.json", TERMINAL_REASON_CHARS) for r in judged]
    return JudgeResult(rows=judged, verdicts=verdicts, report_dir=out_dir, lines=terminal, judgement_id=jid, index=index)


STATIC_ONLY = "static checks only (the patch applies, reverts and stays inside the editable region); correctness and timing need a GPU"


def static_only_rows(bound: Any, suggestions: list[Suggestion], backend: str, why: str) -> list[VariantResult]:
    """Rows for a family whose kernel this host's backend cannot run (an external kernel on a host with no GPU):
    each patch goes through the gate's static stage (parse, apply and revert, editable region, static policy),
    nothing runs, and a row that passes says what was not checked and why (``why``: the backend's own line), so
    its verdict is NEEDS_REVIEW, never PASS."""
    from kernels.candidate import JudgeOptions, static_stage
    from kregress.core.patch import editable_set, read_sources
    from kregress.core.records import base_row

    spec, family = bound.spec, bound.family
    es = editable_set(family)
    texts = read_sources(es)
    base_hash = family.source_hash({es.files[rel]: t for rel, t in texts.items()})
    opts = JudgeOptions.for_spec(spec)
    rows = []
    for s in suggestions:
        row = base_row(s, backend)
        rows.append(row)
        if s.patch:
            cand = static_stage(family, es, texts, base_hash, s, opts)
            row.gate = cand.report
            if cand.error:
                row.error, row.error_detail = cand.error, cand.detail
                continue
        problem = family.space.check(s.config, spec.params, spec.hardware.limits)
        if problem:
            row.error, row.error_detail = "invalid_config", problem
            continue
        row.error_detail = f"{STATIC_ONLY}: {why}"
    return rows


def load_judged_patch(task_id: str, variant_id: str, home: Path | None = None) -> tuple[str, dict[str, Any]]:
    """(patch text, its verdicts.parquet row) of a patch ``kregress judge`` judged for ``task_id``: the
    newest judgement holding ``variant_id``, or ``<judgement id>/<variant_id>`` for an older one. The
    text's sha256 must match the row's. Raises ValueError saying what is missing."""
    import hashlib

    import pandas as pd

    root = judge_root(task_id, home)
    jid, _, vid = variant_id.rpartition("/")
    folders = [root / jid] if jid else sorted((d for d in root.glob("*") if d.is_dir()), reverse=True)
    found = next((d for d in folders if (d / "patches" / f"{vid}.patch").is_file()), None)
    if found is None or not (found / "verdicts.parquet").is_file():
        raise ValueError(f"no judged patch {variant_id!r} for {task_id} under {root} (expected <judgement id>/patches/"
                         f"{vid}.patch and verdicts.parquet). Fix: run `kregress judge SPEC {vid}.patch` first")
    f, table = found / "patches" / f"{vid}.patch", found / "verdicts.parquet"
    text = f.read_text()
    df = pd.read_parquet(table)
    rows = df[df["variant_id"] == vid].to_dict("records")
    if not rows:
        raise ValueError(f"{table} has no row for {vid!r}. Fix: judge the patch again")
    row = rows[0]
    if row.get("patch_sha256") and row["patch_sha256"] != hashlib.sha256(text.encode()).hexdigest():
        raise ValueError(f"{f} changed since it was judged (sha256 differs from verdicts.parquet). Fix: judge it again")
    row["judgement_id"] = found.name
    return text, row


# --- a patch already in the working tree ------------------------------------------------------------


def already_applied(family: Any, patch_text: str) -> list[str]:
    """The files (relative to the family's root) in which ``patch_text`` is already applied: its reverse
    applies cleanly to the file on disk and the patch itself does not. [] when it is not applied (or
    only partly, or it does not parse: the gate says what is wrong with it)."""
    from kregress.core.patch import PatchFormatError, apply_file, editable_set, read_sources

    try:
        patch = parse_patch(patch_text)
        texts = read_sources(editable_set(family))
    except (NotAPatch, PatchFormatError, ValueError, OSError):
        return []
    hit = []
    for fp in patch.files:
        if fp.old_path is None or fp.new_path is None or fp.binary or fp.new_path not in texts:
            return []
        cur = texts[fp.new_path]
        try:
            apply_file(cur, fp.reversed())
        except ValueError:
            return []
        try:
            apply_file(texts.get(fp.old_path, cur), fp)
            return []  # applies both ways (an ambiguous context): not known to be applied
        except ValueError:
            hit.append(fp.new_path)
    return hit


def export_base(family: Any, ref: str, dest: Path) -> tuple[Path, str]:
    """Export ``ref`` of the git checkout that holds the family's package into ``dest`` (``git archive``:
    the working tree and the index are only read) -> (the export's import root, the commit's sha).
    Raises BadArgument when the family is not in a git checkout or ``ref`` is unknown."""
    import io
    import subprocess
    import tarfile

    from kregress.core.patch import editable_set

    root = editable_set(family).root
    top = subprocess.run(["git", "-C", str(root), "rev-parse", "--show-toplevel"], capture_output=True, text=True)
    if top.returncode != 0:
        raise BadArgument(f"--base {ref}: {root} is not in a git checkout, so there is no committed source to judge "
                          "against. Fix: stash or revert the change by hand and judge without --base")
    top_dir = Path(top.stdout.strip())
    sha = subprocess.run(["git", "-C", str(top_dir), "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
                         capture_output=True, text=True)
    if sha.returncode != 0:
        raise BadArgument(f"--base {ref}: no such commit in {top_dir}. Fix: a branch, tag or sha, e.g. --base HEAD")
    archive = subprocess.run(["git", "-C", str(top_dir), "archive", "--format=tar", sha.stdout.strip()],
                             capture_output=True, check=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(dest, filter="data")
    return dest / root.relative_to(top_dir), sha.stdout.strip()


# --- the llm policy's patches (search.patches: true) ------------------------------------------------------

PATCH_SYSTEM_ADDENDUM = """\
This task also accepts source patches. Exception to "no source code": an element may carry the key
"patch": SEARCH/REPLACE blocks that edit only the EDITABLE SOURCE shown (the @triton.jit functions and
the launch wrapper), each block written as
""" + SEARCH_REPLACE_FORMAT + """At most {max_lines} changed lines. Keep every kernel @triton.jit and the wrapper's signature; compute with
Triton only: no torch compute, no try/except, no imports, no module-level state, no environment, device or
timer access. A patch is judged on secret inputs and hidden shapes; a cheat is rejected."""


def patch_prompt(ctx: Any, system: str) -> tuple[str, str]:
    """(system prompt, user section) for a round whose spec allows patches: the rules, and the family's
    editable source with line numbers, cut at ``spec.patches.max_source_chars`` (the prompt carries it, so
    the round's token budget counts it)."""
    from kregress.core.family import CudaFamily
    from kregress.core.patch import editable_set, editable_source_text, read_sources

    if isinstance(ctx.family, CudaFamily):  # .cu kernel functions (resources/cuda_judge.py)
        from resources.cuda_judge import CUDA_PATCH_ADDENDUM, cuda_source_text

        source = cuda_source_text(ctx.family, ctx.spec.patches.max_source_chars)
        return (system + "\n" + CUDA_PATCH_ADDENDUM.format(max_lines=ctx.spec.patches.max_changed_lines),
                f"\nEDITABLE SOURCE (numbers are line numbers, not part of the text):\n{source}")
    es = editable_set(ctx.family)
    source = editable_source_text(es, read_sources(es), ctx.spec.patches.max_source_chars)
    addendum = PATCH_SYSTEM_ADDENDUM.format(max_lines=ctx.spec.patches.max_changed_lines)
    return system + "\n" + addendum, f"\nEDITABLE SOURCE (numbers are line numbers, not part of the text):\n{source}"


def patch_from_reply(value: Any, ctx: Any) -> tuple[str | None, str | None]:
    """A reply's ``patch`` -> (unified diff, None), or (None, why it is dropped). SEARCH/REPLACE blocks are
    turned into the same diff ``kregress judge`` reads; a unified diff is taken as it is."""
    from kregress.core.patch import PatchFormatError, editable_set, read_sources, search_replace_to_diff

    if value in (None, ""):
        return None, None
    if not ctx.spec.search.patches:
        return None, "a patch, but this spec does not take patches (search.patches: false)"
    if not isinstance(value, str):
        return None, f"patch must be text (SEARCH/REPLACE blocks or a unified diff), got {type(value).__name__}"
    if "<<<<<<< SEARCH" in value:
        from kregress.core.family import CudaFamily

        if isinstance(ctx.family, CudaFamily):  # the .cu files, not the Python module
            from resources.cuda_judge import cuda_sources

            sources, default = cuda_sources(ctx.family)
        else:
            es = editable_set(ctx.family)
            sources, default = read_sources(es), es.module_file
        try:
            diff = search_replace_to_diff(value, sources, default_path=default)
        except ValueError as exc:
            return None, f"patch: {exc}"
        return (diff, None) if diff else (None, "patch: the SEARCH/REPLACE blocks change nothing")
    try:
        parse_patch(value)
    except (NotAPatch, PatchFormatError) as exc:
        return None, f"patch: {exc}"
    return value, None
