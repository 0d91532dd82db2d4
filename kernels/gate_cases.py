"""The gate's secret cases (process side, no decisions): which shapes and structures a judgement checks,
their inputs' distributions, the poisoned output buffers, fresh copies for every call, and which programs a
sampled launch runs. Used by the judging parent (``kernels.candidate``) to draw the case groups and by the
sandboxed child (``kernels.gate_child``) to make and copy the inputs."""

from __future__ import annotations

import math
from typing import Any

from kernels.gate_plan import (  # noqa: F401 - the planner's rules, kept importable from here
    CAUSAL_SQ_BATCH,
    CAUSAL_SQ_MORE,
    COVER,
    G_CAUSAL_SQ,
    G_GQA_OTHER,
    G_LONG_Q,
    G_WINDOW,
    LONG_Q_KIND,
    LONG_Q_MIN,
    MIXES,
    STRATA,
    classes_of,
    cover_programs,
    program_classes,
    structure_plan,
    uncovered,
    unravel,
    window_of,
)

DISTRIBUTIONS = ("normal", "uniform", "large", "outliers")
# A family's structure_cases may pass params only the gate reads (how the case's inputs are made): keys with
# this prefix go to make_inputs and never to a call (a candidate cannot tell the case from its params), and
# INPUTS_AS_MADE keeps the inputs as make_inputs built them (no distribution redraws them).
GATE_PARAM_PREFIX = "_gate"
INPUTS_AS_MADE = "_gate_inputs_as_made"
STRETCH_BUDGET_S = 1.5  # interpreter seconds of the baseline a stretched shape may take
HIDDEN_BUDGET_S = 6.0  # ... and a generic hidden shape (odd, ones, aligned, hidden_odd): past it, the group's next shape
WIDER_MIN_PROGRAMS = 64  # a grid axis grown past the timed launches has at least this many programs (see wider_shapes)
WIDER_MAX_PROGRAMS = 4096  # ... and the programs of a wider shape stay within this (a full run, if suspected, is affordable)
WIDER_MAX_FLOPS = 2e9  # ... and its float64 reference within ~1 s of the CPU
WIDER_PARTS = 2  # wider cases at most: where growing every grid axis at once is too large, one axis each
# An axis whose growth to its target is past WIDER_MAX_FLOPS (attention's row tiles: a longer sequence is quadratic)
# still grows past the timed launches, as far as this many times the timed shapes' FLOPs allow (their own sampled
# check makes a reference of that order already), never past WIDER_REACH_MAX_FLOPS
WIDER_REACH_RATIO = 2.0
REACH_PAST = 0.25  # ... as far past the timed launches' programs as this fraction of them (or WIDER_MIN_PROGRAMS)
WIDER_REACH_MAX_FLOPS = 2e10  # (the cap of a sampled shape that is not the least: kernels.gate_child.SAMPLED_MAX_FLOPS)
LARGE_SCALE = 8.0  # "large magnitudes": x8 keeps an fp16 GEMM of K <= 1024 far from overflow
OUTLIER_SCALE = 16.0
OUTLIER_FRACTION = 0.01


def _to(value: Any, device: str) -> Any:
    import torch

    if torch.is_tensor(value):
        return value.to(device)
    if isinstance(value, dict):
        return {k: _to(v, device) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to(v, device) for v in value)
    return value


def _fresh(value: Any, device: str) -> Any:
    """A deep copy on ``device``: what every call (baseline, candidate, reference) gets, so nothing one
    call writes reaches another (``.to(device)`` on the tensor's own device returns the same tensor)."""
    import torch

    if torch.is_tensor(value):
        return value.detach().to(device, copy=True)
    if isinstance(value, dict):
        return {k: _fresh(v, device) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_fresh(v, device) for v in value)
    return value


def poison_buffers(inputs: dict, names: Any, mode: str, seed: int) -> dict:
    """Fill the output buffers ``names`` of ``inputs`` in place: ``nan`` (a kernel that writes nothing
    returns NaN) or ``random`` finite non-zero values (a kernel that tests for NaN, or leaves rows it must
    write, returns stale numbers). The reference starts from the same buffers, so what a correct kernel
    leaves untouched must come back bit for bit."""
    import torch

    g = torch.Generator(device="cpu").manual_seed(seed & 0x7FFF_FFFF_FFFF)
    for name in names:
        t = inputs.get(name)
        if not torch.is_tensor(t) or not t.is_floating_point():
            continue
        if mode == "nan":
            t.fill_(float("nan"))
        else:
            r = torch.randn(t.shape, generator=g)
            r = torch.where(r == 0, torch.ones_like(r), r)
            t.copy_(r.to(t.dtype).to(t.device))
    return inputs


def _clone_cpu(value: Any) -> Any:
    import torch

    if torch.is_tensor(value):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: _clone_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_clone_cpu(v) for v in value)
    return value


def _write_inplace(dst: Any, src: Any) -> None:
    """Copy ``src``'s values into ``dst``'s buffers (same structure): the second call's inputs."""
    import torch

    if torch.is_tensor(dst):
        dst.copy_(src.to(dst.device))
    elif isinstance(dst, dict):
        for k in dst:
            _write_inplace(dst[k], src[k])
    elif isinstance(dst, (list, tuple)):
        for d, s in zip(dst, src):
            _write_inplace(d, s)


def _tensor_bytes(value: Any) -> int:
    import torch

    if torch.is_tensor(value):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(_tensor_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_tensor_bytes(v) for v in value)
    return 0


def transform_inputs(inputs: dict, dist: str, dtype: Any, seed: int) -> dict:
    """The family's inputs with their floating tensors of the spec's dtype redrawn from ``dist``:
    normal (as made), uniform (unit variance), large (x8), outliers (1% of entries x16). Integer and
    other tensors (lengths, tables, scales) are left as made."""
    import torch

    if dist == "normal":
        return inputs
    g = torch.Generator(device="cpu").manual_seed(seed & 0x7FFF_FFFF_FFFF)
    out = {}
    for k, v in inputs.items():
        if not (torch.is_tensor(v) and v.dtype == dtype and v.is_floating_point()):
            out[k] = v
            continue
        x = v.to("cpu", torch.float32)
        if dist == "uniform":
            x = (torch.rand(x.shape, generator=g) * 2 - 1) * math.sqrt(3.0)
        elif dist == "large":
            x = x * LARGE_SCALE
        elif dist == "outliers":
            mask = torch.rand(x.shape, generator=g) < OUTLIER_FRACTION
            x = torch.where(mask, x * OUTLIER_SCALE, x)
        out[k] = x.to(dtype).to(v.device)
    return out


def _outputs(value: Any) -> list:
    return list(value) if isinstance(value, (tuple, list)) else [value]


# --- the timed shape on a CPU host: a few programs of each launch --------------------------------------------

# Programs run per launch (see ``program_slots``): a covering design (``kernels.gate_plan.cover_programs``), then
# the first and the last program and uniform working programs (``choose_programs``). The slots and a uniform pool
# are drawn once per judgement and case and run by the baseline (idle programs replaced by working ones of the
# same classes modulo STRATA); each candidate draws its programs from those, with its own secret seed.
UPPER_PICKS = 8  # programs per axis of a wider shape's sampled run (see upper_slots)
UPPER_WINDOW = 8  # a later launch's programs per pick of an earlier launch tiling the axis otherwise (see upper_slots)
SLOT_ALTERNATIVES = 4  # programs tried for a structured pick that the baseline's run shows idle
UNIFORM_MAX = 32  # uniform working programs a candidate's sampled run adds on a grid of 2+ varying axes, as far as UNIFORM_BUDGET_S allows
UNIFORM_BUDGET_S = 2.0  # interpreter seconds of the baseline's working programs those may cost a candidate
UNIFORM_POOL = 2  # the baseline runs this many times a candidate's uniform programs: each candidate draws its own


_unravel = unravel  # the name tests and older callers use


def several_axes(grid: tuple[int, int, int]) -> bool:
    """Whether two or more axes of a launch grid have several programs (the id's flattenings and mixes of axes
    are classes of their own only then: on one axis every affine class of the id is a union of residues)."""
    return sum(n > 1 for n in grid) >= 2


def program_slots(grid: tuple[int, int, int], rng: Any) -> list[list[tuple[int, int, int]]]:
    """The structured picks of a sampled run of a ``grid`` (nx, ny, nz) launch, each a slot: alternative
    programs in order of preference, all in the same classes modulo STRATA. The first and the last program,
    then the covering design of ``cover_programs``: every residue class modulo 16 of each axis (modulo 3, 5
    and 7 as far as the axis allows), of the flattened program index both ways round (x fastest, as a
    launch's linear id; z fastest) and of the affine mixes of two axes (``MIXES``). A kernel that skips one
    such class (one program in eight or sixteen, every third group, a diagonal of tiles) has a program of it
    in every sample. The alternatives are the program moved by multiples of 16 along its axes (the same class
    modulo 16 of every axis, flattening and mix): a program the baseline's run shows idle (past a varlen
    sequence's end, say) cannot show a skip, so the reference child runs the next one (``choose_programs``)."""
    nx, ny, nz = grid
    slots: list[list[tuple[int, int, int]]] = [[(0, 0, 0)], [(nx - 1, ny - 1, nz - 1)]]
    for p in cover_programs(grid, rng):
        # the same classes mod 16: the program moved by multiples of 16 on its long axes, to the top member of its
        # class, the bottom one (idle programs lie at one end of an axis: past a varlen sequence's end), at random
        top = tuple(c + STRATA * ((n - 1 - c) // STRATA) if n > STRATA else c for c, n in zip(p, grid))
        bottom = tuple(c % STRATA if n > STRATA else c for c, n in zip(p, grid))
        moved = [tuple(c + STRATA * rng.randrange((n - c + STRATA - 1) // STRATA) if n > STRATA else c
                       for c, n in zip(p, grid)) for _ in range(SLOT_ALTERNATIVES - 3)]
        slots.append(list(dict.fromkeys([p, top, bottom] + moved)))
    return slots


def upper_slots(grid: tuple[int, int, int], seed: int,
                earlier: list[tuple[int, int, int]] = ()) -> list[list[tuple[int, int, int]]]:
    """The programs of a sampled run of a wider shape (``wider_shapes``), one per slot: the first and the last,
    and ``UPPER_PICKS`` coordinates from the upper half of every axis longer than that, taken together (the
    i-th of each), with every coordinate of the shorter axes. A wider shape grows an axis four times or more
    past the timed launches, so these are program ids no spec shape reaches: one of them writing elsewhere than
    the baseline's, or nothing, shows a kernel that maps or skips the ids past a count.

    A later launch of the call reads what the earlier ones' sampled programs wrote (MLA's combine reads the
    split-K decode's partials), so its picks must lie where those were computed. The picks of an axis depend on
    ``seed`` and its length only: launches that share an axis's length (the batch) run the same coordinates.
    Where an ``earlier`` launch tiles the axis otherwise (the decode's rows in tiles of BLOCK_H, the combine's in
    tiles of 8: 110 and 220 programs), each of its picks becomes the window of this launch's programs over the
    same fraction of the axis, one program wider each side (``cdiv`` rounding), so a tile of this launch inside
    a computed tile of the earlier one is run (where this launch has at most ``UPPER_WINDOW`` times the earlier one's
    programs on the axis: past that, its own picks)."""
    import itertools
    import random

    def own(n: int) -> list[int]:
        return sorted(random.Random(f"{seed}:{n}").sample(range(n // 2, n), min(UPPER_PICKS, n - n // 2)))

    def axis_picks(a: int, n: int) -> list[list[int]]:
        if n <= UPPER_PICKS:
            return [list(range(n))]
        for e in earlier:
            m = e[a]
            if m > UPPER_PICKS and m != n and n <= UPPER_WINDOW * m:
                return [list(range(max(0, p * n // m - 1), min(n, -(-(p + 1) * n // m) + 1))) for p in own(m)]
        return [[p] for p in own(n)]

    nx, ny, nz = grid
    picks = [axis_picks(a, n) for a, n in enumerate(grid)]
    long = [a for a in range(3) if grid[a] > UPPER_PICKS]
    short = [a for a in range(3) if grid[a] <= UPPER_PICKS]
    progs = {(0, 0, 0), (nx - 1, ny - 1, nz - 1)}
    for i in range(max((len(picks[a]) for a in long), default=1)):
        for combo in itertools.product(*([picks[a][i % len(picks[a])] for a in long] + [picks[a][0] for a in short])):
            p = [0, 0, 0]
            for a, v in zip(long + short, combo):
                p[a] = v
            progs.add(tuple(p))
    return [[p] for p in sorted(progs)]


FED_MAX = 64  # programs a launch adds so that a later launch's first program reads computed values (see fed_slots)


def fed_slots(grid: tuple[int, int, int], later: list[tuple[int, ...]]) -> list[list[tuple[int, int, int]]]:
    """Slots that feed a later launch: the first program of ``grid`` with every coordinate of the axes that a
    later launch of the call does not have (length 1 there, several here), one slot each. MLA's combine
    (rows / 8, batch) reads what every split of its decode (rows / BLOCK_H, batch, splits) wrote for the same
    rows: the decode's sampled programs take one split each, so no sampled combine program read computed partials,
    wrote nothing, and the baseline failed its own timed case (dropped on most draws). With every split of the
    first decode program run, the combine's first program (always sampled) is fed. At most ``FED_MAX``."""
    import itertools

    axes = [a for a in range(3) if grid[a] > 1 and any((tuple(g) + (1, 1, 1))[a] == 1 for g in later)]
    if not axes or math.prod(grid[a] for a in axes) > FED_MAX:
        return []
    out = []
    for combo in itertools.product(*(range(grid[a]) for a in axes)):
        p = [0, 0, 0]
        for a, v in zip(axes, combo):
            p[a] = v
        out.append([tuple(p)])
    return out


def sample_programs(grid: tuple[int, int, int], rng: Any) -> set[tuple[int, int, int]]:
    """The first choice of every slot of ``program_slots``: what a sampled run executes where nothing is
    known about which programs do work."""
    return {slot[0] for slot in program_slots(grid, rng)}


def uniform_programs(grid: tuple[int, int, int], rng: Any, n: int) -> list[tuple[int, int, int]]:
    """``n`` programs drawn uniformly (with replacement) from ``grid``, in draw order."""
    nx, ny, nz = grid
    return [(rng.randrange(nx), rng.randrange(ny), rng.randrange(nz)) for _ in range(n)]


def choose_programs(slots: list[list[tuple]], pool: list[tuple], wrote: dict[tuple, int], k_uniform: int,
                    rng: Any) -> list[tuple]:
    """One candidate's programs once the baseline has run the slots' alternatives and the pool (``wrote``:
    program -> elements the baseline's program wrote; absent: not run): per slot one of its alternatives
    that wrote something, drawn from ``rng`` (the first when none did), and ``k_uniform`` programs drawn
    from those of ``pool`` that wrote something. Uniform working programs catch a skip keyed on any other
    class (a mix of axes, a range of ids) with probability 1 - (1 - f)^k for a class of fraction f of the
    working programs; each candidate draws its own from the baseline's runs."""
    out: list[tuple] = []
    for slot in slots:
        busy = [p for p in slot if wrote.get(p, 0) > 0]
        out.append(busy[rng.randrange(len(busy))] if busy else slot[0])
    busy = [p for p in dict.fromkeys(pool) if wrote.get(p, 0) > 0]
    out += rng.sample(busy, min(k_uniform, len(busy)))
    return sorted(set(out))


def _nan_mask(t: Any) -> tuple[Any, int]:
    """(where ``t`` holds NaN, how many): the mask is None for a tensor that is not floating."""
    import torch

    if not t.is_floating_point():
        return None, 0
    with torch.utils._python_dispatch._disable_current_modes():
        mask = torch.isnan(t)
        return mask, int(mask.count_nonzero())  # 4x the speed of .sum()


def _written_where(before: tuple[Any, int], after: tuple[Any, int]) -> str:
    """Which elements a program turned from NaN into a value, as a digest of their flat indices ("" for
    none): two programs that wrote the same elements have the same digest, whatever the values. Where a
    program writes is what its id must decide as the baseline's does; a count alone cannot show a program
    that writes another program's tile (``pid % 40``: every sampled program writes a full tile, and the
    tiles past 40 are left to nobody)."""
    import hashlib

    import torch

    (mb, nb), (ma, na) = before, after
    if mb is None or nb == na:
        return ""
    with torch.utils._python_dispatch._disable_current_modes():
        idx = (mb & ~ma).reshape(-1).nonzero().reshape(-1)  # int64
        return hashlib.blake2b(idx.numpy().tobytes(), digest_size=8).hexdigest()


_GRIDS: dict[tuple, tuple[Any, list[tuple]]] = {}  # (family id, shape, config, dtype, params) -> (family, grids)


def _launch_grids(family: Any, shape: dict, config: dict, dtype: Any, params: dict) -> list[tuple]:
    """The grids the entry point launches on ``shape`` (interpreter mode; nothing runs). Kept per process: a probe
    makes the shape's inputs (a DeepSeek-size MLA decode shape: about 11 GB and 45 s on the CPU), and a
    judgement's wide and wider cases probe the same timed shapes."""
    import json

    key = (id(family), json.dumps([shape, config, str(dtype), params], sort_keys=True, default=str))
    hit = _GRIDS.get(key)
    if hit is not None and hit[0] is family:
        return list(hit[1])
    grids = _probe_grids(family, shape, config, dtype, params)
    _GRIDS[key] = (family, grids)  # holds the family, so its id is not reused while cached
    return list(grids)


def _probe_grids(family: Any, shape: dict, config: dict, dtype: Any, params: dict) -> list[tuple]:
    from triton.runtime import interpreter as interp

    from kernels.interpreter import LaunchHandle

    grids: list[tuple] = []
    original = interp.InterpretedFunction.run

    def run(self: Any, *args: Any, grid: Any, warmup: Any, **kwargs: Any) -> Any:
        g = grid(dict(zip(self.arg_names, args)) | kwargs) if callable(grid) else grid
        grids.append(tuple(int(x) for x in g))
        return LaunchHandle(getattr(self.fn, "__name__", "kernel"))  # what a launch returns when it runs

    interp.InterpretedFunction.run = run
    try:
        family.run(family.make_inputs(shape, dtype, "cpu", 0, params), dict(config), dict(params))
    finally:
        interp.InterpretedFunction.run = original
    return grids


def _grids_or_none(family: Any, shape: dict, config: dict, dtype: Any, params: dict) -> list[tuple] | None:
    """``_launch_grids``, None where the family refuses the shape (its ``check_shape`` or its wrapper: an
    attention head_dim the spec's params do not list passes the one and not the other)."""
    try:
        return _launch_grids(family, shape, config, dtype, params) if family.check_shape(shape) is None else None
    except Exception:  # noqa: BLE001
        return None


def wide_shape(family: Any, timed: dict, correctness: list[dict], config: dict, dtype: Any, params: dict) -> dict | None:
    """``timed`` with every dimension that does not change the baseline's launch grids cut to its smallest
    (1, else the smallest checked value): every program of the timed launch, the least work per program.
    The reduction (``reduction_keys``: GEMM K, attention keys) keeps its timed length and the structure
    (``structure_keys``: the GQA heads) is never cut, so a skip past a length or a wrong head map runs
    here too. None when no dimension can be cut."""
    target = _launch_grids(family, timed, config, dtype, params)
    shape = dict(timed)
    kept = set(getattr(family, "reduction_keys", ())) | set(getattr(family, "structure_keys", ()))
    for k in [k for k in family.shape_keys if k not in kept]:
        for v in sorted({1, min(s[k] for s in correctness)}):
            trial = {**shape, k: v}
            if v < shape[k] and _grids_or_none(family, trial, config, dtype, params) == target:
                shape = trial
                break
    return None if shape == timed else shape


def wider_shapes(family: Any, timed: list[dict], correctness: list[dict], config: dict, dtype: Any, params: dict,
                 factor: int, rng: Any) -> list[dict]:
    """Shapes that launch more programs than any timed shape on every grid axis a dimension can grow, each
    program with the least work, in order of preference. From the least work: every dimension but the
    structure (``structure_keys``) at its smallest checked value (never below it: a checked shape is one whose
    inputs give every program work), the structure at its least with the timed shapes' ratios; then per grid
    axis one dimension that grows
    it (drawn from ``rng``; a reduction only where nothing else grows that axis), doubled until the axis has
    ``factor`` times the programs of the timed launches' and ``WIDER_MIN_PROGRAMS`` or more, then set to an
    odd prime past that. Where that is past ``WIDER_MAX_FLOPS`` (or ``WIDER_MAX_PROGRAMS``), the dimension grows
    as far as the reach cap allows (``WIDER_REACH_RATIO`` times the timed shapes' FLOPs; its float64 reference
    costs what theirs do), if that passes the timed launches on an axis (attention's row tiles: a sequence
    longer than the timed one is quadratic); an axis it cannot pass is left to another dimension. All of them
    at once, or one at a time (each a case of its own) where all at once is past the caps; a shape past those
    alone is left out. The
    spec's shapes cap the program ids a check reaches; a kernel that maps the ids past a count onto those below
    it (``pid % 40``, ``min(pid, 39)``) or skips them is right on every one of them and wrong here. Empty
    when no dimension grows the grid."""
    seen: dict[tuple, list[tuple] | None] = {}

    def grids(shape: dict) -> list[tuple] | None:
        key = tuple(sorted(shape.items()))
        if key not in seen:
            seen[key] = _grids_or_none(family, shape, config, dtype, params)
        return seen[key]

    def programs(g: list[tuple]) -> int:
        return sum(math.prod(x) for x in g)

    tops = [g for g in (grids(s) for s in timed) if g is not None]
    fixed = set(getattr(family, "structure_keys", ()))
    reductions = set(getattr(family, "reduction_keys", ()))
    keys = [k for k in family.shape_keys if k not in fixed]
    shape = dict(max(timed, key=lambda s: programs(grids(s) or [])))
    for k in keys:
        # the smallest checked value, not 1: a shape the spec checks is one whose inputs give every program work
        # (MLA cut to one key left its causal rows nothing to read; cut to one sequence, the short one of its
        # "spread" lengths; either way the sampled programs wrote nothing and the case was dropped)
        v = min(s[k] for s in correctness)
        if v < shape[k] and grids({**shape, k: v}) is not None:
            shape = {**shape, k: v}
    if fixed and all(shape[k] > 0 for k in fixed):
        # the structure at its least with the same ratios (attention's GQA 16:4 as 4:1, 128:128 as 1:1): fewer
        # programs on the heads axis, the same index arithmetic, so a longer sequence stays cheap to run whole
        common = math.gcd(*(shape[k] for k in fixed))
        least = {**shape, **{k: shape[k] // common for k in fixed}}
        if common > 1 and grids(least) is not None:
            shape = least
    base = grids(shape)
    if base is None or not tops:
        return []

    def top(i: int, a: int) -> int:  # the timed launches' programs on an axis
        return max((t[i][a] for t in tops if i < len(t) and a < len(t[i])), default=1)

    def want(i: int, a: int) -> int:  # the programs an axis must reach
        return max(factor * top(i, a), WIDER_MIN_PROGRAMS)

    # a dimension grown only as far as the reach cap allows (see WIDER_REACH_RATIO), and that cap
    reaching: set[str] = set()
    reach_cap = max(WIDER_MAX_FLOPS, min(WIDER_REACH_MAX_FLOPS, WIDER_REACH_RATIO * max(family.flops(s, params) for s in timed)))

    def within(trial: dict, cap: float, more_than: int = 0) -> bool:  # flops first: a probe makes the shape's inputs
        if family.flops(trial, params) > cap:
            return False
        g = grids(trial)
        return g is not None and more_than < programs(g) <= WIDER_MAX_PROGRAMS

    grows: dict[str, set] = {}
    for k in keys:  # probes past a tile (a dimension cut to 1 grows no grid when doubled), within the family's bounds
        for probe in (2 * shape[k] + 2 * tile_size(family), shape[k] + tile_size(family), 2 * shape[k]):
            g = grids({**shape, k: probe})
            if g is not None and len(g) == len(base) and programs(g) > programs(base):
                grows[k] = {(i, a) for i, (x, y) in enumerate(zip(g, base)) for a in range(len(x)) if x[a] > y[a]}
                break
    order = [k for k in rng.sample(keys, len(keys)) if k not in reductions] + [k for k in keys if k in reductions]
    parts: list[dict[str, int]] = []  # per axis set: the dimensions grown for it and their values
    covered: set = set()
    for k in order:
        axes = grows.get(k, set()) - covered
        if not axes:
            continue
        covered |= grows[k]
        part: dict[str, int] = {}
        # the drawn dimension, then any other that grows these axes (the rows of MLA are the heads times the queries:
        # each alone is capped); a dimension that grows none of them is never doubled (MLA's batch: a probe of
        # thousands of sequences makes their inputs)
        used = {j for p in parts for j in p}
        for j in [k] + [j for j in order if j != k and j not in used and grows.get(j, set()) & axes]:
            now = grids({**shape, **part})
            if now is None or all(now[i][a] >= want(i, a) for i, a in axes):
                break
            v = last = shape[j]
            past_caps = False
            for _ in range(24):  # doubled until the axes have their programs or the family refuses the size
                v *= 2
                # past the cost caps the shape is never used: stop before probing it (a probe makes its inputs;
                # attention's sequence doubled towards its row-tile target reached gigabytes)
                if family.flops({**shape, **part, j: v}, params) > WIDER_MAX_FLOPS:
                    past_caps = True
                    break
                g = grids({**shape, **part, j: v})
                if g is None:
                    break
                if programs(g) > WIDER_MAX_PROGRAMS:
                    past_caps = True
                    break
                last = v
                if all(g[i][a] >= want(i, a) for i, a in axes):
                    break
            if past_caps:  # short of the target within the caps: past the timed launches, within the reach cap
                fix = {**shape, **part}
                v = _reach_value(lambda x, fix=fix, j=j: within({**fix, j: x}, reach_cap), last, shape[j])
                g = grids({**fix, j: v}) if v is not None else None
                passed = {(i, a) for i, a in axes if g is not None and g[i][a] > top(i, a)}
                if not passed:
                    part = {}  # these axes cannot pass the timed launches within the caps (the part is left out)
                    break
                # the least value as far past them as REACH_PAST asks, or as this one reaches (a whole run of it stays
                # affordable: attention's row tiles past the timed ones, not the most the FLOPs cap allows)
                goal = {(i, a): min(g[i][a], max(top(i, a) + max(2, int(REACH_PAST * top(i, a))), WIDER_MIN_PROGRAMS))
                        for i, a in passed}

                def reaches(x: int, fix: dict = fix, j: str = j, goal: dict = goal) -> bool:
                    gx = grids({**fix, j: x})
                    return gx is not None and all(gx[i][a] >= n for (i, a), n in goal.items())

                # (from below ``last`` too: it fell short there only on an axis it cannot pass)
                _, hi = _boundary(shape[j], v, lambda x, reaches=reaches: not reaches(x))
                above = _odd_near(hi - 1, set(), below=False)  # the odd prime nearest at or past it, if still within
                part[j] = above if above <= v and reaches(above) else hi
                reaching.add(j)
                covered -= axes - passed  # an axis it could not pass is left to another dimension
                break
            odd = [o for o in (_odd_near(last, set(), below=False, rng=rng), _odd_near(last, set(), below=True, rng=rng))
                   if grids({**shape, **part, j: o}) is not None]
            g = grids({**shape, **part, j: odd[0] if odd else last})
            if last > shape[j] and g is not None and any(g[i][a] > now[i][a] for i, a in axes):
                part[j] = odd[0] if odd else last
        if part:
            parts.append(part)

    def cheap(trial: dict) -> bool:  # the reach cap only for a part grown under it
        return within(trial, reach_cap if reaching & set(k for k in trial if trial[k] != shape[k]) else WIDER_MAX_FLOPS,
                      more_than=programs(base))

    every = {**shape, **{k: v for part in parts for k, v in part.items()}}
    if len(parts) > 1 and cheap(every):
        return [every]
    return [t for t in ({**shape, **part} for part in parts) if cheap(t)]


def _reach_value(ok: Any, last: int, start: int) -> int | None:
    """The largest value past ``last`` (the largest under the plain caps; ``start`` if none) for which ``ok``
    holds, ``ok`` true up to a point and false past it: doubled until it fails, then bisected. None if
    ``last`` + 1 fails."""
    lo = max(last, start)
    if not ok(lo + 1):
        return None
    hi = 2 * lo + 2
    for _ in range(24):
        if not ok(hi):
            break
        lo, hi = hi, 2 * hi
    else:
        return lo
    return _boundary(lo, hi, ok)[0]


def _boundary(lo: int, hi: int, ok: Any) -> tuple[int, int]:
    """Bisection: ``ok`` true at ``lo``, false at ``hi`` and monotone between; the adjacent pair where it turns."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo, hi


def _primes_upto(n: int) -> list[int]:
    sieve = [True] * (n + 1)
    out = []
    for i in range(2, n + 1):
        if sieve[i]:
            out.append(i)
            for j in range(i * i, n + 1, i):
                sieve[j] = False
    return out


_PRIMES = _primes_upto(4096)


def tile_size(family: Any) -> int:
    """The largest tile of the family's space (its BLOCK_* values): a size that is a multiple of it is a
    multiple of every tile."""
    blocks = [v for k, vals in family.space.params.items() if k.upper().startswith("BLOCK") for v in vals]
    return max(blocks) if blocks else 16


def _odd_near(v: int, avoid: set[int], below: bool, rng: Any = None) -> int:
    """An odd prime (a multiple of no tile) below or above ``v``, not one of ``avoid``: the nearest, or with
    ``rng`` one of the few nearest, so the hidden shapes differ from judgement to judgement."""
    import bisect

    near: list[int] = []  # the (up to) four nearest, in ascending order
    if below:
        for p in reversed(_PRIMES[1:bisect.bisect_left(_PRIMES, v)]):
            if p not in avoid:
                near.insert(0, p)
                if len(near) == 4:
                    break
    else:
        for p in _PRIMES[max(1, bisect.bisect_right(_PRIMES, v)):]:
            if p not in avoid:
                near.append(p)
                if len(near) == 4:
                    break
    if not near:
        return 1 if below else v + 1 + (v % 2)
    return rng.choice(near) if rng is not None else (near[-1] if below else near[0])


def _guarantees_of(group: dict) -> list[str]:
    """What a generic case group guarantees (the structure cases carry their own: ``structure_plan``)."""
    kind = group["kind"]
    fixed = {"correctness": ["a spec correctness shape"], "odd": ["no dimension a multiple of any tile"],
             "ones": ["dimensions of 1"], "aligned": ["every dimension a multiple of every tile"],
             "hidden_odd": ["larger than every correctness shape, no multiple of any tile"],
             "timed": ["the timed shape"],
             "sampled": ["the timed shape: a program in every residue class mod 16 of each grid axis, both "
                         "flattenings and the affine mixes of two axes (program_classes)"],
             "wide": ["every program of the timed launch, the least work each"],
             "wider": ["grid axes past the timed launches' programs"]}
    if kind in fixed:
        return fixed[kind]
    if kind.startswith("past_"):
        return [f"{kind[5:]} past every timed and checked value"]
    if kind.startswith("stretched_"):
        return [f"{kind[10:]} stretched towards its timed value"]
    return []


def _cost(family: Any, group: dict, params: dict) -> float | None:
    """The estimated cost of a group: the FLOPs of its first shape (its timed shape's for a wide or wider case,
    whose own shape the reference child derives; an upper bound), with its params."""
    shape = (group.get("shapes") or [group.get("wide_of")] + list(group.get("wider_of") or []))[0]
    if not shape:
        return None
    visible = {k: v for k, v in (group.get("params") or {}).items() if not k.startswith(GATE_PARAM_PREFIX)}
    try:
        return float(family.flops(shape, {**params, **visible}))
    except Exception:  # noqa: BLE001 - a family that cannot price it
        return None


def shape_groups(family: Any, correctness: list[dict], timed: list[dict], on_gpu: bool, rng: Any,
                 seeds: list[int], params: dict | None = None) -> list[dict]:
    """The case groups: each has a kind, candidate shapes in order of preference (the reference child
    keeps the first the family accepts and the baseline passes), a seed and a distribution for the
    first call and another for the second call in the same buffers. The generic hidden shapes never
    change the family's ``structure_keys`` (the GQA heads: an odd prime for both makes every group 1);
    the family's ``structure_cases`` (params overrides: group sizes, cache lengths, another GQA ratio,
    a long sequence) vary the structure on purpose, drawn fresh from ``rng``."""
    keys = [k for k in family.shape_keys if k not in getattr(family, "structure_keys", ())]
    base = max(correctness, key=lambda s: sum(math.log(max(1, s[k])) for k in keys))
    tiled = [k for k in keys if max(s[k] for s in correctness) >= 16] or keys
    seen = {k: {s[k] for s in correctness} for k in keys}
    T = tile_size(family)
    limit_work = max(sum(math.log(max(1, s[k])) for k in keys) for s in correctness) + math.log(512.0)

    def ok(shape: dict) -> bool:
        try:
            return family.check_shape(shape) is None
        except Exception:  # noqa: BLE001
            return False

    def variants(target: dict[str, int], order: list[str]) -> list[dict]:
        """The target mutations, then with fewer keys mutated (each shape once, valid ones only)."""
        import itertools

        out: list[dict] = []
        for r in range(len(order), 0, -1):
            for subset in itertools.combinations(order, r):
                s = dict(base)
                s.update({k: target[k] for k in subset})
                if ok(s) and s not in out and s not in correctness:
                    out.append(s)
        return out[:24]

    # drawn from the secret: which odd and aligned sizes are checked differs from judgement to judgement
    odd = {k: _odd_near(max(s[k] for s in correctness), seen[k], below=True, rng=rng) for k in keys}
    ones = {k: 1 for k in keys}
    aligned = {k: (T * (max(1, math.ceil(max(s[k] for s in correctness) / T)) + rng.choice((0, 0, 1)))
                   if k in tiled else base[k]) for k in keys}
    hidden_odd = {k: (_odd_near(rng.choice((3, 4)) * max(s[k] for s in correctness), seen[k], below=False, rng=rng)
                      if k in tiled else _odd_near(max(s[k] for s in correctness) + 1, seen[k], below=False, rng=rng))
                  for k in keys}

    def shrink(target: dict[str, int]) -> dict[str, int]:
        """Scale the tiled keys down until the work (sum of log sizes) is within 512x the largest check."""
        t = dict(target)
        for _ in range(16):
            work = sum(math.log(max(1, t[k])) for k in keys)
            if work <= limit_work:
                break
            k = max(tiled, key=lambda k: t[k])
            t[k] = max(max(s[k] for s in correctness) + 1, t[k] * 2 // 3)
        return t

    groups = [{"kind": "correctness", "shapes": [s]} for s in correctness]
    try:
        structure = family.structure_cases(correctness, dict(params or {}), rng, timed=list(timed)) \
            if hasattr(family, "structure_cases") else []
    except Exception as exc:  # noqa: BLE001 - a family's own hook failing is said, not fatal
        structure = []
        groups.append({"kind": f"structure (not drawn: {type(exc).__name__}: {str(exc)[:80]})", "shapes": []})
    for kind, shape, over, promised in structure_plan(structure, timed, dict(params or {}), rng):
        if ok(shape):
            over = dict(over)
            as_made = bool(over.pop(INPUTS_AS_MADE, False))  # inputs built for the case: no redrawn distribution
            groups.append({"kind": kind, "shapes": [shape], "params": over, "guarantees": promised,
                           **({"as_made": True} if as_made else {})})
    # past the timed reduction: the least-work checked shape with each reduction (K, cache length) longer than
    # any timed one, so a kernel correct only up to the timed length (a loop capped at it) fails here
    small = min(correctness, key=lambda s: sum(math.log(max(1, s[k])) for k in family.shape_keys))
    for k in getattr(family, "reduction_keys", ()):
        top = max([s[k] for s in list(timed) + list(correctness)])
        tries = [{**small, k: top + d} for d in sorted({T, 16, 64, 128, 2 * T})]
        tries = [t for t in tries if ok(t)]
        if tries:
            groups.append({"kind": f"past_{k}", "shapes": tries[:1]})
    # on the CPU each runs once per candidate on the interpreter: a shape whose baseline run takes longer than
    # HIDDEN_BUDGET_S gives way to the next of its group (fewer dimensions mutated), see the reference child
    budget = {} if on_gpu else {"budget_s": HIDDEN_BUDGET_S}
    groups += [
        {"kind": "odd", "shapes": variants(odd, tiled + [k for k in keys if k not in tiled]), **budget},
        {"kind": "ones", "shapes": variants(ones, keys), **budget},
        {"kind": "aligned", "shapes": variants(shrink(aligned), tiled), **budget},
        {"kind": "hidden_odd", "shapes": variants(shrink(hidden_odd), tiled + [k for k in keys if k not in tiled]), **budget},
    ]
    if on_gpu:
        groups += [{"kind": "timed", "shapes": [s]} for s in timed]
    else:
        # one dimension stretched towards the timed size, the others as checked: a cheat that skips work
        # past a size threshold shows on the CPU too. Tried smallest first; the reference child keeps the
        # largest whose baseline run stays within the interpreter's budget.
        for k in tiled:
            top = max((s[k] for s in timed), default=0)
            lo = max(s[k] for s in correctness)
            if top <= 2 * lo:
                continue
            vals, v = [], 2 * lo
            while v < top:
                vals.append(_odd_near(v, seen[k], below=False, rng=rng))
                v *= 2
            vals.append(top)
            shapes = [s for s in ({**base, k: x} for x in dict.fromkeys(vals)) if ok(s)]
            if shapes:
                groups.append({"kind": f"stretched_{k}", "shapes": shapes, "ascending": True, "budget_s": STRETCH_BUDGET_S})
    if not on_gpu:
        # each timed shape itself, a few programs of each launch (see _ProgramSampler): what only the
        # timed size reaches (every dimension large at once, the program count) is checked on a CPU too
        groups += [{"kind": "sampled", "shapes": [s], "sample": True} for s in timed]
        # and every program of each timed launch with the least work each (see wide_shape): a launch that
        # skips programs past a count, or maps them onto the same tiles, leaves part of the output unwritten
        groups += [{"kind": "wide", "shapes": [], "wide_of": s} for s in timed]
        # and past the timed launches: more programs than any spec shape launches (see wider_shapes), sampled
        factor, draw = rng.choice((4, 6, 8)), rng.randrange(1, 2**31)  # one draw for both parts
        groups += [{"kind": "wider", "shapes": [], "wider_of": list(timed), "part": part, "sample": True, "factor": factor, "draw": draw}
                   for part in range(WIDER_PARTS)]
    out = []
    for i, g in enumerate(groups):
        if not g["shapes"] and not g.get("wide_of") and not g.get("wider_of"):
            continue
        d1, d2 = DISTRIBUTIONS[i % len(DISTRIBUTIONS)], DISTRIBUTIONS[(i + 1) % len(DISTRIBUTIONS)]
        if g.get("as_made"):
            d1 = d2 = "normal"
        s1, s2 = i % len(seeds), (i + 1) % len(seeds)
        # on the CPU the largest hidden shapes are called once (their cost is the interpreter's)
        second = on_gpu or (g["kind"] not in ("aligned", "hidden_odd", "sampled", "wide", "structure_long", LONG_Q_KIND)
                             and not g["kind"].startswith("stretched"))
        g.setdefault("guarantees", _guarantees_of(g))
        g["cost_flops"] = _cost(family, g, params or {})
        out.append({"id": f"g{i}", **g, "seed": seeds[s1], "seed_index": s1, "dist": d1,
                    "second": {"seed": seeds[s2], "dist": d2} if second else None})
    return out
