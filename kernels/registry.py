"""Kernel families register here, like tritonbench operators.

A family is data plus functions: a search space (values per tunable and validity rules), input
generation, the Triton launch, a float64 reference, FLOP and byte formulas, and what the AOT compile
needs. The asset graph, the benchmark resource and the agents are generated from this registry and
never special-case a family.
"""

from __future__ import annotations

import hashlib
import inspect
import itertools
from dataclasses import dataclass, field
from typing import Any, Callable

import torch


@dataclass(frozen=True)
class Rule:
    """A validity rule: ``predicate(config, params) -> bool``; ``text`` is what a user or agent reads."""

    name: str
    text: str
    predicate: Callable[[dict[str, int], dict[str, Any]], bool]


@dataclass(frozen=True)
class Space:
    """Search space as data: allowed values per tunable, plus rules checked before any compile."""

    params: dict[str, tuple[int, ...]]
    rules: tuple[Rule, ...] = ()

    def check(self, config: dict[str, Any], params: dict[str, Any] | None = None) -> str | None:
        """None when the config is inside the space, else one sentence saying what is wrong."""
        if not isinstance(config, dict):
            return f"config must be a mapping of {', '.join(self.params)}"
        missing = [k for k in self.params if k not in config]
        extra = [k for k in config if k not in self.params]
        if missing or extra:
            parts = []
            if missing:
                parts.append(f"missing {', '.join(missing)}")
            if extra:
                parts.append(f"unknown {', '.join(extra)}")
            return f"{'; '.join(parts)} (tunables: {', '.join(self.params)})"
        for k, allowed in self.params.items():
            v = config[k]
            if isinstance(v, bool) or not isinstance(v, int) or v not in allowed:
                return f"{k}={v!r} is not allowed; allowed: {', '.join(map(str, allowed))}"
        for rule in self.rules:
            if not rule.predicate(config, params or {}):
                return f"violates rule {rule.name}: {rule.text}"
        return None

    def enumerate(self, params: dict[str, Any] | None = None):
        keys = list(self.params)
        for values in itertools.product(*(self.params[k] for k in keys)):
            cfg = dict(zip(keys, values))
            if self.check(cfg, params) is None:
                yield cfg

    def describe(self) -> str:
        vals = "; ".join(f"{k} in {{{', '.join(map(str, v))}}}" for k, v in self.params.items())
        rules = "; ".join(r.text for r in self.rules)
        return vals + (f"; rules: {rules}" if rules else "")


@dataclass(frozen=True)
class CompileUnit:
    """One Triton kernel to compile ahead of time: the jit function, its signature and constexprs."""

    fn: Any  # triton JITFunction
    signature: dict[str, str]
    constexprs: dict[str, Any]
    num_warps: int
    num_stages: int
    # Arguments the GPU JIT would specialize as divisible by 16 (aligned pointers, strides and sizes
    # that are multiples of 16 on the timed shapes). Without this hint an AOT compile takes the
    # unaligned path: no cp.async/TMA pipelining, so shared memory and registers would be wrong.
    divisible: tuple[str, ...] = ()


@dataclass
class Family:
    """Base class; a family module subclasses it and calls ``register``."""

    name: str
    space: Space
    shape_keys: tuple[str, ...]
    headline_metric: str  # "tflops" or "gbps"
    module: Any = field(repr=False, default=None)

    dtypes = ("fp16", "bf16")  # input dtypes the family's kernels take
    # True for families that serve recorded runs (replay): nothing to compile or check, the runs
    # come from ``replay(config, shape, params) -> (measurements, error, detail)``.
    recorded = False

    # --- shapes and knobs -------------------------------------------------------------------
    def check_shape(self, shape: dict[str, Any]) -> str | None:
        if not isinstance(shape, dict):
            return f"a shape is a mapping with keys {', '.join(self.shape_keys)}"
        missing = [k for k in self.shape_keys if k not in shape]
        extra = [k for k in shape if k not in self.shape_keys]
        if missing or extra:
            return f"shape keys must be exactly {', '.join(self.shape_keys)} (missing: {missing or '-'}, unknown: {extra or '-'})"
        for k in self.shape_keys:
            v = shape[k]
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                return f"{k}={v!r} must be a positive integer"
        return None

    def check_params(self, params: dict[str, Any]) -> str | None:
        return None if not params else f"family {self.name} takes no params (got {', '.join(params)})"

    def shape_label(self, shape: dict[str, Any]) -> str:
        return "x".join(str(shape[k]) for k in self.shape_keys)

    # --- what subclasses implement ---------------------------------------------------------
    def make_inputs(self, shape: dict, dtype: torch.dtype, device: str, seed: int, params: dict) -> dict:
        raise NotImplementedError

    def run(self, inputs: dict, config: dict[str, int], params: dict, interpret: bool = False) -> torch.Tensor:
        """Launch the variant. ``interpret`` is informational: the interpreter is chosen per process
        (TRITON_INTERPRET=1 before the kernels are imported), never per call."""
        raise NotImplementedError

    def reference(self, inputs: dict, params: dict) -> torch.Tensor:
        raise NotImplementedError

    def flops(self, shape: dict, params: dict) -> float:
        raise NotImplementedError

    def bytes_moved(self, shape: dict, dtype_bytes: int, params: dict) -> float:
        raise NotImplementedError

    def compile_units(self, config: dict[str, int], dtype: str, params: dict) -> list[CompileUnit]:
        raise NotImplementedError

    def model_latency_ms(self, shape: dict, config: dict, stats: Any, hw: Any, dtype_bytes: int, params: dict) -> float:
        """Analytic latency estimate from real compile stats (evidence=model)."""
        raise NotImplementedError

    def tolerance(self, shape: dict, dtype: str, base_tol: float, params: dict) -> tuple[float, float]:
        """(atol, rtol) against the float64 reference; grows with the reduction length."""
        return base_tol, base_tol

    def profile_fields(self, shape: dict, config: dict, measurement: Any, hw: Any, params: dict) -> dict[str, Any]:
        """Family-specific fields for the trimmed profile the agent sees."""
        return {}

    def use_cudagraph(self) -> bool:
        return False

    # --- identity ----------------------------------------------------------------------------
    def source_hash(self) -> str:
        """Hash of the family's kernel source: part of every compile cache key and code_version."""
        src = inspect.getsource(self.module) if self.module is not None else self.name
        return hashlib.sha256(src.encode()).hexdigest()[:16]


# --- checks shared by the families' check_params ---------------------------------------------


def check_param_keys(params: dict, allowed: tuple[str, ...]) -> str | None:
    unknown = [k for k in params if k not in allowed]
    return f"unknown param(s) {', '.join(unknown)}; allowed: {', '.join(allowed)}" if unknown else None


def check_seqlens_param(v: Any, patterns: tuple[str, ...]) -> str | None:
    """``seqlens``: a named pattern, or a list of lengths cycled over the batch (0 allowed)."""
    if isinstance(v, list):
        if not v or len(v) > 4096:
            return "seqlens as a list needs 1..4096 entries (cycled over the batch)"
        bad = [x for x in v if isinstance(x, bool) or not isinstance(x, int) or x < 0]
        if bad:
            return f"seqlens entries must be integers >= 0; bad: {bad[:5]}"
        return None
    if v not in patterns:
        return f"seqlens={v!r} is not allowed; allowed: {', '.join(patterns)} or a list of lengths"
    return None


def check_positive_number(name: str, v: Any, hint: str = "") -> str | None:
    import math

    if isinstance(v, bool) or not isinstance(v, (int, float)) or not (v > 0 and math.isfinite(v)):
        return f"{name}={v!r} must be a positive number{hint}"
    return None


FAMILIES: dict[str, Family] = {}


def register(family: Family) -> Family:
    FAMILIES[family.name] = family
    return family


def get_family(name: str) -> Family:
    _load_builtin()
    try:
        return FAMILIES[name]
    except KeyError:
        raise KeyError(f"unknown kernel family {name!r}; allowed: {', '.join(sorted(FAMILIES))}") from None


# Modules that register a family when imported. A new family adds its module here.
_BUILTIN = ("kernels.gemm", "kernels.mla_decode", "kernels.attention", "kernels.replay_family")


def _load_builtin() -> None:
    import importlib

    for mod in _BUILTIN:
        importlib.import_module(mod)


def families() -> dict[str, Family]:
    _load_builtin()
    return FAMILIES
