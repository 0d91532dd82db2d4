"""The portfolio's genetic algorithm (one module per strategy, as Kernel Tuner keeps them).

A steady-state version of Kernel Tuner's ``genetic_algorithm`` over the sweep's shared evaluated set: the
population is its own line (the best configs it proposed) plus the sweep's ``ELITE`` best, topped up with
measured configs drawn at random while the line is short (a population of the other members' best configs
sits in their basin); each child has two parents drawn
by rank (the best most often), takes each tunable from one of them at random (uniform crossover), and then
changes each tunable with chance ``1 / d`` (d tunables, at least one change when the child equals a parent) to
a value one step away on its ordered axis or, with chance ``FAR_MUTATION``, to any of its values. A child that
is not a valid config, or is taken (measured, or picked earlier this round), is replaced by the nearest valid
config that is not taken and not predicted to fail (steps along the ordered values). Configs are the rows of
the enumerated valid set (``kernel_assets.agent.local.ValidSet``); no config is ever proposed twice.
"""

from __future__ import annotations

import random

import numpy as np

from kernel_assets.agent.local import Shared

POPULATION = 20  # configs that breed
ELITE = 2  # of them, the sweep's best (whoever found them)
FAR_MUTATION = 0.3  # chance that a mutated tunable jumps to any value instead of one step
TRIES = 16  # children drawn per pick before the nearest free config stands in


class GeneticAlgorithm:
    name = "ga"

    def propose(self, shared: Shared, k: int) -> list[int]:
        valid, taken = shared.valid, shared.taken.copy()
        rng = np.random.default_rng([abs(shared.seed), shared.round, 0x6A])
        if k <= 0 or not len(shared.ok_rows):
            return []
        pop = valid.idx[self.population(shared, rng)].astype(np.int64)
        weights = 1.0 / np.arange(1, len(pop) + 1)  # rank weights: the best breeds most
        weights /= weights.sum()
        levels = np.asarray([len(v) for v in valid.values])
        d = len(levels)
        blocked = taken | ~shared.feasible
        tie = random.Random(int(rng.integers(2**31)))
        out: list[int] = []
        for _ in range(k):
            row = None
            child = pop[0]
            for _ in range(TRIES):
                a, b = rng.choice(len(pop), 2, p=weights)
                child = np.where(rng.random(d) < 0.5, pop[a], pop[b])
                mutate = rng.random(d) < 1.0 / d
                if not mutate.any() and (np.array_equal(child, pop[a]) or np.array_equal(child, pop[b])):
                    mutate[rng.integers(d)] = True
                for j in np.flatnonzero(mutate & (levels > 1)):
                    if rng.random() < FAR_MUTATION:
                        child[j] = rng.integers(levels[j])
                    else:
                        child[j] = int(np.clip(child[j] + rng.choice((-1, 1)), 0, levels[j] - 1))
                i = valid.row_of.get(tuple(int(x) for x in child))
                if i is not None and not blocked[i]:
                    row = i
                    break
            if row is None:  # the last child's nearest free config
                near = valid.nearest(tuple(int(x) for x in child), blocked, 1, tie)
                if not near:
                    near = valid.nearest(tuple(int(x) for x in child), taken, 1, tie)
                if not near:
                    break
                row = near[0]
            out.append(int(row))
            taken[row] = blocked[row] = True
        return out

    @staticmethod
    def population(shared: Shared, rng: np.random.Generator) -> np.ndarray:
        """The rows that breed, best first: the ``ELITE`` best of the sweep, the best of the ga's own line
        (the configs it proposed that ran), and, while that line is short, measured configs drawn at random
        (not the best: the other members' best configs sit in one basin, and a population there only
        repeats their search)."""
        y_of = dict(zip(shared.ok_rows, shared.ok_y))
        ok = np.asarray(shared.ok_rows)
        elite = [int(r) for r in ok[np.argsort(np.asarray(shared.ok_y), kind="stable")[:ELITE]]]
        own = sorted({r for r in shared.own.get(GeneticAlgorithm.name, []) if r in y_of} - set(elite), key=y_of.get)
        members = elite + own[: POPULATION - len(elite)]
        rest = [int(r) for r in ok if r not in set(members)]
        if len(members) < POPULATION and rest:
            members += [int(r) for r in rng.choice(rest, min(len(rest), POPULATION - len(members)), replace=False)]
        return np.asarray(sorted(members, key=y_of.get))
