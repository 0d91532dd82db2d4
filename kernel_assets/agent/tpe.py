"""The portfolio's library sampler: Optuna's TPE (one module per strategy, as Kernel Tuner keeps them).

The study holds the sweep's shared evaluated set: every measured config is a finished trial over the tunables'
ordinal positions (``IntDistribution(0, levels - 1)``, so the Parzen estimators see the order of block
sizes), its value the log objective; a failed config gets the first measured config's log objective plus
``FAIL_PENALTY`` (a fixed value, so a trial never changes), and the sampler learns where the space fails.
Each round a multivariate TPE sampler seeded by the sweep's seed and the round (``constant_liar``, so one
round's asks spread out) is asked for ``k`` points; a point that is not a valid config, or is taken
(measured, or picked earlier this round), is replaced by the nearest valid config that is not taken and not
predicted to fail.

Adding a few hundred trials to a study costs Optuna more than the asks (it deep-copies each), so the study
is kept between rounds (per process, valid set and seed) and only the newly measured configs are added. The
asked trials are then marked failed, which TPE ignores, so the kept study samples as one rebuilt from the
history would: the proposals depend on the seed and the history only (``test_agent_portfolio`` checks it).
"""

from __future__ import annotations

import logging
import random
import threading
import warnings
from collections import OrderedDict

import optuna

from kernel_assets.agent.local import Shared

optuna.logging.set_verbosity(logging.WARNING)

FAIL_PENALTY = 1.0  # log units above the first measured config (e times slower)
STARTUP = 10  # TPE's own random start: fewer trials than this and it samples uniformly
_STUDIES: OrderedDict[tuple[int, int], tuple[object, optuna.Study, list[tuple[int, float]]]] = OrderedDict()
_LOCK = threading.Lock()
CACHED_STUDIES = 8


def _study(shared: Shared, names: list[str], active: list[int], dists: dict) -> optuna.Study:
    """The study holding every measured config of ``shared``, in the order measured (kept, or rebuilt)."""
    valid = shared.valid
    y_of = dict(zip(shared.ok_rows, shared.ok_y))
    fail_y = (shared.ok_y[0] if shared.ok_y else 0.0) + FAIL_PENALTY
    seq = [(r, y_of.get(r, fail_y)) for r in shared.all_rows]
    key = (id(valid), int(shared.seed))
    with _LOCK:
        hit = _STUDIES.get(key)
    if hit is not None and hit[0] is valid and hit[2] == seq[: len(hit[2])]:
        study, added = hit[1], hit[2]
    else:
        study, added = optuna.create_study(direction="minimize"), []
    new = []
    for r, y in seq[len(added):]:
        pos = valid.idx[r]
        new.append(optuna.trial.create_trial(params={n: int(pos[j]) for n, j in zip(names, active)},
                                             distributions=dists, value=float(y)))
    study.add_trials(new)
    with _LOCK:
        _STUDIES[key] = (valid, study, seq)  # holds the valid set, so its id is not reused while kept
        _STUDIES.move_to_end(key)
        while len(_STUDIES) > CACHED_STUDIES:
            _STUDIES.popitem(last=False)
    return study


class TPE:
    name = "tpe"

    def propose(self, shared: Shared, k: int) -> list[int]:
        valid, taken = shared.valid, shared.taken.copy()
        if k <= 0:
            return []
        active = [j for j, v in enumerate(valid.values) if len(v) > 1]
        names = [f"p{j}" for j in active]
        dists = {n: optuna.distributions.IntDistribution(0, len(valid.values[j]) - 1) for n, j in zip(names, active)}
        blocked = taken | ~shared.feasible
        tie = random.Random(shared.seed * 31 + shared.round)
        out: list[int] = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # multivariate TPE is marked experimental
            study = _study(shared, names, active, dists)
            study.sampler = optuna.samplers.TPESampler(seed=int(abs(shared.seed) * 7919 + shared.round) % (2**31),
                                                       n_startup_trials=STARTUP, multivariate=True, constant_liar=True)
            asked = []
            for _ in range(k):
                trial = study.ask(dists)
                asked.append(trial)
                pos = [0] * len(valid.values)
                for n, j in zip(names, active):
                    pos[j] = trial.params[n]
                key = tuple(pos)
                i = valid.row_of.get(key)
                if i is None or blocked[i]:
                    near = valid.nearest(key, blocked, 1, tie) or valid.nearest(key, taken, 1, tie)
                    if not near:
                        break
                    i = near[0]
                out.append(int(i))
                taken[i] = blocked[i] = True
            for trial in asked:  # TPE ignores failed trials: the kept study stays the history's
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
        return out
