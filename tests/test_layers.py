"""The import contract: layers only import downwards.

    kregress (core, the public API)  <-  kernels  <-  resources  <-  kernel_assets
    kregress.core                    <-  kernel_assets.clients        (the coding-tool config tools)

kregress (its top-level modules and core) imports neither Dagster nor Triton nor torch (type-checking-
only imports aside), kernels never imports resources, kernel_assets or Dagster, resources never imports
kernel_assets. Every import statement counts, including those inside functions: a lazy upward import is
still an upward import. Runtime lookups count too: a module named in a string (a family's entry point,
a ``module:attribute`` target, a tuple of plugin modules imported with importlib) obeys the same rules
as an import statement in the module that names it.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# package -> top-level modules it must never import (prefix match on the dotted name)
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "kregress": ("dagster", "triton", "torch", "kernels", "resources", "kernel_assets"),
    # the coding-tool config tools stand on core alone: no Dagster, no kernels, nothing else of kernel_assets
    "kernel_assets.clients": ("dagster", "triton", "torch", "kernels", "resources") + tuple(
        f"kernel_assets.{p.stem}" for p in sorted((REPO / "kernel_assets").iterdir())
        if p.stem not in ("clients", "__init__", "__pycache__") and (p.suffix == ".py" or p.is_dir())),
    "kernels": ("dagster", "resources", "kernel_assets"),
    "resources": ("kernel_assets",),
}
# The one sanctioned runtime lookup from a lower layer: core's family registry loads family modules by
# name (entry points, import paths). Their targets must live in the kernel layer (or outside the project).
REGISTRY = "kregress/core/family.py"
PROJECT_PACKAGES = ("kregress", "kernels", "resources", "kernel_assets")


def _docstring_nodes(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def runtime_lookups(path: Path) -> list[tuple[int, str]]:
    """(line, dotted module) for every string that is exactly a module path of the project, optionally
    with ``:attribute``: what importlib, an entry point or a plugin tuple would import at run time."""
    import re

    pattern = re.compile(rf"^((?:{'|'.join(PROJECT_PACKAGES)})(?:\.[A-Za-z_][A-Za-z0-9_]*)+)(?::[A-Za-z_.]+)?$")
    tree = ast.parse(path.read_text(), filename=str(path))
    docs = _docstring_nodes(tree)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            m = pattern.match(node.value)
            if m:
                out.append((node.lineno, m.group(1)))
    return out


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _import_nodes(tree: ast.AST):
    """Every import statement of a module, inside functions too; the bodies of ``if TYPE_CHECKING:`` skipped."""
    todo: list[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and _is_type_checking(node):
            todo.extend(node.orelse)
        else:
            todo.extend(ast.iter_child_nodes(node))


def _from_module(node: ast.ImportFrom, module: str, path: Path) -> str:
    """The dotted module a ``from ... import`` reads from, relative imports resolved."""
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base[: len(base) - node.level + (1 if path.name == "__init__.py" else 0)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(path: Path, module: str) -> list[tuple[int, str]]:
    """(line, dotted name) of every import in the file, relative imports resolved, TYPE_CHECKING skipped."""
    out: list[tuple[int, str]] = []
    for node in _import_nodes(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, a.name) for a in node.names)
        else:
            out.append((node.lineno, _from_module(node, module, path)))
    return sorted(out)


def violations(root: Path = REPO, rules: dict[str, tuple[str, ...]] = FORBIDDEN) -> list[str]:
    found = []
    for package, banned in rules.items():
        pkg_dir = root.joinpath(*package.split("."))
        for path in sorted(pkg_dir.rglob("*.py")):
            rel = path.relative_to(root).with_suffix("")
            module = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
            lookups = [] if path.relative_to(root).as_posix() == REGISTRY else runtime_lookups(path)
            for how, items in (("imports", imports_of(path, module)), ("looks up", lookups)):
                for line, name in items:
                    for b in banned:
                        if name == b or name.startswith(b + "."):
                            found.append(f"{path.relative_to(root)}:{line}: {package} {how} {name} (layer rule: no {b})")
    return found


def test_family_entry_points_live_in_the_kernel_layer():
    """The built-ins register through kregress.families entry points; each target is a kernels module (the
    registry in core loads them by name, so a target in resources or kernel_assets would be an upward import)."""
    import tomllib

    eps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"]["kregress.families"]
    assert {"gemm", "gemm_fp8", "grouped_gemm_fp8", "mla_decode", "attention", "torch_sdpa", "replay"} <= set(eps)
    bad = {name: target for name, target in eps.items() if not target.startswith("kernels.")}
    assert not bad, bad


def test_runtime_lookups_are_checked(tmp_path):
    """A module named in a string (a plugin tuple, an importlib target) is held to the layer rules."""
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "__init__.py").write_text("")
    (tmp_path / "kernels" / "sneaky.py").write_text(
        '"""Docs may mention kernel_assets.cli freely."""\nimport importlib\n\n'
        'def f():\n    return importlib.import_module("kernel_assets.cli")\n')
    found = violations(tmp_path, {"kernels": FORBIDDEN["kernels"]})
    assert found == ["kernels/sneaky.py:5: kernels looks up kernel_assets.cli (layer rule: no kernel_assets)"]


def test_no_upward_imports():
    problems = violations()
    assert not problems, "upward imports:\n" + "\n".join(problems)


def test_the_contract_catches_an_upward_import(tmp_path):
    """The checker itself: a planted lazy upward import (inside a function) is reported with its line."""
    for pkg in ("kregress/core", "kernels", "resources"):
        (tmp_path / pkg).mkdir(parents=True)
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "kregress" / "__init__.py").write_text("")
    (tmp_path / "kregress/core/bad.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import torch\n\ndef f():\n    import dagster\n")
    (tmp_path / "kernels/bad.py").write_text("from resources.gpu import CudaBackend\n")
    (tmp_path / "resources/ok.py").write_text("from . import ok\nfrom kernels import gemm\n")
    found = violations(tmp_path, {k: v for k, v in FORBIDDEN.items() if k != "kernel_assets.clients"})
    assert found == [
        "kregress/core/bad.py:6: kregress imports dagster (layer rule: no dagster)",
        "kernels/bad.py:1: kernels imports resources.gpu (layer rule: no resources)",
    ]


@pytest.mark.parametrize("module", ["kregress", "kregress.core.spec", "kregress.core.stats", "kregress.core.recorded",
                                    "kregress.core.endpoints"])
def test_core_loads_without_dagster_triton_or_torch(module):
    code = (f"import sys, {module}; bad = [m for m in ('dagster', 'triton', 'torch') if m in sys.modules]; "
            "print(','.join(bad)); sys.exit(1 if bad else 0)")
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, f"importing {module} pulled in: {res.stdout.strip()} {res.stderr[-400:]}"


def module_graph(root: Path = REPO) -> dict[str, set[str]]:
    """module -> the project modules it imports (every import, inside functions too; TYPE_CHECKING skipped).
    ``from pkg import name`` is an edge to ``pkg.name`` where that is a module, else to ``pkg``."""
    files: dict[str, Path] = {}
    for package in PROJECT_PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root).with_suffix("")
            files[".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)] = path
    return {module: _imported_modules(module, path, files) for module, path in files.items()}


def _imported_modules(module: str, path: Path, files: dict[str, Path]) -> set[str]:
    edges: set[str] = set()
    for node in _import_nodes(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            name = _from_module(node, module, path)
            targets = [f"{name}.{a.name}" if f"{name}.{a.name}" in files else name for a in node.names]
        for t in targets:
            while t and t not in files:  # a name inside a module: the module
                t = t.rpartition(".")[0]
            if t and t != module:
                edges.add(t)
    return edges


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def test_no_import_circles():
    """No module reaches itself through imports, lazy ones inside functions included: each layer is a
    stack of modules that can be read (and tested) bottom up."""
    found = circles(module_graph())
    assert not found, "import circles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_circle_check_sees_a_lazy_import_through_a_package(tmp_path):
    """The checker itself: ``from pkg import mod`` inside a function closes a circle a -> pkg.mod -> a."""
    (tmp_path / "kernel_assets" / "pkg").mkdir(parents=True)
    for f in ("kernel_assets/__init__.py", "kernel_assets/pkg/__init__.py"):
        (tmp_path / f).write_text("")
    (tmp_path / "kernel_assets/a.py").write_text("from kernel_assets.pkg.mod import X\n")
    (tmp_path / "kernel_assets/pkg/mod.py").write_text("X = 1\n\ndef f():\n    from kernel_assets import a\n")
    (tmp_path / "kernel_assets/b.py").write_text("from kernel_assets.a import pkg\n")
    for p in ("kregress", "kernels", "resources"):
        (tmp_path / p).mkdir()
    assert circles(module_graph(tmp_path)) == [["kernel_assets.a", "kernel_assets.pkg.mod"]]
