"""The public API for family authors: Family, Space, Rule, CompileUnit, and the family registry.

A family is data plus functions: a search space (values per tunable and validity rules that receive
the spec's hardware limits), input generation, the launch, a float64 reference, FLOP and byte
formulas, and what the AOT compile needs. The asset graph, the benchmark resources and the agents
are generated from the registry and never special-case a family.

No Dagster and no Triton import here: a family module imports Triton itself; this module only
reads the family's source files (AST) to hash what is compiled.

A family is one of four kinds (``TritonFamily``, ``ExternalFamily``, ``CudaFamily``, ``RecordedFamily``), each an
abstract base whose ``@abstractmethod``s are what its author must write.

Families are looked up by ``get_family(name)``:

* installed families: entry points in the group ``kregress.families`` (``name = "pkg.mod:FAMILY"``),
  the built-ins (declared in kregress's own pyproject.toml) and plugins alike;
* an import path ``package.module:attribute`` written as the spec's ``kernel_family``.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import itertools
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar

from kregress.core.source_tree import parse_source

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
    # ``detail(config, params, limits)``: the figures of a config that breaks the rule (e.g. "56064 B > 49152 B"),
    # appended to the rule's text where a config is refused. None: the text says it all.
    detail: Callable[[dict[str, int], dict[str, Any], "HardwareLimits"], str] | None = None


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
                detail = f" ({rule.detail(config, params or {}, lim)})" if rule.detail else ""
                return f"violates rule {rule.name}: {rule.text}{detail}"
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
class Family(ABC):
    """What every family has, whatever its kind: a name, a search space, shape keys and checks, the
    params it takes, and its headline metric. On its own it describes a search space (what an agent
    policy needs); a family that runs is one of the kinds below.

    A family is one of three kinds, each an abstract base below; backends and the conformance kit
    dispatch on the kind (``isinstance``), never on flags:

    * ``TritonFamily``: Triton jit kernels compiled ahead of time, checked in the interpreter on a CPU
      host, timed on a GPU;
    * ``ExternalFamily``: a compiled extension or a torch op (no AOT compile), timed on a GPU;
    * ``RecordedFamily``: a recorded search space that answers with its recorded runs (no kernel).

    A built-in family module instantiates its class and calls ``register``; a plugin exposes an
    instance through its entry point (or an import path) and need not register."""

    name: str
    space: Space
    shape_keys: tuple[str, ...]
    headline_metric: str  # "tflops" or "gbps": what the report and the agent's prompt lead with
    module: Any = field(repr=False, default=None)
    # How get_family found it (its name, or the spec's package.module:attribute): what a child
    # process passes to get_family to load the same family.
    lookup: str = field(repr=False, default="")

    kind: ClassVar[str] = ""  # "triton", "external" or "recorded": set by the kind bases
    dtypes = ("fp16", "bf16")  # input dtypes the family's kernels take

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
        families return themselves; one whose space, shapes or identity come from its params (a
        recorded family: the file ``cache_file`` names) returns a family bound to them.
        ``kregress.core.bind.bind`` calls it once per run; code downstream uses the bound family."""
        return self

    def resolve_params(self, params: dict[str, Any], spec_dir: Path) -> dict[str, Any]:
        """``params`` with paths relative to the spec's folder made absolute; ``bind`` calls it
        before the family checks. Default: unchanged."""
        return params

    def shape_label(self, shape: dict[str, Any]) -> str:
        return "x".join(str(shape[k]) for k in self.shape_keys)

    def peak_tflops(self, hw: Any, params: dict) -> float:
        """The compute roof on ``hw`` (the spec's ``hardware``), TFLOP/s: the dense bf16/fp16 tensor-core
        peak by default; a family of another precision (FP8) returns its own."""
        return float(hw.limits.peak_tflops)

    def peak(self, hw: Any, params: dict) -> float:
        """The headline metric's peak on ``hw``: TFLOP/s (``peak_tflops``) or HBM GB/s."""
        return float(hw.limits.hbm_gbps) if self.headline_metric == "gbps" else self.peak_tflops(hw, params)

    def headline(self, tflops: float, gbps: float) -> tuple[str, float, str]:
        """(name, value, unit) of the headline metric for a measurement: ``("gbps", 1234.5, "GB/s")``
        for a memory-bound family, ``("tflops", 612.0, "TFLOP/s")`` otherwise."""
        if self.headline_metric == "gbps":
            return "gbps", gbps, "GB/s"
        return "tflops", tflops, "TFLOP/s"

    def toolchain_problem(self) -> str | None:
        """None when this host has what the family's kind needs to compile (a CUDA family: nvcc), else the
        one line that says how to get it; a spec on the family is refused with it (``bind``)."""
        return None

    # --- identity ----------------------------------------------------------------------------
    def source_files(self) -> list[Path]:
        """Files whose content is the kernel: the family's module by default. The compile cache
        key, the assets' code_version, the spec sensor and ``kregress review`` follow these files."""
        f = getattr(self.module, "__file__", None)
        return [Path(f).resolve()] if f else []

    def editable_region(self) -> dict[Path, tuple[str, ...]]:
        """The files a candidate patch may edit (absolute paths), each with the names of the functions in it a
        patch may change besides what the kind adds on its own (a Triton file's ``@triton.jit`` functions).
        Each kind says what its kernel is; a family with nothing a patch could edit (a recorded one) returns {}."""
        return {}

    def source_hash(self, texts: dict[Path, str] | None = None) -> str:
        """Hash of what runs, read from disk (so a long-lived process sees an edit): every byte of
        ``source_files()``. ``TritonFamily`` narrows it to what is compiled. ``texts``: the content of some of
        the files (by resolved path) instead of what is on disk (the hash of a patched copy)."""
        h = hashlib.sha256(self.name.encode())
        over = {Path(p).resolve(): t for p, t in (texts or {}).items()}
        for f in self.source_files():
            h.update(str(f.name).encode())
            try:
                h.update(over[f].encode("utf-8") if f in over else f.read_bytes())
            except OSError:
                h.update(b"missing")
        return h.hexdigest()[:16]


@dataclass
class KernelFamily(Family):
    """A family that runs a kernel: inputs, the launch, a float64 reference, a tolerance."""

    @abstractmethod
    def flops(self, shape: dict, params: dict) -> float:
        """Floating-point operations of one launch on ``shape`` (the TFLOP/s figure's numerator)."""

    @abstractmethod
    def bytes_moved(self, shape: dict, dtype_bytes: int, params: dict) -> float:
        """Compulsory bytes read and written by one launch (the GB/s figure's numerator)."""

    def speed_of_light_ms(self, shape: dict, dtype_bytes: int, hw: Any, params: dict) -> float:
        """The fastest one launch on ``shape`` can possibly be on ``hw``: its FLOPs at the compute roof or
        its compulsory bytes at HBM bandwidth, whichever takes longer. A measurement below it is not
        physics: the gate calls such a variant implausible."""
        t_compute = self.flops(shape, params) / (self.peak_tflops(hw, params) * 1e12)
        t_memory = self.bytes_moved(shape, dtype_bytes, params) / (float(hw.limits.hbm_gbps) * 1e9)
        return max(t_compute, t_memory) * 1e3

    @abstractmethod
    def make_inputs(self, shape: dict, dtype: "torch.dtype", device: str, seed: int, params: dict) -> dict:
        """The inputs of one launch on ``shape``, deterministic given ``seed``."""

    @abstractmethod
    def run(self, inputs: dict, config: dict[str, int], params: dict) -> "torch.Tensor":
        """Launch the variant ``config`` on ``inputs``; returns the output(s). The interpreter is chosen
        per process (TRITON_INTERPRET=1 before the kernels are imported), never per call."""

    @abstractmethod
    def reference(self, inputs: dict, params: dict) -> "torch.Tensor":
        """The float64 reference output(s) for ``inputs``."""

    def tolerance(self, shape: dict, dtype: str, base_tol: float, params: dict) -> tuple[float, float]:
        """(atol, rtol) against the float64 reference; grows with the reduction length."""
        return base_tol, base_tol

    # --- the roles of the inputs (what the patch gate checks; see kernels/gate_cases.py) ------------
    # Shape keys the gate's generic hidden shapes (odd, aligned, wide) never change on their own: the
    # dimensions indexing depends on (GQA heads); ``structure_cases`` varies them on purpose.
    structure_keys: ClassVar[tuple[str, ...]] = ()
    # Shape keys of the reduction (GEMM K, the keys of attention): the least-work ("wide") shape keeps
    # their timed value, so a cheat that skips work past a length runs there too.
    reduction_keys: ClassVar[tuple[str, ...]] = ()

    def output_buffers(self, params: dict) -> dict[str, int]:
        """Inputs that are output buffers the caller provides (DeepGEMM's ``out``, partials, lse), each
        mapped to the index of the result it must hold after the call. The gate poisons each one (NaN,
        then random finite values) before every call and compares it as an output; ``reference`` starts
        from the buffer as handed in, so what a correct kernel leaves untouched (padding, rows past
        ``masked_m``) must come back bit for bit. Every other input is read-only: bit-identical after
        the call. Default: none."""
        return {}

    def structure_inputs(self, params: dict) -> tuple[str, ...]:
        """Read-only inputs that indexing depends on (group sizes, ``masked_m``, page tables, sequence
        offsets); the gate reports their changes by name. Default: none."""
        return ()

    def structure_cases(self, shapes: list[dict], params: dict, rng: Any,
                        timed: list[dict] = ()) -> list[tuple[str, dict, dict]]:
        """Hidden cases that vary what indexing depends on, drawn from ``rng`` (fresh per judgement):
        (kind, shape, params overrides) each, e.g. ragged group sizes, ``masked_m`` from 0 to full,
        another GQA ratio, a long sequence with few heads. ``shapes`` are the spec's correctness shapes,
        ``timed`` its timed shapes (a long case goes past them). Default: none."""
        return []

    def use_cudagraph(self) -> bool:
        """True for families with short launches: the cuda backend times them with do_bench_cudagraph."""
        return False


@dataclass
class TritonFamily(KernelFamily):
    """Triton jit kernels: compiled ahead of time for the spec's arch (registers, spills, shared
    memory are real on any host), checked in the interpreter on a CPU host, timed on a GPU."""

    kind: ClassVar[str] = "triton"

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

    @abstractmethod
    def compile_units(self, config: dict[str, int], dtype: str, params: dict) -> list[CompileUnit]:
        """The jit kernels of one variant with their signatures and constexprs, for the AOT compile."""

    @abstractmethod
    def model_latency_ms(self, shape: dict, config: dict, stats: Any, hw: Any, dtype_bytes: int, params: dict) -> float:
        """Analytic latency estimate from the variant's real compile stats (evidence=model): what a
        sweep on a CPU host reports, labelled as an estimate."""

    def source_files(self) -> list[Path]:
        """The family's module, then its ``helper_files``."""
        return super().source_files() + [Path(h).resolve() for h in self.helper_files]

    def editable_region(self) -> dict[Path, tuple[str, ...]]:
        """The Python source files: the module with its ``launch_wrappers``, the helpers with their jit functions."""
        module = Path(getattr(self.module, "__file__", "") or "").resolve()
        return {f: (tuple(self.launch_wrappers) if f == module else ()) for f in self.source_files() if f.suffix == ".py"}

    def source_hash(self, texts: dict[Path, str] | None = None) -> str:
        """Hash of what is compiled, read from disk: in each Python source file, the Triton jit
        functions (``@triton.jit``/``@jit``), the ``compile_units`` methods that choose signatures,
        constexprs and hints, and the module-level UPPER_CASE constants the kernels read; other files
        (.cu, .cubin, .so) whole. Comments, the module docstring, the latency model and the reference
        change nothing, so editing them recompiles nothing. ``texts``: the content of some of the files
        (by resolved path) instead of what is on disk: the kernel hash of a patched copy (the patch gate's
        ``base_hash`` and ``patched_hash`` are this hash)."""
        h = hashlib.sha256(self.name.encode())
        over = {Path(p).resolve(): t for p, t in (texts or {}).items()}
        for f in self.source_files():
            h.update(str(f.name).encode())
            try:
                data = over[f].encode("utf-8") if f in over else f.read_bytes()
            except OSError:
                h.update(b"missing")
                continue
            h.update(compiled_parts(data.decode("utf-8", "replace")).encode() if f.suffix == ".py" else data)
        return h.hexdigest()[:16]


@dataclass
class ExternalFamily(KernelFamily):
    """A compiled extension or a torch op: no AOT compile (no compile stats), timed by the cuda backend
    like a Triton variant and checked against its reference; on a CPU host a sweep needs the cuda
    backend or a recorded file. ``source_files()`` lists what runs (.py wrapper, .cu, .so, .cubin)."""

    kind: ClassVar[str] = "external"

    # The module-level functions of the family's module that wrap the external kernel (check shapes, pick
    # the op, call it): the only code a candidate patch may change. Empty (the default): a patch may change
    # comments and blank lines only, since the kernel itself is compiled elsewhere.
    launch_wrappers: ClassVar[tuple[str, ...]] = ()

    def editable_region(self) -> dict[Path, tuple[str, ...]]:
        """The Python files among ``source_files()``, the module with its ``launch_wrappers``."""
        module = Path(getattr(self.module, "__file__", "") or "").resolve()
        return {f: (tuple(self.launch_wrappers) if f == module else ()) for f in self.source_files() if f.suffix == ".py"}


@dataclass(frozen=True)
class CudaUnit:
    """One CUDA kernel of a variant, as nvcc compiles it: the ``__global__`` function ``kernel`` of the
    ``.cu`` file ``source`` (one of the family's ``cuda_sources``), instantiated with ``template_args`` (in
    the template's parameter order) and compiled with ``defines`` (``-DNAME=value``); ``threads`` per block
    and the ``dynamic_smem_bytes`` its launch requests (added to ptxas's static shared memory)."""

    kernel: str
    source: str
    template_args: tuple[int, ...] = ()
    defines: tuple[tuple[str, int], ...] = ()
    threads: int = 128
    dynamic_smem_bytes: int = 0
    source_dir: str = ""  # "": the family's own folder; a patch judgement points it at the patched copy


# A config key that only the patch judge sets (never a tunable): the folder of a patched copy of the .cu files.
CUDA_SOURCE_KEY = "_cuda_source_dir"

# ptxas refuses more static shared memory (``__shared__`` arrays) per kernel than this on every arch kregress
# targets ("uses too much shared data (..., 0xc000 max)"); more needs dynamic shared memory and an opt-in.
CUDA_STATIC_SMEM_LIMIT = 48 * 1024


@dataclass
class CudaFamily(KernelFamily):
    """CUDA C++ kernels in ``.cu`` files, compiled by nvcc for the spec's arch (``nvcc -cubin``): registers,
    spills, shared memory and barriers from ptxas are real on any host with nvcc. On a GPU the same cubin is
    loaded and launched by the family's Python host wrapper (``kernels.cuda.launch``) and checked and timed
    like every family; on a CPU host a variant has compile facts only (never PASS).

    A tunable reaches the kernel as a template argument (``template_params``, in the template's order) or
    as a ``-D`` macro (``define_params``); ``launch_params`` are tunables only the host wrapper reads (a
    split count, a grid order). Every tunable of the space is exactly one of these."""

    kind: ClassVar[str] = "cuda"

    # The .cu files of the family, relative to the folder of its module; a patch may edit the
    # ``kernel_functions`` in them (their __global__ and __device__ functions by name) and nothing else.
    cuda_sources: ClassVar[tuple[str, ...]] = ()
    kernel_functions: ClassVar[tuple[str, ...]] = ()
    template_params: ClassVar[tuple[str, ...]] = ()
    define_params: ClassVar[tuple[str, ...]] = ()
    launch_params: ClassVar[tuple[str, ...]] = ()
    nvcc_flags: ClassVar[tuple[str, ...]] = ("-O3", "-std=c++17")

    @abstractmethod
    def cuda_units(self, config: dict[str, int], dtype: str, params: dict) -> list[CudaUnit]:
        """The kernels of one variant (``self.unit(...)`` fills the template arguments and macros)."""

    def static_smem_bytes(self, config: dict[str, int]) -> int | None:
        """The static shared memory (bytes) the variant ``config`` declares, from the config alone: the size of
        its kernels' ``__shared__`` arrays, which ptxas reports as the kernel's static ``smem``. None (the
        default): the family does not declare it, and ptxas alone says what fits. A family that overrides it
        gets the space rule ``static_smem`` (``__post_init__``): a config over ``CUDA_STATIC_SMEM_LIMIT`` is
        refused wherever configs are checked (the search never proposes it, a sweep never compiles it, the
        judge refuses it), with this figure in the reason; ptxas still confirms what compiles."""
        return None

    def __post_init__(self) -> None:
        if type(self).static_smem_bytes is not CudaFamily.static_smem_bytes:  # the family declares its formula
            rule = Rule("static_smem",
                        f"static shared memory (static_smem_bytes) at most {CUDA_STATIC_SMEM_LIMIT} B, ptxas's "
                        "limit: more is infeasible, never compiled",
                        lambda c, p, lim: (self.static_smem_bytes(c) or 0) <= CUDA_STATIC_SMEM_LIMIT,
                        lambda c, p, lim: f"{self.static_smem_bytes(c)} B > {CUDA_STATIC_SMEM_LIMIT} B")
            if all(r.name != rule.name for r in self.space.rules):
                self.space = Space(self.space.params, self.space.rules + (rule,))

    def unit(self, kernel: str, config: dict[str, int], *, source: str | None = None, threads: int = 128,
             dynamic_smem_bytes: int = 0, extra_defines: dict[str, int] | None = None) -> CudaUnit:
        """A ``CudaUnit`` of ``kernel`` with the config's ``template_params`` and ``define_params``."""
        defines = tuple((k, int(config[k])) for k in self.define_params) + tuple((extra_defines or {}).items())
        return CudaUnit(kernel=kernel, source=source or self.cuda_sources[0],
                        template_args=tuple(int(config[k]) for k in self.template_params), defines=defines,
                        threads=int(threads), dynamic_smem_bytes=int(dynamic_smem_bytes),
                        source_dir=str(config.get(CUDA_SOURCE_KEY, "")))

    def cu_files(self) -> list[Path]:
        """The ``cuda_sources`` as absolute paths (beside the family's module)."""
        f = getattr(self.module, "__file__", None)
        base = Path(f).resolve().parent if f else Path.cwd()
        return [(base / s).resolve() for s in self.cuda_sources]

    def source_files(self) -> list[Path]:
        """The module (the host wrapper and reference), the ``.cu`` files and the headers they include."""
        from kregress.core.cuda_source import local_headers

        cu = self.cu_files()
        return super().source_files() + cu + local_headers(cu)

    def editable_region(self) -> dict[Path, tuple[str, ...]]:
        """The ``.cu`` files, each with the ``kernel_functions`` (the host wrapper in Python is fixed)."""
        return {f: tuple(self.kernel_functions) for f in self.cu_files()}

    def toolchain_problem(self) -> str | None:
        from kregress.core.cuda_source import nvcc_problem

        return nvcc_problem()


@dataclass
class RecordedFamily(Family):
    """A recorded search space (a Kernel Tuner cache file): every evaluation answers with the runs
    recorded for that configuration; nothing is compiled or re-checked."""

    kind: ClassVar[str] = "recorded"

    @abstractmethod
    def flops(self, shape: dict, params: dict) -> float:
        """Floating-point operations of one launch on ``shape`` (the TFLOP/s figure's numerator)."""

    @abstractmethod
    def bytes_moved(self, shape: dict, dtype_bytes: int, params: dict) -> float:
        """Compulsory bytes read and written by one launch (the GB/s figure's numerator)."""

    @abstractmethod
    def replay(self, config: dict[str, int], shape: dict, params: dict) -> tuple[list, str | None, str]:
        """(measurements, error, detail) for one config: its recorded runs, or its recorded failure."""


KINDS: dict[str, type[Family]] = {"triton": TritonFamily, "external": ExternalFamily, "cuda": CudaFamily,
                                  "recorded": RecordedFamily}
KIND_BASES = tuple(KINDS.values())


def is_jit_decorator(node: ast.expr) -> bool:
    """``@triton.jit``, ``@jit``, ``@triton.jit(...)``: what makes a function a Triton kernel."""
    target = node.func if isinstance(node, ast.Call) else node
    text = ast.unparse(target)
    return text == "jit" or text.endswith(".jit")


def is_jit_def(node: ast.AST) -> bool:
    return isinstance(node, ast.FunctionDef) and any(is_jit_decorator(d) for d in node.decorator_list)


def compiled_parts(source: str) -> str:
    """The part of a Python kernel module that decides what is compiled (see ``Family.source_hash``)."""
    try:
        tree = parse_source(source)
    except SyntaxError:
        return source  # an unparsable file: every byte counts
    parts: list[str] = []
    has_jit = False
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            jit = is_jit_def(node)
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


def structure_scale_factors(rng: Any) -> tuple[float, float]:
    """Factors for the softmax_scale of gate structure cases, (0.6-0.8, 1.25-1.6): never near 1, so a kernel
    that ignores the run-time scale (hard-codes the spec's) is off by more than any tolerance; one below and
    one above, so one that honours it on one side only (clamps it) is too, where a family has two cases."""
    return rng.uniform(0.6, 0.8), rng.uniform(1.25, 1.6)


def structure_scale_factor(rng: Any) -> float:
    """One of ``structure_scale_factors``, the side drawn (a family with one scaled case)."""
    low, high = structure_scale_factors(rng)
    return low if rng.random() < 0.5 else high


def reversed_rank_pair(rng: Any, draw: Callable[[], list]) -> tuple[list, list]:
    """Two draws of per-slot values (lengths, counts) for a pair of gate structure cases: ``draw()`` shuffled,
    then a fresh ``draw()`` placed by the first's ranks reversed (its largest value where the first had its
    smallest; ties in slot order). A kernel that takes slot b's value from another slot, a fixed one (j) or a
    neighbour (b+1), alone or in max/min with its own, is then wrong for some slot in one of the two draws,
    whatever the secret draw: j is not the smallest in one of them (max with j changes some slot) and not the
    largest in one (min with j does), given distinct values in each draw."""
    first = list(draw())
    rng.shuffle(first)
    order = sorted(range(len(first)), key=lambda b: (first[b], b))
    fresh = sorted(draw(), reverse=True)
    second = [0] * len(first)
    for rank, b in enumerate(order):
        second[b] = fresh[rank]
    return first, second


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

# The distribution whose entry points are the built-in families (pyproject.toml's
# [project.entry-points."kregress.families"]): built-ins and plugins register the same way.
BUILTIN_DIST = "kregress"

FAMILIES: dict[str, Family] = {}


class UnknownFamily(KeyError):
    """A ``kernel_family`` that is neither installed (built in or plugin) nor an import path."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def register(family: Family) -> Family:
    """Add a family under its name (a family module may call this at import; the registry also loads
    every entry point of the group ``kregress.families`` on demand)."""
    if not isinstance(family, KIND_BASES):
        raise TypeError(f"family {family.name!r} is a {type(family).__name__}: subclass one of the kinds "
                        "TritonFamily, ExternalFamily, CudaFamily or RecordedFamily (kregress.core.family)")
    family.lookup = family.lookup or family.name
    FAMILIES[family.name] = family
    return family


def entry_points_by_name() -> dict[str, Any]:
    """name -> entry point of every installed family, the built-ins (distribution ``kregress``) included."""
    from importlib.metadata import entry_points

    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def is_builtin(ep: Any) -> bool:
    return ep.dist is not None and ep.dist.name == BUILTIN_DIST


def family_names() -> list[str]:
    """Every installed family's name (built-ins and plugins), for listings and "did you mean"."""
    return sorted(set(entry_points_by_name()) | set(FAMILIES))


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
    if not isinstance(obj, KIND_BASES):
        raise UnknownFamily(f"{what}: {target} is a {type(obj).__name__}, which subclasses Family directly; "
                            "subclass TritonFamily, ExternalFamily, CudaFamily or RecordedFamily (kregress.core.family)")
    if obj.module is None:
        obj.module = mod
    return obj


def get_family(name: str) -> Family:
    """The family named ``name``: an installed family (entry point: built-in or plugin) or
    ``package.module:attr``."""
    if name in FAMILIES:
        return FAMILIES[name]
    if ":" in name:
        fam = _load_target(name, f"kernel_family {name!r}")
    else:
        eps = entry_points_by_name()
        if name not in eps:
            builtins = sorted(n for n, ep in eps.items() if is_builtin(ep))
            plugins = sorted(n for n, ep in eps.items() if not is_builtin(ep))
            raise UnknownFamily(
                f"unknown kernel family {name!r}; built in: {', '.join(builtins) or 'none (reinstall kregress: pip install -e .)'}; "
                f"installed plugins: {', '.join(plugins) or 'none'}. A plugin registers itself under the "
                f"entry-point group {ENTRY_POINT_GROUP!r} (pip install -e DIR; `kregress family new NAME --dir DIR` "
                "scaffolds one), or name an import path package.module:attribute"
            )
        ep = eps[name]
        kind = "built-in" if is_builtin(ep) else "plugin"
        fam = _load_target(ep.value, f"{kind} family {name!r} (entry point {ep.value})")
    fam.lookup = fam.lookup or name
    FAMILIES[name] = fam
    return fam


def families() -> dict[str, Family]:
    """Every installed family, built-ins first (import-path families appear once they are used). A
    broken plugin is skipped here (``kregress family list`` says why); a broken built-in raises."""
    eps = entry_points_by_name()
    for name in sorted(eps, key=lambda n: (not is_builtin(eps[n]), n)):
        try:
            get_family(name)
        except UnknownFamily:
            if is_builtin(eps[name]):
                raise
    return dict(FAMILIES)
