"""The import contract: layers only import downwards.

    kregress.core  <-  kernels  <-  resources  <-  kernel_assets
    kregress.core  <-  kregress.clients            (the coding-tool config tools)

kregress.core imports neither Dagster nor Triton nor torch (type-checking-only imports aside), kernels
never imports resources, kernel_assets or Dagster, resources never imports kernel_assets. Every import
statement counts, including those inside functions: a lazy upward import is still an upward import.
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
    "kregress.core": ("dagster", "triton", "torch", "kernels", "resources", "kernel_assets", "kregress.clients"),
    "kregress.clients": ("dagster", "triton", "torch", "kernels", "resources", "kernel_assets"),
    "kernels": ("dagster", "resources", "kernel_assets", "kregress.clients"),
    "resources": ("kernel_assets", "kregress.clients"),
}


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def imports_of(path: Path, module: str) -> list[tuple[int, str]]:
    """(line, dotted name) of every import in the file, relative imports resolved, TYPE_CHECKING skipped."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out: list[tuple[int, str]] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for sub in child.orelse:
                    visit(sub)
                continue
            if isinstance(child, ast.Import):
                out.extend((child.lineno, a.name) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = module.split(".")
                    base = base[: len(base) - child.level + (1 if path.name == "__init__.py" else 0)]
                    name = ".".join(base + ([child.module] if child.module else []))
                else:
                    name = child.module or ""
                out.append((child.lineno, name))
            visit(child)

    visit(tree)
    return out


def violations(root: Path = REPO, rules: dict[str, tuple[str, ...]] = FORBIDDEN) -> list[str]:
    found = []
    for package, banned in rules.items():
        pkg_dir = root.joinpath(*package.split("."))
        for path in sorted(pkg_dir.rglob("*.py")):
            rel = path.relative_to(root).with_suffix("")
            module = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
            for line, name in imports_of(path, module):
                for b in banned:
                    if name == b or name.startswith(b + "."):
                        found.append(f"{path.relative_to(root)}:{line}: {package} imports {name} (layer rule: no {b})")
    return found


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
    found = violations(tmp_path, {k: v for k, v in FORBIDDEN.items() if k != "kregress.clients"})
    assert found == [
        "kregress/core/bad.py:6: kregress.core imports dagster (layer rule: no dagster)",
        "kernels/bad.py:1: kernels imports resources.gpu (layer rule: no resources)",
    ]


@pytest.mark.parametrize("module", ["kregress", "kregress.core.spec", "kregress.core.stats", "kregress.core.recorded",
                                    "kregress.core.endpoints"])
def test_core_loads_without_dagster_triton_or_torch(module):
    code = (f"import sys, {module}; bad = [m for m in ('dagster', 'triton', 'torch') if m in sys.modules]; "
            "print(','.join(bad)); sys.exit(1 if bad else 0)")
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, f"importing {module} pulled in: {res.stdout.strip()} {res.stderr[-400:]}"
