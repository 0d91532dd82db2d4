"""bench/search.py: counting helpers, and a short run of the harness on a small cache file made here
(failures in the space and counted for every method, fixed-budget quality, the JSON schema)."""

from __future__ import annotations

import gzip
import importlib.util
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from kernel_assets.agent.base import AgentContext
from kernel_assets.agent.local import LocalPolicy
from kregress.core.family import Family, Rule, Space
from kregress.core.records import Measurement, VariantResult, config_hash
from kregress.core.spec import parse_spec

_spec = importlib.util.spec_from_file_location("search_bench", Path(__file__).resolve().parents[1] / "bench" / "search.py")
search = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("search_bench", search)  # dataclasses look their module up while defining
_spec.loader.exec_module(search)


def _problem(values: dict[tuple[int, ...], float], start: tuple[int, ...], failed=()):
    return search.Problem(path="x", objective="median", keys=("A", "B"), values=values, start=start,
                          best=min(values.values()), failed=frozenset(failed))


def write_cache(path: Path, gz: bool = False, int_problem_size: bool = False) -> dict:
    """A small Kernel Tuner cache file: A, B in 0..7, C in {0, 1}; points with (A + B) % 5 == 0 are
    ruled out (absent); A * B > 24 fail at run time (about a fifth of the recorded ones); 32 runs each."""
    rng = np.random.default_rng(7)
    cache = {}
    for a in range(8):
        for b in range(8):
            for c in (0, 1):
                if (a + b) % 5 == 0:
                    continue
                rec = {"A": a, "B": b, "C": c, "compile_time": 1.0, "verification_time": 0, "benchmark_time": 1.0}
                if a * b > 24:
                    rec["time"] = "RuntimeFailedConfig"
                else:
                    t = 1.0 + 0.1 * (a - 4) ** 2 + 0.07 * (b - 5) ** 2 + 0.05 * c
                    rec["times"] = list(t * (1 + 0.002 * rng.standard_normal(32)))
                    rec["time"] = float(np.mean(rec["times"]))
                cache[f"{a},{b},{c}"] = rec
    data = {"device_name": "test GPU", "kernel_name": "toy", "problem_size": 4096 if int_problem_size else [4096],
            "tune_params_keys": ["A", "B", "C"], "tune_params": {"A": list(range(8)), "B": list(range(8)), "C": [0, 1]},
            "objective": "time", "cache": cache}
    raw = json.dumps(data).encode()
    path.write_bytes(gzip.compress(raw) if gz else raw)
    return data


def test_counts_distinct_recorded_evaluations_start_first_failures_included():
    vals = {(0, 0): 10.0, (0, 1): 5.0, (1, 0): 1.04, (1, 1): 1.0}
    p = _problem(vals, (0, 0), failed={(2, 2)})
    # repeats and points with no record (outside the space) cost nothing; a recorded failure costs one
    seq = search.distinct_with_start(p, [(0, 0), (0, 1), (9, 9), (2, 2), (0, 1), (1, 0), (1, 1)])
    assert seq == [(0, 0), (0, 1), (2, 2), (1, 0), (1, 1)]
    assert search.evals_to_targets(p, seq) == [4, 5]  # within 5%: (1, 0); within 1%: only the optimum
    assert search.evals_to_targets(p, seq[:2]) == [None, None]


def test_quality_at_fixed_budgets():
    vals = {(0, 0): 4.0, (0, 1): 2.0, (1, 0): 1.0}
    p = _problem(vals, (0, 0), failed={(2, 2)})
    q = search.quality_at(p, [(0, 0), (2, 2), (0, 1), (1, 0)], budgets=(1, 2, 3, 4, 50))
    # a failure has no value; a run shorter than the budget keeps its best
    assert q == {1: 4.0, 2: 4.0, 3: 2.0, 4: 1.0, 50: 1.0}


def test_quality_at_the_sweeps_counts_is_after_that_many_proposals():
    # the start config, then 70 proposals whose values fall one step at evaluations 9, 10, 17, 33, 34, 65, 66
    keys = [(0, i) for i in range(71)]
    drops = {8: 8.0, 9: 7.0, 16: 6.0, 32: 5.0, 33: 4.0, 64: 3.0, 65: 2.0}
    vals, cur = {}, 10.0
    for i, k in enumerate(keys):
        cur = drops.get(i, cur)
        vals[k] = cur
    vals[(1, 0)] = 1.0  # the optimum, never evaluated
    q = search.quality_all(_problem(vals, keys[0]), keys)
    assert list(q) == list(search.QUALITY_KEYS)
    # after B proposals = evaluation 1 + B (the start config is the sweep's baseline); 50..400 count the start
    assert (q["8"], q["16"], q["24"], q["32"], q["64"]) == (8.0, 6.0, 6.0, 5.0, 3.0)
    assert (q["50"], q["100"], q["400"]) == (4.0, 2.0, 2.0)


def test_exact_random_matches_the_combinatorics():
    n_valid, good = 10, 2  # 9 configs after the start, 2 of them good
    n = n_valid - 1
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


def test_p_fewer_counts_ties_and_double_misses_half():
    assert search.p_fewer([1.0], [2.0]) == 1.0
    assert search.p_fewer([math.inf], [math.inf]) == 0.5
    assert search.p_fewer([1.0, math.inf], [2.0]) == 0.5


def _setup(tmp_path, **kw):
    f = tmp_path / "toy.json"
    data = write_cache(f, **kw)
    _, problem = search.load_problem(f)
    search._PROBLEMS[problem.path] = problem
    return f, data, problem


def test_failures_are_in_the_space_and_cost_one_evaluation_for_local_and_random(tmp_path):
    f, data, problem = _setup(tmp_path, gz=True, int_problem_size=True)  # a 1-D problem size reads too
    n_fail = sum(isinstance(r["time"], str) for r in data["cache"].values())
    assert len(problem.failed) == n_fail > 0 and len(problem.values) + n_fail == len(data["cache"])
    search.prepare_local(problem)
    n_space = len(data["cache"])
    for method in ("local", "random"):
        # a cap of the whole space: a method that never skipped failures evaluates every one of them
        r = search.run_task((problem.path, method, 0, n_space))
        assert "error" not in r, r
        assert r["n"] == n_space and r["n_failed"] == n_fail, (method, r["n"], r["n_failed"])
        assert r["evals"][1] is not None and r["quality"]["400"] == 1.0


def test_kernel_tuner_pays_for_failures_too(tmp_path):
    pytest.importorskip("kernel_tuner")
    import tempfile

    f, data, problem = _setup(tmp_path)
    d = tempfile.mkdtemp(dir=tmp_path)
    search._KT_CACHES[problem.path] = search.write_kt_cache(problem, d)
    n_space = len(data["cache"])
    for strategy in ("random_sample", "greedy_ils"):
        r = search.run_task((problem.path, f"kt:{strategy}", 1, n_space))
        assert "error" not in r, r
        # tune_cache alone never proposes a recorded failure; with them in its space it pays for them
        assert r["n_failed"] > 0, (strategy, r)
        assert r["n"] <= n_space


def test_short_run_writes_the_json_schema(tmp_path, capsys, monkeypatch):
    f = tmp_path / "toy.json.gz"
    write_cache(f, gz=True)
    out = tmp_path / "out.json"
    methods = ["local", "random"]
    try:
        import kernel_tuner  # noqa: F401

        methods.append("kt:greedy_ils")
    except ImportError:
        pass
    runs = tmp_path / "runs.jsonl"
    argv = ["--replay", str(f), "--seeds", "2", "--cap", "60", "--methods", ",".join(methods), "--workers", "1",
            "--json", str(out), "--runs", str(runs)]
    assert search.main(argv) == 0
    text = capsys.readouterr().out
    assert "toy.json.gz" in text and "target:" in text
    res = json.loads(out.read_text())
    assert list(res) == ["toy.json.gz"] and sorted(res["toy.json.gz"]) == sorted(methods)
    for s in res["toy.json.gz"].values():
        assert s["seeds"] == 2 and 0 <= s["reached_1"] <= 2 and s["policy_s_per_round"] >= 0
        assert s["policy_s_per_round_max"] >= s["policy_s_per_round"]
        for k in ("evals_to_5_q", "evals_to_1_q"):
            assert len(s[k]) == 3
        # every method at the sweep's counts (8 to 64 proposals after the start config) and at the fixed budgets
        keys = ["8", "16", "24", "32", "50", "64", "100", "200", "400"]
        assert sorted(s["quality"], key=int) == keys == list(search.QUALITY_KEYS)
        qs = [s["quality"][b] for b in keys]
        assert all(q >= 1.0 for q in qs) and qs == sorted(qs, reverse=True)  # best so far never worsens
        for k in keys:  # the worst seed and the mean beside the median
            assert s["quality_max"][k] >= s["quality_p90"][k] >= 1.0 and s["quality_max_seed"][k] in (0, 1)
            assert s["quality_max"][k] >= s["quality_mean"][k] >= 1.0
        for k in ("evals_to_5", "evals_to_1"):
            assert s[k] is None or 1 <= s[k] <= 60
    # the local policy's forecasts are scored against the measured speedups
    assert 0.0 <= res["toy.json.gz"]["local"]["forecast_coverage_80"] <= 1.0
    assert res["toy.json.gz"]["local"]["forecast_abs_log_err"] >= 0.0
    assert "evals to 5%:" in text and "local forecasts:" in text
    assert "q@8" in text and "q@64" in text and "worst case over the files" in text and "local: @16 mean" in text
    # a rerun with the same runs file reuses every run and reports the same figures
    first = out.read_text()
    assert search.main(argv) == 0
    assert f"reused {2 * len(methods)} runs" in capsys.readouterr().out and out.read_text() == first
    # a run made under other versions of the libraries that draw its random numbers is run again, not reused
    stamps = {m: search.method_stamp(m) for m in methods}
    assert "numpy" in stamps["local"] and "optuna" in stamps["local"]
    if "kt:greedy_ils" in methods:
        assert all(d in stamps["kt:greedy_ils"] for d in ("kernel_tuner", "numpy", "scipy", "scikit-learn"))
    real = search.dist_version
    monkeypatch.setattr(search, "dist_version", lambda d: "0.0-other" if d == "numpy" else real(d))
    assert search.main(argv) == 0
    assert f"reused 0 runs from {runs}; {2 * len(methods)} to run" in capsys.readouterr().out
    # rounds of another size (--per-round): the local runs are not the rounds-of-8 runs, so none is reused
    monkeypatch.setattr(search, "dist_version", real)
    assert search.main(argv + ["--per-round", "12", "--methods", "local"]) == 0
    text = capsys.readouterr().out
    assert "12 proposals/round" in text and f"reused 0 runs from {runs}; 2 to run" in text
    monkeypatch.setattr(search, "N_PER_ROUND", 8)


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

    def row(cfg, value, rnd, vid):
        m = Measurement(shape="64x64x64", samples_ms=[value], p20_ms=value, p50_ms=value, p80_ms=value, tflops=1,
                        gbps=1, evidence="replay", device="x", torch_version="n/a", triton_version="n/a")
        return VariantResult(variant_id=vid, round=rnd, source="local", config=cfg, config_hash=config_hash(cfg),
                             measurements=[m], evidence="replay", backend="replay")

    history = [row(base, latency(base), 0, "baseline")]
    for rnd in range(1, 4):
        ctx = AgentContext(spec=spec, family=fam, round=rnd, n=4, history=history,
                           objective={r.config_hash: r.measurements[0].p50_ms for r in history},
                           profile_summary="", failures=[])
        p = LocalPolicy(seed=1).propose(ctx)
        assert len(p.suggestions) == 4 and not p.dropped
        assert all(space.check(s.config) is None for s in p.suggestions)
        history += [row(s.config, latency(s.config), rnd, s.variant_id) for s in p.suggestions]
    hashes = [r.config_hash for r in history]
    assert len(hashes) == len(set(hashes))
    best = min(history, key=lambda r: r.measurements[0].p50_ms)
    assert best.variant_id != "baseline" and p.suggestions[0].parent != "baseline"
    assert best.measurements[0].p50_ms < latency(base) - 2


# --- bench/synth_spaces.py: synthetic recorded spaces in Kernel Tuner's cache format
_sspec = importlib.util.spec_from_file_location("synth_spaces_bench", Path(__file__).resolve().parents[1] / "bench" / "synth_spaces.py")
synth = importlib.util.module_from_spec(_sspec)
_sspec.loader.exec_module(synth)


def _medians(doc):
    return {k: float(np.median(r["times"])) for k, r in doc["cache"].items() if "times" in r}


def test_synthetic_spaces_are_reproducible_and_read_like_recorded_files(tmp_path):
    from kregress.core.recorded import ReplayTable

    a = synth.write_space(tmp_path / "a", "threeway", "small", seed=3)
    b = synth.write_space(tmp_path / "b", "threeway", "small", seed=3)
    c = synth.write_space(tmp_path / "c", "threeway", "small", seed=4)
    assert a.read_bytes() == b.read_bytes() != c.read_bytes()  # seeded: the same seed, the same bytes
    table = ReplayTable.load(a)
    assert len(table) == len(json.loads(gzip.decompress(a.read_bytes()))["cache"]) > 1000
    assert table.runs_per_config == 32 and table.best().ok
    # the small and medium sizes differ, and the generator keeps a file already there
    assert len(synth.generate_space("lone", "medium", 0)["cache"]) > 3 * len(table)
    assert synth.generate(tmp_path / "a", kinds=("threeway",), sizes=("small",), seed=3) == [a]


def test_each_kind_plants_what_it_says():
    def gap(doc):
        v = sorted(_medians(doc).values())
        return v[0], v

    # lone: the optimum and a tight group of at most four; the rest at least ~1.1x (the basin) / 1.19x (plateau)
    lone = synth.generate_space("lone", "small", 0)
    best, v = gap(lone)
    assert sum(x <= 1.03 * best for x in v) <= 4 and sum(x <= 1.08 * best for x in v) <= 4
    med = _medians(lone)
    keys = lone["tune_params_keys"]
    opt = min(med, key=med.get).split(",")
    far = [k for k, x in med.items() if sum(a != b for a, b in zip(k.split(","), opt)) >= 2]
    assert min(med[k] for k in far) >= 1.15 * best  # away from the optimum's own basin: the plateau
    # three-way: the cell holds the optimum; configs with two of its three values are no better than the plateau
    import itertools

    tw = synth.generate_space("threeway", "medium", 0)
    med = _medians(tw)
    rows = {tuple(k.split(",")): x for k, x in med.items()}
    opt = min(rows, key=rows.get)
    best = rows[opt]
    planted = []
    for trio in itertools.combinations(range(len(opt)), 3):
        match = {k: sum(k[j] == opt[j] for j in trio) for k in rows}
        outside = min(x for k, x in rows.items() if match[k] < 3)
        if abs(outside / best - synth.PLATEAU) < 0.01:  # the best config outside the cell: the plateau, 1.19x
            two = min(x for k, x in rows.items() if match[k] == 2)
            planted.append((trio, two / best))
    assert planted and all(two >= synth.PLATEAU * 0.99 for _, two in planted), planted
    # edge: about a third fails; the optimum has a failing one-change neighbour
    edge = synth.generate_space("edge", "medium", 0)
    fails = {k for k, r in edge["cache"].items() if isinstance(r["time"], str)}
    assert 0.2 < len(fails) / len(edge["cache"]) < 0.5
    assert {r["time"] for k, r in edge["cache"].items() if k in fails} == {"RuntimeFailedConfig", "CompilationFailedConfig"}
    med = _medians(edge)
    opt = min(med, key=med.get).split(",")
    assert any(sum(a != b for a, b in zip(k.split(","), opt)) == 1 for k in fails)
    # flaky: ~15% fail, at about that rate for every value of every tunable (not where the parameters say)
    flaky = synth.generate_space("flaky", "medium", 0)
    rows = [(k.split(","), isinstance(r["time"], str)) for k, r in flaky["cache"].items()]
    assert abs(sum(f for _, f in rows) / len(rows) - synth.FLAKY_RATE) < 0.03
    for j, name in enumerate(flaky["tune_params_keys"]):
        for val in flaky["tune_params"][name]:
            sub = [f for k, f in rows if k[j] == str(val)]
            if len(sub) >= 300:
                assert abs(sum(sub) / len(sub) - synth.FLAKY_RATE) < 0.06, (name, val)
    # noisy: ten runs each, widely spread
    noisy = synth.generate_space("noisy", "small", 0)
    spread = [np.std(np.log(r["times"])) for r in noisy["cache"].values()]
    assert all(len(r["times"]) == 10 for r in noisy["cache"].values()) and np.median(spread) > 0.08
    assert keys and all(k in lone["tune_params"] for k in keys)


def test_search_bench_runs_on_generated_synthetic_spaces(tmp_path, capsys):
    out = tmp_path / "s.json"
    argv = ["--replay", str(synth.write_space(tmp_path / "spaces", "flaky", "small", 0)), "--synthetic",
            str(tmp_path / "spaces"), "--synthetic-sizes", "small", "--seeds", "1", "--cap", "24", "--methods",
            "local,random", "--workers", "1", "--json", str(out)]
    assert search.main(argv) == 0
    res = json.loads(out.read_text())
    assert sorted(res) == sorted(synth.file_name(k, "small", 0) for k in synth.KINDS)
    assert all(sorted(v) == ["local", "random"] for v in res.values())


# --- the development set (issue 34): shipped files, a fixed seeded split, the held-back spaces kept out
def test_the_dev_set_split_is_fixed_a_third_test_by_kernel_and_gpu_and_holds_none_of_the_held_back_spaces():
    train, test = search.dev_split()
    names = {p.name for p in train + test}
    assert len(names) >= 20 and (search.DEV_DIR / "LICENSE").is_file()
    assert len(test) * 3 >= len(train) + len(test) + search.N_SHARED  # a third of all spaces, the shared four too
    groups = {split: {search.dev_group(p) for p in files} for split, files in (("train", train), ("test", test))}
    assert not groups["train"] & groups["test"]  # one kernel on one GPU never straddles the split
    assert not groups["test"] & search.SHARED_GROUPS  # what the policy was developed on is train
    assert {p.name for p in test} == {  # fixed by SPLIT_SEED before any tuning on the set
        "convolution_RTX_2080_Ti.json.gz", "convolution_RTX_3090.json.gz", "convolution_milo_W7800.json.gz",
        "dedispersion_milo_A6000.json.gz", "dedispersion_milo_MI250X.json.gz", "ktt_convolution_RTX_2080_Ti.json.gz",
        "ktt_convolution_RTX_3090.json.gz", "ktt_pnpoly_RTX_2080_Ti.json.gz", "pnpoly_RTX_2080_Ti.json.gz",
        "pnpoly_RTX_2080_Ti_2.json.gz", "pnpoly_RTX_Titan.json.gz"}
    held_back = {("convolution", "W6600"), ("convolution", "A100"), ("convolution", "MI250X"),
                 ("dedispersion", "W6600"), ("gemm", "2080 Ti"), ("gemm", "TITAN RTX")}
    for p in train + test:
        kernel, device = search.dev_group(p)
        assert not any(kernel == k and gpu in device for k, gpu in held_back), p.name
        source = json.loads(gzip.decompress(p.read_bytes()))["kregress_source"]
        assert source["repository"] == "AutoTuningAssociation/benchmark_hub" and len(source["sha256"]) == 64


def test_every_seed_figures_are_geometric_means_over_seeds_then_spaces_against_the_best_kt():
    """summarize's geometric means (a run that never reached 5% counts UNREACHED) and the split report's line:
    per space ours over the best Kernel Tuner strategy's, then the geometric mean over the split's spaces."""
    def runs(evals5, q100):
        return [{"evals": [e, None], "quality": {str(b): q for b in search.BUDGETS}, "policy_s_per_round": 0.0,
                 "policy_s_per_round_max": 0.0, "n": 400, "n_failed": 0} for e, q in zip(evals5, q100)]
    ours = search.summarize(runs([10, 40, None], [1.0, 1.1, 1.21]))
    assert ours["geo_evals_to_5"] == pytest.approx((10 * 40 * search.UNREACHED) ** (1 / 3))
    assert ours["geo_quality_100"] == pytest.approx(1.1)
    assert ours["evals_to_5"] == 40  # the median, unchanged
    kt_a = search.summarize(runs([20, 20, 20], [1.2, 1.2, 1.2]))
    kt_b = search.summarize(runs([5, 80, 80], [1.0, 1.0, 1.331]))  # geo 31.7 and 1.1
    other = search.summarize(runs([8, 8, 8], [1.05, 1.05, 1.05]))
    kt_c = search.summarize(runs([16, 16, 16], [1.05, 1.05, 1.05]))
    out = {"s1": {"local": ours, "kt:a": kt_a, "kt:b": kt_b}, "s2": {"local": other, "kt:c": kt_c}}
    line = next(x for x in search.split_report(out, {"s1": "test", "s2": "test"}) if "every seed counted" in x)
    r5 = math.exp((math.log(ours["geo_evals_to_5"] / 20) + math.log(8 / 16)) / 2)
    assert f"evaluations to 5% {r5:.3f} (2 spaces)" in line
    assert f"best/optimum at 100 {math.exp((math.log(1.1 / 1.1) + 0) / 2):.4f} (2 spaces)" in line
    # a space where nothing ran by 100 (best/optimum inf) for every KT strategy drops out of that figure only
    with np.errstate(invalid="ignore"):  # the 90th-percentile seed of three infs
        out["s3"] = {"local": other, "kt:d": search.summarize(runs([30, 30, 30], [math.inf] * 3))}
    line = next(x for x in search.split_report(out, {"s1": "test", "s2": "test", "s3": "test"})
                if "every seed counted" in x)
    assert "(3 spaces)" in line and "1.0000 (2 spaces)" in line


def test_variants_report_gives_each_local_method_its_split_figures():
    """With the default and its variants in one run, each gets a row per split with the figures of its own split
    table: spaces meeting every target, the worst space, and the every-seed ratios; one local method, no table."""
    def runs(evals5, q):
        return [{"evals": [e, None], "quality": {str(b): q for b in search.BUDGETS}, "policy_s_per_round": 0.0,
                 "policy_s_per_round_max": 0.0, "n": 400, "n_failed": 0} for e in evals5]
    kt = search.summarize(runs([20, 20, 20], 1.01))
    good, slow = search.summarize(runs([10, 10, 10], 1.0)), search.summarize(runs([40, 40, 40], 1.03))
    out = {"a": {"local": good, "local:local-switch": slow, "kt:x": kt},
           "b": {"local": good, "local:local-switch": good, "kt:x": kt}}
    split_of = {"a": "train", "b": "test"}
    assert search.variants_report(out, split_of, ["local", "kt:x"]) == []
    rows = [x for x in search.variants_report(out, split_of, ["local", "local:local-switch", "kt:x"]) if x.startswith("| local")]
    assert rows == ["| local | train | 1 of 1 | 1.000 | 1.000 | 1.000 | 0.500 | 0.9901 |",
                    "| local | test | 1 of 1 | 1.000 | 1.000 | 1.000 | 0.500 | 0.9901 |",
                    "| local:local-switch | train | 0 of 1 | 1.030 | 1.030 | 1.030 | 2.000 | 1.0198 |",
                    "| local:local-switch | test | 1 of 1 | 1.000 | 1.000 | 1.000 | 0.500 | 0.9901 |"]
    for m in ("local", "local:local-switch"):  # the same figures as the method's own split table
        table = "\n".join(search.split_report(out, split_of, m))
        assert f"all targets met on {rows[0 if m == 'local' else 2].split(' | ')[2]}" in table


def test_without_kernel_tuner_runs_the_targets_are_not_judged_rather_than_missed():
    """The targets are against Kernel Tuner's strategies: a run of local methods alone (no bench extra installed,
    or no kt: method asked for) says the targets were not judged and how to judge them, never "met on 0 of N";
    a split where only some spaces have Kernel Tuner runs counts the judged ones and says how many were not."""
    def runs(q):
        return [{"evals": [10, None], "quality": {str(b): q for b in search.BUDGETS}, "policy_s_per_round": 0.0,
                 "policy_s_per_round_max": 0.0, "n": 400, "n_failed": 0}]
    good = search.summarize(runs(1.0))
    out = {"a": {"local": good, "local:local-switch": good}, "b": {"local": good, "local:local-switch": good}}
    split_of = {"a": "test", "b": "test"}
    report = "\n".join(search.split_report(out, split_of))
    assert "all targets met on not judged (no Kernel Tuner runs)" in report and "0 of 2" not in report
    assert "kt:genetic_algorithm" in report and ".[bench]" in report  # how to judge them
    rows = [x for x in search.variants_report(out, split_of, ["local", "local:local-switch"]) if x.startswith("| local")]
    assert rows and all("| not judged (no Kernel Tuner runs) |" in r for r in rows)
    lines = search.check_targets(out["a"])
    assert lines[0] == "within 2% at 400: local 1.000: yes" and "not judged" in lines[1]
    out["a"]["kt:x"] = search.summarize(runs(1.01))  # one space judged, one not
    report = "\n".join(search.split_report(out, split_of))
    assert "all targets met on 1 of the 1 judged (1 without Kernel Tuner runs)" in report


def test_runs_are_stored_under_the_code_read_before_they_ran(tmp_path, monkeypatch):
    """The policy's sources are stamped once, before anything runs: a source edited while the benchmark runs
    (the next variant being written) must not label the runs made by the code before the edit."""
    f = tmp_path / "toy.json.gz"
    write_cache(f, gz=True)
    runs = tmp_path / "runs.jsonl"
    calls = []

    def stamp(method):  # a different stamp on every read, as if the sources changed between reads
        calls.append(method)
        return f"code-{len(calls)}"

    monkeypatch.setattr(search, "method_stamp", stamp)
    argv = ["--replay", str(f), "--seeds", "2", "--cap", "30", "--methods", "local,random", "--workers", "1",
            "--runs", str(runs)]
    assert search.main(argv) == 0
    keys = [json.loads(line)["key"] for line in runs.read_text().splitlines()]
    assert len(keys) == 4 and calls == ["local", "random"]
    assert {json.loads(k)[2] for k in keys} == {"code-1", "code-2"}


def test_first_seed_runs_fresh_seeds_and_reuses_them_later(tmp_path, capsys):
    """--first-seed K runs seeds K..K+N-1 (a choice made on seeds 0..N-1 is checked on seeds it never saw); a
    later run over 0..K+N-1 reuses them and runs only the others."""
    f = tmp_path / "toy.json.gz"
    write_cache(f, gz=True)
    runs = tmp_path / "runs.jsonl"
    base = ["--replay", str(f), "--cap", "30", "--methods", "random", "--workers", "1", "--runs", str(runs)]
    assert search.main(base + ["--seeds", "2", "--first-seed", "3"]) == 0
    assert "seeds 3..4," in capsys.readouterr().out
    assert sorted(json.loads(line)["seed"] for line in runs.read_text().splitlines()) == [3, 4]
    assert search.main(base + ["--seeds", "5"]) == 0
    out = capsys.readouterr().out
    assert "reused 2 runs" in out and "3 to run" in out
    assert sorted(json.loads(line)["seed"] for line in runs.read_text().splitlines()) == [0, 1, 2, 3, 4]
    with pytest.raises(SystemExit):
        search.main(base + ["--seeds", "2", "--first-seed", "-1"])
    # lines that are not runs (a line cut short by a killed run, a stray value) are skipped and counted
    with runs.open("a") as fh:
        fh.write('{"file": "x", "key": \n123\n[1, 2]\n')
    assert search.main(base + ["--seeds", "5", "--report-only"]) == 0
    out = capsys.readouterr().out
    assert "reused 5 runs" in out and "3 line(s) there are not runs" in out


def test_local_stamp_covers_every_member_module(tmp_path, monkeypatch):
    """A run of the local policy is stored under every module of kernel_assets/agent: a member added in a new
    module (the portfolio imports it) makes the earlier runs stale, as an edit to an existing one does."""
    agent = tmp_path / "kernel_assets" / "agent"
    agent.mkdir(parents=True)
    (agent / "local.py").write_text("x = 1\n")
    monkeypatch.setattr(search, "_ROOT", tmp_path)
    first = search.method_stamp("local")
    (agent / "newmember.py").write_text("y = 2\n")
    second = search.method_stamp("local")
    (agent / "local.py").write_text("x = 3\n")
    assert len({first, second, search.method_stamp("local:local+ga")}) == 3
    (agent / "empty.py").write_text("")  # a module with no text, or text moved from one module to the next
    (agent / "local.py").write_text("x = ")
    (agent / "newmember.py").write_text("3\ny = 2\n")
    assert search.method_stamp("local") not in {first, second}
    fourth = search.method_stamp("local")
    (agent / "empty.py").unlink()
    assert search.method_stamp("local") != fourth


def test_variant_methods_name_known_members_and_knobs():
    """A typo in a variant's member or knob is an error naming it, not the default run under the variant's label."""
    policy = search.make_policy("local:local+ga+ps-start_cover-standing", 0)
    assert policy.members == ("local", "ga", "ps") and policy.local.ablate == {"start_cover", "standing"}
    with pytest.raises(ValueError, match="unknown member pss"):
        search.make_policy("local:local+ga+pss-start_cover-standing", 0)
    with pytest.raises(ValueError, match="unknown knob nope"):
        search.make_policy("local:local+ga-nope", 0)


def test_the_command_line_refuses_what_no_run_could_use(tmp_path, capsys):
    """A typo in a method, or --runs naming a folder or a file in a missing folder, stops the bench before any
    run, with the option and the fix named (it used to fail every run, or raise IsADirectoryError at the end)."""
    space = str(search.DEV_DIR / "pnpoly_RTX_Titan.json.gz")
    cases = [(["--methods", "local:local+pss"], "unknown member pss"), (["--methods", "local:local-nope"], "unknown knob nope"),
             (["--runs", str(tmp_path)], "give a file"), (["--runs", str(tmp_path / "no" / "r.jsonl")], "give a file")]
    try:
        import kernel_tuner  # noqa: F401
        cases.append((["--methods", "local,kt:psoo"], "kt:psoo: not a Kernel Tuner strategy"))
    except ImportError:
        pass
    for extra, says in cases:
        with pytest.raises(SystemExit):
            search.main(["--replay", space, "--seeds", "1", "--methods", "local", *extra])
        err = capsys.readouterr().err
        assert says in err and ("--methods" in err or "--runs" in err)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("seed", range(6))
def test_protocol_odds_apply_the_split_tables_targets_to_drawn_seeds(seed):
    """protocol_odds draws k of each method's seeds and applies the split table's targets to the medians. Drawing
    every seed gives each space exactly the table's verdict (random figures, runs that never got to 5% among them,
    so the censored medians are checked too); a method better on every figure meets every draw; a space where a
    method has fewer than k seeds is left out."""
    rng = np.random.default_rng(seed)
    n = 7 + seed % 4

    def runs(name, method, k=n, scale=1.0):
        out = []
        for s in range(k):
            e5 = None if rng.random() < 0.3 else int(rng.integers(2, 60) * scale)
            q100 = 1.0 + scale * float(rng.exponential(0.03))
            out.append({"file": f"/x/{name}", "method": method, "seed": s, "evals": [e5, None], "n": 400, "n_failed": 0,
                        "quality": {**{k: q100 * 1.2 for k in ("8", "16", "24", "32", "64")}, "50": q100 * 1.1,
                                    "100": q100, "200": q100, "400": 1.0 + (q100 - 1.0) / 3},
                        "policy_s_per_round": 0.0, "policy_s_per_round_max": 0.0})
        return out

    names = [f"s{i}.json.gz" for i in range(4)]
    results = [r for nm in names for m in ("local", "kt:a", "kt:b") for r in runs(nm, m)]
    split_of = {nm: ("train" if i < 2 else "test") for i, nm in enumerate(names)}
    odds = search.protocol_odds(results, split_of, "local", n, draws=50, seed=seed, replace=False)
    out_json = {nm: {m: search.summarize([r for r in results if r["file"].endswith(nm) and r["method"] == m])
                     for m in ("local", "kt:a", "kt:b")} for nm in names}
    for split in ("train", "test"):
        f = search.split_figures(out_json, split_of, "local", split)
        verdict = {row.split(" | ")[0][2:]: row.endswith("| met |") for row in f["rows"]}
        assert {nm.removesuffix(".json.gz"): p for nm, p in odds[split]["spaces"].items()} == {
            k: float(v) for k, v in verdict.items()}
        assert odds[split]["all"] == float(all(verdict.values()))
    # a bootstrap of fewer seeds: a chance between 0 and 1, every space at once at most as often as the least likely
    # one, the expected number met the sum of the chances
    part = search.protocol_odds(results, split_of, "local", n - 3, draws=200, seed=seed)
    for f in part.values():
        assert all(0.0 <= p <= 1.0 for p in f["spaces"].values()) and f["all"] <= min(f["spaces"].values()) + 1e-12
        assert f["expected_met"] == pytest.approx(sum(f["spaces"].values())) and not f["left_out"]
    # a Kernel Tuner method held to the same targets gets its odds too (itself drawn again among the best)
    assert set(search.protocol_odds(results, split_of, "kt:a", n - 3, draws=20)["test"]["spaces"]) == set(names[2:])
    # a method ahead on every figure (fewer evaluations, closer to the optimum) meets every draw
    best = [dict(r, method="local:best", evals=[1, None], quality={b: 1.0 for b in r["quality"]})
            for r in results if r["method"] == "local"]
    sure = search.protocol_odds(results + best, split_of, "local:best", n - 3, draws=100, seed=seed)
    assert all(f["all"] == 1.0 for f in sure.values())
    # a space where ours has fewer seeds than k is left out
    short = [r for r in results if not (r["file"].endswith(names[0]) and r["method"] == "local" and r["seed"] >= 2)]
    got = search.protocol_odds(short, split_of, "local", 3, draws=10)["train"]
    assert names[0] not in got["spaces"] and any(x.startswith(names[0]) for x in got["left_out"])
    # a Kernel Tuner method short of seeds on a space is left out there, and said
    short_kt = [r for r in results if not (r["file"].endswith(names[1]) and r["method"] == "kt:b" and r["seed"] >= 2)]
    got = search.protocol_odds(short_kt, split_of, "local", 3, draws=10)["train"]
    assert names[1] in got["spaces"] and got["left_out"] == [f"{names[1]}: kt:b (2 runs)"]
    lines = "\n".join(search.odds_report({"local": {"train": got}}, 3))
    assert "left out: s1.json.gz: kt:b (2 runs)" in lines and "| space | local |" in lines
    alone = search.protocol_odds([r for r in results if r["method"] == "local"], split_of, "local", 3, draws=10)
    assert not alone["train"]["spaces"] and "no space has the runs for odds" in "\n".join(
        search.odds_report({"local": alone}, 3))
    # several methods: one table per split, a column each (ours first), its chances in its column; a space a
    # method has no odds for is a dash, and each method's line for the split follows
    both = {"local": part, "kt:a": search.protocol_odds(results, split_of, "kt:a", n - 3, draws=20)}
    both["kt:a"]["test"]["spaces"].pop(names[3])
    text = search.odds_report(both, n - 3)
    for split in ("train", "test"):
        at = text.index(next(x for x in text if x.startswith(f"### {split}:")))
        assert text[at + 2] == "| space | local | kt:a |"
        rows = {r.split(" | ")[0][2:]: r.split(" | ")[1:] for r in text[at + 4:] if r.startswith("| s")}
        for nm in names[:2] if split == "train" else names[2:]:
            got_l, got_k = rows[nm.removesuffix(".json.gz")]
            assert got_l == f"{part[split]['spaces'][nm]:.0%}"
            want_k = both["kt:a"][split]["spaces"].get(nm)
            assert got_k.rstrip(" |") == ("-" if want_k is None else f"{want_k:.0%}")
        assert any(x.startswith(f"{split}, kt:a, {n - 3} seeds:") for x in text)


def test_odds_needs_the_dev_set_and_more_seeds_than_it_draws(capsys):
    for argv in (["--odds", "10", "--seeds", "10", "--dev", "test"], ["--odds", "5", "--seeds", "10"],
                 ["--odds", "0", "--seeds", "10", "--dev", "test"],
                 ["--odds", "3", "--seeds", "10", "--dev", "test", "--methods", "local"]):
        with pytest.raises(SystemExit):
            search.main(argv)
        assert "--odds" in capsys.readouterr().err


def test_ctrl_c_keeps_the_finished_runs_says_so_and_the_same_command_resumes(tmp_path):
    """SIGINT in the middle of a benchmark: exit 130 with one line naming what is kept and how to go on (no
    traceback); the rerun reuses every kept run and runs only the rest."""
    import signal
    import subprocess
    import time

    runs = tmp_path / "runs.jsonl"
    cmd = [sys.executable, str(Path(search.__file__)), "--replay", str(search.DEV_DIR / "pnpoly_RTX_Titan.json.gz"),
           "--seeds", "40", "--cap", "400", "--methods", "local", "--workers", "1", "--runs", str(runs)]
    # SIGINT as a terminal sends it: a test run in the background (a non-interactive shell's `&`) inherits SIGINT
    # ignored, and Python then leaves it ignored; the child restores the default first
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (not runs.exists() or not runs.read_text().count("\n")):
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    kept = runs.read_text().count("\n")
    assert proc.returncode == 130, (out, err)
    assert "Traceback" not in err and f"{kept} more finished runs kept in {runs} ({kept} there in all)" in err, err
    assert 1 <= kept < 40
    done = subprocess.run(cmd[:cmd.index("--seeds") + 1] + [str(kept + 1)] + cmd[cmd.index("--seeds") + 2:],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"reused {kept} runs from {runs}; 1 to run" in done.stdout
