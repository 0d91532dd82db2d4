"""Compile units that follow a patched kernel's signature, and the child's compile job (AOT for the
spec's arch, no interpreter)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


# --- compile units that follow the patched kernel's signature ---------------------------------------------


def _unwrap(fn: Any) -> Any:
    """The JITFunction under decorators such as triton.heuristics."""
    from triton.runtime.jit import JITFunction

    seen = 0
    while not isinstance(fn, JITFunction) and hasattr(fn, "fn") and seen < 8:
        fn = fn.fn
        seen += 1
    return fn


@dataclass
class Capture:
    fn: Any
    signature: dict[str, str]
    constexprs: dict[str, Any]
    divisible: tuple[str, ...]
    num_warps: int
    num_stages: int


def capture_launches(family: Any, config: dict, dtype: str, params: dict, shapes: list[dict], arch: str) -> list[Capture]:
    """Run the entry point on CPU tensors with every jit launch intercepted (nothing runs): what the
    GPU JIT would compile for ``arch`` on each launch (signature, constexprs, divisibility, options),
    computed with Triton's own binder. Used for what ``compile_units`` does not say (a new parameter)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import JITFunction, create_function_from_signature

    from kernels.dtypes import TORCH_DTYPES
    from kregress.core.names import arch_capability

    backend = make_backend(GPUTarget("cuda", arch_capability(arch), 32))
    caps: list[Capture] = []
    original = JITFunction.run

    def run(self, *args, grid, warmup, **kwargs):
        binder = create_function_from_signature(self.signature, self.params, backend)
        bound_args, specialization, options = binder(*args, **kwargs)
        options, signature, constexprs, attrs = self._pack_args(backend, kwargs, bound_args, specialization, options)
        names = list(self.arg_names)
        consts = {names[p[0]]: v for p, v in constexprs.items() if len(p) == 1}
        div = tuple(names[p[0]] for p, a in attrs.items() if len(p) == 1 and any(x[0] == "tt.divisibility" for x in a))
        caps.append(Capture(self, dict(signature), consts, div, options.num_warps, options.num_stages))
        return None

    JITFunction.run = run
    try:
        for shape in shapes:
            inputs = family.make_inputs(shape, TORCH_DTYPES[dtype], "cpu", 0, params)
            family.run(inputs, dict(config), dict(params))
    finally:
        JITFunction.run = original
    return caps


def derive_units(family: Any, config: dict, dtype: str, params: dict, captures: list[Capture]) -> tuple[list, list[str]]:
    """The family's compile units for the patched kernels: each unit keeps what ``compile_units`` says
    for the parameters it knows; a parameter the patch added takes its value (and type and
    divisibility) from the captured launches of that kernel, else its default; a kernel the wrapper
    launches that ``compile_units`` does not list is compiled as captured. Returns (units, notes)."""
    from kregress.core.family import CompileUnit

    units = family.compile_units(config, dtype, params)
    out, notes = [], []
    known = set()
    for u in units:
        fn = _unwrap(u.fn)
        known.add(id(fn))
        names = list(fn.arg_names)
        missing = [n for n in names if n not in u.signature]
        # what the wrapper really launches (its tile sizes, warps, stages) is compiled too where it differs
        # from what compile_units declares for the judged config: the stats are of the heaviest unit, so a
        # wrapper that launches other tiles than the config says cannot hide their spills or shared memory
        for cap in captures:
            if cap.fn is fn and not _launch_matches(cap, u):
                differs = {k: cap.constexprs[k] for k, v in u.constexprs.items() if k in cap.constexprs and cap.constexprs[k] != v}
                differs.update({k: getattr(cap, k) for k in ("num_warps", "num_stages") if getattr(cap, k) != getattr(u, k)})
                out.append(CompileUnit(cap.fn, dict(cap.signature), dict(cap.constexprs), cap.num_warps, cap.num_stages,
                                       tuple(cap.divisible)))
                notes.append(f"{fn.__name__}: launched with {differs}, not the judged config's values: compiled as launched too")
        if not missing and all(n in names for n in u.signature):
            out.append(CompileUnit(fn, dict(u.signature), dict(u.constexprs), u.num_warps, u.num_stages, tuple(u.divisible)))
            continue
        mine = [c for c in captures if c.fn is fn]
        variants: list[tuple] = []
        for cap in mine or [None]:
            sig = {n: u.signature[n] for n in names if n in u.signature}
            consts = {k: v for k, v in u.constexprs.items() if k in names}
            div = [d for d in u.divisible if d in names]
            for n in missing:
                p = fn.params[names.index(n)]
                if cap is not None and n in cap.signature:
                    sig[n] = cap.signature[n]
                    if n in cap.constexprs:
                        consts[n] = cap.constexprs[n]
                    if n in cap.divisible:
                        div.append(n)
                elif p.is_constexpr and p.has_default:
                    sig[n] = "constexpr"
                    consts[n] = p.default
                else:
                    raise ValueError(f"{fn.__name__}: the new parameter {n} has no default and the launch could not be "
                                     "captured; give it a default or pass it from the launch wrapper")
            sig = {n: sig[n] for n in names}
            key = (tuple(sig.items()), tuple(sorted((k, repr(v)) for k, v in consts.items())))
            if key not in [v[0] for v in variants]:
                variants.append((key, CompileUnit(fn, sig, consts, u.num_warps, u.num_stages, tuple(dict.fromkeys(div)))))
        out += [v[1] for v in variants]
        added = ", ".join(f"{n}={variants[0][1].constexprs.get(n, variants[0][1].signature[n])}" for n in missing)
        notes.append(f"{fn.__name__}: new parameter(s) {added} taken from "
                     f"{'the wrapper launch' if mine else 'their defaults'} ({len(variants)} compile unit(s))")
    for cap in captures:
        if id(cap.fn) not in known:
            known.add(id(cap.fn))
            out.append(CompileUnit(cap.fn, cap.signature, cap.constexprs, cap.num_warps, cap.num_stages, cap.divisible))
            notes.append(f"{cap.fn.__name__}: launched by the wrapper, not listed by compile_units: compiled as launched")
    return out, notes


def _launch_matches(cap: Capture, unit: Any) -> bool:
    """A captured launch runs the unit's code: the same values for the constexprs the unit fixes, and the
    same warps and stages."""
    same = all(cap.constexprs[k] == v for k, v in unit.constexprs.items() if k in cap.constexprs)
    return same and cap.num_warps == unit.num_warps and cap.num_stages == unit.num_stages


def _capture_shapes(family: Any, spec_shapes: list[dict], fallback: list[dict], dtype_bytes: int, params: dict,
                    max_bytes: float = 512e6) -> list[dict]:
    shapes = [s for s in spec_shapes if family.bytes_moved(s, dtype_bytes, params) <= max_bytes]
    return shapes or fallback[-1:]


def _job_compile(state: dict, job: dict, blobs: list[bytes]) -> tuple[dict, list[bytes]]:
    """Candidate child (no interpreter): AOT-compile the patched kernels for the spec's arch."""
    from kernels.compile import CompileError, compile_units
    from kernels.dtypes import DTYPE_BYTES
    from kregress.core.spec import HardwareLimits

    family = state["family"]
    config, params, dtype = job["config"], job["params"], job["dtype"]
    try:
        shapes = _capture_shapes(family, job["shapes"], job["fallback_shapes"], DTYPE_BYTES[dtype], params)
        try:
            caps = capture_launches(family, config, dtype, params, shapes, job["arch"])
        except Exception as exc:  # noqa: BLE001 - fall back to the defaults, and say so
            caps = []
            note = f"the launch could not be captured ({type(exc).__name__}: {str(exc)[:160]})"
        else:
            note = ""
        units, notes = derive_units(family, config, dtype, params, caps)
        stats = compile_units(units, job["arch"], HardwareLimits(**job["limits"]))
    except CompileError as exc:
        return {"error": exc.error, "detail": exc.detail}, []
    except ValueError as exc:
        return {"error": "compile_failed", "detail": str(exc)[:400]}, []
    return {"stats": stats.model_dump(), "notes": ([note] if note else []) + notes}, []
