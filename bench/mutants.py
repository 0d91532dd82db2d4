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

Guarded (conditional) mutants (``generate_guarded``, docs/mutants.md): each operator's statement also runs
mutated only where a condition holds, ``if COND: <mutated> else: <original>``, as a cheat is written. The
conditions, in the kernel's own terms: ``size`` (a dimension just past the largest checked, hidden and timed
value), ``programs`` (program-id residues, affine mixes of two axes, ids past a count), ``structure`` (a structure
key or config constexpr past its timed value), ``interpreter`` (a tf32 probe dot; a launch's return value). A
guarded mutant the gate lets through is equivalent when no launch within the declared limits makes its condition
true (decided statically, ``guard_reachable``) or when the check cannot tell its forced twin (the condition
replaced by True) from the original; the report counts the two reasons apart.

Output: ``{"<family>[/<layout or variant>]": {"generated", "equivalent", "killed", "survived": [names],
"seconds", "by_operator", ...}}`` plus ``false_alarms`` (killed mutants the check cannot tell from the original,
when ``--check-killed``), per mutant verdicts and the survivors' diffs under ``details``; and one key per family
``"<family>[/<layout or variant>]/guarded"`` with the same fields plus ``"by_condition": {class: {"generated",
"equivalent", "killed"}}`` and ``equivalent_reasons``.

CPU heavy: run it with ``nice -n 5``. Options: --families or --family (repeatable), --max-per-family (default 40),
--seed, --check-killed, --guarded-only, --no-guarded, --sample N (N per key, spread over operators or classes),
--list.
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
    cls: str = ""  # guarded: the condition's class (GUARD_CLASSES); "" for an unconditional mutant
    guard: "Guard | None" = None
    forced: str = ""  # guarded: the module with the condition replaced by True (what the equivalence check runs)


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


# --- guarded (conditional) mutants ----------------------------------------------------------------------
#
# Each operator above also comes guarded: the statement holding the mutated expression runs mutated only
# when a condition holds and as it was otherwise, ``if COND: <mutated> else: <original>``, the way a cheat is
# written. The conditions come in four classes, in the kernel's own terms (its arguments, constexprs, program
# ids and loaded sizes):
#   size        a threshold on a dimension the kernel reads, just past the largest value the spec's correctness
#               shapes and the gate's hidden shapes use, and just past the timed shapes' value;
#   programs    a class of program ids: a residue, an affine mix of two axes, ids past a count on an axis;
#   structure   a structure key past its timed value (queries, heads, GQA ratio, splits, groups, masked_m,
#               window edges, a config constexpr);
#   interpreter a tell: a probe tl.dot of fp32 (1 + 2^-20) values, whose sum is 4096 exactly only where the dot
#               rounds to tf32 (a compiled run), or a launch's return value in the wrapper (None under the
#               interpreter as shipped), kept on the kernel object and passed to the next launch as a new
#               constexpr COMPILED.

GUARD_CLASSES = ("size", "programs", "structure", "interpreter")
PROBE_ONE = "1.00000095367431640625"  # 1 + 2**-20, exact in fp32; tf32 (10-bit mantissa) rounds it to 1.0
PROBE_PRELUDE = f"_mut_probe = tl.full([16, 16], {PROBE_ONE}, tl.float32)"
PROBE_COND = "tl.sum(tl.sum(tl.dot(_mut_probe, _mut_probe), 1), 0) == 4096.0"
LAUNCH_FLAG = "compiled"  # the attribute a launch_return mutant keeps on its kernel object
RESIDUE_MODULI = (2, 3, 5, 7)
MAX_CHANGED_LINES = 60  # kregress.core.patch.DEFAULT_MAX_CHANGED_LINES: a bigger patch is refused for its size
# the operators the issue names (drop a mask term, skip the first or last iteration, shift a store, a scale by 1,
# skip work, remap program ids) come first in each class's round robin
GUARDED_FIRST = ("drop_mask_term", "skip_first_iteration", "store_shifted_row", "scale_to_one", "skip_large_sizes",
                 "wrap_program_ids", "skip_last_iteration", "drop_mask", "store_skip_program_ids", "skip_program_ids",
                 "clamp_program_ids", "drop_where_term")


@dataclass(frozen=True)
class Term:
    """A value the kernel reads, under any of ``names`` (the first bound where a guard goes is used).
    ``value(shape, params, config)`` is its largest value on a launch of that shape; ``limit(params, space)``
    the family's declared largest value (None: no bound but int32's). ``config``: the value is the spec's
    baseline config's (the timed value)."""

    names: tuple[str, ...]
    cls: str  # "size" or "structure"
    value: Callable[[dict, dict, dict], int]
    limit: Callable[[dict, dict], int | None] = lambda params, space: None
    config: bool = False


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _grouped_sizes(shape: dict, params: dict) -> list[int]:
    from kernels.gemm_fp8 import group_sizes

    return group_sizes(shape, params)


def _contiguous_rows(shape: dict, params: dict) -> int:
    from kernels.gemm_fp8 import ALIGN_M

    return sum(_cdiv(s, ALIGN_M) * ALIGN_M for s in _grouped_sizes(shape, params))


def _mla_lens(shape: dict, params: dict) -> list[int]:
    from kernels.mla_decode import cache_seqlens

    return cache_seqlens(shape, params)


def _att_lens(shape: dict, params: dict) -> tuple[list[int], list[int]]:
    from kernels.attention import key_lengths, seq_lengths

    return seq_lengths(shape, params), key_lengths(shape, params)


def _att_window(params: dict) -> tuple[int, int]:
    from kernels.attention import window_size

    return window_size(params)


def _space_max(name: str) -> Callable[[dict, dict], int]:
    return lambda params, space: max(space[name])


def _fixed(fn: Callable[[dict], int]) -> Callable[[dict, dict], int]:
    """A value the spec's params fix (the problem's contract: page size, head dims, window, cache format)."""
    return lambda params, space: fn(params)


_MNK = (Term(("M",), "size", lambda s, p, c: s["M"]), Term(("N",), "size", lambda s, p, c: s["N"]),
        Term(("K",), "size", lambda s, p, c: s["K"]))
_GROUP_M = Term(("GROUP_M",), "structure", lambda s, p, c: c["GROUP_M"], _space_max("GROUP_M"), config=True)
_MLA_TERMS = (
    Term(("seqlen",), "size", lambda s, p, c: max(_mla_lens(s, p))),
    Term(("M",), "size", lambda s, p, c: s["s_q"] * s["h_q"]),
    Term(("S_Q",), "structure", lambda s, p, c: s["s_q"]),
    Term(("H_Q",), "structure", lambda s, p, c: s["h_q"]),
    Term(("NUM_SPLITS",), "structure", lambda s, p, c: c["num_splits"], _space_max("num_splits"), config=True),
    Term(("PAGE_SIZE",), "structure", lambda s, p, c: int(p.get("page_size", 64)), _fixed(lambda p: int(p.get("page_size", 64)))),
)
TERMS: dict[str, tuple[Term, ...]] = {
    "gemm": _MNK + (_GROUP_M,),
    "gemm_fp8": _MNK + (_GROUP_M,),
    "grouped_gemm_fp8/contiguous": (
        Term(("M",), "size", lambda s, p, c: _contiguous_rows(s, p)), *_MNK[1:],
        Term(("g",), "structure", lambda s, p, c: s["groups"] - 1), _GROUP_M),
    "grouped_gemm_fp8/masked": (
        Term(("M",), "size", lambda s, p, c: s["m"]), *_MNK[1:],
        Term(("m_valid",), "structure", lambda s, p, c: max(_grouped_sizes(s, p))),
        Term(("g",), "structure", lambda s, p, c: s["groups"] - 1), _GROUP_M),
    "mla_decode": _MLA_TERMS,
    "mla_decode/fp8_kv": _MLA_TERMS,
    "attention": (
        Term(("seqlen_q",), "size", lambda s, p, c: max(_att_lens(s, p)[0])),
        Term(("seqlen_k",), "size", lambda s, p, c: max(_att_lens(s, p)[1])),
        Term(("GROUP",), "structure", lambda s, p, c: s["h_q"] // s["h_kv"]),
        Term(("diag",), "structure", lambda s, p, c: max(k - q for q, k in zip(*_att_lens(s, p)))),
        Term(("WIN_RIGHT", "win_right"), "structure", lambda s, p, c: max(_att_window(p)[1], 0),
             _fixed(lambda p: max(_att_window(p)[1], 0))),
        Term(("WIN_LEFT", "win_left"), "structure", lambda s, p, c: max(_att_window(p)[0], 0),
             _fixed(lambda p: max(_att_window(p)[0], 0))),
        Term(("D_QK",), "structure", lambda s, p, c: max(p.get("head_dims") or [s["head_dim"]]),
             _fixed(lambda p: max(p.get("head_dims") or [256]))),
    ),
}

# Declared program counts per grid axis of each jit function (None: unbounded, 1: a one-wide axis).
_AX1 = {0: None, 1: 1, 2: 1}
AXES: dict[str, dict[str, dict[int, int | None]]] = {
    "gemm": {"gemm_kernel": _AX1},
    "gemm_fp8": {"fp8_gemm_kernel": _AX1},
    "grouped_gemm_fp8/contiguous": {"fp8_gemm_kernel": _AX1},
    "grouped_gemm_fp8/masked": {"fp8_gemm_kernel": {0: None, 1: None, 2: 1}},
    "mla_decode": {"mla_decode_kernel": {0: None, 1: None, 2: 32}, "mla_combine_kernel": {0: None, 1: None, 2: 1}},
    "mla_decode/fp8_kv": {"mla_decode_kernel": {0: None, 1: None, 2: 32}, "mla_combine_kernel": {0: None, 1: None, 2: 1}},
    "attention": {"attn_fwd_kernel": {0: None, 1: None, 2: None}, "_attn_blocks": {0: None, 1: None, 2: None}},
}


def _timed_grid(key: str, fn: str, s: dict, p: dict, c: dict) -> tuple[int, int, int]:
    """The grid of ``fn``'s launch on the timed shape ``s`` (as the launch wrapper computes it)."""
    if key in ("gemm", "gemm_fp8"):
        return (_cdiv(s["M"], c["BLOCK_M"]) * _cdiv(s["N"], c["BLOCK_N"]), 1, 1)
    if key == "grouped_gemm_fp8/contiguous":
        return (_cdiv(_contiguous_rows(s, p), c["BLOCK_M"]) * _cdiv(s["N"], c["BLOCK_N"]), 1, 1)
    if key == "grouped_gemm_fp8/masked":
        return (_cdiv(s["m"], c["BLOCK_M"]) * _cdiv(s["N"], c["BLOCK_N"]), s["groups"], 1)
    if key.startswith("mla_decode"):
        if fn == "mla_combine_kernel":
            from kernels.mla_decode import _combine_meta

            return (_cdiv(s["s_q"] * s["h_q"], _combine_meta(c["num_splits"])["BLOCK_R"]), s["batch"], 1)
        return (_cdiv(s["s_q"] * s["h_q"], c["BLOCK_H"]), s["batch"], c["num_splits"])
    q, _k = _att_lens(s, p)
    return (_cdiv(max(q), c["BLOCK_M"]), s["h_q"], s["batch"])


@dataclass(frozen=True)
class Guard:
    """One condition. ``kind``: bound (``term >= value``), count (``pid >= value``), residue (``pid % modulus ==
    value``), affine (``(a + coef * b) % modulus == value``), probe_dot, launch_return. ``limits``: the declared
    largest value of the term (bound) or the program counts of the axes it reads (None: unbounded)."""

    cls: str
    kind: str
    text: str
    reads: tuple[str, ...] = ()
    limits: tuple[int | None, ...] = ()
    value: int = 0
    modulus: int = 0
    coef: int = 0
    prelude: tuple[str, ...] = ()
    fn: str = ""  # the jit function it is written for ("" any)


def guard_reachable(g: Guard) -> tuple[bool, str]:
    """Whether some launch within the declared limits makes ``g`` true, decided statically, with the reason."""
    if g.kind == "bound":
        lim = g.limits[0]
        if lim is None or lim >= g.value:
            return True, f"{g.text}: reachable ({g.reads[0]} is bounded only by int32)" if lim is None else \
                f"{g.text}: reachable ({g.reads[0]} may be up to {lim})"
        return False, f"{g.text}: unreachable ({g.reads[0]} is at most {lim} within the declared limits)"
    if g.kind in ("count", "residue"):
        lim = g.limits[0]
        if lim is None or lim > g.value:
            return True, f"{g.text}: reachable"
        return False, f"{g.text}: unreachable (the axis has at most {lim} program(s))"
    if g.kind == "affine":
        la, lb = (64 if x is None else x for x in g.limits)
        if any((a + g.coef * b) % g.modulus == g.value for a in range(min(la, 64)) for b in range(min(lb, 64))):
            return True, f"{g.text}: reachable"
        return False, f"{g.text}: unreachable (no program ids within the axes' counts {g.limits} satisfy it)"
    return True, f"{g.text}: true on every compiled launch"


_SPEC_CACHE: dict[str, dict] = {}


def _spec(target: Target) -> dict:
    if target.spec not in _SPEC_CACHE:
        import yaml

        _SPEC_CACHE[target.spec] = yaml.safe_load((SPECS / target.spec).read_text())
    return _SPEC_CACHE[target.spec]


_LEVELS: dict[str, dict[str, tuple[list[int], int | None]]] = {}


def term_levels(target: Target, draws: int = 4) -> dict[str, tuple[list[int], int | None]]:
    """term (its first name) -> (thresholds, declared limit): just past the largest value the spec's correctness
    shapes and the gate's hidden shapes (kernels/gate_cases.shape_groups, ``draws`` secret draws) use, and just
    past the timed shapes' value. A config term: just past the baseline; a term the spec's params fix: just past
    that value (so unreachable)."""
    if target.key in _LEVELS:
        return _LEVELS[target.key]
    from kernels import gate_cases
    from kregress.core.family import get_family

    spec = _spec(target)
    fam = get_family(spec["kernel_family"])
    params, config = dict(spec.get("params") or {}), dict(spec["baseline"])
    timed, corr = list(spec["shape_matrix"]), list(spec["correctness_shapes"])
    checked: list[tuple[dict, dict]] = [(s, params) for s in corr]
    for d in range(draws):
        for g in gate_cases.shape_groups(fam, corr, timed, False, random.Random(d), [1, 2, 3], params):
            for s in g.get("shapes") or []:
                if fam.check_shape(s) is None:
                    checked.append((s, {**params, **(g.get("params") or {})}))
    space = {k: list(v) for k, v in fam.space.params.items()}
    out: dict[str, tuple[list[int], int | None]] = {}
    for t in TERMS[target.key]:
        lim = t.limit(params, space)
        top_timed = max(t.value(s, params, config) for s in timed)
        if t.config:
            levels = [top_timed + 1]
        else:
            seen = [top_timed] + [t.value(s, p, config) for s, p in checked]
            levels = sorted({max(seen) + 1, top_timed + 1})
        out[t.names[0]] = (levels, lim)
    _LEVELS[target.key] = out
    return out


def _bound_names(st: ast.stmt) -> set[str]:
    out: set[str] = set()
    targets = st.targets if isinstance(st, ast.Assign) else [st.target] if isinstance(st, (ast.AugAssign, ast.AnnAssign)) else []
    for t in targets:
        for n in ast.walk(t):
            if isinstance(n, ast.Name):
                out.add(n.id)
    return out


def _enclosing(fn: ast.FunctionDef, node: ast.AST) -> tuple[ast.stmt | None, set[str]]:
    """The innermost statement of ``fn`` holding ``node``, and the names bound on the way to it (arguments,
    assignments before it in each enclosing block, loop variables)."""
    span = (node.lineno, node.col_offset, node.end_lineno, node.end_col_offset)

    def inside(n: ast.AST) -> bool:
        return (n.lineno, n.col_offset) <= span[:2] and (n.end_lineno, n.end_col_offset) >= span[2:]

    names = {a.arg for a in fn.args.args}
    body, found = fn.body, None
    while True:
        nxt = None
        for st in body:
            if inside(st):
                nxt = st
                break
            names |= _bound_names(st)
        if nxt is None:
            return found, names
        found = nxt
        sub = None
        for field in ("body", "orelse"):
            blk = getattr(nxt, field, None)
            if isinstance(blk, list) and any(isinstance(s, ast.stmt) and inside(s) for s in blk):
                sub = blk
        if sub is None:
            return found, names
        if isinstance(nxt, ast.For):
            names |= {n.id for n in ast.walk(nxt.target) if isinstance(n, ast.Name)}
        body = sub


_GRIDS: dict[tuple[str, str], list[int]] = {}


def _guards_at(target: Target, fn: str, names: set[str], rng: random.Random, launched: bool) -> list[Guard]:
    """Every guard of every class that can be written at a statement of ``fn`` where ``names`` are bound."""
    spec = _spec(target)
    params, config = dict(spec.get("params") or {}), dict(spec["baseline"])
    out: list[Guard] = []
    levels = term_levels(target)
    for t in TERMS[target.key]:
        name = next((n for n in t.names if n in names), None)
        if name is None:
            continue
        ths, lim = levels[t.names[0]]
        for v in ths:
            out.append(Guard(t.cls, "bound", f"{name} >= {v}", (name,), (lim,), v, fn=fn))
    axes = AXES[target.key][fn]
    gk = (target.key, fn)
    if gk not in _GRIDS:
        grid = [1, 1, 1]
        for s in spec["shape_matrix"]:
            grid = [max(a, b) for a, b in zip(grid, _timed_grid(target.key, fn, s, params, config))]
        _GRIDS[gk] = grid
    grid = _GRIDS[gk]
    live = [a for a, lim in axes.items() if lim != 1]
    for a in live:
        pid = f"tl.program_id({a})"
        for c in sorted({grid[a], 64} - {0}):
            if axes[a] is None or c < axes[a] + 1:
                out.append(Guard("programs", "count", f"{pid} >= {c}", (), (axes[a],), c, fn=fn))
        m = rng.choice(RESIDUE_MODULI)
        r = rng.randrange(1, m)
        out.append(Guard("programs", "residue", f"{pid} % {m} == {r}", (), (axes[a],), r, m, fn=fn))
    pairs = [(f"tl.program_id({a})", f"tl.program_id({b})", axes[a], axes[b]) for a in live for b in live if a < b]
    if {"pid_m", "pid_n"} <= names:  # a one-axis launch's tile coordinates (the grouped order's pid_m, pid_n)
        pairs.append(("pid_m", "pid_n", None, None))
    for ea, eb, la, lb in pairs:
        m = rng.choice(RESIDUE_MODULI[1:])
        k, r = rng.randrange(1, m), rng.randrange(0, m)
        reads = tuple(x for x in (ea, eb) if not x.startswith("tl."))
        out.append(Guard("programs", "affine", f"({ea} + {k} * {eb}) % {m} == {r}", reads, (la, lb), r, m, k, fn=fn))
    out.append(Guard("interpreter", "probe_dot", PROBE_COND, prelude=(PROBE_PRELUDE,), fn=fn))
    if launched:
        out.append(Guard("interpreter", "launch_return", "COMPILED", fn=fn))
    return out


def _indent(block: list[str]) -> list[str]:
    return [("    " + ln) if ln.strip() else ln for ln in block]


def _statement_lines(lines: list[str], st: ast.stmt) -> tuple[int, int] | None:
    """[a, b) line indices of ``st`` when it owns its lines whole (nothing else before or after it on them)."""
    a, b = st.lineno - 1, st.end_lineno
    if lines[a][:st.col_offset].strip():
        return None
    rest = lines[b - 1][st.end_col_offset:].strip()
    if rest and not rest.startswith("#"):
        return None
    return a, b


def _guarded_statement(lines: list[str], fn: ast.FunctionDef, site: _Site, guard: Guard, cond: str) -> str | None:
    """The module with the statement holding ``site`` run mutated where ``cond`` holds, as it was elsewhere."""
    st, _names = _enclosing(fn, site.node)
    if st is None:
        return None
    ab = _statement_lines(lines, st)
    if ab is None or (site.insert_before is not None and site.insert_before != st.lineno):
        return None
    a, b = ab
    mutated = _apply(lines, site).splitlines(True)
    delta = len(mutated) - len(lines)
    new = mutated[a:b + delta]
    if "".join(new) == "".join(lines[a:b]):
        return None
    ind = " " * st.col_offset
    head = [f"{ind}{p}\n" for p in guard.prelude] + [f"{ind}if {cond}:\n"]
    return "".join(lines[:a] + head + _indent(new) + [f"{ind}else:\n"] + _indent(lines[a:b]) + lines[b:])


def _launch_statement(tree: ast.Module, fn_name: str) -> ast.stmt | None:
    """The wrapper's statement that launches jit function ``fn_name`` (``fn_name[grid](...)``)."""
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef) or any("jit" in ast.unparse(d) for d in node.decorator_list):
            continue
        for st in ast.walk(node):
            if isinstance(st, ast.Expr) and isinstance(st.value, ast.Call) and isinstance(st.value.func, ast.Subscript) \
                    and isinstance(st.value.func.value, ast.Name) and st.value.func.value.id == fn_name:
                return st
    return None


def _guarded_launch(lines: list[str], tree: ast.Module, fn: ast.FunctionDef, site: _Site, cond: str) -> str | None:
    """The statement holding ``site`` runs mutated where the new constexpr ``COMPILED`` is set (``cond``: its text,
    or True forced); the wrapper sets it from the previous launch's return value (a handle when compiled, None
    under the interpreter), kept on the kernel object: ``fn.compiled = fn[grid](..., COMPILED=getattr(fn,
    "compiled", False)) is not None``."""
    st = _launch_statement(tree, fn.name)
    if st is None or st.lineno <= fn.end_lineno or not fn.args.args:
        return None
    ab = _statement_lines(lines, st)
    if ab is None:
        return None
    a, b = ab
    launch = list(lines[a:b])
    if len(launch) < 2 or launch[-1].strip() != ")" or not launch[-2].rstrip().endswith(","):
        return None
    ind = " " * st.col_offset
    launch[0] = ind + f"{fn.name}.{LAUNCH_FLAG} = " + launch[0][st.col_offset:]
    launch[-1] = launch[-1].rstrip() + " is not None\n"
    launch.insert(-1, f'{ind}    COMPILED=getattr({fn.name}, "{LAUNCH_FLAG}", False),  # a handle came back before: compiled\n')
    edited = lines[:a] + launch + lines[b:]
    text = _guarded_statement(edited, fn, site, Guard("interpreter", "launch_return", "COMPILED"), cond)
    if text is None:
        return None
    out = text.splitlines(True)
    last = fn.args.args[-1]
    i, c = last.end_lineno - 1, last.end_col_offset
    out[i] = out[i][:c] + ", COMPILED: tl.constexpr = False" + out[i][c:]
    return "".join(out)


def _guarded_source(src: str, lines: list[str], tree: ast.Module, fn: ast.FunctionDef, site: _Site, guard: Guard,
                    forced: bool = False) -> str | None:
    cond = "True" if forced else guard.text
    if guard.kind == "launch_return":
        return _guarded_launch(lines, tree, fn, site, cond)
    return _guarded_statement(lines, fn, site, guard, cond)


def generate_guarded(target: Target, max_n: int, seed: int) -> list[Mutant]:
    """Guarded mutants of ``target``: the operators' sites, each statement guarded by a condition of each class
    that can be written there; at most ``max_n``, round robin over the classes, then over the operators (seeded).
    Each carries its guard and ``forced``, the same module with the condition replaced by True."""
    path = REPO / target.module
    src = path.read_text()
    lines = src.splitlines(True)
    tree = ast.parse(src)
    fns = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in target.functions]
    rng = random.Random(seed)
    pool: dict[str, dict[str, list[tuple]]] = {c: {} for c in GUARD_CLASSES}
    for fn in fns:
        launched = _launch_statement(tree, fn.name) is not None
        for s in _expr_sites(fn, target.consts):
            st, names = _enclosing(fn, s.node)
            if st is None:
                continue
            for g in _guards_at(target, fn.name, names, rng, launched):
                pool[g.cls].setdefault(s.op, []).append((fn, s, g))
    for by_op in pool.values():
        for cands in by_op.values():
            rng.shuffle(cands)
    chosen: list[Mutant] = []
    seen: set[str] = set()
    turn = {c: 3 * i for i, c in enumerate(GUARD_CLASSES)}  # each class starts at another operator

    def order(c: str) -> list[str]:  # the operators first, then the others
        live = [o for o, v in pool[c].items() if v]
        return [o for o in GUARDED_FIRST if o in live] + sorted(o for o in live if o not in GUARDED_FIRST)

    while len(chosen) < max_n and any(any(v) for v in pool.values()):
        for c in GUARD_CLASSES:
            ops = order(c)
            if not ops or len(chosen) >= max_n:
                continue
            while ops:
                op = ops[turn[c] % len(ops)]
                turn[c] += 1
                fn, s, g = pool[c][op].pop()
                text = _guarded_source(src, lines, tree, fn, s, g)
                if text is None or text in seen:
                    ops = order(c)
                    continue
                try:
                    ast.parse(text)
                except SyntaxError:
                    continue
                if _changed_lines(lines, text) > MAX_CHANGED_LINES:  # the gate would refuse it for its size
                    continue
                forced = _guarded_source(src, lines, tree, fn, s, g, forced=True)
                seen.add(text)
                chosen.append(Mutant(name="", op=s.op, line=s.node.lineno, source=text, cls=c, guard=g, forced=forced or ""))
                break
    chosen.sort(key=lambda m: (m.cls, m.line, m.op))
    rel = target.module
    for i, m in enumerate(chosen):
        m.name = f"g{i:02d}_{m.cls}_{m.guard.kind}_{m.op}_L{m.line}"
        body = "".join(difflib.unified_diff(lines, m.source.splitlines(True), f"a/{rel}", f"b/{rel}", n=3))
        m.diff = f"diff --git a/{rel} b/{rel}\n" + body
    return chosen


def _changed_lines(lines: list[str], text: str) -> int:
    return sum(1 for ln in difflib.unified_diff(lines, text.splitlines(True), n=0)
               if ln[:1] in "+-" and not ln.startswith(("+++", "---")))


def spread_sample(mutants: list[Mutant], n: int, seed: int) -> list[Mutant]:
    """``n`` of ``mutants``, round robin over their classes (guarded) or operators (seeded)."""
    rng = random.Random(seed)
    by: dict[str, list[Mutant]] = {}
    for m in mutants:
        by.setdefault(m.cls or m.op, []).append(m)
    for v in by.values():
        rng.shuffle(v)
    out: list[Mutant] = []
    while len(out) < n and any(by.values()):
        for k in sorted(by):
            if by[k] and len(out) < n:
                out.append(by[k].pop())
    return sorted(out, key=lambda m: m.name)


def child_env(tmp: str) -> dict[str, str]:
    """The environment of the children that import and run mutants: the sandbox's allowlist (no keys), the
    interpreter on, the project importable, HOME and TMPDIR in the run's temp folder."""
    from kernels.sandbox import ENV_ALLOW

    env = {k: os.environ[k] for k in ENV_ALLOW if k in os.environ}
    env.update(TRITON_INTERPRET="1", PYTHONPATH=str(REPO), HOME=tmp, TMPDIR=tmp)
    return env


def import_check(mutants: list[Mutant], timeout_s: float = 600.0) -> dict[str, str | None]:
    """name -> None when the mutant's module (and its forced twin) imports under TRITON_INTERPRET=1 in a child,
    else the error."""
    job = {m.name: [m.source] + ([m.forced] if m.forced else []) for m in mutants}
    with tempfile.TemporaryDirectory(prefix="kregress-mutants-import-") as tmp:
        jf = Path(tmp) / "job.json"
        jf.write_text(json.dumps({"dir": tmp, "mutants": job}))
        env = child_env(tmp)
        proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--import-child", str(jf)],
                              capture_output=True, text=True, timeout=timeout_s, env=env, cwd=str(REPO))
        out = Path(tmp) / "imports.json"
        if not out.exists():
            raise RuntimeError(f"import child failed ({proc.returncode}): {proc.stderr[-3000:]}")
        return json.loads(out.read_text())


def _import_child(job_file: str) -> None:
    import importlib.util

    job = json.loads(Path(job_file).read_text())
    res: dict[str, str | None] = {}
    for i, (name, sources) in enumerate(job["mutants"].items()):
        res[name] = None
        for j, text in enumerate(sources):
            f = Path(job["dir"]) / f"kregress_imp_{i}_{j}.py"
            f.write_text(text)
            spec = importlib.util.spec_from_file_location(f.stem, f)
            mod = importlib.util.module_from_spec(spec)
            sys.modules[f.stem] = mod
            try:
                spec.loader.exec_module(mod)
            except Exception as exc:  # noqa: BLE001 - the error is the result
                res[name] = f"{'forced ' if j else ''}does not import: {type(exc).__name__}: {str(exc)[:300]}"
                break
    (Path(job["dir"]) / "imports.json").write_text(json.dumps(res))


# --- judging --------------------------------------------------------------------------------------


def killed(verdict: str, cause: str | None) -> bool:
    return (verdict == "REGRESS" and cause != "slower") or (verdict == "NEEDS_REVIEW" and cause in ("precision", "implausible"))


def judge_mutants(target: Target, mutants: list[Mutant], workdir: Path, tag: str = "") -> dict[str, tuple[str, str | None, str]]:
    """name -> (verdict, cause, first reason) from one judgement of all ``mutants`` against the spec."""
    from kernel_assets.judge import judge, read_patch_args

    pdir = workdir / (target.key.replace("/", "_") + tag)
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
            env = child_env(tmp)
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


def _breakdown(muts: list[Mutant], field: str, equivalent: set[str], dead: set[str]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for m in muts:
        row = out.setdefault(getattr(m, field), {"generated": 0, "equivalent": 0, "killed": 0})
        row["generated"] += 1
        row["equivalent"] += m.name in equivalent
        row["killed"] += m.name in dead and m.name not in equivalent
    return dict(sorted(out.items()))


def run_target(target: Target, max_n: int, seed: int, workdir: Path, check_killed: bool,
               log: Callable[[str], None], sample: int | None = None) -> dict[str, Any]:
    t0 = time.perf_counter()
    muts = generate(target, max_n, seed)
    if sample is not None:
        muts = spread_sample(muts, sample, seed)
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
        "by_operator": _breakdown(muts, "op", set(equivalent) | set(false_alarms), {m.name for m in dead}),
        "details": {m.name: {"op": m.op, "verdict": list(verdicts[m.name]), "check": eq.get(m.name, "not checked"),
                             **({"diff": m.diff} if m.name in survived or m.name in false_alarms else {})}
                    for m in muts},
    }


def run_guarded(target: Target, max_n: int, seed: int, workdir: Path, check_killed: bool,
                log: Callable[[str], None], sample: int | None = None) -> dict[str, Any]:
    """The guarded mutants of ``target``, judged in one judgement. A mutant the gate lets through is equivalent
    when no launch within the declared limits makes its condition true (decided statically: ``guard_reachable``),
    or when the independent check cannot tell its forced twin (the condition replaced by True: the mutation
    wherever it runs, on the check's own reduced shapes) from the original; otherwise it survives."""
    t0 = time.perf_counter()
    muts = generate_guarded(target, max_n, seed)
    if sample is not None:
        muts = spread_sample(muts, sample, seed)
    bad = {k: v for k, v in import_check(muts).items() if v}
    if bad:  # never judged: a mutant that does not import is the generator's bug, not a kill
        raise RuntimeError(f"{target.key}: guarded mutants that do not import under TRITON_INTERPRET=1: {bad}")
    log(f"{target.key}/guarded: {len(muts)} mutants, judging")
    verdicts = judge_mutants(target, muts, workdir, tag="_guarded")
    t_judge = time.perf_counter() - t0
    static = {m.name: guard_reachable(m.guard) for m in muts}
    dead = [m for m in muts if killed(*verdicts[m.name][:2])]
    to_check = [m for m in muts if static[m.name][0] and (check_killed or m not in dead)]
    log(f"{target.key}/guarded: {len(dead)} killed, {len(muts) - len(dead)} live; equivalence check of {len(to_check)} forced twins")
    eq = equivalence(target, [Mutant(name=m.name, op=m.op, line=m.line, source=m.forced) for m in to_check])
    out = classify_guarded(muts, verdicts, static, eq)
    out.update(seconds=round(time.perf_counter() - t0, 1), seconds_judging=round(t_judge, 1),
               seconds_per_judged_patch=round(t_judge / max(1, len(muts)), 2))
    return out


def classify_guarded(muts: list[Mutant], verdicts: dict[str, tuple[str, str | None, str]],
                     static: dict[str, tuple[bool, str]], eq: dict[str, str | None]) -> dict[str, Any]:
    """The report of one key's guarded mutants from the gate's verdicts, the static reachability of each guard and
    the independent check's result on each checked forced twin (name -> None: no difference; absent: not checked).
    Equivalent: unreachable, or reachable and the forced twin not told apart. Killed and equivalent: a false alarm."""
    reasons: dict[str, str] = {}
    for m in muts:
        if not static[m.name][0]:
            reasons[m.name] = f"unreachable: {static[m.name][1]}"
        elif m.name in eq and eq[m.name] is None:
            reasons[m.name] = "no effect where the condition holds: the check cannot tell the forced twin from the original"
    dead = [m for m in muts if killed(*verdicts[m.name][:2])]
    live = [m for m in muts if m not in dead]
    equivalent = [m.name for m in live if m.name in reasons]
    survived = [m.name for m in live if m.name not in reasons]
    false_alarms = [m.name for m in dead if m.name in reasons]
    eq_names = set(equivalent) | set(false_alarms)
    non_eq = len(muts) - len(eq_names)
    dead_names = {m.name for m in dead}
    return {
        "generated": len(muts), "equivalent": len(eq_names), "killed": len(dead), "survived": survived,
        "score": round((len(dead) - len(false_alarms)) / non_eq, 4) if non_eq else None,
        "false_alarms": false_alarms,
        "by_condition": _breakdown(muts, "cls", eq_names, dead_names),
        "by_operator": _breakdown(muts, "op", eq_names, dead_names),
        "equivalent_reasons": {
            "unreachable": sorted(n for n in eq_names if reasons[n].startswith("unreachable")),
            "no_effect_when_true": sorted(n for n in eq_names if not reasons[n].startswith("unreachable")),
        },
        "details": {m.name: {"op": m.op, "class": m.cls, "guard": m.guard.text, "kind": m.guard.kind,
                             "verdict": list(verdicts[m.name]),
                             "check": reasons.get(m.name, eq.get(m.name, "not checked")),
                             **({"diff": m.diff} if m.name in survived or m.name in false_alarms else {})}
                    for m in muts},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="write the report here")
    ap.add_argument("--families", default=",".join(TARGETS), help=f"comma-separated keys, of: {', '.join(TARGETS)}")
    ap.add_argument("--family", action="append", default=[],
                    help="one key (repeatable; instead of --families), e.g. --family gemm --family attention")
    ap.add_argument("--guarded-only", action="store_true", help="only the guarded (conditional) mutants")
    ap.add_argument("--no-guarded", action="store_true", help="only the unconditional mutants (today's keys)")
    ap.add_argument("--sample", type=int, help="judge only N mutants per key, spread over the operators "
                    "(unconditional) or the condition classes (guarded), seeded")
    ap.add_argument("--max-per-family", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--check-killed", action="store_true",
                    help="also run the equivalence check on killed mutants (counts the gate's false alarms)")
    ap.add_argument("--list", action="store_true", help="only generate and print the mutants (no judging)")
    ap.add_argument("--equivalence-child", help=argparse.SUPPRESS)
    ap.add_argument("--import-child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.equivalence_child:
        _child(args.equivalence_child)
        return 0
    if args.import_child:
        _import_child(args.import_child)
        return 0
    keys = args.family or [k.strip() for k in args.families.split(",") if k.strip()]
    bad = [k for k in keys if k not in TARGETS]
    if bad:
        ap.error(f"--families/--family: unknown {', '.join(bad)}; known: {', '.join(TARGETS)}")
    if args.guarded_only and args.no_guarded:
        ap.error("--guarded-only and --no-guarded exclude each other: pass at most one")
    if args.list:
        for k in keys:
            if not args.guarded_only:
                for m in generate(TARGETS[k], args.max_per_family, args.seed):
                    print(k, m.name)
            if not args.no_guarded:
                for m in generate_guarded(TARGETS[k], args.max_per_family, args.seed):
                    reach = guard_reachable(m.guard)[0]
                    print(f"{k}/guarded", m.name, "|", m.guard.text, "" if reach else "(unreachable)")
        return 0
    os.environ.setdefault("DAGSTER_HOME", tempfile.mkdtemp(prefix="kregress-mutants-home-"))
    report: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="kregress-mutants-") as work:
        log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
        for k in keys:
            runs = ([] if args.guarded_only else [(k, run_target)]) + ([] if args.no_guarded else [(f"{k}/guarded", run_guarded)])
            for rk, fn in runs:
                report[rk] = fn(TARGETS[k], args.max_per_family, args.seed, Path(work), args.check_killed, log, args.sample)
                r = report[rk]
                print(f"{rk}: generated {r['generated']}, equivalent {r['equivalent']}, killed {r['killed']}, "
                      f"survived {len(r['survived'])} ({', '.join(r['survived'])}), score {r['score']}, {r['seconds']}s",
                      flush=True)
                for c, row in r.get("by_condition", {}).items():
                    print(f"  {c}: generated {row['generated']}, equivalent {row['equivalent']}, killed {row['killed']}", flush=True)
                if args.json:
                    Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    raise SystemExit(main())
