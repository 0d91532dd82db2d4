"""mla_decode's `causal` flag against FlashMLA's semantics, with a float64 reference written here from
FlashMLA's documentation and tests (not imported from kernels/):

- flash_mla_with_kvcache(..., causal=False) is the default: every query token sees the whole cache.
- causal=True: query i of s_q sees keys j <= seqlen - s_q + i (the mask is tril(diagonal=s_k - s_q),
  bottom-right aligned); with s_q = 1 the two are the same.
- softmax_lse is [batch, h_q, s_q], natural log of sum_j exp(q.k_j * softmax_scale); a row that sees no key
  gets out = 0 and lse = +inf.

The kernel runs in the Triton interpreter (a child process: TRITON_INTERPRET must be set before the
kernels are decorated) on ragged lengths (0, 1, 2, 3, 65, 70) with shuffled pages and NaN past each
sequence's end, for causal false and true and s_q = 1, 2, 3, 4, with and without split-K."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow  # ~16 interpreter launches of the 576-dim kernel
LENS = [0, 1, 2, 3, 65, 70]
SCALE = 0.1

_CHILD = r"""
import sys, torch
from kernels.mla_decode import FAMILY as MLA, mla_decode
results = []
for s_q in (1, 2, 3, 4):
    shape = {"batch": 6, "s_q": s_q, "h_q": 16, "seqlen_k": 70}
    inp = MLA.make_inputs(shape, torch.float16, "cpu", s_q, {"seqlens": %(lens)r, "page_size": 32})
    for causal in (False, True):
        for cfg in (dict(BLOCK_H=16, BLOCK_N=32, num_splits=1, num_stages=1, num_warps=4),
                    dict(BLOCK_H=32, BLOCK_N=16, num_splits=3, num_stages=1, num_warps=4)):
            if cfg["BLOCK_H"] == 32 and s_q not in (2, 3):
                continue  # split-K with a row tile wider than the rows: s_q = 2 and 3 only (time)
            out, lse = mla_decode(inp["q"], inp["kv_cache"], inp["block_table"], inp["cache_seqlens"], %(scale)r, cfg,
                                  causal=causal)
            results.append({"s_q": s_q, "causal": causal, "cfg": cfg, "inputs": inp, "out": out, "lse": lse})
torch.save(results, sys.argv[1])
"""


def flashmla_reference(q: torch.Tensor, blocked_k: torch.Tensor, block_table: torch.Tensor, seqlens: torch.Tensor,
                       scale: float, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashMLA's dense decode in float64: (out [b, s_q, h_q, 512], lse [b, h_q, s_q], +inf where no key)."""
    b, s_q, h_q, _ = q.shape
    page = blocked_k.shape[1]
    out = torch.zeros(b, s_q, h_q, 512, dtype=torch.float64)
    lse = torch.empty(b, h_q, s_q, dtype=torch.float64)
    for i in range(b):
        n = int(seqlens[i])
        keys = torch.stack([blocked_k[int(block_table[i, t // page]), t % page, 0].double() for t in range(n)]) \
            if n else torch.zeros(0, 576, dtype=torch.float64)
        for s in range(s_q):
            visible = n if not causal else max(0, min(n, n - s_q + s + 1))
            for h in range(h_q):
                if visible == 0:
                    lse[i, h, s] = math.inf
                    continue
                logits = keys[:visible] @ q[i, s, h].double() * scale
                m = logits.max()
                w = torch.exp(logits - m)
                lse[i, h, s] = m + torch.log(w.sum())
                out[i, s, h] = (w / w.sum()) @ keys[:visible, :512]
    return out, lse


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    path = tmp_path_factory.mktemp("mla_causal") / "runs.pt"
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(REPO), PYTHONWARNINGS="ignore")
    code = _CHILD % {"lens": LENS, "scale": SCALE}
    proc = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, cwd=REPO, env=env,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return torch.load(path, weights_only=False)


def test_every_s_q_and_both_causal_values_ran(runs):
    assert {(r["s_q"], r["causal"]) for r in runs} == {(s, c) for s in (1, 2, 3, 4) for c in (False, True)}
    assert any(r["cfg"]["num_splits"] == 3 for r in runs)


def test_out_and_lse_match_flashmla_semantics_in_float64(runs):
    for r in runs:
        inp = r["inputs"]
        ref_out, ref_lse = flashmla_reference(inp["q"], inp["kv_cache"], inp["block_table"], inp["cache_seqlens"],
                                              SCALE, r["causal"])
        label = f"s_q={r['s_q']} causal={r['causal']} splits={r['cfg']['num_splits']}"
        out, lse = r["out"].double(), r["lse"].double()
        assert lse.shape == ref_lse.shape == (6, 16, r["s_q"]), label
        assert not torch.isnan(out).any() and not torch.isnan(lse).any(), label
        # +inf rows exactly where FlashMLA has them, finite everywhere else
        assert torch.equal(torch.isposinf(lse), torch.isposinf(ref_lse)), label
        assert not torch.isneginf(lse).any(), label
        fin = torch.isfinite(ref_lse)
        assert (lse[fin] - ref_lse[fin]).abs().max() < 2e-3, label
        assert (out - ref_out).abs().max() < 5e-3, label
        empty = torch.isposinf(ref_lse).permute(0, 2, 1)  # [b, s_q, h_q]
        assert (out[empty] == 0).all(), label


def test_causal_and_non_causal_differ_exactly_where_flashmla_says(runs):
    """s_q = 1: the flag changes nothing. s_q > 1: every query but the last sees fewer keys when causal."""
    by = {(r["s_q"], r["causal"], r["cfg"]["num_splits"]): r for r in runs}
    for s_q in (1, 2, 3, 4):
        full, causal = by[(s_q, False, 1)], by[(s_q, True, 1)]
        diff = (full["out"].double() - causal["out"].double()).abs()
        if s_q == 1:
            assert torch.equal(full["out"], causal["out"]) and torch.equal(full["lse"], causal["lse"])
            continue
        assert diff[4:, :s_q - 1].amax() > 0.01  # the long sequences: earlier queries lose keys
        assert diff[:, s_q - 1].amax() == 0  # the last query sees the whole cache either way
        # lengths below s_q: causal rows with no key are +inf, the same rows non-causal see every key
        short = causal["lse"][2]  # seqlen 2
        assert torch.isposinf(short[:, : max(0, s_q - 2)]).all() and torch.isfinite(full["lse"][2]).all()
    assert torch.isposinf(by[(4, False, 1)]["lse"][0]).all()  # seqlen 0: +inf either way
