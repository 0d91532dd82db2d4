"""kregress: budgeted, auditable GPU kernel regression sweeps.

The public API for family authors (stable; plugins are written against it)::

    from kregress import TritonFamily, Space, Rule, CompileUnit

    class MyFamily(TritonFamily): ...  # or ExternalFamily, CudaFamily, RecordedFamily
    FAMILY = MyFamily(name="my_gemm", space=Space(params={...}, rules=(Rule(...),)),
                      shape_keys=("M", "N", "K"), headline_metric="tflops")

and the records a family's kernels are measured into (CompileStats, Correctness, Measurement,
VariantResult, Verdict), the spec (TaskSpec, HardwareLimits, load_spec, bind) and the registry
(get_family, families, register). Importing ``kregress`` imports neither Dagster nor Triton.
"""

# Names are imported on first use (PEP 562): `import kregress` stays cheap, so `kregress --help` (whose
# modules import kregress.core.*) does not pay for pydantic models and the family registry at start-up.
_EXPORTS = {
    **dict.fromkeys(("ENTRY_POINT_GROUP", "CompileUnit", "CudaFamily", "CudaUnit", "ExternalFamily", "Family", "KernelFamily", "RecordedFamily",
                     "Rule", "Space", "TritonFamily", "UnknownFamily", "check_param_keys", "check_positive_number",
                     "families", "get_family", "register"),
                    "kregress.core.family"),
    **dict.fromkeys(("BoundSpec", "bind", "load_bound"), "kregress.core.bind"),
    **dict.fromkeys(("CompileStats", "Correctness", "Measurement", "Suggestion", "VariantResult", "Verdict",
                     "config_hash"), "kregress.core.records"),
    **dict.fromkeys(("Hardware", "HardwareLimits", "SpecError", "TaskSpec", "load_spec"), "kregress.core.spec"),
}

__version__ = "0.2.0"

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'kregress' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
