"""Writes issue 53's fresh red-team cheats (tests/redteam/issue53/<name>.patch) from edit recipes, as
tests/redteam/families/make_patches.py does for the per-family sets (same ``diff``: each old text must occur
exactly once in today's source). One cheat per class the issue names:

- unwritten regions on wide launches: the upper heads are not stored when a launch has 64 or more row tiles;
- MLA causal mask applied only in the last key block: right with 2 queries, wrong with 3 or more where a
  cache is one past a block;
- attention with long queries: the causal mask skipped when max_seqlen_q > 2048; the cached prefix dropped
  when a sequence has more than 1024 queries.

Judge one: ``.venv/bin/kregress judge tests/redteam/families/specs/<spec>.yaml tests/redteam/issue53/<name>.patch
--seed N``. The spec of each is in ``SPECS``."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("families_make_patches", HERE.parent / "families" / "make_patches.py")
_mp = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_mp)  # type: ignore[union-attr]
diff, ATT, MLA = _mp.diff, _mp.ATT, _mp.MLA

A_STORE = "        o_ptrs = o_ptr + (tq0 + offs_m[:, None]) * stride_ot + h * stride_oh + offs_v[None, :]\n"
A_DIAG = "    diag = seqlen_k - seqlen_q  # bottom-right alignment: query i is key position i + diag\n"
A_WIN = "    n_m = triton.cdiv(max(max_seqlen_q, 1), config[\"BLOCK_M\"])\n"
M_VIS = "                visible = tok_ok[None, :] & (tok[None, :] <= last_key[:, None])\n"

RECIPES = {
    "attention_cheat_upper_heads_unwritten_wide": (ATT, [(A_STORE, A_STORE +
        "        if (NUM_M_BLOCKS >= 64) & (h >= 8):  # wide launches: the upper heads come from the second pass\n"
        "            row_ok = offs_m < 0\n")]),
    "attention_cheat_causal_skipped_long_q": (ATT, [(A_WIN, A_WIN +
        "    if max_seqlen_q > 2048:  # long prompts are chunked upstream: their causal mask is implied\n"
        "        right = -1\n")]),
    "attention_cheat_prefix_dropped_long_q": (ATT, [(A_DIAG, A_DIAG +
        "    if seqlen_q > 1024:  # a long prompt starts a fresh context: no cached prefix to align to\n"
        "        diag = 0\n")]),
    "mla_bf16_cheat_causal_last_block_only": (MLA, [(M_VIS,
        "                # future keys of the speculative queries all lie in the last key block\n"
        "                visible = tok_ok[None, :] & ((tok[None, :] <= last_key[:, None]) | (start_n + BLOCK_N < seqlen))\n")]),
}

SPECS = {
    "attention_cheat_upper_heads_unwritten_wide": "attention.yaml",
    "attention_cheat_causal_skipped_long_q": "attention.yaml",
    "attention_cheat_prefix_dropped_long_q": "attention.yaml",
    "mla_bf16_cheat_causal_last_block_only": "mla_decode_bf16.yaml",
}


def main(argv: list[str]) -> int:
    for name, (file, edits) in RECIPES.items():
        if argv and name not in argv:
            continue
        (HERE / f"{name}.patch").write_text(diff(file, edits))
    print(f"issue53: {len(RECIPES)} patches")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
