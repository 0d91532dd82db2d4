"""Task specs: one YAML file per sweep, validated strictly, content-hashed.

A bad spec never runs: ``load_spec`` raises ``SpecError`` whose message names the file, the field,
the value and what is allowed, one line per problem, every problem in one pass (schema and family
checks together). Strict means: no type coercion (``true`` is not a count, ``"128"`` is not an
integer), a key given twice in one mapping is refused, numbers have bounds with a reason, the
architecture is one the toolchain knows, and a misspelt key or value gets a "did you mean".
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import typing
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from kregress.core.names import MAX_GRAPH_ROUNDS, Strategy, arch_capability

# Compute capabilities Triton 3.x / ptxas target ("a" = the arch-specific feature set).
KNOWN_ARCHS = ("sm_70", "sm_72", "sm_75", "sm_80", "sm_86", "sm_87", "sm_89", "sm_90", "sm_90a",
               "sm_100", "sm_100a", "sm_101", "sm_101a", "sm_103", "sm_103a", "sm_120", "sm_120a",
               "sm_121", "sm_121a")
Arch = Literal[KNOWN_ARCHS]  # type: ignore[valid-type]

# Bounds, each with the reason a user reads when a value is outside it.
MAX_DIM = 2**24  # one tensor dimension: 16,777,216 elements
MAX_SHAPE_PRODUCT = 2**48  # product of a shape's dims (the work of one launch): ~2.8e14
MAX_TOKENS = 10**9  # per budget line: far above any real sweep, below what a typo produces
MAX_BASELINE_VALUE = 2**16  # a tunable (tile size, warps, stages) is small
BOUND_REASONS = {
    "shape": f"each dimension <= {MAX_DIM:,} (2^24) and the product of a shape's dimensions <= 2^48: "
             "larger tensors do not fit one GPU",
    "tokens": f"<= {MAX_TOKENS:,} tokens per budget line: a larger value is almost always a typo",
    "rounds": f"the asset graph has {MAX_GRAPH_ROUNDS} rounds (round_1 .. round_{MAX_GRAPH_ROUNDS} assets, the same for "
              "every spec partition), so a sweep cannot run more; raise MAX_GRAPH_ROUNDS in kregress/core/names.py "
              "to build a longer graph",
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class HardwareLimits(_Strict):
    """Per-SM limits of the target; defaults are an H100 SXM (sm_90)."""

    sm_count: int = Field(default=132, gt=0, le=4096)
    max_registers_per_thread: int = Field(default=255, gt=0, le=1024)
    registers_per_sm: int = Field(default=65536, gt=0, le=2**20)
    max_shared_memory_per_block: int = Field(default=232448, gt=0, le=2**24)
    shared_memory_per_sm: int = Field(default=233472, gt=0, le=2**24)
    max_threads_per_sm: int = Field(default=2048, gt=0, le=8192)
    max_blocks_per_sm: int = Field(default=32, gt=0, le=1024)
    peak_tflops: float = Field(default=989.0, gt=0, le=1e5, description="dense bf16/fp16 tensor-core peak")
    hbm_gbps: float = Field(default=3350.0, gt=0, le=1e6)
    l2_bytes: int = Field(default=50 * 1024 * 1024, gt=0, le=2**34)


class Hardware(_Strict):
    device: str = Field(default="NVIDIA H100 80GB HBM3", max_length=200)
    arch: Arch = "sm_90"
    limits: HardwareLimits = HardwareLimits()

    @property
    def capability(self) -> int:
        return arch_capability(self.arch)


class Constraints(_Strict):
    max_registers_per_thread: int = Field(default=255, gt=0, le=1024)
    max_shared_memory_bytes: int = Field(default=232448, gt=0, le=2**24)
    numeric_tolerance: float = Field(default=1e-2, gt=0, le=1.0)
    max_spill_bytes: int = Field(default=0, ge=0, le=2**30)


class RegressionGuard(_Strict):
    metric: Literal["latency_p50"] = "latency_p50"
    not_worse_than_baseline_ratio: float = Field(default=1.03, ge=1.0, le=100.0)
    # 0.90 two-sided = a one-sided 95% claim per verdict; chosen on the recorded RTX 3090 runs
    # (bench/stats.py: no A/A false alarm, >=95% detection of a 6% slowdown even on the noisiest configs).
    confidence: float = Field(default=0.90, gt=0.5, lt=1.0)
    min_samples: int = Field(default=10, ge=3, le=100000)


class Search(_Strict):
    strategy: Strategy = "local"
    variants_per_round: int = Field(default=8, ge=1, le=64)
    max_rounds: int = Field(default=3, ge=1, le=MAX_GRAPH_ROUNDS)
    no_improve_rounds: int = Field(default=2, ge=1, le=MAX_GRAPH_ROUNDS)
    min_improvement: float = Field(default=0.01, ge=0, le=1.0, description="relative p50 gain that counts")
    seed: int = Field(default=0, ge=0, le=2**32 - 1)
    top_k: int = Field(default=5, ge=1, le=50, description="rows of history the agent sees")
    patches: bool = Field(default=False, description="llm/hybrid may propose source patches (shown the editable source)")


class Budget(_Strict):
    max_input_tokens_per_round: int = Field(default=20000, ge=0, le=MAX_TOKENS)
    max_output_tokens_per_round: int = Field(default=8000, ge=0, le=MAX_TOKENS)
    max_total_tokens: int = Field(default=100000, ge=0, le=MAX_TOKENS)


class Patches(_Strict):
    """The gate candidate patches go through (kregress.core.gate): size cap and gate factors."""

    max_changed_lines: int = Field(default=60, ge=1, le=5000, description="added + removed lines a patch may have")
    precision_factor: float = Field(default=4.0, gt=1.0, le=1000.0,
                                    description="NEEDS_REVIEW precision: error this many times the baseline's own")
    plausibility_factor: float = Field(default=2.0, gt=1.0, le=1000.0,
                                       description="NEEDS_REVIEW implausible: this many times faster than the baseline")
    seeds: int = Field(default=3, ge=3, le=32, description="secret input seeds per judgement")
    max_source_chars: int = Field(default=12000, ge=1000, le=200000,
                                  description="editable source shown to the llm policy (counted in the round's budget)")


class Objective(_Strict):
    metric: Literal["latency_p50"] = "latency_p50"
    aggregate: Literal["geomean", "max", "sum"] = "geomean"
    direction: Literal["minimize"] = "minimize"


class Benchmark(_Strict):
    backend: Literal["auto", "cuda", "interpreter"] = "auto"
    warmup_ms: int = Field(default=25, gt=0, le=600_000)
    rep_ms: int = Field(default=100, gt=0, le=600_000)
    timeout_s: float = Field(default=300.0, gt=0, le=86400.0, description="per variant, child process killed after")
    max_gpu_seconds_per_round: float | None = Field(
        default=None, gt=0, le=86400.0,
        description="cap on a round's GPU timing (cuda backend), variants timed best-forecast first; None: no cap")
    # The timing plan (kregress.core.batching.TimingPlan.from_spec): how every variant, config or patch, is timed.
    batch_order: Literal["interleaved", "random-blocks"] = Field(
        default="interleaved", description="slot order of a batch: B v1 B v2 ... B, or the variants shuffled per round")
    batch_rounds: int = Field(default=4, ge=1, le=1000,
                              description="passes over the batch (the first look, when max_batch_rounds is larger)")
    max_batch_rounds: int | None = Field(
        default=None, ge=1, le=1000,
        description="adaptive sampling: more rounds only for variants whose verdict is still open, up to this cap; "
                    "None: batch_rounds, fixed")
    lock_clocks: str | None = Field(default=None, pattern=r"^\d{2,5},\d{2,5}$",
                                    description="'SM,MEM' MHz: lock the GPU clocks for each batch (root); None: leave them")

    @model_validator(mode="after")
    def _cap_not_below_rounds(self) -> "Benchmark":
        if self.max_batch_rounds is not None and self.max_batch_rounds < self.batch_rounds:
            raise ValueError(f"benchmark.max_batch_rounds ({self.max_batch_rounds}) is below benchmark.batch_rounds "
                             f"({self.batch_rounds}): set it to at least {self.batch_rounds}, or leave it out (fixed rounds)")
        return self


class TaskSpec(_Strict):
    task_id: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]{0,62}$")
    description: str = Field(default="", max_length=2000)
    kernel_family: str
    dtype: Literal["fp16", "bf16", "fp32", "fp8_e4m3"] = "bf16"
    hardware: Hardware = Hardware()
    shape_matrix: list[dict[str, Any]] = Field(min_length=1, max_length=256)
    correctness_shapes: list[dict[str, Any]] = Field(min_length=1, max_length=256)
    objective: Objective = Objective()
    constraints: Constraints = Constraints()
    regression_guard: RegressionGuard = RegressionGuard()
    search: Search = Search()
    budget: Budget = Budget()
    benchmark: Benchmark = Benchmark()
    patches: Patches = Patches()
    baseline: dict[str, int]
    params: dict[str, Any] = Field(default_factory=dict, description="family-specific knobs")

    # The file the spec was loaded from (None for a spec built in code): bind resolves the family's
    # relative paths against its folder, and errors name it.
    _source: Path | None = PrivateAttr(default=None)

    @property
    def source(self) -> Path | None:
        return self._source

    def with_params(self, params: dict[str, Any]) -> "TaskSpec":
        """A copy with ``params`` replaced (bind: paths resolved), from the same file."""
        out = self.model_copy(update={"params": params})
        out._source = self._source
        return out

    def content_hash(self) -> str:
        blob = json.dumps(self.model_dump(mode="json"), sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def did_you_mean(value: Any, choices: list[str] | tuple[str, ...]) -> str:
    if not isinstance(value, str) or not choices:
        return ""
    close = difflib.get_close_matches(value, [str(c) for c in choices], n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close and close[0] != value else ""


def shape_bound_problems(shape: Any) -> list[tuple[str | None, Any, str]]:
    """(dimension or None for the whole shape, value, message): the family-independent bounds on a
    shape (see BOUND_REASONS['shape'])."""
    if not isinstance(shape, dict):
        return []
    dims = {k: v for k, v in shape.items() if isinstance(v, int) and not isinstance(v, bool)}
    big = [(str(k), v, f"{k}={v:,} is out of bounds; allowed: {BOUND_REASONS['shape']}")
           for k, v in dims.items() if v > MAX_DIM]
    if big:
        return big
    if dims and math.prod(dims.values()) > MAX_SHAPE_PRODUCT:
        return [(None, shape, f"the product of the dimensions ({math.prod(dims.values()):.3g}) is out of bounds; "
                              f"allowed: {BOUND_REASONS['shape']}")]
    return []


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
    if "max_length" in ctx:
        return f"allowed: at most {ctx['max_length']} item(s)"
    return ""


def _type_hint(err: dict[str, Any]) -> str:
    """Why a strict type error is an error, in the user's terms."""
    value, kind = err.get("input"), err["type"]
    if kind.startswith(("int_", "float_")) and isinstance(value, bool):
        return "a boolean is not a number: write the number itself (for example 1)"
    if kind.startswith(("int_", "float_")) and isinstance(value, str):
        try:
            float(value)
        except ValueError:  # a word (eight), not a quoted number: YAML read it as text
            return "a word is not a number: write the number in digits"
        return "a quoted string is not a number: remove the quotes"
    if kind == "int_type" and isinstance(value, float):
        return "needs a whole number, not a decimal"
    if kind == "string_type":
        return "needs text"
    return ""


def _bound_reason(loc: tuple, err: dict[str, Any]) -> str:
    if err["type"] == "less_than_equal" and loc and loc[0] == "budget":
        return "; " + BOUND_REASONS["tokens"]
    if err["type"] == "less_than_equal" and tuple(loc[:2]) in (("search", "max_rounds"), ("search", "no_improve_rounds")):
        return "; " + BOUND_REASONS["rounds"]
    return ""


def format_validation_error(path: str | Path, exc: ValidationError, model: type[BaseModel]) -> str:
    return "\n".join(_error_lines(path, exc, model))


def _error_lines(path: str | Path, exc: ValidationError, model: type[BaseModel]) -> list[str]:
    lines = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        where = ".".join(str(p) for p in loc) or "(top level)"
        value = err.get("input")
        if err["type"] == "extra_forbidden":
            parent_fields = _fields_at(model, loc[:-1])
            msg = f"unknown key; allowed keys here: {', '.join(parent_fields)}" if parent_fields else "unknown key"
            msg += did_you_mean(str(loc[-1]), parent_fields)
        else:
            msg = err["msg"].removeprefix("Value error, ")
            hint = _type_hint(err)
            if hint:
                msg += f" ({hint})"
            if err["type"] == "literal_error":
                msg += did_you_mean(value, _literal_choices(model, loc))
            msg += _bound_reason(loc, err)
        shown = json.dumps(value, default=str)[:120] if err["type"] != "missing" else "(missing)"
        allowed = _allowed_for(err)
        line = f"{path}: field '{where}': value {shown}: {msg}"
        expected = str((err.get("ctx") or {}).get("expected", "\0"))
        if allowed and allowed not in msg and "allowed" not in msg and expected not in msg:
            line += f" ({allowed})"
        lines.append(line)
    return lines


def _annotation_at(model: type[BaseModel], loc: tuple) -> Any:
    cur: Any = model
    for part in loc:
        field = getattr(cur, "model_fields", {}).get(part) if isinstance(part, str) else None
        if field is None:
            return None
        cur = field.annotation
    return cur


def _literal_choices(model: type[BaseModel], loc: tuple) -> list[str]:
    ann = _annotation_at(model, loc)
    return [str(a) for a in typing.get_args(ann)] if typing.get_origin(ann) is Literal else []


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


def parse_spec_data(data: Any, path: str | Path = "<spec>") -> tuple[TaskSpec | None, list[str], set[str]]:
    """(spec or None, one line per schema problem, the top-level fields that failed): the schema check
    alone. No family is imported; ``kregress.core.bind`` runs the family's checks."""
    if not isinstance(data, dict):
        return None, [f"{path}: the file must hold a YAML mapping (task_id: ..., kernel_family: ...), "
                      f"got {type(data).__name__}"], set()
    try:
        return TaskSpec.model_validate(data), [], set()
    except ValidationError as exc:
        return None, _error_lines(path, exc, TaskSpec), {str(e["loc"][0]) for e in exc.errors() if e["loc"]}


def parse_spec(data: Any, path: str | Path = "<spec>") -> TaskSpec:
    """A TaskSpec from a mapping, schema-checked (``SpecError`` lists every schema problem)."""
    spec, lines, _ = parse_spec_data(data, path)
    if lines:
        raise SpecError("\n".join(lines))
    return spec


class StrictLoader(yaml.SafeLoader):
    """SafeLoader that records every key given twice in one mapping (plain YAML keeps the last silently);
    ``duplicates`` holds (line, message) for each, so they are reported with every other problem."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self.duplicates: list[tuple[int, str]] = []


def _construct_mapping(loader: StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    loader.flatten_mapping(node)
    seen: dict[Any, yaml.Mark] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        try:
            hash(key)
        except TypeError:
            continue  # SafeLoader reports unhashable keys itself
        if key in seen:
            loader.duplicates.append((key_node.start_mark.line + 1,
                                      f"key {key!r} appears twice in one mapping (lines {seen[key].line + 1} and "
                                      f"{key_node.start_mark.line + 1}); keep one"))
        seen[key] = key_node.start_mark
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def read_yaml(text: str) -> tuple[Any, list[tuple[int, str]]]:
    """(data, duplicated keys as (line, message)); raises yaml.YAMLError for text that is not YAML."""
    loader = StrictLoader(text)
    try:
        return loader.get_single_data(), loader.duplicates
    finally:
        loader.dispose()


def read_spec_file(path: str | Path) -> tuple[Any, list[str]]:
    """(the file's YAML data, one line per key given twice); ``SpecError`` when the file is missing,
    unreadable or not YAML."""
    path = Path(path)
    if not path.is_file():
        raise SpecError(f"{path}: no such spec file")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(f"{path}: cannot read the file: {exc}") from None
    try:
        data, duplicates = read_yaml(text)
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: not valid YAML: {' '.join(str(exc).split())}") from None
    return data, [f"{path}: line {line}: {msg}" for line, msg in duplicates]


def load_spec(path: str | Path) -> TaskSpec:
    """Read and schema-check a spec file. Imports no family (so no torch, no Triton): the family's own
    checks run when the spec is bound (``kregress.core.bind.bind``). Duplicated keys and every schema
    problem are reported together in one ``SpecError``."""
    path = Path(path)
    data, lines = read_spec_file(path)
    spec, schema_lines, _ = parse_spec_data(data, path)
    lines += schema_lines
    if lines:
        raise SpecError("\n".join(lines))
    spec._source = path.resolve()
    return spec


def discover_specs(specs_dir: str | Path) -> dict[str, Path]:
    """task_id -> file for every *.yaml under specs_dir; duplicate task_ids are an error."""
    out: dict[str, Path] = {}
    for p in sorted(Path(specs_dir).glob("*.y*ml")):
        try:
            data = yaml.safe_load(p.read_text()) or {}
        except (yaml.YAMLError, OSError, UnicodeDecodeError):
            continue
        tid = data.get("task_id") if isinstance(data, dict) else None
        if not tid:
            continue
        if tid in out:
            raise SpecError(f"{p}: task_id {tid!r} is also used by {out[tid]}; task_ids must be unique")
        out[tid] = p
    return out
