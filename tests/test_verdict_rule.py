"""The latency rule's false-alarm and detection figures on real GPU timings, as a regression test.

A small fixed resample of the recorded file shipped in the repo (data/replay/, 754 RTX 3090 GEMM
configurations x 32 real runs). The full figures, on every recorded file, belong to bench/stats.py;
here the margins are wide (the bench measures 0.0% false alarms and 100% detection on this kernel's
data): a change that breaks the rule falls far outside them, noise in 150 trials does not.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kregress.core import stats
from kregress.core.recorded import ReplayTable

SHIPPED = Path(__file__).resolve().parents[1] / "data" / "replay" / "gemm_clblast_RTX_3090_trimmed.json.gz"
TRIALS = 150


@pytest.fixture(scope="module")
def runs() -> np.ndarray:
    table = ReplayTable.load(SHIPPED)
    return np.asarray([r.times for r in table.records() if r.ok and len(r.times) == 32], dtype=float)


def _rates(runs: np.ndarray, mode: str, noisy: bool) -> dict[str, float]:
    rng = np.random.default_rng(12)
    pool = np.arange(len(runs))
    if noisy:  # the 5% of configurations with the largest IQR / median
        med = np.median(runs, axis=1)
        spread = (np.quantile(runs, 0.75, axis=1) - np.quantile(runs, 0.25, axis=1)) / med
        pool = np.argsort(spread)[-max(8, len(runs) // 20):]
    out = {"fa": 0, "det6": 0}
    for _ in range(TRIALS):
        r = runs[rng.choice(pool)]
        if mode == "resample":
            base, var = r[rng.integers(0, 32, 32)], r[rng.integers(0, 32, 32)]
        else:  # split: two disjoint random halves of the real runs
            perm = rng.permutation(32)
            base, var = r[perm[:16]], r[perm[16:]]
        out["fa"] += stats.verdict(var, base)[0] == "REGRESS"
        out["det6"] += stats.verdict(var * 1.06, base)[0] == "REGRESS"
    return {k: v / TRIALS for k, v in out.items()}


@pytest.mark.parametrize("mode", ["resample", "split"])
@pytest.mark.parametrize("noisy", [False, True], ids=["all", "noisy"])
def test_false_alarms_and_detection_on_recorded_runs(runs, mode, noisy):
    r = _rates(runs, mode, noisy)
    assert r["fa"] <= 0.04, r  # target 1%; the bench measures 0.0% on this kernel
    assert r["det6"] >= 0.85, r  # target 95%; the bench measures 100%


def test_new_rule_detects_regime_switching_noise_that_the_old_rule_misses():
    """The reason the rule changed. The noisiest recorded configurations (convolution on an RTX A4000,
    in ../shared/data/replay, not shipped) switch between clock regimes within a session: runs cluster
    at about 0.97, 1.14 and 1.19 of the median. This builds such runs (cluster shares and 0.2% jitter
    read off one of them) and compares a +6% variant in random halves: the old rule (bootstrap interval
    entirely above the guard) rarely clears the guard, the shift rule does most of the time."""
    rng = np.random.default_rng(5)
    new = old = fa = 0
    n = 120
    for _ in range(n):
        runs = np.concatenate([np.full(17, 0.97), np.full(12, 1.14), np.full(3, 1.19)]) * np.exp(rng.normal(0, 0.002, 32))
        perm = rng.permutation(32)
        base, var = runs[perm[:16]], runs[perm[16:]]
        fa += stats.verdict(var, base)[0] == "REGRESS"
        new += stats.verdict(var * 1.06, base)[0] == "REGRESS"
        old += stats.verdict(var * 1.06, base, method="bootstrap", rule="interval")[0] == "REGRESS"
    assert fa / n <= 0.08, fa
    assert new / n >= old / n + 0.25, (new, old)


def _regimes(rng: np.random.Generator, jitter: float = 0.001) -> np.ndarray:
    """32 runs of one configuration in three clock regimes spaced like the 6% slowdown to be found
    (0.888 / 1.000 / 1.055 of the median, shares 10 / 11 / 11 as in a recorded convolution config)."""
    levels = np.concatenate([np.full(10, 0.888), np.full(11, 1.0), np.full(11, 1.055)])
    return levels * np.exp(rng.normal(0.0, jitter, 32))


def test_aligned_likelihood_tells_a_shift_from_a_regime_change():
    """Regimes 5.5% apart: +6% turns the 1.000 regime into one at 1.060, next to the baseline's 1.055,
    and how many runs fell in each regime differs between random halves. Ranks (Hodges-Lehmann) cannot
    tell the two apart; the cluster positions can (0.888 * 1.06 lands on no baseline cluster)."""
    rng = np.random.default_rng(3)
    n = 100
    hits = {"aligned": 0, "hodges-lehmann": 0}
    fa = aligned = 0
    for _ in range(n):
        runs = _regimes(rng)
        perm = rng.permutation(32)
        base, var = runs[perm[:16]], runs[perm[16:]]
        for m in hits:
            hits[m] += stats.verdict(var * 1.06, base, method=m)[0] == "REGRESS"
        kind, _, ci = stats.verdict(var, base)
        fa += kind == "REGRESS"
        aligned += ci.aligned_shapes
    assert aligned == n  # every comparison was judged on the cluster positions
    assert fa == 0
    assert hits["aligned"] >= 0.95 * n, hits
    assert hits["aligned"] >= hits["hodges-lehmann"] + 0.15 * n, hits


def test_aligned_falls_back_to_hodges_lehmann_on_smooth_noise():
    """Smooth 3% noise: the leave-one-out bandwidth is wide, so the kernel likelihood (overconfident
    there) is not used and the interval is exactly the Hodges-Lehmann one."""
    rng = np.random.default_rng(8)
    base, var = np.exp(rng.normal(0, 0.03, 32)), np.exp(rng.normal(0.06, 0.03, 32))
    a = stats.ratio_ci([var], [base], method="aligned")
    h = stats.ratio_ci([var], [base], method="hodges-lehmann")
    assert a.aligned_shapes == 0 and (a.ratio, a.low, a.high) == (h.ratio, h.low, h.high)
    assert a.label == "shift ratio"
    # too few samples a side for the likelihood: Hodges-Lehmann too, however tight the clusters
    few = stats.ratio_ci([_regimes(rng)[:8] * 1.06], [_regimes(rng)[:8]], method="aligned")
    assert few.aligned_shapes == 0


def test_aligned_label_names_the_shapes_it_judged():
    rng = np.random.default_rng(4)
    clustered = _regimes(rng)
    smooth = np.exp(rng.normal(0, 0.03, 32))
    ci = stats.ratio_ci([clustered[:16] * 1.06, smooth * 1.06], [clustered[16:], np.exp(rng.normal(0, 0.03, 32))])
    assert (ci.aligned_shapes, ci.shapes) == (1, 2)
    assert ci.describe().startswith("shift ratio (1 of 2 shapes aligned) ")
    one = stats.ratio_ci([clustered[:16] * 1.06], [clustered[16:]])
    assert one.describe().startswith("aligned shift ratio ")


def _shared(name: str):
    from kregress.core.recorded import ENV_DIR, replay_dir

    p = replay_dir() / name
    return pytest.param(p, marks=pytest.mark.skipif(
        not p.is_file(), reason=f"benchmark file {p} is absent (set {ENV_DIR} to the folder holding it)"), id=name)


@pytest.mark.parametrize("path", [_shared("convolution_milo_A4000.json.gz")])
def test_noisiest_convolution_configs_split_in_halves(path):
    """The cell the Hodges-Lehmann rule missed (bench: 65% detection of +6%): the 5% noisiest
    convolution configurations, random halves of their 32 runs. The bench measures 0.0% false alarms
    and 96.9% detection for the default rule; the margins here are wide (100 trials)."""
    table = ReplayTable.load(path)
    runs = np.asarray([r.times for r in table.records() if r.ok and len(r.times) >= 32], dtype=float)[:, :32]
    med = np.median(runs, axis=1)
    spread = (np.quantile(runs, 0.75, axis=1) - np.quantile(runs, 0.25, axis=1)) / med
    pool = np.argsort(spread)[-int(round(0.05 * len(runs))):]
    rng = np.random.default_rng(21)
    fa = det = det_hl = 0
    n = 100
    for _ in range(n):
        r = runs[rng.choice(pool)]
        perm = rng.permutation(32)
        base, var = r[perm[:16]], r[perm[16:]]
        fa += stats.verdict(var, base)[0] == "REGRESS"
        det += stats.verdict(var * 1.06, base)[0] == "REGRESS"
        det_hl += stats.verdict(var * 1.06, base, method="hodges-lehmann")[0] == "REGRESS"
    assert fa <= 3, fa
    assert det >= 88, det
    assert det >= det_hl + 15, (det, det_hl)
