"""Fixes to Triton's CPU interpreter (TRITON_INTERPRET=1) so that a kernel checked on a CPU host
computes what the same kernel computes on the GPU.

Each fix is installed only where the Triton (and NumPy) at hand need it, and that is decided by a
probe of the interpreter's own behaviour on one tiny input, not by a version string: a Triton that
fixes a bug upstream simply stops getting our fix, and the record (``install()``'s answer, which
the GPU check writes into its summary) says which fixes ran and why.

- ``bf16_dot``: the interpreter stores bf16 as uint16 and its ``create_dot`` multiplies those raw
  bit patterns (fp8 operands are converted first, bf16 are not), which yields garbage. bf16 operands
  are widened to fp32 first: a product of two bf16 values is exact in fp32, which is what the tensor
  cores compute too. (Triton 3.6 and 3.9.)
- ``bf16_round``: the interpreter converts fp32 to bf16 by dropping the low 16 bits (truncation,
  toward zero), while the GPU's ``cvt.rn.bf16.f32`` (and torch) round to nearest, ties to even. About
  half of all values came out one bf16 step smaller in magnitude, so every bf16 output checked on a
  CPU host was about one bf16 step worse than on the GPU. fp32 -> bf16 now rounds to nearest even;
  NaN stays a (quiet) NaN, values past the largest bf16 round to inf as on the GPU. Every fp32 ->
  bf16 cast goes through ``cast_impl`` (``x.to(tl.bfloat16)``, stores into bf16 pointers, bf16
  constants, and fp64 -> bf16 via fp32); an explicit ``fp_downcast_rounding="rtz"`` keeps truncating.
  (Triton 3.6 and 3.9.)
- ``scalar_index``: every scalar in the interpreter is a one-element 1-d array, and Triton 3.6's
  ``tensor.__index__`` is ``int(self.handle.data)``; NumPy 2.4 made converting an array of ndim > 0
  to a Python scalar an error ("only 0-dimensional arrays can be converted to Python scalars"), so
  ``for k in range(0, tl.cdiv(K, BLOCK_K))`` (every GEMM's K loop) failed on the first launch. Triton
  3.9 takes ``.squeeze()`` first; the fix does the same on a Triton that does not. (Triton 3.6 with
  NumPy >= 2.4.)
- ``nested_patch`` (speed, not arithmetic): a launch patches ``triton.language`` for the interpreter
  once (``_patch_lang``: ``inspect.getmembers`` over the language modules, a wrapper per builtin), and
  restores it when the launch ends; but every call of a nested ``@triton.jit`` helper patches it all
  again (``InterpretedFunction.__call__``), finding the builtins already wrapped. Inside a launch whose
  patch already covers the language modules the helper sees, the helper's call now skips that; the
  same wrappers are in place either way, so the arithmetic is unchanged (tests/test_interpreter_fixes.py
  compares the outputs bit for bit). The attention and MLA kernels call helpers per block of keys:
  ``bench/interpreter_patch.py`` has a sequence after a 4000-key prefix at 2.3x the speed, a ragged
  batch at 1.3x and an MLA decode batch at 1.4x. (Triton 3.6 and 3.9.)

Only the interpreter (CPU) is touched; compiled kernels are unaffected. ``kernels/__init__.py``
calls ``install()`` when TRITON_INTERPRET=1, so every process that runs kernels in the interpreter
(the worker, a test's child process, a plugin's) gets the same arithmetic.
"""

from __future__ import annotations

import inspect
import operator

FIX_NAMES = ("bf16_dot", "bf16_round", "scalar_index", "nested_patch")

_state: dict[str, str] = {}


def fp32_to_bf16_bits(x):
    """fp32 values -> bf16 bit patterns (uint16), rounded to nearest, ties to even.

    Adding 0x7FFF plus the lowest kept bit and dropping the low 16 bits rounds the 32-bit pattern
    to nearest even; a carry out of the mantissa moves into the exponent, which is the right answer
    (up to inf past the largest bf16). NaN is kept a quiet NaN with its sign."""
    import numpy as np

    arr = np.asarray(x, dtype=np.float32)
    u = arr.reshape(-1).view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    rounded[nan] = ((u[nan] >> 16) | 0x0040).astype(np.uint16)
    return rounded.reshape(arr.shape)


def _bf16_bits_to_fp32(h):
    import numpy as np

    return (np.asarray(h).astype(np.uint32) << 16).view(np.float32)


# --- probes: does the interpreter at hand still have the bug? -----------------------------------

def _interp():
    from triton.runtime import interpreter as interp

    return interp


def _probe_bf16_dot() -> bool:
    """True when a bf16 dot of 1.0 x 1.0 does not give 1.0 (raw uint16 patterns multiplied)."""
    import numpy as np
    import triton.language as tl

    interp = _interp()
    one = interp.TensorHandle(np.full((1, 1), 0x3F80, dtype=np.uint16), tl.bfloat16)
    acc = interp.TensorHandle(np.zeros((1, 1), dtype=np.float32), tl.float32)
    out = interp.InterpreterBuilder.create_dot(interp.interpreter_builder, one, one, acc, None, 0)
    return float(np.asarray(out.data).reshape(-1)[0]) != 1.0


def _probe_bf16_round() -> bool:
    """True when fp32 0x3F80FFFF (just under 1 + one bf16 step) converts to bf16 0x3F80 (truncated)
    instead of 0x3F81 (nearest)."""
    import numpy as np
    import triton.language as tl

    interp = _interp()
    x = interp.TensorHandle(np.array([0x3F80FFFF], dtype=np.uint32).view(np.float32), tl.float32)
    out = interp.InterpreterBuilder.cast_impl(interp.interpreter_builder, x, tl.bfloat16)
    return int(np.asarray(out.data).view(np.uint16).reshape(-1)[0]) != 0x3F81


def _probe_scalar_index() -> bool:
    """True when the interpreter's ``tensor.__index__`` cannot index with a scalar (a one-element
    1-d array, as every interpreter scalar is)."""
    import numpy as np
    import triton.language as tl

    interp = _interp()
    scope = interp._LangPatchScope()
    try:
        interp._patch_lang_tensor(tl.core.tensor, scope)
        probe = tl.core.tensor(interp.TensorHandle(np.array([3], dtype=np.int32), tl.int32), tl.int32)
        try:
            return operator.index(probe) != 3
        except TypeError:
            return True
    finally:
        scope.restore()


def _patch_builtin_calls(kernel_name: str) -> int:
    """How many times the interpreter patches a language module during one launch of
    ``kernels._interpreter_probe.<kernel_name>`` (one program)."""
    from kernels import _interpreter_probe as probe

    interp = _interp()
    original, calls = interp._patch_builtin, [0]

    def counting(*args, **kwargs):
        calls[0] += 1
        return original(*args, **kwargs)

    interp._patch_builtin = counting
    try:
        getattr(probe, kernel_name)[(1,)](3)
    finally:
        interp._patch_builtin = original
    return calls[0]


def _probe_nested_patch() -> bool:
    """True when a launch that calls a nested ``@triton.jit`` helper patches the language more often
    than one that does not."""
    return _patch_builtin_calls("nested_call") > _patch_builtin_calls("no_call")


# --- the fixes ------------------------------------------------------------------------------------

def _apply_bf16_dot() -> None:
    import numpy as np
    import triton.language as tl

    interp = _interp()
    builder_cls = interp.InterpreterBuilder
    original = builder_cls.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if a.dtype.scalar == tl.bfloat16 or b.dtype.scalar == tl.bfloat16:
            def widen(h):
                if h.dtype.scalar == tl.bfloat16:
                    return _bf16_bits_to_fp32(h.data)
                return h.data.astype(np.float32)

            out = np.matmul(widen(a), widen(b), dtype=np.float32).astype(d.data.dtype) + d.data
            return interp.TensorHandle(out, d.dtype.scalar)
        return original(self, a, b, d, input_precision, max_num_imprecise_acc)

    create_dot._kregress_original = original
    builder_cls.create_dot = create_dot


def _apply_bf16_round() -> None:
    import triton.language as tl

    interp = _interp()
    builder_cls = interp.InterpreterBuilder
    original = builder_cls.cast_impl

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            return interp.TensorHandle(fp32_to_bf16_bits(src.data), dst_type.scalar)
        return original(self, src, dst_type)

    cast_impl._kregress_original = original
    builder_cls.cast_impl = cast_impl


def _apply_scalar_index() -> None:
    interp = _interp()
    original = interp._patch_lang_tensor

    def _patch_lang_tensor(tensor, scope):
        original(tensor, scope)
        # recorded in the same scope, so the launch's restore undoes it with the rest
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    _patch_lang_tensor._kregress_original = original
    interp._patch_lang_tensor = _patch_lang_tensor


def _visible_langs(fn) -> frozenset:
    """The language modules (``triton.language``, ``triton.language.core``) ``fn``'s globals hold: the modules
    the interpreter's ``_patch_lang(fn)`` patches one by one (with ``tl.math`` and the tensor descriptors,
    which it patches every time)."""
    import triton.language as tl

    return frozenset(id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and (v is tl or v is tl.core))


def _apply_nested_patch() -> None:
    import threading

    interp = _interp()
    original_patch = interp._patch_lang
    executor = interp.GridExecutor
    if executor.__name__ != "GridExecutor":  # e.g. a subclass put in place by the gate's program sampler
        raise RuntimeError(f"interp.GridExecutor is {executor.__qualname__}, not the interpreter's own class")
    original_call = executor.__call__
    # per thread, per launch in progress (innermost last): [the launch's function, the language modules its
    # own patch covers (None until the launch has made its patch)]
    local = threading.local()

    def _patch_lang(fn):
        launches = getattr(local, "launches", None)
        if launches:
            entry = launches[-1]
            own_fn, covered = entry
            if covered is None:
                scope = original_patch(fn)
                if fn is own_fn:  # the launch's own patch, which it restores when it ends
                    entry[1] = _visible_langs(fn)
                return scope
            langs = _visible_langs(fn)
            if langs and langs <= covered:
                # the launch's wrappers are in place (it restores them when it ends); a helper's call
                # would only find them wrapped already. Its scope is never restored upstream either.
                return interp._LangPatchScope()
            # a helper that sees a module the launch did not patch: patched as upstream does (and, as
            # upstream, not restored), so the rest of the launch finds it patched too
            scope = original_patch(fn)
            entry[1] = covered | langs
            return scope
        return original_patch(fn)

    def __call__(self, *args, **kwargs):
        launches = getattr(local, "launches", None)
        if launches is None:
            launches = local.launches = []
        launches.append([self.fn, None])
        try:
            return original_call(self, *args, **kwargs)
        finally:
            launches.pop()

    _patch_lang._kregress_original = original_patch
    __call__._kregress_original = original_call
    interp._patch_lang = _patch_lang
    executor.__call__ = __call__


_FIXES = {
    "bf16_dot": (_probe_bf16_dot, _apply_bf16_dot),
    "bf16_round": (_probe_bf16_round, _apply_bf16_round),
    "scalar_index": (_probe_scalar_index, _apply_scalar_index),
    "nested_patch": (_probe_nested_patch, _apply_nested_patch),
}


def install(only: tuple[str, ...] | None = None) -> dict[str, str]:
    """Install every fix the interpreter at hand needs (or those named in ``only``); idempotent.

    Returns {fix: "applied" | "not needed (...)" | "not applied: ..."} for every fix considered in
    this process. A Triton whose interpreter internals changed so that a probe cannot run gets no fix
    and says so (the interpreter then runs as shipped; tests/test_interpreter_fixes.py fails loudly),
    rather than every interpreter process failing at import."""
    import numpy as np
    import triton

    where = f"Triton {triton.__version__}, NumPy {np.__version__}"
    for name in only or FIX_NAMES:
        if name in _state:
            continue
        probe, apply = _FIXES[name]
        try:
            if not probe():
                _state[name] = f"not needed ({where} already right)"
                continue
            apply()
            _state[name] = "applied" if not probe() else f"not applied: the fix did not take on {where}"
        except Exception as exc:  # noqa: BLE001 - internals of another Triton: record, never break the import
            _state[name] = f"not applied: probe failed on {where}: {type(exc).__name__}: {exc}"[:300]
    return dict(_state)


def installed() -> dict[str, str]:
    """What ``install()`` decided in this process so far."""
    return dict(_state)
