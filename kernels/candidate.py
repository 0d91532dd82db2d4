"""The correctness harness for candidate patches, and what the sandboxed children run.

The judging process (``judge_patches``) never imports a candidate. It:

1. checks each patch statically (``kregress.core.patch`` and ``kregress.core.gate``) and applies it to
   a temporary copy of the family's package (the working tree is only read);
2. draws a secret seed (``secrets``; never shown to the agent, never written to a report) and builds the
   cases: every correctness shape, an odd shape (no multiple of any tile) and a shape of ones, a shape
   aligned to every tile, and hidden shapes larger than every correctness shape (one aligned, one odd)
   that the agent never saw; on a GPU the timed shapes too. Each shape runs on >= 3 seeds across four
   value distributions (normal, uniform, large magnitudes, outliers), twice: the second call puts other
   values in the same buffers, so a result cached by pointer or shape fails;
3. has a sandboxed child of the *pristine* package (``kernels.sandbox``) make the inputs, the float64
   reference and the baseline's own outputs (its error is the precision yardstick, and the aten ops it
   runs are the audit's allowlist). A case the baseline itself fails is dropped and said so;
4. for each candidate, forks a sandboxed child of the *patched* copy that AOT-compiles the kernel for the
   spec's arch (the compile units follow the patched signature: a new ``tl.constexpr`` takes its value
   from the wrapper's own launch, or its default), and another that runs the cases: candidate-allocated
   memory is poisoned (``torch.empty`` fills NaN; freed blocks are NaN-filled first) and no reference
   result ever existed in that process; each call runs under a ``TorchDispatchMode`` that records the aten
   ops, and the audit hook's refusals and new Python threads are recorded;
5. compares in the judging process: outputs against the reference (tolerance by dtype and shape), inputs
   against their values before the call (they must not change), the error against the baseline's
   (precision), the ops against the baseline's (torch computing instead of the kernel), and times on a
   GPU with the baseline re-timed in the same batch, interleaved, then checks correctness again after the
   timing loop.
"""

from __future__ import annotations

import copy
import math
import os
import secrets
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from kernels import sandbox as _sandbox  # bound before a child drops its copy of the package
from kregress.core.gate import GateReport, PrecisionMetrics, static_gate
from kregress.core.patch import (
    EditableSet,
    NotAPatch,
    PatchApplyError,
    PatchFormatError,
    apply_and_check,
    check_region,
    editable_set,
    materialize,
    parse_patch,
    read_sources,
    source_snapshot_hash,
)

DISTRIBUTIONS = ("normal", "uniform", "large", "outliers")
STRETCH_BUDGET_S = 1.5  # interpreter seconds of the baseline a stretched shape may take
LARGE_SCALE = 8.0  # "large magnitudes": x8 keeps an fp16 GEMM of K <= 1024 far from overflow
OUTLIER_SCALE = 16.0
OUTLIER_FRACTION = 0.01

# aten ops that allocate, view, copy or fill: a wrapper may add them without computing anything. Any
# other op the candidate runs that the baseline never ran means torch computed instead of the kernel.
# Not in it: reading a value into Python (_local_scalar_dense: float(t), int(t), bool(t), t.item()) and
# making a tensor from Python data (lift_fresh: torch.tensor, new_tensor), which host-side compute and
# value sniffing need and a launch wrapper does not (unless the baseline's own wrapper does them).
HARMLESS_OPS = frozenset({
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros", "zeros_like", "new_zeros",
    "zero_", "ones", "ones_like", "new_ones", "full", "full_like", "new_full", "fill_", "fill", "set_", "copy_",
    "_to_copy", "to", "clone", "contiguous", "view", "_unsafe_view", "reshape", "_reshape_alias", "as_strided",
    "as_strided_", "t", "transpose", "permute", "expand", "unsqueeze", "squeeze", "slice", "select", "narrow",
    "unbind", "split", "split_with_sizes", "chunk", "alias", "resize_",
    "cat", "stack", "constant_pad_nd", "arange", "view_as", "flatten", "unflatten",
    "is_same_size", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "record_stream",
})
HOST_DATA_OPS = frozenset({"_local_scalar_dense", "lift_fresh", "lift_fresh_copy", "detach", "item"})
# A call may run this many times the baseline's aten ops (plus a margin) before it counts as host-side work:
# a Python loop over elements (float(a[i, k]), c[i, j].fill_(...)) runs thousands where a wrapper runs a few.
OP_COUNT_FACTOR, OP_COUNT_MARGIN = 8, 64
# Fresh allocations a candidate may read before writing: what they hold in the second call (see _OpRecorder).
EMPTY_OPS = frozenset({"empty", "empty_like", "new_empty", "empty_strided", "new_empty_strided"})


# --- in the children -------------------------------------------------------------------------------------


def preload() -> None:
    """What the zygote imports once so every fork starts warm: torch (the heavy part), never Triton
    (its standard library is decorated when imported, for the interpreter or the compiler: each child
    imports it in its own mode), never a family, never a candidate."""
    import sys

    import numpy  # noqa: F401
    import torch  # noqa: F401
    import torch.utils._python_dispatch  # noqa: F401

    import kregress.core.family  # noqa: F401
    import kregress.core.records  # noqa: F401
    import kregress.core.spec  # noqa: F401

    if any(m == "triton" or m.startswith("triton.") for m in sys.modules):
        raise RuntimeError("the zygote imported Triton while preloading; children could not choose the interpreter")


_GUARDED = (
    ("triton.testing", "do_bench"), ("triton.testing", "do_bench_cudagraph"), ("time", "perf_counter"),
    ("time", "time"), ("torch.cuda", "Event"), ("torch.cuda", "synchronize"), ("torch.cuda", "Stream"),
    ("torch", "empty"), ("torch", "empty_like"), ("torch.Tensor", "copy_"), ("torch.Tensor", "clone"),
    ("torch.Tensor", "to"), ("triton.runtime.jit.JITFunction", "run"), ("builtins", "open"),
)


def _resolve(path: str):
    import importlib

    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for p in parts[i:]:
            obj = getattr(obj, p)
        return obj
    raise ImportError(path)


def _snapshot_guarded() -> dict[str, Any]:
    out = {}
    for mod, attr in _GUARDED + tuple(_GUARDED_EXTRA):
        try:
            out[f"{mod}.{attr}"] = getattr(_resolve(mod), attr)
        except (ImportError, AttributeError):
            continue
    return out


def _changed_guarded(before: dict[str, Any]) -> list[str]:
    out = []
    for key, obj in before.items():
        mod, _, attr = key.rpartition(".")
        try:
            now = getattr(_resolve(mod), attr)
        except (ImportError, AttributeError):
            now = None
        if now is not obj:
            out.append(f"{key} was replaced (monkeypatched timer or harness)")
    return out


class _OpRecorder:
    """A TorchDispatchMode that counts the aten ops a call runs (name without overload) and, with
    ``decoys``, fills what the call allocates uninitialised (``torch.empty`` and kin) with plausible finite
    values instead of NaN: the previous call's outputs where the size matches (the memory a caching
    allocator hands back in a timing loop), else random numbers. A kernel that reads its output before
    writing it (reusing what the memory already holds, or testing whether the checker NaN-filled it)
    then returns stale values, which the comparison sees."""

    def __new__(cls, decoys: list | None = None, seed: int = 0):
        import collections

        import torch
        from torch.utils._python_dispatch import TorchDispatchMode

        class Recorder(TorchDispatchMode):
            def __init__(self):
                super().__init__()
                self.ops: collections.Counter = collections.Counter()
                self.decoys = decoys
                self.gen = torch.Generator(device="cpu").manual_seed(seed & 0x7FFF_FFFF)

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                name = str(func)
                short = name.split(".")[1] if name.startswith("aten.") else name
                self.ops[short] += 1
                out = func(*args, **(kwargs or {}))
                if self.decoys is not None and short in EMPTY_OPS and torch.is_tensor(out) and out.numel():
                    self._fill(out)
                return out

            def _fill(self, out):
                for d in self.decoys:
                    if torch.is_tensor(d) and d.dtype == out.dtype and d.numel() == out.numel():
                        out.copy_(d.reshape(out.shape).to(out.device))
                        return
                if out.is_floating_point():
                    out.copy_(torch.randn(out.shape, generator=self.gen).to(out.dtype).to(out.device))
                elif out.dtype != torch.bool:
                    out.copy_(torch.randint(-64, 64, out.shape, generator=self.gen).to(out.dtype).to(out.device))

        return Recorder()


def _to(value: Any, device: str) -> Any:
    import torch

    if torch.is_tensor(value):
        return value.to(device)
    if isinstance(value, dict):
        return {k: _to(v, device) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to(v, device) for v in value)
    return value


def _fresh(value: Any, device: str) -> Any:
    """A deep copy on ``device``: what every call (baseline, candidate, reference) gets, so nothing one
    call writes reaches another (``.to(device)`` on the tensor's own device returns the same tensor)."""
    import torch

    if torch.is_tensor(value):
        return value.detach().to(device, copy=True)
    if isinstance(value, dict):
        return {k: _fresh(v, device) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_fresh(v, device) for v in value)
    return value


def poison_buffers(inputs: dict, names: Any, mode: str, seed: int) -> dict:
    """Fill the output buffers ``names`` of ``inputs`` in place: ``nan`` (a kernel that writes nothing
    returns NaN) or ``random`` finite non-zero values (a kernel that tests for NaN, or leaves rows it must
    write, returns stale numbers). The reference starts from the same buffers, so what a correct kernel
    leaves untouched must come back bit for bit."""
    import torch

    g = torch.Generator(device="cpu").manual_seed(seed & 0x7FFF_FFFF_FFFF)
    for name in names:
        t = inputs.get(name)
        if not torch.is_tensor(t) or not t.is_floating_point():
            continue
        if mode == "nan":
            t.fill_(float("nan"))
        else:
            r = torch.randn(t.shape, generator=g)
            r = torch.where(r == 0, torch.ones_like(r), r)
            t.copy_(r.to(t.dtype).to(t.device))
    return inputs


def _clone_cpu(value: Any) -> Any:
    import torch

    if torch.is_tensor(value):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: _clone_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_clone_cpu(v) for v in value)
    return value


def _poison(nbytes: int, device: str) -> None:
    """Allocate, fill with NaN, free: the memory a candidate's ``torch.empty`` can be handed holds NaN.
    (``fill_uninitialized_memory`` fills fresh allocations too; this covers recycled blocks.)"""
    import torch

    chunk = 1 << 16  # below malloc's mmap threshold, so freed chunks are reused on the CPU
    n = max(1, min(nbytes, 1 << 30) // (chunk * 4))
    bufs = [torch.full((chunk,), float("nan"), dtype=torch.float32, device=device) for _ in range(n)]
    del bufs


def _write_inplace(dst: Any, src: Any) -> None:
    """Copy ``src``'s values into ``dst``'s buffers (same structure): the second call's inputs."""
    import torch

    if torch.is_tensor(dst):
        dst.copy_(src.to(dst.device))
    elif isinstance(dst, dict):
        for k in dst:
            _write_inplace(dst[k], src[k])
    elif isinstance(dst, (list, tuple)):
        for d, s in zip(dst, src):
            _write_inplace(d, s)


def _tensor_bytes(value: Any) -> int:
    import torch

    if torch.is_tensor(value):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(_tensor_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_tensor_bytes(v) for v in value)
    return 0


def transform_inputs(inputs: dict, dist: str, dtype: Any, seed: int) -> dict:
    """The family's inputs with their floating tensors of the spec's dtype redrawn from ``dist``:
    normal (as made), uniform (unit variance), large (x8), outliers (1% of entries x16). Integer and
    other tensors (lengths, tables, scales) are left as made."""
    import torch

    if dist == "normal":
        return inputs
    g = torch.Generator(device="cpu").manual_seed(seed & 0x7FFF_FFFF_FFFF)
    out = {}
    for k, v in inputs.items():
        if not (torch.is_tensor(v) and v.dtype == dtype and v.is_floating_point()):
            out[k] = v
            continue
        x = v.to("cpu", torch.float32)
        if dist == "uniform":
            x = (torch.rand(x.shape, generator=g) * 2 - 1) * math.sqrt(3.0)
        elif dist == "large":
            x = x * LARGE_SCALE
        elif dist == "outliers":
            mask = torch.rand(x.shape, generator=g) < OUTLIER_FRACTION
            x = torch.where(mask, x * OUTLIER_SCALE, x)
        out[k] = x.to(dtype).to(v.device)
    return out


def _outputs(value: Any) -> list:
    return list(value) if isinstance(value, (tuple, list)) else [value]


# --- the timed shape on a CPU host: a few programs of each launch --------------------------------------------

# Programs run per launch (see ``sample_programs``): per grid axis, one program in each residue class
# modulo STRATA (so also modulo 2 and 4) and modulo 3, the first and the last, and RANDOM_PROGRAMS more,
# all drawn per candidate from the secret.
STRATA = (8, 3)
RANDOM_PROGRAMS = 2
SAMPLED_MAX_FLOPS = 2e10  # the float64 reference of a sampled shape must stay cheap on a CPU
SAMPLED_MAX_BYTES = 256e6
SAMPLED_FULL_BUDGET_S = 120.0  # a full interpreter run (what a suspicion escalates to) must be affordable


class _ProgramProxy:
    """Stands in for a kernel's Python function in the interpreter's grid loop: runs it only for the
    sampled programs, and counts, per program, how many elements of each floating tensor argument it
    turned from NaN into a value (what it wrote)."""

    def __init__(self, fn: Any, launch: dict, builder: Any):
        import inspect

        self.fn, self.launch, self.builder = fn, launch, builder
        self.__signature__ = inspect.signature(fn)
        self.__name__ = fn.__name__
        self.__globals__ = fn.__globals__

    def __call__(self, **args: Any) -> None:
        if tuple(self.builder.grid_idx) not in self.launch["sample"]:
            return None
        tensors = self.launch["tensors"]
        before = [_nan_count(t) for t in tensors]
        t0 = time.perf_counter()
        self.fn(**args)
        self.launch["seconds"] += time.perf_counter() - t0
        self.launch["programs"].append([b - _nan_count(t) for b, t in zip(before, tensors)])
        self.launch["pids"].append(",".join(map(str, self.builder.grid_idx)))
        return None


def _nan_count(t: Any) -> int:
    import torch

    with torch.utils._python_dispatch._disable_current_modes():
        return int(torch.isnan(t).sum()) if t.is_floating_point() else 0


class _ProgramSampler:
    """While active, every interpreted launch runs only the programs ``sample_programs`` draws from
    ``seed`` (stratified by program id), NaN-poisoned outputs showing what they wrote. A timed shape costs the
    interpreter seconds per program; a few programs of it still show a launch that skips programs past a
    count, a wrapper that truncates work on large shapes, or a kernel that cheats on large program ids,
    which the small checked shapes never reach. Relies on the interpreter's grid loop (``GridExecutor``,
    ``interpreter_builder``); where those are not as expected it raises, and the case is not used."""

    def __init__(self, seeds: list[int]):
        import random

        self.rngs = [random.Random(s) for s in seeds]
        self.launches: list[dict] = []

    def __enter__(self) -> "_ProgramSampler":
        import torch
        from triton.runtime import interpreter as interp

        builder = interp.interpreter_builder
        if not (hasattr(interp, "GridExecutor") and hasattr(builder, "set_grid_dim")):
            raise RuntimeError("the Triton interpreter has no GridExecutor / interpreter_builder.set_grid_dim")
        sampler, original_dim = self, builder.set_grid_dim

        def set_grid_dim(nx: int, ny: int, nz: int) -> None:
            original_dim(nx, ny, nz)
            sampler._choose(nx, ny, nz)

        class Sampled(interp.GridExecutor):  # type: ignore[misc, valid-type]
            def __call__(ex, *args_dev: Any, **kwargs: Any) -> Any:  # noqa: N805
                tensors = [t for t in list(args_dev) + list(kwargs.values()) if torch.is_tensor(t)]
                launch = {"tensors": tensors, "programs": [], "pids": [], "grid": 0, "sample": set(), "seconds": 0.0}
                sampler.launches.append(launch)
                real = ex.fn
                ex.fn = _ProgramProxy(real, launch, builder)
                try:
                    return super().__call__(*args_dev, **kwargs)
                finally:
                    ex.fn = real

        self._restore = (interp, interp.GridExecutor, builder)
        builder.set_grid_dim = set_grid_dim
        interp.GridExecutor = Sampled
        return self

    def _choose(self, nx: int, ny: int, nz: int) -> None:
        launch = self.launches[-1]
        launch["grid"] = nx * ny * nz
        launch["sample"] = set().union(*(sample_programs((nx, ny, nz), rng) for rng in self.rngs))

    def __exit__(self, *exc: object) -> None:
        interp, cls, builder = self._restore
        interp.GridExecutor = cls
        builder.__dict__.pop("set_grid_dim", None)

    def stats(self, out: Any) -> dict:
        """Per output tensor, the launches that wrote into it: grid size and per sampled program the
        elements it wrote there; and the estimated seconds of a full run."""
        import torch

        per_out = []
        for o in _outputs(out):
            entry: dict[str, Any] = {"launches": []}
            if torch.is_tensor(o):
                ptr = o.untyped_storage().data_ptr()
                for launch in self.launches:
                    idx = [i for i, t in enumerate(launch["tensors"]) if t.untyped_storage().data_ptr() == ptr]
                    if idx:
                        entry["launches"].append({"grid": launch["grid"],
                                                  "filled": [sum(p[i] for i in idx) for p in launch["programs"]],
                                                  "pids": list(launch["pids"])})
            per_out.append(entry)
        full = sum(la["seconds"] / max(1, len(la["programs"])) * la["grid"] for la in self.launches)
        return {"outputs": per_out, "launches": len(self.launches), "full_seconds": full,
                "programs": sum(len(la["programs"]) for la in self.launches), "grid": sum(la["grid"] for la in self.launches)}


def sample_programs(grid: tuple[int, int, int], rng: Any) -> set[tuple[int, int, int]]:
    """The programs of a ``grid`` (nx, ny, nz) that a sampled run executes: the first and the last; for
    each modulus m of ``STRATA``, m programs whose coordinates on every axis fall in each residue class
    modulo m (paired at random across axes); and ``RANDOM_PROGRAMS`` uniform ones. A kernel that skips
    the programs of one residue class (one program in eight, every third group) is always sampled there;
    which programs of the class is drawn from ``rng``, per candidate."""
    nx, ny, nz = grid
    picks = {(0, 0, 0), (nx - 1, ny - 1, nz - 1)}

    def in_class(n: int, m: int, r: int) -> int:
        members = range(r % m, n, m) if n > r % m else range(0, n)
        return rng.choice(members)

    for m in STRATA:
        perms = [rng.sample(range(m), m) for _ in range(3)]
        for r in range(m):
            picks.add(tuple(in_class(n, m, p[r]) for n, p in zip((nx, ny, nz), perms)))
    for _ in range(RANDOM_PROGRAMS):
        picks.add((rng.randrange(nx), rng.randrange(ny), rng.randrange(nz)))
    return picks


def _sampled_call(family: Any, inputs: dict, config: dict, params: dict, seeds: list[int]) -> tuple[Any, dict]:
    """One call of the entry point on the CPU interpreter with only sampled programs running (see
    ``_ProgramSampler``): (outputs, with NaN where no sampled program wrote; the sampling stats)."""
    _poison(2 * _tensor_bytes(inputs) + (1 << 20), "cpu")
    cfg, prm = copy.deepcopy(config), copy.deepcopy(params)
    _THREADS["in_call"] = True
    try:
        with _ProgramSampler(seeds) as sampler:
            out = family.run(inputs, cfg, prm)
    finally:
        _THREADS["in_call"] = False
    if cfg != config or prm != params:
        _sandbox.record_violation("the call changed the config or params it was handed (state kept across calls)")
    return _clone_cpu(out), sampler.stats(out)


def _launch_grids(family: Any, shape: dict, config: dict, dtype: Any, params: dict) -> list[tuple]:
    """The grids the entry point launches on ``shape`` (interpreter mode; nothing runs)."""
    from triton.runtime import interpreter as interp

    grids: list[tuple] = []
    original = interp.InterpretedFunction.run

    def run(self: Any, *args: Any, grid: Any, warmup: Any, **kwargs: Any) -> None:
        g = grid(dict(zip(self.arg_names, args)) | kwargs) if callable(grid) else grid
        grids.append(tuple(int(x) for x in g))

    interp.InterpretedFunction.run = run
    try:
        family.run(family.make_inputs(shape, dtype, "cpu", 0, params), dict(config), dict(params))
    finally:
        interp.InterpretedFunction.run = original
    return grids


def wide_shape(family: Any, timed: dict, correctness: list[dict], config: dict, dtype: Any, params: dict) -> dict | None:
    """``timed`` with every dimension that does not change the baseline's launch grids cut to its smallest
    (1, else the smallest checked value): every program of the timed launch, the least work per program.
    The reduction (``reduction_keys``: GEMM K, attention keys) keeps its timed length and the structure
    (``structure_keys``: the GQA heads) is never cut, so a skip past a length or a wrong head map runs
    here too. None when no dimension can be cut."""
    target = _launch_grids(family, timed, config, dtype, params)
    shape = dict(timed)
    kept = set(getattr(family, "reduction_keys", ())) | set(getattr(family, "structure_keys", ()))
    for k in [k for k in family.shape_keys if k not in kept]:
        for v in sorted({1, min(s[k] for s in correctness)}):
            trial = {**shape, k: v}
            if v < shape[k] and family.check_shape(trial) is None and _launch_grids(family, trial, config, dtype, params) == target:
                shape = trial
                break
    return None if shape == timed else shape


def base_writes(stats: dict) -> list[list[dict[str, int]]]:
    """Per output, per launch: program id -> elements the baseline's program wrote there."""
    return [[dict(zip(la["pids"], la["filled"])) for la in o["launches"]] for o in stats["outputs"]]


def sampled_problems(out: Any, ref: Any, stats: dict, atol: float, rtol: float,
                     base: list[list[dict[str, int]]] | None = None) -> list[str]:
    """What a sampled run of a timed shape shows that a full run would have to settle: a written element
    that differs from the reference, a launch whose programs cannot cover the output (the largest amount
    a sampled program wrote, times the grid, is less than the output), no launch writing an output at
    all; and with ``base`` (the baseline's writes on the same programs) a program that wrote less than
    the baseline's program of the same id, or launches unlike the baseline's. Empty: nothing to settle."""
    import torch

    from kernels.measure import compare

    out_l, ref_l = _outputs(out), _outputs(ref)
    if len(out_l) != len(ref_l):
        return [f"{len(out_l)} output(s), the reference has {len(ref_l)}"]
    why: list[str] = []
    for i, (o, r) in enumerate(zip(out_l, ref_l)):
        if not torch.is_tensor(r):
            continue
        if not torch.is_tensor(o) or tuple(o.shape) != tuple(r.shape) or not o.is_floating_point():
            why.append(f"output {i} is not a floating tensor of the reference's shape")
            continue
        launches = stats["outputs"][i]["launches"] if i < len(stats["outputs"]) else []
        if not launches:
            why.append(f"no launch wrote output {i}")
            continue
        reach = sum(max(la["filled"], default=0) * la["grid"] for la in launches)
        if reach < o.numel():
            why.append(f"output {i}: the launches reach at most {reach} of its {o.numel()} elements "
                       f"(largest write of a sampled program x grid)")
        if base is not None:
            mine = base[i] if i < len(base) else []
            if len(mine) != len(launches):
                why.append(f"output {i}: written by {len(launches)} launch(es), the baseline's by {len(mine)}")
            for j, la in enumerate(launches[:len(mine)]):
                short = [(p, n, mine[j][p]) for p, n in zip(la.get("pids", []), la["filled"]) if n < mine[j].get(p, -1)]
                missing = [p for p in la.get("pids", []) if p not in mine[j]]
                if short or missing:
                    p, n, b = short[0] if short else (missing[0], 0, "?")
                    why.append(f"output {i}: program ({p}) of a {la['grid']}-program launch wrote {n} elements, "
                               f"the baseline's {b}")
                    break
        written = ~torch.isnan(o)
        if written.any():
            res = compare(o[written], r[written], atol, rtol)
            if not res["ok"]:
                why.append(f"output {i}: {res['mismatches']} of {int(written.sum())} written elements differ from the reference")
    return why


def child_main(rfd: int, wfd: int, spec: dict, info: dict) -> None:
    """The job loop of a sandboxed child (reference or candidate); see ``judge_patches``."""
    import torch

    sandbox = _sandbox

    guarded = _snapshot_guarded()
    if spec.get("interpret"):
        from kernels.interpreter import install as install_interpreter_fixes

        install_interpreter_fixes()  # the same fixes every interpreter process gets (bf16 dot and rounding, ...)
        guarded = _snapshot_guarded()
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    _guard_threads()
    _guard_host_reads(sandbox.watched_files(spec.get("watch", []), spec.get("watch_wrappers")))
    guarded = _snapshot_guarded()
    from kregress.core.family import get_family

    state: dict[str, Any] = {"guarded": guarded, "kept": {}}
    try:
        family = get_family(spec["family"]).for_params(spec.get("params") or {})
        mod_file = os.path.realpath(getattr(family.module, "__file__", "") or "")
        if not mod_file.startswith(os.path.realpath(spec["root"]) + os.sep):
            raise RuntimeError(f"the family module was imported from {mod_file}, not from the copy {spec['root']}")
        state["family"] = family
        load_violations = sandbox.violations() + _changed_guarded(guarded)
    except Exception as exc:  # noqa: BLE001 - a candidate that does not import is a value
        sandbox.write_frame(wfd, {"hello": info, "error": "compile_failed",
                                  "detail": f"importing the family failed: {type(exc).__name__}: {str(exc)[:400]}",
                                  "violations": sandbox.violations()})
        return
    sandbox.write_frame(wfd, {"hello": info, "violations": load_violations})
    jobs = {"prepare": _job_prepare, "run": _job_run, "compile": _job_compile, "bench": _job_bench,
            "recheck": _job_recheck, "full": _job_full}
    while True:
        msg = sandbox.read_frame(rfd)
        if msg is None:
            return
        header, blobs = msg
        op = header.get("job")
        if op == "exit":
            return
        try:
            reply, out_blobs = jobs[op](state, header, blobs)
        except Exception as exc:  # noqa: BLE001 - a failure is a value in the reply
            import traceback

            reply, out_blobs = {"error": "runtime_error", "detail": f"{type(exc).__name__}: {str(exc)[:400]}",
                                "traceback": traceback.format_exc(limit=4)[-1500:]}, []
        reply["violations"] = sandbox.violations() + _changed_guarded(state["guarded"])
        sandbox.write_frame(wfd, reply, out_blobs)


_THREADS = {"in_call": False, "started": 0}

# Calls candidate code never needs and the aten audit cannot see: tensor values handed to Python without
# an aten op, and the switches that hide ops from the audit's dispatch mode.
_HOST_READS = (("torch.Tensor", "tolist"), ("torch.Tensor", "numpy"), ("torch.Tensor", "__array__"),
               ("torch.Tensor", "__dlpack__"), ("torch._tensor_str", "_str"))
_AUDIT_SWITCHES = (("torch.utils._python_dispatch", "_disable_current_modes"),
                   ("torch.utils._python_dispatch", "_pop_mode_temporarily"), ("torch.utils._python_dispatch", "_pop_mode"),
                   ("torch._C", "_pop_torch_dispatch_stack"), ("torch._C", "_unset_dispatch_mode"))


def _guard_host_reads(watch: dict) -> None:
    """Record a violation when candidate code (a watched file, directly or through torch or the standard
    library: ``str(t)``, ``print(t)``, ``np.asarray(t)``) reads tensor values into Python (host-side
    compute or value sniffing), or switches off the dispatch mode the aten audit records with. The
    harness's and Triton's own calls are not the candidate's."""
    import torch

    skip = _sandbox._stdlib_prefixes() + (os.path.dirname(torch.__file__) + os.sep,)
    for owner_path, attr in _HOST_READS + _AUDIT_SWITCHES:
        try:
            owner = _resolve(owner_path)
        except ImportError:
            continue
        original = getattr(owner, attr, None)
        if original is None:
            continue
        why = ("read tensor values into Python ({}): host-side compute or value sniffing" if (owner_path, attr) in _HOST_READS
               else "switched off the aten audit ({})").format(attr)

        def guarded(*args: Any, _original: Any = original, _why: str = why, **kwargs: Any) -> Any:
            if _sandbox.initiated_by(watch, skip):
                _sandbox.record_violation(f"the candidate {_why}")
            return _original(*args, **kwargs)

        setattr(owner, attr, guarded)
        _GUARDED_EXTRA.append((owner_path, attr))


_GUARDED_EXTRA: list[tuple[str, str]] = []


def _guard_threads() -> None:
    """Count the Python threads started while the entry point runs (3.11 has no audit event for it)."""
    import _thread

    original = threading._start_new_thread  # type: ignore[attr-defined]

    def start(function, args, kwargs=None):
        if _THREADS["in_call"]:
            _THREADS["started"] += 1
        return original(function, args, kwargs or {})

    threading._start_new_thread = start  # type: ignore[attr-defined]
    _thread.start_new_thread = start


def _call(family: Any, inputs: dict, config: dict, params: dict, device: str, record: bool = True,
          decoys: list | None = None, seed: int = 0) -> tuple[Any, dict]:
    """One call of the family's entry point: (outputs on the CPU, what was seen: the aten ops run and
    how many, the Python threads started, problems with the outputs). ``decoys``: fill fresh
    allocations with finite stale values (see ``_OpRecorder``) instead of NaN."""
    import torch

    _poison(2 * _tensor_bytes(inputs) + (1 << 20), device)
    rec = _OpRecorder(decoys, seed) if record else None
    problems: list[str] = []
    started = _THREADS["started"]
    cfg, prm = copy.deepcopy(config), copy.deepcopy(params)
    _THREADS["in_call"] = True
    try:
        if rec is not None:
            with rec:
                out = family.run(inputs, cfg, prm)
        else:
            out = family.run(inputs, cfg, prm)
        # read the results on the current stream first (work left on a side stream is not waited for),
        # then synchronise and read again: the two must agree
        first = _clone_cpu(out)
    finally:
        _THREADS["in_call"] = False
    if device == "cuda":
        torch.cuda.synchronize()
        second = _clone_cpu(out)
        for a, b in zip(_outputs(first), _outputs(second)):
            if torch.is_tensor(a) and not torch.equal(a.nan_to_num(0.123), b.nan_to_num(0.123)):
                problems.append("outputs changed after the call returned (work left running on another stream)")
                break
    if cfg != config or prm != params:
        # state kept in the dicts it is handed survives a timing loop that passes the same dict every call
        _sandbox.record_violation("the call changed the config or params it was handed (state kept across calls)")
    ops = rec.ops if rec is not None else {}
    seen = {"ops": set(ops), "op_count": sum(ops.values()), "threads": _THREADS["started"] - started, "problems": problems}
    return first, seen


def _job_prepare(state: dict, job: dict, blobs: list[bytes]) -> tuple[dict, list[bytes]]:
    """Reference child: pick each group's first valid shape, make the inputs of every case (secret
    seeds, distributions), the float64 reference and the baseline's outputs; record the baseline's ops."""
    import torch

    from kernels.dtypes import TORCH_DTYPES
    from kernels.measure import compare

    family = state["family"]
    dtype = TORCH_DTYPES[job["dtype"]]
    params, config, device = job["params"], job["config"], job["device"]
    base_tol = job["tolerance"]
    out_blobs: list[bytes] = []
    cases_out, dropped, ops = [], [], set()
    keep = job.get("keep", False)

    def make(shape: dict, seed: int, dist: str, prm: dict | None = None, poison: str = "nan") -> dict:
        """A case's inputs as shipped to every call: output buffers poisoned (``nan`` for the first call,
        ``random`` finite for the second), never written by any call (each call gets a fresh copy)."""
        prm = params if prm is None else prm
        inputs = family.make_inputs(shape, dtype, "cpu", seed, prm)
        inputs = transform_inputs(inputs, dist, dtype, seed + 7919)
        return poison_buffers(inputs, family.output_buffers(prm), poison, seed + 104729)

    def reference(inputs: dict, prm: dict | None = None) -> Any:
        prm = params if prm is None else prm
        ref_dev = job.get("reference_device", "cpu")
        try:
            return _clone_cpu(family.reference(_fresh(inputs, ref_dev), prm))
        except Exception:  # noqa: BLE001 - a reference that only runs on the CPU
            if ref_dev == "cpu":
                raise
            return family.reference(_fresh(inputs, "cpu"), prm)

    threads = 0

    op_count = 0

    def one(shape: dict, seed: int, dist: str, prm: dict) -> tuple[dict, Any, Any, set[str], str | None]:
        nonlocal threads, op_count
        inputs = make(shape, seed, dist, prm)
        ref = reference(inputs, prm)
        out, seen = _call(family, _fresh(inputs, device), config, prm, device)
        run_ops = seen["ops"]
        op_count = max(op_count, seen["op_count"])
        threads += seen["threads"]
        atol, rtol = family.tolerance(shape, job["dtype"], base_tol, prm)
        outs, refs = _outputs(out), _outputs(ref)
        if len(outs) != len(refs):
            return inputs, ref, out, run_ops, f"{len(outs)} outputs, reference has {len(refs)}"
        for o, r in zip(outs, refs):
            if torch.is_tensor(o) and torch.is_tensor(r):
                res = compare(o, r, atol, rtol)
                if not res["ok"] or res["nan_inf"]:
                    return inputs, ref, out, run_ops, res["sample"][:200] or "NaN/Inf"
        return inputs, ref, out, run_ops, None

    for group in job["groups"]:
        if group.get("wide_of"):
            try:
                wide = wide_shape(family, group["wide_of"], job["correctness"], config, dtype, params)
            except Exception as exc:  # noqa: BLE001 - a wrapper that needs real inputs to launch: not derived
                wide = None
                dropped.append(f"wide: no shape derived ({type(exc).__name__}: {str(exc)[:120]})")
            if wide is None:
                continue
            group = dict(group, shapes=[wide])
        if group.get("sample"):
            case = _prepare_sampled(family, group, job, make, reference, dropped)
            if case is not None:
                case["payload"] = _sandbox.pack(case.pop("data"), out_blobs)
                cases_out.append(case)
            continue
        chosen = None
        tried = []
        prm = {**params, **group.get("params", {})}
        for shape in group["shapes"]:
            seed, dist = group["seed"], group["dist"]
            t0 = time.perf_counter()
            try:
                inputs, ref, out, run_ops, bad = one(shape, seed, dist, prm)
            except MemoryError as exc:
                tried.append(f"{shape}: the baseline cannot run it here (out of memory: {str(exc)[:80]})")
                continue
            except Exception as exc:  # noqa: BLE001 - a shape the family refuses: try the next one
                tried.append(f"{shape}: {type(exc).__name__}: {str(exc)[:120]}")
                continue
            if bad:
                tried.append(f"{shape}: the baseline fails it ({bad})")
                continue
            chosen = (shape, inputs, ref, out, run_ops)
            # ascending groups keep growing while the run stays within half the budget (the next is ~2x)
            if not group.get("ascending") or time.perf_counter() - t0 > group.get("budget_s", 1.0) / 2:
                break
        if chosen is None:
            dropped.append(f"{group['kind']}: no usable shape ({'; '.join(tried)[:400]})")
            continue
        shape, inputs, ref, out, run_ops = chosen
        ops |= run_ops
        case = {"id": group["id"], "kind": group["kind"], "shape": shape, "seed_index": group["seed_index"],
                "dist": group["dist"], "tol": list(family.tolerance(shape, job["dtype"], base_tol, prm)),
                "label": family.shape_label(shape) + (f" {group['kind']}" if group.get("params") else ""),
                "params": group.get("params", {}), "buffers": family.output_buffers(prm)}
        payload = {"inputs": inputs, "ref": ref, "base": out}
        if group.get("second"):
            s2 = group["second"]
            inputs2 = make(shape, s2["seed"], s2["dist"], prm, poison="random")
            ref2 = reference(inputs2, prm)
            out2, seen2 = _call(family, _fresh(inputs2, device), config, prm, device, decoys=_outputs(out), seed=s2["seed"])
            ops |= seen2["ops"]
            op_count = max(op_count, seen2["op_count"])
            threads += seen2["threads"]
            payload.update({"inputs2": inputs2, "ref2": ref2, "base2": out2})
            case["dist2"] = s2["dist"]
        if keep and group["kind"] == "timed":
            state["kept"][group["id"]] = _fresh(inputs, device)
        case["payload"] = _sandbox.pack(payload, out_blobs)
        cases_out.append(case)
    return {"cases": cases_out, "dropped": dropped, "ops": sorted(ops), "op_count": op_count, "threads": threads}, out_blobs


def _prepare_sampled(family: Any, group: dict, job: dict, make: Callable, reference: Callable, dropped: list) -> dict | None:
    """Reference child: a timed shape for the sampled check, used only where it is cheap to make and the
    baseline passes it (a family whose programs share their outputs, a split-K reduction, say, cannot be
    checked by sampling) and a full run, what a suspicion escalates to, is affordable."""
    from kernels.dtypes import DTYPE_BYTES

    params, config = job["params"], job["config"]
    shape = group["shapes"][0]
    label = f"{group['kind']} {family.shape_label(shape)}"
    if family.flops(shape, params) > SAMPLED_MAX_FLOPS or family.bytes_moved(shape, DTYPE_BYTES[job["dtype"]], params) > SAMPLED_MAX_BYTES:
        dropped.append(f"{label}: too large for a float64 reference on the CPU (not sampled)")
        return None
    try:
        inputs = make(shape, group["seed"], group["dist"])
        ref = reference(inputs)
        out, stats = _sampled_call(family, _fresh(inputs, "cpu"), config, params, group["candidate_seeds"])
    except Exception as exc:  # noqa: BLE001 - a family the sampler cannot run: the check is not used
        dropped.append(f"{label}: the sampled run failed ({type(exc).__name__}: {str(exc)[:120]})")
        return None
    atol, rtol = family.tolerance(shape, job["dtype"], job["tolerance"], params)
    why = sampled_problems(out, ref, stats, atol, rtol)
    if why:
        dropped.append(f"{label}: the baseline itself does not pass a sampled run ({'; '.join(why)[:200]})")
        return None
    if stats["full_seconds"] > SAMPLED_FULL_BUDGET_S:
        dropped.append(f"{label}: a full run would take ~{stats['full_seconds']:.0f}s on the interpreter (not sampled)")
        return None
    return {"id": group["id"], "kind": group["kind"], "shape": shape, "seed_index": group["seed_index"], "dist": group["dist"],
            "tol": [atol, rtol], "label": family.shape_label(shape), "sampled": True, "params": {},
            "buffers": family.output_buffers(params),
            "full_seconds": stats["full_seconds"], "base_writes": base_writes(stats), "data": {"inputs": inputs, "ref": ref}}


def _job_full(state: dict, job: dict, blobs: list[bytes]) -> tuple[dict, list[bytes]]:
    """Candidate child: a full (unsampled) call on a sampled case's inputs, where the sampled run left
    something to settle."""
    sandbox = _sandbox
    out_blobs: list[bytes] = []
    results = []
    for case in job["cases"]:
        data = sandbox.unpack(case["payload"], blobs)
        try:
            prm = {**job["params"], **case.get("params", {})}
            out, seen = _call(state["family"], _fresh(data["inputs"], job["device"]), job["config"], prm, job["device"])
            results.append({"id": case["id"], "problems": seen["problems"], "payload": sandbox.pack({"out": out}, out_blobs)})
        except Exception as exc:  # noqa: BLE001 - a crashing candidate is a value
            results.append({"id": case["id"], "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
    return {"results": results}, out_blobs


def _job_run(state: dict, job: dict, blobs: list[bytes]) -> tuple[dict, list[bytes]]:
    """Candidate child: run every case (and its second call in the same buffers); send back the outputs,
    the inputs as they are after each call, the ops run and what was seen."""
    sandbox = _sandbox
    family = state["family"]
    params, config, device = job["params"], job["config"], job["device"]
    out_blobs: list[bytes] = []
    results = []
    ops: set[str] = set()
    op_count = 0
    threads = 0
    for case in job["cases"]:
        data = sandbox.unpack(case["payload"], blobs)
        res: dict[str, Any] = {"id": case["id"]}
        prm = {**params, **case.get("params", {})}
        try:
            inputs = _fresh(data["inputs"], device)  # the shipped inputs are never handed to a call
            if case.get("sample"):
                out, stats = _sampled_call(family, inputs, config, prm, [int(case["sample"])])
                res.update({"sampled": stats, "problems": [],
                            "payload": sandbox.pack({"out": out, "after": _clone_cpu(inputs)}, out_blobs)})
                results.append(res)
                continue
            out, seen = _call(family, inputs, config, prm, device)
            ops |= seen["ops"]
            op_count = max(op_count, seen["op_count"])
            threads += seen["threads"]
            problems = list(seen["problems"])
            payload = {"out": out, "after": _clone_cpu(inputs)}
            if "inputs2" in data:
                _write_inplace(inputs, data["inputs2"])
                # the second call finds the first call's outputs (or random numbers) in what it allocates,
                # not NaN: reading the output before writing it shows
                out2, seen2 = _call(family, inputs, config, prm, device, decoys=_outputs(out),
                                    seed=int(case.get("decoy_seed", 0)))
                ops |= seen2["ops"]
                op_count = max(op_count, seen2["op_count"])
                threads += seen2["threads"]
                problems += seen2["problems"]
                payload.update({"out2": out2, "after2": _clone_cpu(inputs)})
            if case.get("keep"):
                state["kept"][case["id"]] = inputs
            res["problems"] = problems
            res["payload"] = sandbox.pack(payload, out_blobs)
        except Exception as exc:  # noqa: BLE001 - a crashing candidate is a value
            import traceback

            res["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            res["traceback"] = traceback.format_exc(limit=-3)[-800:]
        results.append(res)
    return {"results": results, "ops": sorted(ops), "op_count": op_count, "threads": threads}, out_blobs


def _job_bench(state: dict, job: dict, blobs: list[bytes]) -> tuple[dict, list[bytes]]:
    """GPU: time the entry point on a kept case's inputs for one slot of the interleaved batch."""
    from kernels.measure import device_identity

    # the timer as it was before the candidate was imported (a replaced one is also reported)
    do_bench = state["guarded"]["triton.testing.do_bench"]
    do_bench_cudagraph = state["guarded"]["triton.testing.do_bench_cudagraph"]
    family = state["family"]
    inputs = state["kept"][job["case"]]
    config, params = job["config"], job["params"]
    # fresh (shallow) copies each call, on both sides: state kept in the dicts does not survive the loop
    fn = lambda: family.run(inputs, dict(config), dict(params))  # noqa: E731
    ident = device_identity()
    import torch

    # no NaN fill of fresh allocations while timing (both sides alike): it would add a kernel per call
    torch.utils.deterministic.fill_uninitialized_memory = False
    torch.use_deterministic_algorithms(False)
    _THREADS["in_call"] = True
    started = _THREADS["started"]
    try:
        if family.use_cudagraph():
            samples = do_bench_cudagraph(fn, rep=job["rep_ms"], return_mode="all")
        else:
            samples = do_bench(fn, warmup=job["warmup_ms"], rep=job["rep_ms"], return_mode="all")
    finally:
        _THREADS["in_call"] = False
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.utils.deterministic.fill_uninitialized_memory = True
    return {"samples": [float(s) for s in samples], "identity": ident, "threads": _THREADS["started"] - started}, []


def _job_recheck(state: dict, job: dict, blobs: list[bytes]) -> tuple[dict, list[bytes]]:
    """GPU, after the timing loop: new values into the kept buffers, one more call, outputs back."""
    sandbox = _sandbox
    family = state["family"]
    out_blobs: list[bytes] = []
    results = []
    for case in job["cases"]:
        data = sandbox.unpack(case["payload"], blobs)
        inputs = state["kept"][case["id"]]
        _write_inplace(inputs, data["inputs"])
        out, seen = _call(family, inputs, job["config"], job["params"], job["device"], record=False)
        results.append({"id": case["id"], "problems": seen["problems"], "payload": sandbox.pack({"out": out}, out_blobs)})
    return {"results": results}, out_blobs


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


# --- the judging process ----------------------------------------------------------------------------------


@dataclass
class Candidate:
    """One patch on its way through the gate."""

    index: int
    suggestion: Any
    report: GateReport
    new_texts: dict[str, str] = field(default_factory=dict)
    error: str | None = None
    detail: str = ""


def _primes_upto(n: int) -> list[int]:
    sieve = [True] * (n + 1)
    out = []
    for i in range(2, n + 1):
        if sieve[i]:
            out.append(i)
            for j in range(i * i, n + 1, i):
                sieve[j] = False
    return out


_PRIMES = _primes_upto(4096)


def tile_size(family: Any) -> int:
    """The largest tile of the family's space (its BLOCK_* values): a size that is a multiple of it is a
    multiple of every tile."""
    blocks = [v for k, vals in family.space.params.items() if k.upper().startswith("BLOCK") for v in vals]
    return max(blocks) if blocks else 16


def _odd_near(v: int, avoid: set[int], below: bool, rng: Any = None) -> int:
    """An odd prime (a multiple of no tile) below or above ``v``, not one of ``avoid``: the nearest, or with
    ``rng`` one of the few nearest, so the hidden shapes differ from judgement to judgement."""
    cands = [p for p in _PRIMES if p > 2 and p not in avoid and ((p < v) if below else (p > v))]
    if not cands:
        return 1 if below else v + 1 + (v % 2)
    near = cands[-4:] if below else cands[:4]
    return rng.choice(near) if rng is not None else (near[-1] if below else near[0])


def shape_groups(family: Any, correctness: list[dict], timed: list[dict], on_gpu: bool, rng: Any,
                 seeds: list[int], params: dict | None = None) -> list[dict]:
    """The case groups: each has a kind, candidate shapes in order of preference (the reference child
    keeps the first the family accepts and the baseline passes), a seed and a distribution for the
    first call and another for the second call in the same buffers. The generic hidden shapes never
    change the family's ``structure_keys`` (the GQA heads: an odd prime for both makes every group 1);
    the family's ``structure_cases`` (params overrides: group sizes, cache lengths, another GQA ratio,
    a long sequence) vary the structure on purpose, drawn fresh from ``rng``."""
    keys = [k for k in family.shape_keys if k not in getattr(family, "structure_keys", ())]
    base = max(correctness, key=lambda s: sum(math.log(max(1, s[k])) for k in keys))
    tiled = [k for k in keys if max(s[k] for s in correctness) >= 16] or keys
    seen = {k: {s[k] for s in correctness} for k in keys}
    T = tile_size(family)
    limit_work = max(sum(math.log(max(1, s[k])) for k in keys) for s in correctness) + math.log(512.0)

    def ok(shape: dict) -> bool:
        try:
            return family.check_shape(shape) is None
        except Exception:  # noqa: BLE001
            return False

    def variants(target: dict[str, int], order: list[str]) -> list[dict]:
        """The target mutations, then with fewer keys mutated (each shape once, valid ones only)."""
        import itertools

        out: list[dict] = []
        for r in range(len(order), 0, -1):
            for subset in itertools.combinations(order, r):
                s = dict(base)
                s.update({k: target[k] for k in subset})
                if ok(s) and s not in out and s not in correctness:
                    out.append(s)
        return out[:24]

    # drawn from the secret: which odd and aligned sizes are checked differs from judgement to judgement
    odd = {k: _odd_near(max(s[k] for s in correctness), seen[k], below=True, rng=rng) for k in keys}
    ones = {k: 1 for k in keys}
    aligned = {k: (T * (max(1, math.ceil(max(s[k] for s in correctness) / T)) + rng.choice((0, 0, 1)))
                   if k in tiled else base[k]) for k in keys}
    hidden_odd = {k: (_odd_near(rng.choice((3, 4)) * max(s[k] for s in correctness), seen[k], below=False, rng=rng)
                      if k in tiled else _odd_near(max(s[k] for s in correctness) + 1, seen[k], below=False, rng=rng))
                  for k in keys}

    def shrink(target: dict[str, int]) -> dict[str, int]:
        """Scale the tiled keys down until the work (sum of log sizes) is within 512x the largest check."""
        t = dict(target)
        for _ in range(16):
            work = sum(math.log(max(1, t[k])) for k in keys)
            if work <= limit_work:
                break
            k = max(tiled, key=lambda k: t[k])
            t[k] = max(max(s[k] for s in correctness) + 1, t[k] * 2 // 3)
        return t

    groups = [{"kind": "correctness", "shapes": [s]} for s in correctness]
    try:
        structure = family.structure_cases(correctness, dict(params or {}), rng) if hasattr(family, "structure_cases") else []
    except Exception as exc:  # noqa: BLE001 - a family's own hook failing is said, not fatal
        structure = []
        groups.append({"kind": f"structure (not drawn: {type(exc).__name__}: {str(exc)[:80]})", "shapes": []})
    for kind, shape, over in structure:
        if ok(shape):
            groups.append({"kind": kind, "shapes": [shape], "params": dict(over)})
    groups += [
        {"kind": "odd", "shapes": variants(odd, tiled + [k for k in keys if k not in tiled])},
        {"kind": "ones", "shapes": variants(ones, keys)},
        {"kind": "aligned", "shapes": variants(shrink(aligned), tiled)},
        {"kind": "hidden_odd", "shapes": variants(shrink(hidden_odd), tiled + [k for k in keys if k not in tiled])},
    ]
    if on_gpu:
        groups += [{"kind": "timed", "shapes": [s]} for s in timed]
    else:
        # one dimension stretched towards the timed size, the others as checked: a cheat that skips work
        # past a size threshold shows on the CPU too. Tried smallest first; the reference child keeps the
        # largest whose baseline run stays within the interpreter's budget.
        for k in tiled:
            top = max((s[k] for s in timed), default=0)
            lo = max(s[k] for s in correctness)
            if top <= 2 * lo:
                continue
            vals, v = [], 2 * lo
            while v < top:
                vals.append(_odd_near(v, seen[k], below=False, rng=rng))
                v *= 2
            vals.append(top)
            shapes = [s for s in ({**base, k: x} for x in dict.fromkeys(vals)) if ok(s)]
            if shapes:
                groups.append({"kind": f"stretched_{k}", "shapes": shapes, "ascending": True, "budget_s": STRETCH_BUDGET_S})
    if not on_gpu:
        # each timed shape itself, a few programs of each launch (see _ProgramSampler): what only the
        # timed size reaches (every dimension large at once, the program count) is checked on a CPU too
        groups += [{"kind": "sampled", "shapes": [s], "sample": True} for s in timed]
        # and every program of each timed launch with the least work each (see wide_shape): a launch that
        # skips programs past a count, or maps them onto the same tiles, leaves part of the output unwritten
        groups += [{"kind": "wide", "shapes": [], "wide_of": s} for s in timed]
    out = []
    for i, g in enumerate(groups):
        if not g["shapes"] and not g.get("wide_of"):
            continue
        d1, d2 = DISTRIBUTIONS[i % len(DISTRIBUTIONS)], DISTRIBUTIONS[(i + 1) % len(DISTRIBUTIONS)]
        s1, s2 = i % len(seeds), (i + 1) % len(seeds)
        # on the CPU the largest hidden shapes are called once (their cost is the interpreter's)
        second = on_gpu or (g["kind"] not in ("aligned", "hidden_odd", "sampled", "wide", "structure_long")
                             and not g["kind"].startswith("stretched"))
        out.append({"id": f"g{i}", **g, "seed": seeds[s1], "seed_index": s1, "dist": d1,
                    "second": {"seed": seeds[s2], "dist": d2} if second else None})
    return out


def _error_fractions(out: Any, ref: Any, atol: float, rtol: float) -> tuple[float, float, int]:
    """(max, sum of squares, count) of |out - ref| / (atol + rtol |ref|) over the reference's finite
    elements; a non-finite output there counts as infinite error."""
    import torch

    o = out.detach().to("cpu", torch.float64)
    r = ref.detach().to("cpu", torch.float64)
    if o.shape != r.shape:
        return math.inf, math.inf, 1
    finite = torch.isfinite(r)
    frac = (o - r).abs() / (atol + rtol * r.abs())
    frac = torch.where(torch.isfinite(o), frac, torch.full_like(frac, math.inf))
    frac = frac[finite]
    if frac.numel() == 0:
        return 0.0, 0.0, 0
    return float(frac.max()), float((frac * frac).sum()), int(frac.numel())


def _structure_problem(out: Any, base: Any) -> str | None:
    """Why the candidate's outputs are not shaped like the baseline's (count, tensor or not, shape, dtype),
    or None. A non-tensor where the baseline returns a tensor (None, a list) has nothing to compare."""
    import torch

    outs, bases = _outputs(out), _outputs(base)
    if len(outs) != len(bases):
        return f"{len(outs)} output(s), the baseline returns {len(bases)}"
    for i, (o, b) in enumerate(zip(outs, bases)):
        if not torch.is_tensor(b):
            continue
        if not torch.is_tensor(o):
            return f"output {i} is {type(o).__name__}, not a tensor like the baseline's"
        if tuple(o.shape) != tuple(b.shape) or o.dtype != b.dtype:
            return f"output {i} is {o.dtype} {tuple(o.shape)}, the baseline's {b.dtype} {tuple(b.shape)}"
    return None


def _same(a: Any, b: Any) -> bool:
    import torch

    if torch.is_tensor(a) and torch.is_tensor(b):
        return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a.view(torch.uint8) if a.numel() else a,
                                                                              b.view(torch.uint8) if b.numel() else b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _where(tb: str) -> str:
    """The last source line a traceback names (where the candidate raised), as `` (at: ...)``."""
    lines = [ln.strip() for ln in tb.strip().splitlines()[:-1] if ln.strip() and set(ln.strip()) - {"^", "~"}]
    code = [ln for ln in lines if not ln.startswith(("File ", "Traceback"))]
    return f" (at: {code[-1][:200]})" if code else ""


def input_problems(after: dict, before: dict, buffers: dict) -> list[str]:
    """Read-only inputs (every input but the output buffers) that are not bit-identical after the call."""
    if not isinstance(after, dict) or not isinstance(before, dict):
        return [] if _same(after, before) else ["the inputs changed during the call (they must be left as they were)"]
    changed = [k for k in before if k not in buffers and not _same(after.get(k), before[k])]
    return [f"the read-only input(s) {', '.join(changed)} changed during the call (they must come back bit-identical)"] if changed else []


def buffer_problems(out: Any, after: dict, before: dict, ref: Any, buffers: dict, tol: list[float], poison: str) -> list[str]:
    """An output buffer compared as an output: after the call it must hold the result it stands for
    (within tolerance, where the reference computes a value), and every element the reference leaves as
    handed in (padding, rows past ``masked_m``: the poison) must come back bit for bit, in the buffer and
    in the returned result."""
    import torch

    from kernels.measure import compare

    why: list[str] = []
    refs, outs = _outputs(ref), _outputs(out)
    for name, idx in buffers.items():
        b0, b1 = before.get(name), after.get(name) if isinstance(after, dict) else None
        if not (torch.is_tensor(b0) and torch.is_tensor(b1)) or idx >= len(refs) or not torch.is_tensor(refs[idx]):
            continue
        r = refs[idx].detach().to("cpu", torch.float64)
        p = b0.detach().to("cpu", torch.float64)
        if r.shape != p.shape or b1.shape != b0.shape:
            why.append(f"the output buffer {name} is {tuple(b1.shape)}, the reference {tuple(r.shape)}")
            continue
        untouched = (r == p) | (torch.isnan(r) & torch.isnan(p))
        res = compare(b1[~untouched], r[~untouched], *tol)
        if not res["ok"]:
            why.append(f"the output buffer {name} does not hold the result after the call: {res['sample'][:200]}")
        for what, t in (("buffer " + name, b1), (f"result {idx}", outs[idx] if idx < len(outs) else None)):
            if not torch.is_tensor(t) or t.shape != b0.shape or t.dtype != b0.dtype:
                continue
            kept = _bits(t)[untouched] == _bits(b0)[untouched]
            if not bool(kept.all()):
                n = int((~kept).sum())
                why.append(f"the {what}: {n} of {int(untouched.sum())} elements a correct kernel leaves untouched "
                           f"(padding, rows past the valid count; poisoned with {poison}) were written")
    return why


def _bits(t: Any) -> Any:
    import torch

    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    return t.detach().cpu().contiguous().view(ints[t.element_size()])


class _Tally:
    """Correctness and precision over every case of one candidate (or of the baseline)."""

    def __init__(self, family: Any, dtype: str):
        self.family, self.dtype = family, dtype
        self.max_abs = self.max_rel = 0.0
        self.nan_inf = False
        self.mismatches = 0
        self.samples: list[str] = []
        self.atols: list[float] = []
        self.rtols: list[float] = []
        self.frac_max = 0.0
        self.frac_sq = 0.0
        self.frac_n = 0
        self.worst = ""
        self.worst_frac = -1.0
        self.shapes: list[str] = []

    def add(self, label: str, out: Any, ref: Any, tol: list[float]) -> None:
        import torch

        from kernels.measure import compare

        atol, rtol = tol
        self.atols.append(atol)
        self.rtols.append(rtol)
        if label.split(" ")[0] not in self.shapes:
            self.shapes.append(label.split(" ")[0])
        outs, refs = _outputs(out), _outputs(ref)
        if len(outs) != len(refs):
            self.mismatches += 1
            self.samples.append(f"[{label}] {len(outs)} output(s), reference has {len(refs)}")
            return
        for i, (o, r) in enumerate(zip(outs, refs)):
            if torch.is_tensor(r) and not torch.is_tensor(o):
                self.mismatches += 1
                self.samples.append(f"[{label}] output {i} is {type(o).__name__}, not a tensor")
                continue
            if not (torch.is_tensor(o) and torch.is_tensor(r)):
                continue
            res = compare(o, r, atol, rtol)
            self.max_abs = max(self.max_abs, res["max_abs"])
            self.max_rel = max(self.max_rel, res["max_rel"])
            self.nan_inf |= res["nan_inf"]
            if res["mismatches"]:
                self.mismatches += max(res["mismatches"], 1)
                which = f" output {i}" if len(outs) > 1 else ""
                self.samples.append(f"[{label}{which}] {res['sample']}")
            mx, sq, n = _error_fractions(o, r, atol, rtol)
            self.frac_max = max(self.frac_max, mx)
            self.frac_sq += sq
            self.frac_n += n
            if mx > self.worst_frac:
                self.worst_frac, self.worst = mx, label

    def problem(self, text: str) -> None:
        self.mismatches += 1
        self.samples.append(text)

    @property
    def rms(self) -> float:
        return math.sqrt(self.frac_sq / self.frac_n) if self.frac_n else 0.0

    def correctness(self) -> Any:
        from kregress.core.records import Correctness

        return Correctness(ok=self.mismatches == 0 and not self.nan_inf, max_abs_err=self.max_abs, max_rel_err=self.max_rel,
                           nan_inf=self.nan_inf, mismatches=self.mismatches,
                           tolerance=max(self.atols + self.rtols) if self.atols else 0.0,
                           shapes_checked=self.shapes, mismatch_sample=" | ".join(self.samples)[:1200],
                           atol=max(self.atols) if self.atols else None, rtol=max(self.rtols) if self.rtols else None,
                           dtype=self.dtype)


def _row(s: Any, backend: str) -> Any:
    from kregress.core.records import VariantResult

    return VariantResult(
        variant_id=s.variant_id, round=s.round, source=s.source, config=s.config, config_hash=s.config_hash,
        patch_summary=s.patch_summary, expected_effect=s.expected_effect, risk=s.risk, parent=s.parent,
        backend=backend, patch=s.patch, patch_sha256=s.patch_sha256, expected_speedup=s.expected_speedup,
        expected_speedup_low=s.expected_speedup_low, expected_speedup_high=s.expected_speedup_high,
        bottleneck=s.bottleneck,
    )


@dataclass
class JudgeOptions:
    """How the gate runs. ``static`` False skips the static policy: only tests use it, to show that the
    run-time layers catch a cheat on their own."""

    seed: int | None = None  # the secret; None draws one
    static: bool = True
    isolate_network: bool = True
    mem_bytes: int | None = 16 << 30  # address-space limit of a CPU child (None on a GPU host)
    max_changed_lines: int = 60
    precision_factor: float = 4.0
    plausibility_factor: float = 2.0
    seeds: int = 3
    keep_dirs: bool = False

    @classmethod
    def for_spec(cls, spec: Any, **kw: Any) -> "JudgeOptions":
        p = spec.patches
        return cls(max_changed_lines=p.max_changed_lines, precision_factor=p.precision_factor,
                   plausibility_factor=p.plausibility_factor, seeds=p.seeds, **kw)


_MODULE_NAMES: dict[str, str | None] = {}


def module_resolver() -> Callable[[str], str | None]:
    """For the static gate: the name of the module a dotted name under torch, triton or math really is
    (``triton.language.core.builtins`` -> ``builtins``), None when it is no module. Asks the module
    objects of this (the judging) process, so a re-export a later Triton adds is found too; no
    candidate code is involved, only the names the candidate wrote."""
    import importlib
    import types

    def resolve(name: str) -> str | None:
        if name in _MODULE_NAMES:
            return _MODULE_NAMES[name]
        parts = name.split(".")
        out = None
        if parts[0] in ("torch", "triton", "math") and not any(p.startswith("_") or not p.isidentifier() for p in parts):
            try:
                obj: Any = importlib.import_module(parts[0])
                for p in parts[1:]:
                    obj = getattr(obj, p)
                out = obj.__name__ if isinstance(obj, types.ModuleType) else None
            except Exception:  # noqa: BLE001 - no such attribute (or one that fails): not a module
                out = None
        _MODULE_NAMES[name] = out
        return out

    return resolve


def static_stage(family: Any, es: EditableSet, texts: dict[str, str], base_hash: str, s: Any,
                 opts: JudgeOptions) -> Candidate:
    """Parse, apply (with the revert checked), region and static policy: the judgement of a patch that
    needs no process. ``error`` is patch_failed (does not apply) or patch_rejected (refused)."""
    from kregress.core.records import patch_sha256

    rep = GateReport(patch_sha256=patch_sha256(s.patch), base_hash=base_hash, precision_factor=opts.precision_factor,
                     plausibility_factor=opts.plausibility_factor)
    cand = Candidate(index=-1, suggestion=s, report=rep)
    try:
        patch = parse_patch(s.patch)
    except (NotAPatch, PatchFormatError) as exc:
        cand.error, cand.detail = "patch_failed", f"not a usable diff: {exc}"
        return cand
    rep.changed_lines = patch.changed_lines
    region = check_region(es, patch, texts, {}, opts.max_changed_lines)  # files, statuses and size, before applying
    if region:
        rep.findings = region
        cand.error, cand.detail = "patch_rejected", "; ".join(f.text() for f in region)[:1500]
        return cand
    try:
        applied = apply_and_check(patch, texts)
    except PatchApplyError as exc:
        cand.error, cand.detail = "patch_failed", f"does not apply to the kernel source {base_hash}: {exc}"
        return cand
    rep.round_trip_ok = applied.round_trip_ok
    new_texts = {**texts, **applied.new_texts}
    rep.patched_hash = source_snapshot_hash(family.name, new_texts)
    findings = check_region(es, patch, texts, new_texts, opts.max_changed_lines)
    if opts.static:
        findings += static_gate(es.wrappers, [f for f in patch.files if f.path in es.files], texts, new_texts,
                                module_resolver())
    rep.findings = findings
    if findings:
        cand.error, cand.detail = "patch_rejected", "; ".join(f.text() for f in findings)[:1500]
        return cand
    cand.new_texts = new_texts
    return cand


def judge_patches(spec: Any, family: Any, suggestions: list[Any], *, backend: str, cache_root: Path,
                  timeout_s: float, log: Callable[[str], None] = print, options: JudgeOptions | None = None,
                  workers: int = 0) -> list[tuple[Any, GateReport]]:
    """Rows (``VariantResult``) and gate reports for patch suggestions, in order. ``backend`` is
    ``interpreter`` (CPU: correctness in the Triton interpreter, latency from the family's model) or
    ``cuda`` (correctness and timing on the GPU, the baseline re-timed in the same batch). ``workers``:
    candidates judged at once (0: one per CPU core, at most 4, on the interpreter; always 1 on a GPU)."""
    opts = options or JudgeOptions.for_spec(spec)
    t_all = time.perf_counter()
    es = editable_set(family)
    texts = read_sources(es)
    base_hash = source_snapshot_hash(family.name, texts)
    out: list[tuple[Any, GateReport]] = []
    live: list[tuple[int, Candidate]] = []
    for i, s in enumerate(suggestions):
        row = _row(s, backend)
        row.patch_base_hash = base_hash
        problem = family.space.check(s.config, spec.params, spec.hardware.limits)
        if problem:
            row.error, row.error_detail = "invalid_config", problem
            out.append((row, GateReport(base_hash=base_hash, patch_sha256=row.patch_sha256)))
            continue
        cand = static_stage(family, es, texts, base_hash, s, opts)
        if cand.error:
            row.error, row.error_detail = cand.error, cand.detail
        else:
            live.append((i, cand))
        out.append((row, cand.report))
    if live:
        work = Path(tempfile.mkdtemp(prefix="kregress-judge-"))
        try:
            _Judgement(spec, family, es, texts, backend, cache_root, timeout_s, log, opts, work).run(live, out, workers)
        finally:
            if not opts.keep_dirs:
                shutil.rmtree(work, ignore_errors=True)
    log(f"judged {len(suggestions)} patch(es) in {time.perf_counter() - t_all:.1f}s")
    return out


class _Judgement:
    """One judgement's processes and secret cases: the zygote, the reference child, the candidates."""

    def __init__(self, spec, family, es, texts, backend, cache_root, timeout_s, log, opts, work):
        import kregress
        from kregress.core.paths import REPO_ROOT

        self.spec, self.family, self.es, self.texts = spec, family, es, texts
        self.on_gpu = backend == "cuda"
        self.device = "cuda" if self.on_gpu else "cpu"
        self.cache_root, self.timeout_s, self.log, self.opts, self.work = Path(cache_root), timeout_s, log, opts, work
        kregress_root = str(Path(kregress.__file__).resolve().parents[1])
        self.env = _sandbox.sandbox_env(interpret=not self.on_gpu, pythonpath=[str(REPO_ROOT), kregress_root])
        self.limits = {"cpu_s": max(60.0, 4 * timeout_s), "mem_bytes": None if self.on_gpu else opts.mem_bytes,
                       "fsize_bytes": 1 << 30}
        self.purge = sorted(set(es.packages()) | ({Path(es.module_file).stem} if len(Path(es.module_file).parts) == 1 else set()))
        self.tools = _sandbox.compiler_tools()

    def child_spec(self, root: Path, name: str, interpret: bool) -> dict:
        d = self.work / name
        d.mkdir(parents=True, exist_ok=True)
        return {"root": str(root), "work": str(d), "interpret": interpret,
                "watch": [str(root / rel) for rel in self.es.files],
                "watch_wrappers": {str(root / rel): list(self.es.wrappers.get(rel, ())) for rel in self.es.files},
                "family": self.family.lookup or self.family.name, "params": self.spec.params, "purge": self.purge,
                "limits": self.limits, "exec_allowed": self.tools, "allow_ctypes": self.on_gpu,
                "isolate_network": self.opts.isolate_network, "sandbox": True}

    def run(self, live: list[tuple[int, Candidate]], out: list, workers: int) -> None:
        import random
        from concurrent.futures import ThreadPoolExecutor

        spec, opts = self.spec, self.opts
        secret = opts.seed if opts.seed is not None else secrets.randbits(62)
        self.secret = secret
        rng = random.Random(secret)
        seeds = [rng.randrange(1, 2**62) for _ in range(max(3, opts.seeds))]
        self.decoy_seed = rng.randrange(1, 2**31)
        groups = shape_groups(self.family, spec.correctness_shapes, spec.shape_matrix, self.on_gpu, rng, seeds, spec.params)
        self.log(f"judging {len(live)} patch(es) in sandboxed children ({'cuda' if self.on_gpu else 'interpreter'}); "
                 f"{len(groups)} case group(s), {len(seeds)} secret seeds, distributions {', '.join(DISTRIBUTIONS)}")
        try:
            with _sandbox.Zygote(self.env, cwd=self.work) as zyg:
                self.zyg = zyg
                for g in groups:  # the baseline runs every program any candidate's sampled run will run
                    if g.get("sample"):
                        g["candidate_seeds"] = [self._sample_seed(g, f"cand{i}") for i, _ in live]
                self._prepare(groups)
                lanes = 1 if self.on_gpu else max(1, min(len(live), workers or min(4, os.cpu_count() or 1)))
                with ThreadPoolExecutor(max_workers=lanes) as pool:
                    list(pool.map(lambda ic: self._one(ic[0], ic[1], *out[ic[0]]), live))
                self.ref.end()
        except _sandbox.ChildFailed as exc:
            for i, _ in live:
                row, _rep = out[i]
                if row.error is None and row.correctness is None:
                    row.error = exc.error if exc.error in ("timeout", "crashed") else "runtime_error"
                    row.error_detail = exc.detail

    def _prepare(self, groups: list[dict]) -> None:
        """The reference child: inputs, float64 reference and baseline outputs of every case."""
        spec = self.spec
        pristine = materialize(self.es, self.texts, self.work / "pristine")
        self.ref = self.zyg.fork(self.child_spec(pristine, "reference", interpret=not self.on_gpu))
        t0 = time.perf_counter()
        head, blobs = self.ref.call({"job": "prepare", "groups": groups, "config": spec.baseline, "params": spec.params,
                                     "correctness": spec.correctness_shapes,
                                     "dtype": spec.dtype, "tolerance": spec.constraints.numeric_tolerance,
                                     "device": self.device, "reference_device": self.device, "keep": self.on_gpu},
                                    timeout=max(self.timeout_s, 60.0) * 4)
        if head.get("error"):
            raise _sandbox.ChildFailed("runtime_error", f"the reference child failed: {head.get('detail')}")
        self.cases = head["cases"]
        self.base_ops = set(head["ops"])
        self.base_op_count = int(head.get("op_count", 0))
        self.base_threads = int(head.get("threads", 0))
        self.dropped = head["dropped"]
        self.data = {c["id"]: _sandbox.unpack(c["payload"], blobs) for c in self.cases}
        self.base_tally = _Tally(self.family, spec.dtype)
        for c in self.cases:
            d = self.data[c["id"]]
            if c.get("sampled"):
                continue  # compared by sampled_problems; the baseline ran only sampled programs of it
            self.base_tally.add(f"{c['label']} {c['dist']}", d["base"], d["ref"], c["tol"])
            if "ref2" in d:
                self.base_tally.add(f"{c['label']} {c['dist2']}", d["base2"], d["ref2"], c["tol"])
        self.log(f"  reference: {len(self.cases)} case group(s) with the float64 reference and the baseline's outputs "
                 f"({time.perf_counter() - t0:.1f}s){'; dropped: ' + '; '.join(self.dropped) if self.dropped else ''}")

    def _one(self, i: int, cand: Candidate, row: Any, rep: GateReport) -> None:
        """Compile (one child) and the cases (another), side by side; then compare and time."""
        from concurrent.futures import ThreadPoolExecutor

        t1 = time.perf_counter()
        cases = self.cases
        rep.cases = sum(2 if "inputs2" in self.data[c["id"]] else 1 for c in cases)
        rep.cases_dropped = list(self.dropped)
        rep.hidden_shapes = [c["label"] for c in cases if c["kind"] in ("odd", "ones", "aligned", "hidden_odd") or c["kind"].startswith("structure")
                             or c["kind"].startswith("stretched")]
        rep.seeds = len({c["seed_index"] for c in cases})
        rep.distributions = sorted({c["dist"] for c in cases} | {c["dist2"] for c in cases if "dist2" in c})
        root = materialize(self.es, cand.new_texts, self.work / f"cand{i}")
        try:
            with ThreadPoolExecutor(max_workers=2) as pool:
                fc = pool.submit(self._compile, row, rep, root, f"cand{i}-compile")
                fr = pool.submit(self._cases, row, rep, root, f"cand{i}")
                compiled, ran = fc.result(), fr.result()
            self._conclude(row, rep, compiled, ran)
        except _sandbox.ChildFailed as exc:
            row.error, row.error_detail = exc.error, exc.detail
        rep.seconds = time.perf_counter() - t1
        self.log(f"  {row.variant_id}: {row.error or 'correct'} ({rep.seconds:.1f}s)")

    def _compile(self, row: Any, rep: GateReport, root: Path, name: str) -> dict:
        """AOT compile of the patched kernels for the spec's arch in a child (no interpreter), cached by
        the patched kernel hash: {"stats"} or {"error", "detail"}, with the child's violations."""
        import json

        from kernels.compile import cache_key
        from kregress.core.records import variant_hash

        spec, hw = self.spec, self.spec.hardware
        key = cache_key(self.family.name, rep.patched_hash, variant_hash(row.config, row.patch), spec.dtype, hw.arch,
                        spec.params)
        cfile = self.cache_root / "compile" / f"{key}.json"
        try:
            hit = json.loads(cfile.read_text())
            hit["notes"] = hit.get("notes", []) + ["compile: from the cache"]
            return hit
        except (OSError, ValueError):
            pass
        t0 = time.perf_counter()
        try:
            comp = self.zyg.fork(self.child_spec(root, name, interpret=False))
        except _sandbox.ChildFailed as exc:
            return {"error": "compile_failed" if exc.error == "compile_failed" else exc.error, "detail": exc.detail}
        try:
            head, _ = comp.call({"job": "compile", "config": row.config, "params": spec.params, "dtype": spec.dtype,
                                 "arch": hw.arch, "limits": hw.limits.model_dump(), "shapes": spec.shape_matrix,
                                 "fallback_shapes": spec.correctness_shapes}, timeout=self.timeout_s)
        except _sandbox.ChildFailed as exc:
            head = {"error": exc.error if exc.error == "timeout" else "compile_failed", "detail": exc.detail}
        finally:
            comp.end()
        violations = comp.hello.get("violations", []) + head.get("violations", [])
        if head.get("error") not in (None, "compile_failed", "out_of_resources", "timeout"):
            head["error"] = "compile_failed"  # anything that stops the compile (an exception in the wrapper, say)
        res = {k: head[k] for k in ("stats", "error", "detail", "notes") if k in head}
        res["notes"] = res.get("notes", []) + [f"compile {time.perf_counter() - t0:.1f}s"]
        if violations:
            res["violations"] = violations
        elif "stats" in res or res.get("error") in ("compile_failed", "out_of_resources"):
            cfile.parent.mkdir(parents=True, exist_ok=True)
            tmp = cfile.with_suffix(f".tmp{os.getpid()}-{threading.get_ident()}")
            tmp.write_text(json.dumps({k: v for k, v in res.items() if k != "notes"} | {"notes": res["notes"][:-1]}))
            tmp.replace(cfile)
        return res

    def _cases(self, row: Any, rep: GateReport, root: Path, name: str) -> dict:
        """The secret cases in a sandboxed child of the patched copy: outputs, inputs after each call, ops."""
        blobs: list[bytes] = []
        job_cases = []
        for c in self.cases:
            d = self.data[c["id"]]
            payload = {"inputs": d["inputs"]}
            if "inputs2" in d:
                payload["inputs2"] = d["inputs2"]
            job_cases.append({"id": c["id"], "payload": _sandbox.pack(payload, blobs), "keep": c["kind"] == "timed",
                              "decoy_seed": self.decoy_seed + len(job_cases),
                              "params": c.get("params", {}),
                              **({"sample": self._sample_seed(c, name)} if c.get("sampled") else {})})
        t0 = time.perf_counter()
        try:
            child = self.zyg.fork(self.child_spec(root, name, interpret=not self.on_gpu))
        except _sandbox.ChildFailed as exc:
            return {"error": exc.error, "detail": exc.detail}
        try:
            head, rblobs = child.call({"job": "run", "cases": job_cases, "config": row.config, "params": self.spec.params,
                                       "device": self.device}, blobs, timeout=self.timeout_s)
        except _sandbox.ChildFailed as exc:
            child.end()
            return {"error": exc.error, "detail": exc.detail, "violations": child.hello.get("violations", [])}
        head["violations"] = child.hello.get("violations", []) + head.get("violations", [])
        head["seconds"] = time.perf_counter() - t0
        if (self.on_gpu or any(c.get("sampled") for c in self.cases)) and not head.get("error"):
            head["child"] = child  # kept for the timing loop, or a full run of a sampled case
        else:
            child.end()
        return {"head": head, "blobs": rblobs}

    def _conclude(self, row: Any, rep: GateReport, compiled: dict, ran: dict) -> None:
        """The gate's order: sandbox refusals (rejected), compile (infeasible), correctness (wrong),
        then precision metrics and latency."""
        from kernels.measure import model_measurements
        from kregress.core.records import CompileStats

        spec = self.spec
        rep.notes += compiled.get("notes", [])
        rep.runtime_violations += compiled.get("violations", [])
        head = ran.get("head") or {}
        rep.runtime_violations += head.get("violations", []) + ran.get("violations", [])
        child = head.pop("child", None)
        try:
            if head.get("threads") and self.base_threads == 0:
                rep.runtime_violations.append(f"the call started {head['threads']} Python thread(s); the baseline starts none")
            extra = sorted(set(head.get("ops", [])) - self.base_ops - HARMLESS_OPS)
            host = [op for op in extra if op in HOST_DATA_OPS]
            if host:
                rep.runtime_violations.append(f"the call ran aten.{', aten.'.join(host)}, which the baseline never runs: "
                                              "it reads tensor values into Python (float(t), bool(t), .item()) or builds "
                                              "tensors from Python data (host-side compute or value sniffing)")
            extra = [op for op in extra if op not in HOST_DATA_OPS]
            if extra:
                rep.runtime_violations.append(f"the call ran aten.{', aten.'.join(extra[:8])}, which the baseline never "
                                              "runs: torch computes instead of the kernel")
            limit = OP_COUNT_FACTOR * self.base_op_count + OP_COUNT_MARGIN
            if int(head.get("op_count", 0)) > limit:
                rep.runtime_violations.append(f"a call ran {head['op_count']} aten ops, the baseline's at most "
                                              f"{self.base_op_count} (limit {limit}): host-side work per element")
            if rep.runtime_violations:
                row.error, row.error_detail = "patch_rejected", "sandbox: " + "; ".join(rep.runtime_violations)[:1200]
                return
            if "stats" not in compiled:
                row.error, row.error_detail = compiled.get("error", "compile_failed"), compiled.get("detail", "")
                return
            row.compile = CompileStats(**compiled["stats"])
            if "head" not in ran:
                row.error, row.error_detail = ran.get("error", "crashed"), ran.get("detail", "")
                return
            if head.get("error"):
                row.error, row.error_detail = "runtime_error", head.get("detail", "")
                return
            crashes = self._compare(row, rep, head, ran["blobs"], child)
            rep.notes.append(f"cases {head.get('seconds', 0.0):.1f}s")
            if crashes:  # the candidate raised where the baseline ran: a crash, said as one
                row.error, row.error_detail = "crashed", "; ".join(crashes)[:600]
                return
            if not row.correctness.ok:
                row.error = "nan_inf" if row.correctness.nan_inf else "numeric_mismatch"
                row.error_detail = row.correctness.mismatch_sample[:600]
                return
            if not self.on_gpu:
                row.measurements = model_measurements(self.family, row.config, spec.shape_matrix, spec.dtype, spec.params,
                                                      row.compile, spec.hardware)
                row.evidence = "model"
                return
            _time_on_gpu(child, self.ref, row, rep, spec, self.family, self.cases, self.data, _sandbox.pack,
                         self.timeout_s, self.log)
        finally:
            if child is not None:
                child.end()

    def _settle(self, settle: list[tuple[dict, list[str]]], tally: "_Tally", child: Any, config: dict) -> None:
        """A full (unsampled) run of each sampled case whose sampled run left something to settle, in the
        same child, compared element by element: a split-K or persistent design is slow to judge, never
        wrong; a kernel that skips work on the timed shape is wrong."""
        if child is None:
            for c, why in settle:
                tally.problem(f"[{c['label']} sampled] {'; '.join(why)[:300]}")
            return
        blobs: list[bytes] = []
        job_cases = [{"id": c["id"], "payload": _sandbox.pack({"inputs": self.data[c["id"]]["inputs"]}, blobs)} for c, _ in settle]
        budget = max(self.timeout_s, sum(4 * c.get("full_seconds", 0.0) + 30 for c, _ in settle))
        head, rblobs = child.call({"job": "full", "cases": job_cases, "config": config, "params": self.spec.params,
                                   "device": self.device}, blobs, timeout=budget)
        if head.get("error"):
            raise _sandbox.ChildFailed("runtime_error", f"the full run of a sampled case failed: {head.get('detail')}")
        for res in head.get("results", []):
            c = next(c for c, _ in settle if c["id"] == res["id"])
            if res.get("error"):
                tally.problem(f"[{c['label']}] the call raised {res['error']}")
                continue
            got = _sandbox.unpack(res["payload"], rblobs)
            tally.add(f"{c['label']} {c['dist']} (full run)", got["out"], self.data[c["id"]]["ref"], c["tol"])
            for p in res.get("problems", []):
                tally.problem(f"[{c['label']}] {p}")
        vio = head.get("violations") or []
        if vio:
            tally.problem("sandbox: " + "; ".join(vio)[:300])

    def _sample_seed(self, case: dict, name: str) -> int:
        """The programs a candidate's sampled run executes: drawn from the secret per candidate and case,
        so two patches of one judgement are not sampled alike."""
        import random

        return random.Random(f"{self.secret}:{name}:{case['id']}").randrange(1, 2**31)

    def _compare(self, row: Any, rep: GateReport, head: dict, blobs: list[bytes], child: Any = None) -> list[str]:
        tally = _Tally(self.family, self.spec.dtype)
        prec = _Tally(self.family, self.spec.dtype)
        by_id = {c["id"]: c for c in self.cases}
        settle: list[tuple[dict, list[str]]] = []
        crashes: list[str] = []
        for res in head["results"]:
            c = by_id[res["id"]]
            d = self.data[c["id"]]
            if res.get("error"):
                tally.problem(f"[{c['label']}] the call raised {res['error']}")
                crashes.append(f"[{c['label']}] the call raised {res['error']}{_where(res.get('traceback', ''))}")
                continue
            got = _sandbox.unpack(res["payload"], blobs)
            for p in res.get("problems", []):
                tally.problem(f"[{c['label']}] {p}")
            buffers = c.get("buffers") or {}
            if c.get("sampled"):
                for why in input_problems(got["after"], d["inputs"], buffers):
                    tally.problem(f"[{c['label']}] {why}")
                st = res.get("sampled") or {}
                why = (sampled_problems(got["out"], d["ref"], st, *c["tol"], base=c.get("base_writes"))
                       if st else ["no sampling statistics"])
                rep.notes.append(f"sampled {c['label']}: {st.get('programs', 0)} of {st.get('grid', 0)} programs"
                                 + (f"; to settle: {'; '.join(why)[:300]}" if why else ""))
                if why:
                    settle.append((c, why))
                continue
            for key, base_key in (("out", "base"), ("out2", "base2")):
                why = _structure_problem(got.get(key), d.get(base_key)) if key in got else None
                if why:
                    tally.problem(f"[{c['label']}] {why}")
            tally.add(f"{c['label']} {c['dist']}", got["out"], d["ref"], c["tol"])
            prec.add(f"{c['label']} {c['dist']}", got["out"], d["ref"], c["tol"])
            for why in input_problems(got["after"], d["inputs"], buffers):
                tally.problem(f"[{c['label']}] {why}")
            for why in buffer_problems(got["out"], got["after"], d["inputs"], d["ref"], buffers, c["tol"], "NaN"):
                tally.problem(f"[{c['label']}] {why}")
            if "out2" in got:
                tally.add(f"{c['label']} {c['dist2']} (2nd call, same buffers)", got["out2"], d["ref2"], c["tol"])
                prec.add(f"{c['label']} {c['dist2']}", got["out2"], d["ref2"], c["tol"])
                for why in input_problems(got["after2"], d["inputs2"], buffers):
                    tally.problem(f"[{c['label']}] second call: {why}")
                for why in buffer_problems(got["out2"], got["after2"], d["inputs2"], d["ref2"], buffers, c["tol"],
                                           "random values"):
                    tally.problem(f"[{c['label']}] second call: {why}")
        if settle:
            self._settle(settle, tally, child, row.config)
        row.correctness = tally.correctness()
        rep.precision = PrecisionMetrics(candidate_max=prec.frac_max, baseline_max=self.base_tally.frac_max,
                                         candidate_rms=prec.rms, baseline_rms=self.base_tally.rms, worst_case=prec.worst)
        return crashes


def _time_on_gpu(child, ref, row, rep, spec, family, cases, data, pack, timeout_s, log) -> None:
    """The candidate and the baseline timed on each timed shape, slot by slot (baseline, candidate,
    baseline, ...) in their own processes on the same GPU, then correctness again after the loop."""
    import uuid

    from kernels.measure import measurement_from_samples, measurement_identity
    from kernels.sandbox import unpack

    rounds = 4
    slot_ms = max(1, spec.benchmark.rep_ms // rounds)
    warm = max(1, spec.benchmark.warmup_ms // rounds)
    batch_id = f"{spec.task_id}/judge/{uuid.uuid4().hex[:8]}"
    timed = [c for c in cases if c["kind"] == "timed"]
    cand_ms, base_ms = [], []
    for c in timed:
        samples = {"base": [], "cand": []}
        idents = []
        for _ in range(rounds):
            for who, proc, cfg in (("base", ref, spec.baseline), ("cand", child, row.config)):
                head, _ = proc.call({"job": "bench", "case": c["id"], "config": cfg, "params": spec.params,
                                     "rep_ms": slot_ms, "warmup_ms": warm}, timeout=timeout_s)
                if head.get("error"):
                    raise_from = f"{who}: {head.get('detail', '')}"
                    row.error, row.error_detail = "runtime_error", f"timing failed ({raise_from})"[:600]
                    return
                if who == "cand" and head.get("violations"):
                    rep.runtime_violations += head["violations"]
                samples[who] += head["samples"]
                idents.append(head["identity"])
        ident = measurement_identity(idents[0], idents[-1])
        shape = c["shape"]
        cand_ms.append(measurement_from_samples(family, shape, samples["cand"], spec.dtype, spec.params, "cuda",
                                                idents[0].get("gpu_name", ""), identity=ident, batch=batch_id))
        base_ms.append(measurement_from_samples(family, shape, samples["base"], spec.dtype, spec.params, "cuda",
                                                idents[0].get("gpu_name", ""), identity=ident, batch=batch_id))
    if rep.runtime_violations:
        row.error, row.error_detail = "patch_rejected", "sandbox: " + "; ".join(rep.runtime_violations)[:1200]
        return
    # correctness again after the timing loop, on the second values in the same buffers
    blobs: list[bytes] = []
    job_cases = [{"id": c["id"], "payload": pack({"inputs": data[c["id"]]["inputs2"]}, blobs)} for c in timed
                 if "inputs2" in data[c["id"]]]
    if job_cases:
        head, rblobs = child.call({"job": "recheck", "cases": job_cases, "config": row.config, "params": spec.params,
                                   "device": "cuda"}, blobs, timeout=timeout_s)
        tally = _Tally(family, spec.dtype)
        by_id = {c["id"]: c for c in timed}
        for res in head.get("results", []):
            c = by_id[res["id"]]
            got = unpack(res["payload"], rblobs)
            tally.add(f"{c['label']} after timing", got["out"], data[c["id"]]["ref2"], c["tol"])
            for p in res.get("problems", []):
                tally.problem(f"[{c['label']}] after timing: {p}")
        if not tally.correctness().ok:
            row.error, row.error_detail = "numeric_mismatch", ("after the timing loop: " + tally.correctness().mismatch_sample)[:600]
            return
    row.measurements = cand_ms
    row.batch_baseline = base_ms
    row.evidence = "cuda"
