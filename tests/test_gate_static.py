"""The static gate (kregress.core.gate) on edits of the real kernels: every cheat construct is refused
with its rule and line, and the edits a kernel engineer makes pass. Pure AST work: no process, no Triton."""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest

from kregress.core.gate import RULES, static_findings

REPO = Path(__file__).resolve().parents[1]
GEMM = (REPO / "kernels" / "gemm.py").read_text()
ATTN = (REPO / "kernels" / "attention.py").read_text()
RETURN_C = "    )\n    return c\n\n\nimport sys as _sys"
LAUNCH = "    gemm_kernel[grid](\n"
LOOP_DOT = "        acc = tl.dot(a, b, acc)\n"


def edit(source: str, old: str, new: str) -> tuple[str, set[int]]:
    assert source.count(old) == 1, old
    text = source.replace(old, new, 1)
    added: set[int] = set()
    sm = difflib.SequenceMatcher(a=source.splitlines(), b=text.splitlines(), autojunk=False)
    for tag, _i1, _i2, j1, j2 in sm.get_opcodes():
        if tag in ("replace", "insert"):
            added |= set(range(j1 + 1, j2 + 1))
    return text, added


def gemm_rules(old: str, new: str) -> list[str]:
    text, added = edit(GEMM, old, new)
    return [f.rule for f in static_findings("kernels/gemm.py", GEMM, text, added, ("matmul",), {"grouped_pid"})]


def at_return(code: str) -> str:
    """Insert ``code`` (wrapper body lines) just before ``return c``."""
    return RETURN_C.replace("    return c\n", code.rstrip("\n") + "\n    return c\n")


CHEATS = [
    ("torch_compute", "    c = a @ b\n"),
    ("torch_compute", "    c = torch.matmul(a, b)\n"),
    ("torch_compute", "    c = torch.ops.aten.mm(a, b)\n"),
    ("torch_compute", "    c = torch.nn.functional.linear(a, b.t())\n"),
    ("torch_compute", "    c = a.mm(b)\n"),
    ("torch_compute", "    c = torch.einsum('mk,kn->mn', a, b)\n"),
    ("torch_compute", "    c = (a[:, :, None] * b[None]).sum(1)\n"),
    ("torch_compute", "    c = torch.Tensor.mm(a, b)\n"),
    ("torch_compute", "    c = torch.addmm(c, a, b, beta=0)\n"),
    ("torch_compute", "    print(a.numpy())\n"),
    ("dynamic_code", "    t = torch\n    c = t.mm(a, b)\n"),
    ("dynamic_code", "    c = getattr(a, 'm' + 'm')(b)\n"),
    ("dynamic_code", "    c = eval('a @ b')\n"),
    ("dynamic_code", "    c = exec('c = 1')\n"),
    ("introspection", "    c = __import__('torch').mm(a, b)\n"),
    ("introspection", "    c = vars()['a']\n"),
    ("introspection", "    c = globals()['FAMILY'].reference({'a': a, 'b': b}, {})\n"),
    ("introspection", "    k = a.__class__\n"),
    ("introspection", "    kind = type(a)\n"),
    ("reference", "    c = FAMILY.reference({'a': a, 'b': b}, {}).to(a.dtype)\n"),
    ("reference", "    space = SPACE\n"),
    ("reference", "    f = GemmFamily\n"),
    ("torch_compute", "    import numpy as np\n"),
    ("environment", "    import os\n"),
    ("environment", "    k = _sys.modules\n"),
    ("environment", "    if a.is_cuda:\n        return c\n"),
    ("environment", "    if a.device.type == 'cpu':\n        return c\n"),
    ("environment", "    ok = torch.cuda.is_available()\n"),
    ("environment", "    if str(a.device) == 'cpu':\n        return c\n"),
    ("environment", "    if a.device.index is None:\n        return c\n"),
    ("environment", "    where = f'{a.device}'\n"),
    ("environment", "    if a.device != torch.device('cuda', 0):\n        return c\n"),
    ("environment", "    v = torch.version.cuda\n"),
    ("environment", "    interp = triton.knobs.runtime.interpret\n"),
    ("environment", "    drv = triton.runtime.driver\n"),
    ("environment", "    flag = 'TRITON_INTERPRET'\n"),
    ("process", "    import subprocess\n"),
    ("network", "    import socket\n"),
    ("native", "    import ctypes\n"),
    ("file_io", "    f = open('/tmp/out', 'w')\n"),
    ("concurrency", "    import threading\n"),
    ("concurrency", "    torch.cuda.synchronize()\n"),
    ("concurrency", "    s = torch.cuda.Stream()\n"),
    ("concurrency", "    e = torch.cuda.Event(enable_timing=True)\n"),
    ("timer", "    t = triton.testing.do_bench\n"),
    ("module_state", "    triton.testing.do_bench = lambda fn, **kw: [0.001]\n"),
    ("module_state", "    torch.backends.cuda.matmul.allow_tf32 = True\n"),
    ("module_state", "    gemm_kernel.cache = c\n"),
    ("module_state", "    TRITON_PTR['c'] = c\n"),
    ("module_state", "    TRITON_PTR.update({'c': c})\n"),
    ("module_state", "    global SPACE\n"),
    ("mutates_input", "    a.zero_()\n"),
    ("mutates_input", "    config['BLOCK_K'] = 16\n"),
    ("cache_by_identity", "    key = a.data_ptr()\n"),
    ("cache_by_identity", "    key = id(a)\n"),
    ("cache_by_identity", "    s = a.untyped_storage()\n"),
    ("tensor_subclass", "    class Lazy(torch.Tensor):\n        pass\n"),
    ("import", "    import functools\n"[:0] + "    import json\n"),
    ("context_manager", "    with torch.no_grad():\n        pass\n"),
]


@pytest.mark.parametrize("rule,code", CHEATS, ids=[f"{r}:{c.strip()[:40]}" for r, c in CHEATS])
def test_wrapper_cheats_are_refused_with_their_rule_and_line(rule, code):
    text, added = edit(GEMM, RETURN_C, at_return(code))
    found = static_findings("kernels/gemm.py", GEMM, text, added, ("matmul",), {"grouped_pid"})
    assert rule in {f.rule for f in found}, [f.text() for f in found]
    assert all(f.line in added for f in found if f.rule == rule), [f.text() for f in found]
    assert all(f.file == "kernels/gemm.py" and f.message.endswith(RULES[f.rule]) for f in found)


def test_try_except_around_the_launch_is_refused():
    old = GEMM[GEMM.index(LAUNCH):GEMM.index(RETURN_C) + 6]
    body = "".join("    " + line if line.strip() else line for line in old.splitlines(True))
    new = "    try:\n" + body + "    except Exception:\n        c = torch.mm(a, b)\n"
    rules = gemm_rules(old, new)
    assert "try_except" in rules and "torch_compute" in rules


KERNEL_CHEATS = [
    ("jit_call", LOOP_DOT, "        acc = matmul(a, b, acc)\n"),
    ("inline_asm", LOOP_DOT, "        acc = tl.inline_asm_elementwise('mov.b32 $0, $1;', '=r,r', [acc], dtype=tl.float32, is_pure=True, pack=1)\n"),
    ("interpreter_internals", LOOP_DOT, "        acc = tl.dot(a, b, acc) + a.handle.data.sum()\n"),
    ("jit_call", LOOP_DOT, "        if isinstance(K, int):\n            acc = tl.dot(a, b, acc)\n"),
    ("torch_compute", LOOP_DOT, "        acc = torch.mm(a, b)\n"),
    ("kernel_not_jit", "@triton.jit\ndef gemm_kernel(", "def gemm_kernel("),
    ("decorator", "@triton.jit\ndef gemm_kernel(", "@triton.autotune(configs=[], key=[])\n@triton.jit\ndef gemm_kernel("),
    ("decorator", "@triton.jit\ndef gemm_kernel(", "@triton.jit(launch_metadata=lambda grid, kernel, args: {})\ndef gemm_kernel("),
    ("entry_signature", "def matmul(a: torch.Tensor, b: torch.Tensor, config: dict[str, int]) -> torch.Tensor:",
     "def matmul(a: torch.Tensor, b: torch.Tensor, config: dict[str, int], _cache={}) -> torch.Tensor:"),
    ("entry_signature", "def matmul(a: torch.Tensor", "@staticmethod\ndef matmul(a: torch.Tensor"),
    ("no_launch", LAUNCH, "    (lambda *args, **kwargs: None)(\n"),
]


@pytest.mark.parametrize("rule,old,new", KERNEL_CHEATS, ids=[f"{r}:{n.strip()[:30]}" for r, _, n in KERNEL_CHEATS])
def test_kernel_cheats_are_refused(rule, old, new):
    assert rule in gemm_rules(old, new)


LEGIT = [
    ("acc += dot", LOOP_DOT, "        acc += tl.dot(a, b)\n"),
    ("input precision", LOOP_DOT, "        acc = tl.dot(a, b, acc, input_precision='ieee')\n"),
    ("hints", "    offs_k = tl.arange(0, BLOCK_K)\n",
     "    offs_k = tl.arange(0, BLOCK_K)\n    offs_m = tl.max_contiguous(tl.multiple_of(offs_m, BLOCK_M), BLOCK_M)\n"),
    ("tl.range pipelining", "    for k in range(0, tl.cdiv(K, BLOCK_K)):\n",
     "    for k in tl.range(0, tl.cdiv(K, BLOCK_K), num_stages=2):\n"),
    ("heuristics EVEN_K", "@triton.jit\ndef gemm_kernel(",
     "@triton.heuristics({'EVEN_K': lambda args: args['K'] % args['BLOCK_K'] == 0})\n@triton.jit\ndef gemm_kernel("),
    ("jit kwargs", "@triton.jit\ndef gemm_kernel(", "@triton.jit(do_not_specialize=['M'])\ndef gemm_kernel("),
    ("new jit helper", "@triton.jit\ndef gemm_kernel(",
     "@triton.jit\ndef _scale(x, s: tl.constexpr):\n    return x * s\n\n\n@triton.jit\ndef gemm_kernel("),
    ("comment above the kernel", "@triton.jit\ndef gemm_kernel(", "# the hot loop below\n@triton.jit\ndef gemm_kernel("),
    ("nested grid def", "    grid = lambda META: (triton.cdiv(M, META[\"BLOCK_M\"]) * triton.cdiv(N, META[\"BLOCK_N\"]),)  # noqa: E731\n",
     "    def grid(META):\n        return (triton.cdiv(M, META['BLOCK_M']) * triton.cdiv(N, META['BLOCK_N']),)\n"),
    ("same device check", "    N = b.shape[1]\n",
     "    N = b.shape[1]\n    if a.device != b.device:\n        raise ValueError('matmul: A and B on different devices')\n"),
    ("early return", "    c = torch.empty((M, N), device=a.device, dtype=a.dtype)\n",
     "    c = torch.empty((M, N), device=a.device, dtype=a.dtype)\n    if M == 0 or N == 0:\n        return c\n"),
    ("next_power_of_2 and math", "    N = b.shape[1]\n",
     "    N = b.shape[1]\n    even_k = K % config['BLOCK_K'] == 0 and triton.next_power_of_2(K) == K and math.log2(K) > 0\n"),
    ("docstring naming the interpreter", '    """C = A @ B with the given tile config. (1) check shapes, (2) allocate, (3) launch.\n',
     '    """C = A @ B, tiled. Under TRITON_INTERPRET=1 it runs on CPU tensors.\n'),
    ("allocation", "    c = torch.empty((M, N), device=a.device, dtype=a.dtype)\n",
     "    c = torch.empty((M, N), device=a.device, dtype=a.dtype, memory_format=torch.contiguous_format)\n"),
]


@pytest.mark.parametrize("name,old,new", LEGIT, ids=[x[0] for x in LEGIT])
def test_kernel_engineering_edits_pass(name, old, new):
    assert gemm_rules(old, new) == []


def test_the_attention_wrapper_keeps_its_pristine_helpers():
    """Changed wrapper code may call what the pristine wrapper already calls (_aligned_rows, _split), but
    not the family's reference or the module's other functions."""
    old = "    main, pe = _split(d)\n    n_m = "
    ok, added = edit(ATTN, old, "    main, pe = _split(d)\n    q = q if _aligned_rows(q) else q.contiguous()\n    n_m = ")
    assert static_findings("kernels/attention.py", ATTN, ok, added, ("attention",), {"online_softmax_step"}) == []
    bad, added = edit(ATTN, old, "    main, pe = _split(d)\n    lens = seq_lengths({}, {})\n    n_m = ")
    assert {f.rule for f in static_findings("kernels/attention.py", ATTN, bad, added, ("attention",),
                                            {"online_softmax_step"})} == {"reference"}


def test_only_changed_code_is_judged():
    """The pristine wrapper's own constructs (raise, .contiguous(), torch.empty) on untouched lines are
    never findings, however the rest of the function is edited."""
    text, added = edit(GEMM, "    a = a.contiguous()\n", "    a = a.contiguous()  # row-major A\n")
    assert static_findings("kernels/gemm.py", GEMM, text, added, ("matmul",), {"grouped_pid"}) == []
