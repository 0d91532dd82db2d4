"""The local policy (embedded default, no network): Bayesian search over the enumerated valid set.

Each round is rebuilt from everything measured in this sweep (the baseline is round 0), so the search
is deterministic given the spec's seed and the history, and resumes from any round. Configs outside
the space, or already measured, are never proposed.

Spaces small enough to enumerate (``ENUMERATE_LIMIT`` Cartesian points; the valid set is built once
per process and space) get the model-based search:

* A model of the shape of the space: Bayesian linear regression of log(objective) on second-order
  features of each config's ordinal positions (one-hot main effects, ordinal trends, pairwise
  interactions; see ``Features``), fitted to every row that ran. Its Gaussian posterior is exact and
  cheap (``Posterior``: a Cholesky factor in the smaller of features and rows). The log objectives it is fitted
  to are capped at their upper Tukey fence (third quartile + 1.5 x the interquartile range, ``slow_fence``: the
  rule of Ax's Winsorize transform for an objective to minimise when it picks its own cutoffs, applied here to
  log times). A config far slower than the rest (a tile of one, a spilling kernel) says "slow", and how slow
  must not tilt the fit of the region the search is after; a capped config is never a restart point. The
  knob ``winsor`` turns the cap off; why it is on: bench/SEARCH.md, stop 48.
* A model of failures: the same features, regressed on "this row failed" (a recorded failure, a
  failed compile or run, or a constraint broken: registers, spills, shared memory). A failure
  teaches where the feasible region ends: candidates whose predicted failure chance is above
  ``FAIL_P_MAX`` are not proposed while other candidates remain.
* A portfolio each round of n proposals: local search around the incumbent (``N_LOCAL`` picks, skipping
  likely failures: model-guided coordinate descent, the best under the posterior mean among its nearest
  unmeasured configs by steps along the ordered values and the configs that change one of its tunables
  to any value; model-free, its nearest configs, until the model has ``MODEL_MIN`` points), then
  one Thompson draw from the posterior per remaining proposal, each taking the draw's best unmeasured
  candidate (global search; the draws' spread shrinks where the model is sure, so exploration and
  exploitation balance by themselves).
* A stale incumbent (no new best for ``STALE_ROUNDS`` rounds): the local picks become a line search,
  the unmeasured configs that change one tunable of the incumbent to ANY of its values, best first
  under a posterior draw. Steps along an ordered axis miss a far good value (on the convolution space
  block sizes 32/64/128/256 are fast and 144..240 three times slower, so the optimum at 256 sat eight
  steps from an incumbent at 128).
* The stagnation switch: a search that has found no better config for ``EXPLORE_AFTER`` rounds has
  stopped learning from its model, whose confident posterior keeps proposing the same basin. A
  pairwise model cannot see a combination of three values that pays only together (a recorded
  convolution space: shared memory off, one row per block and four rows per thread, the next config
  19% slower; each pair of those values looks like a loss), nor a lone optimum in a narrow basin of
  its own. From then on each round also spends ``TRIPLE_SLOTS`` proposals on Thompson draws of a
  wider model, the pairwise one plus one-hot blocks over the joint values of three tunables (unvisited
  cells keep their prior spread, so draws try them; one good measurement in a cell makes the whole
  cell look good), half of them within ``TRIPLE_RADIUS`` changes of the incumbent, half anywhere; and
  ``RANDOM_SLOTS`` uniform random proposals (the global explorer, which no model can mislead), one more
  for every ``RANDOM_GROWTH`` further rounds without a new best. Measured with bench/search.py and the
  synthetic spaces of bench/synth_spaces.py (lone optimum, three-way interaction): without the switch
  the 5-seed median best/optimum at 400 evaluations stays at the plateau, 1.189 and 1.195; with it,
  1.000 on both (figures for 20 seeds in bench/SEARCH.md).
* Two standing explorers, in every round from the second, because a trap must be found before the
  search has stalled on it, not after (bench/synth_spaces.py's three-way spaces, small and medium: the
  paying cell first sampled within 100 evaluations on 1 and 5 of 20 seeds when exploration waited for
  the switch, on 13 and 18 with the explorers):

  - the three-way cover (``COVER_SLOTS``, and the picks of round 1 that are not the baseline's neighbours): the
    config most likely to land in a paying combination of three values whose tunables and values are
    unknown, i.e. the one whose joint values of three tunables are unmeasured in the most (and the most
    nearly exhausted) triples (``_explore``). Uniform sampling hits a given cell of 1/40 of the space
    after 28 draws in the median; the cover walks through the cells of every triple at once;
  - restarts from other basins (``SURPRISE_SLOTS``): the nearest unmeasured configs of the best measured
    config that the model, fitted to the others, predicted far too slow (leave-one-out residual below
    ``-SURPRISE_Z`` sd) and that differs from the incumbent in ``SURPRISE_HAMMING`` tunables or more. One
    cover pick in a three-way cell, or one on a lone optimum's shoulder, is such a config: the search
    then climbs that basin while the main search stays where it is, and moves over once it is better.

* The global explorer (``global_explore``, run by the portfolio, ``kernel_assets.agent.portfolio.explore_slots``): a
  share of every round from the second, growing while the sweep's best has not moved, goes to uniformly random valid
  configs at least ``FAR_HAMMING`` changes from every measured config and earlier pick. No model steers it, so no
  model can keep a round from looking where nothing was measured (issue 57: a trap that held the median seed at 1.19
  of the optimum from evaluation 100 to 400).

* Moves that cannot change the objective: when measured configs that differ only in one tunable have
  given exactly the same objective, in at least ``EQUAL_MIN`` contexts and never a different one (a
  model estimate blind to that tunable: pipeline depth, L2 grouping), its values are equivalent, and a
  config equivalent to a measured one is not proposed (``value_classes``). Measurements are never
  exactly equal, so on measured evidence this never fires.
* Round 1 (the baseline alone): cover picks first (they spread over the space), then a quarter of the
  round as the baseline's nearest valid configs; cover picks until the model has ``MODEL_MIN`` points.
  The portfolio (``kernel_assets.agent.portfolio.LOCAL_OFF``) runs the policy without the three-way cover in
  round 1 (``start_cover`` off) and with the standing cover pick only once the search has stalled (``standing``
  off): on the recorded train spaces they did not pay. Its round-1 picks are then a greedy cover of each
  tunable's values instead (``_explore`` of order 1, a balanced design): each pick the config with the most
  unmeasured values, each weighed by 1 / (its tunable's unmeasured values), so on a full grid the picks form a
  Latin design while there are values left (as a Latin hypercube spreads its points over every axis); a tunable
  whose values are all measured stops counting, and on a constrained space the greedy pick may repeat one
  tunable's value to reach new values of others. With ``balance`` off too, or ``stagnation_switch`` off,
  uniform random picks.
* Forecasts: every proposal carries ``expected_speedup`` (baseline objective / predicted objective, the
  pairwise posterior mean of log objective) and an 80% interval (``Z80`` predictive sd: the posterior
  spread of the mean plus the model's residual variance). Before the model has ``MODEL_MIN`` points
  the forecast is the prior: no change, with an interval as wide as the spread of log(time) over
  whole recorded spaces (``PRIOR_LOG_SD``). A forecast is computed once, when proposed.

Larger spaces keep the plain path: one-step neighbours of the incumbent, then Optuna's TPE with a
constraint function over registers, spills and shared memory, with rejection and an attempt cap; their
forecasts come from a Bayesian main-effects model of the measured rows (``main_effects_forecast``).
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import optuna

from kernel_assets.agent.base import AgentContext, Proposal, validate_and_dedupe
from kregress.core.family import Space
from kregress.core.records import Suggestion, VariantResult, config_label
from kregress.core.spec import HardwareLimits

optuna.logging.set_verbosity(logging.WARNING)


def constraint_values(row: VariantResult, spec) -> dict[str, float]:
    """<= 0 means satisfied (Optuna's convention); the TPE sampler reads them off each trial."""
    c = spec.constraints
    if row.compile is None:
        # No compile stats: a failed compile (the row has an error) breaks every constraint; a row
        # measured without them (a replay backend: recorded runs of a kernel that is not compiled
        # here) breaks none, as in kernel_assets.sweep.constraint_violations.
        v = 1.0 if row.error else 0.0
        return {"registers": v, "spills": v, "shared_memory": v}
    return {
        "registers": float(row.compile.regs_per_thread - c.max_registers_per_thread),
        "spills": float(row.compile.spill_bytes - c.max_spill_bytes),
        "shared_memory": float(row.compile.smem_bytes - c.max_shared_memory_bytes),
    }


def describe_change(base: dict[str, int], new: dict[str, int]) -> tuple[str, str, str]:
    """(patch_summary, expected_effect, risk) for a config change, from the kernel's mechanics."""
    changes = [(k, base.get(k), v) for k, v in new.items() if base.get(k) != v]
    summary = ", ".join(f"{k} {a}->{b}" for k, a, b in changes) or "same config"
    effects = []
    risk = "low" if len(changes) <= 1 else "medium"
    for k, a, b in changes:
        up = a is not None and b > a
        if k.startswith("BLOCK_"):
            effects.append(f"{'bigger' if up else 'smaller'} {k}: {'more reuse, fewer tiles, more smem/regs' if up else 'more tiles, better wave fill, less reuse'}")
            if up and b >= 256:
                risk = "high"
        elif k == "num_stages":
            effects.append(f"{'deeper' if up else 'shallower'} pipeline: {'hides more load latency, costs smem' if up else 'frees smem, may expose latency'}")
        elif k == "num_warps":
            effects.append(f"{'more' if up else 'fewer'} warps: {'more parallel MMA issue, fewer regs each' if up else 'more regs per thread, less issue parallelism'}")
        elif k == "GROUP_M":
            effects.append(f"GROUP_M {b}: {'better L2 reuse of B' if up else 'less L2 grouping'}")
        elif k == "num_splits":
            effects.append(f"{'more' if up else 'fewer'} KV splits: {'more CTAs for small batches, more combine work' if up else 'less combine work, fewer CTAs'}")
        else:
            effects.append(f"{k} {a}->{b}")
    return f"vs best: {summary}"[:120], "; ".join(effects)[:300], risk


# Spaces up to this many Cartesian points are enumerated (the GEMM family's 6,000 take ~15 ms, a
# recorded 82,944-point Kernel Tuner space ~0.3 s, once per process); larger ones are sampled.
ENUMERATE_LIMIT = 250_000
_VALID_CACHE: dict[tuple[int, str], tuple[object, "ValidSet"]] = {}
_VALID_LOCK = threading.Lock()


class ValidSet:
    """The valid configs of a space as ordinal positions (row i, tunable j: index into its values)."""

    def __init__(self, space, params: dict, limits=None):
        # A plain snapshot: a family may compute params and rules on every access (the replay family
        # reads them off its file), which would cost that much per enumerated point.
        snapshot = Space(params=dict(space.params), rules=tuple(space.rules))
        self.keys = list(snapshot.params)
        self.values = [tuple(snapshot.params[k]) for k in self.keys]
        rows: list[tuple[int, ...]] = []
        if all(isinstance(v, int) and not isinstance(v, bool) for vals in self.values for v in vals):
            # Space.check on a point built from the allowed values reduces to its rules: run them directly.
            keys, rules = self.keys, snapshot.rules
            lim = limits if limits is not None else HardwareLimits()
            ranges = [range(len(vals)) for vals in self.values]
            for vals, pos in zip(itertools.product(*self.values), itertools.product(*ranges)):
                cfg = dict(zip(keys, vals))
                if all(rule.predicate(cfg, params, lim) for rule in rules):
                    rows.append(pos)
        else:
            where = [{v: i for i, v in enumerate(vals)} for vals in self.values]
            rows = [tuple(where[j][cfg[k]] for j, k in enumerate(self.keys)) for cfg in snapshot.enumerate(params, limits)]
        self.idx = np.asarray(rows, dtype=np.int16).reshape(len(rows), len(self.keys))
        self.row_of = {r: i for i, r in enumerate(rows)}

    def __len__(self) -> int:
        return len(self.idx)

    def position(self, config: dict) -> tuple[int, ...] | None:
        try:
            return tuple(self.values[j].index(config[k]) for j, k in enumerate(self.keys))
        except (KeyError, ValueError):
            return None

    def config(self, row: int) -> dict[str, int]:
        return {k: int(self.values[j][p]) for j, (k, p) in enumerate(zip(self.keys, self.idx[row]))}

    def nearest(self, pos: tuple[int, ...], taken: np.ndarray, k: int, rng: random.Random) -> list[int]:
        """Up to k untaken rows nearest to ``pos``: steps along the ordered values (L1 over positions),
        then fewer tunables changed; ties in a seeded random order."""
        free = np.flatnonzero(~taken)
        if not len(free) or k <= 0:
            return []
        diff = np.abs(self.idx[free] - np.asarray(pos, dtype=np.int16))
        steps = diff.sum(axis=1)
        changed = (diff > 0).sum(axis=1)
        tie = np.frombuffer(rng.randbytes(4 * len(free)), dtype=np.uint32)
        order = np.lexsort((tie, changed, steps))[:k]
        return [int(free[i]) for i in order]


def valid_set(space, params: dict, limits=None) -> ValidSet | None:
    """The enumerated valid set of ``space`` (cached per process), or None when it is too large."""
    if math.prod(len(v) for v in dict(space.params).values()) > ENUMERATE_LIMIT:
        return None
    key = (id(space), json.dumps(params or {}, sort_keys=True, default=str),
           limits.model_dump_json() if limits is not None else "")
    with _VALID_LOCK:
        hit = _VALID_CACHE.get(key)
    if hit is not None and hit[0] is space:
        return hit[1]
    vs = ValidSet(space, params or {}, limits)
    with _VALID_LOCK:
        _VALID_CACHE[key] = (space, vs)  # holds the space, so its id is not reused while cached
    return vs


# -------------------------------------------------------------------------------------------------
# The model: a Bayesian second-order model of log(objective) over the enumerated valid set.
PAIR_LEVELS_MAX = 256  # one-hot interaction blocks up to this many cells (Li * Lj); larger pairs keep z_i * z_j only
FEATURES_MAX = 2500  # cap on model width (one-hot pair blocks are dropped, largest first, beyond it)
CANDIDATES_MAX = 30_000  # candidates scored per round (a random subset of larger valid sets, plus the incumbents' neighbours)
NOISE_VAR = 0.05  # residual variance of standardised log(objective): measurement noise plus model misfit
FAIL_P_MAX = 0.5  # a candidate whose predicted chance of failing is above this is not proposed while others remain
RING_MAX = 64  # the incumbent's nearest unmeasured configs the model ranks for the local picks
N_LOCAL = 2  # proposals per round around the incumbent (its ring and lines, best first under the model; see below)
STALE_ROUNDS = 3  # rounds without a new best after which the local picks become a line search (see below)
FIRST_NEAR_DIV = 4  # round 1: n // this nearest neighbours of the baseline, the rest random
MODEL_MIN = 4  # measured points before the model proposes (and forecasts); random picks and the prior until then
# The stagnation switch (a search that has stopped finding better configs explores what its model cannot see):
EXPLORE_AFTER = 3  # rounds without a new best after which part of each round explores
TRIPLE_SLOTS = 2  # proposals per exploring round from Thompson draws of the model with three-way blocks
RANDOM_SLOTS = 1  # uniform random proposals per exploring round, at first
RANDOM_GROWTH = 3  # one more random proposal per this many further rounds without a new best
TRIPLE_CELLS_MAX = 64  # three-way blocks over tunables whose joint values number at most this
TRIPLE_BLOCKS_MAX = 24  # three-way blocks per round (a seeded random subset when there are more)
TRIPLE_PRIOR_VAR = 0.1  # prior variance of one three-way cell (standardised log objective)
TRIPLE_CANDIDATES_MAX = 4_000  # candidates the three-way model scores per round
TRIPLE_RADIUS = 3  # the three-way model's picks change at most this many tunables of the incumbent
# The standing explorer and restarts from other basins (see the module docstring):
COVER_SLOTS = 1  # proposals per model round that cover three-way value cells no measured config has
SURPRISE_SLOTS = 2  # proposals per round that are the nearest unmeasured configs of the best surprising config
SURPRISE_Z = 2.0  # surprising: its leave-one-out residual is this many sd below the model's prediction
SURPRISE_HAMMING = 2  # ... and it differs from the incumbent in at least this many tunables
EQUAL_RTOL = 1e-9  # two objectives this close are "exactly equal" (a model estimate, not a measurement)
EQUAL_MIN = 2  # equal pairs (in different contexts) before two values of a tunable count as equivalent
# Forecasts: an 80% interval is mean +- Z80 sd of log(variant / baseline). Before the model has MODEL_MIN
# points the forecast is the prior: no change expected, sd PRIOR_LOG_SD. That is the spread of log(time)
# over every config of the recorded spaces (0.10 dedispersion, 0.37 pnpoly, 0.45 convolution, 0.55 gemm),
# rounded up: a baseline of median speed and a variant from anywhere in the space differ by about that.
Z80 = 1.2816
PRIOR_LOG_SD = 0.6
# Parts of the search that can be switched off, for the ablations of bench/search.py (method local:...-name):
ABLATIONS = {
    "line": "the incumbent's one-tunable lines: the stale incumbent's line search, and the lines among the local picks",
    "cover": "the three-way cover pick (round 1's spread and the standing explorer); round 1 balanced instead",
    "start_cover": "the cover in round 1 only: balanced picks there (a cover of each tunable's values), the "
                   "standing explorer kept",
    "balance": "round 1's balanced picks, where the three-way cover is off (cover or start_cover): uniform random "
               "picks there",
    "standing": "the cover pick in every round: only once the search has stalled (with the switch's picks)",
    "surprise": "the restarts around the best config the model predicted far too slow",
    "switch": "the stagnation switch's three-way model draws and uniform random picks",
    "winsor": "the cap on slow outliers: the enumerated search's models fit every measured log objective as it is, "
              "not capped at the upper Tukey fence",
    "global": "the portfolio's global explorer (kernel_assets.agent.portfolio.explore_slots): no share of the round "
              "kept for uniformly random configs far from every measured one",
    "near_rank": "the local picks model-free: the incumbent's nearest configs, ties in a seeded random order (no "
                 "one-tunable line, no ranking by the model's posterior mean)",
}


class Features:
    """Second-order features of every valid config, from its ordinal positions.

    * one-hot main effects: one column per (tunable, value);
    * ordinal trends: z_j (position scaled to [-1, 1]) and z_j^2, per tunable;
    * interactions: one-hot per pair of values of two tunables (blocks up to ``PAIR_LEVELS_MAX``
      cells), and z_i * z_j for every pair.

    ``cat`` holds each valid config's one-hot column ids (rows x blocks), ``cont`` its continuous
    columns; ``group`` says which prior a column gets (0 main, 1 trend, 2 interaction)."""

    def __init__(self, valid: ValidSet):
        idx = valid.idx.astype(np.int32)
        levels = [len(v) for v in valid.values]
        active = [j for j, n in enumerate(levels) if n > 1]
        cat_cols: list[np.ndarray] = []
        group: list[int] = []
        off = 0
        for j in active:
            cat_cols.append(idx[:, j] + off)
            group += [0] * levels[j]
            off += levels[j]
        pairs = sorted(((levels[i] * levels[j], i, j) for a, i in enumerate(active) for j in active[a + 1:]))
        n_cont = 2 * len(active) + len(active) * (len(active) - 1) // 2
        for cells, i, j in pairs:
            if cells > PAIR_LEVELS_MAX or off + cells + n_cont > FEATURES_MAX:
                continue
            cat_cols.append(off + idx[:, i] * levels[j] + idx[:, j])
            group += [2] * cells
            off += cells
        self.n_cat = off
        self.cat = np.stack(cat_cols, axis=1) if cat_cols else np.zeros((len(idx), 0), dtype=np.int32)
        z = np.stack([2.0 * idx[:, j] / (levels[j] - 1) - 1.0 for j in active], axis=1) if active else np.zeros((len(idx), 0))
        cont = [z, z * z - np.mean(z * z, axis=0)]
        cont += [(z[:, a] * z[:, b])[:, None] for a in range(len(active)) for b in range(a + 1, len(active))]
        self.cont = np.concatenate(cont, axis=1) if active else np.zeros((len(idx), 0))
        group += [1] * (2 * len(active)) + [2] * (self.cont.shape[1] - 2 * len(active))
        self.group = np.asarray(group, dtype=np.int8)
        self.width = self.n_cat + self.cont.shape[1]
        n_act = max(1, len(active))
        n_pair_blocks = max(1, len(active) * (len(active) - 1) // 2)
        # Prior variances (standardised log objective): the main effects explain about one unit of
        # variance in all, the interactions about half a unit; a column's share falls with its group size.
        var = np.where(self.group == 0, 1.0 / n_act, np.where(self.group == 1, 0.5 / n_act, 0.5 / n_pair_blocks))
        self.prior_var = var
        self.levels = levels
        self.active = active

    def triples(self) -> list[tuple[int, int, int]]:
        """Every three active tunables whose joint values number at most ``TRIPLE_CELLS_MAX``."""
        lv = self.levels
        return [t for t in itertools.combinations(self.active, 3) if lv[t[0]] * lv[t[1]] * lv[t[2]] <= TRIPLE_CELLS_MAX]

    def with_triples(self, valid: ValidSet, triples: list[tuple[int, int, int]], var: float) -> "Features":
        """These features plus one-hot blocks over the joint values of each of ``triples`` (prior
        variance ``var`` per cell): the model of a three-way interaction the pairwise model cannot fit."""
        out = object.__new__(Features)
        out.__dict__.update(self.__dict__)
        idx = valid.idx.astype(np.int32)
        lv = self.levels
        cols, off = [self.cat], self.n_cat
        for i, j, k in triples:
            cols.append((off + (idx[:, i] * lv[j] + idx[:, j]) * lv[k] + idx[:, k])[:, None])
            off += lv[i] * lv[j] * lv[k]
        extra = off - self.n_cat
        out.cat = np.concatenate(cols, axis=1)
        out.n_cat = off
        out.width = off + self.cont.shape[1]
        out.prior_var = np.concatenate([self.prior_var[:self.n_cat], np.full(extra, var), self.prior_var[self.n_cat:]])
        return out

    def design(self, rows: np.ndarray) -> np.ndarray:
        X = np.zeros((len(rows), self.width))
        if self.n_cat:
            np.put_along_axis(X, self.cat[rows], 1.0, axis=1)
        X[:, self.n_cat:] = self.cont[rows]
        return X

    def predict(self, rows: np.ndarray, w: np.ndarray) -> np.ndarray:
        """Predictions for ``rows`` under each column of ``w`` (width x S)."""
        out = self.cont[rows] @ w[self.n_cat:]
        if self.n_cat:
            for b in range(self.cat.shape[1]):
                out += w[self.cat[rows, b]]
        return out


def _value_cells(valid: ValidSet, order: int) -> list[tuple[np.ndarray, int]]:
    """For every ``order`` tunables of more than one value (order 1: each tunable; 3: every triple): each valid
    config's joint-value cell id, numbered over the cells some valid config has (0..n-1), and that number n
    (cached on the valid set)."""
    cache = getattr(valid, "_value_cells", None)
    if cache is None:
        cache = valid._value_cells = {}  # type: ignore[attr-defined]
    out = cache.get(order)
    if out is None:
        lv = [len(v) for v in valid.values]
        active = [j for j, n in enumerate(lv) if n > 1]
        idx = valid.idx.astype(np.int64)
        out = []
        for group in itertools.combinations(active, order):
            ids = np.zeros(len(idx), dtype=np.int64)
            size = 1
            for j in group:
                ids = ids * lv[j] + idx[:, j]
                size *= lv[j]
            present = np.bincount(ids, minlength=size) > 0
            out.append(((np.cumsum(present) - 1)[ids], int(present.sum())))
        cache[order] = out
    return out


def _features(valid: ValidSet) -> Features:
    f = getattr(valid, "_features", None)
    if f is None:
        f = Features(valid)
        valid._features = f  # type: ignore[attr-defined]
    return f


class Posterior:
    """The Gaussian posterior of a linear model y = X w + e, w ~ N(0, diag(prior_var)), e ~ N(0, noise).

    Solved in the smaller of the two spaces: features (a Cholesky factor of X'X / noise + prior precision)
    when there are at least as many rows as features, else rows (a Cholesky factor of
    X diag(prior_var) X' + noise I, draws by Matheron's rule), so a wide model (pairwise and three-way
    blocks, thousands of columns) on a few hundred rows costs rows^2 x features, not features^3."""

    def __init__(self, X: np.ndarray, y: np.ndarray, prior_var: np.ndarray, noise: float):
        self.X, self.y, self.pv, self.noise = X, y, prior_var, noise
        n, d = X.shape
        self.primal = n >= d
        if self.primal:
            A = X.T @ X / noise
            A[np.diag_indices_from(A)] += 1.0 / prior_var
            self.L = np.linalg.cholesky(A)
            self.mean = np.linalg.solve(self.L.T, np.linalg.solve(self.L, X.T @ y / noise))
        else:
            self.XP = X * prior_var  # X diag(prior_var)
            K = self.XP @ X.T
            K[np.diag_indices_from(K)] += noise
            self.L = np.linalg.cholesky(K)
            self.alpha = np.linalg.solve(self.L.T, np.linalg.solve(self.L, y))
            self.mean = self.XP.T @ self.alpha

    def draws(self, s: int, rng: np.random.Generator) -> np.ndarray:
        """``s`` weight vectors drawn from the posterior (features x s)."""
        d = len(self.pv)
        if self.primal:
            return self.mean[:, None] + np.linalg.solve(self.L.T, rng.standard_normal((d, s)))
        w0 = np.sqrt(self.pv)[:, None] * rng.standard_normal((d, s))
        e = math.sqrt(self.noise) * rng.standard_normal((len(self.y), s))
        r = self.y[:, None] - self.X @ w0 - e
        return w0 + self.XP.T @ np.linalg.solve(self.L.T, np.linalg.solve(self.L, r))

    def variance(self, Xq: np.ndarray) -> np.ndarray:
        """The posterior variance of X_q w for each row of ``Xq`` (the model's uncertainty, noise excluded)."""
        if self.primal:
            V = np.linalg.solve(self.L, Xq.T)
            return np.sum(V * V, axis=0)
        V = np.linalg.solve(self.L, self.XP @ Xq.T)
        return np.maximum(np.sum(Xq * Xq * self.pv, axis=1) - np.sum(V * V, axis=0), 0.0)


def value_classes(rows: np.ndarray, values: np.ndarray, levels: list[int]) -> list[np.ndarray] | None:
    """Per tunable, a class id for each of its value positions: two values share a class when every
    measured pair of configs that differ only in that tunable, between those two values, gave exactly the
    same objective, and no pair between members of the class
    gave a different one, where ``EQUAL_MIN`` such pairs at least were measured (one equal pair can be a
    coincidence of a symmetric formula). None when no two values share a class.

    A model estimate that ignores a tunable (a latency model blind to pipeline depth) gives exactly equal
    objectives for its values; a measurement never does, so on measured evidence nothing is merged."""
    out: list[np.ndarray] = []
    merged = False
    for j, n in enumerate(levels):
        root = np.arange(n)
        if n > 1 and len(rows) > 1:
            others = np.delete(rows, j, axis=1)
            groups: dict[bytes, list[int]] = {}
            for r in range(len(rows)):
                groups.setdefault(others[r].tobytes(), []).append(r)
            equal: dict[tuple[int, int], int] = {}
            differ: set[tuple[int, int]] = set()
            for members in groups.values():
                for a, b in itertools.combinations(members, 2):
                    va, vb = int(rows[a, j]), int(rows[b, j])
                    pair = (min(va, vb), max(va, vb))
                    same = abs(values[a] - values[b]) <= EQUAL_RTOL * max(abs(values[a]), abs(values[b]))
                    if same:
                        equal[pair] = equal.get(pair, 0) + 1
                    else:
                        differ.add(pair)

            def find(v: int, root=root) -> int:
                while root[v] != v:
                    v = int(root[v])
                return v

            for a, b in sorted(p for p, count in equal.items() if count >= EQUAL_MIN and p not in differ):
                ra, rb = find(a), find(b)
                if ra == rb:
                    continue
                members_a = [v for v in range(n) if find(v) == ra]
                members_b = [v for v in range(n) if find(v) == rb]
                if any((min(u, v), max(u, v)) in differ for u in members_a for v in members_b):
                    continue
                root[max(ra, rb)] = min(ra, rb)
                merged = True
            root = np.asarray([find(v) for v in range(n)])
        out.append(root)
    return out if merged else None


def _speedup(log_ratio: float) -> float:
    """baseline / variant from log(variant / baseline), kept inside what a float and the record hold."""
    return float(math.exp(min(max(-log_ratio, -700.0), 700.0))) or 1e-300


def baseline_value(ctx: AgentContext) -> float | None:
    """The objective of the sweep's baseline (the round-0 row, else the row with the spec's baseline config)."""
    rows = [r for r in ctx.history if r.round == 0] or [r for r in ctx.history if r.config == ctx.spec.baseline]
    for r in rows:
        v = ctx.objective.get(r.config_hash)
        if v is not None and math.isfinite(v) and v > 0 and not r.error:
            return float(v)
    return None


def main_effects_forecast(ctx: AgentContext, bad: set[str], picked: list[dict[str, int]]
                          ) -> list[tuple[float, float] | None]:
    """Forecasts for a space too large to enumerate: a Bayesian model of log(objective) with one
    coefficient per (tunable, value), fitted to every measured row that ran; (mean, sd) of
    log(variant / baseline) per pick, None before ``MODEL_MIN`` rows ran."""
    base = baseline_value(ctx)
    rows = [(r.config, ctx.objective[r.config_hash]) for r in ctx.history
            if r.config_hash not in bad and ctx.objective.get(r.config_hash)]
    if base is None or len(rows) < MODEL_MIN or not picked:
        return [None] * len(picked)
    params = dict(ctx.family.space.params)
    col = {}
    for k, vals in params.items():
        for v in vals:
            col[(k, v)] = len(col)

    def design(cfgs: list[dict[str, int]]) -> np.ndarray:
        X = np.zeros((len(cfgs), len(col)))
        for i, c in enumerate(cfgs):
            for k, v in c.items():
                if (k, v) in col:
                    X[i, col[(k, v)]] = 1.0
        return X

    y = np.log([v for _, v in rows])
    mu, sd = float(y.mean()), float(y.std()) or 1.0
    post = Posterior(design([c for c, _ in rows]), (y - mu) / sd, np.full(len(col), 1.0 / max(1, len(params))),
                     NOISE_VAR)
    Xq = design(picked)
    mean = mu + sd * (Xq @ post.mean)
    var = sd ** 2 * (post.variance(Xq) + NOISE_VAR)
    return [(float(m - math.log(base)), float(math.sqrt(v))) for m, v in zip(mean, var)]


def prior_forecast() -> tuple[float, float]:
    """(mean, sd) of log(baseline / variant) before the model has data: centred on no change, spread
    ``PRIOR_LOG_SD`` (see its comment)."""
    return 0.0, PRIOR_LOG_SD


@dataclass
class Shared:
    """The sweep's evaluated set as the portfolio's other members see it (kernel_assets/agent/portfolio.py): the
    enumerated valid set, which rows are taken (measured, or picked earlier this round: never proposed again),
    the rows that ran with their log objectives, the rows that failed, the failure model's verdict per row
    (True: not predicted to fail), the incumbent's position, and the round's seed."""

    valid: ValidSet
    taken: np.ndarray
    ok_rows: list[int]
    ok_y: list[float]
    fail_rows: list[int]
    all_rows: list[int]  # every measured row, in the order measured (ok and failed)
    feasible: np.ndarray
    anchor_pos: tuple[int, ...] | None
    seed: int
    round: int
    own: dict[str, list[int]] = field(default_factory=dict)  # member -> the measured rows it proposed, in order
    # rows -> the pairwise model's posterior mean of their standardised log objective, as the model sees it (capped
    # at the slow fence: ``slow_fence``); None: too few points
    predict: Callable[[np.ndarray], np.ndarray] | None = None


# fill(shared, k) -> up to k (row, member name) picks not taken: the portfolio's other members
Fill = Callable[[Shared, int], list[tuple[int, str]]]


# The global explorer (issue 57; kernel_assets.agent.portfolio says how many of a round's picks, ``n_explore``): uniformly
# random valid configs outside the neighbourhood of everything measured or picked, so that no model, however confident,
# keeps a round from looking elsewhere. Its picks are the local member's, their ids tagged (``r3-local-05-explore``).
EXPLORE_TAG = "explore"
FAR_HAMMING = 2  # an exploring pick differs from every measured (and earlier picked) config in at least this many tunables
FAR_SAMPLE = 512  # random unmeasured configs drawn per pick, among which one that far is taken


def global_explore(valid: ValidSet, taken: np.ndarray, seen: list[int], feasible: np.ndarray, k: int,
                   rng: np.random.Generator) -> list[int]:
    """``k`` exploring picks, each a uniformly random config not ``taken`` (and not predicted to fail, ``feasible``,
    while any such is left) that differs from every ``seen`` config (the measured ones and the round's earlier picks)
    and every earlier exploring pick in at least ``FAR_HAMMING`` tunables: outside the neighbourhood of each of them
    that the local picks search (their nearest ring and one-tunable lines), anywhere else in the space with equal
    chance. Drawn from up to ``FAR_SAMPLE`` random candidates per pick; where none of them is that far (a space nearly
    exhausted around what is measured), the farthest of them. ``taken`` is not changed."""
    out: list[int] = []
    ref = valid.idx[np.asarray(seen, dtype=np.int64)] if len(seen) else valid.idx[:0]
    avoid = taken.copy()
    for _ in range(k):
        free = np.flatnonzero(~avoid & feasible)
        if not len(free):
            free = np.flatnonzero(~avoid)
        if not len(free):
            break
        cand = rng.choice(free, min(FAR_SAMPLE, len(free)), replace=False)  # in a random order
        j = 0
        if len(ref):
            dist = (valid.idx[cand][:, None, :] != ref[None, :, :]).sum(axis=2).min(axis=1)
            j = int(np.flatnonzero(dist >= min(FAR_HAMMING, int(dist.max())))[0])  # a uniform draw among the far
        i = int(cand[j])
        avoid[i] = True
        out.append(i)
        ref = np.vstack([ref, valid.idx[i][None, :]])
    return out


def slow_fence(y: np.ndarray) -> float:
    """The upper Tukey fence of the measured log objectives (third quartile + 1.5 x the interquartile range), where
    the models cap them: what lies beyond is slow, and how slow does not matter to a search for the fastest. No
    fence (inf) where the quartiles tie: with the middle half of the values equal (model estimates blind to a
    tunable) the fence would sit on the third quartile and flatten every slower value, outlier or not."""
    q1 = float(np.percentile(y, 25, method="lower"))
    q3 = float(np.percentile(y, 75, method="higher"))
    return q3 + 1.5 * (q3 - q1) if q3 > q1 else math.inf


class _Round:
    """One round of the enumerated search: what the history says (which rows are taken, which ran and their log
    objectives, which failed), the features, the candidates (a seeded sample of a large valid set), the failure
    model's verdict on them, the incumbent's position, the pairwise model (fitted once, when first needed), and
    the picks so far. Built from the history alone, so a round is the same whenever it is rebuilt."""

    def __init__(self, ctx: AgentContext, valid: ValidSet, anchor: dict, bad: set[str], base_seed: int,
                 notes: list[str], winsor: bool = True):
        self.ctx, self.valid, self.seed = ctx, valid, int(base_seed)
        self.rng = np.random.default_rng([abs(int(base_seed)), int(ctx.round), 0x10CA1])
        self.tie_rng = random.Random(int(self.rng.integers(2**31)))
        self.taken = taken = np.zeros(len(valid), dtype=bool)
        self.ok_rows: list[int] = []
        self.ok_y: list[float] = []
        self.all_rows: list[int] = []  # every measured row, in the order measured (ok and failed)
        self.picked: list[int] = []
        self.explored: set[int] = set()  # the picks of the global explorer (``global_explore``)
        self._post: Posterior | None = None  # fitted once, when first needed
        fail, ok_v = [], []
        for row in ctx.history:
            pos = valid.position(row.config)
            i = valid.row_of.get(pos) if pos is not None else None
            if i is None or taken[i]:
                continue
            taken[i] = True
            self.all_rows.append(i)
            fail.append(1.0 if row.config_hash in bad else 0.0)
            value = ctx.objective.get(row.config_hash)
            if value is not None and math.isfinite(value) and value > 0 and not row.error:
                self.ok_rows.append(i)
                self.ok_y.append(math.log(value))
                ok_v.append(value)
        self.fail_rows = [r for r, f in zip(self.all_rows, fail) if f]
        self.exhausted = bool(taken.all()) or self._skip_inert(ok_v, notes)
        if self.exhausted:
            return
        self.feats = _features(valid)
        free = np.flatnonzero(~taken)
        if len(free) > CANDIDATES_MAX:
            free = np.sort(self.rng.choice(free, CANDIDATES_MAX, replace=False))
        self.free = free
        # Failure model: which candidates look like the failures seen so far.
        fail_p = np.zeros(len(free))
        if any(fail) and len(self.all_rows) >= 2:
            t = np.asarray(fail)
            base = float(t.mean())
            fpost = Posterior(self.feats.design(np.asarray(self.all_rows)), t - base, self.feats.prior_var, 0.1)
            fail_p = base + self.feats.predict(free, fpost.mean[:, None])[:, 0]
        self.feasible = fail_p <= FAIL_P_MAX
        self.feas_all = np.ones(len(valid), dtype=bool)
        self.feas_all[free] = self.feasible
        self.anchor_pos = valid.position(anchor)
        # the incumbent's positions, as idx holds them
        self.at = np.asarray(self.anchor_pos, dtype=np.int16) if self.anchor_pos is not None else None
        y_all = np.asarray(self.ok_y)
        self.capped = np.zeros(len(y_all), dtype=bool)  # the rows whose log objective the models see capped
        if winsor and len(y_all) >= MODEL_MIN:
            fence = slow_fence(y_all)
            self.capped = y_all > fence
            y_all = np.minimum(y_all, fence)
        self.y_mu, self.y_sd = (float(y_all.mean()), float(y_all.std()) or 1.0) if len(y_all) else (0.0, 1.0)
        self.y_std = (y_all - self.y_mu) / self.y_sd  # the standardised log objectives the models are fitted to

    def _skip_inert(self, ok_v: list[float], notes: list[str]) -> bool:
        """Moves that cannot change the objective: values of a tunable that have only ever given exactly the same
        objective (model evidence blind to them) make configs equivalent; one of each class is enough. Marks the
        configs equivalent to a measured one taken, with a note; True when nothing is left."""
        valid, taken, ok_rows = self.valid, self.taken, self.ok_rows
        classes = value_classes(valid.idx[ok_rows], np.asarray(ok_v), [len(v) for v in valid.values]) if ok_rows else None
        if classes is None:
            return False
        code = np.zeros(len(valid), dtype=np.int64)
        for j, cls in enumerate(classes):
            code = code * len(cls) + cls[valid.idx[:, j]]
        same = np.isin(code, code[np.asarray(ok_rows)]) & ~taken
        if not same.any():
            return False
        inert = [f"{k} {'/'.join(str(valid.values[j][v]) for v in range(len(cls)) if cls[v] == c)}"
                 for j, (k, cls) in enumerate(zip(valid.keys, classes))
                 for c in sorted(set(cls.tolist())) if (cls == c).sum() > 1]
        notes.append(f"skipped {int(same.sum())} configs that differ from measured ones only in values that "
                     f"have always given exactly the same objective ({'; '.join(inert)})")
        taken |= same
        return bool(taken.all())

    def pick(self, i: int) -> None:
        self.taken[i] = True
        self.picked.append(int(i))

    def posterior(self) -> Posterior:
        """The pairwise model's posterior, fitted to the rows that ran (once a round)."""
        if self._post is None:
            self._post = Posterior(self.feats.design(np.asarray(self.ok_rows)), self.y_std, self.feats.prior_var,
                                   NOISE_VAR)
        return self._post

    def unmeasured(self) -> np.ndarray:
        """The free configs not yet taken that do not look like failures (all of them when none is left)."""
        cand = self.free[self.feasible & ~self.taken[self.free]]
        return cand if len(cand) else self.free[~self.taken[self.free]]

    def nearest_to(self, pos, k: int) -> list[int]:
        """Up to k unmeasured configs nearest ``pos`` that do not look like failures."""
        mask = self.taken.copy()
        mask[self.free[~self.feasible]] = True
        return self.valid.nearest(pos, mask, k, self.tie_rng)

    def lines(self) -> np.ndarray:
        """The incumbent's unmeasured one-tunable lines, over the whole valid set (not only ``free``, a sample of
        a large one)."""
        on_line = (self.valid.idx != self.at).sum(axis=1) == 1
        return np.flatnonzero(on_line & ~self.taken)

    def thompson(self, model: Features, mpost: Posterior, k: int, cand: np.ndarray) -> None:
        """``k`` picks from ``cand``, each the best candidate of one posterior draw (predicted failures last)."""
        if k <= 0 or not len(cand):
            return
        pred = model.predict(cand, mpost.draws(k, self.rng))
        pred += 1e-9 * self.rng.standard_normal(pred.shape)  # seeded tie break
        pred[~self.feas_all[cand]] += 1e6  # failures-to-be last, while anything else remains
        for c in range(k):
            col = pred[:, c].copy()
            col[self.taken[cand]] = np.inf
            j = int(np.argmin(col))
            if not math.isfinite(col[j]):
                break
            self.pick(cand[j])

    def finish(self, name: str, fill: Fill | None
               ) -> tuple[list[dict[str, int]], list[tuple[float, float] | None], list[str]]:
        """The other members fill the round (``fill``, the portfolio); every pick gets the pairwise model's
        forecast; the member that picked each."""
        ctx, members = self.ctx, [EXPLORE_TAG if i in self.explored else name for i in self.picked]
        if fill is not None and len(self.picked) < ctx.n:
            model = (lambda rows: self.feats.predict(np.asarray(rows), self.posterior().mean[:, None])[:, 0]
                     ) if len(self.ok_rows) >= MODEL_MIN else None
            shared = Shared(self.valid, self.taken, self.ok_rows, self.ok_y, self.fail_rows, list(self.all_rows),
                            self.feas_all, self.anchor_pos, self.seed, ctx.round, predict=model)
            mine = set(self.picked)  # fill marks its picks taken as it goes (members pick in turn)
            for i, m in fill(shared, ctx.n - len(self.picked)):
                if i not in mine:
                    mine.add(i)
                    self.pick(i)
                    members.append(m)
        return [self.valid.config(i) for i in self.picked], self.forecasts(), members

    def forecasts(self) -> list[tuple[float, float] | None]:
        """Each pick's forecast of log(variant) - log(baseline) under the pairwise model: the posterior mean, and
        the predictive sd (posterior spread of the mean plus the model's residual variance ``NOISE_VAR``, in log
        units). None before the model has ``MODEL_MIN`` measured points."""
        base = baseline_value(self.ctx)
        if not self.picked or len(self.ok_rows) < MODEL_MIN or base is None:
            return [None] * len(self.picked)
        post = self.posterior()
        rows = np.asarray(self.picked)
        mean = self.y_mu + self.y_sd * self.feats.predict(rows, post.mean[:, None])[:, 0]
        var = self.y_sd ** 2 * (post.variance(self.feats.design(rows)) + NOISE_VAR)
        lb = math.log(base)
        return [(float(m - lb), float(math.sqrt(v))) for m, v in zip(mean, var)]


class LocalPolicy:
    """Thompson sampling on a second-order model of the measured history, with a failure model, the
    incumbent's nearest neighbours, and a switch to wider exploration when the search stops finding
    better configs (see the module docstring). ``stagnation_switch=False`` runs the search without the
    switch and the explorers (pairwise model, the local picks and the stale line search, uniform random picks
    in round 1 only): for comparisons."""

    name = "local"

    def __init__(self, seed: int | None = None, *, stagnation_switch: bool = True, ablate: frozenset[str] = frozenset()):
        unknown = sorted(set(ablate) - set(ABLATIONS))
        if unknown:
            raise ValueError(f"ablate {', '.join(unknown)}: unknown; use {', '.join(ABLATIONS)}")
        self.seed = seed
        self.stagnation_switch = stagnation_switch
        self.ablate = frozenset(ablate)

    def propose(self, ctx: AgentContext, n_own: int | None = None, fill: Fill | None = None,
                n_explore: int = 0) -> Proposal:
        """The round's proposals. With ``fill`` (the portfolio), this policy picks ``n_own`` of the ``ctx.n``
        and ``fill`` the rest from the same evaluated set; each proposal's id names its member
        (``r<round>-<member>-<k>``), and every proposal gets this policy's model forecast. ``n_explore`` of its own
        picks are the global explorer's (``global_explore``; enumerated spaces), their ids ``r<round>-local-<k>-explore``."""
        spec, fam = ctx.spec, ctx.family
        base_seed = spec.search.seed if self.seed is None else self.seed
        best, bad = self._incumbent(ctx)
        anchor = best.config if best else spec.baseline
        anchor_id = best.variant_id if best else "baseline"
        valid = valid_set(fam.space, spec.params, spec.hardware.limits)
        notes: list[str] = []
        if valid is not None and len(valid):
            stale = ctx.round - 1 - (best.round if best else 0)  # finished rounds since the best was found
            picked, forecasts, members = self._propose_enumerated(ctx, valid, anchor, bad, base_seed, stale, notes,
                                                                  n_own=n_own, fill=fill, n_explore=n_explore)
        else:
            picked = self._propose_sampled(ctx, anchor, base_seed * 1009 + ctx.round)
            forecasts = main_effects_forecast(ctx, bad, picked)
            members = [self.name] * len(picked)
        if len(picked) < ctx.n:
            notes.append(f"local search found {len(picked)} new valid configs of {ctx.n} asked (space nearly exhausted)")
        base_value = baseline_value(ctx)
        suggestions = []
        for k, (cfg, fc, member) in enumerate(zip(picked, forecasts, members), start=1):
            summary, effect, risk = describe_change(anchor, cfg)
            speed = {}
            if base_value is not None:
                mean, sd = fc if fc is not None else prior_forecast()
                # the forecast is of log(variant objective) - log(baseline): speedup = exp(-that)
                speed = dict(expected_speedup=_speedup(mean), expected_speedup_low=_speedup(mean + Z80 * sd),
                             expected_speedup_high=_speedup(mean - Z80 * sd))
            vid = (f"r{ctx.round}-{self.name}-{k:02d}-{EXPLORE_TAG}" if member == EXPLORE_TAG
                   else f"r{ctx.round}-{member}-{k:02d}")
            suggestions.append(Suggestion(
                variant_id=vid, config=cfg, patch_summary=summary, expected_effect=effect,
                risk=risk, parent=anchor_id, source="local", round=ctx.round, **speed,
            ))
        if base_value is None:
            notes.append("no forecast: the baseline has no objective value (it failed or was not measured)")
        kept, dropped = validate_and_dedupe(ctx, suggestions, "local")
        ctx.log.info(f"local policy: {len(kept)} proposals around {anchor_id} ({config_label(anchor)})")
        return Proposal(suggestions=kept, dropped=dropped, notes=notes)

    @staticmethod
    def _incumbent(ctx: AgentContext) -> tuple[VariantResult | None, set[str]]:
        """The best row that ran and met the constraints; the hashes of rows that failed or broke one."""
        best, best_v, bad = None, math.inf, set()
        for row in ctx.history:
            value = ctx.objective.get(row.config_hash)
            cons = constraint_values(row, ctx.spec)
            if row.error or value is None or not math.isfinite(value) or value <= 0 or any(c > 0 for c in cons.values()):
                bad.add(row.config_hash)
                continue
            if value < best_v:
                best, best_v = row, value
        return best, bad

    def _propose_enumerated(self, ctx: AgentContext, valid: ValidSet, anchor: dict, bad: set[str],
                            base_seed: int, stale: int = 0, notes: list[str] | None = None,
                            n_own: int | None = None, fill: Fill | None = None, n_explore: int = 0,
                            ) -> tuple[list[dict[str, int]], list[tuple[float, float] | None], list[str]]:
        """The round's picks (configs) and each one's forecast of log(variant / baseline objective) as
        (mean, sd), None where the model has too few points (the caller uses the prior forecast); and the member
        that picked each. In order: the local picks around the incumbent (``_local_picks``); until the model has
        a few points, random picks; from then on the model's picks (``_model_picks``); the other members last."""
        notes = notes if notes is not None else []
        r = _Round(ctx, valid, anchor, bad, base_seed, notes, winsor="winsor" not in self.ablate)
        n = ctx.n if n_own is None else min(n_own, ctx.n)
        if r.exhausted:
            return [], [], []
        n_x = min(max(0, n_explore), n)  # the global explorer's picks: kept whatever the local picks take
        n_local = min(n - n_x, max(1, (n - n_x) // FIRST_NEAR_DIV) if len(r.ok_rows) <= 1 else N_LOCAL)
        self._local_picks(r, n_local, stale)
        if n_x:
            rng = np.random.default_rng([abs(int(base_seed)), int(ctx.round), 0x61AB])
            for i in global_explore(valid, r.taken, r.all_rows + r.picked, r.feas_all, n_x, rng):
                r.pick(i)
                r.explored.add(i)
        if len(r.ok_rows) < max(MODEL_MIN, ctx.n // 2):
            # Until the model has a few points: space-filling random picks, first (they cover the space).
            cand = r.unmeasured()
            k = min(n - len(r.picked), len(cand))
            n_near = len(r.picked)
            # the three-way cover; with it off, a cover of each tunable's values; uniform without the explorers
            if not self.stagnation_switch:
                order = 0
            elif not {"cover", "start_cover"} & self.ablate:
                order = 3
            else:
                order = 0 if "balance" in self.ablate else 1
            for i in self._explore(valid, r.all_rows + r.picked, cand, k, r.rng, order) if k > 0 else []:
                r.pick(i)
            r.picked[:] = r.picked[n_near:] + r.picked[:n_near]
        else:
            self._model_picks(r, n, stale)
        return r.finish(self.name, fill)

    def _local_picks(self, r: _Round, n_local: int, stale: int) -> None:
        """The local picks: the incumbent's ring and lines best first under the model (model-free until it has
        MODEL_MIN points: the nearest unmeasured configs that do not look like failures). Once the best has not
        moved for STALE_ROUNDS rounds: a line search instead, the unmeasured configs that change ONE tunable of
        the incumbent to any of its values (a far value on an ordered axis can be the good one: block sizes 32,
        64, 128, 256 fast, those between slow), best first under a posterior draw, predicted failures included
        (they are the incumbent's own line)."""
        if r.anchor_pos is None:
            return
        line = np.zeros(0, dtype=np.int64)
        if stale >= STALE_ROUNDS and len(r.ok_rows) >= 2 and "line" not in self.ablate:
            line = r.lines()
        if len(line):
            draw = r.posterior().draws(1, r.rng)
            score = r.feats.predict(line, draw)[:, 0] + 1e-9 * r.rng.standard_normal(len(line))
            for j in np.argsort(score)[:n_local]:
                r.pick(int(line[j]))
        elif len(r.ok_rows) >= MODEL_MIN and "near_rank" not in self.ablate:
            # Model-guided coordinate descent: the incumbent's nearest ring (the configs as near as the
            # n_local-th nearest, up to RING_MAX of them) and its one-tunable lines (any value of one tunable: a
            # far value on an ordered axis can be the good one; not with the "line" knob off), predicted failures
            # left out, best first under the pairwise model's posterior mean.
            ring = np.asarray(r.nearest_to(r.anchor_pos, RING_MAX), dtype=np.int64)
            if len(ring):
                steps = np.abs(r.valid.idx[ring] - r.at).sum(axis=1)
                ring = ring[steps <= steps[min(n_local, len(ring)) - 1]]
            if "line" not in self.ablate:
                line = r.lines()
                ring = np.union1d(ring, line[r.feas_all[line]])
            if len(ring):
                score = r.feats.predict(ring, r.posterior().mean[:, None])[:, 0]
                for j in np.argsort(score, kind="stable")[:n_local]:
                    r.pick(int(ring[j]))
        else:
            for i in r.nearest_to(r.anchor_pos, n_local):
                r.pick(i)

    def _model_picks(self, r: _Round, n: int, stale: int) -> None:
        """The rest of a round once the model has a few points: Thompson sampling, one posterior draw per
        remaining proposal, its best candidate. A search that has stopped finding better configs (STALE_ROUNDS
        rounds) spends part of each round on exploration the pairwise model cannot do: draws from a model with
        three-way blocks (a combination of three values that pays only together, which the pairwise model has
        averaged away), and a diverse pick. The standing second local search (around the best config the model did
        not expect: another basin) and the standing explorer come first and last."""
        explore = self.stagnation_switch and stale >= EXPLORE_AFTER and "switch" not in self.ablate
        if self.stagnation_switch and SURPRISE_SLOTS and r.anchor_pos is not None and "surprise" not in self.ablate:
            root = self._surprise_root(r.valid, r.posterior(), r.ok_rows, r.anchor_pos, r.capped)
            if root is not None:
                for i in r.nearest_to(tuple(r.valid.idx[root]), min(SURPRISE_SLOTS, n - len(r.picked))):
                    r.pick(i)
        s = n - len(r.picked)
        # the standing explorer: in every round, or ("standing" switched off) once the search has stalled
        k_cover = (min(s, COVER_SLOTS) if self.stagnation_switch and "cover" not in self.ablate
                   and (explore or "standing" not in self.ablate) else 0)
        k_rand = min(s - k_cover, RANDOM_SLOTS + (stale - EXPLORE_AFTER) // RANDOM_GROWTH) if explore else 0
        k_tri = min(TRIPLE_SLOTS, s - k_cover - k_rand) if explore and r.feats.triples() else 0
        r.thompson(r.feats, r.posterior(), s - k_cover - k_rand - k_tri, r.free)
        if k_tri:
            trip = r.feats.triples()
            if len(trip) > TRIPLE_BLOCKS_MAX:
                trip = [trip[i] for i in sorted(r.rng.choice(len(trip), TRIPLE_BLOCKS_MAX, replace=False))]
            ext = r.feats.with_triples(r.valid, trip, TRIPLE_PRIOR_VAR)
            tpost = Posterior(ext.design(np.asarray(r.ok_rows)), r.y_std, ext.prior_var, NOISE_VAR)
            # Half the draws (rounded up) pick within TRIPLE_RADIUS changes of the incumbent: an interaction
            # that pays may be one the incumbent nearly has (the pairwise model priced each pair as a loss);
            # the others anywhere: one seen once, far from the incumbent, is exploited where it was seen.
            cand = r.free[~r.taken[r.free]]
            k_near = (k_tri + 1) // 2 if r.anchor_pos is not None else 0
            if k_near:
                near = cand[(r.valid.idx[cand] != r.at).sum(axis=1) <= TRIPLE_RADIUS]
                if len(near) > TRIPLE_CANDIDATES_MAX:
                    near = np.sort(r.rng.choice(near, TRIPLE_CANDIDATES_MAX, replace=False))
                r.thompson(ext, tpost, k_near, near)
            if len(cand) > TRIPLE_CANDIDATES_MAX:
                cand = np.sort(r.rng.choice(cand, TRIPLE_CANDIDATES_MAX, replace=False))
            r.thompson(ext, tpost, k_tri - k_near, cand)
        # The explorers that no model can mislead: the three-way cover, then (a stalled search) uniform random
        # picks, which no structure biases (a lone optimum is anywhere; the cover prefers unusual configs).
        for k, order in ((k_cover, 3), (k_rand, 0)):
            if k:
                for i in self._explore(r.valid, r.all_rows + r.picked, r.unmeasured(), k, r.rng, order):
                    r.pick(int(i))

    @staticmethod
    def _explore(valid: ValidSet, seen: list[int], cand: np.ndarray, k: int, rng: np.random.Generator,
                 order: int) -> list[int]:
        """``k`` exploring picks from ``cand``: uniform random (``order`` 0), or a greedy cover of the value cells
        of every ``order`` tunables (order 3: combinations of three values; order 1: single values, a balanced
        design, as a Latin hypercube spreads its points over every axis). Each pick maximises its chance of
        landing in a cell that pays, where the tunables and their values are unknown: every group of tunables
        equally likely, and every cell of a group that no measured config (or earlier pick) has equally likely.
        That chance is, up to a constant, the sum over groups of [the pick's cell is unmeasured] / (unmeasured
        cells of that group). Ties in a seeded random order."""
        k = min(k, len(cand))
        if k <= 0:
            return []
        if not order:
            return [int(i) for i in rng.choice(cand, k, replace=False)]
        cells = _value_cells(valid, order)
        seen_rows = np.asarray(seen, dtype=np.int64)
        cand = np.asarray(cand)
        cand_cells = []
        state = []
        for ids, n_cells in cells:
            covered = np.zeros(n_cells, dtype=bool)
            if len(seen_rows):
                covered[ids[seen_rows]] = True
            state.append(covered)
            cand_cells.append(ids[cand])
        out: list[int] = []
        alive = np.ones(len(cand), dtype=bool)
        for _ in range(k):
            score = 1e-9 * rng.random(len(cand))
            for t, covered in enumerate(state):
                open_cells = len(covered) - int(covered.sum())
                if open_cells:
                    score += (~covered[cand_cells[t]]) / open_cells
            score[~alive] = -np.inf
            j = int(np.argmax(score))
            if not math.isfinite(score[j]):
                break
            alive[j] = False
            out.append(int(cand[j]))
            for t, covered in enumerate(state):
                covered[cand_cells[t][j]] = True
        return out

    @staticmethod
    def _surprise_root(valid: ValidSet, post: Posterior, ok_rows: list[int], anchor_pos,
                       capped: np.ndarray | None = None) -> int | None:
        """The best measured config that the model, fitted to the others, predicted far too slow (leave-one-out
        residual below -``SURPRISE_Z`` sd) and that differs from the incumbent in ``SURPRISE_HAMMING``
        tunables or more; None when there is none. ``post`` is the model fitted to ``ok_rows`` (its design
        and standardised log objectives are those rows'). A row in ``capped`` (past the slow fence: the model
        sees it at the fence, so its residual can look negative) is slow whatever the model says, never a root."""
        rows = np.asarray(ok_rows)
        far = (valid.idx[rows] != np.asarray(anchor_pos, dtype=np.int16)).sum(axis=1) >= SURPRISE_HAMMING
        if capped is not None:
            far &= ~capped
        if not far.any():
            return None
        ys, X = post.y, post.X
        fit = X @ post.mean
        h = np.clip(post.variance(X) / NOISE_VAR, 0.0, 1.0 - 1e-6)  # the posterior hat matrix's diagonal
        z = (ys - fit) / np.sqrt(NOISE_VAR * (1.0 - h))  # standardised leave-one-out residual
        ok = far & (z < -SURPRISE_Z)
        if not ok.any():
            return None
        return int(rows[np.flatnonzero(ok)[np.argmin(ys[ok])]])

    def _propose_sampled(self, ctx: AgentContext, anchor: dict, seed: int) -> list[dict[str, int]]:
        """Spaces too large to enumerate: one-step neighbours of the incumbent, then constrained TPE
        (Optuna) with rejection of invalid or measured points, up to an attempt cap."""
        from kregress.core.records import config_hash

        spec, fam = ctx.spec, ctx.family
        space_params = dict(fam.space.params)  # read once: a family may compute it on every access
        distributions = {k: optuna.distributions.CategoricalDistribution(list(v)) for k, v in space_params.items()}
        sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=8, multivariate=True, constant_liar=True)
        study = optuna.create_study(direction="minimize", sampler=sampler)
        for row in ctx.history:
            params = {k: row.config[k] for k in distributions if k in row.config}
            if len(params) != len(distributions) or any(params[k] not in space_params[k] for k in params):
                continue
            value = ctx.objective.get(row.config_hash)
            cons = constraint_values(row, spec)
            if row.error or value is None:
                trial = optuna.trial.create_trial(params=params, distributions=distributions,
                                                  state=optuna.trial.TrialState.FAIL, constraints=cons)
            else:
                trial = optuna.trial.create_trial(params=params, distributions=distributions, value=value,
                                                  constraints=cons)
            study.add_trial(trial)
        rng = random.Random(seed)
        seen = set(ctx.measured_hashes)
        n_exploit = max(1, ctx.n // 2)
        picked: list[dict[str, int]] = []
        neighbours = []
        for k, values in space_params.items():
            pos = values.index(anchor[k]) if anchor.get(k) in values else None
            if pos is None:
                continue
            for step in (-1, 1):
                if 0 <= pos + step < len(values):
                    cand = dict(anchor)
                    cand[k] = values[pos + step]
                    neighbours.append(cand)
        rng.shuffle(neighbours)
        for cand in neighbours:
            if len(picked) >= n_exploit:
                break
            h = config_hash(cand)
            if h not in seen and fam.space.check(cand, spec.params, spec.hardware.limits) is None:
                seen.add(h)
                picked.append(cand)
        attempts = misses = 0
        while len(picked) < ctx.n and attempts < 60 * ctx.n and misses < 300:
            attempts += 1
            misses += 1
            trial = study.ask(distributions)
            cand = {k: int(trial.params[k]) for k in distributions}
            h = config_hash(cand)
            if fam.space.check(cand, spec.params, spec.hardware.limits) is not None:
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
                continue
            if h in seen:
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                continue
            seen.add(h)
            picked.append(cand)
            misses = 0
        return picked
