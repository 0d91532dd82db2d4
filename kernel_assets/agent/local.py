"""The local policy (embedded default, no network): a constrained Optuna ask/tell search.

Each round rebuilds a study from everything measured in this sweep (the baseline is trial 0), so the
search is deterministic given the spec's seed and resumes from any round. Half of the proposals
are one-step neighbours of the best variant so far (enqueued, exploitation); the rest come from a
TPE sampler with a constraint function over registers, spills and shared memory (exploration).
Configs outside the space, or already measured, are never proposed.
"""

from __future__ import annotations

import logging
import random

import optuna

from kernel_assets.agent.base import AgentContext, Proposal, validate_and_dedupe
from kernels.records import Suggestion, VariantResult, config_label

optuna.logging.set_verbosity(logging.WARNING)


def constraint_values(row: VariantResult, spec) -> dict[str, float]:
    """<= 0 means satisfied (Optuna's convention); the TPE sampler reads them off each trial."""
    c = spec.constraints
    if row.compile is None:
        return {"registers": 1.0, "spills": 1.0, "shared_memory": 1.0}
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


class LocalPolicy:
    name = "local"

    def __init__(self, seed: int | None = None):
        self.seed = seed

    def propose(self, ctx: AgentContext) -> Proposal:
        spec, fam = ctx.spec, ctx.family
        seed = (spec.search.seed if self.seed is None else self.seed) * 1009 + ctx.round
        distributions = {k: optuna.distributions.CategoricalDistribution(list(v)) for k, v in fam.space.params.items()}
        sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=8, multivariate=True, constant_liar=True)
        study = optuna.create_study(direction="minimize", sampler=sampler)
        best: VariantResult | None = None
        for row in ctx.history:
            params = {k: row.config[k] for k in distributions if k in row.config}
            if len(params) != len(distributions) or any(params[k] not in fam.space.params[k] for k in params):
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

        # Exploitation: one-step neighbours of the incumbent, in a seeded order.
        rng = random.Random(seed)
        neighbours = []
        for k, values in fam.space.params.items():
            pos = values.index(anchor[k]) if anchor.get(k) in values else None
            if pos is None:
                continue
            for step in (-1, 1):
                if 0 <= pos + step < len(values):
                    cand = dict(anchor)
                    cand[k] = values[pos + step]
                    neighbours.append(cand)
        rng.shuffle(neighbours)

        seen = set(ctx.measured_hashes)
        from kernels.records import config_hash

        picked: list[dict[str, int]] = []
        for cand in neighbours:
            if len(picked) >= max(1, ctx.n // 2):
                break
            h = config_hash(cand)
            if h not in seen and fam.space.check(cand, spec.params) is None:
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
            if fam.space.check(cand, spec.params) is not None:
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
