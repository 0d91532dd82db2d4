"""Checks that need no model: the AOT compile of the spec's baseline config with the base and the new
source (compile-stat deltas), the findings those facts imply, and which checklist items the tests touch.

Each side compiles through the worker protocol (``python -m kernels.worker``, ``kernels/worker.py``) in a
child process whose working directory and first import root are that side's own tree: the working tree for
the new side, a temporary ``git worktree add --detach`` of the base revision for the base side (removed
afterwards, whatever happens). So the base kernel compiles against the base revision's own kregress code,
and an API change between the two revisions never breaks the comparison. A plugin's repository has no
worker of its own: its trees are put first on the import path of this installation's worker.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import json
import os
import re
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path
from typing import Any, Iterator

from kernel_assets.review.diff import FamilySources, git
from kernel_assets.review.records import CHECKLIST, CompileDelta, CompileSide, ReviewError, ReviewFinding
from kregress.core.paths import REPO_ROOT
from resources.workers import Worker, WorkerDied, worker_env

COMPILE_TIMEOUT_S = 300
STARTUP_TIMEOUT_S = 120
DELTA_METRICS = ("regs_per_thread", "spill_bytes", "smem_bytes", "occupancy", "blocks_per_sm", "sass_instructions",
                 "spill_stores", "spill_loads", "smem_static_bytes", "smem_dynamic_bytes", "barriers")  # the last five: CUDA families (ptxas)
_UNCACHED = ("timeout", "crashed", "wrong_source", "no_worker")


@contextlib.contextmanager
def base_worktree(repo: Path, sha: str) -> Iterator[Path]:
    """A detached worktree of ``sha`` in a temporary folder; always removed on exit."""
    tmp = Path(tempfile.mkdtemp(prefix="kregress-review-base-"))
    tree = tmp / "tree"
    try:
        git(repo, "worktree", "add", "--detach", str(tree), sha, timeout=300)
        yield tree
    finally:
        if tree.exists():
            git(repo, "worktree", "remove", "--force", str(tree), check=False)
        git(repo, "worktree", "prune", check=False)
        shutil.rmtree(tmp, ignore_errors=True)


def _worker_home(root: Path) -> tuple[Path | None, str]:
    """Whose ``kernels/worker.py`` compiles a tree whose import root is ``root``: its own (a kregress checkout),
    this installation's (a plugin's repository), or none (a kregress revision older than the worker protocol)."""
    if (root / "kernels" / "worker.py").is_file():
        return root, ""
    if (root / "kernels" / "__init__.py").is_file() or (root / "kregress" / "__init__.py").is_file():
        return None, "this revision predates the worker protocol (no kernels/worker.py), so it cannot be compiled for comparison"
    return REPO_ROOT, ""


def _env(cache_home: Path, first: list[Path]) -> dict[str, str]:
    env = worker_env(cache_home, interpret=False)
    for k in [k for k in env if k.startswith(("TAOTOKEN_", "ANTHROPIC_", "OPENAI_"))]:
        del env[k]  # the child needs no key
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([str(p) for p in first] + env.get("PYTHONPATH", "").split(os.pathsep)))
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _tree_hash(dirs: list[Path]) -> str:
    h = hashlib.sha256()
    for d in dirs:
        for f in sorted(d.rglob("*")) if d.is_dir() else []:
            if f.is_file() and "__pycache__" not in f.parts:
                h.update(f.relative_to(d.parent).as_posix().encode())
                h.update(f.read_bytes())
    return h.hexdigest()


def _cache_key(job: dict, dirs: list[Path]) -> str:
    """Same sources + same job + same compiler -> same stats."""
    try:
        triton_version = metadata.version("triton")
    except metadata.PackageNotFoundError:
        triton_version = "none"
    h = hashlib.sha256(json.dumps([job, triton_version], sort_keys=True).encode())
    h.update(_tree_hash(dirs).encode())
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


def _one_line(text: Any, limit: int = 300) -> str:
    lines = [ln.strip() for ln in str(text or "").strip().splitlines() if ln.strip()]
    return (lines[0] if lines else "")[:limit]


def compile_side(tree: Path, src: FamilySources, job: dict, label: str, cache_home: Path, cache_dir: Path,
                 timeout: float = COMPILE_TIMEOUT_S) -> CompileSide:
    """Describe and AOT-compile the baseline config with the sources in ``tree`` (a checkout of src.repo)."""
    root = (tree / src.import_root).resolve()
    worker_home, why = _worker_home(root)
    if worker_home is None:
        return CompileSide(label=label, ok=False, error="no_worker", detail=why)
    first = [root] + ([worker_home] if worker_home != root else [])
    dirs = [root / src.package, root / "kernels", root / "kregress"]
    dirs += [worker_home / "kernels", worker_home / "kregress"] if worker_home != root else []
    dirs += [REPO_ROOT / "kregress"] if not (root / "kregress").is_dir() else []  # imported from this installation then
    key = _cache_key(job, list(dict.fromkeys(dirs)))
    hit = _cache_get(cache_dir, key)
    if hit is not None:
        return CompileSide(**{**hit, "label": label})
    side = _run_worker(root, first, job, label, cache_home, timeout)
    if side.error not in _UNCACHED:
        _cache_put(cache_dir, key, side.model_dump())
    return side


def _run_worker(root: Path, first: list[Path], job: dict, label: str, cache_home: Path, timeout: float) -> CompileSide:
    try:
        worker = Worker(_env(cache_home, first), cwd=root)
    except OSError as exc:
        return CompileSide(label=label, ok=False, error="crashed", detail=f"could not start the worker: {exc}")
    try:
        try:
            worker.wait_ready(STARTUP_TIMEOUT_S)
        except (WorkerDied, TimeoutError) as exc:
            return CompileSide(label=label, ok=False, error="crashed",
                               detail=f"the worker did not start ({exc or 'no answer'}); run `python -m kernels.worker` in {root} to see why")
        space_check, note = None, ""
        try:
            desc = worker.call({**job, "op": "describe"}, STARTUP_TIMEOUT_S)
        except (WorkerDied, TimeoutError) as exc:
            return CompileSide(label=label, ok=False, error="crashed", detail=f"the worker died loading the family: {exc or 'timeout'}")
        if "unknown op" in str(desc.get("detail", "")):
            note = "this revision's worker has no describe op: the space rules were not checked and the imported files not verified"
        elif desc.get("error"):
            return CompileSide(label=label, ok=False, error=desc["error"], detail=_one_line(desc.get("detail")))
        else:
            outside = [f for f in desc.get("source_files", []) if not Path(f).resolve().is_relative_to(root)]
            if outside:
                return CompileSide(label=label, ok=False, error="wrong_source",
                                   detail=f"the worker imported {outside[0]}, not a file under {root}")
            space_check = desc.get("space_check")
        try:
            res = worker.call({**job, "op": "compile"}, timeout)
        except TimeoutError:
            return CompileSide(label=label, ok=False, error="timeout", detail=f"compile ran past {timeout:.0f}s and was killed")
        except WorkerDied as exc:
            return CompileSide(label=label, ok=False, error="crashed", detail=f"the worker died compiling: {exc}")
        stats = res.get("stats")
        return CompileSide(label=label, ok=stats is not None, error=res.get("error", ""), detail=_one_line(res.get("detail")),
                           space_check=space_check, stats=stats, note=note)
    finally:
        worker.kill()


def _job(spec: Any) -> dict:
    return {"family": spec.kernel_family, "config": dict(spec.baseline), "params": dict(spec.params or {}), "dtype": spec.dtype,
            "arch": spec.hardware.arch, "limits": spec.hardware.limits.model_dump()}


def patched_compile_deltas(src: FamilySources, head_sha: str, texts: dict[str, str], spec: Any, home: Path,
                           timeout: float = COMPILE_TIMEOUT_S) -> CompileDelta:
    """A judged patch's compile comparison: the spec's baseline config compiled with the working tree (base)
    and with a temporary worktree of ``head_sha`` holding the working tree's family files with the patch
    applied (new; ``texts``: path relative to the checkout -> text), in parallel. No GPU: an AOT compile."""
    job = _job(spec)
    cache_home = home / "cache"
    cache_dir = Path(os.environ.get("KREGRESS_REVIEW_CACHE") or cache_home / "review-compile")

    def new_side() -> CompileSide:
        label = "new (working tree + the judged patch)"
        try:
            with base_worktree(src.repo, head_sha) as tree:
                for rel, text in texts.items():
                    (tree / rel).parent.mkdir(parents=True, exist_ok=True)
                    (tree / rel).write_text(text, encoding="utf-8")
                return compile_side(tree, src, job, label, cache_home, cache_dir, timeout)
        except (ReviewError, OSError) as exc:
            return CompileSide(label=label, ok=False, error="no_worktree", detail=_one_line(exc))

    with ThreadPoolExecutor(max_workers=2) as ex:
        fut_new = ex.submit(new_side)
        base = compile_side(src.repo, src, job, "base (working tree)", cache_home, cache_dir, timeout)
        new = fut_new.result()
    return CompileDelta(config=dict(spec.baseline), base=base, new=new, rows=delta_rows(base, new))


def compile_deltas(src: FamilySources, base_sha: str | None, spec: Any, home: Path, timeout: float = COMPILE_TIMEOUT_S) -> CompileDelta:
    """AOT-compile the spec's baseline config with the base revision's tree and with the working tree (in parallel)."""
    job = _job(spec)
    cache_home = home / "cache"
    cache_dir = Path(os.environ.get("KREGRESS_REVIEW_CACHE") or cache_home / "review-compile")

    def base_side() -> CompileSide | None:
        if base_sha is None:
            return None
        label = f"base {base_sha[:10]}"
        try:
            with base_worktree(src.repo, base_sha) as tree:
                return compile_side(tree, src, job, label, cache_home, cache_dir, timeout)
        except ReviewError as exc:
            return CompileSide(label=label, ok=False, error="no_worktree", detail=_one_line(exc))
        except OSError as exc:  # a worktree that cannot be read or written: the new side still comes
            return CompileSide(label=label, ok=False, error="no_worktree", detail=_one_line(f"{type(exc).__name__}: {exc}"))

    with ThreadPoolExecutor(max_workers=2) as ex:
        fut_base = ex.submit(base_side)
        fut_new = ex.submit(compile_side, src.repo, src, job, "new (working tree)", cache_home, cache_dir, timeout)
        base, new = fut_base.result(), fut_new.result()
    return CompileDelta(config=dict(spec.baseline), base=base, new=new, rows=delta_rows(base, new))


def delta_rows(base: CompileSide | None, new: CompileSide) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    if not (base and base.stats and new.stats):
        return rows
    mix_b, mix_n = base.stats.get("sass_mix", {}), new.stats.get("sass_mix", {})
    both = bool(mix_b) and bool(mix_n)  # a side with no disassembly (a judgement's figures) has no mix to compare
    for m in list(DELTA_METRICS) + ([f"sass.{k}" for k in sorted(set(mix_b) | set(mix_n))] if both else []):
        if m.startswith("sass."):
            b, n = mix_b.get(m[5:], 0), mix_n.get(m[5:], 0)
        else:
            b, n = base.stats.get(m), new.stats.get(m)
        if b is None or n is None:
            continue
        d = n - b
        rows.append({"metric": m, "base": round(b, 4) if isinstance(b, float) else b, "new": round(n, 4) if isinstance(n, float) else n,
                     "delta": round(d, 4) if isinstance(d, float) else d})
    return rows


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


# --- what the tests touch ------------------------------------------------------------------------------------

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
