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
