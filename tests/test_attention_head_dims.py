"""Attention head dims as flash-attn takes them: q/k = v in 32, 64, 96, 128, 192, 256, DeepSeek's 192/128,
and 128/192 (which the kernel takes though no flash-attn build does). The non-powers of two run as two dots
(96 = 64 + 32, 192 = 128 + 64) and a padded, masked v tile.

The float64 reference is written here from flash_attn_varlen_func's documented rule, not imported from
kernels/: packed sequences (cu_seqlens), query i of a sequence sits at key position i + seqlen_k -
seqlen_q (bottom-right), sees keys j with i + off - left <= j <= i + off + right (window_size, -1
unbounded; causal means right = 0), query head h reads KV head h // (h_q / h_kv), softmax_scale defaults to
1 / sqrt(d_qk), lse [h_q, total_q]. The kernel runs in the interpreter (a child process). The sm_90 compile
facts (registers, spills, shared memory) of the heaviest configs the space's rules keep are real AOT
compiles."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernels.attention import HEAD_DIM_PAIRS, smem_bytes
from kernels.compile import compile_units
from kregress.core.family import get_family
from kregress.core.spec import HardwareLimits

REPO = Path(__file__).resolve().parent.parent
ATTN = get_family("attention")
pytestmark = pytest.mark.slow  # interpreter launches and a dozen sm_90 compiles

# (id, d_qk, d_v, dtype, causal, window, lens_q, prefix, h_q, h_kv, config)
CASES = [
    ("d32-causal-gqa-varlen", 32, 32, "float16", True, (-1, 0), [37, 0, 50], [0, 0, 5], 4, 2, (16, 16)),
    ("d96-window", 96, 96, "float16", False, (5, 3), [29, 41], [0, 7], 2, 1, (16, 16)),
    ("d96-causal-bf16", 96, 96, "bfloat16", True, (-1, 0), [45], [3], 2, 2, (64, 32)),
    ("d256-causal-prefix", 256, 256, "float16", True, (-1, 0), [33, 18], [9, 0], 2, 1, (16, 32)),
    ("d192-192", 192, 192, "float16", False, (-1, -1), [21, 30], [0, 0], 2, 2, (32, 16)),
    ("d128-v192", 128, 192, "float16", True, (7, 0), [40], [11], 2, 1, (16, 16)),
]

_CHILD = r"""
import sys, torch
from kernels.attention import attention
cases = %(cases)r
results = {}
for cid, d, dv, dtype, causal, window, lens, prefix, h_q, h_kv, (bm, bn) in cases:
    g = torch.Generator().manual_seed(len(results))
    dt = getattr(torch, dtype)
    lk = [n + p for n, p in zip(lens, prefix)]
    q = torch.randn(sum(lens), h_q, d, generator=g).to(dt)
    k = torch.randn(sum(lk), h_kv, d, generator=g).to(dt)
    v = torch.randn(sum(lk), h_kv, dv, generator=g).to(dt)
    cu = lambda xs: torch.tensor([0] + [sum(xs[:i + 1]) for i in range(len(xs))], dtype=torch.int32)
    cfg = dict(BLOCK_M=bm, BLOCK_N=bn, num_stages=1, num_warps=4)
    out, lse = attention(q, k, v, cu(lens), cu(lk), max(lens), cfg, window_size=window)
    results[cid] = {"q": q, "k": k, "v": v, "lens": lens, "lk": lk, "out": out, "lse": lse}
torch.save(results, sys.argv[1])
"""


def flash_attn_reference(q, k, v, lens_q, lens_k, window: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """flash_attn_varlen_func's forward in float64, one (sequence, head, query) at a time."""
    h_q, h_kv, d = q.shape[1], k.shape[1], q.shape[2]
    scale = 1.0 / math.sqrt(d)
    left, right = window
    out = torch.zeros(q.shape[0], h_q, v.shape[2], dtype=torch.float64)
    lse = torch.full((h_q, q.shape[0]), math.inf, dtype=torch.float64)
    q0 = k0 = 0
    for nq, nk in zip(lens_q, lens_k):
        off = nk - nq
        for i in range(nq):
            lo = 0 if left < 0 else max(0, i + off - left)
            hi = nk - 1 if right < 0 else min(nk - 1, i + off + right)
            for h in range(h_q):
                if hi < lo:
                    continue
                kh = h // (h_q // h_kv)
                logits = k[k0 + lo:k0 + hi + 1, kh].double() @ q[q0 + i, h].double() * scale
                w = torch.softmax(logits, 0)
                out[q0 + i, h] = w @ v[k0 + lo:k0 + hi + 1, kh].double()
                lse[h, q0 + i] = torch.logsumexp(logits, 0)
        q0, k0 = q0 + nq, k0 + nk
    return out, lse


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    path = tmp_path_factory.mktemp("attn_dims") / "runs.pt"
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(REPO), PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, "-c", _CHILD % {"cases": CASES}, str(path)], capture_output=True, text=True,
                          cwd=REPO, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return torch.load(path, weights_only=False)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_head_dim_matches_flash_attn_rule(runs, case):
    cid, d, dv, dtype, causal, window, *_ = case
    r = runs[cid]
    ref_out, ref_lse = flash_attn_reference(r["q"], r["k"], r["v"], r["lens"], r["lk"], window)
    out, lse = r["out"].double(), r["lse"].double()
    assert out.shape == ref_out.shape and out.shape[-1] == dv and lse.shape == ref_lse.shape
    assert not torch.isnan(out).any() and torch.equal(torch.isinf(lse), torch.isinf(ref_lse))
    tol = 2e-2 if dtype == "bfloat16" else 4e-3
    err = float((out - ref_out).abs().max())
    assert err < tol, (cid, err)
    fin = torch.isfinite(ref_lse)
    assert float((lse[fin] - ref_lse[fin]).abs().max()) < 2e-3


def test_params_and_shapes_take_flash_attn_head_dims():
    for d in (32, 64, 96, 128, 192, 256):
        assert ATTN.check_shape({"batch": 1, "seqlen": 8, "h_q": 2, "h_kv": 1, "head_dim": d}) is None
        assert ATTN.check_params({"head_dims": [d], "head_dim_v": d}) is None
    assert ATTN.check_params({"head_dims": [192], "head_dim_v": 128}) is None
    assert ATTN.check_params({"head_dims": [128], "head_dim_v": 192}) is None
    assert "allowed: 32, 64, 96, 128, 192, 256" in ATTN.check_shape({"batch": 1, "seqlen": 8, "h_q": 2, "h_kv": 1, "head_dim": 80})
    problem = ATTN.check_params({"head_dims": [32], "head_dim_v": 256})
    assert problem and "(q/k, v) = (32, 256) is not allowed" in problem and "(128, 192)" in problem
    assert ATTN.check_params({"head_dims": [96]}) is None  # v defaults to the q/k dim
    assert (96, 96) in HEAD_DIM_PAIRS and (256, 256) in HEAD_DIM_PAIRS


def _heaviest_kept(params: dict, lim) -> list[dict]:
    """The kept configs nearest the rules' edges: the most live registers per thread with 2 warps (mma.sync)
    and with 4 or more (warpgroup MMA), and the most shared memory."""
    from kernels.attention import _pairs_of, live_values

    kept = list(ATTN.space.enumerate(params, lim))
    (d, dv), = _pairs_of(params)
    picks = [max(kept, key=lambda c: (smem_bytes(c, d, dv), live_values(c, d, dv)))]
    for group in ([c for c in kept if c["num_warps"] == 2], [c for c in kept if c["num_warps"] >= 4]):
        if group:
            picks.append(max(group, key=lambda c: (live_values(c, d, dv), smem_bytes(c, d, dv))))
    return [dict(t) for t in dict.fromkeys(tuple(sorted(c.items())) for c in picks)]


@pytest.mark.parametrize("pair", [(32, 32), (96, 96), (256, 256), (128, 192)], ids=lambda p: f"{p[0]}x{p[1]}")
def test_rules_keep_sm90_legal_configs(pair):
    """The heaviest kept configs of each head dim compile for sm_90 without spills, within the shared memory,
    and the rule's byte count is Triton's."""
    d, dv = pair
    lim = HardwareLimits()
    params = {"head_dims": [d], "head_dim_v": dv, "causal": True}
    configs = _heaviest_kept(params, lim)
    assert configs
    for cfg in configs:
        stats = compile_units(ATTN.compile_units(cfg, "bf16", params), "sm_90", lim)
        line = f"{d}x{dv} {cfg}: regs {stats.regs_per_thread}, spills {stats.spill_bytes}, smem {stats.smem_bytes}"
        print("\n" + line)
        assert stats.spill_bytes == 0, line
        assert stats.smem_bytes <= lim.max_shared_memory_per_block, line
        if cfg["num_stages"] > 1:
            assert stats.smem_bytes <= smem_bytes(cfg, d, dv), line


def test_rules_refuse_the_configs_measured_to_spill_or_overflow():
    """sm_90 compiles (scripts/attention_head_dim_facts.py) that spilled: the rules refuse them before any compile."""
    lim = HardwareLimits()
    spilled = [  # (d_qk, d_v, config, spill bytes measured)
        (256, 256, dict(BLOCK_M=64, BLOCK_N=64, num_stages=3, num_warps=4), 168),
        (256, 256, dict(BLOCK_M=128, BLOCK_N=64, num_stages=2, num_warps=8), 56),
        (256, 256, dict(BLOCK_M=64, BLOCK_N=32, num_stages=4, num_warps=4), 64),
        (256, 256, dict(BLOCK_M=128, BLOCK_N=32, num_stages=4, num_warps=8), 16),
        (256, 256, dict(BLOCK_M=16, BLOCK_N=32, num_stages=4, num_warps=2), 64),
        (128, 128, dict(BLOCK_M=64, BLOCK_N=128, num_stages=3, num_warps=4), 96),
        (32, 32, dict(BLOCK_M=128, BLOCK_N=128, num_stages=4, num_warps=4), 144),
        (128, 192, dict(BLOCK_M=32, BLOCK_N=128, num_stages=2, num_warps=4), 8),
        (96, 96, dict(BLOCK_M=16, BLOCK_N=128, num_stages=4, num_warps=2), 16),
        (192, 192, dict(BLOCK_M=16, BLOCK_N=64, num_stages=3, num_warps=2), 80),
        (192, 128, dict(BLOCK_M=64, BLOCK_N=64, num_stages=4, num_warps=4), 48),
        (192, 128, dict(BLOCK_M=128, BLOCK_N=16, num_stages=4, num_warps=4), 56),
        (128, 64, dict(BLOCK_M=32, BLOCK_N=128, num_stages=4, num_warps=4), 8),
        (192, 64, dict(BLOCK_M=32, BLOCK_N=128, num_stages=3, num_warps=8), 16),
    ]
    for d, dv, cfg, _ in spilled:
        problem = ATTN.space.check(cfg, {"head_dims": [d], "head_dim_v": dv}, lim)
        assert problem and "acc_in_registers" in problem, (d, dv, cfg)
    # 256/256 with 3 stages of 128-key tiles needs (32 * 256 + 3 * 128 * 512) * 2 bytes: over 227 KiB
    big = dict(BLOCK_M=32, BLOCK_N=128, num_stages=3, num_warps=8)
    assert smem_bytes(big, 256, 256) > lim.max_shared_memory_per_block
    assert "smem_ring" in ATTN.space.check(big, {"head_dims": [256]}, lim)
