"""Task specs: one YAML file per sweep, validated strictly, content-hashed.

A bad spec never runs: ``load_spec`` raises ``SpecError`` whose message names the file, the field,
the value and what is allowed, one line per problem.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from kregress.core.names import MAX_GRAPH_ROUNDS, Strategy


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class HardwareLimits(_Strict):
    """Per-SM limits of the target; defaults are an H100 SXM (sm_90)."""

    sm_count: int = Field(default=132, gt=0)
    max_registers_per_thread: int = Field(default=255, gt=0)
    registers_per_sm: int = Field(default=65536, gt=0)
    max_shared_memory_per_block: int = Field(default=232448, gt=0)
    shared_memory_per_sm: int = Field(default=233472, gt=0)
    max_threads_per_sm: int = Field(default=2048, gt=0)
    max_blocks_per_sm: int = Field(default=32, gt=0)
    peak_tflops: float = Field(default=989.0, gt=0, description="dense bf16/fp16 tensor-core peak")
    hbm_gbps: float = Field(default=3350.0, gt=0)
    l2_bytes: int = Field(default=50 * 1024 * 1024, gt=0)


class Hardware(_Strict):
    device: str = "NVIDIA H100 80GB HBM3"
    arch: str = Field(default="sm_90", pattern=r"^sm_\d{2,3}a?$")
    limits: HardwareLimits = HardwareLimits()

    @property
    def capability(self) -> int:
        return int(self.arch.removeprefix("sm_").rstrip("a"))


class Constraints(_Strict):
    max_registers_per_thread: int = Field(default=255, gt=0)
    max_shared_memory_bytes: int = Field(default=232448, gt=0)
    numeric_tolerance: float = Field(default=1e-2, gt=0)
    max_spill_bytes: int = Field(default=0, ge=0)


class RegressionGuard(_Strict):
    metric: Literal["latency_p50"] = "latency_p50"
    not_worse_than_baseline_ratio: float = Field(default=1.03, ge=1.0)
    # 0.90 two-sided = a one-sided 95% claim per verdict; chosen on the recorded RTX 3090 runs
    # (bench/stats.py: no A/A false alarm, >=95% detection of a 6% slowdown even on the noisiest configs).
    confidence: float = Field(default=0.90, gt=0.5, lt=1.0)
    min_samples: int = Field(default=10, ge=3)


class Search(_Strict):
    strategy: Strategy = "local"
    variants_per_round: int = Field(default=8, ge=1, le=64)
    max_rounds: int = Field(default=3, ge=1, le=MAX_GRAPH_ROUNDS)
    no_improve_rounds: int = Field(default=2, ge=1)
    min_improvement: float = Field(default=0.01, ge=0, description="relative p50 gain that counts")
    seed: int = 0
    top_k: int = Field(default=5, ge=1, le=50, description="rows of history the agent sees")


class Budget(_Strict):
    max_input_tokens_per_round: int = Field(default=20000, ge=0)
    max_output_tokens_per_round: int = Field(default=8000, ge=0)
    max_total_tokens: int = Field(default=100000, ge=0)


class Objective(_Strict):
    metric: Literal["latency_p50"] = "latency_p50"
    aggregate: Literal["geomean", "max", "sum"] = "geomean"
    direction: Literal["minimize"] = "minimize"


class Benchmark(_Strict):
    backend: Literal["auto", "cuda", "interpreter"] = "auto"
    warmup_ms: int = Field(default=25, gt=0)
    rep_ms: int = Field(default=100, gt=0)
    timeout_s: float = Field(default=300.0, gt=0, description="per variant, child process killed after")


class TaskSpec(_Strict):
    task_id: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]{0,62}$")
    description: str = ""
    kernel_family: str
    dtype: Literal["fp16", "bf16", "fp32"] = "bf16"
    hardware: Hardware = Hardware()
    shape_matrix: list[dict[str, Any]] = Field(min_length=1)
    correctness_shapes: list[dict[str, Any]] = Field(min_length=1)
    objective: Objective = Objective()
    constraints: Constraints = Constraints()
    regression_guard: RegressionGuard = RegressionGuard()
    search: Search = Search()
    budget: Budget = Budget()
    benchmark: Benchmark = Benchmark()
    baseline: dict[str, int]
    params: dict[str, Any] = Field(default_factory=dict, description="family-specific knobs")

    @field_validator("kernel_family")
    @classmethod
    def _known_family(cls, v: str) -> str:
        from kregress.core.family import UnknownFamily, get_family

        try:  # built in, an installed plugin (entry point) or an import path package.module:attribute
            get_family(v)
        except UnknownFamily as exc:
            raise ValueError(str(exc)) from None
        return v

    @model_validator(mode="after")
    def _family_checks(self, info: ValidationInfo) -> TaskSpec:
        # parse_spec asks to defer these so that each problem is reported with its own field name.
        if not (info.context or {}).get("defer_family_checks"):
            problems = family_problems(self)
            if problems:
                raise ValueError("; ".join(f"{field}: {msg}" for field, _, msg in problems))
        return self

    def content_hash(self) -> str:
        blob = json.dumps(self.model_dump(mode="json"), sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def family_problems(spec: TaskSpec) -> list[tuple[str, Any, str]]:
    """(field, value, message) for every shape, baseline or params problem the family finds."""
    from kregress.core.family import get_family

    fam = get_family(spec.kernel_family)
    out = []
    if spec.dtype not in fam.dtypes:
        out.append(("dtype", spec.dtype, f"family {fam.name} takes {', '.join(fam.dtypes)}"))
    for field in ("shape_matrix", "correctness_shapes"):
        for i, shape in enumerate(getattr(spec, field)):
            problem = fam.check_shape(shape)
            if problem:
                out.append((f"{field}.{i}", shape, problem))
    problem = fam.space.check(spec.baseline, spec.params, spec.hardware.limits)
    if problem:
        out.append(("baseline", spec.baseline, problem))
    problem = fam.check_params(spec.params)
    if problem:
        out.append(("params", spec.params, problem))
    return out


class SpecError(ValueError):
    """A spec that cannot run; the message is what the user reads."""


def _allowed_for(err: dict[str, Any]) -> str:
    ctx = err.get("ctx") or {}
    if "expected" in ctx:
        return f"allowed: {ctx['expected']}"
    for k, word in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<=")):
        if k in ctx:
            return f"allowed: {word} {ctx[k]}"
    if "pattern" in ctx:
        return f"allowed: text matching {ctx['pattern']}"
    if err["type"] == "extra_forbidden":
        return "remove it or check its spelling"
    if err["type"] == "missing":
        return "add it"
    if "min_length" in ctx:
        return f"allowed: at least {ctx['min_length']} item(s)"
    return ""


def format_validation_error(path: str | Path, exc: ValidationError, model: type[BaseModel]) -> str:
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
        value = err.get("input")
        if err["type"] == "extra_forbidden":
            parent_fields = _fields_at(model, err["loc"][:-1])
            msg = f"unknown key; allowed keys here: {', '.join(parent_fields)}" if parent_fields else "unknown key"
        else:
            msg = err["msg"].removeprefix("Value error, ")
        shown = json.dumps(value, default=str)[:120] if err["type"] != "missing" else "(missing)"
        allowed = _allowed_for(err)
        line = f"{path}: field '{loc}': value {shown}: {msg}"
        if allowed and allowed not in msg and "allowed" not in msg:
            line += f" ({allowed})"
        lines.append(line)
    return "\n".join(lines)


def _fields_at(model: type[BaseModel], loc: tuple) -> list[str]:
    cur: Any = model
    for part in loc:
        if isinstance(part, int):
            return []
        field = getattr(cur, "model_fields", {}).get(part)
        if field is None:
            return []
        cur = field.annotation
        if not (isinstance(cur, type) and issubclass(cur, BaseModel)):
            return []
    return list(cur.model_fields) if isinstance(cur, type) and issubclass(cur, BaseModel) else []


def parse_spec(data: Any, path: str | Path = "<spec>") -> TaskSpec:
    if not isinstance(data, dict):
        raise SpecError(f"{path}: the file must hold a YAML mapping (task_id: ..., kernel_family: ...), got {type(data).__name__}")
    try:
        spec = TaskSpec.model_validate(data, context={"defer_family_checks": True})
    except ValidationError as exc:
        raise SpecError(format_validation_error(path, exc, TaskSpec)) from None
    problems = family_problems(spec)
    if problems:
        raise SpecError("\n".join(
            f"{path}: field '{field}': value {json.dumps(value, default=str)[:160]}: {msg}" for field, value, msg in problems
        ))
    return spec


def load_spec(path: str | Path) -> TaskSpec:
    path = Path(path)
    if not path.is_file():
        raise SpecError(f"{path}: no such spec file")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: not valid YAML: {exc}") from None
    return parse_spec(data, path)


def discover_specs(specs_dir: str | Path) -> dict[str, Path]:
    """task_id -> file for every *.yaml under specs_dir; duplicate task_ids are an error."""
    out: dict[str, Path] = {}
    for p in sorted(Path(specs_dir).glob("*.y*ml")):
        try:
            data = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError:
            continue
        tid = data.get("task_id") if isinstance(data, dict) else None
        if not tid:
            continue
        if tid in out:
            raise SpecError(f"{p}: task_id {tid!r} is also used by {out[tid]}; task_ids must be unique")
        out[tid] = p
    return out
