"""bench/search.py's counting helpers, and the local policy on a space where most points are invalid."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

from kernel_assets.agent.base import AgentContext
from kernel_assets.agent.local import LocalPolicy
from kregress.core.records import Measurement, VariantResult, config_hash
from kregress.core.family import Family, Rule, Space
from kregress.core.spec import parse_spec

_spec = importlib.util.spec_from_file_location("search_bench", Path(__file__).resolve().parents[1] / "bench" / "search.py")
search = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("search_bench", search)  # dataclasses look their module up while defining
_spec.loader.exec_module(search)


def _problem(values: dict[tuple[int, ...], float], start: tuple[int, ...]):
    return search.Problem(path="x", objective="median", keys=("A", "B"), values=values, start=start,
                          best=min(values.values()))


def test_counts_distinct_recorded_evaluations_start_first():
    vals = {(0, 0): 10.0, (0, 1): 5.0, (1, 0): 1.04, (1, 1): 1.0}
    p = _problem(vals, (0, 0))
    # repeats and points with no record (outside the space) cost nothing; the start is evaluation 1
    seq = search.distinct_with_start(p, [(0, 0), (0, 1), (9, 9), (0, 1), (1, 0), (1, 1)])
    assert seq == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert search.evals_to_targets(p, seq) == [3, 4]  # within 5%: (1, 0); within 1%: only the optimum
    assert search.evals_to_targets(p, seq[:2]) == [None, None]


def test_exact_random_matches_the_combinatorics():
    n_valid, good = 10, 2  # 9 configs after the start, 2 of them good
    n = n_valid - 1
    # P(first good one at draw m) = C(n - m, good - 1) / C(n, good)
    pmf = [math.comb(n - m, good - 1) / math.comb(n, good) for m in range(1, n + 1)]
    cdf = [sum(pmf[:i]) for i in range(1, n + 1)]
    want = [next(m for m, c in enumerate(cdf, start=1) if c >= q - 1e-12) + 1 for q in (0.25, 0.5, 0.75)]
    quant, p_cap = search.exact_random(n_valid, good, cap=4)
    assert quant == want
    assert abs(p_cap - cdf[2]) < 1e-12  # cap 4 = the start + 3 draws


def test_quartiles_treat_misses_as_more_than_the_cap():
    q1, med, q3 = search.quartiles([10, 20, None, None])
    assert med == 20 and math.isinf(q3)
    assert search.fmt_q((q1, med, q3), 100) == "20 [10, >100]"
    assert search.ratio(50.0, math.inf, 100) == "<0.50"


def _row(cfg: dict, value: float, rnd: int, vid: str) -> VariantResult:
    m = Measurement(shape="64x64x64", samples_ms=[value], p20_ms=value, p50_ms=value, p80_ms=value, tflops=1, gbps=1,
                    evidence="replay", device="x", torch_version="n/a", triton_version="n/a")
    # no compile stats: recorded runs of a kernel that is not compiled here (the replay backend)
    return VariantResult(variant_id=vid, round=rnd, source="local", config=cfg, config_hash=config_hash(cfg),
                         measurements=[m], evidence="replay", backend="replay")


def test_local_policy_climbs_a_space_where_single_moves_are_invalid():
    # Valid only when X == Y: every one-tunable move from a valid point is invalid, so only moves that
    # change both stay in the space (the shape of a rule like MWG % (MDIMC * VWM) == 0).
    vals = tuple(range(12))
    space = Space(params={"X": vals, "Y": vals, "Z": (0, 1)},
                  rules=(Rule("diag", "X must equal Y", lambda c, p, lim: c["X"] == c["Y"]),))
    fam = Family(name="diag", space=space, shape_keys=("M",), headline_metric="tflops")

    def latency(c):
        return 1.0 + abs(c["X"] - 9) + 0.5 * c["Z"]

    base = {"X": 0, "Y": 0, "Z": 1}
    spec = parse_spec({
        "task_id": "diag", "kernel_family": "gemm", "shape_matrix": [{"M": 64, "N": 64, "K": 64}],
        "correctness_shapes": [{"M": 32, "N": 32, "K": 32}],
        "baseline": dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_stages=3, num_warps=8),
    }).model_copy(update={"baseline": base})
    history = [_row(base, latency(base), 0, "baseline")]
    for rnd in range(1, 4):
        ctx = AgentContext(spec=spec, family=fam, round=rnd, n=4, history=history,
                           objective={r.config_hash: r.measurements[0].p50_ms for r in history},
                           profile_summary="", failures=[])
        p = LocalPolicy(seed=1).propose(ctx)
        assert len(p.suggestions) == 4 and not p.dropped
        assert all(space.check(s.config) is None for s in p.suggestions)
        history += [_row(s.config, latency(s.config), rnd, s.variant_id) for s in p.suggestions]
    hashes = [r.config_hash for r in history]
    assert len(hashes) == len(set(hashes))
    best = min(history, key=lambda r: r.measurements[0].p50_ms)
    # rows without compile stats can be the incumbent: the search moved off the baseline
    assert best.variant_id != "baseline" and p.suggestions[0].parent != "baseline"
    assert best.measurements[0].p50_ms < latency(base) - 2


def test_p_fewer_counts_ties_and_double_misses_half():
    assert search.p_fewer([1.0], [2.0]) == 1.0
    assert search.p_fewer([math.inf], [math.inf]) == 0.5
    assert search.p_fewer([1.0, math.inf], [2.0]) == 0.5
