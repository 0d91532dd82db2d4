"""Forecasts scored against measurements: which policy and model to trust, and which proposals to measure first.

Every proposal may carry a forecast: ``expected_speedup`` (baseline p50 / variant p50) with an 80% interval
``[expected_speedup_low, expected_speedup_high]``. It is stored on the Suggestion before the variant is
measured and never changed; it orders work, it never decides a verdict. Here it is compared with what was
measured:

- ``measured_speedup(row, baseline)``: baseline p50 / variant p50, geomean over the shapes, against the
  baseline samples of the variant's own batch where the backend re-timed it (as the verdict does).
- ``score(history, models)``: one ``Scored`` row per forecast; a row is scored only on measured evidence
  (cuda, replay). On model evidence the "measurement" is itself an analytic estimate, so a score would
  compare two models: those rows are counted and marked not scorable.
- ``calibration(rows)``: per policy and model, the median |log(forecast / measured)|, the share of measured
  speedups inside their 80% interval (coverage; 0.8 is calibrated), and Spearman's rank correlation of
  forecast and measurement within each round (averaged over the rounds with at least 3 scored variants and
  some spread; how well the forecast orders a round's work).
- ``section(history, models)``: the report's markdown section (forecast beside measurement per variant, then
  the calibration table).

No Dagster, no Triton; numpy and scipy only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

from kregress.core.names import MEASURED_EVIDENCE
from kregress.core.records import VariantResult

MIN_RANKED = 3  # variants a round needs for its rank correlation to mean anything
NOMINAL_COVERAGE = 0.8


def measured_speedup(row: VariantResult, baseline: VariantResult | None) -> float | None:
    """baseline p50 / variant p50, geomean over the shapes both timed; None when either was not timed.

    The baseline side is the variant's own batch (``row.batch_baseline``) where the backend re-timed it."""
    base_ms = row.batch_baseline or (baseline.measurements if baseline is not None else [])
    if row.error or not row.measurements or not base_ms:
        return None
    base = {m.shape: m.p50_ms for m in base_ms}
    logs = [math.log(base[m.shape] / m.p50_ms) for m in row.measurements
            if m.shape in base and m.p50_ms > 0 and base[m.shape] > 0]
    return math.exp(sum(logs) / len(logs)) if logs else None


@dataclass(frozen=True)
class Scored:
    """One forecast beside what was measured."""

    variant_id: str
    round: int
    policy: str  # the proposal's source: llm, local, ...
    model: str  # the model that proposed it ("-" for a local policy)
    expected: float
    low: float | None
    high: float | None
    measured: float | None  # baseline p50 / variant p50, None when not timed (failed, or not measured)
    evidence: str | None
    bottleneck: str | None = None

    @property
    def scorable(self) -> bool:
        return self.measured is not None and self.evidence in MEASURED_EVIDENCE

    @property
    def abs_log_error(self) -> float | None:
        return abs(math.log(self.expected / self.measured)) if self.scorable else None

    @property
    def covered(self) -> bool | None:
        if not self.scorable or self.low is None or self.high is None:
            return None
        return self.low <= self.measured <= self.high  # type: ignore[operator]


def score(history: Sequence[VariantResult], models: Mapping[int, str] | None = None) -> list[Scored]:
    """A Scored row per variant that carried a forecast (the baseline, round 0, never does)."""
    models = models or {}
    baseline = next((r for r in history if r.round == 0), None)
    out = []
    for r in history:
        if r.round == 0 or r.expected_speedup is None:
            continue
        out.append(Scored(
            variant_id=r.variant_id, round=r.round, policy=r.source or "-",
            model=(models.get(r.round) or "-") if r.source == "llm" else "-",
            expected=float(r.expected_speedup), low=r.expected_speedup_low, high=r.expected_speedup_high,
            measured=measured_speedup(r, baseline), evidence=r.evidence, bottleneck=r.bottleneck,
        ))
    return out


@dataclass(frozen=True)
class Calibration:
    """How one policy's (and model's) forecasts held up against measured evidence."""

    policy: str
    model: str
    forecasts: int  # variants that carried a forecast
    scored: int  # of them measured on cuda / replay evidence
    not_scorable: int  # measured on model evidence only: cannot be scored
    median_abs_log_error: float | None
    coverage: float | None  # share of measured speedups inside their 80% interval
    with_interval: int  # scored rows that carried an interval
    spearman: float | None  # mean within-round rank correlation of forecast and measurement
    rounds_ranked: int  # rounds that entered the mean


def _spearman(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    from scipy.stats import spearmanr

    if len(xs) < MIN_RANKED or len(set(xs)) < 2 or len(set(ys)) < 2:
        return None
    rho = float(spearmanr(xs, ys).statistic)
    return rho if math.isfinite(rho) else None


def calibration(rows: Sequence[Scored]) -> list[Calibration]:
    """Per (policy, model): median |log(forecast/measured)|, interval coverage, mean within-round Spearman."""
    import numpy as np

    groups: dict[tuple[str, str], list[Scored]] = {}
    for r in rows:
        groups.setdefault((r.policy, r.model), []).append(r)
    out = []
    for (policy, model), rs in sorted(groups.items()):
        scored = [r for r in rs if r.scorable]
        errs = [r.abs_log_error for r in scored]
        cov = [r.covered for r in scored if r.covered is not None]
        rhos = []
        for rnd in sorted({r.round for r in scored}):
            in_round = [r for r in scored if r.round == rnd]
            rho = _spearman([r.expected for r in in_round], [r.measured for r in in_round])  # type: ignore[misc]
            if rho is not None:
                rhos.append(rho)
        out.append(Calibration(
            policy=policy, model=model, forecasts=len(rs), scored=len(scored),
            not_scorable=sum(1 for r in rs if r.measured is not None and not r.scorable),
            median_abs_log_error=float(np.median(errs)) if errs else None,
            coverage=(sum(cov) / len(cov)) if cov else None, with_interval=len(cov),
            spearman=(sum(rhos) / len(rhos)) if rhos else None, rounds_ranked=len(rhos),
        ))
    return out


def _f(x: float | None, fmt: str = "{:.3f}") -> str:
    return "-" if x is None else fmt.format(x)


def ratio_words(time_ratio: float | None, estimate: bool = False) -> str:
    """A time ratio (variant time / baseline time) in words, one convention everywhere: "12.5% slower"
    (takes 12.5% longer), "47.4% faster" (takes 47.4% less time), and beyond a factor of two "2.39x slower"
    (takes 2.39 times as long) or "3.10x faster" (a third of the time); " (model estimate)" when it is one."""
    if time_ratio is None or time_ratio != time_ratio or time_ratio <= 0:
        return ""
    if time_ratio >= 2:
        text = f"{time_ratio:.2f}x slower"
    elif time_ratio <= 0.5:
        text = f"{1 / time_ratio:.2f}x faster"
    else:
        d = (time_ratio - 1.0) * 100
        text = "same time" if abs(d) < 0.05 else f"{abs(d):.1f}% {'slower' if d > 0 else 'faster'}"
    return text + (" (model estimate)" if estimate else "")


def section(history: Sequence[VariantResult], models: Mapping[int, str] | None = None) -> str:
    """The report's forecast section: forecast beside measurement per variant, then calibration per policy and model."""
    rows = score(history, models)
    proposed = sum(1 for r in history if r.round > 0)
    if not rows:
        return (f"_none of the {proposed} proposed variants carried a forecast (expected_speedup with an 80% interval)_"
                if proposed else "_no variants were proposed_")
    lines = [
        "Each proposal's forecast (speedup = baseline p50 / variant p50, with an 80% interval) was stored before the "
        "variant was measured; it orders work and never decides a verdict. It is scored only on measured evidence "
        "(cuda, replay); on model evidence the measurement is itself an estimate and the forecast cannot be scored. "
        "The number columns here are speedups (baseline time / variant time: above 1 is faster), the other way "
        "round from a time ratio; each is also said in words, as the verdict table says its `vs baseline` "
        "(\"12.5% faster\": takes 12.5% less time; \"2.39x slower\": takes 2.39 times as long).",
        "",
        "| variant | round | policy | model | forecast speedup | forecast in words | 80% interval | measured speedup | "
        "measured in words | inside | evidence |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        interval = f"[{_f(r.low, '{:.2f}')}, {_f(r.high, '{:.2f}')}]" if r.low is not None else "-"
        inside = {True: "yes", False: "no", None: "-"}[r.covered]
        measured = _f(r.measured) if r.scorable else ("not scorable" if r.measured is not None else "not timed")
        said = ratio_words(1 / r.measured) if r.scorable and r.measured else "-"
        lines.append(f"| {r.variant_id} | {r.round} | {r.policy} | {r.model} | {r.expected:.3f} | "
                     f"{ratio_words(1 / r.expected) if r.expected else '-'} | {interval} | {measured} | {said} | "
                     f"{inside} | {r.evidence or '-'} |")
    lines += ["", "| policy | model | forecasts | scored | median abs log error | interval coverage (0.8 nominal) | "
                  "Spearman within round | rounds ranked |", "|---|---|---|---|---|---|---|---|"]
    for c in calibration(rows):
        cov = f"{c.coverage:.2f} ({c.with_interval})" if c.coverage is not None else "-"
        lines.append(f"| {c.policy} | {c.model} | {c.forecasts} | {c.scored} | {_f(c.median_abs_log_error)} | {cov} | "
                     f"{_f(c.spearman, '{:.2f}')} | {c.rounds_ranked} |")
    unscorable = sum(1 for r in rows if r.measured is not None and not r.scorable)
    if unscorable:
        lines += ["", f"{unscorable} forecast(s) rest on model evidence (an analytic estimate, not a measurement): they cannot "
                      "be scored; calibration needs cuda or replay evidence."]
    return "\n".join(lines)
