"""The family conformance kit: the checks every built-in family passes, for any family.

``kregress family check NAME`` prints one line per check; a plugin's own pytest calls the same checks::

    from kregress.conformance import run_checks, assert_conforms

    def test_my_family_conforms():
        assert_conforms("my_family", spec_path="specs/my_family.yaml")

Checks (each returns ``Check(name, status, detail, fix)``, status PASS / FAIL / SKIP):

- ``space``: the space is enumerable under the spec's hardware limits and the baseline is inside it;
- ``shapes``: every timed and correctness shape and the params pass the family's own checks;
- ``reference``: the reference returns float64, finite, on a correctness shape;
- ``formulas``: FLOP and byte counts are positive, finite and grow (never shrink) with every dimension;
- ``tolerance``: (atol, rtol) positive and growing with the reduction length, never shrinking with a dimension;
- ``kernel_vs_reference``: the smallest and the largest tile of the space match the reference on the
  spec's correctness shapes, in the Triton interpreter (an external kernel: on the CPU where its op runs);
- ``compile``: the compile units compile ahead of time for the spec's arch and report registers and
  shared memory (an external kernel has no compile units: SKIP, with the reason).

A recorded family (replay) has no kernel to run: the kernel checks SKIP and say so. This module runs
kernels in child processes (``resources.workers``), so it belongs to the application layer, not core.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from kregress.core.family import Family, get_family
from kregress.core.records import config_label
from kregress.core.spec import SpecError, TaskSpec, load_spec

ENUMERATE_CAP = 200_000


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # PASS, FAIL or SKIP
    detail: str
    fix: str = ""

    @property
    def ok(self) -> bool:
        return self.status != "FAIL"

    def line(self) -> str:
        return f"{self.status:<4} {self.name}: {self.detail}" + (f". Fix: {self.fix}" if self.fix and not self.ok else "")


class ConformanceError(AssertionError):
    pass


def default_spec_path(family: Family) -> Path | None:
    """``specs/<name>.yaml`` beside the family's package (the scaffold's layout), else None."""
    files = family.source_files()
    for f in files[:1]:
        for parent in list(f.parents)[:3]:
            cand = parent / "specs" / f"{family.name}.yaml"
            if cand.is_file():
                return cand
    return None


def _tiles(family: Family, spec: TaskSpec) -> list[dict[str, int]]:
    """The smallest and the largest tile (product of the BLOCK_* values, else of every value)."""
    keys = [k for k in family.space.params if k.upper().startswith("BLOCK")] or list(family.space.params)
    best: dict[str, tuple[int, dict]] = {}
    for n, cfg in enumerate(family.space.enumerate(spec.params, spec.hardware.limits)):
        if n >= ENUMERATE_CAP:
            break
        size = math.prod(cfg[k] for k in keys)
        if "min" not in best or size < best["min"][0]:
            best["min"] = (size, cfg)
        if "max" not in best or size > best["max"][0]:
            best["max"] = (size, cfg)
    out = [best["min"][1]] if best else []
    if best and best["max"][1] != best["min"][1]:
        out.append(best["max"][1])
    return out


def check_space(family: Family, spec: TaskSpec) -> Check:
    count = 0
    for count, _ in enumerate(family.space.enumerate(spec.params, spec.hardware.limits), 1):
        if count >= ENUMERATE_CAP:
            break
    if count == 0:
        return Check("space", "FAIL", "no configuration satisfies the rules under the spec's hardware limits",
                     "loosen a rule or add values to the space")
    problem = family.space.check(spec.baseline, spec.params, spec.hardware.limits)
    if problem:
        return Check("space", "FAIL", f"baseline {spec.baseline} is outside the space: {problem}",
                     "pick a baseline inside the space (kregress family check prints the space's size)")
    more = "+" if count >= ENUMERATE_CAP else ""
    return Check("space", "PASS", f"{count:,}{more} valid configurations; the baseline is inside")


def check_shapes(family: Family, spec: TaskSpec) -> Check:
    problems = [f"{field}.{i}: {p}" for field in ("shape_matrix", "correctness_shapes")
                for i, shape in enumerate(getattr(spec, field)) if (p := family.check_shape(shape))]
    if (p := family.check_params(spec.params)):
        problems.append(f"params: {p}")
    if problems:
        return Check("shapes", "FAIL", "; ".join(problems)[:400], "fix the spec's shapes/params or the family's check_shape")
    return Check("shapes", "PASS", f"{len(spec.shape_matrix)} timed and {len(spec.correctness_shapes)} correctness shape(s) valid")


def check_reference(family: Family, spec: TaskSpec) -> Check:
    if family.recorded:
        return Check("reference", "SKIP", "recorded family: the runs were validated when they were recorded")
    import torch

    from kernels.measure import TORCH_DTYPES

    shape = spec.correctness_shapes[0]
    try:
        inputs = family.make_inputs(shape, TORCH_DTYPES[spec.dtype], "cpu", 0, spec.params)
        ref = family.reference(inputs, spec.params)
    except Exception as exc:  # a family bug is a finding, not a crash of the kit
        return Check("reference", "FAIL", f"make_inputs/reference raised {type(exc).__name__}: {str(exc)[:200]}",
                     "make make_inputs(shape, dtype, 'cpu', seed, params) and reference(inputs, params) run on the CPU")
    outs = list(ref) if isinstance(ref, (tuple, list)) else [ref]
    bad = [str(t.dtype) for t in outs if not torch.is_tensor(t) or t.dtype != torch.float64]
    if bad:
        return Check("reference", "FAIL", f"reference returns {', '.join(bad)}, not float64",
                     "compute the reference in float64 (inputs.double())")
    if not all(bool(torch.isfinite(t).all()) for t in outs):
        return Check("reference", "FAIL", "reference has NaN/Inf on a correctness shape", "check the reference's math")
    return Check("reference", "PASS", f"float64 on {family.shape_label(shape)}")


def _scaled(shape: dict, key: str, factor: int = 64) -> dict:
    return {**shape, key: shape[key] * factor}


def check_formulas(family: Family, spec: TaskSpec) -> Check:
    from kernels.measure import DTYPE_BYTES

    if family.recorded:  # one recorded problem: nothing to scale, FLOPs from the recorded GFLOP/s
        return Check("formulas", "SKIP", "recorded family: the file records one problem and no byte count")
    nbytes = DTYPE_BYTES.get(spec.dtype, 2)
    for shape in spec.shape_matrix:
        f, b = family.flops(shape, spec.params), family.bytes_moved(shape, nbytes, spec.params)
        if not (f > 0 and b > 0 and math.isfinite(f) and math.isfinite(b)):
            return Check("formulas", "FAIL", f"flops={f} bytes={b} on {family.shape_label(shape)}",
                         "return positive, finite FLOP and byte counts")
    shape = spec.shape_matrix[0]
    f0, b0 = family.flops(shape, spec.params), family.bytes_moved(shape, nbytes, spec.params)
    grew = False
    for key in family.shape_keys:
        s2 = _scaled(shape, key, 2)  # the formulas hold for any shape, recorded or not
        f2, b2 = family.flops(s2, spec.params), family.bytes_moved(s2, nbytes, spec.params)
        if f2 < f0 or b2 < b0:
            return Check("formulas", "FAIL", f"doubling {key} lowers flops ({f0:.3g} -> {f2:.3g}) or bytes ({b0:.3g} -> {b2:.3g})",
                         "FLOPs and bytes must not shrink when a dimension grows")
        grew |= f2 > f0
    if not grew:
        return Check("formulas", "FAIL", "FLOPs do not grow with any dimension", "count the work the kernel does per shape")
    return Check("formulas", "PASS", f"{f0 / b0:.2f} FLOP/byte on {family.shape_label(shape)}; grow with the shape")


def check_tolerance(family: Family, spec: TaskSpec) -> Check:
    if family.recorded:
        return Check("tolerance", "SKIP", "recorded family: nothing is compared with a reference")
    base = spec.constraints.numeric_tolerance
    shape = spec.correctness_shapes[0]
    a0, r0 = family.tolerance(shape, spec.dtype, base, spec.params)
    if not (a0 > 0 and r0 > 0 and math.isfinite(a0) and math.isfinite(r0)):
        return Check("tolerance", "FAIL", f"tolerance {a0, r0} on {family.shape_label(shape)}", "return positive (atol, rtol)")
    grows = []
    for key in family.shape_keys:
        s2 = _scaled(shape, key)
        a2, r2 = family.tolerance(s2, spec.dtype, base, spec.params)
        if a2 < a0 or r2 < r0:
            return Check("tolerance", "FAIL", f"tolerance shrinks when {key} grows ({a0:.3g} -> {a2:.3g})",
                         "a longer reduction accumulates more rounding: never tighten with size")
        if a2 > a0 or r2 > r0:
            grows.append(key)
    if not grows:
        return Check("tolerance", "FAIL", "tolerance does not grow with any dimension (the reduction length)",
                     "scale atol with the reduction length, e.g. base * sqrt(K / 128)")
    return Check("tolerance", "PASS", f"atol {a0:.3g}, rtol {r0:.3g}; grows with {', '.join(grows)}")


def _run_jobs(jobs: list[dict], interpret: bool, timeout: float) -> list[dict]:
    import tempfile

    from resources.workers import WorkerPool, worker_env

    with tempfile.TemporaryDirectory(prefix="kregress-check-") as cache, \
            WorkerPool(1, worker_env(Path(cache), interpret=interpret)) as pool:
        return pool.run(jobs, timeout)


def check_kernel(family: Family, spec: TaskSpec, timeout: float = 600) -> Check:
    if family.recorded:
        return Check("kernel_vs_reference", "SKIP", "recorded family: no kernel to run")
    if family.external:  # few configs (which library kernel runs): try each where it runs, on the CPU
        tiles = list(family.space.enumerate(spec.params, spec.hardware.limits))[:8]
    else:
        tiles = _tiles(family, spec)
    jobs = [{"op": "correctness", "family": family.lookup or family.name, "config": cfg, "dtype": spec.dtype,
             "shapes": spec.correctness_shapes, "tolerance": spec.constraints.numeric_tolerance,
             "params": spec.params, "device": "cpu", "interpret": not family.external} for cfg in tiles]
    where = "on the CPU (external kernel)" if family.external else "in the Triton interpreter"
    bad, ran, unavailable = [], [], []
    for cfg, res in zip(tiles, _run_jobs(jobs, interpret=not family.external, timeout=timeout)):
        c = res.get("correctness")
        if c is None and family.external:
            unavailable.append(f"{config_label(cfg)} ({' '.join(str(res.get('detail', res.get('error'))).split())[:100]})")
        elif c is None:
            bad.append(f"{config_label(cfg)}: {res.get('error')}: {res.get('detail', '')[:200]}")
        elif not c["ok"]:
            bad.append(f"{config_label(cfg)}: {c['mismatch_sample'][:200]}")
        else:
            ran.append(config_label(cfg))
    if bad:
        return Check("kernel_vs_reference", "FAIL", f"{where}: " + " | ".join(bad),
                     "the kernel and the reference disagree: check masking of ragged edges and the accumulation dtype")
    if not ran:
        return Check("kernel_vs_reference", "SKIP", f"no config runs on this CPU ({'; '.join(unavailable)[:300]}): "
                                                    "it needs the cuda backend or a recorded file")
    more = f"; not runnable here (need the cuda backend): {'; '.join(unavailable)[:300]}" if unavailable else ""
    return Check("kernel_vs_reference", "PASS",
                 f"{', '.join(ran)} match the reference on {len(spec.correctness_shapes)} shape(s) {where}{more}")


def check_compile(family: Family, spec: TaskSpec, timeout: float = 600) -> Check:
    if family.recorded:
        return Check("compile", "SKIP", "recorded family: nothing to compile")
    if family.external:
        return Check("compile", "SKIP", "external kernel: no Triton compile units (registers and shared memory "
                                       "are read from a shipped cubin when the family lists one in source_files)")
    job = {"op": "compile", "family": family.lookup or family.name, "config": spec.baseline, "dtype": spec.dtype,
           "arch": spec.hardware.arch, "limits": spec.hardware.limits.model_dump(), "params": spec.params}
    (res,) = _run_jobs([job], interpret=False, timeout=timeout)
    st = res.get("stats")
    if not st:
        return Check("compile", "FAIL", f"baseline did not compile for {spec.hardware.arch}: {res.get('error')}: "
                                        f"{res.get('detail', '')[:240]}",
                     "compile_units() must return CompileUnits whose signature matches the jit function's arguments")
    if st["regs_per_thread"] <= 0:
        return Check("compile", "FAIL", "compiled but reported no registers", "check the cubin (cuobjdump)")
    return Check("compile", "PASS", f"{spec.hardware.arch}: {st['regs_per_thread']} regs/thread, "
                                    f"{st['smem_bytes']} B shared memory, {st['spill_bytes']} B spills")


CHECKS: tuple[Callable[[Family, TaskSpec], Check], ...] = (
    check_space, check_shapes, check_reference, check_formulas, check_tolerance, check_kernel, check_compile,
)


def run_checks(name: str, spec_path: str | Path | None = None,
               on_check: Callable[[Check], None] | None = None) -> list[Check]:
    """Every check on family ``name`` against its spec (``spec_path``, else ``specs/<name>.yaml`` beside it)."""
    family = get_family(name)
    path = Path(spec_path) if spec_path else default_spec_path(family)
    if path is None:
        return [Check("spec", "FAIL", f"no spec for family {name} (looked for specs/{name}.yaml beside its package)",
                      "pass --spec FILE")]
    try:
        spec = load_spec(path)
    except SpecError as exc:
        return [Check("spec", "FAIL", str(exc).splitlines()[0], "fix the spec (kregress specs validate FILE)")]
    if spec.kernel_family != name and get_family(spec.kernel_family) is not family:
        return [Check("spec", "FAIL", f"{path} is a spec of family {spec.kernel_family}, not {name}", "pass a spec of this family")]
    family = family.for_params(spec.params)  # replay: the recorded file the spec names
    out = [Check("spec", "PASS", str(path))]
    if on_check:
        on_check(out[0])
    for fn in CHECKS:
        c = fn(family, spec)
        out.append(c)
        if on_check:
            on_check(c)
    return out


def assert_conforms(name: str, spec_path: str | Path | None = None) -> list[Check]:
    """For a plugin's own pytest: raise with every failing line, return the checks otherwise."""
    checks = run_checks(name, spec_path)
    failed = [c.line() for c in checks if not c.ok]
    if failed:
        raise ConformanceError("\n".join(failed))
    return checks
