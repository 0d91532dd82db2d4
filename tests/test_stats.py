"""kernels/stats.py: verdicts from samples (interval of the p50 ratio against the guard)."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kregress.core import stats
from kregress.core.stats import (
    RatioCI,
    asv_rule,
    classify,
    median_threshold_rule,
    p50_ratio,
    ratio_ci,
)

ROOT = Path(__file__).resolve().parents[1]


def lognormal(seed: int, n: int = 32, center: float = 10.0, sigma: float = 0.01, shapes: int = 1) -> list[list[float]]:
    rng = np.random.default_rng(seed)
    return [list(center * (s + 1) * np.exp(rng.normal(0.0, sigma, n))) for s in range(shapes)]


def scaled(samples: list[list[float]], factor: float) -> list[list[float]]:
    return [[x * factor for x in s] for s in samples]


def ci(ratio=1.0, low=0.99, high=1.01, n_variant=32, n_baseline=32, confidence=0.9) -> RatioCI:
    return RatioCI(ratio, low, high, confidence, "bootstrap", n_variant, n_baseline)


# --- verdicts on samples --------------------------------------------------------------------------


@pytest.mark.parametrize("method", stats.METHODS)
def test_known_slowdown_is_regress(method):
    base = lognormal(1, shapes=3)
    var = scaled(lognormal(2, shapes=3), 1.08)
    interval = ratio_ci(var, base, method=method)
    assert interval.low > 1.03 and interval.low < interval.ratio < interval.high
    assert interval.ratio == pytest.approx(1.08, abs=0.01)
    verdict, reason = classify(interval)
    assert verdict == "REGRESS"
    assert "above the guard 1.03 and entirely above 1.005" in reason
    assert f"{interval.label} {interval.ratio:.3f} [{interval.low:.3f}, {interval.high:.3f}] at 90%" in reason
    assert classify(interval, rule="interval")[0] == "REGRESS"  # +8% clears the old, stricter rule too


@pytest.mark.parametrize("method", stats.METHODS)
def test_aa_is_not_flagged(method):
    base = lognormal(3, shapes=2)
    var = lognormal(4, shapes=2)  # same distribution, independent draws
    interval = ratio_ci(var, base, method=method)
    assert interval.low < 1.0 < interval.high
    verdict, reason = classify(interval)
    assert verdict == "PASS"
    assert "entirely below the guard 1.03" in reason


def test_slowdown_at_the_guard_needs_review():
    base = lognormal(5, sigma=0.02)
    var = scaled(base, 1.03)  # the same runs, 3% slower: the p50 ratio is exactly the guard
    interval = ratio_ci(var, base)
    assert interval.ratio == pytest.approx(1.03)
    verdict, reason = classify(interval)
    assert verdict == "NEEDS_REVIEW"  # exactly at the guard is not above it
    assert "reaches past the guard 1.03" in reason
    assert classify(interval, rule="interval")[1].endswith("straddles the guard 1.03: the samples cannot tell "
                                                           "whether the variant is within it")


def test_real_runs_aa_passes_and_injected_slowdown_regresses():
    """One recorded configuration: its 32 real RTX 3090 runs split in halves."""
    from kregress.core.recorded import ReplayTable

    table = ReplayTable.load()
    rec = table.best()
    runs = np.asarray(rec.times)
    rng = np.random.default_rng(0)
    perm = rng.permutation(runs.size)
    a, b = runs[perm[:16]], runs[perm[16:]]
    assert classify(ratio_ci([a.tolist()], [b.tolist()]))[0] == "PASS"
    assert classify(ratio_ci([(a * 1.06).tolist()], [b.tolist()]))[0] == "REGRESS"


def test_too_few_samples_is_needs_review_and_says_so():
    base = lognormal(7, n=9)
    var = scaled(lognormal(8, n=32), 1.5)  # an obvious slowdown, but only 9 baseline samples
    interval = ratio_ci(var, base)
    assert (interval.n_variant, interval.n_baseline) == (32, 9)
    verdict, reason = classify(interval)
    assert verdict == "NEEDS_REVIEW"
    assert "too few samples" in reason and "9 baseline" in reason and "at least 10 per side" in reason
    assert classify(interval, min_samples=9)[0] == "REGRESS"


def test_sample_counts_are_the_fewest_in_any_shape():
    base = [lognormal(1, n=32)[0], lognormal(2, n=12)[0]]
    var = [lognormal(3, n=20)[0], lognormal(4, n=40)[0]]
    interval = ratio_ci(var, base)
    assert (interval.n_variant, interval.n_baseline, interval.shapes) == (20, 12, 2)


@pytest.mark.parametrize("method", stats.METHODS)
def test_deterministic_given_seed(method):
    base = lognormal(9, sigma=0.05, shapes=2)
    var = lognormal(10, sigma=0.05, shapes=2)
    assert ratio_ci(var, base, seed=123, method=method) == ratio_ci(var, base, seed=123, method=method)


@pytest.mark.parametrize("method", stats.METHODS)
def test_interval_scales_with_the_variant(method):
    """bench/stats.py relies on it: a slowdown moves the interval by exactly that factor."""
    base = lognormal(30, sigma=0.04, shapes=2)
    var = lognormal(31, sigma=0.04, shapes=2)
    a = ratio_ci(var, base, seed=5, method=method)
    b = ratio_ci(scaled(var, 1.06), base, seed=5, method=method)
    for x, y in ((a.ratio, b.ratio), (a.low, b.low), (a.high, b.high)):
        assert y == pytest.approx(x * 1.06, rel=1e-12)


def test_bootstrap_seed_matters():
    base = lognormal(9, sigma=0.05)
    var = lognormal(10, sigma=0.05)
    a, b = ratio_ci(var, base, seed=1, method="bootstrap"), ratio_ci(var, base, seed=2, method="bootstrap")
    assert a.ratio == b.ratio
    assert (a.low, a.high) != (b.low, b.high)


def test_ratio_is_geomean_of_median_ratios():
    base = [[1.0, 2.0, 3.0], [10.0, 10.0, 10.0]]
    var = [[2.0, 4.0, 6.0], [5.0, 5.0, 50.0]]  # medians 4 / 2 = 2 and 5 / 10 = 0.5
    assert p50_ratio(var, base) == pytest.approx(1.0)
    assert ratio_ci(var, base, n_boot=200).ratio == pytest.approx(1.0)
    assert p50_ratio([[3.0, 1.0, 100.0]], [[1.0]]) == pytest.approx(3.0)


def test_flat_list_is_one_shape():
    base = lognormal(11)[0]
    var = lognormal(12)[0]
    assert ratio_ci(var, base) == ratio_ci([var], [base])


def test_bootstrap_interval_always_holds_the_reported_ratio():
    rng = np.random.default_rng(13)
    for i in range(30):
        base = [list(rng.lognormal(2.0, 0.1, 16)) for _ in range(2)]
        var = [list(rng.lognormal(2.05, 0.1, 16)) for _ in range(2)]
        interval = ratio_ci(var, base, n_boot=500, seed=i)
        assert interval.low <= interval.ratio <= interval.high


def test_wider_confidence_gives_wider_interval():
    base = lognormal(14, sigma=0.03)
    var = lognormal(15, sigma=0.03)
    narrow = ratio_ci(var, base, confidence=0.8)
    wide = ratio_ci(var, base, confidence=0.99)
    assert wide.low < narrow.low and wide.high > narrow.high


def test_hodges_lehmann_inverts_mann_whitney():
    from scipy.stats import mannwhitneyu

    rng = np.random.default_rng(16)
    x, y = rng.normal(0.3, 1.0, 20), rng.normal(0.0, 1.0, 25)
    est, lo, hi = stats.hodges_lehmann(x, y, 0.95)
    d = np.sort((x[:, None] - y[None, :]).ravel())
    assert est == pytest.approx(np.median(d))

    def p(delta: float) -> float:
        return mannwhitneyu(x - delta, y, method="asymptotic", use_continuity=False).pvalue

    eps = 1e-9
    assert p(lo - eps) < 0.05 and p(hi + eps) < 0.05  # outside: rejected
    assert p(est) > 0.5
    next_in_lo, next_in_hi = d[d > lo][0], d[d < hi][-1]
    assert p(next_in_lo + eps) >= 0.05 and p(next_in_hi - eps) >= 0.05  # one step inside: accepted


# --- classify edge cases --------------------------------------------------------------------------


def test_classify_boundaries_interval_rule():
    def c(*a, **k):
        return classify(ci(*a), rule="interval", **k)[0]

    assert c(1.05, 1.0301, 1.07) == "REGRESS"
    assert c(1.05, 1.03, 1.07) == "NEEDS_REVIEW"  # touching the guard is not above it
    assert c(1.0, 0.98, 1.0299) == "PASS"
    assert c(1.0, 0.98, 1.03) == "NEEDS_REVIEW"  # high == guard is not below it
    assert c(1.03, 1.01, 1.05) == "NEEDS_REVIEW"
    assert c(0.8, 0.7, 0.9) == "PASS"  # faster is a pass
    assert c(1.0, 0.99, 1.01, guard=0.95) == "REGRESS"  # a guard below 1 demands a speed-up


def test_classify_boundaries_shift_rule():
    assert classify(ci(1.05, 1.0051, 1.09))[0] == "REGRESS"  # above the guard, and slower beyond doubt
    assert classify(ci(1.05, 1.005, 1.09))[0] == "NEEDS_REVIEW"  # the interval touches 1.005: not established
    assert classify(ci(1.05, 1.0001, 1.09), min_shift=0.0)[0] == "REGRESS"
    assert classify(ci(1.05, 0.98, 1.09))[1].endswith("the slowdown is not established")
    assert classify(ci(1.03, 1.01, 1.05))[0] == "NEEDS_REVIEW"  # estimate == guard is not above it
    assert classify(ci(1.0, 0.98, 1.0299))[0] == "PASS"
    assert classify(ci(1.0, 0.98, 1.03))[0] == "NEEDS_REVIEW"  # high == guard is not below it
    assert classify(ci(0.8, 0.7, 0.9))[0] == "PASS"
    assert classify(ci(1.0, 0.99, 1.01), guard=0.95)[0] == "NEEDS_REVIEW"  # not slower than 1 beyond doubt
    with pytest.raises(ValueError, match="unknown rule"):
        classify(ci(), rule="vibes")


def test_classify_reason_text():
    verdict, reason = classify(RatioCI(1.0714, 1.0521, 1.0903, 0.95, "bootstrap", 32, 32), rule="interval")
    assert verdict == "REGRESS"
    assert reason == "p50 ratio 1.071 [1.052, 1.090] at 95% is entirely above the guard 1.03"
    verdict, reason = classify(ci(0.99, 0.985, 0.995), guard=1.05)
    assert reason == "p50 ratio 0.990 [0.985, 0.995] at 90% is entirely below the guard 1.05"
    verdict, reason = classify(RatioCI(1.0612, 1.0123, 1.1004, 0.9, "hodges-lehmann", 32, 32))
    assert verdict == "REGRESS"
    assert reason == ("shift ratio 1.061 [1.012, 1.100] at 90%: above the guard 1.03 and entirely above 1.005 "
                      "(slower beyond doubt)")


def test_classify_sample_check_comes_first():
    verdict, reason = classify(ci(2.0, 1.9, 2.1, n_variant=3))
    assert verdict == "NEEDS_REVIEW" and "3 variant" in reason


def test_classify_non_finite_interval():
    assert classify(ci(1.0, float("nan"), 1.01))[0] == "NEEDS_REVIEW"
    assert classify(ci(1.0, 0.9, math.inf))[0] == "NEEDS_REVIEW"


@pytest.mark.parametrize("kwargs", [{"guard": 0}, {"guard": -1.0}, {"guard": float("nan")}, {"min_samples": 0}])
def test_classify_rejects_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        classify(ci(), **kwargs)


# --- input validation -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "variant, baseline, match",
    [
        ([[1.0, 2.0]], [[1.0], [2.0]], "1 shapes but baseline has 2"),
        ([], [[1.0]], "variant samples are empty"),
        ([[1.0], []], [[1.0], [1.0]], "variant shape 1 has no samples"),
        ([[1.0, -2.0]], [[1.0]], "finite and positive"),
        ([[1.0, float("nan")]], [[1.0]], "finite and positive"),
        ([[1.0]], "1.0", "baseline samples must be a list"),
        ([["a", "b"]], [[1.0]], "timings must be numbers"),
    ],
)
def test_bad_samples_are_clear_errors(variant, baseline, match):
    with pytest.raises(ValueError, match=match):
        ratio_ci(variant, baseline)


def test_bad_ratio_ci_arguments():
    base, var = lognormal(1), lognormal(2)
    with pytest.raises(ValueError, match="confidence"):
        ratio_ci(var, base, confidence=1.0)
    with pytest.raises(ValueError, match="unknown method"):
        ratio_ci(var, base, method="t-test")
    with pytest.raises(ValueError, match="n_boot"):
        ratio_ci(var, base, n_boot=10, method="bootstrap")


# --- the alternatives -----------------------------------------------------------------------------


def test_median_threshold_rule():
    base = [[10.0] * 5]
    assert median_threshold_rule([[10.31] * 5], base)[0] == "REGRESS"
    assert median_threshold_rule([[10.3] * 5], base, guard=1.031)[0] == "PASS"
    assert median_threshold_rule([[9.0] * 5], base)[0] == "PASS"


def test_asv_rule():
    base = lognormal(20)
    assert asv_rule(scaled(lognormal(21), 1.08), base)[0] == "REGRESS"
    assert asv_rule(lognormal(22), base)[0] == "PASS"
    # ratio beyond the factor but too few samples to be significant at p < 0.002
    verdict, reason = asv_rule([[10.5, 10.9, 9.9]], [[10.0, 10.1, 9.8]])
    assert verdict == "PASS" and "not significant" in reason
    # several shapes are pooled on one scale: both slowed by 8% is significant
    assert asv_rule(scaled(lognormal(23, shapes=2), 1.08), lognormal(24, shapes=2))[0] == "REGRESS"


def test_kernels_never_import_dagster():
    code = (
        "import sys, kregress.core.stats, kregress.core.recorded; "
        "bad = [m for m in sys.modules if m == 'dagster' or m.startswith('dagster.')]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=120)
