"""Search-efficiency benchmark on a real, brute-forced search space (recorded GPU runs).

How many evaluations does a search need to get within 5% and within 1% of the best configuration of
the CLBlast Xgemm SGEMM space measured on an RTX 3090 (``../shared/data/replay/``, read through
``kregress.core.recorded.ReplayTable``: 17,956 valid configurations out of 82,944 Cartesian points)? Side by
side, in one run, over the same seeds:

* local             our embedded-default policy (``kernel_assets.agent.local.LocalPolicy``) on the
                    ``replay`` family and ``specs/replay_clblast_rtx3090.yaml``, round after round with
                    n=8 proposals a round, called as the sweep calls it: an ``AgentContext`` whose history
                    holds every row measured so far (the start config is the baseline, round 0), each
                    row built from ``family.replay`` as the replay backend builds it (recorded runs, no
                    compile stats), and whose objective maps each row to its value;
* random            uniform sampling without replacement from the valid configurations;
* random (exact)    the same sampler's distribution computed exactly (no seeds, no cap): the
                    reference for "at most a fifth of random sampling's";
* kt:<strategy>     Kernel Tuner's own strategies in its simulation mode (``kernel_tuner.tune_cache``:
                    tune parameters, problem size and restrictions inferred from the cache file, every
                    evaluation answered from the recorded cache), budget ``strategy_options
                    {"max_fevals": cap}``, seeded through ``random.seed``/``numpy.random.seed`` (what its
                    strategies draw from), ``seed=`` (what its pymoo strategies read) and a seeded
                    generator for scipy's LatinHypercube, which Kernel Tuner creates unseeded (diff_evo,
                    bayes_opt): a rerun reproduces every number.

What is counted, the same way for every method:

* Objective: the median of each configuration's 32 recorded runs (``--objective median``, the default:
  the sweep's objective is latency p50, so this is exactly the number the local policy is given), or
  the recorded mean ``time`` (``--objective mean``). Kernel Tuner reads ``time`` from its cache, so the
  temporary copy handed to it carries the chosen value as ``time``: every method optimises and is
  scored on the same number. The targets are 1.05x and 1.01x of the best value (on this file 6
  configurations are within 5% and only the optimum itself is within 1%, under either objective).
* Evaluation 1 is the fixed start config: the baseline of ``specs/replay_clblast_rtx3090.yaml``, the
  configuration of median recorded time (2.6x slower than the best; with ``--replay``, the config of
  median value of that file), the same for every seed and method. It
  is the baseline of the local policy and ``x0`` of the Kernel Tuner strategies that take one; for the
  methods that cannot (random, kt:random_sample, kt:bayes_opt) it is counted as evaluation 1 before
  their own choices, as if the baseline had been measured first.
* An evaluation is a distinct configuration that has a record, i.e. one that would be compiled and run
  on the GPU. A repeat of an already measured configuration is served from the cache and costs nothing
  (Kernel Tuner's own ``max_fevals`` accounting); a point outside the space (absent from the cache:
  ruled out by the kernel's restrictions, which are checked before any compile) is rejected without a
  run and costs nothing, for every method (the local policy never proposes one). This file has no
  failed records, so no evaluation fails; one that did would count (it was run).
* Within a round of the local policy the proposals are counted in the order proposed (a sweep runs
  all 8; the count stops at the first that reaches the target, as within Kernel Tuner's batches).
* A run stops once it has evaluated a configuration within 1% (the optimum), or at ``--cap``
  evaluations. For Kernel Tuner the stop is its own budget, shrunk to the evaluations spent as soon as
  the simulation runner serves that configuration: what came before is unchanged, the rest would not
  change the counts. A run that does not reach a target within the cap is censored: it enters the
  quartiles as "more than cap" (shown ``>cap``), and the "reached" column says how many runs did.

Ratios: "ours/x" is the local policy's median divided by method x's (below 1: fewer evaluations;
``<r`` when x's median is censored, i.e. the ratio is at most r).

Run (default: 20 seeds, cap 2000, local, random and 9 Kernel Tuner strategies on 2 worker processes;
about 5 minutes on 2 cores, half of it kt:bayes_opt)::

    .venv/bin/python bench/search.py
    .venv/bin/python bench/search.py --seeds 40 --cap 4000 --methods local,random,kt:pso

The ``kt:`` methods need the ``bench`` extra (``kernel_tuner``); without it they are reported as not run.
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")  # one thread per worker process: the workers are the parallelism

import argparse  # noqa: E402
import gzip  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import math  # noqa: E402
import multiprocessing as mp  # noqa: E402
import random  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from concurrent.futures import ProcessPoolExecutor  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

_ROOT = Path(__file__).resolve().parents[1]
if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path[0] = str(_ROOT)  # run as a script: import the project, not bench/ siblings
elif str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

import numpy as np  # noqa: E402

from kregress.core.recorded import ReplayTable  # noqa: E402

THRESHOLDS = (0.05, 0.01)
N_PER_ROUND = 8
SPEC_FILE = _ROOT / "specs" / "replay_clblast_rtx3090.yaml"
KT_DEFAULT = ("random_sample", "genetic_algorithm", "simulated_annealing", "pso", "greedy_ils",
              "firefly_algorithm", "diff_evo", "dual_annealing", "bayes_opt")
# Kernel Tuner strategies that take a start point (strategy_options x0); the others start where they like.
KT_TAKES_X0 = {"genetic_algorithm", "simulated_annealing", "pso", "greedy_ils", "firefly_algorithm", "diff_evo",
               "dual_annealing", "basinhopping", "mls", "greedy_mls", "ordered_greedy_mls", "minimize", "skopt"}
DEFAULT_METHODS = ("local", "random") + tuple(f"kt:{s}" for s in KT_DEFAULT)
SLOW_FIRST = ("kt:bayes_opt", "local")  # scheduled first so the pool stays busy to the end


# -------------------------------------------------------------------------------------------------
# The problem: a value per valid configuration, the start config, the targets.
@dataclass
class Problem:
    path: str
    objective: str  # "median" or "mean"
    keys: tuple[str, ...]  # tune_params_keys order
    values: dict[tuple[int, ...], float]  # config key -> objective (ms), every config with recorded runs
    start: tuple[int, ...]
    best: float

    def target(self, thr: float) -> float:
        return self.best * (1.0 + thr)

    def config(self, key: tuple[int, ...]) -> dict[str, int]:
        return dict(zip(self.keys, key))


def load_problem(path: str | None, objective: str, start: dict[str, int] | None = None) -> tuple[ReplayTable, Problem]:
    """The table and the problem; ``start`` defaults to the configuration of median value."""
    table = ReplayTable.load(path)
    values: dict[tuple[int, ...], float] = {}
    for rec in table.records():  # configs with recorded runs; a recorded failure has no value
        v = float(np.median(rec.times)) if objective == "median" else float(rec.time)
        values[table.key(rec.config)] = v
    order = sorted(values, key=lambda k: (values[k], k))
    start_key = table.key(start) if start is not None else order[len(order) // 2]
    if start_key not in values:
        raise ValueError(f"start config {start} has no recorded runs in {table.path}")
    return table, Problem(str(table.path), objective, table.tune_params_keys, values, start_key, values[order[0]])


def evals_to_targets(problem: Problem, seq: list[tuple[int, ...]]) -> list[int | None]:
    """1-based index of the first evaluation within each threshold, over the distinct evaluated
    configurations in order (start config first); None when not reached."""
    out: list[int | None] = []
    for thr in THRESHOLDS:
        tgt = problem.target(thr)
        out.append(next((i for i, k in enumerate(seq, start=1) if k in problem.values and problem.values[k] <= tgt), None))
    return out


def distinct_with_start(problem: Problem, keys: list[tuple[int, ...]], valid: set | None = None) -> list[tuple[int, ...]]:
    """The start config, then each configuration evaluated for the first time, in order; points with no
    record (outside the space: rejected before a run) are dropped."""
    valid = problem.values if valid is None else valid
    seen = {problem.start}
    seq = [problem.start]
    for k in keys:
        if k in seen or k not in valid:
            continue
        seen.add(k)
        seq.append(k)
    return seq


def exact_random(n_valid: int, n_good: int, qs=(0.25, 0.5, 0.75), cap: int | None = None) -> tuple[list[int], float]:
    """Evaluations (start config first, then uniform sampling without replacement from the other
    ``n_valid - 1`` configs, ``n_good`` of them good) until the first good one: the quantiles ``qs``,
    exactly, and the probability of a hit within ``cap`` evaluations."""
    n = n_valid - 1
    m = np.arange(n + 1)  # draws after the start config
    # P(no good one in the first m draws) = prod_{i<m} (n - n_good - i) / (n - i)
    factors = np.clip((n - n_good - m[:-1]) / (n - m[:-1]), 0.0, 1.0)
    survive = np.concatenate(([1.0], np.cumprod(factors)))
    cdf = 1.0 - survive
    quant = [int(np.searchsorted(cdf, q - 1e-12)) + 1 for q in qs]  # smallest m with P(T <= m) >= q, +1 start
    p_cap = float(cdf[min(cap - 1, n)]) if cap else 1.0
    return quant, p_cap


# -------------------------------------------------------------------------------------------------
# Methods. Each returns (distinct evaluated configs in order, start first; a note) for one seed.
_PROBLEM: Problem | None = None  # set in the parent before the workers fork
_KT_CACHE: str | None = None


def run_random(problem: Problem, seed: int, cap: int) -> tuple[list[tuple[int, ...]], str]:
    rng = np.random.default_rng(seed)
    pool = sorted(k for k in problem.values if k != problem.start)
    idx = rng.permutation(len(pool))[: max(0, cap - 1)]
    return [problem.start] + [pool[i] for i in idx], ""


def run_local(problem: Problem, seed: int, cap: int) -> tuple[list[tuple[int, ...]], str]:
    from kernel_assets.agent.base import AgentContext
    from kernel_assets.agent.local import LocalPolicy
    from kernel_assets.sweep import objective as sweep_objective
    from kregress.core.records import VariantResult, config_hash
    from kregress.core.family import get_family
    from kregress.core.spec import load_spec

    family = get_family("replay")
    spec = load_spec(SPEC_FILE)
    start_cfg = problem.config(problem.start)
    spec = spec.model_copy(update={"baseline": start_cfg, "search": spec.search.model_copy(update={"seed": seed})})

    def measure(vid: str, rnd: int, cfg: dict[str, int], parent: str | None) -> VariantResult:
        """One row as the replay backend builds it (resources/gpu.py): recorded runs, no compile."""
        row = VariantResult(variant_id=vid, round=rnd, source="local" if rnd else "baseline", config=cfg,
                            config_hash=config_hash(cfg), parent=parent, backend="replay")
        problem_text = family.space.check(cfg, spec.params, spec.hardware.limits)
        if problem_text:
            row.error, row.error_detail = "invalid_config", problem_text
            return row
        for shape in spec.shape_matrix:
            ms, error, detail = family.replay(cfg, shape, spec.params)
            if error:
                row.error, row.error_detail = error, detail
                return row
            row.measurements += ms
        row.evidence = "replay"
        return row

    def value(row: VariantResult) -> float | None:
        v = sweep_objective(row, spec)  # what the sweep hands the policy: p50 over the shape matrix
        if v is not None and problem.objective == "mean":
            v = problem.values[tuple(row.config[k] for k in problem.keys)]
        return v

    history = [measure("baseline", 0, start_cfg, None)]
    objective = {history[0].config_hash: value(history[0])}
    assert problem.objective != "median" or abs(objective[history[0].config_hash] - problem.values[problem.start]) < 1e-9
    seq = [problem.start]
    policy = LocalPolicy(seed=seed)
    stop_at = problem.target(min(THRESHOLDS))
    rnd = 0
    note = ""
    round_s: list[float] = []
    reached = False
    while len(seq) < cap and not reached:
        rnd += 1
        ctx = AgentContext(spec=spec, family=family, round=rnd, n=N_PER_ROUND, history=history,
                           objective=objective, profile_summary="", failures=[])
        t0 = time.perf_counter()
        prop = policy.propose(ctx)
        round_s.append(time.perf_counter() - t0)
        if not prop.suggestions:
            note = f"no proposals in round {rnd}: {'; '.join(prop.notes)}"
            break
        for s in prop.suggestions:
            key = tuple(s.config[k] for k in problem.keys)
            if key not in problem.values:
                raise AssertionError(f"local policy proposed a config outside the space: {s.config}")
            row = measure(s.variant_id, rnd, dict(s.config), s.parent)
            history.append(row)
            v = value(row)
            if v is not None:
                objective[row.config_hash] = v
            seq.append(key)
            if problem.values[key] <= stop_at:
                reached = True
            if reached or len(seq) >= cap:
                break
    if len(set(seq)) != len(seq):
        raise AssertionError("local policy proposed an already measured config")
    ms = 1e3 * np.asarray(round_s)
    note = note or f"{rnd} rounds, propose() {ms.mean():.0f} ms/round mean, {np.median(ms):.0f} median, {ms.max():.0f} max"
    return seq, note


def run_kt(problem: Problem, strategy: str, seed: int, cap: int) -> tuple[list[tuple[int, ...]], str]:
    from kernel_tuner import tune_cache
    from kernel_tuner.runners.simulation import SimulationRunner

    assert _KT_CACHE is not None
    served: list[tuple[int, ...]] = []  # every result the simulation runner served, in order
    stop_at = problem.target(min(THRESHOLDS))
    keys = problem.keys
    orig_run = SimulationRunner.run

    def run(self, parameter_space, tuning_options):
        results = orig_run(self, parameter_space, tuning_options)
        for r in results:
            if r and "__error__" not in r:
                k = tuple(int(r[p]) for p in keys)
                served.append(k)
                if problem.values.get(k, math.inf) <= stop_at:
                    budget = tuning_options.budget  # end the budget here: the rest cannot change the counts
                    budget.max_fevals = min(budget.max_fevals or budget.num_fevals, max(1, budget.num_fevals))
        return results

    # Kernel Tuner's strategies draw from `random` and `numpy.random` (seeded here), except scipy's
    # LatinHypercube (diff_evo's initial population, bayes_opt's initial samples), which it creates
    # without a seed, i.e. from fresh OS entropy: hand it a generator seeded from the run's seed.
    import scipy.stats.qmc as qmc

    lhs_rng = np.random.default_rng([seed, 0x1A5])
    orig_lhs = qmc.LatinHypercube

    class SeededLatinHypercube(orig_lhs):  # type: ignore[misc, valid-type]
        def __init__(self, d, **kwargs):
            if kwargs.get("rng") is None and kwargs.get("seed") is None:
                kwargs["rng"] = lhs_rng
            super().__init__(d, **kwargs)

    lhs_modules: list[Any] = [qmc]
    random.seed(seed)
    np.random.seed(seed)
    opts: dict[str, Any] = {}
    if strategy in KT_TAKES_X0:
        opts["x0"] = list(problem.start)
        opts["max_fevals"] = cap
    else:
        opts["max_fevals"] = cap - 1  # the start config is counted as evaluation 1 in front of it
    error = ""
    SimulationRunner.run = run
    if strategy == "bayes_opt":
        import kernel_tuner.strategies.bayes_opt as bo  # imports LatinHypercube by name

        lhs_modules.append(bo)
    for mod in lhs_modules:
        mod.LatinHypercube = SeededLatinHypercube
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tune_cache(_KT_CACHE, strategy=strategy, strategy_options=opts, quiet=True, verbose=False, seed=seed)
    except Exception as exc:  # counted up to where it failed, and said
        if not served:
            raise
        error = f"raised {type(exc).__name__}: {exc}"[:200]
    finally:
        SimulationRunner.run = orig_run
        for mod in lhs_modules:
            mod.LatinHypercube = orig_lhs
    seq = distinct_with_start(problem, served)[:cap]
    notes = []
    if strategy in KT_TAKES_X0 and served and served[0] != problem.start:
        notes.append("x0 not evaluated first")
    reached = evals_to_targets(problem, seq)[-1] is not None
    if not reached and len(set(served)) < opts["max_fevals"]:
        notes.append(f"ended by itself after {len(seq)} evals")
    if error:
        notes.append(error)
    return seq, "; ".join(notes)


def run_task(task: tuple[str, int, int]) -> dict[str, Any]:
    method, seed, cap = task
    problem = _PROBLEM
    assert problem is not None
    t0 = time.perf_counter()
    try:
        if method == "local":
            seq, note = run_local(problem, seed, cap)
        elif method == "random":
            seq, note = run_random(problem, seed, cap)
        elif method.startswith("kt:"):
            seq, note = run_kt(problem, method[3:], seed, cap)
        else:
            raise ValueError(f"unknown method {method!r}")
    except Exception as exc:  # a failed method is reported, not a lost benchmark
        return {"method": method, "seed": seed, "error": f"{type(exc).__name__}: {exc}"[:300],
                "wall": time.perf_counter() - t0}
    return {"method": method, "seed": seed, "evals": evals_to_targets(problem, seq), "n": len(seq), "note": note,
            "wall": time.perf_counter() - t0}


# -------------------------------------------------------------------------------------------------
# Kernel Tuner's cache: plain JSON in a temp dir (it reads only *.json), only the fields it uses,
# ``time`` set to the benchmark's objective value.
def write_kt_cache(problem: Problem, dest_dir: str) -> str:
    path = problem.path
    with gzip.open(path, "rb") if str(path).endswith(".gz") else open(path, "rb") as fh:
        data = json.load(fh)
    keep = set(data["tune_params_keys"]) | {"time", "compile_time", "verification_time", "benchmark_time"}
    cache = {}
    for key, rec in data["cache"].items():
        slim = {k: v for k, v in rec.items() if k in keep}
        k = tuple(int(x) for x in key.split(","))
        if k in problem.values:
            slim["time"] = problem.values[k]
        cache[key] = slim
    data["cache"] = cache
    out = os.path.join(dest_dir, "cache.json")
    with open(out, "w") as fh:
        json.dump(data, fh)
    return out


def kt_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("kernel_tuner")
    except Exception:
        return None


# -------------------------------------------------------------------------------------------------
# Summary
def quartiles(vals: list[int | None]) -> tuple[float, float, float]:
    """q1, median, q3, censored runs (None) as +inf ("more than cap"); order statistics (no
    interpolation) once any run is censored."""
    arr = np.array([math.inf if v is None else float(v) for v in vals])
    if not len(arr):
        return math.nan, math.nan, math.nan
    method = "lower" if np.isinf(arr).any() else "linear"
    q = np.quantile(arr, [0.25, 0.5, 0.75], method=method)
    return float(q[0]), float(q[1]), float(q[2])


def fmt_n(v: float, cap: int) -> str:
    if math.isnan(v):
        return "-"
    if math.isinf(v):
        return f">{cap}"
    return f"{v:.0f}" if abs(v - round(v)) < 1e-9 else f"{v:.1f}"


def fmt_q(q: tuple[float, float, float], cap: int) -> str:
    return f"{fmt_n(q[1], cap)} [{fmt_n(q[0], cap)}, {fmt_n(q[2], cap)}]"


def ratio(ours: float, theirs: float, cap: int) -> str:
    """ours / theirs of the medians; a censored median of theirs is only known to exceed the cap."""
    if math.isnan(ours) or math.isnan(theirs):
        return "-"
    if math.isinf(ours) and math.isinf(theirs):
        return "?"
    if math.isinf(ours):
        return f">{cap / theirs:.2f}"
    if math.isinf(theirs):
        return f"<{ours / cap:.2f}"
    return f"{ours / theirs:.2f}"


def evals_of(rows: list[dict[str, Any]], i: int) -> list[float]:
    return [math.inf if r["evals"][i] is None else float(r["evals"][i]) for r in rows if "evals" in r]


def p_fewer(a: list[float], b: list[float]) -> float:
    """P(X < Y) for X from a and Y from b over all pairs, ties (two misses included) counted half."""
    if not a or not b:
        return math.nan
    x = np.asarray(a)[:, None]
    y = np.asarray(b)[None, :]
    return float(np.mean((x < y) + 0.5 * (x == y)))


def main(argv: list[str] | None = None) -> int:
    global _PROBLEM, _KT_CACHE
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=20, help="seeds per method, 0..N-1 (default 20)")
    ap.add_argument("--cap", type=int, default=2000, help="evaluation cap per run, start config included (default 2000)")
    ap.add_argument("--methods", default=",".join(DEFAULT_METHODS),
                    help="comma list of local, random, kt:<strategy> (default: %(default)s)")
    ap.add_argument("--objective", choices=("median", "mean"), default="median",
                    help="per-config value: median of the 32 runs (the sweep's p50, default) or recorded mean `time`")
    ap.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--replay", default=None, help="Kernel Tuner cache file (default: the RTX 3090 GEMM file)")
    args = ap.parse_args(argv)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    logging.getLogger("kregress.agent").setLevel(logging.WARNING)
    if args.cap < 2:
        ap.error("--cap must be at least 2")
    if args.replay is not None and "local" in methods:
        ap.error("local runs on the replay family's default file; drop --replay or local")

    t_all = time.perf_counter()
    start = None
    if args.replay is None:  # the replay spec's baseline: the median-time config of the file (mean time)
        from kregress.core.spec import load_spec

        start = dict(load_spec(SPEC_FILE).baseline)
    table, problem = load_problem(args.replay, args.objective, start)
    _PROBLEM = problem
    best_key = min(problem.values, key=problem.values.get)
    n_good = {thr: sum(v <= problem.target(thr) for v in problem.values.values()) for thr in THRESHOLDS}
    print(f"space: {table.kernel_name} {table.shape_label} on {table.device_name}: {len(problem.values):,} configs with "
          f"recorded runs, {len(table.failures())} recorded failures ({problem.path})")
    print(f"objective: {'median of the 32 runs' if problem.objective == 'median' else 'recorded mean time'}; "
          f"best {problem.best:.4f} ms {problem.config(best_key)}")
    print(f"targets: within 5% <= {problem.target(0.05):.4f} ms ({n_good[0.05]} configs), "
          f"within 1% <= {problem.target(0.01):.4f} ms ({n_good[0.01]} configs)")
    print(f"start (evaluation 1, every method): {problem.values[problem.start]:.4f} ms "
          f"({problem.values[problem.start] / problem.best:.2f}x best) {problem.config(problem.start)}")

    tmp = None
    kt_error = None
    if any(m.startswith("kt:") for m in methods):
        ver = kt_version()
        if ver is None:
            kt_error = "kernel_tuner is not installed (the bench extra: pip install 'kernel_tuner>=1.5')"
        else:
            print(f"kernel_tuner {ver}, simulation mode (tune_cache on a plain-JSON copy of the file, `time` = objective)")
            tmp = tempfile.mkdtemp(prefix="kregress-search-")
            _KT_CACHE = write_kt_cache(problem, tmp)
    print(f"seeds 0..{args.seeds - 1}, cap {args.cap} evaluations, {N_PER_ROUND} proposals/round for local, "
          f"{args.workers} worker process(es)", flush=True)

    tasks = [(m, s, args.cap) for m in methods for s in range(args.seeds) if not (kt_error and m.startswith("kt:"))]
    tasks.sort(key=lambda t: SLOW_FIRST.index(t[0]) if t[0] in SLOW_FIRST else len(SLOW_FIRST))
    results: list[dict[str, Any]] = []
    try:
        if args.workers > 1:
            with ProcessPoolExecutor(args.workers, mp_context=mp.get_context("fork")) as pool:
                results = list(pool.map(run_task, tasks, chunksize=1))
        else:
            results = [run_task(t) for t in tasks]
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)

    by: dict[str, list[dict[str, Any]]] = {m: [] for m in methods}
    for r in results:
        by[r["method"]].append(r)
    q: dict[str, list[tuple[float, float, float]]] = {}
    for m, rows in by.items():
        ok = [r for r in rows if "evals" in r]
        if ok:
            q[m] = [quartiles([r["evals"][i] for r in ok]) for i in range(len(THRESHOLDS))]
    exact = [exact_random(len(problem.values), n_good[thr], cap=args.cap) for thr in THRESHOLDS]
    q["random (exact)"] = [(float(e[0][0]), float(e[0][1]), float(e[0][2])) for e in exact]
    ours = [q["local"][i][1] for i in range(len(THRESHOLDS))] if "local" in q else [math.nan] * len(THRESHOLDS)

    head = (f"{'method':<22} {'evals to 5%: med [q1, q3]':>26} {'evals to 1%: med [q1, q3]':>26} "
            f"{'reached 5% / 1%':>16} {'ours/x 5%':>9} {'ours/x 1%':>9} {'s/run':>6}")
    print()
    print(head)
    print("-" * len(head))
    notes = []
    rows_out = [m for m in methods]
    if "random" in methods:
        rows_out.insert(rows_out.index("random") + 1, "random (exact)")
    for m in rows_out:
        if m == "random (exact)":
            cells = [fmt_q(q[m][i], len(problem.values)) for i in range(len(THRESHOLDS))]
            succ = " / ".join(f"{100 * e[1]:.0f}%" for e in exact)
            rat = [ratio(ours[i], q[m][i][1], args.cap) for i in range(len(THRESHOLDS))]
            print(f"{m:<22} {cells[0]:>26} {cells[1]:>26} {succ:>16} {rat[0]:>9} {rat[1]:>9} {'-':>6}")
            continue
        rows = by[m]
        ok = [r for r in rows if "evals" in r]
        errs = [r for r in rows if "error" in r]
        if m.startswith("kt:") and kt_error:
            print(f"{m:<22} not run: {kt_error}")
            continue
        if not ok:
            print(f"{m:<22} failed: {errs[0]['error'] if errs else 'no runs'}")
            continue
        cells = [fmt_q(q[m][i], args.cap) for i in range(len(THRESHOLDS))]
        succ = " / ".join(f"{sum(r['evals'][i] is not None for r in ok)}/{len(ok)}" for i in range(len(THRESHOLDS)))
        rat = ["" if m == "local" else ratio(ours[i], q[m][i][1], args.cap) for i in range(len(THRESHOLDS))]
        wall = float(np.mean([r["wall"] for r in rows]))
        print(f"{m:<22} {cells[0]:>26} {cells[1]:>26} {succ:>16} {rat[0]:>9} {rat[1]:>9} {wall:>6.1f}")
        if errs:
            notes.append(f"{m}: {len(errs)} of {len(rows)} runs failed, e.g. {errs[0]['error']}")
        nn = [r["note"] for r in ok if r.get("note")]
        if nn and m != "local":
            kinds = sorted({n.split(" after ")[0] for n in nn})
            notes.append(f"{m}: {len(nn)} of {len(ok)} runs: " + " | ".join(kinds))
        if m == "local":
            notes.append("local: " + "; ".join(f"seed {r['seed']}: {r['note']}" for r in ok[:2]) + "; ...")
    print("\n(reached: runs that got there within the cap; for random (exact): the probability of it)")

    # The targets, read off the medians above.
    if "local" in q:
        print()
        for i, thr in enumerate(THRESHOLDS):
            kt = {m: q[m][i][1] for m in q if m.startswith("kt:")}
            if kt:
                closest = min(kt, key=lambda m: (kt[m], m))
                p_win = p_fewer(evals_of(by["local"], i), evals_of(by[closest], i))
                closest_txt = f"; closest: {closest[3:]} (P(a local run needs fewer than a {closest[3:]} run) = {p_win:.2f})"
            else:
                closest_txt = ""
            beats = [m for m, v in kt.items() if ours[i] < v]
            losses = [m for m in kt if m not in beats]
            rnd = q["random (exact)"][i][1]
            verdict = "n/a (none run)" if not kt else "no" if losses else "yes"
            print(f"target within {thr:.0%}: local median {fmt_n(ours[i], args.cap)} evals; fewer than every Kernel Tuner "
                  f"strategy run: {verdict}"
                  + (f" (not fewer than: {', '.join(m[3:] for m in losses)})" if losses else "")
                  + closest_txt
                  + f"; at most 1/5 of random sampling's ({rnd:.0f}/5 = {rnd / 5:.0f}): {'yes' if ours[i] <= rnd / 5 else 'no'}")
    if notes:
        print()
        for n in notes:
            print("note:", n)
    print(f"\ntotal wall {time.perf_counter() - t_all:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
