"""The gate's comparisons (process side): candidate outputs against the float64 reference and the
baseline, output buffers and what must stay untouched, read-only inputs, and what a sampled launch leaves
to settle. Each problem is a sentence naming the case; ``kregress.core.checks`` names the checks."""

from __future__ import annotations

import math
from typing import Any

from kernels.gate_cases import _outputs
from kregress.core.checks import Evidence, Suspicion


def base_writes(stats: dict) -> list[list[dict]]:
    """Per output, per launch: its program count and, per program id, the elements the baseline's program
    wrote there and a digest of where ({"grid": n, "writes": {pid: n}, "where": {pid: digest}})."""
    return [[{"grid": la["grid"], "writes": dict(zip(la["pids"], la["filled"])), "where": dict(zip(la["pids"], la.get("where", [])))}
             for la in o["launches"]] for o in stats["outputs"]]


def sampled_problems(out: Any, ref: Any, stats: dict, atol: float, rtol: float,
                     base: list[list[dict]] | None = None, cover: bool = True, reach: bool = True) -> list[str]:
    """The sentences of ``sampled_suspicions``."""
    return [s.text for s in sampled_suspicions(out, ref, stats, atol, rtol, base, cover, reach)]


def sampled_suspicions(out: Any, ref: Any, stats: dict, atol: float, rtol: float,
                       base: list[list[dict]] | None = None, cover: bool = True, reach: bool = True) -> list[Suspicion]:
    """What a sampled run of a timed shape shows that a full run would have to settle: a written element
    that differs from the reference, a launch whose programs cannot cover the output (the largest amount
    a sampled program wrote, times the grid, is less than the elements the reference holds), no launch writing an output at
    all; and with ``base`` (``base_writes`` of the baseline's runs) a program that wrote less than the
    baseline's program of the same id, a program of the call's first launch that wrote other elements than it (a kernel that maps
    program ids to tiles otherwise: a swizzle is honest, ``pid % 40`` leaves tiles to nobody, and only a full
    run tells them apart), a launch of another program count than the baseline's (a persistent kernel
    divides the work otherwise: its programs cannot be compared by id, so a full run settles it), or
    launches unlike the baseline's; the reach is then held to what the baseline's programs reached. Without
    ``cover`` (the baseline's run of a wider shape's upper picks: a few programs of a grid whose programs differ,
    grouped GEMM's tiles of 8 real rows and of 2) the reach only has to be more than nothing; without ``reach``
    it is not checked (the baseline's second run: only the slots' alternatives, their reach is the runs' together,
    see ``kernels.gate_child._prepare_sampled``). Empty: nothing to settle. Each a ``Suspicion`` of a kind
    (``kregress.core.checks.Evidence``) naming the output and, where one is, the program."""
    import torch

    from kernels.measure import compare

    out_l, ref_l = _outputs(out), _outputs(ref)
    if len(out_l) != len(ref_l):
        return [Suspicion(Evidence.OUTPUT_COUNT, f"{len(out_l)} output(s), the reference has {len(ref_l)}")]
    why: list[Suspicion] = []
    for i, (o, r) in enumerate(zip(out_l, ref_l)):
        if not torch.is_tensor(r):
            continue
        if not torch.is_tensor(o) or tuple(o.shape) != tuple(r.shape) or not o.is_floating_point():
            why.append(Suspicion(Evidence.NOT_FLOAT, f"output {i} is not a floating tensor of the reference's shape", i))
            continue
        launches = stats["outputs"][i]["launches"] if i < len(stats["outputs"]) else []
        if not launches:
            why.append(Suspicion(Evidence.NO_LAUNCH, f"no launch wrote output {i}", i))
            continue
        mine = (base[i] if i < len(base) else []) if base is not None else None
        short_reach = _reach_problem(i, launches, r, mine, cover) if reach else None
        if short_reach:
            why.append(Suspicion(Evidence.SHORT_REACH, short_reach, i))
        if mine is not None:
            if len(mine) != len(launches):
                why.append(Suspicion(Evidence.LAUNCH_COUNT, f"output {i}: written by {len(launches)} launch(es), the baseline's by {len(mine)}", i))
            for j, la in enumerate(launches[:len(mine)]):
                if la["grid"] != mine[j]["grid"]:
                    why.append(Suspicion(Evidence.GRID, f"output {i}: launch {j} has {la['grid']} programs, the baseline's "
                                         f"{mine[j]['grid']} (not comparable program by program)", i))
                    continue
                writes = mine[j]["writes"]
                short = [(p, n, writes[p]) for p, n in zip(la.get("pids", []), la["filled"]) if n < writes.get(p, -1)]
                missing = [p for p in la.get("pids", []) if p not in writes]
                if short or missing:
                    p, n, b = short[0] if short else (missing[0], 0, "?")
                    why.append(Suspicion(Evidence.WROTE_LESS, f"output {i}: program ({p}) of a {la['grid']}-program launch "
                                         f"wrote {n} elements, the baseline's {b}", i, p))
                    break
                # where a program wrote is its own only in the call's first launch: a later one (MLA's combine after
                # its split-K decode) writes what the sampled programs of the earlier ones computed, and those differ
                # between the baseline's runs and a candidate's, so its count is compared, not its where
                where = (mine[j].get("where") or {}) if la.get("index", 0) == 0 else {}
                moved = [p for p, w in zip(la.get("pids", []), la.get("where", [])) if p in where and w != where[p]]
                if moved:
                    why.append(Suspicion(Evidence.WROTE_ELSEWHERE, f"output {i}: program ({moved[0]}) of a {la['grid']}-program "
                                         "launch wrote other elements than the baseline's program of the same id "
                                         f"({len(moved)} of {len(la.get('pids', []))} sampled programs)", i, moved[0]))
        written = ~torch.isnan(o)
        if written.any():
            res = compare(o[written], r[written], atol, rtol)
            if not res["ok"]:
                why.append(Suspicion(Evidence.VALUES, f"output {i}: {res['mismatches']} of {int(written.sum())} written "
                                     "elements differ from the reference", i))
    return why


def program_differences(stats: dict, base: list[list[dict]]) -> dict[tuple, Evidence]:
    """Per program of a sampled run (``stats``), how it differs from the baseline's program of the same id
    (``base``: ``base_writes`` of the baseline's run of the same programs on the same inputs): {(output,
    launch, "x,y,z"): WROTE_LESS or WROTE_ELSEWHERE}, and {(output, launch, None): GRID} for a launch of
    another program count, {(output, None, None): LAUNCH_COUNT} for another number of launches. Where a
    program wrote is compared in the call's first launch only (as ``sampled_suspicions`` does)."""
    diffs: dict[tuple, Evidence] = {}
    for i, o in enumerate(stats.get("outputs", [])):
        launches = o.get("launches", [])
        mine = base[i] if i < len(base) else []
        if len(mine) != len(launches):
            diffs[(i, None, None)] = Evidence.LAUNCH_COUNT
        for j, la in enumerate(launches[:len(mine)]):
            if la["grid"] != mine[j]["grid"]:
                diffs[(i, j, None)] = Evidence.GRID
                continue
            writes, where = mine[j]["writes"], (mine[j].get("where") or {}) if la.get("index", 0) == 0 else {}
            for k, (p, n) in enumerate(zip(la.get("pids", []), la["filled"])):
                if n < writes.get(p, -1) or p not in writes:
                    diffs[(i, j, p)] = Evidence.WROTE_LESS
                elif p in where and k < len(la.get("where", [])) and la["where"][k] != where[p]:
                    diffs[(i, j, p)] = Evidence.WROTE_ELSEWHERE
    return diffs


def grids_of(stats: dict) -> list[tuple[int, ...]]:
    """The launch grids (nx, ny, nz) a sampled run made, in order."""
    return [tuple(int(x) for x in la["dims"]) for la in stats.get("ran", [])]


def _reach_problem(i: int, launches: list[dict], r: Any, mine: list[dict] | None, cover: bool) -> str | None:
    """Why the sampled programs of output ``i``'s ``launches`` cannot cover it (the largest write of a sampled
    program times the grid is short of what must be written), or None. What must be written: the reference's
    values, not an output buffer's NaN (as handed in) where no correct program writes (grouped GEMM's padding
    rows: a wider case with few real rows has most tiles of them); with ``mine`` (the baseline's launches of the
    same programs) no more than they reached; without ``cover`` (a wider shape's uneven upper picks) only more
    than nothing."""
    import torch

    got = sum(max(la["filled"], default=0) * la["grid"] for la in launches)
    need = int((~torch.isnan(r)).sum()) if r.is_floating_point() else r.numel()
    if mine is not None:
        need = min(need, sum(max(m["writes"].values(), default=0) * m["grid"] for m in mine))
    elif not cover:
        need = min(need, 1)
    if got >= need:
        return None
    return f"output {i}: the launches reach at most {got} of the {need} elements it must hold (largest write of a sampled program x grid)"


def reach_problems(ref: Any, stats: dict, cover: bool = True) -> list[str]:
    """``_reach_problem`` for every tensor output written by a launch of ``stats`` (the baseline's sampled runs
    merged: the second runs only alternatives, whose later launches read what the first run computed)."""
    import torch

    outs = stats["outputs"]
    return [w for i, r in enumerate(_outputs(ref)) if torch.is_tensor(r) and i < len(outs) and outs[i]["launches"]
            for w in [_reach_problem(i, outs[i]["launches"], r, None, cover)] if w]


def _error_fractions(out: Any, ref: Any, atol: float, rtol: float) -> tuple[float, float, int]:
    """(max, sum of squares, count) of |out - ref| / (atol + rtol |ref|) over the reference's finite
    elements; a non-finite output there counts as infinite error."""
    import torch

    o = out.detach().to("cpu", torch.float64)
    r = ref.detach().to("cpu", torch.float64)
    if o.shape != r.shape:
        return math.inf, math.inf, 1
    finite = torch.isfinite(r)
    frac = (o - r).abs() / (atol + rtol * r.abs())
    frac = torch.where(torch.isfinite(o), frac, torch.full_like(frac, math.inf))
    frac = frac[finite]
    if frac.numel() == 0:
        return 0.0, 0.0, 0
    return float(frac.max()), float((frac * frac).sum()), int(frac.numel())


def _structure_problem(out: Any, base: Any) -> str | None:
    """Why the candidate's outputs are not shaped like the baseline's (count, tensor or not, shape, dtype),
    or None. A non-tensor where the baseline returns a tensor (None, a list) has nothing to compare."""
    import torch

    outs, bases = _outputs(out), _outputs(base)
    if len(outs) != len(bases):
        return f"{len(outs)} output(s), the baseline returns {len(bases)}"
    for i, (o, b) in enumerate(zip(outs, bases)):
        if not torch.is_tensor(b):
            continue
        if not torch.is_tensor(o):
            return f"output {i} is {type(o).__name__}, not a tensor like the baseline's"
        if tuple(o.shape) != tuple(b.shape) or o.dtype != b.dtype:
            return f"output {i} is {o.dtype} {tuple(o.shape)}, the baseline's {b.dtype} {tuple(b.shape)}"
    return None


def _same(a: Any, b: Any) -> bool:
    import torch

    if torch.is_tensor(a) and torch.is_tensor(b):
        return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a.view(torch.uint8) if a.numel() else a,
                                                                              b.view(torch.uint8) if b.numel() else b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _where(tb: str) -> str:
    """The last source line a traceback names (where the candidate raised), as `` (at: ...)``."""
    lines = [ln.strip() for ln in tb.strip().splitlines()[:-1] if ln.strip() and set(ln.strip()) - {"^", "~"}]
    code = [ln for ln in lines if not ln.startswith(("File ", "Traceback"))]
    return f" (at: {code[-1][:200]})" if code else ""


def input_problems(after: dict, before: dict, buffers: dict) -> list[str]:
    """Read-only inputs (every input but the output buffers) that are not bit-identical after the call."""
    if not isinstance(after, dict) or not isinstance(before, dict):
        return [] if _same(after, before) else ["the inputs changed during the call (they must be left as they were)"]
    changed = [k for k in before if k not in buffers and not _same(after.get(k), before[k])]
    return [f"the inputs changed during the call: the read-only input(s) {', '.join(changed)} must come back "
            "bit-identical"] if changed else []


def buffer_problems(out: Any, after: dict, before: dict, ref: Any, buffers: dict, tol: list[float], poison: str) -> list[str]:
    """An output buffer compared as an output: after the call it must hold the result it stands for
    (within tolerance, where the reference computes a value), and every element the reference leaves as
    handed in (padding, rows past ``masked_m``: the poison) must come back bit for bit, in the buffer and
    in the returned result."""
    import torch

    from kernels.measure import compare

    why: list[str] = []
    refs, outs = _outputs(ref), _outputs(out)
    for name, idx in buffers.items():
        b0, b1 = before.get(name), after.get(name) if isinstance(after, dict) else None
        if not (torch.is_tensor(b0) and torch.is_tensor(b1)) or idx >= len(refs) or not torch.is_tensor(refs[idx]):
            continue
        r = refs[idx].detach().to("cpu", torch.float64)
        p = b0.detach().to("cpu", torch.float64)
        if r.shape != p.shape or b1.shape != b0.shape:
            why.append(f"the output buffer {name} is {tuple(b1.shape)}, the reference {tuple(r.shape)}")
            continue
        untouched = (r == p) | (torch.isnan(r) & torch.isnan(p))
        res = compare(b1[~untouched], r[~untouched], *tol)
        if not res["ok"]:
            why.append(f"the output buffer {name} does not hold the result after the call: {res['sample'][:200]}")
        for what, t in (("buffer " + name, b1), (f"result {idx}", outs[idx] if idx < len(outs) else None)):
            if not torch.is_tensor(t) or t.shape != b0.shape or t.dtype != b0.dtype:
                continue
            kept = _bits(t)[untouched] == _bits(b0)[untouched]
            if not bool(kept.all()):
                n = int((~kept).sum())
                why.append(f"the {what}: {n} of {int(untouched.sum())} elements a correct kernel leaves untouched "
                           f"(padding, rows past the valid count; poisoned with {poison}) were written")
    return why


def _bits(t: Any) -> Any:
    import torch

    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    return t.detach().cpu().contiguous().view(ints[t.element_size()])


class _Tally:
    """Correctness and precision over every case of one candidate (or of the baseline)."""

    def __init__(self, family: Any, dtype: str):
        self.family, self.dtype = family, dtype
        self.max_abs = self.max_rel = 0.0
        self.nan_inf = False
        self.mismatches = 0
        self.samples: list[str] = []
        self.atols: list[float] = []
        self.rtols: list[float] = []
        self.frac_max = 0.0
        self.frac_sq = 0.0
        self.frac_n = 0
        self.worst = ""
        self.worst_frac = -1.0
        self.shapes: list[str] = []

    def add(self, label: str, out: Any, ref: Any, tol: list[float]) -> None:
        import torch

        from kernels.measure import compare

        atol, rtol = tol
        self.atols.append(atol)
        self.rtols.append(rtol)
        if label.split(" ")[0] not in self.shapes:
            self.shapes.append(label.split(" ")[0])
        outs, refs = _outputs(out), _outputs(ref)
        if len(outs) != len(refs):
            self.mismatches += 1
            self.samples.append(f"[{label}] {len(outs)} output(s), reference has {len(refs)}")
            return
        for i, (o, r) in enumerate(zip(outs, refs)):
            if torch.is_tensor(r) and not torch.is_tensor(o):
                self.mismatches += 1
                self.samples.append(f"[{label}] output {i} is {type(o).__name__}, not a tensor")
                continue
            if not (torch.is_tensor(o) and torch.is_tensor(r)):
                continue
            res = compare(o, r, atol, rtol)
            self.max_abs = max(self.max_abs, res["max_abs"])
            self.max_rel = max(self.max_rel, res["max_rel"])
            self.nan_inf |= res["nan_inf"]
            if res["mismatches"]:
                self.mismatches += max(res["mismatches"], 1)
                which = f" output {i}" if len(outs) > 1 else ""
                self.samples.append(f"[{label}{which}] {res['sample']}")
            mx, sq, n = _error_fractions(o, r, atol, rtol)
            self.frac_max = max(self.frac_max, mx)
            self.frac_sq += sq
            self.frac_n += n
            if mx > self.worst_frac:
                self.worst_frac, self.worst = mx, label

    def problem(self, text: str) -> None:
        self.mismatches += 1
        self.samples.append(text)

    @property
    def rms(self) -> float:
        return math.sqrt(self.frac_sq / self.frac_n) if self.frac_n else 0.0

    def correctness(self) -> Any:
        from kregress.core.records import Correctness

        return Correctness(ok=self.mismatches == 0 and not self.nan_inf, max_abs_err=self.max_abs, max_rel_err=self.max_rel,
                           nan_inf=self.nan_inf, mismatches=self.mismatches,
                           tolerance=max(self.atols + self.rtols) if self.atols else 0.0,
                           shapes_checked=self.shapes, mismatch_sample=" | ".join(self.samples)[:1200],
                           atol=max(self.atols) if self.atols else None, rtol=max(self.rtols) if self.rtols else None,
                           dtype=self.dtype)
