"""The compile facts a sweep reports are ptxas's own (issue 32): registers and spills read back from the cubin
agree with `ptxas -v` on the same PTX, and a kernel that does not compile keeps the compiler's message,
not just its location. Real Triton compiles for sm_90; no GPU."""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path

import pytest
import triton
import triton.language as tl

from kernels.compile import _TRITON_BIN, CompileError, compile_error_text, compile_units
from kregress.core.family import CompileUnit, get_family
from kregress.core.spec import HardwareLimits


@triton.jit
def _bad_dot(x_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    a = tl.load(x_ptr + offs)
    b = tl.dot(a, a)  # a 1-D dot: Triton refuses it at compile time
    tl.store(x_ptr + offs, b)


def test_a_compile_error_keeps_the_message_and_the_failing_line():
    unit = CompileUnit(fn=_bad_dot, signature={"x_ptr": "*fp32", "BLOCK": "constexpr"}, constexprs={"BLOCK": 16},
                       num_warps=4, num_stages=1)
    with pytest.raises(CompileError) as info:
        compile_units([unit], "sm_90", HardwareLimits())
    assert info.value.error == "compile_failed"
    detail = info.value.detail
    assert detail.startswith("input and other must have equal ranks >= 2"), detail  # the message first
    assert re.search(r"\(at \d+:\d+: b = tl\.dot\(a, a\)", detail), detail  # then where, and the failing line


def test_compile_error_text_other_shapes():
    assert compile_error_text("ptxas error: too many resources\nmore") == "ptxas error: too many resources"
    assert compile_error_text("at 3:4:\nx = 1\nno caret here") == "at 3:4: x = 1 no caret here"
    assert compile_error_text("at 1:0:\ndef k():\n^\n") == "no message (at 1:0: def k():)"


def _ptxas_v(ptx: str) -> tuple[int, int]:
    """(registers, stack frame bytes) as `ptxas -v` prints them, with the ptxas of the Triton wheel that
    takes this PTX version."""
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.ptx"
        src.write_text(ptx)
        for name in ("ptxas-blackwell", "ptxas"):
            exe = _TRITON_BIN / name
            if not exe.exists():
                continue
            r = subprocess.run([str(exe), "-v", "--gpu-name=sm_90a", str(src), "-o", str(Path(tmp) / "k.cubin")],
                               capture_output=True, text=True)
            if r.returncode == 0:
                regs = int(re.search(r"Used (\d+) registers", r.stderr).group(1))
                stack = int(re.search(r"(\d+) bytes stack frame", r.stderr).group(1))
                return regs, stack
    pytest.skip("no ptxas in the Triton wheel takes this PTX version")


@pytest.mark.parametrize("stages", [1, 2])
def test_registers_and_spills_agree_with_ptxas_v(stages):
    """BLOCK 64x256x128 on 2 warps: a 64x256 fp32 accumulator over 64 threads is 256 values a thread.
    With num_stages=1 ptxas itself reports 32 registers and a 12.7 KB stack frame (the accumulator lives
    in local memory: spilled, not held in registers); with 2 stages 255 registers and a smaller frame.
    The sweep's numbers are ptxas's, read back from the cubin (cuobjdump's REG and STACK): registers
    equal, the spill bytes (the stack frame) within 3% of the frame `ptxas -v` prints for the same PTX
    (8 B and 72 B apart here)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    cfg = {"BLOCK_M": 64, "BLOCK_N": 256, "BLOCK_K": 128, "GROUP_M": 8, "num_stages": stages, "num_warps": 2}
    (unit,) = get_family("gemm").compile_units(cfg, "bf16", {})
    stats = compile_units([unit], "sm_90", HardwareLimits(), sass=False)
    attrs = {(unit.fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in unit.divisible}
    compiled = triton.compile(ASTSource(fn=unit.fn, signature=unit.signature, constexprs=unit.constexprs, attrs=attrs),
                              target=GPUTarget("cuda", 90, 32), options={"num_warps": 2, "num_stages": stages})
    regs, stack = _ptxas_v(compiled.asm["ptx"])
    assert stats.regs_per_thread == regs
    assert abs(stack - stats.spill_bytes) <= 0.03 * stack, (stack, stats.spill_bytes)
    if stages == 1:
        assert regs == 32 and stats.spill_bytes > 256 * 4 * 4  # far more than the accumulator: it is all on the stack
