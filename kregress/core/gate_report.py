"""The gate's record of one patch variant (``GateReport``), and the two review decisions it carries:
precision against the baseline's own error, plausibility against the speed of light. Pure."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, Field

from kregress.core.checks import Unsettled
from kregress.core.patch import Finding

# --- the gate's record -----------------------------------------------------------------------------

Stage = Literal["static", "apply", "sandbox", "compile", "correctness", "precision", "plausibility", "measure"]


class PrecisionMetrics(BaseModel):
    """Errors against the float64 reference on the same secret inputs, as fractions of the tolerance."""

    candidate_max: float  # max over elements of |out - ref| / (atol + rtol |ref|)
    baseline_max: float
    candidate_rms: float  # root mean square of the same ratio
    baseline_rms: float
    worst_case: str = ""  # the case (shape, distribution) where the ratio is largest


class GateReport(BaseModel):
    """What the gate found for one patch variant, stage by stage; ``gate_verdict`` reads it."""

    patch_sha256: str | None = None
    base_hash: str | None = None  # the kernel hash the patch applies to
    patched_hash: str | None = None
    changed_lines: int = 0
    round_trip_ok: bool = False
    findings: list[Finding] = Field(default_factory=list)  # static and region refusals
    runtime_violations: list[str] = Field(default_factory=list)  # sandbox / audit refusals at run time
    cases: int = 0  # correctness cases run (shape x seed x distribution, second calls included)
    cases_dropped: list[str] = Field(default_factory=list)  # generated cases the baseline itself fails (not used)
    hidden_shapes: list[str] = Field(default_factory=list)
    seeds: int = 0
    distributions: list[str] = Field(default_factory=list)
    precision: PrecisionMetrics | None = None
    precision_factor: float = 4.0
    plausibility_factor: float = 2.0
    notes: list[str] = Field(default_factory=list)
    unsettled: list[Unsettled] = Field(default_factory=list)  # differences seen that no check fitting this host settled
    seconds: float = 0.0


# --- precision and plausibility --------------------------------------------------------------------

# Errors below this fraction of the tolerance are noise (fp32 summation order): never a precision finding.
PRECISION_FLOOR_MAX = 0.02
PRECISION_FLOOR_RMS = 0.005


def precision_finding(m: PrecisionMetrics, factor: float) -> str | None:
    """The reason a candidate's error is several times the baseline's own on the same inputs (within
    tolerance or not), or None. Both the largest error and the RMS error (as fractions of the
    tolerance) are compared, each against the larger of the baseline's and a noise floor."""
    reasons = []
    base_max = max(m.baseline_max, PRECISION_FLOOR_MAX)
    base_rms = max(m.baseline_rms, PRECISION_FLOOR_RMS)
    if m.candidate_max > factor * base_max:
        reasons.append(f"largest error {m.candidate_max:.3g} of the tolerance vs the baseline's {m.baseline_max:.3g} "
                       f"({m.candidate_max / base_max:.1f}x > {factor:g}x)")
    if m.candidate_rms > factor * base_rms:
        reasons.append(f"RMS error {m.candidate_rms:.3g} of the tolerance vs the baseline's {m.baseline_rms:.3g} "
                       f"({m.candidate_rms / base_rms:.1f}x > {factor:g}x)")
    if not reasons:
        return None
    return "; ".join(reasons) + (f" (worst on {m.worst_case})" if m.worst_case else "") + \
        ": the patch lowers precision; review whether that is intended"


def plausibility_findings(per_shape: list[tuple[str, float, float | None, float]], factor: float) -> list[str]:
    """Reasons a variant is too fast to believe, one per shape: ``per_shape`` holds (shape, variant p50
    ms, baseline p50 ms or None, speed-of-light ms). Faster than the speed of light, or more than
    ``factor`` times faster than the baseline."""
    out = []
    for shape, p50, base, sol in per_shape:
        if p50 <= 0 or not math.isfinite(p50):
            out.append(f"[{shape}] a latency of {p50} ms is not a measurement")
            continue
        if sol > 0 and p50 < sol:
            out.append(f"[{shape}] {p50:.4g} ms is faster than the speed of light {sol:.4g} ms (FLOPs and bytes at the "
                       "spec's peaks): work is skipped or the timer is fooled")
        if base is not None and base > 0 and base / p50 > factor:
            out.append(f"[{shape}] {base / p50:.2f}x faster than the baseline (> patches.plausibility_factor {factor:g}x)")
    return out
