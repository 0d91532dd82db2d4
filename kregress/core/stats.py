"""Statistical latency verdicts on samples, not on single numbers (no Dagster import).

A variant is compared with the baseline on the same shapes. Each side is a list with one entry per
shape, each entry the timing samples (ms) of that shape. An interval method gives an estimate of the
ratio variant / baseline (geometric mean over shapes) and its confidence interval; ``classify`` turns
it into a verdict against the guard (e.g. 1.03):

* REGRESS       the estimate is above the guard AND the interval lies entirely above 1.005: slower than
                the guard allows, and slower (by more than half a percent) beyond doubt;
* PASS          the interval lies entirely below the guard;
* NEEDS_REVIEW  anything else, or too few samples (``min_samples`` per side and shape).

That is the ``"shift"`` rule (default). The earlier rule, ``"interval"``, asked the whole
interval to clear the guard (REGRESS only when low > guard); on noisy timings a +6% slowdown rarely
does, so it missed real slowdowns (see below). ``verdict_by_shape`` applies the rule to every shape
and to all of them together: a variant is REGRESS if any shape is, and the shape is named.

Interval methods:

* ``"aligned"`` (default): per shape, ``aligned_shift`` where the timings sit in tight clusters (the
  leave-one-out kernel bandwidth of the pooled, aligned samples is at most 0.2% and each side has 10
  samples): the shift that lines the variant's clusters up with the baseline's, with its likelihood
  interval; on every other shape the Hodges-Lehmann shift below. ``RatioCI.aligned_shapes`` counts
  the shapes judged on the clusters, and the label says so ("aligned shift ratio").
* ``"hodges-lehmann"``: per shape, the Hodges-Lehmann shift of the log samples (median of all pairwise
  differences) with the distribution-free interval obtained by inverting the Mann-Whitney test.
* ``"bootstrap"``: percentile bootstrap of the p50 ratio itself (each replicate resamples every
  shape's samples within the shape and side, takes the medians and their geometric mean).

Several shapes are combined by averaging the per-shape log shifts and adding their variances (read
off each shape's interval, normal approximation). ``ratio`` is exp(shift); ``p50`` the plain p50 ratio.

Why these defaults: ``bench/stats.py`` on the four recorded files in ``../shared/data/replay``
(CLBlast GEMM and pnpoly on an RTX 3090, convolution and dedispersion on an RTX A4000: real runs per
configuration, A/A comparisons from one configuration's runs, injected slowdowns, 1,000 trials per
cell; ``.venv/bin/python bench/stats.py --trials 1000``, 2 min 16 s on 2 cores). At confidence 0.90
and guard 1.03, resample (32 draws a side) and split (random halves of the runs) modes:

* false alarms (A/A REGRESS): 0.0% in every cell of every file, except pnpoly split/noisy 0.5%.
* detection of +6%: 99.5-100% on every file and stratum, except convolution split/noisy 96.9% and
  pnpoly split (5 runs a side): 93.4% over all configurations, 55.7% on the noisiest 5%.
* The noisiest 5% of the convolution configurations switch between clock regimes within a session:
  their runs sit in two or three clusters 5-15% apart, each within about 0.1%. A +6% slowdown moves a
  cluster onto the place of another, so ranks alone cannot tell it from a change in how often each
  regime occurred: Hodges-Lehmann detected 89.8% (resample) / 65.1% (split) there, the asv-style rule
  54.0% / 15.6%, the plain p50 threshold 84.3% / 76.3% at 16.5% / 23.8% false alarms, the rule before
  the earlier rule 30.7% / 17.7%. Lining up the cluster positions detects 100% / 96.9% at 0.0% false alarms.
* Where the timings are smooth the kernel likelihood at a fixed threshold is overconfident (on
  simulated lognormal noise of 6%, 16 samples a side, 300 A/A trials, forced past the gate: 8.7% false
  alarms against Hodges-Lehmann's 2.7%), hence the bandwidth gate; there the rule is the
  Hodges-Lehmann one, with its distribution-free interval.
* pnpoly has 10 runs per configuration, so split mode compares 5 runs a side (``min_samples`` lowered
  to 5; below ``ALIGN_MIN_SAMPLES``, so Hodges-Lehmann). No location estimate tried (Hodges-Lehmann,
  median, minimum, aligned) separates A/A from +6% there at <= 1% false alarms: on the noisiest 5% the
  Hodges-Lehmann estimate alone exceeds 1.045 in 5.9% of A/A trials. More runs per side is the fix.
* The likelihood interval is narrow: on A/A it excludes 1.0 in 11-31% of trials (the clusters' 0.1%
  jitter), against 1-11% for the Mann-Whitney interval. The verdict does not rest on that: REGRESS
  needs the estimate above the guard and the interval above 1.005 (``DEFAULT_MIN_SHIFT``); with the
  floor at 1.0 the Hodges-Lehmann rule had 2.2-2.6% false alarms on the noisy split cells.
* Drift: when the baseline is the first half of a session and the variant the second ("sequential"),
  no rule survives the convolution file's regime switches (19.2% false alarms over all
  configurations, 97.2% on the noisiest; Hodges-Lehmann 16.5% / 95.9%, asv 12.1% / 88.4%).
  Interleaving the same runs (baseline, variant, baseline, ... as ``kregress.core.batching`` times
  them) takes them to 0.0% and detects +6% in 98.7-100%; hence the same-batch baseline of the
  benchmark backends.

Adaptive (sequential) sampling: ``SequentialDesign`` looks at 6, 10, 16, 26 and 32 draws a side and stops
at the first look whose verdict is PASS or REGRESS; the 10% error budget is spent over the looks (Bonferroni:
1.25% at each of the first four, 5% at the last, so that where the cap is reached the interval is nearly the
fixed rule's), which keeps every look's interval honest under optional stopping. On the recorded files
(``.venv/bin/python bench/stats.py --adaptive --trials 1000 --modes resample,split --replay all --replay
data/replay/gemm_clblast_RTX_3090_trimmed.json.gz``, about 7 minutes on 2 busy cores), against the same rule
at a fixed 8 draws a side:

* all configurations, every 32-run file, resample and split: A/A review 0.0-1.3% (fixed 8: 0.0-15.0%),
  median 6 draws a side (p90 6-10), detection at +6% 99.1-100% (fixed 8: 89.2-100%), false alarms
  0.0-0.1%: every target met;
* the noisiest 5% (clock-regime clusters): median 10 draws a side where the timings cluster (the aligned
  interval needs 10 a side: convolution, dedispersion, pnpoly resample), 6 on the GEMMs; review 0.0-0.4%
  resample, 1.7% dedispersion split, 3.3% convolution split (fixed at the split cap of 16 a side: 4.0%;
  fixed 8: 69.6%); detection 97.1-100%; false alarms <= 0.6%. A median of 8 is not reached there: fewer
  than 10 draws from two or three clusters 5-15% apart cannot bound a 3% guard (the aligned likelihood at
  6 or 8 draws was tried: 2.5% and 1.0% false alarms);
* pnpoly split has 5 runs a side: one look at 90%, the fixed rule itself (review 32.5%, detection 92.0%).

``asv_rule`` and ``median_threshold_rule`` are the alternatives the benchmark compares against.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from statistics import NormalDist
from typing import Sequence, Union

import numpy as np

from kregress.core.names import NEEDS_REVIEW, PASS, REGRESS  # noqa: E402

METHODS = ("bootstrap", "hodges-lehmann", "aligned")
DEFAULT_METHOD = "aligned"
# How an interval becomes a verdict (see ``classify``): "shift" (default) or "interval" (the old rule).
RULES = ("shift", "interval")
DEFAULT_RULE = "shift"
# The shift rule's significance floor: a REGRESS needs the whole interval above 1 + this (0.5%).
DEFAULT_MIN_SHIFT = 0.005
DEFAULT_CONFIDENCE = 0.90
DEFAULT_GUARD = 1.03
DEFAULT_MIN_SAMPLES = 10
# The "aligned" method (see ``aligned_shift``): kernel bandwidths (log units; 0.001 is 0.1%) the
# leave-one-out likelihood chooses from; the likelihood is used only when the chosen one is at most
# ALIGN_MAX_BANDWIDTH (the timings sit in tight clusters) and each side has ALIGN_MIN_SAMPLES.
ALIGN_BANDWIDTHS = (0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064)
ALIGN_MAX_BANDWIDTH = 0.002
ALIGN_MIN_SAMPLES = 10
ALIGN_MAX_PAIRS = 256 * 256  # beyond this many sample pairs Hodges-Lehmann has the power (and costs less)
_ALIGN_FLOOR = 1e-6  # density floor: a sample that matches nothing costs log(1e-6) instead of -inf

Samples = Union[Sequence[float], Sequence[Sequence[float]], np.ndarray]


@dataclass(frozen=True)
class RatioCI:
    """Latency ratio (variant / baseline, geometric mean over shapes) with its confidence interval.

    ``ratio`` is the method's own estimate, the one its interval brackets: the p50 ratio for the
    bootstrap, the Hodges-Lehmann shift (as a ratio) for ``hodges-lehmann``. ``p50`` is always the
    plain p50 ratio (geometric mean of median ratios), for the tables.

    ``n_variant`` / ``n_baseline`` are the fewest samples any one shape has on that side: the count
    that limits what the interval can say, and what ``classify``'s ``min_samples`` is checked against.
    """

    ratio: float
    low: float
    high: float
    confidence: float
    method: str
    n_variant: int
    n_baseline: int
    shapes: int = 1
    p50: float | None = None
    aligned_shapes: int = 0  # shapes judged on the cluster-aligned likelihood (method "aligned")

    @property
    def label(self) -> str:
        if self.method == "bootstrap":
            return "p50 ratio"
        if self.aligned_shapes:
            return "aligned shift ratio" if self.aligned_shapes == self.shapes else (
                f"shift ratio ({self.aligned_shapes} of {self.shapes} shapes aligned)")
        return "shift ratio"

    def describe(self) -> str:
        """``p50 ratio 1.071 [1.052, 1.090] at 95%`` (``shift ratio`` for Hodges-Lehmann)."""
        # an interval narrower than the 3-decimal display (runs that barely vary) gets 4 decimals, not a point
        d = 4 if all(math.isfinite(x) for x in (self.low, self.high)) and f"{self.low:.3f}" == f"{self.high:.3f}" else 3
        return (f"{self.label} {_fmt(self.ratio, d)} [{_fmt(self.low, d)}, {_fmt(self.high, d)}] at "
                f"{_pct(self.confidence)}")


# --------------------------------------------------------------------------------------------------
# input handling


def _as_shapes(samples: Samples, side: str) -> list[np.ndarray]:
    """Per-shape float arrays. A flat list of numbers is taken as a single shape."""
    if isinstance(samples, np.ndarray):
        samples = samples.tolist() if samples.ndim > 1 else [samples.tolist()]
    if isinstance(samples, (str, bytes)) or not isinstance(samples, Sequence):
        raise ValueError(f"{side} samples must be a list of per-shape lists of timings (ms)")
    if len(samples) == 0:
        raise ValueError(f"{side} samples are empty: at least one shape with samples is needed")
    if all(isinstance(x, (int, float, np.floating, np.integer)) and not isinstance(x, bool) for x in samples):
        samples = [samples]
    shapes = []
    for i, s in enumerate(samples):
        if isinstance(s, (str, bytes)) or not isinstance(s, (Sequence, np.ndarray)):
            raise ValueError(f"{side} shape {i}: expected a list of timings (ms), got {type(s).__name__}")
        try:
            arr = np.asarray(s, dtype=float).reshape(-1)
        except (TypeError, ValueError):
            raise ValueError(f"{side} shape {i}: timings must be numbers") from None
        if arr.size == 0:
            raise ValueError(f"{side} shape {i} has no samples")
        if not np.all(np.isfinite(arr)) or np.any(arr <= 0):
            bad = arr[~(np.isfinite(arr) & (arr > 0))][0]
            raise ValueError(f"{side} shape {i}: timings must be finite and positive (got {bad!r})")
        shapes.append(arr)
    return shapes


def _check_pair(variant: Samples, baseline: Samples) -> tuple[list[np.ndarray], list[np.ndarray]]:
    v = _as_shapes(variant, "variant")
    b = _as_shapes(baseline, "baseline")
    if len(v) != len(b):
        raise ValueError(f"variant has {len(v)} shapes but baseline has {len(b)}; they must match shape by shape")
    return v, b


def p50_ratio(variant: Samples, baseline: Samples) -> float:
    """Geometric mean over shapes of median(variant) / median(baseline)."""
    v, b = _check_pair(variant, baseline)
    return _p50_ratio(v, b)


def _p50_ratio(v: list[np.ndarray], b: list[np.ndarray]) -> float:
    logs = [math.log(float(np.median(x)) / float(np.median(y))) for x, y in zip(v, b)]
    return math.exp(sum(logs) / len(logs))


# --------------------------------------------------------------------------------------------------
# intervals


def ratio_ci(
    variant: Samples,
    baseline: Samples,
    confidence: float = DEFAULT_CONFIDENCE,
    n_boot: int = 2000,
    seed: int = 0,
    method: str = DEFAULT_METHOD,
) -> RatioCI:
    """Confidence interval of the p50 ratio variant / baseline.

    ``variant`` and ``baseline`` hold one list of samples (ms) per shape, in the same shape order.
    Deterministic for a given ``seed`` (the Hodges-Lehmann method uses no randomness at all).
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be between 0 and 1 (exclusive), got {confidence!r}")
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; allowed: {', '.join(METHODS)}")
    v, b = _check_pair(variant, baseline)
    p50 = _p50_ratio(v, b)
    aligned = 0
    if method == "bootstrap":
        if int(n_boot) < 100:
            raise ValueError(f"n_boot must be at least 100, got {n_boot!r}")
        low, high = _bootstrap_interval(v, b, confidence, int(n_boot), seed)
        ratio = p50
    else:
        ratio, low, high, aligned = _hodges_lehmann_interval(v, b, confidence, aligned=method == "aligned")
    return RatioCI(
        aligned_shapes=aligned,
        ratio=ratio,
        p50=p50,
        low=low,
        high=high,
        confidence=float(confidence),
        method=method,
        n_variant=min(x.size for x in v),
        n_baseline=min(y.size for y in b),
        shapes=len(v),
    )


def _boot_log_medians(rng: np.random.Generator, x: np.ndarray, n_boot: int) -> np.ndarray:
    """log of the median of ``n_boot`` resamples (with replacement) of x.

    x is sorted once, so the median of a resample is read off the middle order statistics of its
    indices (np.partition on small ints), which is about twice as fast as np.median on the values.
    """
    xs = np.sort(x)
    n = xs.size
    lo, hi = (n - 1) // 2, n // 2
    idx = rng.integers(0, n, size=(n_boot, n))
    part = np.partition(idx, (lo, hi) if lo != hi else lo, axis=1)
    med = 0.5 * (xs[part[:, lo]] + xs[part[:, hi]])
    return np.log(med)


def _bootstrap_interval(
    v: list[np.ndarray], b: list[np.ndarray], confidence: float, n_boot: int, seed: int
) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    acc = np.zeros(n_boot)
    for x, y in zip(v, b):
        acc += _boot_log_medians(rng, x, n_boot) - _boot_log_medians(rng, y, n_boot)
    acc /= len(v)
    alpha = 1.0 - confidence
    lo, hi = np.quantile(acc, [alpha / 2.0, 1.0 - alpha / 2.0])
    return math.exp(lo), math.exp(hi)


def hodges_lehmann(x: np.ndarray, y: np.ndarray, confidence: float) -> tuple[float, float, float]:
    """Hodges-Lehmann shift of x over y and its distribution-free interval, (estimate, low, high).

    The interval holds the pairwise differences x_i - y_j between the order statistics whose ranks
    invert the two-sided Mann-Whitney test at ``1 - confidence`` (normal approximation of U, which is
    accurate from about 10 samples a side).
    """
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    n, m = x.size, y.size
    d = np.sort((x[:, None] - y[None, :]).reshape(-1))
    est = float(np.median(d))
    z = NormalDist().inv_cdf(0.5 + confidence / 2.0)
    c = math.floor(n * m / 2.0 - z * math.sqrt(n * m * (n + m + 1) / 12.0))
    if c < 1:  # too few samples for this confidence: the interval is everything observed
        return est, float(d[0]), float(d[-1])
    return est, float(d[c - 1]), float(d[n * m - c])


def _loo_bandwidth(x: np.ndarray) -> float:
    """The bandwidth of ``ALIGN_BANDWIDTHS`` with the highest leave-one-out log-likelihood of x
    (Gaussian kernel density): tight clusters choose the smallest, smooth noise a wider one."""
    best, chosen = -math.inf, ALIGN_BANDWIDTHS[-1]
    diff = x[:, None] - x[None, :]
    for h in ALIGN_BANDWIDTHS:
        z = diff / h
        k = np.exp(-0.5 * z * z)
        np.fill_diagonal(k, 0.0)
        dens = k.sum(axis=1) / ((x.size - 1) * h * math.sqrt(2.0 * math.pi))
        score = float(np.log(dens + _ALIGN_FLOOR / h).sum())
        if score > best:
            best, chosen = score, h
    return chosen


def aligned_shift(x: np.ndarray, y: np.ndarray, confidence: float) -> tuple[float, float, float] | None:
    """The cluster-aligned shift of x over y (log samples) and its likelihood interval, or None.

    GPU timings often sit in a few tight clusters (clock regimes, timer ticks): runs of one config at
    0.89, 1.00 and 1.06 of the median, each within 0.1%. A rank method only sees that a variant's
    samples are larger; where the clusters are, it cannot tell a 6% shift from a change in how often
    each regime occurred. The cluster positions can: shifted by the true amount, every variant sample
    lands on a baseline cluster. This estimates the shift d that maximises the symmetric profile
    likelihood

        l(d) = sum_i log(mean_j K_h(x_i - d - y_j) + floor) + sum_j log(mean_i K_h(x_i - d - y_j) + floor)

    (K_h Gaussian; each sample explained by the other side's density), over a grid of step h/4
    anchored at the Hodges-Lehmann estimate, and returns (d, low, high) with [low, high] the hull of
    {d : l(d) >= max l - z^2} (z the normal quantile of ``confidence``, twice the Wilks value).

    The bandwidth h is chosen by leave-one-out likelihood on the pooled, Hodges-Lehmann-aligned
    samples. Returns None (use Hodges-Lehmann) unless h <= ``ALIGN_MAX_BANDWIDTH`` and both sides
    have ``ALIGN_MIN_SAMPLES`` (with at most ``ALIGN_MAX_PAIRS`` pairs): on smooth noise a kernel
    likelihood at a fixed threshold is overconfident, on tight clusters it is what tells a shift from
    a regime change (``bench/stats.py``).
    The result moves exactly with a shift of x (the grid is anchored at an equivariant estimate).
    """
    n, m = x.size, y.size
    if min(n, m) < ALIGN_MIN_SAMPLES or n * m > ALIGN_MAX_PAIRS:
        return None
    d = (x[:, None] - y[None, :]).reshape(-1)
    anchor = float(np.median(d))
    h = _loo_bandwidth(np.concatenate([x - anchor, y]))
    if h > ALIGN_MAX_BANDWIDTH:
        return None
    q = h / 4.0
    rel = d - anchor
    offsets = np.unique(np.round(rel / q))
    ll = np.empty(offsets.size)
    step = max(1, 2_000_000 // d.size)  # candidates per block: about 2M kernel values at a time
    for s in range(0, offsets.size, step):
        c = offsets[s : s + step] * q
        z = (rel[None, :] - c[:, None]) / h
        k = np.exp(-0.5 * z * z).reshape(c.size, n, m)
        ll[s : s + step] = (np.log(k.mean(axis=2) + _ALIGN_FLOOR).sum(axis=1)
                            + np.log(k.mean(axis=1) + _ALIGN_FLOOR).sum(axis=1))
    top = int(np.argmax(ll))
    z = NormalDist().inv_cdf(0.5 + confidence / 2.0)
    inside = offsets[ll >= ll[top] - z * z]
    return (anchor + float(offsets[top]) * q, anchor + float(inside.min()) * q, anchor + float(inside.max()) * q)


def _hodges_lehmann_interval(
    v: list[np.ndarray], b: list[np.ndarray], confidence: float, aligned: bool = False
) -> tuple[float, float, float, int]:
    """(estimate, low, high, shapes aligned): ratios from the mean over shapes of the per-shape log shifts.

    With ``aligned``, a shape whose timings cluster uses ``aligned_shift`` instead of Hodges-Lehmann."""
    parts = []
    n_aligned = 0
    for x, y in zip(v, b):
        lx, ly = np.log(x), np.log(y)
        part = aligned_shift(lx, ly, confidence) if aligned else None
        n_aligned += part is not None
        parts.append(part if part is not None else hodges_lehmann(lx, ly, confidence))
    if len(parts) == 1:
        est, lo, hi = parts[0]
        return math.exp(est), math.exp(lo), math.exp(hi), n_aligned
    z = NormalDist().inv_cdf(0.5 + confidence / 2.0)
    k = len(parts)
    est = sum(p[0] for p in parts) / k
    se = math.sqrt(sum(((p[2] - p[1]) / (2.0 * z)) ** 2 for p in parts)) / k
    return math.exp(est), math.exp(est - z * se), math.exp(est + z * se), n_aligned


# --------------------------------------------------------------------------------------------------
# verdicts


def _fmt(x: float, digits: int = 3) -> str:
    return f"{x:.{digits}f}" if math.isfinite(x) else str(x)


def _pct(confidence: float) -> str:
    return f"{confidence * 100:g}%"


def classify(
    ci: RatioCI,
    guard: float = DEFAULT_GUARD,
    min_samples: int = DEFAULT_MIN_SAMPLES,
    rule: str = DEFAULT_RULE,
    min_shift: float = DEFAULT_MIN_SHIFT,
) -> tuple[str, str]:
    """(verdict, reason) for a latency comparison.

    ``rule="shift"`` (default):

    * REGRESS when the estimate is above ``guard`` AND the interval lies entirely above
      ``1 + min_shift`` (1.005): slower by more than the guard, and slower beyond doubt (a one-sided
      test at (1 + confidence) / 2 that the slowdown exceeds half a percent);
    * PASS when the interval lies entirely below ``guard``;
    * NEEDS_REVIEW otherwise (estimate above the guard but not significant, or an interval that
      reaches past the guard).

    ``rule="interval"`` (the earlier rule): REGRESS only when the whole interval is above the
    guard (low > guard), PASS when it is entirely below it, NEEDS_REVIEW otherwise. It asks the
    interval to clear the guard, which on noisy timings a +6% slowdown rarely does.

    Either way NEEDS_REVIEW whenever a side has fewer than ``min_samples`` samples in some shape.
    """
    if not (isinstance(guard, (int, float)) and math.isfinite(guard) and guard > 0):
        raise ValueError(f"guard must be a positive number, got {guard!r}")
    if isinstance(min_samples, bool) or not isinstance(min_samples, int) or min_samples < 1:
        raise ValueError(f"min_samples must be a positive integer, got {min_samples!r}")
    if rule not in RULES:
        raise ValueError(f"unknown rule {rule!r}; allowed: {', '.join(RULES)}")
    head = ci.describe()
    if ci.n_variant < min_samples or ci.n_baseline < min_samples:
        return NEEDS_REVIEW, (
            f"too few samples for a latency verdict: {ci.n_variant} variant and {ci.n_baseline} baseline "
            f"samples per shape, at least {min_samples} per side are needed ({head})"
        )
    if not all(math.isfinite(x) for x in (ci.ratio, ci.low, ci.high)):
        return NEEDS_REVIEW, f"{head} is not a finite interval; the samples cannot be judged"
    if rule == "interval":
        if ci.low > guard:
            return REGRESS, f"{head} is entirely above the guard {guard:g}"
        if ci.high < guard:
            return PASS, f"{head} is entirely below the guard {guard:g}"
        return NEEDS_REVIEW, (
            f"{head} straddles the guard {guard:g}: the samples cannot tell whether the variant is within it"
        )
    floor = 1.0 + min_shift
    if ci.ratio > guard and ci.low > floor:
        return REGRESS, f"{head}: above the guard {guard:g} and entirely above {floor:g} (slower beyond doubt)"
    if ci.high < guard:
        return PASS, f"{head} is entirely below the guard {guard:g}"
    if ci.ratio > guard:
        return NEEDS_REVIEW, (
            f"{head}: above the guard {guard:g} but the interval reaches {floor:g}, so the slowdown is not established"
        )
    return NEEDS_REVIEW, (
        f"{head} reaches past the guard {guard:g}: the samples cannot tell whether the variant is within it"
    )


def verdict(
    variant: Samples,
    baseline: Samples,
    guard: float = DEFAULT_GUARD,
    confidence: float = DEFAULT_CONFIDENCE,
    min_samples: int = DEFAULT_MIN_SAMPLES,
    n_boot: int = 2000,
    seed: int = 0,
    method: str = DEFAULT_METHOD,
    rule: str = DEFAULT_RULE,
) -> tuple[str, str, RatioCI]:
    """``classify(ratio_ci(...))`` in one call: (verdict, reason, interval)."""
    ci = ratio_ci(variant, baseline, confidence=confidence, n_boot=n_boot, seed=seed, method=method)
    v, r = classify(ci, guard=guard, min_samples=min_samples, rule=rule)
    return v, r, ci


@dataclass(frozen=True)
class ShapeVerdicts:
    """A variant's verdict over several shapes: the combined one and one per shape.

    ``verdict`` is REGRESS when the combined comparison or ANY shape is REGRESS (``worst_shape``
    names the slowest such shape), PASS when the combined comparison and every shape pass, and
    NEEDS_REVIEW otherwise.
    """

    verdict: str
    reason: str
    combined: RatioCI
    per_shape: list[tuple[str, str, RatioCI]]  # (verdict, reason, interval) in shape order
    worst_shape: int | None = None


def verdict_by_shape(
    variant: Samples,
    baseline: Samples,
    guard: float = DEFAULT_GUARD,
    confidence: float = DEFAULT_CONFIDENCE,
    min_samples: int = DEFAULT_MIN_SAMPLES,
    seed: int = 0,
    method: str = DEFAULT_METHOD,
    rule: str = DEFAULT_RULE,
    shape_names: Sequence[str] | None = None,
) -> ShapeVerdicts:
    """The combined verdict and one per shape (same rule, same guard)."""
    v, b = _check_pair(variant, baseline)
    names = list(shape_names) if shape_names is not None else [f"shape {i}" for i in range(len(v))]
    kind, reason, ci = verdict(v, b, guard, confidence, min_samples, seed=seed, method=method, rule=rule)
    per = [verdict([x], [y], guard, confidence, min_samples, seed=seed + i, method=method, rule=rule)
           for i, (x, y) in enumerate(zip(v, b))]
    if len(per) == 1:
        return ShapeVerdicts(kind, reason, ci, per, 0 if kind == REGRESS else None)
    slow = [i for i, p in enumerate(per) if p[0] == REGRESS]
    if slow:
        worst = max(slow, key=lambda i: per[i][2].ratio)
        others = f" (also {', '.join(names[i] for i in slow if i != worst)})" if len(slow) > 1 else ""
        return ShapeVerdicts(REGRESS, f"slower on {names[worst]}{others}: {per[worst][1]}", ci, per, worst)
    if kind == REGRESS:
        return ShapeVerdicts(REGRESS, f"over all {len(per)} shapes: {reason}", ci, per, None)
    if kind == PASS and all(p[0] == PASS for p in per):
        return ShapeVerdicts(PASS, f"every shape passes; over all {len(per)} shapes: {reason}", ci, per, None)
    unsure = [names[i] for i, p in enumerate(per) if p[0] != PASS]
    where = f"not established on {', '.join(unsure)}" if unsure else f"over all {len(per)} shapes: {reason}"
    return ShapeVerdicts(NEEDS_REVIEW, where + ("" if not unsure else f"; combined: {reason}"), ci, per, None)


# --------------------------------------------------------------------------------------------------
# alternatives (compared in bench/stats.py)


def median_threshold_rule(variant: Samples, baseline: Samples, guard: float = DEFAULT_GUARD) -> tuple[str, str]:
    """Plain threshold on the p50 ratio: REGRESS when it exceeds ``guard``, PASS otherwise."""
    ratio = p50_ratio(variant, baseline)
    if ratio > guard:
        return REGRESS, f"p50 ratio {_fmt(ratio)} is above the guard {guard:g}"
    return PASS, f"p50 ratio {_fmt(ratio)} is not above the guard {guard:g}"


def mann_whitney_p(variant: Samples, baseline: Samples) -> float:
    """Two-sided Mann-Whitney U p-value (scipy). Several shapes are pooled after dividing every
    sample by its shape's baseline median, so that shapes of different speed compare on one scale."""
    from scipy.stats import mannwhitneyu

    v, b = _check_pair(variant, baseline)
    if len(v) == 1:
        x, y = v[0], b[0]
    else:
        x = np.concatenate([xv / np.median(yb) for xv, yb in zip(v, b)])
        y = np.concatenate([yb / np.median(yb) for yb in b])
    return float(mannwhitneyu(x, y, alternative="two-sided").pvalue)


def asv_rule(variant: Samples, baseline: Samples, factor: float = DEFAULT_GUARD, p: float = 0.002) -> tuple[str, str]:
    """asv-style: REGRESS when the p50 ratio is beyond ``factor`` AND Mann-Whitney U says the two
    sample sets differ (two-sided p < ``p``); PASS otherwise (asv's "not significant" included)."""
    ratio = p50_ratio(variant, baseline)
    pv = mann_whitney_p(variant, baseline)
    if ratio > factor and pv < p:
        return REGRESS, f"p50 ratio {_fmt(ratio)} is above {factor:g} and Mann-Whitney p={pv:.2g} < {p:g}"
    if ratio > factor:
        return PASS, (
            f"p50 ratio {_fmt(ratio)} is above {factor:g} but not significant (Mann-Whitney p={pv:.2g} >= {p:g})"
        )
    return PASS, f"p50 ratio {_fmt(ratio)} is not above {factor:g} (Mann-Whitney p={pv:.2g})"


# --------------------------------------------------------------------------------------------------
# adaptive (group-sequential) sampling


SPENDINGS = ("pocock", "front", "back")


@dataclass(frozen=True)
class SequentialDesign:
    """When to look at the samples, and at what confidence, so that stopping early stays honest.

    Draws are taken a few at a time and the verdict rule is applied at each look; sampling stops at the
    first look whose verdict is PASS or REGRESS (the interval no longer reaches across the guard) and
    goes on while it is NEEDS_REVIEW, up to ``cap`` draws a side. Looking again and again at a 90%
    interval would make its error rate grow with every look (optional stopping); here the error budget
    ``alpha = 1 - confidence`` is spent over the looks instead (alpha spending with the Bonferroni
    bound: the chance that ANY look's interval misses the true ratio is at most the sum of the looks'
    alphas = alpha, whatever the correlation between looks; conservative, distribution-free, and valid
    for any stopping rule that only reads the looks).

    * ``looks()``: the draws a side at each look: ``start``, then each look ``growth`` times the last
      (rounded up), the last one ``cap``; e.g. 6, 10, 16, 26, 32 (the cluster-aligned interval applies from 10).
    * ``look_confidence(k)``: the interval's confidence at look ``k`` (0-based): ``1 - alpha_k`` with
      ``pocock`` (the same alpha at every look: early looks can stop as well as late ones) or ``front``
      (half of alpha at the first look, the rest equally over the others: most comparisons are decided
      at the first look; fewer reviews there, wider intervals later) or ``back`` (half of alpha at the
      last look, the rest equally over the others: where the cap is reached, the interval is nearly as
      narrow as the fixed-draw rule's, so few comparisons end in review).

    With ``start == cap`` there is one look at the full confidence: the fixed-draw rule.
    """

    start: int = 6
    cap: int = 32
    growth: float = 1.6
    confidence: float = DEFAULT_CONFIDENCE
    spending: str = "back"

    def __post_init__(self) -> None:
        for name in ("start", "cap"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 2:
                raise ValueError(f"SequentialDesign.{name} must be an integer >= 2, got {v!r}")
        if self.start > self.cap:
            raise ValueError(f"SequentialDesign.start ({self.start}) must not exceed cap ({self.cap})")
        if not (isinstance(self.growth, (int, float)) and self.growth > 1.0):
            raise ValueError(f"SequentialDesign.growth must be a number above 1, got {self.growth!r}")
        if not 0.0 < self.confidence < 1.0:
            raise ValueError(f"SequentialDesign.confidence must be between 0 and 1, got {self.confidence!r}")
        if self.spending not in SPENDINGS:
            raise ValueError(f"SequentialDesign.spending {self.spending!r} is unknown; allowed: {', '.join(SPENDINGS)}")

    def looks(self) -> tuple[int, ...]:
        out = [self.start]
        while out[-1] < self.cap:
            out.append(min(self.cap, max(out[-1] + 1, math.ceil(out[-1] * self.growth))))
        return tuple(out)

    def alphas(self) -> tuple[float, ...]:
        """The error spent at each look; they sum to ``1 - confidence``."""
        alpha, k = 1.0 - self.confidence, len(self.looks())
        if k == 1:
            return (alpha,)
        if self.spending == "front":
            return (alpha / 2.0,) + (alpha / 2.0 / (k - 1),) * (k - 1)
        if self.spending == "back":
            return (alpha / 2.0 / (k - 1),) * (k - 1) + (alpha / 2.0,)
        return (alpha / k,) * k

    def look_confidence(self, k: int) -> float:
        return 1.0 - self.alphas()[k]

    def capped(self, cap: int) -> "SequentialDesign":
        """The same design for a comparison that cannot take more than ``cap`` draws a side (the last
        look is then at ``cap`` and the error is spent over the looks that can happen)."""
        cap = max(2, min(self.cap, cap))
        return self if cap == self.cap else replace(self, cap=cap, start=min(self.start, cap))

    def describe(self) -> str:
        looks = self.looks()
        if len(looks) == 1:
            return f"fixed {looks[0]} draws a side at {_pct(self.confidence)}"
        return (f"sequential: looks at {', '.join(map(str, looks))} draws a side, {_pct(self.confidence)} spent "
                f"over them ({self.spending})")


@dataclass(frozen=True)
class SequentialVerdict:
    """A verdict reached by sequential sampling: the verdict of the look it stopped at, and how many
    draws a side (and looks) it took."""

    result: ShapeVerdicts
    draws: int
    looks: int
    confidence: float  # the interval's confidence at the look it stopped at

    @property
    def verdict(self) -> str:
        return self.result.verdict

    @property
    def reason(self) -> str:
        return self.result.reason


def stop_at_look(design: SequentialDesign, look: int, verdict_kind: str) -> bool:
    """Whether sampling stops after look ``look`` (0-based) with ``verdict_kind``: a decision, or the cap."""
    return verdict_kind != NEEDS_REVIEW or look >= len(design.looks()) - 1


def judge_look(
    design: SequentialDesign,
    look: int,
    variant: Samples,
    baseline: Samples,
    guard: float = DEFAULT_GUARD,
    min_samples: int | None = None,
    seed: int = 0,
    method: str = DEFAULT_METHOD,
    rule: str = DEFAULT_RULE,
    shape_names: Sequence[str] | None = None,
) -> ShapeVerdicts:
    """The verdict at look ``look`` on the samples taken so far, at that look's confidence.

    ``min_samples`` defaults to the first look's draws (a look never refuses for want of samples that
    the design did not ask for)."""
    ms = design.start if min_samples is None else min_samples
    res = verdict_by_shape(variant, baseline, guard=guard, confidence=design.look_confidence(look), min_samples=ms,
                           seed=seed, method=method, rule=rule, shape_names=shape_names)
    return res


def sequential_verdict(
    variant: Samples,
    baseline: Samples,
    design: SequentialDesign = SequentialDesign(),
    guard: float = DEFAULT_GUARD,
    seed: int = 0,
    method: str = DEFAULT_METHOD,
    rule: str = DEFAULT_RULE,
    shape_names: Sequence[str] | None = None,
) -> SequentialVerdict:
    """Sequential sampling over draws already taken in order (per shape, the i-th draw of each side
    taken at the same time): look at the first ``looks()[k]`` draws of every shape and stop at the
    first decided look (``stop_at_look``). Draws past the stopping look are never read. A side with
    fewer draws than the cap is judged under ``design.capped(draws)`` (its last look at the draws there are)."""
    v, b = _check_pair(variant, baseline)
    design = design.capped(min(min(x.size for x in v), min(y.size for y in b)))
    looks = design.looks()
    res = None
    for k, n in enumerate(looks):
        res = judge_look(design, k, [x[:n] for x in v], [y[:n] for y in b], guard=guard,
                         min_samples=min(design.start, n), seed=seed, method=method, rule=rule, shape_names=shape_names)
        if res.verdict != NEEDS_REVIEW or k == len(looks) - 1:
            return SequentialVerdict(res, n, k + 1, design.look_confidence(k))
    raise AssertionError("unreachable")  # pragma: no cover
