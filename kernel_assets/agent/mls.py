"""The portfolio's multi-start local search (one module per strategy, as Kernel Tuner keeps them: its
``greedy_mls``).

Climbs from random starts, each to a local optimum, so that the portfolio searches basins other than the one its
incumbent sits in. A climb's neighbourhood is Hamming's: the valid configs that change one tunable to any of its
values. The climbs are the member's own configs (the measured configs it proposed) and the measured configs one
change away from them, whoever measured those. Each round it polls the free neighbours of one point, the best of
them that no measured neighbour beats and that still has free neighbours, best first under the local policy's
pairwise model (``Shared.predict``; a seeded random order before the model has points): a climb moves as soon as
one of its polls beats its point, and the next round starts from there. The rest of its picks are new starts,
uniform random configs: all of them when no such point is left (every climb has reached a local optimum, or it
has none yet), and those beyond the point's free neighbours (one climb a round). A point beaten by a measured
config that is not in the climbs (two changes from the member's own configs) ends that climb: the config is the
other members' to climb. Free: not taken (measured, or picked earlier this round) and not predicted to fail. Stateless:
everything is read off the shared evaluated set, so the search stays deterministic given the seed and resumable.
Configs are rows of the enumerated valid set (``kernel_assets.agent.local.ValidSet``).
"""

from __future__ import annotations

import numpy as np

from kernel_assets.agent.local import Shared


class MultiStartLocalSearch:
    name = "mls"

    def propose(self, shared: Shared, k: int) -> list[int]:
        if k <= 0:
            return []
        valid = shared.valid
        idx = valid.idx
        rng = np.random.default_rng([abs(shared.seed), shared.round, 0x4D4C53])
        blocked = shared.taken | ~shared.feasible
        y_of = dict(zip(shared.ok_rows, shared.ok_y))
        own = np.asarray(sorted({r for r in shared.own.get(self.name, []) if r in y_of}), dtype=np.int64)
        out: list[int] = []
        if len(own):
            ok = np.asarray(shared.ok_rows, dtype=np.int64)
            near = ((idx[ok][:, None, :] != idx[own][None, :, :]).sum(axis=2) <= 1).any(axis=1)
            climb = sorted((int(r) for r in ok[near]), key=lambda r: (y_of[r], r))
            for r in climb:
                hood = np.flatnonzero((idx != idx[r]).sum(axis=1) == 1)
                if any(y_of.get(int(i), np.inf) < y_of[r] for i in hood):
                    continue  # beaten by a measured neighbour: the climb has moved on
                free = hood[~blocked[hood]]
                if not len(free):
                    continue  # a local optimum (every neighbour measured or predicted to fail)
                free = rng.permutation(free)
                if shared.predict is not None:  # best first under the model; ties in the seeded order
                    free = free[np.argsort(shared.predict(free), kind="stable")]
                for i in free[: k - len(out)]:
                    out.append(int(i))
                    blocked[i] = True
                break
        if len(out) < k:  # new starts
            free = np.flatnonzero(~blocked)
            if not len(free):
                free = np.flatnonzero(~shared.taken)
                free = free[~np.isin(free, out)]
            out += [int(i) for i in rng.choice(free, min(k - len(out), len(free)), replace=False)]
        return out
