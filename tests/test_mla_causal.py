"""mla_decode is always causal over its s_q queries (documented in kernels/mla_decode.py and the
README): query i sees keys 0 .. seqlen - s_q + i. FlashMLA defaults to causal=False; the kernel's
output must match the causal float64 reference and differ from the non-causal one where the two
differ (every query but the last when s_q > 1)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

_CHILD = r"""
import json
import torch
from kernels.mla_decode import FAMILY as MLA, mla_decode, reference_mla_decode
shape = {"batch": 2, "s_q": 3, "h_q": 16, "seqlen_k": 9}
params = {"seqlens": [9, 4], "softmax_scale": 0.1}
inp = MLA.make_inputs(shape, torch.float16, "cpu", 0, params)
cfg = {"BLOCK_H": 16, "BLOCK_N": 16, "num_splits": 1, "num_stages": 1, "num_warps": 4}
out, lse = mla_decode(inp["q"], inp["kv_cache"], inp["block_table"], inp["cache_seqlens"], 0.1, cfg)
causal, _ = reference_mla_decode(inp["q"], inp["kv_cache"], inp["block_table"], inp["cache_seqlens"], 0.1)
# non-causal (FlashMLA's default): each query alone, as an s_q = 1 query over the whole cache
full = torch.cat([reference_mla_decode(inp["q"][:, s:s + 1].contiguous(), inp["kv_cache"], inp["block_table"],
                                       inp["cache_seqlens"], 0.1)[0] for s in range(3)], dim=1)
o = out.double()
print("@@" + json.dumps({
    "vs_causal": float((o - causal).abs().max()),
    "vs_full_per_query": [float((o[:, s] - full[:, s]).abs().max()) for s in range(3)],
}))
"""


def test_mla_decode_is_causal_over_s_q():
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(REPO), PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, cwd=REPO, env=env, timeout=600)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("@@")), None)
    assert line, proc.stderr[-3000:]
    res = json.loads(line[2:])
    assert res["vs_causal"] < 5e-3
    first, second, last = res["vs_full_per_query"]
    assert first > 0.05 and second > 0.05  # they see fewer keys than a non-causal query would
    assert last < 5e-3  # the last query sees the whole cache either way
