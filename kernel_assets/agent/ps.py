"""The portfolio's pattern search (one module per strategy, as Kernel Tuner keeps them).

A batch compass search (a generalised pattern search: Hooke and Jeeves, Torczon) around the sweep's incumbent:
it polls the configs that change one tunable of the incumbent by a step, coarse steps first. The steps are
fractions of each tunable's ordered axis: 1 (clipped at the axis' ends, i.e. its two extremes), 1/2, 1/4, ...
down to one position. Around an incumbent whose coarse polls are all measured (by any member) it polls finer
ones; a new incumbent starts again from the coarsest (the step shrinks only where it has stopped paying, as in
pattern search). Within a step size the tunables go in a seeded random order, and a poll point that is not
a valid config, or taken, or predicted to fail, is skipped. Model-free: the bandit gives it proposals where
its polls pay. Configs are rows of the enumerated valid set (``kernel_assets.agent.local.ValidSet``).
"""

from __future__ import annotations

import numpy as np

from kernel_assets.agent.local import Shared


class PatternSearch:
    name = "ps"

    def propose(self, shared: Shared, k: int) -> list[int]:
        valid = shared.valid
        if k <= 0 or shared.anchor_pos is None:
            return []
        rng = np.random.default_rng([abs(shared.seed), shared.round, 0x5053])
        levels = [len(v) for v in valid.values]
        axes = [int(j) for j in rng.permutation(len(levels)) if levels[j] > 1]  # a one-value tunable has no step
        if not axes:
            return []
        blocked = shared.taken | ~shared.feasible
        center = np.asarray(shared.anchor_pos, dtype=np.int64)
        out: list[int] = []
        top = max(levels) - 1
        frac, seen = 1.0, set()
        while len(out) < k and top * frac >= 0.5:
            for j in axes:
                step = max(1, int(round(frac * (levels[j] - 1))))
                for sign in rng.permutation((-1, 1)):
                    pos = center.copy()
                    pos[j] = int(np.clip(pos[j] + sign * step, 0, levels[j] - 1))
                    key = tuple(int(x) for x in pos)
                    if key in seen:
                        continue
                    seen.add(key)
                    i = valid.row_of.get(key)
                    if i is not None and not blocked[i]:
                        out.append(int(i))
                        blocked[i] = True
                        if len(out) >= k:
                            return out
            frac /= 2
        return out
