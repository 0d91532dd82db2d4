"""kernel_source_review: an agent review (role "review") of the kernel changes that matter to one spec.

What is reviewed: ``git diff <base> -- kernels/`` against the working tree (untracked kernel files included),
where <base> is the asset config's ``base_ref``, else the revision this spec last reviewed in this repository
(remembered in ``$DAGSTER_HOME/review/<task_id>.json``), else HEAD (the uncommitted changes). Only the files
that matter to the spec are reviewed: its family's module (e.g. ``kernels/gemm.py``) and the ``kernels/``
modules it imports; other changed kernel files are listed, not reviewed.

How: the diff is sliced per kernel file (and a large file's hunks into several slices); each slice goes to
the model on its own (never the whole repository in one prompt) with the spec's acceptance checklist
(numerics in fp16/bf16/fp8, masks and boundaries, shared memory and registers, tile scheduling and K
splitting, split-K reduction order and write-back, interface, fallback path, evidence) and the offline facts
about that file. The answer is untrusted data: parsed as JSON, validated into ``ReviewFinding`` rows
(checklist item, risk, file, line, evidence, a local command that would verify it); a finding that cites a
line outside the diff is kept but flagged. Suggested commands are listed, never executed.

Offline (no key, or the model call failed) the checks that need no model still run and the result says that
no model reviewed it: the AOT compile of the spec's baseline config for sm_90 (no GPU needed) with the base
version of the kernel module (``git show <base>:kernels/<file>.py`` materialised into a temporary copy of the
``kernels`` package) and with the new one, each in a child process, giving register / spill / shared memory /
occupancy / SASS deltas and the space-rule check of the baseline; and which checklist items the tests under
``tests/`` touch for the changed kernel (a keyword match over the test functions, not a proof of coverage).

Findings appear as a table in the asset's metadata and in ``$DAGSTER_HOME/reports/<task_id>/review.md``.
Keys never appear in either: model text is scrubbed of every key in the environment.
"""


import ast
import datetime as _dt
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Literal

import dagster as dg
from pydantic import BaseModel, Field, ValidationError

from kernel_assets.constants import SPECS_PARTITIONS
from kregress.core import paths

GROUP_REVIEW = "review"
ASSET_NAME = "kernel_source_review"
CHECK_NAME = "kernel_review_clean"
REPO_ROOT = Path(__file__).resolve().parent.parent
KERNELS_DIR = "kernels"
MAX_RESPONSE_CHARS = 32_000
MAX_FINDINGS_PER_SLICE = 50
DEFAULT_SLICE_CHARS = 16_000
COMPILE_TIMEOUT_S = 300
RISKS = ("low", "medium", "high")
_RISK_ORDER = {"high": 0, "medium": 1, "low": 2}
_DANGEROUS = re.compile(r"\b(rm\s+-|git\s+push|kubectl|psql|mysql|docker\s+push|curl|wget|dd\s+if=|mkfs|shutdown|chmod\s+-R)\b", re.IGNORECASE)


class ReviewError(RuntimeError):
    """The review cannot run (no git, not a repository, an unknown base ref); the message says what to do."""


# --- the checklist ---------------------------------------------------------------------------------------

CHECKLIST: dict[str, str] = {
    "numerics": "Numerics against the float64 reference in fp16 / bf16 / fp8: accumulator dtype, casts on load and store, scaling, tolerance",
    "masks_boundaries": "Masks and boundaries: causal, sliding window, variable length, padding, block edges (off-by-one, < vs <=, partial tiles)",
    "smem_registers": "Shared memory and registers: stages x tile sizes, spills, within the spec's limits on the target arch",
    "tile_scheduling": "Tile scheduling and K splitting: grid size, program-id mapping, grouped order, divisibility rules of the space",
    "splitk_reduction": "Split-K reduction order and write-back: partial results, combine step, atomics, determinism, what is stored where",
    "interface": "Interface: layouts, strides, head dims, dtypes, contiguity, argument order between launcher and kernel",
    "fallback": "Fallback path: unsupported shapes or dtypes, the interpreter path, errors instead of silently wrong results",
    "evidence": "Evidence: tests and measurements that prove the change (correctness shapes, compile stats, benchmark evidence kind)",
}
ChecklistId = Literal["numerics", "masks_boundaries", "smem_registers", "tile_scheduling", "splitk_reduction", "interface", "fallback", "evidence"]

# Which test source mentions which checklist item (keyword match; reported as such, never as proof).
COVERAGE_KEYWORDS: dict[str, str] = {
    "numerics": r"\b(fp16|bf16|fp8|float8\w*|float16|bfloat16|allclose|max_abs_err|max_rel_err|reference|tolerance)\b",
    "masks_boundaries": r"\b(causal|window\w*|varlen|cu_seqlens|seqlens|padding|pad\w*|ragged|boundar\w*|edge\w*|mask\w*)\b",
    "smem_registers": r"\b(regs_per_thread|smem\w*|shared_memory\w*|spill\w*|registers?|out_of_resources|compile_units|occupancy)\b",
    "tile_scheduling": r"\b(GROUP_M|swizzl\w*|grid|BLOCK_[MNKH]|page_size|divisib\w*|num_splits)\b",
    "splitk_reduction": r"\b(num_splits|split\w*|combine\w*|lse|reduction|atomic\w*)\b",
    "interface": r"\b(stride\w*|head_dim\w*|contiguous|transpose\w*|layout|dtype|shape\w*)\b",
    "fallback": r"\b(fallback|interpret\w*|unsupported|raises|ValueError|invalid\w*)\b",
    "evidence": r"\b(evidence|benchmark\w*|do_bench\w*|replay|measure\w*)\b",
}


def spec_checklist(spec: Any, family: Any) -> dict[str, str]:
    """The checklist with this spec's specifics: dtype, params, limits, the space's rules."""
    c = spec.constraints
    params = ", ".join(f"{k}={v}" for k, v in sorted((spec.params or {}).items())) or "none"
    space = family.space
    split = "num_splits" in space.params
    return {
        "numerics": f"{CHECKLIST['numerics']}. Spec dtype {spec.dtype}; tolerance {c.numeric_tolerance} against float64.",
        "masks_boundaries": f"{CHECKLIST['masks_boundaries']}. Spec params: {params}; correctness shapes are ragged on purpose: "
                            f"{'; '.join(family.shape_label(s) for s in spec.correctness_shapes)}.",
        "smem_registers": f"{CHECKLIST['smem_registers']}. Limits: <= {c.max_registers_per_thread} registers/thread, <= {c.max_shared_memory_bytes} "
                          f"bytes shared memory, <= {c.max_spill_bytes} spill bytes, arch {spec.hardware.arch}.",
        "tile_scheduling": f"{CHECKLIST['tile_scheduling']}. Space: {space.describe()}.",
        "splitk_reduction": CHECKLIST["splitk_reduction"] + (f". Splits in this family: num_splits in {space.params['num_splits']}."
                                                             if split else ". This family has no split-K knob; flag any split the diff adds."),
        "interface": f"{CHECKLIST['interface']}. Shape keys: {', '.join(family.shape_keys)}.",
        "fallback": CHECKLIST["fallback"] + ".",
        "evidence": CHECKLIST["evidence"] + ".",
    }


# --- records ---------------------------------------------------------------------------------------------


class ReviewFinding(BaseModel):
    checklist_item: ChecklistId
    risk: Literal["low", "medium", "high"]
    file: str = Field(max_length=300)
    line: int | None = Field(default=None, ge=1)
    evidence: str = Field(max_length=800)
    verify_command: str = Field(default="", max_length=400)
    source: Literal["model", "offline"] = "model"
    in_diff: bool | None = None  # None: the finding cites no line
    flag: str = ""  # why this finding needs a second look (a line outside the diff, a destructive command ...)


class CompileSide(BaseModel):
    label: str  # "base <sha>" or "new (working tree)"
    ok: bool
    error: str = ""
    detail: str = ""
    space_check: str | None = None  # None: the baseline config is inside the family's space
    stats: dict[str, Any] | None = None


class CompileDelta(BaseModel):
    config: dict[str, int]
    base: CompileSide | None
    new: CompileSide
    rows: list[dict[str, Any]] = []  # metric, base, new, delta


class ReviewResult(BaseModel):
    task_id: str
    repo: str
    base_ref: str
    base_sha: str
    head_sha: str
    worktree_dirty: bool
    files_reviewed: list[str] = []
    files_changed_elsewhere: list[str] = []
    slices: int = 0
    slices_model_reviewed: int = 0
    findings: list[ReviewFinding] = []
    compile: CompileDelta | None = None
    coverage: dict[str, list[str]] = {}
    reviewed_by: str = ""
    model_reviewed: bool = False
    notes: list[str] = []
    tokens: dict[str, int] = {}
    report_path: str = ""

    @property
    def suggested_commands(self) -> list[str]:
        seen: list[str] = []
        for f in self.findings:
            if f.verify_command and f.verify_command not in seen:
                seen.append(f.verify_command)
        return seen


# --- git -------------------------------------------------------------------------------------------------


def _git(repo: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    if shutil.which("git") is None:
        raise ReviewError("git is not installed on this host; the review reads the kernel diff with git. "
                          "Fix: install git, or materialize the review where the repository is checked out.")
    p = subprocess.run(["git", "-C", str(repo), "-c", "core.quotepath=off", *args], capture_output=True, text=True, timeout=120)
    if check and p.returncode != 0:
        raise ReviewError(f"git {' '.join(args[:3])} failed in {repo}: {p.stderr.strip()[:300] or 'exit ' + str(p.returncode)}")
    return p


def repo_toplevel(repo: Path) -> Path:
    if not repo.is_dir():
        raise ReviewError(f"{repo} does not exist. Fix: set the review's repo_dir to the checkout that holds {KERNELS_DIR}/.")
    p = _git(repo, "rev-parse", "--show-toplevel", check=False)
    if p.returncode != 0:
        raise ReviewError(f"{repo} is not a git repository ({p.stderr.strip()[:200]}). "
                          f"Fix: set the review's repo_dir to a git checkout that holds {KERNELS_DIR}/.")
    return Path(p.stdout.strip())


def resolve_ref(repo: Path, ref: str, what: str) -> str:
    p = _git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", check=False)
    if p.returncode != 0 or not p.stdout.strip():
        if ref == "HEAD":
            raise ReviewError(f"{repo} has no commits yet, so there is no base to diff against. Fix: commit the kernels once, "
                              "then change them and review.")
        raise ReviewError(f"{what} {ref!r} is not a commit in {repo}. Fix: `git fetch` it, or set base_ref to an existing "
                          "branch, tag or sha (e.g. origin/main or HEAD~1).")
    return p.stdout.strip()


# --- diff ------------------------------------------------------------------------------------------------


class Hunk(BaseModel):
    header: str
    # (kind, old line, new line, text): kind ' ' context, '+' added, '-' removed
    lines: list[tuple[str, int | None, int | None, str]] = []


class FileDiff(BaseModel):
    path: str  # new path (old path for a deletion)
    old_path: str = ""
    status: Literal["modified", "added", "deleted", "renamed"] = "modified"
    hunks: list[Hunk] = []
    binary: bool = False

    def lines_in_diff(self) -> set[int]:
        """New-side line numbers the diff shows (added and context lines): what a finding may cite."""
        return {n for h in self.hunks for k, _, n, _ in h.lines if n is not None}

    def changed_lines(self) -> set[int]:
        return {n for h in self.hunks for k, _, n, _ in h.lines if k == "+" and n is not None}

    def spans(self) -> str:
        out = []
        for h in self.hunks:
            ns = [n for _, _, n, _ in h.lines if n is not None]
            if ns:
                out.append(f"{min(ns)}-{max(ns)}")
        return ", ".join(out) or "none"


_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@(.*)$")


def parse_unified_diff(text: str) -> list[FileDiff]:
    """``git diff`` output -> files with their hunks (line numbers counted from the hunk headers)."""
    files: list[FileDiff] = []
    cur: FileDiff | None = None
    hunk: Hunk | None = None
    old_n = new_n = old_left = new_left = 0
    for line in text.splitlines():
        if hunk is not None and (old_left > 0 or new_left > 0):
            kind, body = line[:1], line[1:]
            if kind == " " or line == "":
                hunk.lines.append((" ", old_n, new_n, body))
                old_n, new_n, old_left, new_left = old_n + 1, new_n + 1, old_left - 1, new_left - 1
                continue
            if kind == "+":
                hunk.lines.append(("+", None, new_n, body))
                new_n, new_left = new_n + 1, new_left - 1
                continue
            if kind == "-":
                hunk.lines.append(("-", old_n, None, body))
                old_n, old_left = old_n + 1, old_left - 1
                continue
            if kind == "\\":  # "\ No newline at end of file"
                continue
            hunk = None  # malformed counts: fall through to header parsing
        if line.startswith("\\"):
            continue
        if line.startswith("diff --git "):
            m = re.match(r"^diff --git a/(.+?) b/(.+)$", line)
            cur = FileDiff(path=m.group(2) if m else line.split()[-1], old_path=m.group(1) if m else "")
            files.append(cur)
            hunk = None
            continue
        if cur is None:
            continue
        m = _HUNK.match(line)
        if m:
            hunk = Hunk(header=line)
            cur.hunks.append(hunk)
            old_n, new_n = int(m.group(1)), int(m.group(3))
            old_left = int(m.group(2)) if m.group(2) is not None else 1
            new_left = int(m.group(4)) if m.group(4) is not None else 1
            continue
        if line.startswith("new file mode"):
            cur.status = "added"
        elif line.startswith("deleted file mode"):
            cur.status = "deleted"
        elif line.startswith("rename from "):
            cur.old_path, cur.status = line[len("rename from "):], "renamed"
        elif line.startswith("rename to "):
            cur.path = line[len("rename to "):]
        elif line.startswith("Binary files"):
            cur.binary = True
        elif line.startswith("--- ") and line[4:] == "/dev/null":
            cur.status = "added"
        elif line.startswith("+++ ") and line[4:] == "/dev/null":
            cur.status = "deleted"
            cur.path = cur.old_path or cur.path
    return files


def _added_file(path: str, text: str) -> FileDiff:
    lines = text.splitlines()
    h = Hunk(header=f"@@ -0,0 +1,{len(lines)} @@ (untracked file)", lines=[("+", None, i + 1, t) for i, t in enumerate(lines)])
    return FileDiff(path=path, status="added", hunks=[h] if lines else [])


def kernel_diff(repo: Path, base_sha: str) -> list[FileDiff]:
    """Base commit -> working tree for kernels/, plus untracked files there."""
    out = _git(repo, "diff", "--no-color", "--no-ext-diff", "--find-renames", "-U3", base_sha, "--", f"{KERNELS_DIR}/").stdout
    files = parse_unified_diff(out)
    untracked = _git(repo, "ls-files", "--others", "--exclude-standard", "--", f"{KERNELS_DIR}/").stdout.split("\n")
    for rel in [u for u in untracked if u.strip()]:
        try:
            files.append(_added_file(rel, (repo / rel).read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError):
            files.append(FileDiff(path=rel, status="added", binary=True))
    return files


def render_slices(fd: FileDiff, max_chars: int) -> list[str]:
    """The file's hunks with new-side line numbers, cut into slices of at most ~max_chars (whole hunks where possible)."""
    blocks = []
    for h in fd.hunks:
        rows = [h.header]
        for kind, _old, new, body in h.lines:
            num = f"{new:>5}" if new is not None else "     "
            rows.append(f"{num} {kind}{body}")
        block = "\n".join(rows)
        if len(block) > max_chars:
            block = block[: max_chars - 40].rsplit("\n", 1)[0] + "\n      (hunk truncated here)"
        blocks.append(block)
    slices: list[str] = []
    cur: list[str] = []
    size = 0
    for b in blocks:
        if cur and size + len(b) > max_chars:
            slices.append("\n".join(cur))
            cur, size = [], 0
        cur.append(b)
        size += len(b) + 1
    if cur:
        slices.append("\n".join(cur))
    return slices


# --- which files matter to the spec -------------------------------------------------------------------------


def family_module_path(family: Any) -> str:
    name = getattr(family.module, "__name__", "") or f"{KERNELS_DIR}.{family.name}"
    return name.replace(".", "/") + ".py"


def relevant_files(repo: Path, module_path: str, base_sha: str) -> list[str]:
    """The family module and the kernels/ modules it imports (read from the working tree, else from the base)."""
    src = ""
    p = repo / module_path
    if p.is_file():
        src = p.read_text(encoding="utf-8", errors="replace")
    else:
        r = _git(repo, "show", f"{base_sha}:{module_path}", check=False)
        src = r.stdout if r.returncode == 0 else ""
    deps = re.findall(rf"^\s*(?:from|import)\s+{KERNELS_DIR}\.(\w+)", src, re.MULTILINE)
    return [module_path] + [f"{KERNELS_DIR}/{d}.py" for d in dict.fromkeys(deps) if f"{KERNELS_DIR}/{d}.py" != module_path]


# --- offline: compile both sides -------------------------------------------------------------------------

_CHILD = r"""
import json, sys
root = sys.argv[1]
sys.path.insert(0, root)
job = json.loads(sys.argv[2])
out = {}
try:
    import kregress.core.family as reg
    fam = reg.get_family(job["family"])
    out["source_file"] = getattr(fam.module, "__file__", "") or ""
    out["space_check"] = fam.space.check(job["config"], job["params"])
    from kernels.compile import CompileError, compile_units
    from kregress.core.spec import HardwareLimits
    try:
        units = fam.compile_units(job["config"], job["dtype"], job["params"])
        out["stats"] = compile_units(units, job["arch"], HardwareLimits(**job["limits"])).model_dump()
    except CompileError as e:
        out["error"], out["detail"] = e.error, e.detail
except Exception as e:
    out["error"], out["detail"] = "compile_failed", (type(e).__name__ + ": " + str(e))[:400]
print("@@review " + json.dumps(out, default=str), flush=True)
"""

DELTA_METRICS = ("regs_per_thread", "spill_bytes", "smem_bytes", "occupancy", "blocks_per_sm", "sass_instructions")


def _child_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TAOTOKEN_", "ANTHROPIC_", "OPENAI_"))}  # the child needs no key
    env.pop("TRITON_INTERPRET", None)
    env.pop("PYTHONPATH", None)
    env.update(PYTHONDONTWRITEBYTECODE="1", PYTHONWARNINGS="ignore", TRITON_DEFAULT_FP_FUSION=env.get("TRITON_DEFAULT_FP_FUSION", "1"),
               TRITON_CACHE_DIR=str(home / "cache" / "triton"))
    return env


def _start_compile(root: Path, job: dict, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _CHILD, str(root), json.dumps(job)], cwd=str(root), env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish_compile(p: subprocess.Popen, root: Path, label: str, timeout: float) -> CompileSide:
    try:
        stdout, stderr = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        return CompileSide(label=label, ok=False, error="timeout", detail=f"compile ran past {timeout:.0f}s and was killed")
    line = next((ln for ln in stdout.splitlines() if ln.startswith("@@review ")), "")
    if not line:
        tail = (stderr or "").strip().splitlines()[-1:] or [f"exit {p.returncode}"]
        return CompileSide(label=label, ok=False, error="crashed", detail=tail[0][:300])
    res = json.loads(line[len("@@review "):])
    src = res.get("source_file", "")
    if src and not Path(src).resolve().is_relative_to(root.resolve()):
        return CompileSide(label=label, ok=False, error="wrong_source", detail=f"the child imported {src}, not a module under {root}")
    stats = res.get("stats")
    return CompileSide(label=label, ok=stats is not None, error=res.get("error", ""), detail=res.get("detail", ""),
                       space_check=res.get("space_check"), stats=stats)


def _compile_cache_key(root: Path, job: dict) -> str:
    """Same kernels/ sources + same job + same compiler -> same stats."""
    import hashlib

    import triton

    h = hashlib.sha256(json.dumps([job, triton.__version__, _CHILD], sort_keys=True).encode())
    for f in sorted((root / KERNELS_DIR).rglob("*.py")):
        h.update(str(f.relative_to(root)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:32]


def _cache_get(d: Path, key: str) -> dict | None:
    try:
        return json.loads((d / f"{key}.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _cache_put(d: Path, key: str, value: dict) -> None:
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / f"{key}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(value))
    os.replace(tmp, d / f"{key}.json")


def compile_deltas(repo: Path, base_sha: str, spec: Any, family_name: str, changed: list[FileDiff], home: Path,
                   timeout: float = COMPILE_TIMEOUT_S) -> CompileDelta:
    """AOT-compile the spec's baseline config with the base and the new kernel sources (in parallel child processes)."""
    job = {"family": family_name, "config": dict(spec.baseline), "params": dict(spec.params or {}), "dtype": spec.dtype,
           "arch": spec.hardware.arch, "limits": spec.hardware.limits.model_dump()}
    env = _child_env(home)
    with tempfile.TemporaryDirectory(prefix="kregress-review-base-") as tmp:
        base_root = Path(tmp)
        shutil.copytree(repo / KERNELS_DIR, base_root / KERNELS_DIR, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        base_ok = True
        for fd in changed:
            if fd.status == "added":
                (base_root / fd.path).unlink(missing_ok=True)
                continue
            old = fd.old_path or fd.path
            blob = subprocess.run(["git", "-C", str(repo), "show", f"{base_sha}:{old}"], capture_output=True, timeout=60)
            if blob.returncode != 0:
                base_ok = False
                continue
            if fd.status == "renamed":
                (base_root / fd.path).unlink(missing_ok=True)
            dest = base_root / old
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(blob.stdout)
        cache_dir = Path(os.environ.get("KREGRESS_REVIEW_CACHE") or home / "cache" / "review-compile")
        roots = {"new": repo}
        if base_ok:
            roots["base"] = base_root
        keys = {name: _compile_cache_key(root, job) for name, root in roots.items()}
        sides: dict[str, CompileSide] = {}
        procs = []
        for name, root in roots.items():
            label = f"base {base_sha[:10]}" if name == "base" else "new (working tree)"
            hit = _cache_get(cache_dir, keys[name])
            if hit is not None:
                sides[name] = CompileSide(**{**hit, "label": label})
            else:
                procs.append((name, root, label, _start_compile(root, job, env)))
        for name, root, label, p in procs:
            sides[name] = _finish_compile(p, root, label, timeout)
            if sides[name].error not in ("timeout", "crashed", "wrong_source"):
                _cache_put(cache_dir, keys[name], sides[name].model_dump())
    base = sides.get("base")
    new = sides["new"]
    rows: list[dict[str, Any]] = []
    if base and base.stats and new.stats:
        metrics = list(DELTA_METRICS) + [f"sass.{k}" for k in sorted(set(base.stats.get("sass_mix", {})) | set(new.stats.get("sass_mix", {})))]
        for m in metrics:
            if m.startswith("sass."):
                b, n = base.stats.get("sass_mix", {}).get(m[5:], 0), new.stats.get("sass_mix", {}).get(m[5:], 0)
            else:
                b, n = base.stats.get(m), new.stats.get(m)
            if b is None or n is None:
                continue
            d = n - b
            rows.append({"metric": m, "base": round(b, 4) if isinstance(b, float) else b, "new": round(n, 4) if isinstance(n, float) else n,
                         "delta": round(d, 4) if isinstance(d, float) else d})
    return CompileDelta(config=dict(spec.baseline), base=base, new=new, rows=rows)


def compile_findings(cd: CompileDelta, spec: Any, file: str, verify: str) -> list[ReviewFinding]:
    """What the compile facts say, as offline findings (no line: they are about the file as compiled)."""
    out: list[ReviewFinding] = []
    c = spec.constraints

    def add(item: str, risk: str, evidence: str) -> None:
        out.append(ReviewFinding(checklist_item=item, risk=risk, file=file, evidence=evidence[:800], verify_command=verify, source="offline"))

    new, base = cd.new, cd.base
    if not new.ok:
        item = "smem_registers" if new.error == "out_of_resources" else "evidence"
        add(item, "high", f"the spec's baseline config no longer compiles for {spec.hardware.arch} with the new source: {new.error}: {new.detail}")
    if new.space_check and not (base and base.space_check):
        add("tile_scheduling", "high", f"the spec's baseline config is outside the family's space with the new source: {new.space_check}")
    s = new.stats or {}
    if s:
        if s["regs_per_thread"] > c.max_registers_per_thread:
            add("smem_registers", "high", f"{s['regs_per_thread']} registers/thread > the spec's limit {c.max_registers_per_thread}")
        if s["spill_bytes"] > c.max_spill_bytes:
            add("smem_registers", "high", f"{s['spill_bytes']} spill bytes > the spec's limit {c.max_spill_bytes}")
        if s["smem_bytes"] > c.max_shared_memory_bytes:
            add("smem_registers", "high", f"{s['smem_bytes']} bytes of shared memory > the spec's limit {c.max_shared_memory_bytes}")
    b = (base.stats if base else None) or {}
    if s and b:
        if s["regs_per_thread"] > b["regs_per_thread"] * 1.10:
            add("smem_registers", "medium", f"registers/thread {b['regs_per_thread']} -> {s['regs_per_thread']} for the baseline config")
        if s["smem_bytes"] > b["smem_bytes"] * 1.10:
            add("smem_registers", "medium", f"shared memory {b['smem_bytes']} -> {s['smem_bytes']} bytes for the baseline config")
        if s["spill_bytes"] > b["spill_bytes"]:
            add("smem_registers", "medium", f"spills {b['spill_bytes']} -> {s['spill_bytes']} bytes for the baseline config")
        if s["occupancy"] < b["occupancy"] - 1e-9:
            add("smem_registers", "low", f"theoretical occupancy {b['occupancy']:.3f} -> {s['occupancy']:.3f} (limiter {s.get('occupancy_limiter')})")
        tensor_b = sum(v for k, v in b.get("sass_mix", {}).items() if k.startswith("tensor"))
        tensor_n = sum(v for k, v in s.get("sass_mix", {}).items() if k.startswith("tensor"))
        async_b = sum(v for k, v in b.get("sass_mix", {}).items() if k in ("async_copy", "tma_load"))
        async_n = sum(v for k, v in s.get("sass_mix", {}).items() if k in ("async_copy", "tma_load"))
        if async_b and not async_n:
            add("interface", "medium", "the new SASS has no cp.async / TMA loads where the base had some: the loads are no longer pipelined "
                "(alignment or divisibility hints lost, or a mask the pipeliner cannot prove)")
        if tensor_b and not tensor_n:
            add("numerics", "high", "the new SASS has no tensor-core instructions (HGMMA/HMMA) where the base had some: the dot product left the tensor cores")
    return out


# --- offline: what the tests touch ---------------------------------------------------------------------------


def coverage_by_item(repo: Path, family_name: str, module_path: str) -> dict[str, list[str]]:
    """Checklist item -> test functions under tests/ about this family whose source mentions the item's keywords."""
    module = Path(module_path).stem
    out: dict[str, list[str]] = {k: [] for k in CHECKLIST}
    tests_dir = repo / "tests"
    if not tests_dir.is_dir():
        return out
    mentions = re.compile(rf"\b({re.escape(family_name)}|{re.escape(module)})\b")
    for f in sorted(tests_dir.glob("test_*.py")):
        try:
            src = f.read_text(encoding="utf-8")
            tree = ast.parse(src)
        except (OSError, SyntaxError, UnicodeDecodeError):
            continue
        whole_file = family_name in f.stem or module in f.stem
        if not whole_file and not mentions.search(src):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
                body = ast.get_source_segment(src, node) or ""
                if not whole_file and not mentions.search(body):
                    continue
                name = f"{f.relative_to(repo)}::{node.name}"
                for item, pattern in COVERAGE_KEYWORDS.items():
                    if re.search(pattern, body, re.IGNORECASE) and name not in out[item]:
                        out[item].append(name)
    return out


# --- the model ---------------------------------------------------------------------------------------

SYSTEM_PROMPT = """\
You review one slice of a diff of a Triton GPU kernel file for kernel engineers. Judge the change only
against the acceptance checklist you are given. Output a JSON array only, no prose: one element per problem,
{"checklist_item": "<one of the checklist ids>", "risk": "low|medium|high", "file": "<the file path given>",
 "line": <a new-side line number printed at the left of the diff>, "evidence": "<the code at that line and
why it is wrong, at most 400 characters>", "verify_command": "<one local, read-only command that would show
it, e.g. a pytest invocation or a kregress command>"}.
Cite only line numbers printed in the diff. Never suggest destructive commands. Return [] when this slice has
no problem against the checklist."""


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
) -> ReviewResult:
    """Review the kernel changes that matter to ``spec``; write the report; remember the reviewed revision.

    ``gateway``: a ``resources.taotoken.Gateway`` (or None: offline, and ``no_model_reason`` says why).
    Raises ReviewError when git cannot give a diff (no git, not a repository, an unknown base ref).
    """
    from kregress.core.family import get_family
    from resources.ledger import BudgetExceeded
    from resources.taotoken import CallContext, ContentError, CredentialsError, GatewayError, KeyPool, RequestError, RetriesExhausted

    say = (lambda m: log.info(m)) if log is not None else (lambda m: None)
    home = Path(home) if home is not None else paths.home()
    pool = KeyPool.from_env()
    scrub = pool.scrub
    repo = repo_toplevel(Path(repo_dir or os.environ.get("KREGRESS_REVIEW_REPO") or REPO_ROOT).resolve())
    family = get_family(spec.kernel_family)
    module_path = family_module_path(family)
    notes: list[str] = []

    head_sha = resolve_ref(repo, "HEAD", "HEAD")
    if base_ref:
        base_sha, base_label = resolve_ref(repo, base_ref, "base_ref"), base_ref
    else:
        remembered = load_state(home, spec.task_id, repo).get("last_reviewed", "")
        if remembered and _git(repo, "cat-file", "-e", f"{remembered}^{{commit}}", check=False).returncode == 0:
            base_sha, base_label = remembered, f"last reviewed {remembered[:10]}"
        else:
            if remembered:
                notes.append(f"the last reviewed revision {remembered[:10]} is gone from this repository (rebased?); reviewing "
                             "against HEAD instead: set base_ref to review the committed history")
            else:
                notes.append("first review of this spec in this repository: reviewing the uncommitted changes against HEAD; "
                             "set base_ref (e.g. origin/main) to review committed history too")
            base_sha, base_label = head_sha, "HEAD"
    dirty = bool(_git(repo, "status", "--porcelain", "--", f"{KERNELS_DIR}/").stdout.strip())
    say(f"review {spec.task_id}: {repo} {base_label} ({base_sha[:10]}) -> working tree")

    diffs = kernel_diff(repo, base_sha)
    relevant = relevant_files(repo, module_path, base_sha)
    mine = [d for d in diffs if d.path in relevant or d.old_path in relevant]
    elsewhere = [d.path for d in diffs if d not in mine]
    result = ReviewResult(task_id=spec.task_id, repo=str(repo), base_ref=base_label, base_sha=base_sha, head_sha=head_sha,
                          worktree_dirty=dirty, files_reviewed=[d.path for d in mine], files_changed_elsewhere=elsewhere, notes=notes)
    verify = _verify_command(repo, family.name, module_path, spec_path)

    if not mine:
        result.reviewed_by = f"nothing to review: no change to {', '.join(relevant)} since {base_label}"
        result.notes.append(result.reviewed_by + (f" (other kernel files changed: {', '.join(elsewhere)})" if elsewhere else ""))
    else:
        # offline facts
        if compile:
            say(f"review: AOT-compiling the baseline config with the base and the new source ({spec.hardware.arch})")
            result.compile = compile_deltas(repo, base_sha, spec, family.name, mine, home)
            result.findings += compile_findings(result.compile, spec, module_path, f"kregress sweep {spec_path}" if spec_path else verify)
        result.coverage = coverage_by_item(repo, family.name, module_path)
        facts = _facts(result)
        # the model, one slice at a time
        checklist = spec_checklist(spec, family)
        slices = [(fd, text) for fd in mine if not fd.binary for text in render_slices(fd, max_slice_chars)]
        result.slices = len(slices)
        tokens = {"prompt": 0, "completion": 0, "total": 0}
        stop = ""
        aliases: list[str] = []
        if gateway is None:
            stop = no_model_reason or "no gateway"
        per_file_count: dict[str, int] = {}
        for fd, text in slices:
            per_file_count[fd.path] = per_file_count.get(fd.path, 0) + 1
            if stop:
                continue
            part = (per_file_count[fd.path], sum(1 for f2, _ in slices if f2 is fd))
            msgs = build_messages(spec, checklist, fd, text, part, facts.get(fd.path, facts.get("*", [])))
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
    result.findings.sort(key=lambda f: (_RISK_ORDER[f.risk], f.file, f.line or 0))
    report = home / "reports" / spec.task_id / "review.md"
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text(scrub(render_report(result)), encoding="utf-8")
    result.report_path = str(report)
    if remember:
        save_state(home, spec.task_id, repo, {"last_reviewed": head_sha, "reviewed_at": _dt.datetime.now(_dt.timezone.utc).isoformat(),
                                              "run_id": run_id, "base": base_sha, "model_reviewed": result.model_reviewed})
    say(f"review {spec.task_id}: {len(result.findings)} finding(s); {result.reviewed_by}")
    return result


def _facts(result: ReviewResult) -> dict[str, list[str]]:
    """Per file (or '*' for all): the offline facts the model sees next to the diff."""
    facts: list[str] = []
    cd = result.compile
    if cd is not None:
        if cd.base is None:
            facts.append("base version of the module could not be materialised: no compile comparison")
        for side in (cd.base, cd.new):
            if side is None:
                continue
            if side.ok and side.stats:
                s = side.stats
                facts.append(f"{side.label}: baseline config compiles: {s['regs_per_thread']} regs/thread, {s['spill_bytes']} spill bytes, "
                             f"{s['smem_bytes']} B shared memory, occupancy {s['occupancy']:.3f}, {s['sass_instructions']} SASS instructions")
            else:
                facts.append(f"{side.label}: baseline config does not compile: {side.error}: {side.detail}")
            if side.space_check:
                facts.append(f"{side.label}: baseline config violates the space: {side.space_check}")
    covered = [k for k, v in result.coverage.items() if v]
    missing = [k for k, v in result.coverage.items() if not v]
    if result.coverage:
        facts.append(f"tests mention: {', '.join(covered) or 'nothing'}; no test mentions: {', '.join(missing) or 'nothing'} (keyword match)")
    return {"*": facts}


# --- report ------------------------------------------------------------------------------------------


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
        return "_not compiled_"
    lines = [f"Baseline config `{json.dumps(cd.config, sort_keys=True)}`."]
    for side in (cd.base, cd.new):
        if side is None:
            lines.append("- base: no base version to compare (new file, or not found at the base)")
            continue
        state = "compiles" if side.ok else f"**does not compile**: {side.error}: {_cell(side.detail)}"
        space = f"; **outside the space**: {side.space_check}" if side.space_check else ""
        lines.append(f"- {side.label}: {state}{space}")
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


# --- the Dagster asset ------------------------------------------------------------------------------------


class ReviewConfig(dg.Config):
    """Launchpad options of kernel_source_review."""

    base_ref: str = Field(default="", description="diff against this ref; empty: the revision last reviewed for this spec, else HEAD")
    repo_dir: str = Field(default="", description="git checkout holding kernels/ (empty: $KREGRESS_REVIEW_REPO, else this code's repository)")
    use_model: bool = Field(default=True, description="ask the model (role review); off: offline checks only")
    compile: bool = Field(default=True, description="AOT-compile the baseline config with the base and the new source")
    max_slice_chars: int = Field(default=DEFAULT_SLICE_CHARS, ge=2000, description="diff characters per model call")
    remember: bool = Field(default=True, description="record the reviewed revision as the next review's base")


def _findings_table(findings: list[ReviewFinding]) -> dg.TableMetadataValue:
    cols = [("risk", "string"), ("checklist_item", "string"), ("file", "string"), ("line", "string"), ("in_diff", "string"),
            ("evidence", "string"), ("verify_command", "string"), ("source", "string"), ("flag", "string")]
    recs = [dg.TableRecord({"risk": f.risk, "checklist_item": f.checklist_item, "file": f.file, "line": str(f.line or ""),
                            "in_diff": "" if f.in_diff is None else ("yes" if f.in_diff else "NO"), "evidence": f.evidence,
                            "verify_command": f.verify_command, "source": f.source, "flag": f.flag}) for f in findings]
    return dg.MetadataValue.table(records=recs, schema=dg.TableSchema(columns=[dg.TableColumn(n, t) for n, t in cols]))


def build_review_assets() -> list:
    """[kernel_source_review] (partitioned by spec, group "review", resources specs / taotoken / ledger) with its
    check kernel_review_clean (no high-risk finding, no finding outside the diff, the new source compiles)."""

    @dg.asset(
        name=ASSET_NAME,
        partitions_def=SPECS_PARTITIONS,
        group_name=GROUP_REVIEW,
        required_resource_keys={"specs", "taotoken", "ledger"},
        description="Agent review (role review) of the kernel diff that matters to this spec, against its acceptance checklist; "
                    "offline compile-stat deltas and test coverage when no model is available.",
        check_specs=[dg.AssetCheckSpec(CHECK_NAME, asset=ASSET_NAME,
                                       description="No high-risk finding, no finding citing a line outside the diff, the new source compiles.")],
    )
    def kernel_source_review(context: dg.AssetExecutionContext, config: ReviewConfig):
        from resources.taotoken import GatewayError

        specs = context.resources.specs
        spec = specs.load(context.partition_key)
        try:
            spec_path = str(specs.path_for(spec.task_id))
        except Exception:
            spec_path = ""
        gateway, why = None, ""
        if not config.use_model:
            why = "use_model is off"
        else:
            try:
                gw = context.resources.taotoken.get_gateway(context.resources.ledger.get_ledger(), log=context.log)
                if gw.has_key("review"):
                    gateway = gw
                else:
                    why = "no TAOTOKEN key for role review (TAOTOKEN_KEY_REVIEW / TAOTOKEN_API_KEY)"
                    gw.close()
            except GatewayError as e:
                why = f"{e.category} error: {str(e)[:300]}"
        try:
            result = run_review(spec, repo_dir=config.repo_dir, base_ref=config.base_ref, gateway=gateway, no_model_reason=why,
                                run_id=context.run_id, partition=context.partition_key, spec_path=spec_path, compile=config.compile,
                                max_slice_chars=config.max_slice_chars, remember=config.remember, log=context.log)
        except ReviewError as e:
            raise dg.Failure(description=str(e)) from None
        finally:
            if gateway is not None:
                gateway.close()
        high = [f for f in result.findings if f.risk == "high"]
        outside = [f for f in result.findings if f.in_diff is False]
        broken = result.compile is not None and not result.compile.new.ok
        md = {
            "reviewed_by": dg.MetadataValue.text(result.reviewed_by),
            "model_reviewed": dg.MetadataValue.bool(result.model_reviewed),
            "diff": dg.MetadataValue.text(f"{result.base_ref} ({result.base_sha[:10]}) -> working tree at {result.head_sha[:10]}"),
            "files_reviewed": dg.MetadataValue.text(", ".join(result.files_reviewed) or "none"),
            "files_changed_elsewhere": dg.MetadataValue.text(", ".join(result.files_changed_elsewhere) or "none"),
            "findings": _findings_table(result.findings),
            "n_findings": dg.MetadataValue.int(len(result.findings)),
            "n_high": dg.MetadataValue.int(len(high)),
            "n_outside_diff": dg.MetadataValue.int(len(outside)),
            "compile_deltas": dg.MetadataValue.md(compile_markdown(result.compile)),
            "test_coverage": dg.MetadataValue.md(coverage_markdown(result.coverage)),
            "suggested_commands": dg.MetadataValue.md("\n".join(f"- `{c}` (not run)" for c in result.suggested_commands) or "_none_"),
            "notes": dg.MetadataValue.md("\n".join(f"- {n}" for n in result.notes) or "_none_"),
            "report": dg.MetadataValue.path(result.report_path),
            "slices": dg.MetadataValue.int(result.slices),
            "tokens_total": dg.MetadataValue.int(result.tokens.get("total", 0)),
        }
        yield dg.Output(result.model_dump(mode="json"), metadata=md)
        problems = [f"{len(high)} high-risk finding(s)"] if high else []
        problems += [f"{len(outside)} finding(s) cite a line outside the diff"] if outside else []
        problems += ["the new source does not compile for the baseline config"] if broken else []
        yield dg.AssetCheckResult(
            check_name=CHECK_NAME, passed=not problems, severity=dg.AssetCheckSeverity.WARN,
            description="; ".join(problems) or "clean",
            metadata={"reviewed_by": result.reviewed_by, "n_high": len(high), "n_outside_diff": len(outside), "compiles": not broken},
        )

    return [kernel_source_review]


__all__ = [
    "build_review_assets", "run_review", "ReviewConfig", "ReviewResult", "ReviewFinding", "ReviewError", "CHECKLIST",
    "parse_unified_diff", "parse_findings", "render_slices", "coverage_by_item", "compile_deltas", "GROUP_REVIEW",
]
