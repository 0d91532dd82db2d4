"""What kernels/interpreter.py's ``nested_patch`` saves: one family call on Triton's CPU interpreter with the fix
and with the interpreter as shipped (a nested ``@triton.jit`` helper's call re-patching ``triton.language``),
alternated in one process (these machines are noisy), on the gate's costly attention cases: a sequence after a
4000-key cached prefix (the gate's long structure case: a helper call per block of keys), a ragged varlen batch,
and an MLA decode batch. Prints each case's best of ``--repeat`` per side, their ratio (shipped / fixed), and
whether the outputs are bit-identical.

    .venv/bin/python bench/interpreter_patch.py [--repeat 3] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"  # before Triton decorates anything
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

CASES = [
    ("attention, 130 queries after a 4000-key prefix", "attention", "fp16",
     {"batch": 1, "seqlen": 130, "h_q": 1, "h_kv": 1, "head_dim": 64},
     {"causal": True, "prefix": [4000], "head_dims": [64]}, {"BLOCK_M": 32, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2}),
    ("attention, ragged batch of 4 (GQA 4:1)", "attention", "fp16",
     {"batch": 4, "seqlen": 48, "h_q": 4, "h_kv": 1, "head_dim": 64},
     {"causal": True, "seqlens": [39, 5, 48, 17], "prefix": [70, 101, 12, 55], "head_dims": [64]},
     {"BLOCK_M": 32, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2}),
    ("mla_decode, batch 4, 1000-token caches", "mla_decode", "bf16",
     {"batch": 4, "s_q": 1, "h_q": 16, "seqlen_k": 1000}, {},
     {"BLOCK_H": 16, "BLOCK_N": 32, "num_splits": 2, "num_stages": 2, "num_warps": 4}),
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)

    import torch
    import triton.runtime.interpreter as ti

    import kernels  # noqa: F401  (installs the interpreter's fixes)
    from kernels.interpreter import installed
    from kregress.core.family import get_family

    if installed().get("nested_patch") != "applied":
        print(f"nested_patch is {installed().get('nested_patch')!r} on this Triton: nothing to compare")
        return 1
    fixed = ti._patch_lang
    sides = {"fixed": fixed, "shipped": fixed._kregress_original}
    rows = []
    for label, name, dtype, shape, params, config in CASES:
        fam = get_family(name).for_params(params)
        inputs = fam.make_inputs(shape, {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype], "cpu", 0, params)
        best, outs = {k: float("inf") for k in sides}, {}
        for _ in range(args.repeat):
            for side, patch in sides.items():  # alternated: drift on the host hits both sides alike
                ti._patch_lang = patch
                try:
                    t0 = time.perf_counter()
                    out = fam.run(inputs, dict(config), params)
                    best[side] = min(best[side], time.perf_counter() - t0)
                finally:
                    ti._patch_lang = fixed
                outs[side] = out if isinstance(out, tuple) else (out,)
        same = all(torch.equal(a, b) for a, b in zip(outs["fixed"], outs["shipped"]))
        rows.append({"case": label, "fixed_s": best["fixed"], "shipped_s": best["shipped"],
                     "ratio": best["shipped"] / best["fixed"], "bit_identical": same})
        print(f"{label:52s} fixed {best['fixed']:6.2f} s  shipped {best['shipped']:6.2f} s  "
              f"shipped/fixed {best['shipped'] / best['fixed']:.2f}  bit-identical {same}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0 if all(r["bit_identical"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
