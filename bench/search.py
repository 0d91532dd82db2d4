"""Search-efficiency benchmark on a real, brute-forced search space (recorded GPU runs).

How many evaluations does a search need to get within 5% and within 1% of the best configuration of
the CLBlast Xgemm SGEMM space measured on an RTX 3090 (``../shared/data/replay/``, read through
``kernels.replay.ReplayTable``: 17,956 valid configurations out of 82,944 Cartesian points)? Side by
side, in one run, over the same seeds:

* local             our embedded-default policy (``kernel_assets.agent.local.LocalPolicy``), run round
                    after round with n=8 proposals a round exactly as a sweep calls it: an
                    ``AgentContext`` whose history holds every measured row (the start config is the
                    baseline, round 0) and whose objective maps each row to its replayed time;
* random            uniform sampling without replacement from the valid configurations;
* kt:<strategy>     Kernel Tuner's own strategies in its simulation mode (``kernel_tuner.tune_cache``:
                    tune parameters, problem size and restrictions inferred from the cache file, every
                    evaluation answered from the recorded cache), budget ``strategy_options
                    {"max_fevals": cap}``, seeded through ``random.seed``/``numpy.random.seed`` (what its
                    strategies draw from) and ``seed=`` (what its pymoo strategies read).

What is counted, the same way for every method:

* Objective: each configuration's recorded mean ``time`` (``--objective mean``, the default and what
  Kernel Tuner optimises on this file), or the median of its 32 runs (``--objective median``: the
  temporary cache handed to Kernel Tuner then carries the median as ``time``, so every method
  optimises and is scored on the same number). The targets are 1.05x and 1.01x of the best value.
* Evaluation 1 is the fixed start config: the configuration of median objective value (a mediocre
  one, about 6x slower than the best), the same for every seed and method. It is the baseline of the
  local policy, ``x0`` of the Kernel Tuner strategies that take one; for the methods that cannot take
  one (random, kt:random_sample, kt:bayes_opt) it is counted as evaluation 1 before their own
  choices, as if the baseline had been measured first.
* An evaluation is a distinct configuration that has a record, i.e. one that would have been compiled
  and run on the GPU. A repeat of an already measured configuration is served from the cache and
  costs nothing (Kernel Tuner's own ``max_fevals`` accounting); a point outside the space (absent from
  the cache: ruled out by the kernel's restrictions, checked before any compile) is rejected without
  a run and costs nothing, for every method (the local policy never proposes one). This file has no
  failed records, so no evaluation fails.
* Within a round of the local policy, the proposals are counted in the order proposed (a sweep would
  run all 8; the count stops at the first one that reaches the target, as for Kernel Tuner's
  batches).
* A run that does not reach a target within ``--cap`` evaluations is censored: it counts in the
  quartiles as "more than cap" (shown as ``>cap``), and the success column says how many reached it.
  ``random (no cap)`` is the same sampler run to the end of the space: the reference for the ratio
  against random when the capped median is censored.

Ratios: "ours/x" is the local policy's median evaluations divided by method x's (below 1 is better;
``<r`` when x's median is censored, i.e. at least that much better).

Run (default: 20 seeds, cap 2000, local + random + 8 Kernel Tuner strategies, 2 worker processes;
a few minutes on 2 cores)::

    .venv/bin/python bench/search.py
    .venv/bin/python bench/search.py --seeds 40 --cap 4000 --methods local,random,kt:bayes_opt

Needs the ``bench`` extra (``kernel_tuner``) for the ``kt:`` methods; without it they are reported as
not run.
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import math
import multiprocessing as mp
import os
import random
import shutil
import sys
import tempfile
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_ROOT = Path(__file__).resolve().parents[1]
if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path[0] = str(_ROOT)  # run as a script: import the project, not bench/ siblings
elif str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

import numpy as np  # noqa: E402

from kernels.replay import ReplayTable  # noqa: E402

THRESHOLDS = (0.05, 0.01)
N_PER_ROUND = 8
KT_DEFAULT = ("random_sample", "genetic_algorithm", "simulated_annealing", "pso", "greedy_ils",
              "firefly_algorithm", "diff_evo", "dual_annealing")
# Kernel Tuner strategies that take a start point (strategy_options x0); the others start where they like.
KT_TAKES_X0 = {"genetic_algorithm", "simulated_annealing", "pso", "greedy_ils", "firefly_algorithm", "diff_evo",
               "dual_annealing", "basinhopping", "mls", "greedy_mls", "ordered_greedy_mls", "minimize", "skopt"}
DEFAULT_METHODS = ("local", "random", "random-nocap") + tuple(f"kt:{s}" for s in KT_DEFAULT)


# -------------------------------------------------------------------------------------------------
# The problem: objective values per configuration, the start config, the targets.
@dataclass
class Problem:
    path: str
    objective: str  # "mean" or "median"
    keys: tuple[str, ...]  # tune_params_keys order
    values: dict[tuple[int, ...], float]  # config key -> objective (ms), every valid config
    start: tuple[int, ...]
    best: float

    def target(self, thr: float) -> float:
        return self.best * (1.0 + thr)

    def config(self, key: tuple[int, ...]) -> dict[str, int]:
        return dict(zip(self.keys, key))


def load_problem(path: str | None, objective: str) -> tuple[ReplayTable, Problem]:
    table = ReplayTable.load(path)
    values: dict[tuple[int, ...], float] = {}
    for rec in table.records():  # failed records have no time; this file has none
        v = float(np.median(rec.times)) if objective == "median" else float(rec.time)
        values[table.key(rec.config)] = v
    order = sorted(values, key=lambda k: (values[k], k))
    start = order[len(order) // 2]  # the median-time configuration: mediocre, fixed
    return table, Problem(str(table.path), objective, table.tune_params_keys, values, start, values[order[0]])


def evals_to_targets(problem: Problem, seq: list[tuple[int, ...]]) -> list[int | None]:
    """1-based index of the first evaluation within each threshold, over a list of distinct evaluated
    configurations (start config first); None when not reached."""
    out: list[int | None] = []
    for thr in THRESHOLDS:
        tgt = problem.target(thr)
        out.append(next((i for i, k in enumerate(seq, start=1) if problem.values[k] <= tgt), None))
    return out


def distinct_with_start(problem: Problem, keys: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """The start config, then each configuration the method evaluated for the first time, in order;
    configurations outside the space are dropped (rejected before a run)."""
    seen = {problem.start}
    seq = [problem.start]
    for k in keys:
        if k in seen or k not in problem.values:
            continue
        seen.add(k)
        seq.append(k)
    return seq


# -------------------------------------------------------------------------------------------------
# Methods. Each returns (evals list in evaluation order, a note) for one seed.
_PROBLEM: Problem | None = None  # set in the parent before the workers fork
_TABLE: ReplayTable | None = None
_KT_CACHE: str | None = None


def run_random(problem: Problem, seed: int, cap: int) -> tuple[list[tuple[int, ...]], str]:
    rng = np.random.default_rng(seed)
    pool = sorted(k for k in problem.values if k != problem.start)
    idx = rng.permutation(len(pool))[: max(0, cap - 1)]
    return [problem.start] + [pool[i] for i in idx], ""


def run_local(problem: Problem, seed: int, cap: int) -> tuple[list[tuple[int, ...]], str]:
    from kernel_assets.agent.base import AgentContext
    from kernel_assets.agent.local import LocalPolicy
    from kernels.records import VariantResult, config_hash
    from kernels.registry import Family
    from kernels.replay import to_measurements
    from kernels.spec import parse_spec

    table = _TABLE
    assert table is not None
    family = Family(name="clblast_xgemm_replay", space=table.space, shape_keys=("M", "N"), headline_metric="gflops")
    start_cfg = problem.config(problem.start)
    # A valid spec (the GEMM family's), then pointed at the replay space: the local policy reads the
    # baseline, params, constraints and seed from it, nothing family-specific.
    spec = parse_spec({
        "task_id": "search_bench", "kernel_family": "gemm", "shape_matrix": [{"M": 4096, "N": 4096, "K": 4096}],
        "correctness_shapes": [{"M": 32, "N": 32, "K": 32}],
        "baseline": dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_stages=3, num_warps=8),
        "search": {"variants_per_round": N_PER_ROUND, "seed": seed},
    }).model_copy(update={"kernel_family": family.name, "baseline": start_cfg})

    def row(vid: str, rnd: int, cfg: dict[str, int]) -> VariantResult:
        rec = table.lookup(cfg)
        return VariantResult(variant_id=vid, round=rnd, source="local" if rnd else "baseline", config=cfg,
                             config_hash=config_hash(cfg), measurements=to_measurements(table, rec),
                             evidence="replay", backend="replay", error=rec.error,
                             error_detail=rec.failure or "")

    history = [row("baseline", 0, start_cfg)]
    objective = {history[0].config_hash: problem.values[problem.start]}
    seq = [problem.start]
    policy = LocalPolicy(seed=seed)
    tgt = problem.target(min(THRESHOLDS))
    rnd = 0
    note = ""
    round_s: list[float] = []
    while len(seq) < cap and min(problem.values[k] for k in seq) > tgt:
        rnd += 1
        ctx = AgentContext(spec=spec, family=family, round=rnd, n=N_PER_ROUND, history=history,
                           objective=objective, profile_summary="", failures=[])
        t0 = time.perf_counter()
        prop = policy.propose(ctx)
        round_s.append(time.perf_counter() - t0)
        if not prop.suggestions:
            note = f"no proposals in round {rnd}"
            break
        for s in prop.suggestions:
            key = table.key(s.config)
            assert key in problem.values, f"local policy proposed a config outside the space: {s.config}"
            r = row(s.variant_id, rnd, dict(s.config))
            history.append(r)
            if not r.error:
                objective[r.config_hash] = problem.values[key]
            seq.append(key)
            if len(seq) >= cap:
                break
    assert len(set(seq)) == len(seq), "local policy repeated a config"
    note = note or f"{rnd} rounds, {1e3 * float(np.mean(round_s)):.0f} ms/round (max {1e3 * max(round_s):.0f})"
    return seq, note


def run_kt(problem: Problem, strategy: str, seed: int, cap: int) -> tuple[list[tuple[int, ...]], str]:
    from kernel_tuner import tune_cache

    assert _KT_CACHE is not None
    random.seed(seed)
    np.random.seed(seed)
    opts: dict[str, Any] = {}
    if strategy in KT_TAKES_X0:
        opts["x0"] = list(problem.start)
        opts["max_fevals"] = cap
    else:
        opts["max_fevals"] = cap - 1  # the start config is counted as evaluation 1 in front of it
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results, _env = tune_cache(_KT_CACHE, strategy=strategy, strategy_options=opts, quiet=True, verbose=False,
                                   seed=seed)
    keys = []
    for r in results:
        if r is None or "__error__" in r:
            continue
        keys.append(tuple(int(r[k]) for k in problem.keys))
    seq = distinct_with_start(problem, keys)
    first = keys[0] if keys else None
    note = "" if strategy not in KT_TAKES_X0 or first == problem.start else "x0 not evaluated first"
    if len(seq) < cap:
        note = (note + "; " if note else "") + f"stopped by itself after {len(seq)} evals"
    return seq[:cap], note


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
        elif method == "random-nocap":
            seq, note = run_random(problem, seed, len(problem.values))
        elif method.startswith("kt:"):
            seq, note = run_kt(problem, method[3:], seed, cap)
        else:
            raise ValueError(f"unknown method {method!r}")
    except Exception as exc:  # reported as a failed method, not a lost benchmark
        return {"method": method, "seed": seed, "error": f"{type(exc).__name__}: {exc}"[:300],
                "wall": time.perf_counter() - t0}
    return {"method": method, "seed": seed, "evals": evals_to_targets(problem, seq), "n": len(seq), "note": note,
            "wall": time.perf_counter() - t0}


# -------------------------------------------------------------------------------------------------
# Kernel Tuner's cache: plain JSON in a temp dir (it reads only .json), with only the fields it uses.
def write_kt_cache(path: str, objective: str, dest_dir: str) -> str:
    with gzip.open(path, "rb") if str(path).endswith(".gz") else open(path, "rb") as fh:
        data = json.load(fh)
    keep = set(data["tune_params_keys"]) | {"time", "compile_time", "verification_time", "benchmark_time"}
    cache = {}
    for key, rec in data["cache"].items():
        slim = {k: v for k, v in rec.items() if k in keep}
        if objective == "median" and isinstance(rec.get("time"), (int, float)) and rec.get("times"):
            slim["time"] = float(np.median(rec["times"]))
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
def quartiles(vals: list[int | None], cap: int) -> tuple[float, float, float]:
    """q1, median, q3 with censored runs (None) as +inf ("more than cap")."""
    arr = np.array([math.inf if v is None else float(v) for v in vals])
    if not len(arr):
        return (math.nan,) * 3  # type: ignore[return-value]
    q = np.quantile(arr, [0.25, 0.5, 0.75], method="lower") if np.isinf(arr).any() else np.quantile(arr, [0.25, 0.5, 0.75])
    return float(q[0]), float(q[1]), float(q[2])


def fmt_n(v: float, cap: int) -> str:
    if math.isnan(v):
        return "-"
    if math.isinf(v):
        return f">{cap}"
    return f"{v:.0f}" if abs(v - round(v)) < 1e-9 else f"{v:.1f}"


def fmt_cell(vals: list[int | None], cap: int) -> str:
    q1, med, q3 = quartiles(vals, cap)
    return f"{fmt_n(med, cap)} [{fmt_n(q1, cap)}, {fmt_n(q3, cap)}]"


def ratio(ours: float, theirs: float, cap_theirs: int) -> str:
    """ours / theirs of the medians; a censored median of theirs is only known to exceed its cap."""
    if math.isnan(ours) or math.isnan(theirs):
        return "-"
    if math.isinf(ours) and math.isinf(theirs):
        return "?"
    if math.isinf(ours):
        return ">1"
    if math.isinf(theirs):
        return f"<{ours / cap_theirs:.2f}"
    return f"{ours / theirs:.2f}"


def main(argv: list[str] | None = None) -> int:
    global _PROBLEM, _TABLE, _KT_CACHE
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=20, help="seeds per method (default 20)")
    ap.add_argument("--cap", type=int, default=2000, help="evaluation cap per run, start config included (default 2000)")
    ap.add_argument("--methods", default=",".join(DEFAULT_METHODS),
                    help="comma list of local, random, random-nocap, kt:<strategy> (default: %(default)s)")
    ap.add_argument("--objective", choices=("mean", "median"), default="mean",
                    help="per-config value: recorded mean `time` or median of the 32 runs (default mean)")
    ap.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--replay", default=None, help="Kernel Tuner cache file (default: the RTX 3090 GEMM file)")
    args = ap.parse_args(argv)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    logging.getLogger("kregress.agent").setLevel(logging.WARNING)

    t_all = time.perf_counter()
    table, problem = load_problem(args.replay, args.objective)
    _PROBLEM, _TABLE = problem, table
    best_key = min(problem.values, key=problem.values.get)
    n_within = {thr: sum(v <= problem.target(thr) for v in problem.values.values()) for thr in THRESHOLDS}
    print(f"space: {table.kernel_name} {table.shape_label} on {table.device_name}: {len(problem.values):,} valid configs "
          f"({problem.path})")
    print(f"objective: {'recorded mean time' if problem.objective == 'mean' else 'median of the 32 runs'}; "
          f"best {problem.best:.4f} ms {problem.config(best_key)}")
    print(f"targets: within 5% <= {problem.target(0.05):.4f} ms ({n_within[0.05]} configs), "
          f"within 1% <= {problem.target(0.01):.4f} ms ({n_within[0.01]} configs)")
    print(f"start (evaluation 1, every method): {problem.values[problem.start]:.4f} ms "
          f"({problem.values[problem.start] / problem.best:.2f}x best) {problem.config(problem.start)}")

    tmp = None
    kt_methods = [m for m in methods if m.startswith("kt:")]
    kt_error = None
    if kt_methods:
        ver = kt_version()
        if ver is None:
            kt_error = "kernel_tuner is not installed (pip install 'kernel_tuner==1.5.0', the bench extra)"
        else:
            print(f"kernel_tuner {ver}, simulation mode (tune_cache on a plain-JSON copy of the file)")
            tmp = tempfile.mkdtemp(prefix="kregress-search-")
            _KT_CACHE = write_kt_cache(problem.path, problem.objective, tmp)
    print(f"seeds 0..{args.seeds - 1}, cap {args.cap} evaluations, {N_PER_ROUND} proposals/round for local, "
          f"{args.workers} workers", flush=True)

    tasks = [(m, s, args.cap) for m in methods for s in range(args.seeds) if not (kt_error and m.startswith("kt:"))]
    # Slow ones first so the pool stays busy to the end.
    tasks.sort(key=lambda t: 0 if t[0] in ("local", "kt:bayes_opt") else 1)
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

    def med(method: str, i: int) -> float:
        rows = [r for r in by.get(method, []) if "evals" in r]
        return quartiles([r["evals"][i] for r in rows], args.cap if method != "random-nocap" else len(problem.values))[1] if rows else math.nan

    head = f"{'method':<24} {'evals to 5%: med [q1, q3]':>28} {'evals to 1%: med [q1, q3]':>28} {'reached 5% / 1%':>16} {'ours/x 5%':>10} {'ours/x 1%':>10} {'s/run':>7}"
    print()
    print(head)
    print("-" * len(head))
    notes = []
    for m in methods:
        rows = by[m]
        ok = [r for r in rows if "evals" in r]
        errs = [r for r in rows if "error" in r]
        if m.startswith("kt:") and kt_error:
            print(f"{m:<24} not run: {kt_error}")
            continue
        if not ok:
            print(f"{m:<24} failed: {errs[0]['error'] if errs else 'no runs'}")
            continue
        cap = len(problem.values) if m == "random-nocap" else args.cap
        cells = [fmt_cell([r["evals"][i] for r in ok], cap) for i in range(len(THRESHOLDS))]
        succ = " / ".join(f"{sum(r['evals'][i] is not None for r in ok)}/{len(ok)}" for i in range(len(THRESHOLDS)))
        rat = ["" if m == "local" else ratio(med("local", i), med(m, i), cap) for i in range(len(THRESHOLDS))]
        wall = float(np.mean([r["wall"] for r in rows]))
        label = "random (no cap)" if m == "random-nocap" else m
        print(f"{label:<24} {cells[0]:>28} {cells[1]:>28} {succ:>16} {rat[0]:>10} {rat[1]:>10} {wall:>7.1f}")
        if errs:
            notes.append(f"{m}: {len(errs)} of {len(rows)} runs failed, e.g. {errs[0]['error']}")
        nn = sorted({r["note"] for r in ok if r.get("note")})
        if nn and m != "local":
            notes.append(f"{m}: " + " | ".join(nn[:3]) + (f" (+{len(nn) - 3} more)" if len(nn) > 3 else ""))
    if "local" in by and any("evals" in r for r in by["local"]):
        lr = [r for r in by["local"] if "evals" in r]
        notes.append("local: " + "; ".join(f"seed {r['seed']}: {r['note']}" for r in lr[:3]) + " ...")
    if notes:
        print()
        for n in notes:
            print("note:", n)
    print(f"\ntotal wall {time.perf_counter() - t_all:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
