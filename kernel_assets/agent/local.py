"""The local policy (embedded default, no network): Bayesian search over the enumerated valid set.

Each round is rebuilt from everything measured in this sweep (the baseline is round 0), so the search
is deterministic given the spec's seed and the history, and resumes from any round. Configs outside
the space, or already measured, are never proposed.

Spaces small enough to enumerate (``ENUMERATE_LIMIT`` Cartesian points; the valid set is built once
per process and space) get the model-based search:

* A model of the shape of the space: Bayesian linear regression of log(objective) on second-order
  features of each config's ordinal positions (one-hot main effects, ordinal trends, pairwise
  interactions; see ``Features``), fitted to every row that ran. Its Gaussian posterior is exact and
  cheap (one Cholesky factor of a features x features matrix a round).
* A model of failures: the same features, regressed on "this row failed" (a recorded failure, a
  failed compile or run, or a constraint broken: registers, spills, shared memory). A failure
  teaches where the feasible region ends: candidates whose predicted failure chance is above
  ``FAIL_P_MAX`` are not proposed while other candidates remain.
* A portfolio each round of n proposals: local search around the incumbent (its ``N_LOCAL`` nearest
  unmeasured configs by steps along the ordered values, model-free, skipping likely failures), then
  one Thompson draw from the posterior per remaining proposal, each taking the draw's best unmeasured
  candidate (global search; the draws' spread shrinks where the model is sure, so exploration and
  exploitation balance by themselves).
* A stale incumbent (no new best for ``STALE_ROUNDS`` rounds): the local picks become a line search,
  the unmeasured configs that change one tunable of the incumbent to ANY of its values, best first
  under a posterior draw. Steps along an ordered axis miss a far good value (on the convolution space
  block sizes 32/64/128/256 are fast and 144..240 three times slower, so the optimum at 256 sat eight
  steps from an incumbent at 128: 20-seed median best/optimum at 400 evaluations 1.004 -> 1.000).
* Before the model has a few points (round 1 from the baseline alone): half the round is the
  incumbent's nearest valid configs by steps along the ordered values, half uniform random picks.

Larger spaces keep the plain path: one-step neighbours of the incumbent, then Optuna's TPE with a
constraint function over registers, spills and shared memory, with rejection and an attempt cap.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import random
import threading

import numpy as np
import optuna

from kernel_assets.agent.base import AgentContext, Proposal, validate_and_dedupe
from kregress.core.records import Suggestion, VariantResult, config_label
from kregress.core.family import Space
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
N_LOCAL = 2  # proposals per round that are the unmeasured valid configs nearest the incumbent
STALE_ROUNDS = 3  # rounds without a new best after which the local picks become a line search (see below)


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
        self.prior_prec = 1.0 / var

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


def _features(valid: ValidSet) -> Features:
    f = getattr(valid, "_features", None)
    if f is None:
        f = Features(valid)
        valid._features = f  # type: ignore[attr-defined]
    return f


def _posterior(X: np.ndarray, y: np.ndarray, prior_prec: np.ndarray, noise: float):
    """Mean and Cholesky factor of the precision of the Gaussian posterior of a linear model."""
    A = X.T @ X / noise
    A[np.diag_indices_from(A)] += prior_prec
    L = np.linalg.cholesky(A)
    mean = np.linalg.solve(L.T, np.linalg.solve(L, X.T @ y / noise))
    return mean, L


class LocalPolicy:
    """Thompson sampling on a second-order model of the measured history, with a failure model,
    plus the incumbent's nearest neighbours (see the module docstring)."""

    name = "local"

    def __init__(self, seed: int | None = None):
        self.seed = seed

    def propose(self, ctx: AgentContext) -> Proposal:
        spec, fam = ctx.spec, ctx.family
        base_seed = spec.search.seed if self.seed is None else self.seed
        best, bad = self._incumbent(ctx)
        anchor = best.config if best else spec.baseline
        anchor_id = best.variant_id if best else "baseline"
        valid = valid_set(fam.space, spec.params, spec.hardware.limits)
        if valid is not None and len(valid):
            stale = ctx.round - 1 - (best.round if best else 0)  # finished rounds since the best was found
            picked = self._propose_enumerated(ctx, valid, anchor, bad, base_seed, stale)
        else:
            picked = self._propose_sampled(ctx, anchor, base_seed * 1009 + ctx.round)
        notes = []
        if len(picked) < ctx.n:
            notes.append(f"local search found {len(picked)} new valid configs of {ctx.n} asked (space nearly exhausted)")
        suggestions = []
        for k, cfg in enumerate(picked, start=1):
            summary, effect, risk = describe_change(anchor, cfg)
            suggestions.append(Suggestion(
                variant_id=f"r{ctx.round}-local-{k:02d}", config=cfg, patch_summary=summary, expected_effect=effect,
                risk=risk, parent=anchor_id, source="local", round=ctx.round,
            ))
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
                            base_seed: int, stale: int = 0) -> list[dict[str, int]]:
        rng = np.random.default_rng([abs(int(base_seed)), int(ctx.round), 0x10CA1])
        tie_rng = random.Random(int(rng.integers(2**31)))
        taken = np.zeros(len(valid), dtype=bool)
        ok_rows, ok_y, all_rows, fail = [], [], [], []
        for row in ctx.history:
            pos = valid.position(row.config)
            i = valid.row_of.get(pos) if pos is not None else None
            if i is None:
                continue
            if taken[i]:
                continue
            taken[i] = True
            failed = row.config_hash in bad
            all_rows.append(i)
            fail.append(1.0 if failed else 0.0)
            value = ctx.objective.get(row.config_hash)
            if value is not None and math.isfinite(value) and value > 0 and not row.error:
                ok_rows.append(i)
                ok_y.append(math.log(value))
        picked: list[int] = []

        def pick(i: int) -> None:
            taken[i] = True
            picked.append(int(i))

        n = ctx.n
        if taken.all():
            return []
        feats = _features(valid)
        free = np.flatnonzero(~taken)
        if len(free) > CANDIDATES_MAX:
            free = np.sort(rng.choice(free, CANDIDATES_MAX, replace=False))
        # Failure model: which candidates look like the failures seen so far.
        fail_p = np.zeros(len(free))
        if any(fail) and len(all_rows) >= 2:
            t = np.asarray(fail)
            base = float(t.mean())
            Xa = feats.design(np.asarray(all_rows))
            w, _ = _posterior(Xa, t - base, feats.prior_prec, 0.1)
            fail_p = base + feats.predict(free, w[:, None])[:, 0]
        feasible = fail_p <= FAIL_P_MAX
        anchor_pos = valid.position(anchor)
        # 1. The incumbent's nearest unmeasured neighbours that do not look like failures. Once the
        # best has not moved for STALE_ROUNDS rounds: a line search instead, the unmeasured configs
        # that change ONE tunable of the incumbent to any of its values (a far value on an ordered axis
        # can be the good one: block sizes 32, 64, 128, 256 fast, those between slow), best first under
        # a posterior draw, predicted failures included (they are the incumbent's own line).
        n_local = max(1, n // 2) if len(ok_rows) <= 1 else min(N_LOCAL, n)
        post: list = []  # the model's posterior (mean, Cholesky factor), fitted once, when first needed

        def posterior() -> tuple[np.ndarray, np.ndarray]:
            if not post:
                y = np.asarray(ok_y)
                sd = float(y.std()) or 1.0
                post.extend(_posterior(feats.design(np.asarray(ok_rows)), (y - y.mean()) / sd, feats.prior_prec,
                                       NOISE_VAR))
            return post[0], post[1]

        line = np.zeros(0, dtype=np.int64)
        if anchor_pos is not None and stale >= STALE_ROUNDS and len(ok_rows) >= 2:
            on_line = (valid.idx[free] != np.asarray(anchor_pos, dtype=np.int16)).sum(axis=1) == 1
            line = free[on_line & ~taken[free]]
        if len(line):
            ml, Ll = posterior()
            draw = ml + np.linalg.solve(Ll.T, rng.standard_normal(feats.width))
            score = feats.predict(line, draw[:, None])[:, 0] + 1e-9 * rng.standard_normal(len(line))
            for j in np.argsort(score)[:n_local]:
                pick(int(line[j]))
        elif anchor_pos is not None:
            mask = taken.copy()
            mask[free[~feasible]] = True
            for i in valid.nearest(anchor_pos, mask, n_local, tie_rng):
                pick(i)
        # 2. Until the model has a few points: space-filling random picks.
        if len(ok_rows) < max(4, n // 2):
            cand = free[feasible & ~taken[free]]
            if not len(cand):
                cand = free[~taken[free]]
            k = min(n - len(picked), len(cand))
            for i in rng.choice(cand, k, replace=False) if k > 0 else []:
                pick(i)
            return [valid.config(i) for i in picked]
        # 3. Thompson sampling: one posterior draw per remaining proposal, its best candidate.
        mean, L = posterior()
        s = n - len(picked)
        draws = mean[:, None] + np.linalg.solve(L.T, rng.standard_normal((feats.width, s)))
        pred = feats.predict(free, draws)
        pred += 1e-9 * rng.standard_normal(pred.shape)  # seeded tie break
        pred[~feasible] += 1e6  # failures-to-be last, while anything else remains
        for c in range(s):
            col = pred[:, c].copy()
            col[taken[free]] = np.inf
            j = int(np.argmin(col))
            if not math.isfinite(col[j]):
                break
            pick(free[j])
        return [valid.config(i) for i in picked]

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
