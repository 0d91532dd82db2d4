"""Two one-program kernels for kernels/interpreter.py's ``nested_patch`` probe: imported only when
the probe runs (under TRITON_INTERPRET=1, where ``triton.jit`` gives the interpreter's functions), never
by a kernel family. They take a scalar and write nothing, so the probe needs no tensor (and no torch)."""

import triton
import triton.language as tl


@triton.jit
def _plus_one(x):
    return x + 1


@triton.jit
def no_call(n):
    tl.static_assert(True)


@triton.jit
def nested_call(n):
    _plus_one(_plus_one(n))
