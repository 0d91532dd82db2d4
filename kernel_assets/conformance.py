"""The family conformance kit: the checks every built-in family passes, for any family.

``kregress family check NAME`` prints one line per check; a plugin's own pytest calls the same checks::

    from kernel_assets.conformance import run_checks, assert_conforms

    def test_my_family_conforms():
        assert_conforms("my_family", spec_path="specs/my_family.yaml")

Which checks run follows the family's kind (``TritonFamily``, ``ExternalFamily``, ``RecordedFamily``);
each returns ``Check(name, status, detail, fix)``, status PASS / FAIL / SKIP:

- ``spec``: the spec loads and binds to the family (schema and the family's own checks);

- ``space``: the space is enumerable under the spec's hardware limits and the baseline is inside it;
- ``shapes``: every timed and correctness shape and the params pass the family's own checks;
- ``reference``: the reference returns float64, finite, on a correctness shape;
- ``formulas``: FLOP and byte counts are positive, finite and grow (never shrink) with every dimension;
- ``tolerance``: (atol, rtol) positive and growing with the reduction length, never shrinking with a dimension;
- ``kernel_vs_reference``: the smallest and the largest tile of the space match the reference on the
  spec's correctness shapes, in the Triton interpreter (an external kernel: on the CPU where its op runs);
- ``sweep_path`` (Triton): the baseline goes through exactly what a sweep on a CPU host calls: the
  interpreter backend's AOT compile for the spec's arch (registers, shared memory), its correctness
  check and the family's ``model_latency_ms`` on every timed shape (positive and finite), so a family
  that passes ``family check`` also runs ``kregress sweep``;
- ``replay`` (recorded): the baseline answers with recorded runs through the replay backend.

An external kernel has no compile units and no latency model: its sweep needs the cuda backend, which
the check says. This module runs kernels in child processes through the benchmark backends, so it
belongs to the application layer.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable

import yaml

from kernel_assets.conformance_parts import ENUMERATE_CAP, Check, _run_jobs, _tiles  # noqa: F401 - Check is public here too
from kregress.core.bind import BoundSpec, load_bound
from kregress.core.family import CudaFamily, ExternalFamily, Family, KernelFamily, RecordedFamily, TritonFamily, get_family
from kregress.core.records import Suggestion, config_label
from kregress.core.spec import SpecError, TaskSpec


class ConformanceError(AssertionError):
    pass


def _declared_family(path: Path) -> str | None:
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    return data.get("kernel_family") if isinstance(data, dict) else None


def _correctness_work(path: Path) -> float:
    """How much interpreter work a spec's correctness shapes ask for (the product of each shape's dims)."""
    try:
        data = yaml.safe_load(path.read_text()) or {}
        return float(sum(math.prod(v for v in s.values() if isinstance(v, int)) for s in data.get("correctness_shapes", [])))
    except Exception:  # noqa: BLE001 - an unreadable spec sorts last
        return math.inf


def default_spec_path(family: Family) -> Path | None:
    """The family's shipped spec: ``specs/<name>.yaml`` beside the family's package (the scaffold's
    layout), else the ``specs/*.yaml`` there whose ``kernel_family`` names it, the cheapest to check
    first (a built-in such as ``gemm_fp8`` ships ``specs/gemm_fp8_h100.yaml``). None when there is none."""
    files = family.source_files()
    for f in files[:1]:
        for parent in list(f.parents)[:3]:
            folder = parent / "specs"
            if not folder.is_dir():
                continue
            exact = folder / f"{family.name}.yaml"
            if exact.is_file():
                return exact
            mine = [p for p in sorted(folder.glob("*.y*ml")) if _declared_family(p) in (family.name, family.lookup)]
            if mine:
                return min(mine, key=_correctness_work)
    return None


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


def check_reference(family: KernelFamily, spec: TaskSpec) -> Check:
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

    if isinstance(family, RecordedFamily):  # one recorded problem: nothing to scale, FLOPs from its GFLOP/s
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


def check_tolerance(family: KernelFamily, spec: TaskSpec) -> Check:
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


def check_kernel(family: KernelFamily, spec: TaskSpec, timeout: float = 600) -> Check:
    external = isinstance(family, ExternalFamily)
    if external:  # few configs (which library kernel runs): try each where it runs, on the CPU
        tiles = list(family.space.enumerate(spec.params, spec.hardware.limits))[:8]
    else:
        tiles = _tiles(family, spec)
    jobs = [{"op": "correctness", "family": family.lookup or family.name, "config": cfg, "dtype": spec.dtype,
             "shapes": spec.correctness_shapes, "tolerance": spec.constraints.numeric_tolerance,
             "params": spec.params, "device": "cpu", "interpret": not external} for cfg in tiles]
    where = "on the CPU (external kernel)" if external else "in the Triton interpreter"
    bad, ran, unavailable = [], [], []
    for cfg, res in zip(tiles, _run_jobs(jobs, interpret=not external, timeout=timeout)):
        c = res.get("correctness")
        if c is None and external:
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


def _baseline(spec: TaskSpec) -> Suggestion:
    return Suggestion(variant_id="baseline", config=spec.baseline, patch_summary="the spec's baseline config",
                      source="baseline", round=0, risk="low")


def _frames(exc: BaseException) -> list[str]:
    import traceback

    return [f.name for f in traceback.extract_tb(exc.__traceback__)]


def check_sweep_path(bound: BoundSpec, timeout: float = 600) -> Check:
    """The baseline through the interpreter backend, as ``kregress sweep`` runs it on a CPU host."""
    import tempfile

    from resources.gpu import InterpreterBackend

    spec = bound.spec
    with tempfile.TemporaryDirectory(prefix="kregress-check-") as cache:
        backend = InterpreterBackend(cache_dir=cache, workers=1, timeout_s=timeout)
        try:
            (row,), _ = backend.evaluate(bound, [_baseline(spec)], log=lambda _m: None)
        except Exception as exc:  # noqa: BLE001 - what would crash a sweep is this check's finding
            where = "model_latency_ms" if "model_latency_ms" in _frames(exc) else "the interpreter backend"
            return Check("sweep_path", "FAIL", f"{where} raised {type(exc).__name__}: {' '.join(str(exc).split())[:240]}",
                         "a sweep on a CPU host calls compile_units, the reference check and model_latency_ms(shape, "
                         "config, stats, hardware, dtype_bytes, params) for every timed shape: make each of them run")
    if row.error:
        fix = ("compile_units() must return CompileUnits whose signature matches the jit function's arguments"
               if row.error in ("compile_failed", "out_of_resources") else "the baseline must match the reference")
        return Check("sweep_path", "FAIL", f"baseline: {row.error}: {' '.join(row.error_detail.split())[:240]}", fix)
    if isinstance(bound.family, CudaFamily):  # a CPU host: compile facts only (kernels/cuda)
        cs = row.compile
        return Check("sweep_path", "PASS", f"{spec.hardware.arch}: {cs.regs_per_thread} regs/thread, {cs.smem_bytes} B shared "
                                           f"memory, {cs.spill_stores}/{cs.spill_loads} B spill stores/loads, {cs.barriers} "
                                           f"barrier(s) ({cs.facts_from}); {row.error_detail or 'measured'}")
    bad = [m.shape for m in row.measurements if not (m.p50_ms > 0 and math.isfinite(m.p50_ms))]
    if bad or len(row.measurements) != len(spec.shape_matrix):
        return Check("sweep_path", "FAIL", f"model_latency_ms gave no positive, finite estimate on {', '.join(bad) or 'some shapes'}",
                     "return the estimated milliseconds of one launch (> 0) for every shape")
    cs = row.compile
    first = row.measurements[0]
    return Check("sweep_path", "PASS", f"{spec.hardware.arch}: {cs.regs_per_thread} regs/thread, {cs.smem_bytes} B shared "
                                       f"memory, {cs.spill_bytes} B spills; correct on {len(spec.correctness_shapes)} shape(s); "
                                       f"estimated {first.p50_ms:.4g} ms on {first.shape}")


def check_replay(bound: BoundSpec) -> Check:
    from resources.gpu import ReplayBackend

    (row,), _ = ReplayBackend().evaluate(bound, [_baseline(bound.spec)], log=lambda _m: None)
    if row.error or not row.measurements:
        return Check("replay", "FAIL", f"the baseline has no recorded runs: {row.error}: {row.error_detail[:200]}",
                     "pick a baseline the file recorded as valid")
    n = sum(len(m.samples_ms) for m in row.measurements)
    return Check("replay", "PASS", f"the baseline answers with {n} recorded run(s)")


def checks_for(bound: BoundSpec) -> list[Callable[[], Check]]:
    """The checks that apply to the bound family's kind, in order."""
    fam, spec = bound.family, bound.spec
    common = [lambda: check_space(fam, spec), lambda: check_shapes(fam, spec), lambda: check_formulas(fam, spec)]
    if isinstance(fam, RecordedFamily):
        return common + [lambda: check_replay(bound)]
    kernel = [lambda: check_reference(fam, spec), lambda: check_tolerance(fam, spec), lambda: check_kernel(fam, spec)]
    if isinstance(fam, TritonFamily):
        return common + kernel + [lambda: check_sweep_path(bound)]
    if isinstance(fam, CudaFamily):  # kernels/cuda: nvcc facts on any host, the kernel itself on a GPU
        from kernel_assets.conformance_cuda import check_cuda_kernel, check_editable_region, check_tunables

        return common + [lambda: check_reference(fam, spec), lambda: check_tolerance(fam, spec),
                         lambda: check_tunables(fam, spec), lambda: check_editable_region(fam),
                         lambda: check_sweep_path(bound), lambda: check_cuda_kernel(fam, spec)]
    return common + kernel + [lambda: Check(
        "sweep_path", "SKIP", "external kernel: no compile units and no latency model; its sweep needs the cuda backend "
                              "(kregress sweep --backend cuda) or a recorded file")]


def run_checks(name: str, spec_path: str | Path | None = None,
               on_check: Callable[[Check], None] | None = None) -> list[Check]:
    """Every check for family ``name``'s kind against its spec (``spec_path``, else its shipped spec)."""
    family = get_family(name)
    path = Path(spec_path) if spec_path else default_spec_path(family)
    if path is None:
        return [Check("spec", "FAIL", f"no spec for family {name} (looked for specs/*.yaml with kernel_family: {name} "
                                      "beside its package)", "pass --spec FILE")]
    try:
        bound = load_bound(path)
    except SpecError as exc:
        return [Check("spec", "FAIL", str(exc).splitlines()[0], "fix the spec (kregress specs validate FILE)")]
    if bound.spec.kernel_family != name and get_family(bound.spec.kernel_family) is not family:
        return [Check("spec", "FAIL", f"{path} is a spec of family {bound.spec.kernel_family}, not {name}",
                      "pass a spec of this family")]
    out = [Check("spec", "PASS", f"{path} ({bound.family.kind} family)")]
    if on_check:
        on_check(out[0])
    for fn in checks_for(bound):
        c = fn()
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
