"""The static rule ``launch_value`` (kregress/core/gate_policy.py ``launch_value_uses``): a changed line that
uses the value of a launch (``kernel[grid](...)``) is found, whatever the way it is read; a launch as a
statement of its own is not. And the host-visible tells of the interpreter the static policy already refuses
(environment, interpreter modules, device checks) stay refused. Pure AST work: no process, no Triton."""

from __future__ import annotations

import ast
import difflib
from pathlib import Path

import pytest

from kregress.core.gate import static_findings
from kregress.core.gate_policy import RULES, launch_value_uses

REPO = Path(__file__).resolve().parents[1]
GEMM = (REPO / "kernels" / "gemm.py").read_text()
LAUNCH = "    gemm_kernel[grid](\n"
RETURN = "    )\n    return c\n"


def edit(old: str, new: str) -> tuple[str, set[int]]:
    assert GEMM.count(old) == 1, old
    text = GEMM.replace(old, new, 1)
    added: set[int] = set()
    sm = difflib.SequenceMatcher(a=GEMM.splitlines(), b=text.splitlines(), autojunk=False)
    for tag, _i1, _i2, j1, j2 in sm.get_opcodes():
        if tag in ("replace", "insert"):
            added |= {n for n in range(j1 + 1, j2 + 1)}
    return text, added


def uses(old: str, new: str) -> list[tuple[int, str]]:
    text, added = edit(old, new)
    fn = next(n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name == "matmul")
    return launch_value_uses(fn, added)


READS = [
    ("assignment", LAUNCH, "    handle = gemm_kernel[grid](\n"),
    ("annotated", LAUNCH, "    handle: object = gemm_kernel[grid](\n"),
    ("is None", LAUNCH, "    on_gpu = gemm_kernel[grid](\n"),
    ("walrus", LAUNCH, "    if (h := gemm_kernel[grid](\n"),
    ("passed", LAUNCH, "    print(gemm_kernel[grid](\n"),
    ("bool", LAUNCH, "    bool(gemm_kernel[grid](\n"),
    ("compared", LAUNCH, "    None is gemm_kernel[grid](\n"),
    ("returned", LAUNCH, "    return gemm_kernel[grid](\n"),
    ("in a tuple", LAUNCH, "    t = (gemm_kernel[grid](\n"),
    ("alias launched", LAUNCH, "    kk = gemm_kernel\n    h = kk[grid](\n"),
    ("lambda", LAUNCH, "    go = lambda: gemm_kernel[grid](\n"),
]


@pytest.mark.parametrize("name,old,new", READS, ids=[r[0] for r in READS])
def test_a_launch_whose_value_is_read_is_found(name, old, new):
    old_block = GEMM[GEMM.index(LAUNCH):GEMM.index(RETURN) + len(RETURN)]
    new_block = old_block.replace(LAUNCH, new, 1)
    if name == "walrus":
        new_block = new_block.replace(RETURN, "    )) is None:\n        c = c * 1\n    return c\n")
    elif name in ("passed", "bool"):
        new_block = new_block.replace(RETURN, "    ))\n    return c\n")
    elif name == "in a tuple":
        new_block = new_block.replace(RETURN, "    ),)\n    return c\n")
    elif name == "is None":
        new_block = new_block.replace(RETURN, "    )\n    c = c if on_gpu is None else c * 1\n    return c\n")
    elif name == "returned":
        new_block = new_block.replace(RETURN, "    )\n")
    elif name == "lambda":
        new_block = new_block.replace(RETURN, "    )\n    go()\n    return c\n")
    found = uses(old_block, new_block)
    assert found, new_block
    assert all(line > 0 for line, _ in found)


def test_a_launch_as_a_statement_is_not_found():
    # the pristine wrapper, and an honest edit of its launch (a new argument), are statements
    fn = next(n for n in ast.parse(GEMM).body if isinstance(n, ast.FunctionDef) and n.name == "matmul")
    assert launch_value_uses(fn, set(range(1, 10_000))) == []
    assert uses("        num_warps=config[\"num_warps\"], num_stages=config[\"num_stages\"],\n",
                "        num_warps=config[\"num_warps\"], num_stages=config[\"num_stages\"] + 0,\n") == []


def test_only_changed_lines_count():
    text = GEMM.replace(LAUNCH, "    h = gemm_kernel[grid](\n", 1)
    fn = next(n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name == "matmul")
    assert launch_value_uses(fn, set()) == []
    line = text.splitlines().index("    h = gemm_kernel[grid](") + 1
    assert launch_value_uses(fn, {line}) == [(line, launch_value_uses(fn, {line})[0][1])]
    assert "launch_value" in RULES and "kernel[grid]" in RULES["launch_value"]


# --- the interpreter's other host-visible tells are refused by the policy as it stands -------------------------

TELLS = [
    ("os.environ", "    import os\n    if os.environ.get('TRITON_INTERPRET') == '1':\n        K = K // 2\n"),
    ("the variable's name", "    k_env = 'TRITON_' + 'INTERPRET'\n"),
    ("triton.runtime.interpreter", "    if triton.runtime.interpreter is not None:\n        K = K // 2\n"),
    ("triton.runtime.driver", "    if triton.runtime.driver.active.get_current_target().backend == 'cuda':\n        K = K // 2\n"),
    ("torch.cuda.is_available", "    if not torch.cuda.is_available():\n        K = K // 2\n"),
    ("tensor.is_cuda", "    if not a.is_cuda:\n        K = K // 2\n"),
    ("tensor.device.type", "    if a.device.type == 'cpu':\n        K = K // 2\n"),
    ("device compared", "    if a.device == torch.device('cpu'):\n        K = K // 2\n"),
    ("str(device)", "    if str(a.device) != 'cuda:0':\n        K = K // 2\n"),
    ("get_device", "    if a.get_device() < 0:\n        K = K // 2\n"),
    ("torch.version.cuda", "    if torch.version.cuda is None:\n        K = K // 2\n"),
    ("triton.knobs", "    if triton.knobs.runtime.interpret:\n        K = K // 2\n"),
    ("kernel object", "    if 'Interpreted' in str(gemm_kernel):\n        K = K // 2\n"),
    ("kernel attribute", "    if gemm_kernel.device_caches is None:\n        K = K // 2\n"),
]


@pytest.mark.parametrize("name,code", TELLS, ids=[t[0] for t in TELLS])
def test_interpreter_tells_in_the_wrapper_are_refused(name, code):
    old = "    c = torch.empty((M, N), device=a.device, dtype=a.dtype)\n"
    text, added = edit(old, old + code)
    found = static_findings("kernels/gemm.py", GEMM, text, added, ("matmul",), {"grouped_pid"})
    assert found, f"{name}: not refused"
