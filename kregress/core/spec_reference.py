"""The spec reference (docs/spec-reference.md), generated from the pydantic models of ``kregress.core.spec``.

    .venv/bin/python -m kregress.core.spec_reference > docs/spec-reference.md

Every field of ``TaskSpec``, section by section: its YAML key, type, default, the values or bounds the schema
allows, and what it means (the field's own ``description`` in the model; else the line in ``NOTES`` below).
``tests/test_docs_spec_reference.py`` regenerates the text in memory and fails when the committed file differs.
"""

from __future__ import annotations

import types
import typing
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from kregress.core.spec import BOUND_REASONS, TaskSpec

REPO = Path(__file__).resolve().parents[2]

COMMAND = ".venv/bin/python -m kregress.core.spec_reference > docs/spec-reference.md"

# What a field means, for the fields whose model gives no description (a model description wins).
NOTES = {
    "task_id": "the spec's name: its partition key in Dagster and its folder under reports/",
    "description": "free text, shown in the report",
    "kernel_family": "an installed family (`kregress family list`) or an import path `package.module:attribute`",
    "dtype": "the input precision the family is run and checked in",
    "hardware": "the target GPU: the arch the AOT compile targets and the limits the validity rules and the "
                "latency models read",
    "hardware.device": "the GPU's name, as torch reports it",
    "hardware.arch": "the compute capability compiled for (ptxas / nvcc `-arch`)",
    "hardware.limits": "per-SM limits and peaks of the target",
    "hardware.limits.sm_count": "streaming multiprocessors",
    "hardware.limits.max_registers_per_thread": "registers one thread may use",
    "hardware.limits.registers_per_sm": "the register file of one SM (32-bit registers)",
    "hardware.limits.max_shared_memory_per_block": "bytes of shared memory one block may use",
    "hardware.limits.shared_memory_per_sm": "bytes of shared memory of one SM",
    "hardware.limits.max_threads_per_sm": "resident threads per SM",
    "hardware.limits.max_blocks_per_sm": "resident blocks per SM",
    "hardware.limits.hbm_gbps": "HBM bandwidth in GB/s (the memory roof)",
    "hardware.limits.l2_bytes": "L2 cache size in bytes",
    "shape_matrix": "the timed shapes, one mapping of the family's shape keys each (e.g. `{M: 4096, N: 4096, K: 4096}`); "
                    + BOUND_REASONS["shape"],
    "correctness_shapes": "small shapes checked in the interpreter on a CPU host (and on the GPU beside the timed ones)",
    "objective": "what the search minimises",
    "objective.metric": "the per-shape figure: the median latency",
    "objective.aggregate": "how the shapes' figures combine into one",
    "objective.direction": "lower is better",
    "constraints": "limits a variant must meet; a variant past one is REGRESS `infeasible`",
    "constraints.max_registers_per_thread": "registers per thread, from the compile",
    "constraints.max_shared_memory_bytes": "shared memory per block, from the compile",
    "constraints.numeric_tolerance": "the family's base tolerance against the float64 reference",
    "constraints.max_spill_bytes": "spill stores plus the stack frame (bytes); 0: no spills allowed",
    "regression_guard": "the verdict rule on measured evidence (`cuda`, `replay`)",
    "regression_guard.metric": "the compared figure: the median latency per shape",
    "regression_guard.not_worse_than_baseline_ratio": "REGRESS above this time ratio to the baseline (1.03: 3% slower); "
                                                      "PASS when the interval lies entirely below it",
    "regression_guard.confidence": "two-sided confidence of the shift interval",
    "regression_guard.min_samples": "fewer timing samples than this a side: NEEDS_REVIEW",
    "search": "how variants are proposed",
    "search.strategy": "`local`: the local model search (no model calls); `llm`: the gateway's model; `hybrid`: the model, "
                       "topped up locally",
    "search.variants_per_round": "proposals measured per round",
    "search.max_rounds": "rounds at most; " + BOUND_REASONS["rounds"],
    "search.no_improve_rounds": "stop after this many rounds without a `min_improvement` gain",
    "search.seed": "the search's seed (a sweep is deterministic given it)",
    "budget": "token budgets of the model calls (strategies `llm` and `hybrid`); " + BOUND_REASONS["tokens"],
    "budget.max_input_tokens_per_round": "prompt tokens a round may send",
    "budget.max_output_tokens_per_round": "completion tokens a round may ask for",
    "budget.max_total_tokens": "all tokens of one sweep, the report included",
    "benchmark": "how variants are timed on a GPU (the timing plan)",
    "benchmark.backend": "`auto`: the GPU when torch sees one, else the interpreter; `cuda`; `interpreter`",
    "benchmark.warmup_ms": "warm-up per timing (triton.testing.do_bench)",
    "benchmark.rep_ms": "timed repetitions per timing, in ms",
    "benchmark.max_batch_rounds#rule": "at least `batch_rounds`",
    "patches": "the gate candidate patches go through",
    "baseline": "the baseline config: a point of the family's search space (tunable -> integer)",
    "params": None,  # the model's description
}


def _type(ann: Any) -> str:
    origin = typing.get_origin(ann)
    args = typing.get_args(ann)
    if origin is Literal:
        return "one of " + ", ".join(f"`{a}`" for a in args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join("null" if a is type(None) else _type(a) for a in args)
    if origin is list:
        return f"list of {_type(args[0])}" if args else "list"
    if origin is dict:
        return f"mapping {_type(args[0])} -> {_type(args[1])}" if args else "mapping"
    if ann is Any:
        return "any"
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return "section"
    return getattr(ann, "__name__", str(ann))


def _bounds(info: FieldInfo) -> str:
    out = []
    for m in info.metadata:
        for attr, sym in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<="), ("min_length", "length >="),
                          ("max_length", "length <="), ("pattern", "matches")):
            v = getattr(m, attr, None)
            if v is not None:
                out.append(f"{sym} `{v}`" if attr == "pattern" else f"{sym} {v:,}" if isinstance(v, int) else f"{sym} {v:g}")
    return ", ".join(out)


def _default(info: FieldInfo) -> str:
    if info.is_required():
        return "required"
    if info.default_factory is not None:
        value = info.default_factory()
    else:
        value = info.default
    if value is PydanticUndefined:
        return "required"
    if isinstance(value, BaseModel):
        return "(its fields' defaults)"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if value == "":
        return '`""`'
    return f"`{value}`"


def _rows(model: type[BaseModel], prefix: str) -> list[tuple[str, str, str, str, str]]:
    rows = []
    for name, info in model.model_fields.items():
        key = f"{prefix}{name}"
        ann = info.annotation
        what = info.description or NOTES.get(key) or ""
        rule = NOTES.get(f"{key}#rule")
        rows.append((key, _type(ann), _default(info), ", ".join(x for x in (_bounds(info), rule) if x), what))
    return rows


def _sections(model: type[BaseModel] = TaskSpec, prefix: str = "") -> list[tuple[str, type[BaseModel], str]]:
    out = [(prefix.rstrip(".") or "top level", model, prefix)]
    for name, info in model.model_fields.items():
        ann = info.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out += _sections(ann, f"{prefix}{name}.")
    return out


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render() -> str:
    lines = [
        "# Spec reference",
        "",
        f"Generated from the pydantic models in `kregress/core/spec.py` by `{COMMAND}`;",
        "`tests/test_docs_spec_reference.py` fails when this file is not current. Do not edit it by hand.",
        "",
        "A spec is one YAML file; one spec is one sweep (and one Dagster partition, its `task_id`). Validation is",
        "strict: no type coercion (`true` is not a count, `\"128\"` is not an integer), unknown keys and keys given",
        "twice are refused, and every problem of a file is listed at once, naming the file, the field, the value and",
        "what is allowed. `kregress specs validate FILE...` checks specs and runs nothing (exit 2 on any problem).",
        "The family then checks the shapes, `baseline` and `params` against its own space and rules.",
        "",
    ]
    for title, model, prefix in _sections():
        lines += [f"## {title}", ""]
        doc = (model.__doc__ or "").strip()
        if model is not TaskSpec and doc and not doc.startswith(model.__name__ + "("):
            lines += [" ".join(doc.split()), ""]
        elif prefix:
            lines += [NOTES.get(prefix.rstrip("."), "") or "", ""]
        lines += ["| field | type | default | allowed | what |", "| --- | --- | --- | --- | --- |"]
        lines += ["| " + " | ".join(_cell(c) for c in (f"`{k}`", t, d, b, w)) + " |" for k, t, d, b, w in _rows(model, prefix)]
        lines.append("")
    example = REPO / "specs" / "gemm_smoke.yaml"
    if example.is_file():  # a source checkout (an installed package ships no specs)
        lines += ["## An example", "", "`specs/gemm_smoke.yaml`, the small spec the tests sweep (every field left out takes its default):",
                  "", "```yaml", example.read_text().rstrip("\n"), "```", ""]
    return "\n".join(lines)


def main() -> None:
    print(render(), end="")


if __name__ == "__main__":
    main()
