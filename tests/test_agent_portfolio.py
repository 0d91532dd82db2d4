"""The portfolio (strategy local): its members share one evaluated set, the bandit follows the member that pays."""

from __future__ import annotations

import numpy as np
import pytest
from test_agent_local import GEMM, SPEC, ctx_for, fake_row

from kernel_assets.agent import policy_for
from kernel_assets.agent.ga import GeneticAlgorithm
from kernel_assets.agent.local import EXPLORE_AFTER, LocalPolicy, Shared, valid_set
from kernel_assets.agent.mls import MultiStartLocalSearch
from kernel_assets.agent.portfolio import (
    DEFAULT_MEMBERS,
    LATE_MEMBERS,
    MEMBERS,
    PortfolioPolicy,
    allocate,
    has_stalled,
    live_members,
    member_of,
)
from kernel_assets.agent.ps import PatternSearch
from kernel_assets.agent.tpe import TPE


def run_rounds(rounds: int, seed: int | None = None, members=MEMBERS):
    history = [fake_row("baseline", SPEC.baseline, 0)]
    proposals = []
    for rnd in range(1, rounds + 1):
        p = PortfolioPolicy(seed=seed, members=members).propose(ctx_for(history, rnd))
        proposals.append(p)
        history += [fake_row(s.variant_id, s.config, rnd) for s in p.suggestions]
    return history, proposals


def test_strategy_local_runs_the_portfolio():
    assert isinstance(policy_for("local", SPEC, None), PortfolioPolicy)


def test_members_share_one_evaluated_set_no_repeats_in_space_each_with_a_forecast():
    rounds = 8
    history, proposals = run_rounds(rounds)
    hashes = [r.config_hash for r in history]
    assert len(hashes) == len(set(hashes)) == 1 + rounds * 8  # no config measured twice, whichever member
    seen = set()
    for rnd, p in enumerate(proposals, start=1):
        assert len(p.suggestions) == 8 and not p.dropped
        stalled = has_stalled(ctx_for(history[:1 + 8 * (rnd - 1)], rnd))
        for s in p.suggestions:
            assert GEMM.space.check(s.config) is None
            assert s.expected_speedup and s.expected_speedup_low <= s.expected_speedup <= s.expected_speedup_high
            seen.add(member_of(s.variant_id))
            assert stalled or member_of(s.variant_id) not in LATE_MEMBERS  # a late member: only after a stall
    assert all(s.variant_id.startswith("r1-local-") for s in proposals[0].suggestions)  # round 1: local's spread
    assert has_stalled(ctx_for(history, rounds + 1))  # this smooth space is worked out within the rounds run
    assert seen == set(MEMBERS)  # every member proposed something after round 1
    assert {member_of(s.variant_id) for p in run_rounds(3, members=DEFAULT_MEMBERS)[1] for s in p.suggestions} == {
        "local", "ga"}  # the default: TPE and ps left out, mls not yet (no stall in three rounds)


def test_a_late_member_joins_once_the_best_has_not_moved_for_explore_after_rounds():
    """``has_stalled`` reads the history alone: the sweep's best has gone EXPLORE_AFTER finished rounds without
    improving at some point (it stays true after a later improvement). Until then a late member has no share; from
    then on it gets its rate like the others (no yield yet: the prior's, above a member that took rounds without a
    new best)."""
    valid = valid_set(GEMM.space, SPEC.params, SPEC.hardware.limits)
    cfgs = [valid.config(i) for i in range(1, 200)]
    history = [fake_row("baseline", SPEC.baseline, 0)]
    lat = {history[0].config_hash: 10.0}

    def add(rnd: int, value, who=("local", "ga")) -> None:
        for k in range(8):
            row = fake_row(f"r{rnd}-{who[k % len(who)]}-{k + 1:02d}", cfgs.pop(), rnd)
            row.measurements[0].p50_ms = lat[row.config_hash] = value(k)
            history.append(row)

    def ctx(rnd):
        c = ctx_for(history, rnd)
        c.objective.update(lat)
        return c

    for rnd in range(1, 1 + EXPLORE_AFTER):
        add(rnd, lambda k, rnd=rnd: 10.0 - rnd)  # a new best every round
        assert not has_stalled(ctx(rnd + 1)) and allocate(ctx(rnd + 1))["mls"] == 0
    for rnd in range(1 + EXPLORE_AFTER, 1 + 2 * EXPLORE_AFTER):
        assert not has_stalled(ctx(rnd)) and allocate(ctx(rnd))["mls"] == 0
        add(rnd, lambda k: 50.0)  # nothing better
    share = allocate(ctx(1 + 2 * EXPLORE_AFTER))
    assert has_stalled(ctx(1 + 2 * EXPLORE_AFTER)) and sum(share.values()) == 8 and share["mls"] >= 1, share
    # the late member's configs set a new best: the sweep has stalled once, so it stays in, and its yield counts
    add(1 + 2 * EXPLORE_AFTER, lambda k: 1.0 - 0.01 * k, who=("mls",))
    later = allocate(ctx(2 + 2 * EXPLORE_AFTER))
    assert has_stalled(ctx(2 + 2 * EXPLORE_AFTER)) and later["mls"] > share["mls"], (share, later)
    assert set(allocate(ctx(2 + 2 * EXPLORE_AFTER), ("local", "ga"))) == {"local", "ga"}  # not a member: no entry


def test_a_late_member_waits_for_a_stall_counted_as_the_local_policy_counts_it():
    """Before a stall a late member has no share and no place in the count that decides whether a round is split at
    all; it proposes only for slots the others cannot fill (the genetic algorithm has no config to breed from while
    nothing has run), so a round is never cut short, and the note says who proposed what. A sweep where nothing has
    run stalls when the local policy's stale count says so (from the baseline's round), not a round earlier."""
    valid = valid_set(GEMM.space, SPEC.params, SPEC.hardware.limits)
    cfgs = [valid.config(i) for i in range(1, 60)]
    base = fake_row("baseline", SPEC.baseline, 0)
    base.error = "compile failed"
    history = [base]
    for rnd in (1, 2, 3):
        for k in range(8):
            row = fake_row(f"r{rnd}-{('local', 'ga')[k % 2]}-{k + 1:02d}", cfgs.pop(), rnd)
            row.error = "run failed"
            history.append(row)
    for rnd in (2, 3, 4):
        ctx = ctx_for(history[:1 + 8 * (rnd - 1)], rnd)
        stale = rnd - 1  # the local policy's count with no best: ctx.round - 1 - 0
        assert has_stalled(ctx) == (stale >= EXPLORE_AFTER), rnd
        assert live_members(ctx) == (DEFAULT_MEMBERS if rnd >= 4 else ("local", "ga"))
        share = allocate(ctx)
        assert sum(share.values()) == 8 and (share["mls"] == 0) == (rnd < 4), (rnd, share)
        prop = PortfolioPolicy(seed=3).propose(ctx)
        picks = [member_of(s.variant_id) for s in prop.suggestions]
        assert len(picks) == 8 and "ga" not in picks, (rnd, picks)  # nothing ran: nothing to breed from
        assert picks.count("local") == share["local"] and picks.count("mls") == 8 - share["local"], (rnd, picks)
        note = prop.notes[-1]
        assert note.startswith(f"portfolio: local {share['local']}, ga {share['ga']}, mls {share['mls']}")
        assert f"(proposed: local {share['local']}, mls {8 - share['local']})" in note, note
    # two proposals a round, before a stall: the two live members split them (the late one is not counted)
    few = ctx_for(history[:1 + 8], 2)
    few.n = 2
    assert allocate(few) == {"local": 1, "ga": 1, "mls": 0}
    # a plain round (every member filled its share) has no "proposed" part
    plain = run_rounds(3, members=DEFAULT_MEMBERS)[1]
    assert all("proposed" not in p.notes[-1] for p in plain)


def test_deterministic_given_seed_and_history():
    a = [[s.variant_id + str(s.config) for s in p.suggestions] for p in run_rounds(3)[1]]
    b = [[s.variant_id + str(s.config) for s in p.suggestions] for p in run_rounds(3)[1]]
    c = [[s.variant_id + str(s.config) for s in p.suggestions] for p in run_rounds(3, seed=11)[1]]
    assert a == b and a != c


def test_the_bandit_moves_slots_to_the_member_that_sets_new_bests():
    """Rows named for ga set every new best; local's and tpe's are slower: ga's share grows, up to all of the
    round (no floor: ``MIN_SLOTS`` is 0); once ga's configs stop paying, the others come back."""
    TRIO = ("local", "ga", "tpe")  # the bandit's mechanics, on three members
    history = [fake_row("baseline", SPEC.baseline, 0)]
    valid = valid_set(GEMM.space, SPEC.params, SPEC.hardware.limits)
    cfgs = [valid.config(i) for i in range(1, 100)]
    lat = {}
    for rnd in (1, 2, 3):
        for k, m in enumerate(TRIO * 2):
            cfg = cfgs.pop()
            row = fake_row(f"r{rnd}-{m}-{k + 1:02d}", cfg, rnd)
            v = 1.0 / (rnd * 10 + k) if m == "ga" else 50.0  # ga: ever faster; the others: slow
            row.measurements[0].p50_ms = v
            lat[row.config_hash] = v
            history.append(row)
    ctx = ctx_for(history, 4)
    ctx.objective.update(lat)
    share = allocate(ctx, TRIO)
    assert sum(share.values()) == 8
    assert share["ga"] > share["local"] and share["ga"] > share["tpe"], share
    for rnd in range(4, 10):  # ga takes whole rounds and finds nothing better
        for k in range(8):
            row = fake_row(f"r{rnd}-ga-{k + 1:02d}", cfgs.pop(), rnd)
            row.measurements[0].p50_ms = lat[row.config_hash] = 50.0
            history.append(row)
    later = ctx_for(history, 10)
    later.objective.update(lat)
    back = allocate(later, TRIO)
    assert sum(back.values()) == 8 and back["local"] >= 1 and back["tpe"] >= 1 and back["ga"] < share["ga"], back
    assert allocate(ctx_for(history[:1], 1), TRIO) == {"local": 8, "ga": 0, "tpe": 0}


@pytest.mark.parametrize("member", [GeneticAlgorithm(), MultiStartLocalSearch(), PatternSearch(), TPE()],
                         ids=lambda m: m.name)
def test_members_pick_new_valid_configs_and_skip_predicted_failures(member):
    valid = valid_set(GEMM.space, SPEC.params, SPEC.hardware.limits)
    rng = np.random.default_rng(0)
    ok = [int(i) for i in rng.choice(len(valid), 30, replace=False)]
    taken = np.zeros(len(valid), dtype=bool)
    taken[ok] = True
    feasible = np.ones(len(valid), dtype=bool)
    feasible[::2] = False  # half the space predicted to fail
    y = [float(np.sum(valid.idx[i])) for i in ok]
    shared = Shared(valid, taken, ok, y, [], list(ok), feasible, tuple(valid.idx[ok[0]]), 5, 3)
    picks = member.propose(shared, 12)
    assert len(picks) == len(set(picks)) == 12
    assert not taken[picks].any() and feasible[picks].all()
    assert picks == member.propose(shared, 12)  # deterministic
    assert taken.sum() == 30  # the member works on its own copy of the taken mask


def test_pattern_search_polls_the_incumbents_axes_coarse_steps_first():
    """ps polls one-tunable changes of the incumbent: each axis' two extremes first (a step of the whole axis,
    clipped), then half steps, ...; once an axis' coarse polls are measured it polls finer; a new incumbent
    starts again from the coarsest."""
    valid = valid_set(GEMM.space, SPEC.params, SPEC.hardware.limits)
    levels = np.asarray([len(v) for v in valid.values])
    full = np.flatnonzero(((valid.idx > 0) & (valid.idx < levels - 1)).all(axis=1) & (levels > 2).all())
    anchor = int(full[0]) if len(full) else len(valid) // 2
    at = valid.idx[anchor].astype(int)
    taken = np.zeros(len(valid), dtype=bool)
    taken[anchor] = True
    shared = Shared(valid, taken, [anchor], [0.0], [], [anchor], np.ones(len(valid), dtype=bool), tuple(at), 3, 2)
    picks = PatternSearch().propose(shared, len(valid))
    assert len(picks) == len(set(picks)) and not taken[picks].any()
    moves = [(int(np.flatnonzero(valid.idx[i] != at)[0]), int(valid.idx[i][valid.idx[i] != at][0])) for i in picks]
    assert all(((valid.idx[i] != at).sum() == 1) for i in picks)  # one tunable changed, always
    extremes = set()  # every valid one-tunable change of the incumbent to an end of that tunable's axis
    for j in range(len(levels)):
        for v in {0, int(levels[j]) - 1} - {int(at[j])}:
            pos = at.copy()
            pos[j] = v
            i = valid.row_of.get(tuple(int(x) for x in pos))
            if i is not None:
                extremes.add(i)
    assert extremes
    first_fine = next((k for k, (j, v) in enumerate(moves) if v not in (0, levels[j] - 1)), len(moves))
    assert set(picks[:first_fine]) == extremes  # all of the extremes, before any finer step
    # the extremes measured: the next round polls finer steps
    taken2 = taken.copy()
    taken2[picks[:first_fine]] = True
    shared2 = Shared(valid, taken2, [anchor], [0.0], [], [anchor], np.ones(len(valid), dtype=bool), tuple(at), 3, 3)
    nxt = PatternSearch().propose(shared2, 4)
    assert nxt and all(not taken2[i] and (valid.idx[i] != at).sum() == 1 for i in nxt)
    assert all(0 < valid.idx[i][valid.idx[i] != at][0] < levels[valid.idx[i] != at][0] - 1 for i in nxt)
    # a new incumbent (one of the polls): its own axes' extremes first again
    new_at = valid.idx[picks[0]].astype(int)
    shared3 = Shared(valid, taken2, [anchor], [0.0], [], [anchor], np.ones(len(valid), dtype=bool), tuple(new_at), 3, 4)
    for i in PatternSearch().propose(shared3, 2):
        j = int(np.flatnonzero(valid.idx[i] != new_at)[0])
        assert (valid.idx[i] != new_at).sum() == 1 and valid.idx[i][j] in (0, levels[j] - 1)


def _hood(valid, i) -> set[int]:
    return {int(j) for j in np.flatnonzero((valid.idx != valid.idx[i]).sum(axis=1) == 1)}


@pytest.mark.parametrize("seed", range(4))
def test_multi_start_local_search_climbs_its_own_points_and_restarts_at_a_local_optimum(seed):
    """mls polls the free one-tunable changes (any value) of its own best point that no measured neighbour beats
    (not the sweep's incumbent elsewhere); when a poll beats that point, the climb moves there; a point whose
    neighbours are all measured is a local optimum, and the picks become new starts. With the model's forecast
    the polls go best first under it. The class: a random start and a random far incumbent per seed."""
    valid = valid_set(GEMM.space, SPEC.params, SPEC.hardware.limits)
    rng = np.random.default_rng(seed)
    feasible = np.ones(len(valid), dtype=bool)
    start = int(rng.integers(len(valid)))
    far = next(int(i) for i in rng.permutation(len(valid)) if (valid.idx[i] != valid.idx[start]).sum() >= 3)
    rows = {start: -10.0, far: -20.0}  # the sweep's incumbent is another member's, three or more changes away
    mine = {start}

    def propose(rnd, k, predict=None):
        taken = np.zeros(len(valid), dtype=bool)
        taken[list(rows)] = True
        ok = sorted(rows)
        shared = Shared(valid, taken, ok, [rows[i] for i in ok], [], ok, feasible, tuple(valid.idx[far]), seed, rnd,
                        predict=predict)
        shared.own["mls"] = sorted(mine)
        return MultiStartLocalSearch().propose(shared, k)

    picks = propose(2, 4)
    assert len(picks) == 4 and set(picks) <= _hood(valid, start) - set(rows)  # its own point's neighbours
    # two climbs, neither beaten: the better point's neighbours are polled
    other = next(int(i) for i in rng.permutation(len(valid)) if min((valid.idx[i] != valid.idx[j]).sum()
                                                                    for j in (start, far)) >= 3)
    mine.add(other)
    for y_other, want in ((-9.0, start), (-12.0, other)):
        rows[other] = y_other
        assert set(propose(2, 3)) <= _hood(valid, want) - set(rows)
    mine.discard(other)
    del rows[other]
    score = {int(i): float(rng.normal()) for i in _hood(valid, start)}
    free = sorted(_hood(valid, start) - set(rows), key=score.get)
    assert propose(2, 3, predict=lambda r: np.asarray([score[int(i)] for i in r])) == free[:3]  # best first
    rows.update({i: 0.0 for i in picks})  # one poll beats the point: the next round climbs from there
    rows[picks[-1]] = -11.0
    mine |= set(picks)
    nxt = propose(3, 3)
    assert len(nxt) == 3 and set(nxt) <= _hood(valid, picks[-1]) - set(rows)
    hood = _hood(valid, picks[-1]) - set(rows)  # all its neighbours measured, worse: a local optimum
    rows.update({i: 5.0 for i in hood})
    mine |= hood
    fresh = propose(4, 3)
    assert len(fresh) == 3 and not set(fresh) & set(rows)
    climbs = set().union(*(_hood(valid, i) for i in mine))
    assert len(climbs) < len(valid) // 2 and not set(fresh) <= climbs  # new starts: uniform, not the climbs' edges


def test_ablations_switch_parts_off_and_unknown_names_are_refused():
    with pytest.raises(ValueError, match="unknown"):
        LocalPolicy(ablate=frozenset({"nope"}))
    with pytest.raises(ValueError, match="first must be 'local'"):
        PortfolioPolicy(members=("ga",))
    history = [fake_row("baseline", SPEC.baseline, 0)]
    p = PortfolioPolicy(members=("local",)).propose(ctx_for(history, 2))
    assert p.suggestions and all(member_of(s.variant_id) == "local" for s in p.suggestions)


def test_the_kept_tpe_study_samples_as_one_rebuilt_from_the_history():
    from kernel_assets.agent import tpe

    valid = valid_set(GEMM.space, SPEC.params, SPEC.hardware.limits)
    rows = [int(i) for i in np.random.default_rng(1).choice(len(valid), 60, replace=False)]

    def shared(n: int, rnd: int) -> Shared:
        taken = np.zeros(len(valid), dtype=bool)
        taken[rows[:n]] = True
        ok = rows[:n:5] + rows[1:n:5] + rows[2:n:5] + rows[3:n:5]  # every fifth row failed
        ok = [r for r in rows[:n] if r in set(ok)]
        y = [float(np.sum(valid.idx[i] ** 2)) for i in ok]
        fail = [r for r in rows[:n] if r not in set(ok)]
        return Shared(valid, taken, ok, y, fail, rows[:n], np.ones(len(valid), dtype=bool), None, 9, rnd)

    tpe._STUDIES.clear()
    TPE().propose(shared(40, 5), 3)  # the study is kept ...
    kept = TPE().propose(shared(60, 6), 3)  # ... and 20 rows are added to it
    tpe._STUDIES.clear()
    assert kept == TPE().propose(shared(60, 6), 3)  # rebuilt from the history: the same picks


def test_the_portfolio_runs_the_local_policy_without_the_early_cover(monkeypatch):
    """``LOCAL_OFF``: round 1's picks are a balanced design (each tunable's values covered, order 1), not the
    three-way cover, and no cover pick is made before the search stalls; the local policy on its own keeps both
    (the synthetic trap spaces need them); with ``balance`` off too, round 1 is uniform random (order 0)."""
    from kernel_assets.agent import portfolio

    assert PortfolioPolicy(seed=0).local.ablate == portfolio.LOCAL_OFF == {"start_cover", "standing"}
    calls: list[tuple[int, int]] = []
    real = LocalPolicy._explore

    def spy(valid, seen, cand, k, rng, order):
        calls.append((len(seen), order))
        return real(valid, seen, cand, k, rng, order)

    monkeypatch.setattr(LocalPolicy, "_explore", staticmethod(spy))

    def uniform(seed=0):
        return PortfolioPolicy(seed, local=LocalPolicy(seed=seed, ablate=portfolio.LOCAL_OFF | {"balance"}))

    for policy in (PortfolioPolicy, LocalPolicy, uniform):
        calls.clear()
        history = [fake_row("baseline", SPEC.baseline, 0)]
        for rnd in (1, 2):
            p = policy(seed=0).propose(ctx_for(history, rnd))
            history += [fake_row(s.variant_id, s.config, rnd) for s in p.suggestions]
        covers = [c for _, c in calls]
        if policy is PortfolioPolicy:
            assert covers and set(covers) == {1}, calls  # round 1 balanced, no standing cover in round 2
        elif policy is uniform:
            assert covers and set(covers) == {0}, calls
        else:
            assert covers[0] == 3 and covers.count(3) >= 2, calls  # round 1 cover, and the standing one in round 2
