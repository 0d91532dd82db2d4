"""The public API for family authors: Family, Space, Rule, CompileUnit, and the family registry.

A family is data plus functions: a search space (values per tunable and validity rules that receive
the spec's hardware limits), input generation, the launch, a float64 reference, FLOP and byte
formulas, and what the AOT compile needs. The asset graph, the benchmark resources and the agents
are generated from the registry and never special-case a family.

No Dagster and no Triton import here: a family module imports Triton itself; this module only
reads the family's source files (AST) to hash what is compiled.

Families come from three places, all looked up by ``get_family(name)``:

* built-ins (``BUILTIN``: name -> ``module:attribute``), shipped with kregress;
* installed plugins: entry points in the group ``kregress.families`` (``name = "pkg.mod:FAMILY"``);
* an import path ``package.module:attribute`` written as the spec's ``kernel_family``.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar

if TYPE_CHECKING:  # type hints only: kregress.core never imports torch or Triton at run time
    import torch

    from kregress.core.spec import HardwareLimits

ENTRY_POINT_GROUP = "kregress.families"

@dataclass(frozen=True)
class Rule:
    """A validity rule: ``predicate(config, params, limits) -> bool``; ``text`` is what a user or agent reads.

    ``limits`` is the spec's ``hardware.limits`` (``HardwareLimits``: shared memory per block,
    registers, ...), so an sm_80 spec is filtered with its own limits, not an H100's."""

    name: str
    text: str
    predicate: Callable[[dict[str, int], dict[str, Any], "HardwareLimits"], bool]


@dataclass(frozen=True)
class Space:
    """Search space as data: allowed values per tunable, plus rules checked before any compile."""

    params: dict[str, tuple[int, ...]]
    rules: tuple[Rule, ...] = ()

    def check(self, config: dict[str, Any], params: dict[str, Any] | None = None,
              limits: "HardwareLimits | None" = None) -> str | None:
        """None when the config is inside the space, else one sentence saying what is wrong.

        ``limits`` defaults to an H100's (``HardwareLimits()``); pass the spec's ``hardware.limits``."""
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
        lim = limits if limits is not None else _default_limits()
        for rule in self.rules:
            if not rule.predicate(config, params or {}, lim):
                return f"violates rule {rule.name}: {rule.text}"
        return None

    def enumerate(self, params: dict[str, Any] | None = None, limits: "HardwareLimits | None" = None):
        """Every config inside the space (Cartesian product filtered by the rules), in product order."""
        keys = list(self.params)
        for values in itertools.product(*(self.params[k] for k in keys)):
            cfg = dict(zip(keys, values))
            if self.check(cfg, params, limits) is None:
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
    """Base class; a built-in family module subclasses it and calls ``register``; a plugin exposes an
    instance through its entry point (or an import path) and need not register."""

    name: str
    space: Space
    shape_keys: tuple[str, ...]
    headline_metric: str  # "tflops" or "gbps"
    module: Any = field(repr=False, default=None)
    # How get_family found it (its name, or the spec's package.module:attribute): what a child
    # process passes to get_family to load the same family.
    lookup: str = field(repr=False, default="")

    dtypes = ("fp16", "bf16")  # input dtypes the family's kernels take
    # True for families that serve recorded runs (replay): nothing to compile or check, the runs
    # come from ``replay(config, shape, params) -> (measurements, error, detail)``.
    recorded = False

    # --- shapes and knobs -------------------------------------------------------------------
    def check_shape(self, shape: dict[str, Any]) -> str | None:
        """None when ``shape`` suits the family, else one sentence: the keys must be exactly
        ``shape_keys`` with positive integer values, then ``check_shape_values`` decides."""
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
        return self.check_shape_values(shape)

    def check_shape_values(self, shape: dict[str, int]) -> str | None:
        """The family's own shape checks, called by ``check_shape`` once the keys are exactly
        ``shape_keys`` and every value is a positive integer. Default: every such shape is accepted."""
        return None

    # The spec ``params`` keys the family takes. None (the default): it takes none. A family that sets
    # it gets the key check from ``check_params`` and checks the values in ``check_param_values``.
    param_keys: ClassVar[tuple[str, ...] | None] = None

    def check_params(self, params: dict[str, Any]) -> str | None:
        """None when ``params`` suit the family, else one sentence. With ``param_keys`` unset any
        param is an error; with it set, unknown keys are, then ``check_param_values`` decides.
        A family with other needs overrides this method."""
        if self.param_keys is None:
            return None if not params else f"family {self.name} takes no params (got {', '.join(params)})"
        params = params or {}
        return check_param_keys(params, self.param_keys) or self.check_param_values(params)

    def check_param_values(self, params: dict[str, Any]) -> str | None:
        """The values' checks, called by ``check_params`` once every key is one of ``param_keys``
        (``params`` is a dict, possibly empty). Default: every value is accepted."""
        return None

    def for_params(self, params: dict[str, Any]) -> "Family":
        """The family as a spec's ``params`` configure it (call after ``check_params`` passes). Most
        families return themselves; one whose space, shapes or identity come from its params (replay:
        the recorded file ``cache_file`` names) returns a family bound to them. Callers use
        ``get_family(spec.kernel_family).for_params(spec.params)`` for space, check_shape, source_hash."""
        return self

    def space_for(self, params: dict[str, Any]) -> Space:
        """``for_params(params).space``: the search space under these params."""
        return self.for_params(params).space

    def resolve_params(self, params: dict[str, Any], spec_dir: Path) -> dict[str, Any]:
        """``params`` with paths relative to the spec's folder made absolute; ``load_spec`` calls it
        before validation. Default: unchanged."""
        return params

    def shape_label(self, shape: dict[str, Any]) -> str:
        return "x".join(str(shape[k]) for k in self.shape_keys)

    # --- what subclasses implement ---------------------------------------------------------
    def make_inputs(self, shape: dict, dtype: torch.dtype, device: str, seed: int, params: dict) -> dict:
        raise NotImplementedError

    def run(self, inputs: dict, config: dict[str, int], params: dict) -> torch.Tensor:
        """Launch the variant. The interpreter is chosen per process (TRITON_INTERPRET=1 before the
        kernels are imported), never per call."""
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
    # True for a family that wraps a compiled extension or a torch op instead of Triton jit functions:
    # no AOT compile (no compile units), timed by the cuda backend like any other family, checked
    # against its reference; on a CPU host it needs the cuda backend or a recorded file.
    external = False

    # The launch wrapper(s): module-level functions of the family's module that check shapes, allocate
    # and launch its jit kernels (the entry point ``run`` calls). With the jit functions (in the module
    # and in ``helper_files``) they are the family's editable region: the only code a candidate patch
    # may change. Everything else (reference, make_inputs, tolerance, space, rules) is fixed.
    launch_wrappers: ClassVar[tuple[str, ...]] = ()

    # Config keys that reach the kernels only as launch options (num_warps, num_stages): Triton's CPU
    # interpreter drops those, so two config-only variants that differ in nothing else compute the same
    # output there and one interpreter check serves both. Empty (the default) when the launch wrappers
    # read them for anything else.
    interpreter_ignores: ClassVar[tuple[str, ...]] = ()

    # Files besides the family's module that hold what is compiled, e.g. a module of @triton.jit
    # helpers the kernels call: ``source_files()`` lists them after the module.
    helper_files: ClassVar[tuple[Path, ...]] = ()

    def source_files(self) -> list[Path]:
        """Files whose content is the kernel: the family's module and its ``helper_files`` by default;
        a plugin or an external kernel adds its own (.py helpers, .cu sources, a shipped .cubin or .so).
        The compile cache key, the assets' code_version, the spec sensor and ``kregress review``
        follow these files."""
        f = getattr(self.module, "__file__", None)
        return ([Path(f).resolve()] if f else []) + [Path(h).resolve() for h in self.helper_files]

    def source_hash(self) -> str:
        """Hash of what is compiled, read from disk (so a long-lived process sees an edit): in each
        Python source file, the Triton jit functions (``@triton.jit``/``@jit``), the ``compile_units``
        methods that choose signatures, constexprs and hints, and the module-level UPPER_CASE
        constants the kernels read; other files (.cu, .cubin, .so) whole. A Python file with no jit
        function (an external kernel's wrapper) counts whole. Comments, the module docstring, the
        latency model and the reference change nothing, so editing them recompiles nothing."""
        h = hashlib.sha256(self.name.encode())
        for f in self.source_files():
            h.update(str(f.name).encode())
            try:
                data = f.read_bytes()
            except OSError:
                h.update(b"missing")
                continue
            h.update(compiled_parts(data.decode("utf-8", "replace")).encode() if f.suffix == ".py" else data)
        return h.hexdigest()[:16]


def _is_jit_decorator(node: ast.expr) -> bool:
    target = node.func if isinstance(node, ast.Call) else node
    text = ast.unparse(target)
    return text == "jit" or text.endswith(".jit")


def compiled_parts(source: str) -> str:
    """The part of a Python kernel module that decides what is compiled (see ``Family.source_hash``)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return source  # an unparsable file: every byte counts
    parts: list[str] = []
    has_jit = False
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            jit = any(_is_jit_decorator(d) for d in node.decorator_list)
            has_jit |= jit
            if jit or node.name == "compile_units":
                parts.append(ast.unparse(node))
    if not has_jit:
        return ast.unparse(tree)  # no jit function: a wrapper around an external kernel counts whole
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if targets and all(isinstance(t, ast.Name) and t.id.isupper() for t in targets):
                parts.append(ast.unparse(node))
    return "\n".join(parts)


def _default_limits() -> "HardwareLimits":
    from kregress.core.spec import HardwareLimits

    return HardwareLimits()


# --- checks shared by the families' check_params ---------------------------------------------


def check_param_keys(params: dict, allowed: tuple[str, ...]) -> str | None:
    unknown = [k for k in params if k not in allowed]
    return f"unknown param(s) {', '.join(unknown)}; allowed: {', '.join(allowed)}" if unknown else None


def check_bool_param(params: dict, name: str) -> str | None:
    """``params[name]``, when present, must be a YAML boolean."""
    if name in params and not isinstance(params[name], bool):
        return f"{name}={params[name]!r} must be true or false"
    return None


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
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not (v > 0 and math.isfinite(v)):
        return f"{name}={v!r} must be a positive number{hint}"
    return None


# --- the registry ------------------------------------------------------------------------------

# Built-in families: name -> "module:attribute". Plugins use the entry-point group instead.
BUILTIN: dict[str, str] = {
    "gemm": "kernels.gemm:FAMILY",
    "mla_decode": "kernels.mla_decode:FAMILY",
    "attention": "kernels.attention:FAMILY",
    "replay": "kernels.replay_family:FAMILY",
    "torch_sdpa": "kernels.torch_sdpa:FAMILY",
    "gemm_fp8": "kernels.gemm_fp8:FAMILY",
    "grouped_gemm_fp8": "kernels.gemm_fp8:GROUPED_FAMILY",
}

FAMILIES: dict[str, Family] = {}


class UnknownFamily(KeyError):
    """A ``kernel_family`` that is neither built in, nor installed, nor an import path."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def register(family: Family) -> Family:
    """Add a family under its name (built-in modules call this at import; plugins need not)."""
    family.lookup = family.lookup or family.name
    FAMILIES[family.name] = family
    return family


def _entry_points() -> dict[str, Any]:
    from importlib.metadata import entry_points

    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def _load_target(target: str, what: str) -> Family:
    mod_name, _, attr = target.partition(":")
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as exc:
        raise UnknownFamily(f"{what}: cannot import module {mod_name!r}: {exc}") from None
    obj = mod
    for part in attr.split(".") if attr else []:
        obj = getattr(obj, part, None)
        if obj is None:
            raise UnknownFamily(f"{what}: module {mod_name!r} has no attribute {attr!r}") from None
    if isinstance(obj, type) and issubclass(obj, Family):
        raise UnknownFamily(f"{what}: {target} is a Family class; point at an instance (e.g. FAMILY = {obj.__name__}(...))")
    if not isinstance(obj, Family):
        raise UnknownFamily(f"{what}: {target} is a {type(obj).__name__}, not a kregress Family instance")
    if obj.module is None:
        obj.module = mod
    return obj


def get_family(name: str) -> Family:
    """The family named ``name``: built-in, installed plugin (entry point), or ``package.module:attr``."""
    if name in FAMILIES:
        return FAMILIES[name]
    if name in BUILTIN:
        fam = _load_target(BUILTIN[name], f"built-in family {name!r}")
    elif ":" in name:
        fam = _load_target(name, f"kernel_family {name!r}")
    else:
        eps = _entry_points()
        if name not in eps:
            raise UnknownFamily(
                f"unknown kernel family {name!r}; built in: {', '.join(sorted(BUILTIN))}; "
                f"installed plugins: {', '.join(sorted(eps)) or 'none'}. A plugin registers itself under the "
                f"entry-point group {ENTRY_POINT_GROUP!r} (pip install -e DIR; `kregress family new NAME --dir DIR` "
                "scaffolds one), or name an import path package.module:attribute"
            )
        fam = _load_target(eps[name].value, f"plugin family {name!r} (entry point {eps[name].value})")
    fam.lookup = fam.lookup or name
    FAMILIES[name] = fam
    return fam


def families() -> dict[str, Family]:
    """Every built-in and installed family (import-path families appear once they are used)."""
    for name in list(BUILTIN) + sorted(_entry_points()):
        try:
            get_family(name)
        except UnknownFamily:
            if name in BUILTIN:
                raise
    return dict(FAMILIES)
