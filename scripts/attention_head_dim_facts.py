"""sm_90 compile facts of the attention family per (q/k, v) head dim, for the configs its space keeps.

For each pair of kernels/attention.HEAD_DIM_PAIRS (or those given), every config the space's rules keep is
listed, and the heaviest per (num_warps, BLOCK_M) (most shared memory, then most fp32 registers per thread)
is AOT-compiled for sm_90 with no GPU (kernels/compile.py): registers per thread, spill bytes and shared
memory, one line each, plus the configs the rules refuse and why. With --all every kept config is compiled.

    .venv/bin/python scripts/attention_head_dim_facts.py [--all] [--pairs 96x96,256x256]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kernels.attention import HEAD_DIM_PAIRS, padded_v, smem_bytes  # noqa: E402
from kernels.compile import CompileError, compile_units  # noqa: E402
from kregress.core.family import get_family  # noqa: E402
from kregress.core.spec import HardwareLimits  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--all", action="store_true", help="compile every kept config, not the heaviest per (warps, BLOCK_M)")
    ap.add_argument("--pairs", default="", help="e.g. 96x96,128x192 (default: every allowed pair)")
    args = ap.parse_args(argv)
    pairs = [tuple(int(x) for x in p.split("x")) for p in args.pairs.split(",") if p] or list(HEAD_DIM_PAIRS)
    fam = get_family("attention")
    lim = HardwareLimits()
    worst = 0
    for d, dv in pairs:
        params = {"head_dims": [d], "head_dim_v": dv, "causal": True}
        kept = list(fam.space.enumerate(params, lim))
        chosen = kept
        if not args.all:
            best: dict[tuple[int, int], dict] = {}
            for c in kept:
                key = (c["num_warps"], c["BLOCK_M"])
                rank = (smem_bytes(c, d, dv), c["BLOCK_M"] * (padded_v(dv) + c["BLOCK_N"]) / c["num_warps"])
                if key not in best or rank > best[key][0]:
                    best[key] = (rank, c)
            chosen = [c for _, c in best.values()]
        print(f"== q/k {d}, v {dv}: {len(kept)} configs kept, compiling {len(chosen)}")
        for c in sorted(chosen, key=lambda c: (c["num_warps"], c["BLOCK_M"])):
            try:
                s = compile_units(fam.compile_units(c, "bf16", params), "sm_90", lim, sass=False)
                line = f"regs {s.regs_per_thread:3d} spills {s.spill_bytes:5d} smem {s.smem_bytes:6d} (rule {smem_bytes(c, d, dv)})"
                worst = max(worst, s.spill_bytes)
            except CompileError as exc:
                line = f"{exc}"
                worst = max(worst, 1)
            print(f"  {d}x{dv} BLOCK_M={c['BLOCK_M']:3d} BLOCK_N={c['BLOCK_N']:3d} stages={c['num_stages']} "
                  f"warps={c['num_warps']}: {line}", flush=True)
    return 1 if worst else 0


if __name__ == "__main__":
    sys.exit(main())
