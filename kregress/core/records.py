"""Records shared by kernels/, resources/ and kernel_assets/ (pydantic, no Dagster).

Every row that leaves a benchmark, an agent or the gateway is one of these, so that the asset graph,
the report and the ledger agree on field names. Failures are values: a row carries ``error`` and
``error_detail`` instead of raising.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from kregress.core.gate_report import GateReport
from kregress.core.names import Evidence, Role, VerdictKind  # noqa: E402  (re-exported)

Risk = Literal["low", "medium", "high"]

# Error classes a variant row can carry (the `error` column). Anything else is a bug.
ERROR_CLASSES = (
    "invalid_config",  # outside the space or fails a validity rule: never compiled
    "compile_failed",  # Triton / ptxas rejected it
    "out_of_resources",  # shared memory or registers beyond the hardware limit
    "numeric_mismatch",  # compared against the float64 reference and failed
    "nan_inf",  # produced NaN or Inf where the reference has none
    "runtime_error",  # the launch raised (illegal address, bad grid, ...)
    "timeout",  # the child process ran past the per-variant limit and was killed
    "crashed",  # the child process died (segfault, illegal memory access)
    "patch_rejected",  # a candidate patch refused before it ran: outside the editable region, a banned construct
    "patch_failed",  # a candidate patch that does not apply to the kernel source it names
)

# What a proposal may say about the bottleneck it attacks (optional on a forecast).
Bottleneck = Literal["compute", "memory", "latency"]


def config_hash(config: dict[str, Any]) -> str:
    """Stable short hash of a variant config (key order does not matter)."""
    blob = json.dumps({k: config[k] for k in sorted(config)}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def patch_sha256(patch: str | None) -> str | None:
    """sha256 of a patch's text (hex), None for no patch."""
    return hashlib.sha256(patch.encode()).hexdigest() if patch else None


def variant_hash(config: dict[str, Any], patch: str | None = None) -> str:
    """A variant's identity: ``config_hash`` alone for a config-only variant (so existing caches and
    ledgers keep their keys), else the config and the patch text together."""
    if not patch:
        return config_hash(config)
    blob = config_hash(config) + ":" + (patch_sha256(patch) or "")
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def config_label(config: dict[str, Any]) -> str:
    """Short human label, e.g. ``BM128-BN128-BK64-G8-s3-w8``."""
    abbrev = {
        "BLOCK_M": "BM",
        "BLOCK_N": "BN",
        "BLOCK_K": "BK",
        "BLOCK_H": "BH",
        "GROUP_M": "G",
        "num_stages": "s",
        "num_warps": "w",
        "num_splits": "sp",
    }
    return "-".join(f"{abbrev.get(k, k)}{v}" for k, v in config.items())


class Suggestion(BaseModel):
    """One proposed variant, from any policy (local search, LLM, replay)."""

    model_config = ConfigDict(extra="forbid")

    variant_id: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")
    config: dict[str, int]
    patch_summary: str = Field(max_length=120)
    expected_effect: str = Field(default="", max_length=300)
    risk: Risk = "medium"
    parent: str | None = None
    source: str = "local"
    round: int = Field(ge=0)
    # A candidate source patch: a unified diff (as `git diff` writes it) against the family's editable
    # region, paths relative to the family package's root. None: a config-only variant.
    patch: str | None = Field(default=None, max_length=200_000)
    # The forecast, stored before the variant is measured and never changed afterwards:
    # expected_speedup = baseline p50 / variant p50, with an 80% interval.
    expected_speedup: float | None = Field(default=None, gt=0)
    expected_speedup_low: float | None = Field(default=None, gt=0)
    expected_speedup_high: float | None = Field(default=None, gt=0)
    bottleneck: Bottleneck | None = None

    @property
    def config_hash(self) -> str:
        """The variant's identity: its config, and its patch's sha256 when it carries one."""
        return variant_hash(self.config, self.patch)

    @property
    def patch_sha256(self) -> str | None:
        return patch_sha256(self.patch)


class DroppedSuggestion(BaseModel):
    """A proposal that was not measured, and why (kept for the report and the next prompt)."""

    round: int
    source: str
    raw: str = Field(max_length=400)
    reason: str


class CompileStats(BaseModel):
    arch: str
    regs_per_thread: int
    spill_bytes: int  # local memory per thread (STACK + LOCAL from cuobjdump)
    smem_bytes: int
    num_warps: int
    num_stages: int
    occupancy: float  # theoretical active warps / max warps per SM, 0..1
    blocks_per_sm: int
    occupancy_limiter: str
    sass_instructions: int | None = None  # None: not disassembled (a sweep's compile; a review's has them)
    sass_mix: dict[str, int] = {}  # opcode class -> count (HMMA/HGMMA, LDG, LDS, STG, BAR, ...)
    compile_seconds: float
    cache_hit: bool = False
    # CUDA C++ families (kernels/cuda/nvcc.py): ptxas's own report, per the heaviest kernel of the variant
    spill_stores: int | None = None
    spill_loads: int | None = None
    smem_static_bytes: int | None = None  # __shared__ arrays (ptxas); smem_bytes = static + dynamic
    smem_dynamic_bytes: int | None = None  # what the launch requests (the family's CudaUnit)
    barriers: int | None = None
    facts_from: str = ""  # "ptxas -v; cuobjdump agrees"
    kernel: str = ""  # the entry the facts are of


class Correctness(BaseModel):
    ok: bool
    max_abs_err: float
    max_rel_err: float
    nan_inf: bool
    mismatches: int
    tolerance: float
    shapes_checked: list[str]
    mismatch_sample: str = ""  # first few mismatches, the text the agent sees
    # the tolerance's parts (largest over the shapes checked): |out - ref| <= atol + rtol * |ref|
    atol: float | None = None
    rtol: float | None = None
    dtype: str = ""
    # the float64 reference rounded to the output dtype, against itself: the error the format alone makes
    ref_rounding_abs: float | None = None
    ref_rounding_rel: float | None = None


class Measurement(BaseModel):
    """Latency of one variant on one shape.

    Measured evidence (cuda, replay) keeps every sample and its p20/p50/p80. Model evidence is one
    analytic estimate: ``p50_ms`` holds it, ``p20_ms``/``p80_ms`` are None (there is no spread to show).
    The device identity fields say where the samples were taken (empty / None where unknown, e.g. a
    recorded file or a model estimate); ``batch`` names the benchmark batch, whose baseline samples the
    variant is compared with (same worker process, same GPU, interleaved).
    """

    shape: str
    samples_ms: list[float]
    p20_ms: float | None = None
    p50_ms: float
    p80_ms: float | None = None
    tflops: float
    gbps: float
    evidence: Evidence
    device: str
    torch_version: str
    triton_version: str
    # device identity: which GPU, on which host, at which clocks
    gpu_name: str = ""
    gpu_uuid: str = ""
    host: str = ""
    driver: str = ""
    sm_clock_mhz_start: float | None = None
    sm_clock_mhz_end: float | None = None
    mem_clock_mhz_start: float | None = None
    mem_clock_mhz_end: float | None = None
    clocks_locked: str = ""  # "" = not locked; else what was locked, e.g. "sm 1755 MHz, mem 2619 MHz"
    batch: str = ""  # benchmark batch id; the baseline's samples of the same batch are its reference

    def device_key(self) -> tuple[str, str]:
        """(host, gpu uuid) where known, else (host, gpu name or device): samples from two keys never compare."""
        return (self.host, self.gpu_uuid or self.gpu_name or self.device)


class VariantResult(BaseModel):
    """Everything measured about one variant, failures included."""

    variant_id: str
    round: int
    source: str
    config: dict[str, int]
    config_hash: str
    patch_summary: str = ""
    expected_effect: str = ""
    risk: str = ""
    parent: str | None = None
    # the candidate patch (None: config only), its sha256 and the kernel hash it was applied to
    patch: str | None = None
    patch_sha256: str | None = None
    patch_base_hash: str | None = None
    # the forecast as proposed (never changed after measurement)
    expected_speedup: float | None = None
    expected_speedup_low: float | None = None
    expected_speedup_high: float | None = None
    bottleneck: str | None = None
    error: str | None = None
    error_detail: str = ""
    compile: CompileStats | None = None
    correctness: Correctness | None = None
    measurements: list[Measurement] = Field(default_factory=list)
    evidence: Evidence | None = None
    backend: str = ""
    # the baseline re-timed in the same batch as this variant (same process, same GPU, interleaved);
    # its verdict compares with these, not with the baseline row timed in another step
    batch_baseline: list[Measurement] = Field(default_factory=list)
    # the timing plan's rounds this variant took (one slot a side each) and at which look its sampling stopped
    # (kregress.core.batching.TimingPlan; None: not timed that way, e.g. replay or a model estimate)
    timing_rounds: int | None = None
    timing_looks: int | None = None
    # what the gate found for a patch variant (None: config only); the verdict reads it
    gate: GateReport | None = None

    @field_validator("error")
    @classmethod
    def _known_error(cls, v: str | None) -> str | None:
        if v is not None and v not in ERROR_CLASSES:
            raise ValueError(f"unknown error class {v!r}; allowed: {', '.join(ERROR_CLASSES)}")
        return v


# Why a REGRESS is one (Verdict.cause); PASS and NEEDS_REVIEW carry None.
# REGRESS causes: slower, wrong, crashed (the variant's process died, or its call raised where the
# baseline's did not), infeasible, rejected (a patch refused by the static gate or outside its editable
# region). NEEDS_REVIEW causes: precision (error several times the baseline's own, within tolerance),
# implausible (faster than speed of light, or than the spec's factor over the baseline), incomparable (baseline and variant timed on different devices or toolchains),
# unsettled (the gate saw a difference from the baseline, a program that wrote less or elsewhere, another grid, and no
# settling check fit this host: the verdict names the program and the evidence; a NEEDS_REVIEW without a cause saw nothing).
CAUSES = ("slower", "wrong", "crashed", "infeasible", "rejected")
REVIEW_CAUSES = ("precision", "implausible", "incomparable", "unsettled")
Cause = Literal["slower", "wrong", "crashed", "infeasible", "rejected", "precision", "implausible", "incomparable",
                "unsettled"]
# error class -> cause; constraint violations (spills, registers, shared memory) are "infeasible"
ERROR_CAUSES = {
    "invalid_config": "infeasible", "compile_failed": "infeasible", "out_of_resources": "infeasible",
    "numeric_mismatch": "wrong", "nan_inf": "wrong", "runtime_error": "wrong", "timeout": "infeasible",
    "crashed": "crashed", "patch_rejected": "rejected", "patch_failed": "rejected",
}


def base_row(s: Suggestion, backend: str) -> VariantResult:
    """The result row of a suggestion before any stage has run: the one row builder of every variant (a
    config, a patch, or both) on every backend."""
    return VariantResult(
        variant_id=s.variant_id, round=s.round, source=s.source, config=s.config, config_hash=s.config_hash,
        patch_summary=s.patch_summary, expected_effect=s.expected_effect, risk=s.risk, parent=s.parent,
        backend=backend, patch=s.patch, patch_sha256=s.patch_sha256, expected_speedup=s.expected_speedup,
        expected_speedup_low=s.expected_speedup_low, expected_speedup_high=s.expected_speedup_high,
        bottleneck=s.bottleneck,
    )


class ShapeVerdict(BaseModel):
    """A variant's latency verdict on one shape (verdicts_by_shape.parquet)."""

    variant_id: str
    shape: str
    verdict: VerdictKind
    cause: Cause | None = None
    reason: str = ""
    ratio: float | None = None
    ratio_ci_low: float | None = None
    ratio_ci_high: float | None = None
    p50_ratio: float | None = None
    n_variant: int = 0
    n_baseline: int = 0
    batch: str = ""
    evidence: Evidence | None = None


class Verdict(BaseModel):
    variant_id: str
    verdict: VerdictKind
    reasons: list[str]
    ratio: float | None = None  # the rule's estimate of variant / baseline (geomean over shapes)
    ratio_ci_low: float | None = None
    ratio_ci_high: float | None = None
    evidence: Evidence | None = None
    cause: Cause | None = None  # every REGRESS (CAUSES) and a NEEDS_REVIEW from the gate (REVIEW_CAUSES)
    p50_ratio: float | None = None  # plain p50 ratio (geomean of median ratios)
    worst_shape: str | None = None  # a REGRESS/slower names the shape it is slower on
    shapes: list[ShapeVerdict] = Field(default_factory=list)
    method: str = ""  # interval method and rule, e.g. "hodges-lehmann/shift"
    # draws a side the verdict took (cuda: timing rounds, one do_bench slot each; replay: recorded runs) and the
    # look its sampling stopped at (adaptive sampling; 1 when fixed)
    draws: int | None = None
    looks: int | None = None


# Columns of the ledger a usage report can group by.
USAGE_GROUPABLE = ("role", "key_alias", "task", "model", "round", "partition", "run_id", "status")


class UsageRecord(BaseModel):
    """One row per model-call attempt (the ledger). Never holds a key, only its alias."""

    ts: float
    run_id: str = ""
    partition: str = ""
    round: int = 0
    role: Role
    task: str = ""
    key_alias: str = ""
    model: str = ""
    request_id: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    latency_ms: float = 0.0
    attempt: int = 1
    status: str = ""
    error_class: str = ""
    cache_hit: bool = False
