"""Synthetic recorded search spaces in Kernel Tuner's cache format, for testing search policies beyond
the four recorded files.

Each file is a brute-forced space of a made-up tiled kernel (block sizes, tile sizes, on/off switches,
restricted like a real kernel: threads per block between 32 and 1024), written as Kernel Tuner writes its
cache (``device_name``, ``kernel_name``, ``problem_size``, ``tune_params_keys``, ``tune_params``,
``objective``, ``cache``; each record ``time`` (mean ms) and ``times`` (the runs), or a failure string).
``kregress.core.recorded.ReplayTable`` reads them, ``bench/search.py --replay`` runs on them, and
``bench/search.py --synthetic DIR`` generates them on the fly.

The landscape of every kind is a smooth model of log(time) (a bowl per tunable with a random centre and
curvature, random pairwise interactions, a little per-level and per-config roughness), plus what the kind
plants on top of it:

* ``lone``: a lone optimum far from the smooth basin (it differs from the smooth best in at least three
  tunables). It and three of its one-change neighbours form a tight group; its other one-change
  neighbours are 10-30% slower; the best of the rest of the space is ``PLATEAU`` (1.19x) slower.
* ``threeway``: a three-way interaction. Every config with three given tunables at three given values
  gets faster, so that the best of them is the optimum and the best of the rest is ``PLATEAU`` slower;
  configs with exactly two of the three values are ``DECEPTION`` (1.25x) slower than the smooth model,
  so each pair of the three looks bad unless the third is there too.
* ``edge``: the optimum on the edge of a failure region. A resource (a weighted sum of block and tile
  positions, like registers per thread) makes configs faster the more they use, and fails past a limit
  (a run-time failure just past it, a compile failure further on): about a third of the space fails.
* ``flaky``: failures that do not depend on the parameters: a seeded ``FLAKY_RATE`` of the configs fail
  at run time, wherever they are.
* ``noisy``: heavy noise: 10 runs per config with a 12% log-normal spread and 8% outliers (1.5-3x), and
  6% per-config roughness on top of the smooth model, so the recorded median is a noisy guide.

Sizes: ``small`` (about 1,000 valid configs, block sizes in powers of two) and ``medium`` (about 4,000,
block_size_x in steps of 16); ``large`` (about 9,000, an unroll tunable more) on request. Everything is
drawn from ``numpy.random.default_rng([seed, kind, size])``: the same seed writes the same bytes.

    .venv/bin/python bench/synth_spaces.py /tmp/synth                 # every kind, small and medium, seed 0
    .venv/bin/python bench/synth_spaces.py /tmp/synth --kinds threeway,lone --sizes medium,large --seed 3
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import math
import sys
from pathlib import Path

import numpy as np

KINDS = ("lone", "threeway", "edge", "flaky", "noisy")
SIZES = ("small", "medium", "large")
DEFAULT_SIZES = ("small", "medium")
PLATEAU = 1.19  # best of the rest / planted optimum (lone, threeway)
DECEPTION = 1.25  # configs with two of the three planted values: this much slower than the smooth model
FLAKY_RATE = 0.15
_KIND_ID = {k: i for i, k in enumerate(KINDS)}
_SIZE_ID = {s: i for i, s in enumerate(SIZES)}


def tunables(size: str) -> dict[str, list[int]]:
    """The tunables of a made-up 2-D tiled kernel (values in Kernel Tuner's order)."""
    if size == "small":
        bx = [16, 32, 64, 128, 256]
    else:
        bx = list(range(16, 257, 16))
    params = {
        "block_size_x": bx,
        "block_size_y": [1, 2, 4, 8, 16],
        "tile_size_x": [1, 2, 3, 4],
        "tile_size_y": [1, 2, 3, 4],
        "use_shmem": [0, 1],
        "read_only": [0, 1],
    }
    if size != "small":
        params["use_padding"] = [0, 1]
    if size == "large":
        params["loop_unroll"] = [0, 1, 2, 4]
    return params


def restrict(cfg: dict[str, int]) -> bool:
    """The kernel's restrictions: 32..1024 threads per block; padding only with shared memory."""
    threads = cfg["block_size_x"] * cfg["block_size_y"]
    if not 32 <= threads <= 1024:
        return False
    if cfg.get("use_padding", 0) and not cfg["use_shmem"]:
        return False
    return True


def _positions(params: dict[str, list[int]], configs: list[tuple[int, ...]]) -> np.ndarray:
    """Each config's position along each tunable's values, scaled to [-1, 1]."""
    keys = list(params)
    out = np.zeros((len(configs), len(keys)))
    for j, k in enumerate(keys):
        where = {v: i for i, v in enumerate(params[k])}
        n = len(params[k])
        out[:, j] = [2.0 * where[c[j]] / (n - 1) - 1.0 for c in configs]
    return out


def _smooth(rng: np.random.Generator, params: dict[str, list[int]], configs: list[tuple[int, ...]],
            rough: float) -> np.ndarray:
    """log(time) of the smooth model: a bowl per tunable, random pairwise terms, roughness."""
    keys = list(params)
    z = _positions(params, configs)
    idx = np.stack([[params[k].index(c[j]) for j, k in enumerate(keys)] for c in configs])
    y = np.zeros(len(configs))
    centre = rng.uniform(-0.8, 0.8, len(keys))
    for j, k in enumerate(keys):
        curv = rng.uniform(0.05, 0.25)
        y += curv * (z[:, j] - centre[j]) ** 2
        y += rng.normal(0.0, 0.04, len(params[k]))[idx[:, j]]  # per-level jitter
    pairs = list(itertools.combinations(range(len(keys)), 2))
    for a, b in (pairs[i] for i in rng.choice(len(pairs), max(2, len(pairs) // 3), replace=False)):
        y += rng.uniform(-0.15, 0.15) * (z[:, a] - centre[a]) * (z[:, b] - centre[b])
        cells = rng.normal(0.0, 0.03, (len(params[keys[a]]), len(params[keys[b]])))
        y += cells[idx[:, a], idx[:, b]]
    return y + rng.normal(0.0, rough, len(configs))


def _hamming(configs: np.ndarray, p: np.ndarray) -> np.ndarray:
    return (configs != p).sum(axis=1)


def generate_space(kind: str, size: str, seed: int = 0) -> dict:
    """The Kernel Tuner cache document of one synthetic space (see the module docstring)."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; allowed: {', '.join(KINDS)}")
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; allowed: {', '.join(SIZES)}")
    rng = np.random.default_rng([int(seed), _KIND_ID[kind], _SIZE_ID[size]])
    params = tunables(size)
    keys = list(params)
    configs = [c for c in itertools.product(*params.values()) if restrict(dict(zip(keys, c)))]
    arr = np.asarray(configs)
    y = _smooth(rng, params, configs, rough=0.06 if kind == "noisy" else 0.015)
    failure: list[str | None] = [None] * len(configs)

    if kind == "lone":
        # the planted optimum: a config at least three changes away from the smooth best, in the slower half
        best = arr[int(np.argmin(y))]
        far = np.flatnonzero((_hamming(arr, best) >= 3) & (y > np.median(y)))
        p = int(rng.choice(far))
        rest_best = float(np.min(np.delete(y, p)))
        opt = rest_best - math.log(PLATEAU)
        near = np.flatnonzero(_hamming(arr, arr[p]) == 1)
        y[p] = opt
        tight = rng.choice(near, min(3, len(near)), replace=False)
        for i in near:
            target = opt + (math.log(rng.uniform(1.0, 1.02)) if i in tight else math.log(rng.uniform(1.10, 1.30)))
            y[i] = min(y[i], target)
    elif kind == "threeway":
        # three tunables of few values and a value of each, chosen where the smooth model is mediocre
        small = [j for j, k in enumerate(keys) if len(params[k]) <= 5]
        best = arr[int(np.argmin(y))]
        for _ in range(1000):
            trio = sorted(rng.choice(small, 3, replace=False).tolist())
            vals = [int(rng.choice([v for v in params[keys[j]] if v != best[j]])) for j in trio]
            match = sum((arr[:, j] == v).astype(int) for j, v in zip(trio, vals))
            cell = match == 3
            if cell.sum() >= 8 and np.min(y[cell]) - np.min(y[~cell]) > math.log(1.3):
                break
        else:  # pragma: no cover - the draw above always finds one on these spaces
            raise RuntimeError("no cell for the three-way interaction")
        y[match == 2] += math.log(DECEPTION)
        y[cell] -= np.min(y[cell]) - (np.min(y[~cell]) - math.log(PLATEAU))
    elif kind == "edge":
        res_keys = [k for k in ("block_size_y", "tile_size_x", "tile_size_y") if k in params]
        w = rng.uniform(0.6, 1.4, len(res_keys))
        z = _positions(params, configs)
        r = sum(wi * z[:, keys.index(k)] for wi, k in zip(w, res_keys))
        limit = float(np.quantile(r, 0.65))
        y -= 0.5 * (r - r.min()) / (r.max() - r.min())  # the more it uses, the faster (up to 1.65x)
        spread = float(np.quantile(r, 0.9)) - limit
        for i in np.flatnonzero(r > limit):
            failure[i] = "RuntimeFailedConfig" if r[i] <= limit + spread else "CompilationFailedConfig"
    elif kind == "flaky":
        for i in np.flatnonzero(rng.random(len(configs)) < FLAKY_RATE):
            failure[i] = "RuntimeFailedConfig"

    # objective values: the best config runs in about 1 ms
    y -= np.min([v for v, f in zip(y, failure) if f is None])
    runs, sd, outliers = (10, 0.12, 0.08) if kind == "noisy" else (32, 0.01, 0.0)
    cache = {}
    for i, c in enumerate(configs):
        key = ",".join(str(v) for v in c)
        rec: dict = dict(zip(keys, (int(v) for v in c)))
        rec.update({"compile_time": round(float(rng.uniform(300, 900)), 3), "verification_time": 0})
        if failure[i] is not None:
            rec["time"] = failure[i]
            rec["benchmark_time"] = 0
        else:
            t = math.exp(float(y[i]))
            times = t * np.exp(rng.normal(0.0, sd, runs))
            if outliers:
                hit = rng.random(runs) < outliers
                times[hit] *= rng.uniform(1.5, 3.0, int(hit.sum()))
            rec["times"] = [round(float(x), 6) for x in times]
            rec["time"] = float(np.mean(rec["times"]))
            rec["benchmark_time"] = round(float(np.sum(times)), 3)
            rec["GFLOP/s"] = round(100.0 / float(np.median(times)), 3)
        cache[key] = rec
    return {
        "version": "1.0",
        "device_name": f"synthetic {kind} GPU",
        "kernel_name": f"synth_{kind}",
        "problem_size": [4096, 4096],
        "tune_params_keys": keys,
        "tune_params": params,
        "objective": "time",
        "cache": cache,
    }


def file_name(kind: str, size: str, seed: int) -> str:
    return f"synth_{kind}_{size}_s{seed}.json.gz"


def write_space(out_dir: str | Path, kind: str, size: str, seed: int = 0) -> Path:
    """Write one space (gzipped; the same bytes for the same arguments) and return its path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / file_name(kind, size, seed)
    raw = json.dumps(generate_space(kind, size, seed)).encode()
    path.write_bytes(gzip.compress(raw, mtime=0))
    return path


def generate(out_dir: str | Path, kinds=KINDS, sizes=DEFAULT_SIZES, seed: int = 0) -> list[Path]:
    """Every (kind, size) space into ``out_dir``; a file already there with the same name is kept (the
    name carries kind, size and seed, and the bytes are a function of them)."""
    paths = []
    for kind in kinds:
        for size in sizes:
            path = Path(out_dir) / file_name(kind, size, seed)
            paths.append(path if path.is_file() else write_space(out_dir, kind, size, seed))
    return paths


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("out_dir", help="folder to write the .json.gz files into (created if missing)")
    ap.add_argument("--kinds", default=",".join(KINDS), help="comma list of %(default)s")
    ap.add_argument("--sizes", default=",".join(DEFAULT_SIZES), help=f"comma list of {', '.join(SIZES)} (default %(default)s)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    bad = [k for k in kinds if k not in KINDS] + [s for s in sizes if s not in SIZES]
    if bad:
        ap.error(f"unknown kind or size {', '.join(bad)}; kinds: {', '.join(KINDS)}; sizes: {', '.join(SIZES)}")
    for kind in kinds:
        for size in sizes:
            path = write_space(args.out_dir, kind, size, args.seed)
            doc = json.loads(gzip.decompress(path.read_bytes()))
            vals = sorted(float(np.median(r["times"])) for r in doc["cache"].values() if "times" in r)
            n_fail = sum(isinstance(r["time"], str) for r in doc["cache"].values())
            print(f"{path}: {len(doc['cache']):,} configs, {n_fail} failures, within 5%: "
                  f"{sum(v <= 1.05 * vals[0] for v in vals)}, within 1%: {sum(v <= 1.01 * vals[0] for v in vals)}, "
                  f"median/best {vals[len(vals) // 2] / vals[0]:.2f}, q10/best {vals[len(vals) // 10] / vals[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
