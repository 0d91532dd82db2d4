"""The case planner's rules (pure; no torch, no Triton): which programs a sampled launch runs (a covering design
over residue classes) and what each structure case guarantees past the timed value. ``kernels.gate_cases`` draws
the cases with them; tests/test_gate_planner_props.py checks them over 200 seeds for every built-in spec."""

from __future__ import annotations

import functools
import math
from typing import Any

# Programs run per launch (see ``program_slots``): a covering design over the launch's residue classes
# (``program_classes``): every class modulo STRATA of each grid axis (so also modulo 8, 4 and 2) and, as far as
# the axis allows, modulo COVER; where two or more axes have several programs, every class modulo STRATA of the
# flattened index (both ways round) and of the affine mixes MIXES of every two such axes (a*pid0 + b*pid1: a
# GEMM whose tiles on one diagonal skip half their K). Programs are chosen greedily, each covering the most
# classes not yet covered (``cover_programs``); then the first and the last program and uniform working programs
# (``choose_programs``). The slots and a uniform pool are drawn once per judgement and case and run by the
# baseline (idle programs replaced by working ones of the same classes modulo STRATA); each candidate draws its
# programs from those, with its own secret seed.
STRATA = 16
COVER = (3, 5, 7)
MIXES = ((1, 1), (1, -1), (1, 2), (2, 1))  # (a, b): the classes of (a * pid_i + b * pid_j) mod STRATA, every i < j
COVER_POOL = 256  # random programs the greedy cover chooses from (and a program built for each class they miss)


def _families(grid: tuple[int, int, int]) -> tuple[tuple, ...]:
    return _families_cached(tuple(int(n) for n in grid))


@functools.lru_cache(maxsize=256)
def _families_cached(grid: tuple[int, int, int]) -> tuple[tuple, ...]:
    """The class families of a ``grid`` launch (see ``program_classes``), each (name, modulus)."""
    multi = [a for a in range(3) if grid[a] > 1]
    fams: list[tuple] = [(("axis", a, m), m) for a in multi for m in (STRATA,) + COVER if m == STRATA or grid[a] > STRATA]
    if len(multi) >= 2 and math.prod(grid) > STRATA:
        fams += [(("flat", True), STRATA), (("flat", False), STRATA)]
    fams += [(("mix", i, j, a, b), STRATA) for ii, i in enumerate(multi) for j in multi[ii + 1:] for a, b in MIXES]
    return tuple(fams)


def _values(name: tuple, progs: Any, grid: tuple[int, int, int]) -> Any:
    """The value of class family ``name`` for each program (rows of the int64 array ``progs``)."""
    nx, ny, nz = grid
    if name[0] == "axis":
        return progs[:, name[1]] % name[2]
    if name[0] == "flat":
        flat = progs[:, 0] + nx * progs[:, 1] + nx * ny * progs[:, 2] if name[1] else \
            progs[:, 0] * ny * nz + progs[:, 1] * nz + progs[:, 2]
        return flat % STRATA
    _, i, j, a, b = name
    return (a * progs[:, i] + b * progs[:, j]) % STRATA


def _reachable(grid: tuple[int, int, int], fams: tuple[tuple, ...]) -> list:
    """Per class family of ``fams`` (``_families(grid)``), a read-only boolean vector over its values: the values
    some program of the grid takes."""
    return list(_reachable_cached(tuple(int(n) for n in grid)))


@functools.lru_cache(maxsize=256)
def _reachable_cached(grid: tuple[int, int, int]) -> tuple:
    import numpy as np

    out = []
    for name, m in _families(grid):
        v = np.zeros(m, dtype=bool)
        if name[0] == "axis":
            v[:min(m, grid[name[1]])] = True
        elif name[0] == "flat":
            v[:] = True
        else:
            _, i, j, a, b = name
            xi = np.arange(min(grid[i], STRATA))[:, None]
            xj = np.arange(min(grid[j], STRATA))[None, :]
            v[np.unique((a * xi + b * xj) % STRATA)] = True
        v.flags.writeable = False
        out.append(v)
    return tuple(out)


def program_classes(grid: tuple[int, int, int]) -> set[tuple]:
    """The classes a sampled run of a ``grid`` launch must have a program in, each (family, value), for every
    value some program of the grid takes. Families: ("axis", a, m): pid_a mod m (m = STRATA, and COVER on an
    axis of more than STRATA programs; an axis of at most STRATA programs runs all of them); ("flat",
    x_fastest): the flattened id mod STRATA, where two or more axes have several programs; ("mix", i, j, a, b):
    (a pid_i + b pid_j) mod STRATA for every two such axes and (a, b) of MIXES."""
    fams = _families(grid)
    return {(name, int(r)) for (name, _m), v in zip(fams, _reachable(grid, fams)) for r in v.nonzero()[0]}


def classes_of(p: tuple[int, int, int], grid: tuple[int, int, int]) -> set[tuple]:
    """The classes (as ``program_classes`` names them) program ``p`` of a ``grid`` launch is in."""
    import numpy as np

    arr = np.array([p], dtype=np.int64)
    return {(name, int(_values(name, arr, grid)[0])) for name, _m in _families(grid)}


def _program_in(cls: tuple, grid: tuple[int, int, int], rng: Any) -> tuple[int, int, int] | None:
    """A program of ``grid`` in class ``cls`` (the other coordinates random), or None where none is found."""
    name, value = cls
    for _ in range(8):
        p = [rng.randrange(n) for n in grid]
        if name[0] == "axis":
            members = range(value, grid[name[1]], name[2])
            if not members:
                return None
            p[name[1]] = members[rng.randrange(len(members))]
        elif name[0] == "flat":
            total = math.prod(grid)
            members = range(value, total, STRATA)
            if not members:
                return None
            p = list(unravel(members[rng.randrange(len(members))], grid, name[1]))
        else:
            _, i, j, a, b = name
            want = (value - b * p[j]) % STRATA
            xs = [x for x in range(min(grid[i], STRATA)) if (a * x) % STRATA == want]
            if not xs:
                continue
            x = rng.choice(xs)
            p[i] = x + STRATA * rng.randrange((grid[i] - x + STRATA - 1) // STRATA)
        return (p[0], p[1], p[2])
    return None


def cover_programs(grid: tuple[int, int, int], rng: Any) -> list[tuple[int, int, int]]:
    """A covering design: programs of ``grid`` chosen greedily, each the one of a pool (``COVER_POOL`` random
    programs, and one built for each class still open) in the most classes not yet covered, until every
    class of ``program_classes`` has one. A kernel that skips one residue class of any axis, of either
    flattening, or of an affine mix of two axes has a program of it in every sample."""
    import numpy as np

    fams = _families(grid)
    if not fams:  # one program: the first and the last
        return []
    offsets = np.cumsum([0] + [m for _n, m in fams])
    need = np.concatenate(_reachable(grid, fams) + [np.zeros(0, dtype=bool)])
    gen = np.random.default_rng(rng.getrandbits(63))  # the pool's draws, from the same secret

    def codes_of(arr: Any) -> Any:
        return np.stack([offsets[f] + _values(name, arr, grid) for f, (name, _m) in enumerate(fams)], axis=1)

    arr = gen.integers(0, grid, size=(COVER_POOL, 3))
    codes = codes_of(arr)
    noise = gen.random(len(arr)) * 0.5  # ties broken at random (from the secret)
    picks: list[tuple[int, int, int]] = []
    while need.any():
        best = int(np.argmax(need[codes].sum(axis=1) + noise))
        if not need[codes[best]].any():  # the pool reaches none of what is left: a program built for each open class
            open_ = np.flatnonzero(need)
            built = [_program_in((fams[f][0], int(c - offsets[f])), grid, rng)
                     for c, f in zip(open_, np.searchsorted(offsets, open_, side="right") - 1)]
            more = np.array([b for b in built if b is not None], dtype=np.int64).reshape(-1, 3)
            if not len(more):
                break  # no program lies in what is left
            arr, codes = np.concatenate([arr, more]), np.concatenate([codes, codes_of(more)])
            noise = np.concatenate([noise, gen.random(len(more)) * 0.5])
            continue
        need[codes[best]] = False
        picks.append(tuple(int(x) for x in arr[best]))
    return picks


def uncovered(grid: tuple[int, int, int], programs: list[tuple[int, int, int]]) -> set[tuple]:
    """The classes of ``program_classes`` that none of ``programs`` is in (empty: a full cover)."""
    import numpy as np

    fams = _families(grid)
    arr = np.array(list(programs), dtype=np.int64).reshape(-1, 3)
    out: set[tuple] = set()
    for (name, m), reach in zip(fams, _reachable(grid, fams)):
        hit = np.zeros(m, dtype=bool)
        hit[_values(name, arr, grid)] = True
        out |= {(name, int(r)) for r in np.flatnonzero(reach & ~hit)}
    return out


def unravel(i: int, grid: tuple[int, int, int], x_fastest: bool) -> tuple[int, int, int]:
    """The program of flat index ``i`` of ``grid``: x fastest (a launch's linear id) or z fastest."""
    nx, ny, nz = grid
    if x_fastest:
        return (i % nx, (i // nx) % ny, i // (nx * ny))
    return (i // (ny * nz), (i // nz) % ny, i % nz)


# --- structure past the timed value: what each structure case guarantees ---------------------------------

# A guarantee is a short name a property test checks (tests/test_gate_planner_props.py):
G_GQA_OTHER = "gqa ratio other than every timed shape's"
G_CAUSAL_SQ = "causal with s_q = {}"  # .format(1), (2), (">= 3")
G_LONG_Q = "max query length > 2048 and a sequence of > 1024 queries after a cached prefix"
G_WINDOW = "window {} edge inside the sequence"  # .format("left"), ("right")
LONG_Q_KIND = "structure_long_q"
LONG_Q_MIN = 2049  # queries of the long-query case: past 2048 (a mask skipped past it), past 1024 (a prefix dropped)
CAUSAL_SQ_MORE = (3, 4, 5)  # s_q of the causal case past the timed 2 (a mask applied only in the last key block)
CAUSAL_SQ_BATCH = 2  # sequences of a derived causal case: the longest of the family's own (the timed caches)


def window_of(params: dict) -> tuple[int, int]:
    """(left, right) of a ``window`` param, -1 unbounded or none (flash-attn's spelling; an int W is (W - 1,
    W - 1)); with causal the right edge is the diagonal, not a window edge (-1)."""
    w, causal = params.get("window"), bool(params.get("causal"))
    if w is None or w is False or (isinstance(w, int) and w == 0):
        return -1, -1  # no window (a causal mask is not one: its right edge is the diagonal, checked everywhere)
    left, right = (w - 1, w - 1) if isinstance(w, int) else (int(w[0]), int(w[1]))
    return left, (-1 if causal else right)


def structure_plan(structure: list[tuple], timed: list[dict], params: dict, rng: Any) -> list[tuple]:
    """The family's structure cases, each with what it guarantees, and the cases derived from them so that the
    structure reaches past the timed value: (kind, shape, params override, guarantees).

    - another GQA ratio: a case whose h_q / h_kv differs from every timed shape's is marked;
    - causal with several queries (MLA's ``structure_causal_edge``): s_q = 1, 2 and one of 3..5 (a mask
      applied only in the last key block is right with 2 queries), the derived ones on the longest
      ``CAUSAL_SQ_BATCH`` of the family's cache lengths, the one past 2 queries on the longest and on one
      a query or two past a multiple of 256 (its first queries' causal bound in the block before the last);
    - long queries (attention's ``structure_long``, a cached prefix): more than 2048 queries after a
      cached prefix, one head (a causal mask skipped past 2048 queries, a prefix dropped past 1024);
    - windows (a spec with ``window``): a sequence longer than the window, so both edges fall inside it."""
    out: list[tuple] = []
    ratios = {s["h_q"] // max(1, s["h_kv"]) for s in timed if "h_q" in s and "h_kv" in s}
    for kind, shape, over in structure:
        promised = []
        if ratios and "h_kv" in shape and shape["h_q"] // max(1, shape["h_kv"]) not in ratios:
            promised.append(G_GQA_OTHER)
        if kind == "structure_causal_edge" and "s_q" in shape and params.get("causal"):
            promised.append(G_CAUSAL_SQ.format(shape["s_q"] if shape["s_q"] < 3 else ">= 3"))
        out.append((kind, shape, over, promised))
        if kind == "structure_causal_edge" and "s_q" in shape and params.get("causal"):
            lens = over.get("seqlens")
            few = sorted(lens, reverse=True)[:CAUSAL_SQ_BATCH] if isinstance(lens, list) and lens else None
            for n in sorted({1, 2, rng.choice(CAUSAL_SQ_MORE)} - {shape["s_q"]}):
                lens_n = few
                if few and n >= 3:  # a cache one or two past a block of every power-of-two size: the causal bound of
                    # the first queries then falls in the block before the last (a mask applied in the last block only)
                    lens_n = [few[0], max(256, few[0] // 256 * 256) + rng.randint(1, n - 2)]
                small = dict(shape, s_q=n, batch=len(lens_n) if lens_n else min(shape.get("batch", 1), CAUSAL_SQ_BATCH))
                o = dict(over, **({"seqlens": lens_n} if lens_n else {}))
                out.append((f"structure_causal_sq{n}", small, o, [G_CAUSAL_SQ.format(n if n < 3 else ">= 3")]))
        if kind == "structure_long" and "prefix" in over and "seqlen" in shape:
            n_q = LONG_Q_MIN + rng.randrange(0, 192)
            o = {k: v for k, v in over.items() if k not in ("prefix", "seqlens")}
            o["prefix"] = [rng.randint(1, 63)]
            if "seqlens" in over:
                o["seqlens"] = [n_q]
            out.append((LONG_Q_KIND, dict(shape, batch=1, seqlen=n_q), o, [G_LONG_Q]))
            left, right = window_of(params)
            if left >= 0 or right >= 0:
                n_w = max(left, 0) + max(right, 0) + 2 + rng.randint(1, 32)
                o = {k: v for k, v in over.items() if k not in ("prefix", "seqlens")}
                o["prefix"] = [0]
                if "seqlens" in over:
                    o["seqlens"] = [n_w]
                out.append(("structure_window_edges", dict(shape, batch=1, seqlen=n_w), o,
                            [G_WINDOW.format(e) for e, w in (("left", left), ("right", right)) if w >= 0]))
    return out
