"""The local policy (embedded default, no network): a constrained Optuna ask/tell search.

Each round rebuilds a study from everything measured in this sweep (the baseline is trial 0), so the
search is deterministic given the spec's seed and resumes from any round. Half of the proposals
are neighbours of the best variant so far (exploitation); the rest come from a TPE sampler with a
constraint function over registers, spills and shared memory (exploration).
Configs outside the space, or already measured, are never proposed.

Spaces where most Cartesian points break a validity rule (a recorded Kernel Tuner space keeps 17,956
of 82,944) are handled through the valid set when the space is small enough to enumerate
(``ENUMERATE_LIMIT`` Cartesian points; enumerated once per process and space):

* neighbours are the unmeasured valid configs nearest to the incumbent: first those one step away
  along one tunable's ordered values (what the policy always proposed), then two steps (one tunable
  two steps, or two tunables one step each), and so on; a rule that forbids changing one tunable
  alone no longer strands the search, and an exhausted neighbourhood widens instead of emptying;
* a TPE proposal that is invalid or already measured is moved to the nearest unmeasured valid
  config, instead of being rejected and asked again (rejection wasted most asks on such a space,
  and each ask costs a pass over the whole history).

Larger spaces keep the plain path: one-step neighbours, then TPE with rejection and an attempt cap.
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


class LocalPolicy:
    name = "local"

    def __init__(self, seed: int | None = None):
        self.seed = seed

    def propose(self, ctx: AgentContext) -> Proposal:
        from kregress.core.records import config_hash

        spec, fam = ctx.spec, ctx.family
        seed = (spec.search.seed if self.seed is None else self.seed) * 1009 + ctx.round
        space_params = dict(fam.space.params)  # read once: a family may compute it on every access
        distributions = {k: optuna.distributions.CategoricalDistribution(list(v)) for k, v in space_params.items()}
        sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=8, multivariate=True, constant_liar=True)
        study = optuna.create_study(direction="minimize", sampler=sampler)
        best: VariantResult | None = None
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
                if all(c <= 0 for c in cons.values()) and (best is None or value < ctx.objective[best.config_hash]):
                    best = row
            study.add_trial(trial)
        anchor = best.config if best else spec.baseline
        anchor_id = best.variant_id if best else "baseline"

        rng = random.Random(seed)
        seen = set(ctx.measured_hashes)
        n_exploit = max(1, ctx.n // 2)
        picked: list[dict[str, int]] = []
        valid = valid_set(fam.space, spec.params, spec.hardware.limits)
        if valid is not None and len(valid):
            # Exploitation: the unmeasured valid configs nearest to the incumbent.
            taken = np.zeros(len(valid), dtype=bool)
            for row in ctx.history:
                pos = valid.position(row.config)
                i = valid.row_of.get(pos) if pos is not None else None
                if i is not None:
                    taken[i] = True
            anchor_pos = valid.position(anchor)
            if anchor_pos is not None:
                for i in valid.nearest(anchor_pos, taken, n_exploit, rng):
                    taken[i] = True
                    cand = valid.config(i)
                    seen.add(config_hash(cand))
                    picked.append(cand)
            # Exploration: TPE under the constraints; an invalid or measured point moves to the nearest
            # unmeasured valid config.
            while len(picked) < ctx.n and not taken.all():
                trial = study.ask(distributions)
                cand = {k: int(trial.params[k]) for k in distributions}
                pos = valid.position(cand)
                i = valid.row_of.get(pos) if pos is not None else None
                if i is None or taken[i]:
                    near = valid.nearest(pos, taken, 1, rng) if pos is not None else []
                    study.tell(trial, state=optuna.trial.TrialState.FAIL if i is None else optuna.trial.TrialState.PRUNED)
                    if not near:
                        break
                    i = near[0]
                    cand = valid.config(i)
                taken[i] = True
                seen.add(config_hash(cand))
                picked.append(cand)
        else:
            # Exploitation: one-step neighbours of the incumbent, in a seeded order.
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
            # Exploration: TPE under the constraints, until n new valid configs or the attempt cap.
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
