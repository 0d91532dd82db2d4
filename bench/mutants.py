"""Mutation testing of the patch gate: ``python bench/mutants.py --json OUT``.

For each built-in Triton family this generates mutants of the family's kernel source by AST operators (never
by hand): drop or flip a mask term, off-by-one in a bound or an offset, skip the first or last iteration of a
loop, swap two index expressions, replace a scale by 1, store to a shifted row, skip work for some program
ids or for large sizes, map the program ids past a count onto those below it. Every mutant is a unified diff against the family's editable region, judged as a
patch by ``kregress judge``'s code path (one judgement per family: one baseline, one set of secret cases
shared by its mutants). A mutant is killed when the gate says REGRESS (any cause but ``slower``) or
NEEDS_REVIEW ``precision`` / ``implausible``; anything else survives.

Equivalent mutants are separated by an independent exhaustive check (``equivalence``): a child process
with the Triton interpreter loads the original and each surviving mutant as modules, runs their launch
wrappers on many shapes of its own (ragged edges, several GQA ratios, long sequences, masked_m from 0 to
full, ragged and empty groups, shuffled page tables, caller buffers poisoned with sentinels) and compares
with float64 references written here, not the families' (exact dequantization). A mutant is equivalent when
no case tells it from the original: every output within max(3x the original's error, a floor), untouched
buffer regions and read-only inputs unchanged, a second call the same. It shares nothing with the gate's
case generator.

Output: ``{"<family>[/<layout or variant>]": {"generated", "equivalent", "killed", "survived": [names],
"seconds", ...}}`` plus ``false_alarms`` (killed mutants the check cannot tell from the original, when
``--check-killed``), per mutant verdicts and the survivors' diffs under ``details``.

CPU heavy: run it with ``nice -n 5``. Options: --families, --max-per-family (default 40), --seed, --check-killed.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
SPECS = REPO / "tests" / "redteam" / "families" / "specs"


@dataclass(frozen=True)
class Target:
    """One key of the report: the spec it is judged with, the kernel module, its jit functions to mutate,
    and the constexpr values under that spec (branches dead under them are not mutated)."""

    key: str
    spec: str
    module: str  # kernels/<file>.py
    functions: tuple[str, ...]
    consts: dict


TARGETS = {
    t.key: t for t in (
        Target("gemm", "gemm.yaml", "kernels/gemm.py", ("gemm_kernel",), {}),
        Target("gemm_fp8", "gemm_fp8.yaml", "kernels/gemm_fp8.py", ("fp8_gemm_kernel",), {"LAYOUT": 0}),
        Target("grouped_gemm_fp8/contiguous", "grouped_gemm_fp8_contiguous.yaml", "kernels/gemm_fp8.py",
               ("fp8_gemm_kernel",), {"LAYOUT": 1}),
        Target("grouped_gemm_fp8/masked", "grouped_gemm_fp8_masked.yaml", "kernels/gemm_fp8.py", ("fp8_gemm_kernel",),
               {"LAYOUT": 2}),
        Target("mla_decode", "mla_decode_bf16.yaml", "kernels/mla_decode.py", ("mla_decode_kernel", "mla_combine_kernel"),
               {"KV_FMT": 0, "NUM_SPLITS": 2, "CAUSAL": 1}),
        Target("mla_decode/fp8_kv", "mla_decode_fp8.yaml", "kernels/mla_decode.py",
               ("mla_decode_kernel", "mla_combine_kernel"), {"KV_FMT": 1, "NUM_SPLITS": 4, "CAUSAL": 1}),
        Target("attention", "attention.yaml", "kernels/attention.py", ("attn_fwd_kernel", "_attn_blocks"),
               {"D_PE": 0, "D_V": 64, "D_VP": 64, "HAS_LEFT": 0, "HAS_RIGHT": 1}),
    )
}

SCALE_NAMES = ("sa", "sb", "tok_scale", "qk_scale", "sm_scale", "w")
CMP_FLIP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt}


@dataclass
class Mutant:
    name: str
    op: str
    line: int
    source: str  # the whole mutated module text
    diff: str = ""


# --- generation ---------------------------------------------------------------------------------------


def _dead(test: ast.expr, consts: dict) -> bool | None:
    """True/False when ``test`` only reads known constexprs (its value), None when it reads anything else."""
    names = {n.id for n in ast.walk(test) if isinstance(n, ast.Name)}
    if not names or not names <= set(consts):
        return None
    try:
        return not bool(_const_value(test, consts))
    except (KeyError, TypeError, ValueError):
        return None


_CMP = {ast.Eq: lambda a, b: a == b, ast.NotEq: lambda a, b: a != b, ast.Lt: lambda a, b: a < b,
        ast.LtE: lambda a, b: a <= b, ast.Gt: lambda a, b: a > b, ast.GtE: lambda a, b: a >= b}


def _const_value(node: ast.expr, consts: dict) -> Any:
    """The value of a constexpr test (names, constants, comparisons, and/or/not), read from the AST; nothing
    is executed. Anything else raises ValueError (the branch is then treated as live)."""
    if isinstance(node, ast.Name):
        return consts[node.id]
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return not _const_value(node.operand, consts)
    if isinstance(node, ast.BoolOp):
        vals = [_const_value(v, consts) for v in node.values]
        return all(vals) if isinstance(node.op, ast.And) else any(vals)
    if isinstance(node, ast.Compare) and all(type(op) in _CMP for op in node.ops):
        left = _const_value(node.left, consts)
        for op, comp in zip(node.ops, node.comparators):
            right = _const_value(comp, consts)
            if not _CMP[type(op)](left, right):
                return False
            left = right
        return True
    raise ValueError(f"not a constexpr test: {ast.dump(node)[:80]}")


def _live_nodes(fn: ast.FunctionDef, consts: dict) -> list[ast.AST]:
    """Nodes of ``fn`` outside branches that are dead under ``consts`` (constexpr ``if``s)."""
    out: list[ast.AST] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If):
            dead = _dead(node.test, consts)
            out.append(node)
            if dead is True:
                for s in node.orelse:
                    visit(s)
                return
            if dead is False:
                for s in node.body:
                    visit(s)
                return
        else:
            out.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    for s in fn.body:
        visit(s)
    return out


def _is_tl_call(node: ast.AST, name: str) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == name
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "tl")


def _and_terms(e: ast.expr) -> list[ast.expr]:
    if isinstance(e, ast.BinOp) and isinstance(e.op, ast.BitAnd):
        return _and_terms(e.left) + _and_terms(e.right)
    return [e]


def _join_and(terms: list[ast.expr]) -> ast.expr:
    out = terms[0]
    for t in terms[1:]:
        out = ast.BinOp(left=out, op=ast.BitAnd(), right=t)
    return out


class _Site:
    """A replacement of one expression's source span (or the insertion of statements before a line)."""

    def __init__(self, op: str, node: ast.AST, text: str, insert_before: int | None = None, insert: str = ""):
        self.op, self.node, self.text, self.insert_before, self.insert = op, node, text, insert_before, insert


def _expr_sites(fn: ast.FunctionDef, consts: dict) -> list[_Site]:
    sites: list[_Site] = []
    u = ast.unparse
    live = _live_nodes(fn, consts)
    assigns = {n.targets[0].id: n.value for n in live if isinstance(n, ast.Assign) and len(n.targets) == 1
               and isinstance(n.targets[0], ast.Name)}
    for node in live:
        # masks of loads and stores, and tl.where conditions: drop one &-term
        if isinstance(node, ast.Call) and (_is_tl_call(node, "load") or _is_tl_call(node, "store")):
            for kw in node.keywords:
                if kw.arg == "mask":
                    mask = kw.value
                    named = mask.value if isinstance(mask, ast.Subscript) else mask
                    if isinstance(named, ast.Name) and named.id in assigns:  # mask=ok[:, :, None], ok = a & b
                        mask = assigns[named.id]
                    terms = _and_terms(mask)
                    if len(terms) > 1:
                        for i in range(len(terms)):
                            rest = terms[:i] + terms[i + 1:]
                            sites.append(_Site("drop_mask_term", mask, u(_join_and(rest))))
                    else:
                        sites.append(_Site("drop_mask", node, u(ast.Call(func=node.func, args=node.args,
                                                                            keywords=[k for k in node.keywords if k.arg not in ("mask", "other")]))))
            # store to a shifted row: the pointer's first row/offset name + 1
            if _is_tl_call(node, "store") and node.args:
                ptr = node.args[0]
                if isinstance(ptr, ast.Name) and ptr.id in assigns:  # c_ptrs = c_ptr + offs_m[:, None] * ...
                    ptr = assigns[ptr.id]
                for n in ast.walk(ptr):
                    if isinstance(n, ast.Name) and n.id.startswith(("offs_m", "rows", "o_row", "out_rows", "part", "offs_m")):
                        sites.append(_Site("store_shifted_row", n, f"({n.id} + 1)"))
                        break
        # a mask built by name: ok = a & b (drop one term)
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.BinOp) and isinstance(node.value.op, ast.BitAnd):
            terms = _and_terms(node.value)
            for i in range(len(terms)):
                sites.append(_Site("drop_mask_term", node.value, u(_join_and(terms[:i] + terms[i + 1:]))))
        # a load from a shifted row / element
        if _is_tl_call(node, "load") and node.args:
            for n in ast.walk(node.args[0]):
                if isinstance(n, ast.Name) and n.id.startswith(("offs", "rows", "tok", "cols", "part", "kb", "start_n")):
                    sites.append(_Site("load_shifted", n, f"({n.id} + 1)"))
                    break
        # a pointer advance dropped
        if isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Add):
            sites.append(_Site("drop_increment", node, "pass"))
        if _is_tl_call(node, "where") and node.args:
            terms = _and_terms(node.args[0])
            if len(terms) > 1:
                for i in range(len(terms)):
                    sites.append(_Site("drop_where_term", node.args[0], u(_join_and(terms[:i] + terms[i + 1:]))))
        # compare: flip strictness, off-by-one on the bound
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in CMP_FLIP:
            flipped = ast.Compare(left=node.left, ops=[CMP_FLIP[type(node.ops[0])]()], comparators=node.comparators)
            sites.append(_Site("flip_compare", node, u(flipped)))
            right = node.comparators[0]
            if not (isinstance(right, ast.Constant) and isinstance(right.value, float)):
                sites.append(_Site("bound_minus_one", right, f"({u(right)} - 1)"))
                sites.append(_Site("bound_plus_one", right, f"({u(right)} + 1)"))
        # offsets: x * BLOCK + tl.arange(...) -> + 1
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) and (
                _is_tl_call(node.right, "arange") or _is_tl_call(node.left, "arange")):
            sites.append(_Site("offset_plus_one", node, f"({u(node)} + 1)"))
            sites.append(_Site("offset_minus_one", node, f"({u(node)} - 1)"))
        # swap the operands of an index subtraction / the two sides of a broadcast
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub) and not isinstance(node.right, ast.Constant) \
                and not isinstance(node.left, ast.Constant):
            sites.append(_Site("swap_operands", node, u(ast.BinOp(left=node.right, op=ast.Sub(), right=node.left))))
        # program ids: swap axes; map the ids past a count onto those below it (a program then computes and
        # writes another program's tile, with the right values: the tiles past the count are left to nobody)
        if _is_tl_call(node, "program_id") and node.args and isinstance(node.args[0], ast.Constant):
            ax = node.args[0].value
            sites.append(_Site("wrap_program_ids", node, f"({u(node)} % 40)"))
            sites.append(_Site("clamp_program_ids", node, f"tl.minimum({u(node)}, 39)"))
            for other in (0, 1, 2):
                if other != ax:
                    sites.append(_Site("swap_program_axis", node, f"tl.program_id({other})"))
                    break
        # scale by 1
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            for side in (node.left, node.right):
                base = side.value if isinstance(side, ast.Subscript) else side
                if isinstance(base, ast.Name) and base.id in SCALE_NAMES:
                    sites.append(_Site("scale_to_one", side, "1.0"))
    # tuple targets: swap two index expressions (pid_m, pid_n = ...)
    for node in live:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Tuple) \
                and len(node.targets[0].elts) == 2:
            a, b = node.targets[0].elts
            sites.append(_Site("swap_index_exprs", node.targets[0], f"{u(b)}, {u(a)}"))
    # loops: skip first / last iteration, skip work for large sizes, for some program ids
    for node in live:
        if isinstance(node, ast.For) and isinstance(node.iter, ast.Call) and isinstance(node.iter.func, ast.Name) \
                and node.iter.func.id in ("range", "tl.range"):
            args = node.iter.args
            lo, hi = (args[0], args[1]) if len(args) >= 2 else (ast.Constant(0), args[0])
            step = u(args[2]) if len(args) >= 3 else "1"
            lo_s, hi_s = u(lo), u(hi)
            sites.append(_Site("skip_first_iteration", node.iter, f"range({lo_s} + {step}, {hi_s}, {step})"))
            sites.append(_Site("skip_last_iteration", node.iter, f"range({lo_s}, {hi_s} - {step}, {step})"))
            sites.append(_Site("every_other_iteration", node.iter, f"range({lo_s}, {hi_s}, 2 * {step})"))
            sites.append(_Site("skip_large_sizes", node.iter, f"range({lo_s}, tl.minimum({hi_s}, {lo_s} + 8 * {step}), {step})"))
            ind = " " * node.col_offset
            sites.append(_Site("skip_program_ids", node.iter, f"range({lo_s}, _mut_hi, {step})", insert_before=node.lineno,
                               insert=f"{ind}_mut_hi = {hi_s}\n{ind}if tl.program_id(0) % 7 == 3:\n"
                                      f"{ind}    _mut_hi = {lo_s}\n"))
    # stores: skip for some program ids (a mask term)
    for node in live:
        if isinstance(node, ast.Call) and _is_tl_call(node, "store"):
            for kw in node.keywords:
                if kw.arg == "mask":
                    sites.append(_Site("store_skip_program_ids", kw.value, f"({u(kw.value)}) & (tl.program_id(0) % 5 != 2)"))
    return sites


def _apply(src_lines: list[str], site: _Site) -> str:
    n = site.node
    lines = list(src_lines)
    l0, c0, l1, c1 = n.lineno - 1, n.col_offset, n.end_lineno - 1, n.end_col_offset
    if l0 == l1:
        lines[l0] = lines[l0][:c0] + site.text + lines[l0][c1:]
    else:
        lines[l0] = lines[l0][:c0] + site.text + lines[l1][c1:]
        del lines[l0 + 1:l1 + 1]
    if site.insert_before is not None:
        lines.insert(site.insert_before - 1, site.insert.rstrip("\n") + "\n" if not site.insert.endswith("\n") else site.insert)
        # insert holds several lines: split them in place
        text = "".join(lines)
        return text
    return "".join(lines)


def generate(target: Target, max_n: int, seed: int) -> list[Mutant]:
    """Mutants of ``target``'s kernel functions, at most ``max_n``, spread over the operators (seeded)."""
    path = REPO / target.module
    src = path.read_text()
    lines = src.splitlines(True)
    tree = ast.parse(src)
    fns = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in target.functions]
    sites = [s for fn in fns for s in _expr_sites(fn, target.consts)]
    seen: set[str] = set()
    by_op: dict[str, list[Mutant]] = {}
    for s in sites:
        text = _apply(lines, s)
        if text == src or text in seen:
            continue
        try:
            ast.parse(text)
        except SyntaxError:
            continue
        seen.add(text)
        by_op.setdefault(s.op, []).append(Mutant(name="", op=s.op, line=s.node.lineno, source=text))
    rng = random.Random(seed)
    for ms in by_op.values():
        rng.shuffle(ms)
    chosen: list[Mutant] = []
    ops = sorted(by_op)
    while len(chosen) < max_n and any(by_op[o] for o in ops):  # round robin over the operators
        for o in ops:
            if by_op[o] and len(chosen) < max_n:
                chosen.append(by_op[o].pop())
    chosen.sort(key=lambda m: (m.line, m.op))
    rel = target.module
    for i, m in enumerate(chosen):
        m.name = f"m{i:02d}_{m.op}_L{m.line}"
        body = "".join(difflib.unified_diff(lines, m.source.splitlines(True), f"a/{rel}", f"b/{rel}", n=3))
        m.diff = f"diff --git a/{rel} b/{rel}\n" + body
    return chosen


# --- judging --------------------------------------------------------------------------------------


def killed(verdict: str, cause: str | None) -> bool:
    return (verdict == "REGRESS" and cause != "slower") or (verdict == "NEEDS_REVIEW" and cause in ("precision", "implausible"))


def judge_mutants(target: Target, mutants: list[Mutant], workdir: Path) -> dict[str, tuple[str, str | None, str]]:
    """name -> (verdict, cause, first reason) from one judgement of all ``mutants`` against the spec."""
    from kernel_assets.judge import judge, read_patch_args

    pdir = workdir / target.key.replace("/", "_")
    pdir.mkdir(parents=True, exist_ok=True)
    files = []
    for m in mutants:
        f = pdir / f"{m.name}.patch"
        f.write_text(m.diff)
        files.append(str(f))
    res = judge(SPECS / target.spec, read_patch_args(files), log=lambda msg: None)
    out = {}
    for row in res.rows:
        v = res.verdicts[row.variant_id]
        out[row.variant_id] = (v.verdict, v.cause, " ".join((v.reasons[0] if v.reasons else "").split())[:300])
    return out


# --- the independent equivalence check --------------------------------------------------------------


def equivalence(target: Target, mutants: list[Mutant], timeout_s: float = 3000.0) -> dict[str, str | None]:
    """name -> None when the independent exhaustive check cannot tell the mutant from the original, else the
    first difference it found. Runs in a child process with TRITON_INTERPRET=1 (tests/ and kernel code are
    loaded there, never here)."""
    if not mutants:
        return {}
    results: dict[str, str | None] = {}
    todo = {m.name: m.source for m in mutants}
    deadline = time.monotonic() + timeout_s
    with tempfile.TemporaryDirectory(prefix="kregress-mutants-") as tmp:
        while todo:  # a mutant that kills the interpreter (a wild pointer) is a difference; the rest go on
            log = Path(tmp) / "progress.jsonl"
            log.write_text("")
            job = {"key": target.key, "module": target.module, "spec": str(SPECS / target.spec),
                   "mutants": todo, "dir": tmp, "progress": str(log)}
            jf = Path(tmp) / "job.json"
            jf.write_text(json.dumps(job))
            env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(REPO))
            proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--equivalence-child", str(jf)],
                                  capture_output=True, text=True, timeout=max(1.0, deadline - time.monotonic()),
                                  env=env, cwd=str(REPO))
            started = None
            for line in log.read_text().splitlines():
                rec = json.loads(line)
                if "start" in rec:
                    started = rec["start"]
                else:
                    results[rec["name"]] = rec["why"]
                    todo.pop(rec["name"], None)
                    started = None
            if proc.returncode == 0 and not todo:
                break
            if started is None:
                raise RuntimeError(f"equivalence child failed ({proc.returncode}) before any mutant: {proc.stderr[-3000:]}")
            results[started] = f"the process died (exit {proc.returncode}) running it"
            todo.pop(started, None)
    return results


def _child(job_file: str) -> None:
    from bench import mutants_check

    job = json.loads(Path(job_file).read_text())
    res = mutants_check.run(job)
    (Path(job["dir"]) / "result.json").write_text(json.dumps(res))


# --- main ------------------------------------------------------------------------------------------------


def run_target(target: Target, max_n: int, seed: int, workdir: Path, check_killed: bool,
               log: Callable[[str], None]) -> dict[str, Any]:
    t0 = time.perf_counter()
    muts = generate(target, max_n, seed)
    log(f"{target.key}: {len(muts)} mutants, judging")
    verdicts = judge_mutants(target, muts, workdir)
    t_judge = time.perf_counter() - t0
    live = [m for m in muts if not killed(*verdicts[m.name][:2])]
    dead = [m for m in muts if killed(*verdicts[m.name][:2])]
    log(f"{target.key}: {len(dead)} killed, {len(live)} live; equivalence check")
    eq = equivalence(target, live + (dead if check_killed else []))
    equivalent = [m.name for m in live if eq.get(m.name) is None]
    survived = [m.name for m in live if eq.get(m.name) is not None]
    false_alarms = [m.name for m in dead if m.name in eq and eq[m.name] is None]
    non_eq = len(muts) - len(equivalent) - len(false_alarms)
    return {
        "generated": len(muts), "equivalent": len(equivalent) + len(false_alarms), "killed": len(dead),
        "survived": survived, "seconds": round(time.perf_counter() - t0, 1),
        "score": round((len(dead) - len(false_alarms)) / non_eq, 4) if non_eq else None,
        "seconds_judging": round(t_judge, 1), "seconds_per_judged_patch": round(t_judge / max(1, len(muts)), 2),
        "false_alarms": false_alarms,
        "details": {m.name: {"op": m.op, "verdict": list(verdicts[m.name]), "check": eq.get(m.name, "not checked"),
                             **({"diff": m.diff} if m.name in survived or m.name in false_alarms else {})}
                    for m in muts},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="write the report here")
    ap.add_argument("--families", default=",".join(TARGETS), help=f"comma-separated keys, of: {', '.join(TARGETS)}")
    ap.add_argument("--max-per-family", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--check-killed", action="store_true",
                    help="also run the equivalence check on killed mutants (counts the gate's false alarms)")
    ap.add_argument("--list", action="store_true", help="only generate and print the mutants (no judging)")
    ap.add_argument("--equivalence-child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.equivalence_child:
        _child(args.equivalence_child)
        return 0
    keys = [k.strip() for k in args.families.split(",") if k.strip()]
    bad = [k for k in keys if k not in TARGETS]
    if bad:
        ap.error(f"--families: unknown {', '.join(bad)}; known: {', '.join(TARGETS)}")
    if args.list:
        for k in keys:
            for m in generate(TARGETS[k], args.max_per_family, args.seed):
                print(k, m.name)
        return 0
    os.environ.setdefault("DAGSTER_HOME", tempfile.mkdtemp(prefix="kregress-mutants-home-"))
    report: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="kregress-mutants-") as work:
        for k in keys:
            report[k] = run_target(TARGETS[k], args.max_per_family, args.seed, Path(work), args.check_killed,
                                   lambda m: print(m, file=sys.stderr, flush=True))
            r = report[k]
            print(f"{k}: generated {r['generated']}, equivalent {r['equivalent']}, killed {r['killed']}, "
                  f"survived {len(r['survived'])} ({', '.join(r['survived'])}), score {r['score']}, {r['seconds']}s",
                  flush=True)
            if args.json:
                Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    raise SystemExit(main())
