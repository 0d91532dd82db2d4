"""The conformance checks of the ``cuda`` kind (``kregress family check`` on a ``CudaFamily``).

- ``tunables``: every tunable of the space is exactly one of ``template_params`` (a template argument),
  ``define_params`` (a ``-D`` macro) or ``launch_params`` (read by the host wrapper only), each declared
  name is a tunable, and the baseline's ``cuda_units`` carry the template arguments and macros in order;
- ``editable_region``: every ``.cu`` file in ``cuda_sources`` exists and defines each of the
  ``kernel_functions`` (what a patch may edit), and nvcc is there (else the one line saying how to get it);
- ``kernel_vs_reference``: on a GPU, the smallest and the largest tile match the float64 reference on the
  spec's correctness shapes; on a CPU host it is skipped, saying so (compile facts only).

The compile facts themselves come from ``sweep_path`` (``kernel_assets.conformance``): the baseline
through the interpreter backend, exactly as ``kregress sweep`` on a CPU host compiles it.
"""

from __future__ import annotations

from kernel_assets.conformance_parts import Check, _run_jobs, _tiles
from kregress.core.cuda_source import kernel_regions, nvcc_problem
from kregress.core.family import CudaFamily
from kregress.core.records import config_label
from kregress.core.spec import TaskSpec


def check_tunables(fam: CudaFamily, spec: TaskSpec) -> Check:
    tunables = list(fam.space.params)
    declared = {"template": fam.template_params, "define": fam.define_params, "launch": fam.launch_params}
    problems = []
    for k in tunables:
        where = [w for w, names in declared.items() if k in names]
        if len(where) != 1:
            problems.append(f"{k} is {'in ' + ' and '.join(where) + '_params' if where else 'in none of template_params, define_params, launch_params'}")
    for w, names in declared.items():
        problems += [f"{w}_params names {n!r}, which is not a tunable" for n in names if n not in tunables]
    if not problems:
        try:
            units = fam.cuda_units(spec.baseline, spec.dtype, spec.params)
        except Exception as exc:  # noqa: BLE001 - a family bug is a finding
            return Check("tunables", "FAIL", f"cuda_units raised {type(exc).__name__}: {str(exc)[:200]}",
                         "cuda_units(config, dtype, params) must return CudaUnits (self.unit(kernel, config, threads=...))")
        want_t = tuple(int(spec.baseline[k]) for k in fam.template_params)
        want_d = {(k, int(spec.baseline[k])) for k in fam.define_params}
        if not units:
            problems.append("cuda_units returned no kernel for the baseline")
        for u in units:
            if fam.template_params and u.template_args[:len(want_t)] != want_t:
                problems.append(f"unit {u.kernel}: template arguments {u.template_args} are not the baseline's {want_t}")
            if not want_d <= set(u.defines):
                problems.append(f"unit {u.kernel}: macros {dict(u.defines)} lack {dict(want_d - set(u.defines))}")
            if u.source not in fam.cuda_sources:
                problems.append(f"unit {u.kernel}: source {u.source!r} is not in cuda_sources")
    if problems:
        return Check("tunables", "FAIL", "; ".join(problems)[:400],
                     "list each tunable once in template_params (template order), define_params or launch_params, and "
                     "build units with self.unit(kernel, config, threads=...)")
    parts = [f"{w} {', '.join(n)}" for w, n in declared.items() if n]
    return Check("tunables", "PASS", "; ".join(parts) + f"; baseline units: {', '.join(u.kernel for u in units)}")


def check_editable_region(fam: CudaFamily) -> Check:
    missing_files = [str(f) for f in fam.cu_files() if not f.is_file()]
    if missing_files or not fam.cuda_sources:
        return Check("editable_region", "FAIL", f"cuda_sources missing: {', '.join(missing_files) or 'none declared'}",
                     "list the .cu files, relative to the family's module folder, in cuda_sources")
    found: dict[str, list[str]] = {}
    for rel, f in zip(fam.cuda_sources, fam.cu_files()):
        for r in kernel_regions(f.read_text(encoding="utf-8"), rel, tuple(fam.kernel_functions)):
            found.setdefault(r.name, []).append(f"{rel}:{r.start}-{r.end}")
    absent = [n for n in fam.kernel_functions if n not in found]
    if absent or not fam.kernel_functions:
        return Check("editable_region", "FAIL", f"kernel_functions not defined as __global__/__device__ in the .cu files: "
                                                f"{', '.join(absent) or 'none declared'}",
                     "name the kernel functions a patch may edit in kernel_functions")
    toolchain = nvcc_problem()
    if toolchain:
        return Check("editable_region", "FAIL", toolchain, "install nvcc")
    return Check("editable_region", "PASS", "; ".join(f"{n} at {', '.join(v)}" for n, v in found.items()))


def check_cuda_kernel(fam: CudaFamily, spec: TaskSpec, timeout: float = 600) -> Check:
    from resources.gpu import gpu_visible

    if not gpu_visible():
        return Check("kernel_vs_reference", "SKIP", "a CUDA kernel runs on a GPU only: compile facts only on this host "
                                                    "(run `kregress family check` on a GPU host to check it)")
    tiles = _tiles(fam, spec)
    jobs = [{"op": "correctness", "family": fam.lookup or fam.name, "config": cfg, "dtype": spec.dtype,
             "shapes": spec.correctness_shapes, "tolerance": spec.constraints.numeric_tolerance, "params": spec.params,
             "device": "cuda", "interpret": False} for cfg in tiles]
    bad, ran = [], []
    for cfg, res in zip(tiles, _run_jobs(jobs, interpret=False, timeout=timeout)):
        c = res.get("correctness")
        if c is None:
            bad.append(f"{config_label(cfg)}: {res.get('error')}: {str(res.get('detail', ''))[:200]}")
        elif not c["ok"]:
            bad.append(f"{config_label(cfg)}: {c['mismatch_sample'][:200]}")
        else:
            ran.append(config_label(cfg))
    if bad:
        return Check("kernel_vs_reference", "FAIL", "on the GPU: " + " | ".join(bad),
                     "the kernel and the reference disagree (a config that does not compile fails here too: the smallest "
                     "and the largest tile must fit)")
    return Check("kernel_vs_reference", "PASS", f"{', '.join(ran)} match the reference on {len(spec.correctness_shapes)} shape(s) on the GPU")
