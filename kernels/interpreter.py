"""Fixes to Triton's CPU interpreter (TRITON_INTERPRET=1) so that a kernel checked on a CPU host
computes what the same kernel computes on the GPU, and sees what it would see there.

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

Then what the kernel compiled for the target arch computes or returns, which the interpreter as shipped does
not (``FIDELITY_NAMES``; the arch is ``set_target_arch``'s, sm_90 unless the gate's child is told another; the
evidence for each, from the PTX Triton emits for sm_90, is in docs/gpu-only.md):

- ``tf32_dot``: the interpreter's ``create_dot`` ignores ``input_precision`` and multiplies fp32 operands in
  fp32. Compiled for sm_80+, Triton's default (``input_precision=None``, ``allow_tf32`` not False,
  ``TRITON_F32_DEFAULT`` unset) is tf32: the fp32 registers go to ``mma``/``wgmma ... .tf32`` with no
  conversion, and the tensor core reads 10 of the 23 mantissa bits (the rest ignored: truncation). fp32 dots
  now do that; ``"tf32x3"`` splits each operand into ``cvt.rna`` tf32 high and low parts and sums three
  products (near fp32); ``"ieee"`` (and any dot below sm_80, which compiles to FMA) stays fp32. A kernel that
  probes ``tl.dot`` of (1 + 2**-20) gets 1.0, as on an H100. (Triton 3.6 and 3.9.)
- ``fp8_acc``: the interpreter converts fp8 operands to fp16 and accumulates exactly. On sm_90 an fp8
  ``wgmma`` (K = 32 per instruction) adds its products into the accumulator in limited precision (about 14
  significant bits: every term aligned to the largest exponent, lower bits dropped), which is why DeepGEMM
  promotes partial sums to CUDA cores and why Triton has ``max_num_imprecise_acc``: by default (2**30 on
  sm_90) every K chunk goes into the running accumulator in that precision; with ``max_num_imprecise_acc=n``
  <= K the chunks go into a zeroed partial accumulator, added to the fp32 accumulator in fp32 every n
  elements of K (the ``add.f32`` the PTX shows) and at the end of the dot. ``fp8_dot`` emulates both; other
  arches keep exact accumulation. (Triton 3.6 and 3.9.)
- ``launch_handle``: ``kernel[grid](...)`` returns the ``CompiledKernel`` when compiled and ``None`` when
  interpreted, so host code could tell the two apart. Interpreted launches now return a ``LaunchHandle``:
  ``is None`` is False as on the GPU, and every other use of the value is reported to the callbacks of
  ``watch_launch_reads`` (the gate's child records each as a sandbox violation: the patch is rejected).

Only the interpreter (CPU) is touched; compiled kernels are unaffected. ``kernels/__init__.py``
calls ``install()`` when TRITON_INTERPRET=1, so every process that runs kernels in the interpreter
(the worker, a test's child process, a plugin's) gets the same arithmetic.
"""

from __future__ import annotations

import inspect
import operator

FIX_NAMES = ("bf16_dot", "bf16_round", "scalar_index", "nested_patch")
# What the compiled kernel for the target arch computes or returns, which the interpreter as shipped does not.
FIDELITY_NAMES = ("tf32_dot", "fp8_acc", "launch_handle")

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


# --- the compiled kernel's arithmetic: what the spec's arch does, not an upstream bug -----------------------
#
# The fixes above repair the interpreter; these make it compute what the kernel compiled for the target arch
# computes (kernels/interpreter.py's docstring: ``tf32_dot``, ``fp8_acc``, ``launch_handle``). They depend on
# the arch (``set_target_arch``; sm_90, an H100, when nobody says).

DEFAULT_ARCH = "sm_90"
TF32_MASK = 0xFFFFE000  # tf32 keeps the sign, the 8 exponent bits and 10 of fp32's 23 mantissa bits
FP8_MMA_K = 32  # K of one fp8 wgmma instruction (m64nNk32): the unit of imprecise accumulation
FP8_ACC_BITS = 14  # significant bits (leading bit included) sm_90's fp8 MMA keeps when it adds
FP8_IMPRECISE_DEFAULT = 2 ** 30  # Triton's max_num_imprecise_acc_default on sm_90 (never promote)

_target: dict[str, object] = {"arch": DEFAULT_ARCH, "capability": 90}


def arch_capability(arch: str) -> int:
    """``sm_90`` / ``sm_90a`` / ``90`` -> 90; anything else is a ValueError naming the value and the form."""
    text = str(arch).strip().lower().removeprefix("sm_").removesuffix("a")
    if not text.isdigit() or not 30 <= int(text) < 1000:
        raise ValueError(f"target arch {arch!r}: expected sm_NN (sm_80, sm_90, sm_90a, sm_100, ...)")
    return int(text)


def set_target_arch(arch: str | None) -> dict[str, object]:
    """The arch the interpreter computes for (None: sm_90). The gate's child calls this with its spec's
    ``hardware.arch`` (kernels/gate_child.py); every other interpreter process computes for sm_90. Also sets
    the interpreter's ``max_num_imprecise_acc_default`` to the CUDA backend's for that arch (2**30 on sm_90,
    else 0), which the language reads when a dot does not pass its own."""
    arch = arch or DEFAULT_ARCH
    _target.update(arch=arch, capability=arch_capability(arch))
    try:
        import dataclasses

        interp = _interp()
        opts = interp.interpreter_builder.options
        want = FP8_IMPRECISE_DEFAULT if _target["capability"] == 90 else 0
        if getattr(opts, "max_num_imprecise_acc_default", want) != want:
            interp.interpreter_builder.options = dataclasses.replace(opts, max_num_imprecise_acc_default=want)
    except ImportError:
        pass
    return dict(_target)


def target() -> dict[str, object]:
    return dict(_target)


def tf32_truncate(x):
    """fp32 -> the tf32 value an mma.tf32 / wgmma.tf32 reads from a raw fp32 register: the low 13 mantissa
    bits ignored (toward zero). Triton's default tf32 dot hands the fp32 bits to the MMA with no cvt (see
    docs/gpu-only.md: the PTX of a default fp32 dot has ``mma...tf32`` and no ``cvt.rna.tf32.f32``)."""
    import numpy as np

    arr = np.ascontiguousarray(x, dtype=np.float32)
    bits = arr.view(np.uint32)
    finite = (bits & 0x7F800000) != 0x7F800000
    return np.where(finite, (bits & np.uint32(TF32_MASK)), bits).astype(np.uint32).view(np.float32).reshape(arr.shape)


def tf32_round(x):
    """``cvt.rna.tf32.f32``: to 10 mantissa bits, to nearest, ties away from zero (what Triton's tf32x3
    split uses). Non-finite values are kept."""
    import numpy as np

    arr = np.ascontiguousarray(x, dtype=np.float32)
    bits = arr.view(np.uint32)
    finite = (bits & 0x7F800000) != 0x7F800000
    rounded = ((bits.astype(np.uint64) + 0x1000) & TF32_MASK).astype(np.uint32)
    return np.where(finite, rounded, bits).astype(np.uint32).view(np.float32).reshape(arr.shape)


def _precision_name(input_precision) -> str:
    """The dot's input precision as a lower-case name (``tf32``, ``tf32x3``, ``ieee``, ...)."""
    name = getattr(input_precision, "name", None)
    if name is None:  # an int from a Triton that passes the enum's value
        from triton._C.libtriton import ir

        name = next((n for n, v in ir.INPUT_PRECISION.__members__.items() if v == input_precision), str(input_precision))
    return str(name).lower()


def fp32_dot(a, b, d, precision: str, capability: int):
    """An fp32 x fp32 dot as Triton compiles it for ``capability``: below sm_80 FMA (exact products, fp32 sums:
    ieee whatever was asked); on sm_80+ ``tf32`` reads the operands as tf32 (truncated), ``tf32x3`` splits
    each operand into a rounded tf32 high part and a tf32 low part and sums three tf32 products (hi*hi +
    hi*lo + lo*hi), ``ieee`` is fp32. Products of tf32 values are exact in fp32; the sums are fp32 (their
    order is NumPy's, not the tensor core's: a difference of fp32 rounding, not of precision)."""
    import numpy as np

    a = np.asarray(a, dtype=np.float32)
    b = np.asarray(b, dtype=np.float32)
    if capability < 80 or precision == "ieee":
        prod = np.matmul(a, b, dtype=np.float32)
    elif precision == "tf32x3":
        a_hi, b_hi = tf32_round(a), tf32_round(b)
        a_lo, b_lo = tf32_round(a - a_hi), tf32_round(b - b_hi)
        small = np.matmul(a_lo, b_hi, dtype=np.float32) + np.matmul(a_hi, b_lo, dtype=np.float32)
        prod = np.matmul(a_hi, b_hi, dtype=np.float32) + small
    elif precision == "tf32":
        prod = np.matmul(tf32_truncate(a), tf32_truncate(b), dtype=np.float32)
    else:
        raise ValueError(f"input_precision {precision!r} for an fp32 dot: the interpreter emulates tf32, tf32x3 "
                         f"and ieee only (see docs/gpu-only.md)")
    return (prod + np.asarray(d, dtype=np.float32)).astype(np.float32)


def _aligned_sum(acc, prods, bits: int):
    """``acc + sum(prods)`` (``prods``: (..., M, k, N), ``acc``: (..., M, N), float32 holding exact values) as
    sm_90's fp8 MMA adds them: every term is aligned to the largest exponent among them and keeps ``bits``
    significant bits below it (truncated toward zero), then the aligned terms are summed exactly.

    The largest exponent is the exponent of the largest magnitude; scaling by a power of two, truncating and
    summing at most 33 integers below 2**bits are exact in float32 (a product of two fp8 values has 8
    significant bits), so no wider type is needed."""
    import numpy as np

    big = np.maximum(np.abs(prods).max(axis=-2), np.abs(acc))
    _, exp = np.frexp(big)
    # 1 / quantum, a normal float32 (an accumulator below 2**-113 keeps fewer bits: far below any tolerance)
    scale = np.ldexp(np.float32(1.0), np.clip(bits - exp, -126, 127).astype(np.int32)).astype(np.float32)
    scale = np.where(big > 0, scale, np.float32(1.0))
    inv = (np.float32(1.0) / scale).astype(np.float32)
    kept = np.trunc(prods * scale[..., None, :]).sum(axis=-2, dtype=np.float32) + np.trunc(acc * scale)
    return (kept * inv).astype(np.float32)


def fp8_dot(a, b, d, max_num_imprecise_acc: int, bits: int = FP8_ACC_BITS, chunk: int = FP8_MMA_K):
    """An fp8 x fp8 -> fp32 dot as Triton compiles it for sm_90 (wgmma, K = 32 per instruction):

    - ``max_num_imprecise_acc`` > K (the default, 2**30): every instruction adds its 32 products into the
      accumulator itself, in the tensor core's limited precision (``_aligned_sum``), the incoming
      accumulator included: a long K loop of ``acc = tl.dot(a, b, acc)`` keeps about ``bits`` bits;
    - otherwise (Triton's "partial accumulator", ``add.f32`` in the PTX every ``max_num_imprecise_acc`` of K):
      the instructions add into a zeroed partial accumulator, which is added to the fp32 accumulator in
      full fp32 every ``max_num_imprecise_acc`` elements of K and at the end of the dot.

    ``a``, ``b``: the operands' exact values (any float dtype); ``d``: the fp32 accumulator."""
    import numpy as np

    a = np.asarray(a, dtype=np.float32)
    b = np.asarray(b, dtype=np.float32)
    full = np.asarray(d, dtype=np.float32)
    k_total = a.shape[-1]
    promote = max_num_imprecise_acc <= k_total
    part = np.zeros(full.shape, np.float32) if promote else full
    since = 0
    for k0 in range(0, k_total, chunk):
        k1 = min(k0 + chunk, k_total)
        prods = a[..., :, k0:k1, None] * b[..., None, k0:k1, :]  # exact: an fp8 x fp8 product has 8 bits
        part = _aligned_sum(part, prods, bits)
        since += k1 - k0
        if promote and (since >= max_num_imprecise_acc or k1 == k_total):
            full = (full + part).astype(np.float32)
            part = np.zeros(full.shape, np.float32)
            since = 0
    return full if promote else part


def _probe_tf32_dot() -> bool:
    """True when an fp32 dot asked for tf32 (Triton's default) keeps fp32 operands: 1 + 2**-11 (not a tf32
    value: tf32 reads it as 1.0) times 1.0 comes out as 1 + 2**-11."""
    import numpy as np
    import triton.language as tl
    from triton._C.libtriton import ir

    interp = _interp()
    saved = dict(_target)
    _target.update(arch=DEFAULT_ARCH, capability=90)
    try:
        a = interp.TensorHandle(np.full((1, 1), 1 + 2.0 ** -11, dtype=np.float32), tl.float32)
        one = interp.TensorHandle(np.ones((1, 1), dtype=np.float32), tl.float32)
        acc = interp.TensorHandle(np.zeros((1, 1), dtype=np.float32), tl.float32)
        out = interp.InterpreterBuilder.create_dot(interp.interpreter_builder, a, one, acc, ir.INPUT_PRECISION.TF32, 0)
    finally:
        _target.update(saved)
    return float(np.asarray(out.data).reshape(-1)[0]) != 1.0


def _probe_fp8_acc() -> bool:
    """True when an fp8 dot on sm_90 accumulates exactly: 32 products of 2**-4 added to an accumulator of
    2**14 give 2**14 + 2 in fp32, and 2**14 on sm_90 (2**-4 is below the 14 bits kept under 2**14)."""
    import numpy as np
    import triton.language as tl
    from triton._C.libtriton import ir

    interp = _interp()
    saved = dict(_target)
    _target.update(arch=DEFAULT_ARCH, capability=90)
    try:
        a = interp.TensorHandle(np.full((1, 32), 0x38, dtype=np.uint8), tl.float8e4nv)  # 1.0
        b = interp.TensorHandle(np.full((32, 1), 0x18, dtype=np.uint8), tl.float8e4nv)  # 2**-4
        acc = interp.TensorHandle(np.full((1, 1), 2.0 ** 14, dtype=np.float32), tl.float32)
        out = interp.InterpreterBuilder.create_dot(interp.interpreter_builder, a, b, acc, ir.INPUT_PRECISION.TF32,
                                                   FP8_IMPRECISE_DEFAULT)
    finally:
        _target.update(saved)
    return float(np.asarray(out.data).reshape(-1)[0]) != 2.0 ** 14


def _apply_tf32_dot() -> None:
    import triton.language as tl

    interp = _interp()
    builder_cls = interp.InterpreterBuilder
    original = builder_cls.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if a.dtype.scalar == tl.float32 and b.dtype.scalar == tl.float32 and d.dtype.scalar == tl.float32:
            out = fp32_dot(a.data, b.data, d.data, _precision_name(input_precision), int(_target["capability"]))
            return interp.TensorHandle(out, d.dtype.scalar)
        return original(self, a, b, d, input_precision, max_num_imprecise_acc)

    create_dot._kregress_original = original
    builder_cls.create_dot = create_dot


def _apply_fp8_acc() -> None:
    import numpy as np
    import triton.language as tl

    interp = _interp()
    builder_cls = interp.InterpreterBuilder
    original = builder_cls.create_dot

    def is_fp8(h) -> bool:
        return h.dtype.scalar.primitive_bitwidth == 8 and h.dtype.scalar.is_floating()

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if _target["capability"] == 90 and is_fp8(a) and is_fp8(b) and d.dtype.scalar == tl.float32:
            def value(h):
                return interp._convert_float(h.data, h.dtype.scalar, tl.float16, None).view(np.float16)

            out = fp8_dot(value(a), value(b), d.data, int(max_num_imprecise_acc))
            return interp.TensorHandle(out, d.dtype.scalar)
        return original(self, a, b, d, input_precision, max_num_imprecise_acc)

    create_dot._kregress_original = original
    builder_cls.create_dot = create_dot
    set_target_arch(str(_target["arch"]))  # the arch's max_num_imprecise_acc_default


_launch_read_hooks: list = []


def watch_launch_reads(callback) -> None:
    """Call ``callback(what)`` whenever host code reads the value an interpreted launch returned (the gate's
    child records it as a violation: kernels/gate_child.py)."""
    _launch_read_hooks.append(callback)


def _launch_read(what: str) -> None:
    for callback in list(_launch_read_hooks):
        callback(what)


class LaunchHandle:
    """What ``kernel[grid](...)`` returns under the interpreter, in place of the ``None`` Triton's interpreter
    returns (the compiled launch returns its ``CompiledKernel``). A launch that is not read is the same either
    way; ``handle is None`` is False either way; every other use of the value (truth, comparison, text,
    attributes, calls, iteration, hashing) is reported to ``watch_launch_reads``'s callbacks, because no
    CPU stand-in can answer it as the compiled kernel would (its registers, its PTX, its metadata), then
    answers as a plain object would (True, identity equality) or raises."""

    __slots__ = ("_kernel",)

    def __init__(self, kernel: str):
        object.__setattr__(self, "_kernel", kernel)

    def _read(self, what: str) -> None:
        _launch_read(f"{what} of the value `{object.__getattribute__(self, '_kernel')}[grid](...)` returned")

    def __bool__(self) -> bool:
        self._read("truth")
        return True

    def __eq__(self, other: object) -> bool:
        self._read("a comparison (==)")
        return self is other

    def __ne__(self, other: object) -> bool:
        self._read("a comparison (!=)")
        return self is not other

    def __hash__(self) -> int:
        self._read("the hash")
        return object.__hash__(self)

    def __repr__(self) -> str:
        self._read("the text")
        return object.__repr__(self)

    def __str__(self) -> str:
        self._read("the text")
        return object.__repr__(self)

    def __format__(self, spec: str) -> str:
        self._read("the text")
        return object.__repr__(self)

    def __getattr__(self, name: str):
        self._read(f"the attribute `{name}`")
        raise AttributeError(f"the interpreter's launch handle has no `{name}` (a CPU run has no compiled kernel)")

    def __setattr__(self, name: str, value: object) -> None:
        self._read(f"an assignment to `{name}`")
        raise AttributeError(f"the interpreter's launch handle is read-only (`{name}`)")

    def __call__(self, *args, **kwargs):
        self._read("a call")
        raise TypeError("the interpreter's launch handle cannot be called")

    def __iter__(self):
        self._read("iteration")
        raise TypeError("the interpreter's launch handle is not iterable")

    def __len__(self) -> int:
        self._read("the length")
        raise TypeError("the interpreter's launch handle has no length")

    def __getitem__(self, key: object):
        self._read("an item")
        raise TypeError("the interpreter's launch handle cannot be indexed")

    def __lt__(self, other: object):
        self._read("an ordering (<)")
        return NotImplemented

    __le__ = __gt__ = __ge__ = __lt__


def _probe_launch_handle() -> bool:
    """True when an interpreted launch returns None (the compiled launch returns its kernel)."""
    from kernels import _interpreter_probe as probe

    return probe.no_call[(1,)](3) is None


def _apply_launch_handle() -> None:
    interp = _interp()
    cls = interp.InterpretedFunction
    original = cls.run

    def run(self, *args, grid, warmup, **kwargs):
        out = original(self, *args, grid=grid, warmup=warmup, **kwargs)
        if out is None and not warmup:
            return LaunchHandle(getattr(self.fn, "__name__", "kernel"))
        return out

    run._kregress_original = original
    cls.run = run


_FIXES = {
    "bf16_dot": (_probe_bf16_dot, _apply_bf16_dot),
    "bf16_round": (_probe_bf16_round, _apply_bf16_round),
    "scalar_index": (_probe_scalar_index, _apply_scalar_index),
    "nested_patch": (_probe_nested_patch, _apply_nested_patch),
    "tf32_dot": (_probe_tf32_dot, _apply_tf32_dot),
    "fp8_acc": (_probe_fp8_acc, _apply_fp8_acc),
    "launch_handle": (_probe_launch_handle, _apply_launch_handle),
}


def install(only: tuple[str, ...] | None = None) -> dict[str, str]:
    """Install every fix the interpreter at hand needs and every emulation of the compiled kernel (or those
    named in ``only``); idempotent.

    Returns {name: "applied" | "not needed (...)" | "not applied: ..."} for every fix and emulation considered
    in this process (``installed()`` lists the fixes, ``fidelity()`` the emulations). A Triton whose
    interpreter internals changed so that a probe cannot run gets no fix and says so (the interpreter then
    runs as shipped; tests/test_interpreter_fixes.py and tests/test_interpreter_fidelity.py fail loudly),
    rather than every interpreter process failing at import."""
    import numpy as np
    import triton

    where = f"Triton {triton.__version__}, NumPy {np.__version__}"
    for name in only or FIX_NAMES + FIDELITY_NAMES:
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
    """What ``install()`` decided about the fixes (``FIX_NAMES``) in this process so far."""
    return {k: v for k, v in _state.items() if k in FIX_NAMES}


def fidelity() -> dict[str, str]:
    """What ``install()`` decided about the emulations of the compiled kernel (``FIDELITY_NAMES``), with the
    target arch they compute for."""
    return {k: v for k, v in _state.items() if k in FIDELITY_NAMES} | {"arch": str(_target["arch"])}
