"""kregress: budgeted, auditable GPU kernel regression sweeps.

The public API for family authors (stable; plugins are written against it)::

    from kregress import Family, Space, Rule, CompileUnit

    class MyFamily(Family): ...
    FAMILY = MyFamily(name="my_gemm", space=Space(params={...}, rules=(Rule(...),)),
                      shape_keys=("M", "N", "K"), headline_metric="tflops")

and the records a family's kernels are measured into (CompileStats, Correctness, Measurement,
VariantResult, Verdict), the spec (TaskSpec, HardwareLimits, load_spec) and the registry
(get_family, families, register). Importing ``kregress`` imports neither Dagster nor Triton.
"""

from kregress.core.family import (
    BUILTIN,
    ENTRY_POINT_GROUP,
    CompileUnit,
    Family,
    Rule,
    Space,
    UnknownFamily,
    check_param_keys,
    check_positive_number,
    families,
    get_family,
    register,
)
from kregress.core.records import (
    CompileStats,
    Correctness,
    Measurement,
    Suggestion,
    VariantResult,
    Verdict,
    config_hash,
)
from kregress.core.spec import Hardware, HardwareLimits, SpecError, TaskSpec, load_spec

__version__ = "0.2.0"

__all__ = [
    "BUILTIN", "ENTRY_POINT_GROUP", "CompileStats", "CompileUnit", "Correctness", "Family", "Hardware",
    "HardwareLimits", "Measurement", "Rule", "Space", "SpecError", "Suggestion", "TaskSpec", "UnknownFamily",
    "VariantResult", "Verdict", "check_param_keys", "check_positive_number", "config_hash", "families",
    "get_family", "load_spec", "register",
]
