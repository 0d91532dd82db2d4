"""The local policy: stays in the space, never repeats a config, deterministic given the seed."""

from __future__ import annotations

import math

from kernel_assets.agent.base import AgentContext
from kernel_assets.agent.local import LocalPolicy
from kregress.core.family import get_family
from kregress.core.records import CompileStats, Measurement, VariantResult, config_hash
from kregress.core.spec import parse_spec

GEMM = get_family("gemm")
SPEC = parse_spec({
    "task_id": "agent_unit", "kernel_family": "gemm", "shape_matrix": [{"M": 4096, "N": 4096, "K": 4096}],
    "correctness_shapes": [{"M": 32, "N": 32, "K": 32}],
    "baseline": dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_stages=3, num_warps=8),
    "search": {"variants_per_round": 8, "seed": 3},
})


def fake_row(vid: str, cfg: dict, rnd: int, regs: int = 128) -> VariantResult:
    """A measured row whose latency comes from a smooth function of the config (the 'GPU')."""
    lat = 1.0 + abs(math.log2(cfg["BLOCK_M"] / 128)) + abs(math.log2(cfg["BLOCK_N"] / 64)) + 0.1 * cfg["num_stages"]
    cs = CompileStats(arch="sm_90", regs_per_thread=regs, spill_bytes=0, smem_bytes=1024, num_warps=cfg["num_warps"],
                      num_stages=cfg["num_stages"], occupancy=0.25, blocks_per_sm=1, occupancy_limiter="registers",
                      sass_instructions=10, sass_mix={}, compile_seconds=0.0)
    m = Measurement(shape="4096x4096x4096", samples_ms=[lat], p20_ms=lat, p50_ms=lat, p80_ms=lat, tflops=1, gbps=1,
                    evidence="model", device="x", torch_version="t", triton_version="t")
    return VariantResult(variant_id=vid, round=rnd, source="local", config=cfg, config_hash=config_hash(cfg),
                         compile=cs, measurements=[m], evidence="model")


def ctx_for(history, rnd):
    return AgentContext(spec=SPEC, family=GEMM, round=rnd, n=8, history=history,
                        objective={r.config_hash: r.measurements[0].p50_ms for r in history if not r.error},
                        profile_summary="", failures=[])


def run_rounds(rounds: int, seed: int | None = None):
    history = [fake_row("baseline", SPEC.baseline, 0)]
    proposals = []
    for rnd in range(1, rounds + 1):
        p = LocalPolicy(seed=seed).propose(ctx_for(history, rnd))
        proposals.append(p)
        history += [fake_row(s.variant_id, s.config, rnd) for s in p.suggestions]
    return history, proposals


def test_never_repeats_and_stays_in_space():
    history, proposals = run_rounds(4)
    hashes = [r.config_hash for r in history]
    assert len(hashes) == len(set(hashes)) == 1 + 4 * 8
    for p in proposals:
        assert len(p.suggestions) == 8 and not p.dropped
        for s in p.suggestions:
            assert GEMM.space.check(s.config) is None
            assert s.variant_id.startswith(f"r{s.round}-local-") and len(s.patch_summary) <= 120
            assert s.risk in ("low", "medium", "high") and s.expected_effect


def test_deterministic_given_seed_and_differs_across_seeds():
    a = [[s.config for s in p.suggestions] for p in run_rounds(2)[1]]
    b = [[s.config for s in p.suggestions] for p in run_rounds(2)[1]]
    c = [[s.config for s in p.suggestions] for p in run_rounds(2, seed=11)[1]]
    assert a == b and a != c


def test_seeded_from_the_incumbent_and_constraint_aware():
    history = [fake_row("baseline", SPEC.baseline, 0)]
    p = LocalPolicy().propose(ctx_for(history, 1))
    # A quarter of the proposals are one-step neighbours of the baseline (the incumbent), after random picks.
    one_step = [s for s in p.suggestions if sum(s.config[k] != SPEC.baseline[k] for k in s.config) == 1]
    assert len(one_step) >= 2 and all(s.parent == "baseline" for s in one_step)
    assert all(sum(s.config[k] != SPEC.baseline[k] for k in s.config) == 1 for s in p.suggestions[-2:])
    # A faster row that breaks a constraint (spills) never becomes the anchor.
    fast = dict(SPEC.baseline, BLOCK_N=64)
    bad = fake_row("r1-bad", fast, 1)
    bad.compile.spill_bytes = 512
    p2 = LocalPolicy().propose(ctx_for([history[0], bad], 2))
    assert all(s.parent == "baseline" for s in p2.suggestions)


def test_exhausted_space_says_so():
    from kregress.core.family import Family, Space

    tiny = Family(name="tiny", space=Space(params={"BLOCK_M": (16, 32), "num_warps": (2, 4)}), shape_keys=("M",),
                  headline_metric="tflops")
    base = {"BLOCK_M": 16, "num_warps": 2}
    spec = SPEC.model_copy(update={"baseline": base})
    row = fake_row("baseline", dict(SPEC.baseline), 0)
    row = row.model_copy(update={"config": base, "config_hash": config_hash(base)})
    ctx = AgentContext(spec=spec, family=tiny, round=1, n=8, history=[row], objective={row.config_hash: 1.0},
                       profile_summary="", failures=[])
    p = LocalPolicy().propose(ctx)
    assert sorted(tuple(s.config.values()) for s in p.suggestions) == [(16, 4), (32, 2), (32, 4)]
    assert p.notes and "exhausted" in p.notes[0]


# --- a space with failures (a region of configs that compile and run but fail, as recorded spaces have)
def _fail_space():
    from kregress.core.family import Family, Rule, Space

    vals = tuple(range(10))
    space = Space(params={"X": vals, "Y": vals, "Z": (0, 1, 2)},
                  rules=(Rule("odd_sum", "X + Y must not be 7", lambda c, p, lim: c["X"] + c["Y"] != 7),))
    fam = Family(name="failspace", space=space, shape_keys=("M",), headline_metric="tflops")
    return space, fam


def _fails(c) -> bool:
    return c["X"] + c["Y"] >= 13  # the feasible region ends at a diagonal; the optimum sits next to it


def _lat(c) -> float:
    return 1.0 + 0.3 * abs(c["X"] - 7) + 0.2 * abs(c["Y"] - 5) + 0.1 * c["Z"]


def _row(vid, cfg, rnd):
    if _fails(cfg):
        return VariantResult(variant_id=vid, round=rnd, source="local", config=cfg, config_hash=config_hash(cfg),
                             error="runtime_error", error_detail="recorded failure: RuntimeFailedConfig")
    lat = _lat(cfg)
    m = Measurement(shape="1", samples_ms=[lat], p20_ms=lat, p50_ms=lat, p80_ms=lat, tflops=1, gbps=1,
                    evidence="replay", device="x", torch_version="n/a", triton_version="n/a")
    return VariantResult(variant_id=vid, round=rnd, source="local", config=cfg, config_hash=config_hash(cfg),
                         measurements=[m], evidence="replay", backend="replay")


def _run_fail_space(seed: int, rounds: int):
    space, fam = _fail_space()
    base = {"X": 0, "Y": 0, "Z": 2}
    spec = SPEC.model_copy(update={"baseline": base})
    history = [_row("baseline", base, 0)]
    proposals = []
    for rnd in range(1, rounds + 1):
        ctx = AgentContext(spec=spec, family=fam, round=rnd, n=8, history=history,
                           objective={r.config_hash: r.measurements[0].p50_ms for r in history if not r.error},
                           profile_summary="", failures=[])
        p = LocalPolicy(seed=seed).propose(ctx)
        proposals.append([s.config for s in p.suggestions])
        assert len(p.suggestions) == 8 and not p.dropped
        history += [_row(s.variant_id, s.config, rnd) for s in p.suggestions]
    return space, history, proposals


def test_space_with_failures_deterministic_no_repeats_in_space_and_learns_where_it_fails():
    space, history, proposals = _run_fail_space(seed=5, rounds=12)
    assert _run_fail_space(seed=5, rounds=12)[2] == proposals  # the same seed, the same proposals
    assert _run_fail_space(seed=6, rounds=3)[2] != proposals[:3]
    hashes = [r.config_hash for r in history]
    assert len(hashes) == len(set(hashes)) == 1 + 12 * 8  # never repeats, failures included
    assert all(space.check(r.config) is None for r in history)  # never leaves the space
    n_valid = sum(1 for x in range(10) for y in range(10) if x + y != 7) * 3
    base_rate = sum(1 for x in range(10) for y in range(10) if x + y != 7 and x + y >= 13) * 3 / n_valid
    late = [c for rnd in proposals[4:] for c in rnd]
    # once failures have been seen, the policy proposes fewer of them than sampling the space would, though
    # the optimum sits on the boundary (without the failure model: more than twice the base rate)
    assert sum(map(_fails, late)) / len(late) < 0.7 * base_rate
    best = min((r for r in history if not r.error), key=lambda r: r.measurements[0].p50_ms)
    assert _lat(best.config) == min(_lat({"X": x, "Y": y, "Z": 0}) for x in range(10) for y in range(10)
                                    if x + y != 7 and not _fails({"X": x, "Y": y}))


def test_a_stale_incumbent_gets_a_line_search_along_each_tunable(monkeypatch):
    """After STALE_ROUNDS rounds without a new best, the local picks change ONE tunable of the
    incumbent to any of its values (the convolution space's optimum is block_size_x 256 where the
    incumbent had 128, with 144..240 three times slower between them): in the space, unmeasured,
    deterministic, predicted failures allowed (they lie on the incumbent's own line)."""
    from kernel_assets.agent import local as L

    space, history, _ = _run_fail_space(seed=5, rounds=6)
    _, fam = _fail_space()
    spec = SPEC.model_copy(update={"baseline": {"X": 0, "Y": 0, "Z": 2}})
    best = min((r for r in history if not r.error), key=lambda r: r.measurements[0].p50_ms)
    measured = {r.config_hash for r in history}

    def picks(rnd):
        ctx = AgentContext(spec=spec, family=fam, round=rnd, n=8, history=history,
                           objective={r.config_hash: r.measurements[0].p50_ms for r in history if not r.error},
                           profile_summary="", failures=[])
        return [s.config for s in LocalPolicy(seed=5).propose(ctx).suggestions]

    def changed(c):
        return sum(c[k] != best.config[k] for k in c)

    assert L.STALE_ROUNDS == 3
    stale = picks(best.round + 1 + 3)
    assert stale == picks(best.round + 1 + 3)  # deterministic
    assert [changed(c) for c in stale[:L.N_LOCAL]] == [1] * L.N_LOCAL  # on the incumbent's lines
    assert all(space.check(c) is None and config_hash(c) not in measured for c in stale)
    assert len({config_hash(c) for c in stale}) == len(stale) == 8
    # and it is a different rule from the nearest-neighbour one it replaces (same round, phase off)
    monkeypatch.setattr(L, "STALE_ROUNDS", 10**6)
    assert picks(best.round + 1 + 3)[:L.N_LOCAL] != stale[:L.N_LOCAL]


# --- forecasts: every proposal carries expected_speedup with an 80% interval, from the posterior
def test_every_proposal_carries_a_forecast_with_an_80_percent_interval():
    from kernel_assets.agent import local as L

    history, proposals = run_rounds(4)
    base = fake_row("baseline", SPEC.baseline, 0).measurements[0].p50_ms
    for p in proposals:
        for s in p.suggestions:
            assert s.expected_speedup is not None and s.expected_speedup_low is not None
            assert s.expected_speedup_low < s.expected_speedup < s.expected_speedup_high
    # round 1 (the baseline alone): the prior, centred on no change, as wide as the documented spread
    r1 = proposals[0].suggestions[0]
    assert r1.expected_speedup == 1.0
    assert math.isclose(r1.expected_speedup_high, math.exp(L.Z80 * L.PRIOR_LOG_SD))
    assert math.isclose(r1.expected_speedup_low, math.exp(-L.Z80 * L.PRIOR_LOG_SD))
    # later rounds: the model's, narrower than the prior once it has data, and roughly right on a smooth space
    late = proposals[-1].suggestions
    prior_width = math.log(r1.expected_speedup_high / r1.expected_speedup_low)
    widths = sorted(math.log(s.expected_speedup_high / s.expected_speedup_low) for s in late)
    # the incumbent's neighbours (the local picks, first) and most picks; a Thompson draw may take a config far
    # from every measured one, whose interval can be wider than the prior where the data spread more than it
    assert widths[len(widths) // 2] < prior_width
    assert all(math.log(s.expected_speedup_high / s.expected_speedup_low) < prior_width for s in late[:L.N_LOCAL])
    rows = {r.variant_id: r for r in history}
    hits = [s.expected_speedup_low <= base / rows[s.variant_id].measurements[0].p50_ms <= s.expected_speedup_high
            for p in proposals[1:] for s in p.suggestions]
    assert sum(hits) >= 0.5 * len(hits)
    # the forecast is made once: proposing the same round again gives the same numbers
    again = LocalPolicy().propose(ctx_for(history[:1 + 3 * 8], 4))
    assert [(s.expected_speedup, s.expected_speedup_low) for s in again.suggestions] == \
        [(s.expected_speedup, s.expected_speedup_low) for s in late]


# --- moves the observations show cannot change the objective (a model estimate blind to a tunable)
def test_moves_that_never_changed_the_objective_are_not_proposed():
    """A latency estimate that ignores num_stages and GROUP_M gives exactly equal objectives for their
    values; once the history shows that, no proposal differs from a measured config only in such values."""
    import numpy as np

    from kernel_assets.agent.local import valid_set, value_classes

    def blind_row(vid, cfg, rnd):
        row = fake_row(vid, cfg, rnd)
        lat = (1.0 + 0.3 * math.log2(cfg["BLOCK_M"] / 100) ** 2 + 0.2 * math.log2(cfg["BLOCK_N"] / 50) ** 2
               + 0.1 * math.log2(cfg["BLOCK_K"] / 30) ** 2 + 0.05 * cfg["num_warps"])
        row.measurements[0] = row.measurements[0].model_copy(update={"p50_ms": lat, "samples_ms": [lat]})
        return row

    valid = valid_set(GEMM.space, SPEC.params, SPEC.hardware.limits)
    levels = [len(v) for v in valid.values]
    history = [blind_row("baseline", SPEC.baseline, 0)]
    notes, merged_rounds = [], 0
    for rnd in range(1, 9):
        ctx = AgentContext(spec=SPEC, family=GEMM, round=rnd, n=8, history=history,
                           objective={r.config_hash: r.measurements[0].p50_ms for r in history}, profile_summary="",
                           failures=[])
        p = LocalPolicy(seed=2).propose(ctx)
        notes += p.notes
        pos = np.array([valid.position(r.config) for r in history])
        classes = value_classes(pos, np.array([r.measurements[0].p50_ms for r in history]), levels)
        if classes is not None:
            merged_rounds += 1
            merged = {valid.keys[j] for j, c in enumerate(classes) if len(set(c.tolist())) < len(c)}
            assert merged <= {"num_stages", "GROUP_M"}, merged  # only what the estimate ignores

            def canon(cfg, classes=classes):
                return tuple(int(c[q]) for c, q in zip(classes, valid.position(cfg)))

            measured = {canon(r.config) for r in history}
            assert not [s.config for s in p.suggestions if canon(s.config) in measured]
        history += [blind_row(s.variant_id, s.config, rnd) for s in p.suggestions]
    assert merged_rounds >= 4
    assert any("always given exactly the same objective" in n for n in notes), notes
    # a measurement is never exactly equal: values that differ by any amount are not merged
    rows = np.array([[0, 0], [1, 0], [0, 1], [1, 1]])
    assert value_classes(rows, np.array([1.0, 1.0, 2.0, 2.0]), [2, 2]) is not None  # A inert in two contexts
    assert value_classes(rows[:3], np.array([1.0, 1.0, 2.0]), [2, 2]) is None  # one equal pair: a coincidence?
    assert value_classes(rows, np.array([1.0, 1.0 + 1e-6, 2.0, 2.0]), [2, 2]) is None  # measured: never equal


# --- the stagnation switch, on a synthetic recorded space with a planted lone optimum
def _lone_space(tmp_path, kind: str = "lone"):
    import importlib.util
    from pathlib import Path

    from kregress.core.family import Family
    from kregress.core.recorded import ReplayTable

    path = Path(__file__).resolve().parents[1] / "bench" / "synth_spaces.py"
    spec = importlib.util.spec_from_file_location("synth_spaces_for_test", path)
    synth = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(synth)
    table = ReplayTable.load(synth.write_space(tmp_path, kind, "small", seed=0))
    fam = Family(name=kind, space=table.space, shape_keys=("M",), headline_metric="tflops")
    return table, fam


def _search(table, fam, seed: int, cap: int, switch: bool) -> list[tuple[dict, float | None]]:
    """(config, objective) in the order evaluated, the start config (median objective) first."""
    import numpy as np

    # the start config as bench/search.py picks it: median objective (median of the runs), ties by key
    values = {table.key(r.config): float(np.median(r.times)) for r in table.records()}
    start = dict(zip(table.tune_params_keys, sorted(values, key=lambda k: (values[k], k))[len(values) // 2]))
    spec = SPEC.model_copy(update={"baseline": dict(start), "params": {}})

    def row(vid, cfg, rnd):
        rec = table.lookup(cfg)
        v = float(np.median(rec.times)) if rec.ok else None
        m = [Measurement(shape="1", samples_ms=[v], p20_ms=v, p50_ms=v, p80_ms=v, tflops=1, gbps=1, evidence="replay",
                         device="x", torch_version="n/a", triton_version="n/a")] if v else []
        return VariantResult(variant_id=vid, round=rnd, source="local", config=cfg, config_hash=config_hash(cfg),
                             measurements=m, evidence="replay", backend="replay",
                             error=None if rec.ok else "runtime_error")

    history = [row("baseline", dict(start), 0)]
    rnd = 0
    while len(history) < cap:
        rnd += 1
        ctx = AgentContext(spec=spec, family=fam, round=rnd, n=8, history=history,
                           objective={r.config_hash: r.measurements[0].p50_ms for r in history if r.measurements},
                           profile_summary="", failures=[])
        p = LocalPolicy(seed=seed, stagnation_switch=switch).propose(ctx)
        assert p.suggestions and not p.dropped
        history += [row(s.variant_id, s.config, rnd) for s in p.suggestions][: cap - len(history)]
    return [(r.config, r.measurements[0].p50_ms if r.measurements else None) for r in history]


LONE_SEED, LONE_CAP = 1, 240


def test_the_stagnation_switch_escapes_a_planted_lone_optimum(tmp_path):
    """The space: a smooth basin whose best is 1.19x the optimum, and a lone optimum three or more changes
    away, in a narrow basin of its own (bench/synth_spaces.py, kind lone). Without the switch the policy
    (pairwise model, nearest moves, line search) stays on the plateau; with it, it finds the optimum."""
    import numpy as np

    table, fam = _lone_space(tmp_path)
    optimum = min(float(np.median(r.times)) for r in table.records())
    runs = {}
    for switch in (False, True):
        seq = _search(table, fam, LONE_SEED, LONE_CAP, switch)
        hashes = [config_hash(c) for c, _ in seq]
        assert len(hashes) == len(set(hashes)) == LONE_CAP  # never a repeat
        assert all(table.check(c) is None for c, _ in seq)  # never outside the space
        runs[switch] = min(v for _, v in seq if v is not None) / optimum
    assert runs[False] > 1.15, runs  # trapped on the plateau
    assert runs[True] <= 1.01, runs  # found the lone optimum
    # deterministic per seed: the same first rounds again
    assert _search(table, fam, LONE_SEED, 40, True) == _search(table, fam, LONE_SEED, 40, True)


def test_a_space_too_large_to_enumerate_gets_forecasts_from_a_main_effects_model():
    from kernel_assets.agent import local as L
    from kregress.core.family import Family, Space

    vals = tuple(range(1, 9))
    space = Space(params={k: vals for k in ("A", "B", "C", "D", "E", "F")})  # 8**6 = 262,144 points
    assert math.prod(len(v) for v in space.params.values()) > L.ENUMERATE_LIMIT
    fam = Family(name="big", space=space, shape_keys=("M",), headline_metric="tflops")
    base = {k: 4 for k in space.params}
    spec = SPEC.model_copy(update={"baseline": base})

    def row(vid, cfg, rnd):
        lat = 1.0 + 0.2 * abs(cfg["A"] - 6) + 0.1 * abs(cfg["B"] - 2)
        m = Measurement(shape="1", samples_ms=[lat], p20_ms=lat, p50_ms=lat, p80_ms=lat, tflops=1, gbps=1,
                        evidence="replay", device="x", torch_version="n/a", triton_version="n/a")
        return VariantResult(variant_id=vid, round=rnd, source="local", config=cfg, config_hash=config_hash(cfg),
                             measurements=[m], evidence="replay", backend="replay")

    history = [row("baseline", base, 0)]
    widths = []
    for rnd in (1, 2):
        ctx = AgentContext(spec=spec, family=fam, round=rnd, n=8, history=history,
                           objective={r.config_hash: r.measurements[0].p50_ms for r in history}, profile_summary="",
                           failures=[])
        p = LocalPolicy(seed=1).propose(ctx)
        assert len(p.suggestions) == 8
        for s in p.suggestions:
            assert s.expected_speedup_low < s.expected_speedup < s.expected_speedup_high
        widths.append(max(math.log(s.expected_speedup_high / s.expected_speedup_low) for s in p.suggestions))
        history += [row(s.variant_id, s.config, rnd) for s in p.suggestions]
    assert math.isclose(widths[0], 2 * L.Z80 * L.PRIOR_LOG_SD) and widths[1] < widths[0]


def test_the_explorers_find_a_three_way_interaction_the_pairwise_search_cannot(tmp_path):
    """The space: three tunables at three given values pay only together (each pair of them alone is 1.25x
    slower), and the best of the rest is 1.19x the optimum (bench/synth_spaces.py, kind threeway). Within 160
    evaluations, on four seeds: without the explorers the search finds the optimum once at most (it stays
    on the plateau); with them (the three-way cover, restarts around surprising configs, the stagnation
    switch) on three seeds at least."""
    import numpy as np

    table, fam = _lone_space(tmp_path, "threeway")
    optimum = min(float(np.median(r.times)) for r in table.records())
    found = {False: 0, True: 0}
    for seed in range(4):
        for switch in (False, True):
            seq = _search(table, fam, seed, 160, switch)
            assert len({config_hash(c) for c, _ in seq}) == len(seq) and all(table.check(c) is None for c, _ in seq)
            found[switch] += min(v for _, v in seq if v is not None) / optimum <= 1.01
    assert found[False] <= 1 and found[True] >= 3, found


def test_the_cover_picks_configs_with_unmeasured_three_way_cells():
    """The explorer's cover: each pick lands in three-way value cells no measured config has; eight picks
    from a 2x2x2x4 space cover more cells than uniform random picks do (every seed of 50 random draws
    but a few), and it is deterministic given the generator's seed."""
    import numpy as np

    from kernel_assets.agent.local import ValidSet, _value_cells
    from kregress.core.family import Space

    space = Space(params={"A": (0, 1), "B": (0, 1), "C": (0, 1), "D": (0, 1, 2, 3)})
    valid = ValidSet(space, {})
    cells = _value_cells(valid, 3)
    assert len(cells) == 4 and sorted(n for _, n in cells) == [8, 16, 16, 16]

    def covered(rows) -> int:
        return sum(len(set(ids[list(rows)].tolist())) for ids, _ in cells)

    seen = [0]
    cand = np.arange(1, len(valid))
    picks = LocalPolicy._explore(valid, seen, cand, 8, np.random.default_rng(7), 3)
    assert picks == LocalPolicy._explore(valid, seen, cand, 8, np.random.default_rng(7), 3)
    assert len(set(picks)) == 8 and 0 not in picks
    # the first pick shares no three-way cell with the measured config (one exists: all values differ)
    assert all(ids[picks[0]] != ids[0] for ids, _ in cells)
    rng = np.random.default_rng(0)
    random_cover = [covered(seen + list(rng.choice(cand, 8, replace=False))) for _ in range(50)]
    assert covered(seen + picks) >= max(random_cover) and covered(seen + picks) > np.median(random_cover)
    # order 0 is plain uniform sampling without replacement
    plain = LocalPolicy._explore(valid, seen, cand, 8, np.random.default_rng(7), 0)
    assert len(set(plain)) == 8 and set(plain) <= set(cand.tolist())


def test_the_balanced_design_spreads_round_one_over_every_tunables_values():
    """Order 1 (round 1 of the portfolio): on a full grid, k picks with k at most each tunable's unmeasured values
    form a Latin design (no value of any tunable repeats, the measured config's included), for any seed and grid;
    on a constrained space the picks cover at least as many (tunable, value) pairs as 90% of 50 uniform draws
    and more than their median; deterministic given the generator's seed."""
    import numpy as np

    from kernel_assets.agent.local import ValidSet, _value_cells
    from kregress.core.family import Rule, Space

    for levels in ((4, 5, 6), (3, 3, 3, 8), (7, 7, 9)):
        space = Space(params={f"p{j}": tuple(range(n)) for j, n in enumerate(levels)})
        valid = ValidSet(space, {})
        for seed in range(5):
            rng = np.random.default_rng(seed)
            seen = [int(rng.integers(len(valid)))]
            cand = np.setdiff1d(np.arange(len(valid)), seen)
            k = min(levels) - 1
            picks = LocalPolicy._explore(valid, seen, cand, k, np.random.default_rng(seed), 1)
            assert picks == LocalPolicy._explore(valid, seen, cand, k, np.random.default_rng(seed), 1)
            rows = valid.idx[seen + picks]
            assert all(len(set(rows[:, j].tolist())) == k + 1 for j in range(len(levels))), rows
    # a constrained space: block sizes whose product is bounded, as thread-block limits make them
    space = Space(params={"X": (1, 2, 4, 8, 16, 32), "Y": (1, 2, 4, 8, 16, 32), "U": (1, 2, 3, 4)},
                  rules=(Rule("threads", "X * Y <= 64", lambda c, p, lim: c["X"] * c["Y"] <= 64),))
    valid = ValidSet(space, {})
    cells = _value_cells(valid, 1)
    assert [n for _, n in cells] == [6, 6, 4]

    def covered(rows) -> int:
        return sum(len(set(ids[list(rows)].tolist())) for ids, _ in cells)

    cand = np.arange(1, len(valid))
    picks = LocalPolicy._explore(valid, [0], cand, 5, np.random.default_rng(3), 1)
    rng = np.random.default_rng(0)
    random_cover = [covered([0] + list(rng.choice(cand, 5, replace=False))) for _ in range(50)]
    assert covered([0] + picks) >= np.percentile(random_cover, 90) and covered([0] + picks) > np.median(random_cover)
    assert len(set(picks)) == 5 and 0 not in picks and set(picks) <= set(cand.tolist())


def test_a_config_far_faster_than_the_model_predicts_becomes_a_restart_point():
    """Restarts from other basins: a measured config the model, fitted to the others, predicts far too slow
    (a shoulder of a basin it cannot see), at least two changes from the incumbent, is the root of the next
    local search; on a smooth space there is none."""
    import numpy as np

    from kernel_assets.agent.local import NOISE_VAR, Posterior, ValidSet, _features
    from kregress.core.family import Space

    space = Space(params={k: tuple(range(5)) for k in "ABCD"})
    valid = ValidSet(space, {})
    feats = _features(valid)
    rng = np.random.default_rng(3)
    rows = sorted(rng.choice(len(valid), 120, replace=False).tolist())
    y = np.array([0.05 * float(np.sum((valid.idx[r] - 1.0) ** 2)) for r in rows])  # a smooth bowl around 1,1,1,1
    y += 0.01 * rng.standard_normal(len(y))
    incumbent = tuple(valid.idx[rows[int(np.argmin(y))]])

    def root(values, capped=None):
        ys = (values - values.mean()) / values.std()
        post = Posterior(feats.design(np.asarray(rows)), ys, feats.prior_var, NOISE_VAR)
        return LocalPolicy._surprise_root(valid, post, rows, incumbent, capped)

    assert root(y) is None
    far = [i for i, r in enumerate(rows) if (valid.idx[r] != np.asarray(incumbent)).sum() >= 3 and y[i] > np.median(y)]
    y2 = y.copy()
    y2[far[0]] = float(np.min(y)) + 0.02  # a far, slow-looking config that runs nearly as fast as the best
    assert root(y2) == rows[far[0]]
    # a row the models see at the slow fence (capped) is slow whatever its residual says: never a root
    capped = np.zeros(len(rows), dtype=bool)
    capped[far[0]] = True
    assert root(y2, capped) != rows[far[0]]


def test_local_picks_are_model_guided_coordinate_descent():
    """Once the model has data, the incumbent's local picks come from its nearest ring and its one-tunable
    lines, best first under the posterior mean (``near_rank`` off: the nearest ones, ties at random). The
    class: random additive spaces (each value of each tunable a random effect on log latency) and random
    histories; the first local pick changes one tunable or steps to the nearest ring, and its true latency
    ranks near the top of those candidates, far better than the model-free order."""
    import random

    import numpy as np

    from kregress.core.family import Family, Space

    space = Space(params={"X": tuple(range(10)), "Y": tuple(range(10)), "Z": (0, 1, 2)})
    fam = Family(name="additive", space=space, shape_keys=("M",), headline_metric="tflops")
    every = [{"X": x, "Y": y, "Z": z} for x in range(10) for y in range(10) for z in range(3)]
    ranks: dict[str, list[float]] = {"ranked": [], "model-free": []}
    for case in range(16):
        rs = np.random.default_rng(case)
        eff = {k: rs.normal(0, 0.4, len(v)) for k, v in space.params.items()}

        def lat(c, eff=eff):
            return float(math.exp(sum(eff[k][c[k]] for k in c)))

        def row(vid, c):
            v = lat(c)
            m = Measurement(shape="1", samples_ms=[v], p20_ms=v, p50_ms=v, p80_ms=v, tflops=1, gbps=1,
                            evidence="replay", device="x", torch_version="n/a", triton_version="n/a")
            return VariantResult(variant_id=vid, round=1, source="local", config=c, config_hash=config_hash(c),
                                 measurements=[m], evidence="replay", backend="replay")
        picks = random.Random(case).sample(every, 13)
        spec = SPEC.model_copy(update={"baseline": picks[0]})
        history = [row("baseline", picks[0])] + [row(f"r1-local-{i:02d}", c) for i, c in enumerate(picks[1:])]
        best = min(history, key=lambda r: r.measurements[0].p50_ms).config
        measured = {config_hash(c) for c in picks}
        cands = [c for c in every if config_hash(c) not in measured
                 and (sum(c[k] != best[k] for k in c) == 1 or sum(abs(c[k] - best[k]) for k in c) == 1)]
        order = sorted(lat(c) for c in cands)
        ring_steps = sorted(sum(abs(c[k] - best[k]) for k in c) for c in every if config_hash(c) not in measured)[1]
        for name, ablate in (("ranked", ()), ("model-free", ("near_rank",)), ("ring only", ("line",))):
            ctx = AgentContext(spec=spec, family=fam, round=2, n=8, history=history,
                               objective={r.config_hash: r.measurements[0].p50_ms for r in history},
                               profile_summary="", failures=[])
            first = LocalPolicy(seed=case, ablate=ablate).propose(ctx).suggestions[0].config
            if name == "ring only":  # the "line" knob off: the nearest ring alone
                assert sum(abs(first[k] - best[k]) for k in first) <= ring_steps
                continue
            assert first in cands, (name, first, best)  # on a line of the incumbent, or one step from it
            ranks[name].append(order.index(lat(first)) / len(order))
    assert np.mean(ranks["ranked"]) < 0.25 and np.mean(ranks["ranked"]) < 0.5 * np.mean(ranks["model-free"]), ranks


def test_how_slow_a_slow_outlier_is_does_not_move_the_search():
    """The models cap measured log objectives at the upper Tukey fence (third quartile + 1.5 x the interquartile
    range; the rule of Ax's Winsorize transform for an objective to minimise, applied to log times): a config far
    slower than the rest (a tile of one, a spilling kernel) says "slow", and how slow must not tilt the fit of the
    region that matters. The class: random additive spaces and random histories with one slow row. Placed anywhere
    past the fence (just past it, x3, x30), the row leaves every proposal and forecast of the round as it was, for
    the local policy and for the portfolio; moved below the fence it moves the round (the cap flattens outliers
    only, not the slow half); with the cap off ("winsor") the same move past the fence moves the round's picks
    (the property is the cap's, not the space's)."""
    import random

    import numpy as np

    from kernel_assets.agent.local import slow_fence
    from kernel_assets.agent.portfolio import PortfolioPolicy
    from kregress.core.family import Family, Space

    space = Space(params={"X": tuple(range(8)), "Y": tuple(range(8)), "Z": (0, 1, 2), "W": (0, 1)})
    fam = Family(name="additive", space=space, shape_keys=("M",), headline_metric="tflops")
    every = [{"X": x, "Y": y, "Z": z, "W": w} for x in range(8) for y in range(8) for z in range(3) for w in range(2)]
    moved_off = moved_below = 0
    for case in range(12):
        rs = np.random.default_rng(100 + case)
        eff = {k: rs.normal(0, 0.4, len(v)) for k, v in space.params.items()}
        picks = random.Random(case).sample(every, 17)
        lat = [float(math.exp(sum(eff[k][c[k]] for k in c))) for c in picks]
        y = np.log(lat)
        fence = slow_fence(y)
        # the second slowest row, or the third where that is row 0 (the baseline, which forecasts are relative to);
        # past the fence it stays above the third quartile, so the fence does not move with it
        order = np.argsort(y)
        slow = int(order[-2]) if order[-2] != 0 else int(order[-3])

        def round_for(factor, ablate=(), policy=LocalPolicy, lat=lat, slow=slow, fence=fence, picks=picks, case=case):
            vals = list(lat)
            vals[slow] = math.exp(fence) * factor
            rows = []
            for i, (c, v) in enumerate(zip(picks, vals)):
                m = Measurement(shape="1", samples_ms=[v], p20_ms=v, p50_ms=v, p80_ms=v, tflops=1, gbps=1,
                                evidence="replay", device="x", torch_version="n/a", triton_version="n/a")
                rows.append(VariantResult(variant_id="baseline" if i == 0 else f"r1-local-{i:02d}", round=min(i, 1),
                                          source="local", config=c, config_hash=config_hash(c), measurements=[m],
                                          evidence="replay", backend="replay"))
            spec = SPEC.model_copy(update={"baseline": picks[0]})
            ctx = AgentContext(spec=spec, family=fam, round=2, n=8, history=rows,
                               objective={r.config_hash: r.measurements[0].p50_ms for r in rows},
                               profile_summary="", failures=[])
            pol = LocalPolicy(seed=case, ablate=ablate) if policy is LocalPolicy else policy(seed=case)
            return [(s.config, s.expected_speedup) for s in pol.propose(ctx).suggestions]

        just_past = round_for(1.001)
        assert just_past == round_for(3.0) == round_for(30.0), case
        assert round_for(1.001, policy=PortfolioPolicy) == round_for(30.0, policy=PortfolioPolicy), case
        moved_below += [c for c, _ in round_for(0.6)] != [c for c, _ in just_past]
        moved_off += ([c for c, _ in round_for(3.0, ("winsor",))] != [c for c, _ in round_for(30.0, ("winsor",))])
    assert moved_below >= 6 and moved_off >= 6, (moved_below, moved_off)


def test_the_slow_fence_needs_a_spread():
    """Where the quartiles tie (the middle half of the objectives exactly equal: estimates blind to a tunable), no
    fence: a fence on the third quartile would flatten every slower value, outlier or not. Otherwise the fence is
    at or above the third quartile, and it stays where it is however far past it the slowest row is placed."""
    import numpy as np

    from kernel_assets.agent.local import slow_fence

    assert slow_fence(np.array([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 3.0])) == math.inf  # the middle half tied
    rng = np.random.default_rng(7)
    for _ in range(50):
        y = rng.normal(0, 0.5, int(rng.integers(6, 40)))
        fence = slow_fence(y)
        assert fence >= np.percentile(y, 75, method="higher")
        for past in (0.01, 1.0, 50.0):
            y2 = y.copy()
            y2[np.argmax(y)] = max(y.max(), fence) + past  # the slowest row, placed past the fence
            assert slow_fence(y2) == fence


# The global explorer (issue 57): a share of every round from the second explores the space away from everything
# measured, and the share grows while the sweep's best has not moved.
def _hamming(a: dict, b: dict) -> int:
    return sum(a[k] != b[k] for k in a)


def _stalled_history(unmoved: int, who: tuple[str, ...] = ("local", "ga"), gain_round: float = 0.0):
    """A baseline (10.0), one round of new bests (9.0 down to 5.5), then ``unmoved`` rounds of slower configs (50.0),
    the last of them with one config ``gain_round`` faster than the best (a relative gain; 0: none); each config
    distinct, the members named in turn by ``who``. Returns (history, objective)."""
    import random as _random

    from kernel_assets.agent.local import valid_set

    valid = valid_set(GEMM.space, SPEC.params, SPEC.hardware.limits)
    rows = list(range(len(valid)))
    _random.Random(5).shuffle(rows)
    base = fake_row("baseline", SPEC.baseline, 0)
    history, lat = [base], {base.config_hash: 10.0}
    cfgs = [valid.config(i) for i in rows if valid.config(i) != SPEC.baseline]
    for rnd in range(1, 2 + unmoved):
        for k in range(8):
            row = fake_row(f"r{rnd}-{who[k % len(who)]}-{k + 1:02d}", cfgs.pop(), rnd)
            v = 9.0 - 0.5 * k if rnd == 1 else 50.0
            if rnd == 1 + unmoved and rnd > 1 and k == 0 and gain_round:
                v = 5.5 * (1.0 - gain_round)
            row.measurements[0].p50_ms = lat[row.config_hash] = v
            history.append(row)
    return history, lat


def _ctx_of(history, lat, rnd):
    c = ctx_for(history, rnd)
    c.objective.update(lat)
    return c


def test_the_global_explorers_share_grows_while_the_best_has_not_moved():
    from kernel_assets.agent.portfolio import (
        EXPLORE_GROWTH,
        EXPLORE_MAX_SHARE,
        EXPLORE_SLOTS,
        explore_slots,
        rounds_unmoved,
    )

    assert explore_slots(ctx_for([fake_row("baseline", SPEC.baseline, 0)], 1)) == 0  # round 1: the balanced start
    shares = []
    for unmoved in range(0, 9):
        history, lat = _stalled_history(unmoved)
        ctx = _ctx_of(history, lat, 2 + unmoved)
        assert rounds_unmoved(ctx) == unmoved
        shares.append(explore_slots(ctx))
    assert shares[0] == EXPLORE_SLOTS >= 1  # a share of every round, a moving best too
    assert shares == sorted(shares) and shares[-1] > shares[0]  # it grows with the stall ...
    assert shares[EXPLORE_GROWTH] == EXPLORE_SLOTS + 1  # ... one more per EXPLORE_GROWTH rounds ...
    assert shares[-1] == int(EXPLORE_MAX_SHARE * 8) >= 2  # ... up to its share of the round (8 proposals)
    # a gain too small to be a move (0.5%) leaves the count running; a 5% gain is a move and the share falls back
    small, lat_s = _stalled_history(6, gain_round=0.005)
    big, lat_b = _stalled_history(6, gain_round=0.05)
    assert rounds_unmoved(_ctx_of(small, lat_s, 8)) == 6 and explore_slots(_ctx_of(small, lat_s, 8)) == shares[6]
    assert rounds_unmoved(_ctx_of(big, lat_b, 8)) == 0 and explore_slots(_ctx_of(big, lat_b, 8)) == shares[0]


def test_an_exploring_proposal_lies_outside_the_neighbourhood_of_every_evaluated_config():
    """The explorer's picks (ids ``r<round>-local-<k>-explore``) differ from every measured config, and from each other,
    in at least FAR_HAMMING tunables: none is a config the local picks would reach (the incumbent's ring and
    one-tunable lines); the share is kept even where the bandit gives the local member fewer slots (the genetic
    algorithm set every new best), and it is off with the knob ``global``."""
    from kernel_assets.agent.local import FAR_HAMMING
    from kernel_assets.agent.portfolio import PortfolioPolicy, allocate, explore_slots, proposer_of

    assert FAR_HAMMING >= 2
    for seed in range(2):
        for unmoved, who in ((0, ("local", "ga")), (6, ("local", "ga")), (0, ("ga",))):
            history, lat = _stalled_history(unmoved, who=who)
            ctx = _ctx_of(history, lat, 2 + unmoved)
            k_x = explore_slots(ctx)
            prop = PortfolioPolicy(seed=seed).propose(ctx)
            assert len(prop.suggestions) == 8 and not prop.dropped
            ex = [s for s in prop.suggestions if proposer_of(s.variant_id) == "explore"]
            assert len(ex) == k_x >= 1, (seed, unmoved, who, [s.variant_id for s in prop.suggestions])
            if who == ("ga",):
                assert allocate(ctx)["local"] < k_x  # the bandit alone would not have given the local member as many
            for i, s in enumerate(ex):
                assert s.variant_id.startswith(f"r{ctx.round}-local-") and GEMM.space.check(s.config) is None
                assert min(_hamming(s.config, r.config) for r in history) >= FAR_HAMMING
                assert all(_hamming(s.config, t.config) >= FAR_HAMMING for t in ex[:i])
            off = PortfolioPolicy(seed=seed, local=LocalPolicy(seed=seed, ablate=frozenset(
                {"start_cover", "standing", "global"}))).propose(ctx)
            assert not [s for s in off.suggestions if proposer_of(s.variant_id) == "explore"]


def test_the_explorer_draws_uniformly_among_the_far_configs():
    """``global_explore`` on a valid set with a tenth measured: every pick is at least FAR_HAMMING changes from every
    measured config; over many draws the picks spread over every value of every tunable (no corner, no model)."""
    import numpy as np

    from kernel_assets.agent.local import FAR_HAMMING, global_explore, valid_set

    valid = valid_set(GEMM.space, SPEC.params, SPEC.hardware.limits)
    rng = np.random.default_rng(0)
    seen = [int(i) for i in rng.choice(len(valid), len(valid) // 10, replace=False)]
    taken = np.zeros(len(valid), dtype=bool)
    taken[seen] = True
    picks = []
    for s in range(40):
        got = global_explore(valid, taken, seen, np.ones(len(valid), dtype=bool), 4, np.random.default_rng(s))
        assert len(got) == len(set(got)) == 4 and not taken[got].any()
        d = (valid.idx[got][:, None, :] != valid.idx[seen][None, :, :]).sum(axis=2).min(axis=1)
        assert (d >= FAR_HAMMING).all()
        picks += got
    for j, vals in enumerate(valid.values):
        assert len(set(valid.idx[picks, j].tolist())) == len(vals), valid.keys[j]
