"""Facts about an editable file the static policy needs: its functions, kernels, module aliases, imported
objects, constants, and which names the region already uses; plus the AST helpers the walker shares."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from kregress.core.family import is_jit_def
from kregress.core.source_tree import parse_source

# --- facts about a file ---------------------------------------------------------------------------


@dataclass
class FileFacts:
    """Module-level facts of one file (patched side), and what its pristine editable region uses."""

    aliases: dict[str, str]  # module-level name -> dotted module it is bound to (tl -> triton.language)
    imported_objects: dict[str, str]  # `from m import x` -> "m.x"
    functions: set[str]
    jit: set[str]
    wrappers: tuple[str, ...]
    constants: set[str]  # UPPER_CASE module-level names
    other_globals: set[str]
    used_by_region: set[str] = field(default_factory=set)  # module-level names the pristine region reads


def file_facts(source: str, wrappers: tuple[str, ...], extra_jit: set[str] = frozenset()) -> FileFacts:
    tree = parse_source(source)
    aliases: dict[str, str] = {}
    objects: dict[str, str] = {}
    functions, jit, constants, others = set(), set(extra_jit), set(), set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:
                    aliases[a.asname] = a.name
                else:
                    aliases[a.name.split(".")[0]] = a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                objects[a.asname or a.name] = f"{node.module}.{a.name}"
        elif isinstance(node, ast.FunctionDef):
            functions.add(node.name)
            if is_jit_def(node):
                jit.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            literal = node.value is not None and _is_literal(node.value)
            for t in targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        # an UPPER_CASE literal (a number, a table of numbers or strings) is data the
                        # kernel may read; anything else (FAMILY = register(...), SPACE = Space(...)) is not
                        (constants if n.id.isupper() and literal else others).add(n.id)
        elif isinstance(node, ast.ClassDef):
            others.add(node.name)
    return FileFacts(aliases, objects, functions, jit, wrappers, constants, others)


def _is_literal(node: ast.AST) -> bool:
    try:
        ast.literal_eval(node)
        return True
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False


def region_usage(source: str, wrappers: tuple[str, ...]) -> set[str]:
    """Module-level names the editable functions of ``source`` read (what the kernel already uses)."""
    tree = parse_source(source)
    used: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and (is_jit_def(node) or node.name in wrappers):
            local = _locals_of(node)
            for n in ast.walk(node):
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id not in local:
                    used.add(n.id)
    return used


def _locals_of(fn: ast.AST) -> set[str]:
    out: set[str] = set()
    for n in ast.walk(fn):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = n.args
            for arg in a.posonlyargs + a.args + a.kwonlyargs + ([a.vararg] if a.vararg else []) + ([a.kwarg] if a.kwarg else []):
                out.add(arg.arg)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n is not fn:
                out.add(n.name)
        elif isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)):
            out.add(n.id)
        elif isinstance(n, ast.ExceptHandler) and n.name:
            out.add(n.name)
        elif isinstance(n, ast.alias):
            out.add((n.asname or n.name).split(".")[0])
    return out


def _params_of(fn: ast.FunctionDef) -> set[str]:
    a = fn.args
    return {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs + ([a.vararg] if a.vararg else []) + ([a.kwarg] if a.kwarg else [])}


def dotted(node: ast.AST) -> tuple[str, ast.AST] | None:
    """``a.b.c`` -> ("a.b.c", the Name node ``a``); None for anything that is not a plain chain."""
    parts = []
    cur = node
    while isinstance(cur, ast.Attribute):
        parts.append(cur.attr)
        cur = cur.value
    if isinstance(cur, ast.Name):
        parts.append(cur.id)
        return ".".join(reversed(parts)), cur
    return None


def _own_lines(node: ast.AST) -> range:
    """The lines a node itself occupies: a compound statement's header only, any other node all its lines."""
    start = getattr(node, "lineno", None)
    if start is None:
        return range(0)
    end = getattr(node, "end_lineno", start) or start
    body = getattr(node, "body", None)
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        start = min([d.lineno for d in node.decorator_list] + [start])
    if isinstance(body, list) and body and isinstance(body[0], ast.AST) and not isinstance(node, ast.Lambda):
        end = max(start, body[0].lineno - 1)
        if isinstance(node, (ast.If, ast.For, ast.While, ast.Try)) and node.orelse:
            pass  # `else:` lines carry no code of their own
    return range(start, end + 1)
