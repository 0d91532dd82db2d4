"""How often the gate catches a kernel that skips the work of one program in eight (issue 30, item 3).

Two measurements, on the red-team family specs (tests/redteam/families/specs):

1. ``--draws N`` (default 100): N judgements' program samples, drawn exactly as the gate draws them (a
   fresh secret per judgement and case; the first choice of every slot, before idle programs are replaced
   by working ones of the same class), on each family's real timed launch grids; for every
   residue r of ``pid % 8`` on every grid axis, whether the sample runs a program of that class. A kernel that
   skips the class r is caught only if one of its programs runs (then it writes less than the baseline's
   program of the same id, and the case is settled by a full run).
2. ``--judged N`` (default 2): N real judgements (``kregress judge`` on the CPU interpreter, new secret each)
   of a gemm patch whose programs with ``pid % 8 == r`` store nothing on grids of >= 128 programs (the
   timed shape only), r drawn per judgement; each must be REGRESS.

    .venv/bin/python bench/program_skip.py [--draws 100] [--judged 2] [--json OUT]
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import random
import secrets
import sys
import tempfile
import time
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"  # the launch grids are read in the interpreter (nothing runs)
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
SPECS = REPO / "tests" / "redteam" / "families" / "specs"


def grids() -> dict[str, list[tuple[int, int, int]]]:
    """Each family spec's timed launch grids (the baseline config), padded to three axes."""
    from kernels.candidate import _launch_grids
    from kernels.dtypes import TORCH_DTYPES
    from kregress.core.bind import load_bound

    out = {}
    for path in sorted(SPECS.glob("*.yaml")):
        b = load_bound(path)
        gs = []
        for shape in b.spec.shape_matrix:
            for g in _launch_grids(b.family, shape, b.spec.baseline, TORCH_DTYPES[b.spec.dtype], b.spec.params):
                gs.append(tuple(list(g) + [1] * (3 - len(g))))
        out[path.stem] = gs
    return out


def draws(n: int, fam_grids: dict) -> dict:
    from kernels.candidate import sample_programs

    res = {}
    for fam, gs in fam_grids.items():
        entry: dict = {"grids": [list(g) for g in gs]}
        for period in (8, 16, 5, 7):
            caught = total = 0
            for _ in range(n):
                secret = secrets.randbits(62)
                seed = random.Random(f"{secret}:sampled:g0").randrange(1, 2**31)  # as _Judgement._sample_seed
                for j, g in enumerate(gs):
                    picks = sample_programs(g, random.Random(f"{seed}:{j}"))  # as _sampled_baseline, first choices
                    for axis in range(3):
                        if g[axis] < period:
                            continue
                        for r in range(period):
                            total += 1
                            caught += any(p[axis] % period == r for p in picks)
            entry[f"one_in_{period}"] = {"skips_tried": total, "caught": caught, "rate": caught / total if total else None}
        res[fam] = entry
    return res


def judged(n: int) -> list[dict]:
    from kernel_assets.judge import judge, read_patch_args

    os.environ.setdefault("DAGSTER_HOME", tempfile.mkdtemp())
    rel = "kernels/gemm.py"
    old = (REPO / rel).read_text()
    out = []
    for _ in range(n):
        r = secrets.randbelow(8)
        # only on grids of 128 programs or more (the timed shape): no checked shape reaches it, only the
        # sampled run of the timed launch can see it
        new = old.replace("    tl.store(c_ptrs, c, mask=mask_m & mask_n)",
                          f"    if (tl.num_programs(0) < 128) | (tl.program_id(0) % 8 != {r}):\n"
                          "        tl.store(c_ptrs, c, mask=mask_m & mask_n)")
        diff = "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"a/{rel}", f"b/{rel}"))
        p = Path(tempfile.mkdtemp()) / f"skip_one_in_eight_{r}.patch"
        p.write_text(diff)
        t0 = time.perf_counter()
        res = judge(SPECS / "gemm.yaml", read_patch_args([str(p)]), seed=secrets.randbits(62), log=lambda m: None)
        row = res.rows[-1]
        v = res.verdicts[row.variant_id]
        out.append({"residue": r, "verdict": v.verdict, "cause": v.cause, "error": row.error,
                    "detail": (row.error_detail or "")[:200], "seconds": round(time.perf_counter() - t0, 1)})
        print(out[-1], flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--draws", type=int, default=100)
    ap.add_argument("--judged", type=int, default=2)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    report = {"draws": draws(a.draws, grids())}
    for fam, r in report["draws"].items():
        parts = [f"1/{p}: {r[f'one_in_{p}']['caught']}/{r[f'one_in_{p}']['skips_tried']}" for p in (8, 16, 5, 7)]
        print(f"{fam} (grids {r['grids']}): skipped class sampled in {', '.join(parts)} over {a.draws} judgements",
              flush=True)
    if a.judged:
        report["judged"] = judged(a.judged)
        print(f"judged: {sum(j['verdict'] == 'REGRESS' for j in report['judged'])}/{len(report['judged'])} REGRESS")
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
