"""Prefill attention (DeepSeek-style main attention): packed variable-length sequences, chunked
prefill against a cached prefix, causal or not, flash-attn (left, right) windows, grouped-query
heads, separate q/k and v head dims (DeepSeek MLA prefill: 192 = 128 + 64 rope, v 128), lse.
Flash-attention forward in Triton.

Shapes (packed "varlen" layout and conventions of flash_attn_varlen_func):
- q [total_q, h_q, d_qk], k [total_k, h_kv, d_qk], v [total_k, h_kv, d_v], cu_seqlens_q and
  cu_seqlens_k [batch + 1] int32 (prefix sums of the query and key lengths), out [total_q, h_q, d_v]
  in the input dtype, lse [h_q, total_q] fp32 (natural log, flash-attn's varlen layout).
- (d_qk, d_v): q/k = v in 32, 64, 96, 128, 192, 256 (flash-attn's head dims), DeepSeek's (192, 128),
  (64, 128), (128, 64), (192, 64) and (128, 192) (HEAD_DIM_PAIRS); h_kv divides h_q and query head h reads KV head
  h // (h_q / h_kv).
- seqlen_q <= seqlen_k per sequence; the queries are the *last* seqlen_q positions (bottom-right
  alignment, as flash-attn >= 2.1): query i sits at position i + seqlen_k - seqlen_q.

Math and why:
- One program owns BLOCK_M query rows of one head of one sequence and walks that sequence's keys in
  BLOCK_N steps with an online softmax (running max m and sum l per row, fp32 accumulator for
  P @ V, exp2 with scale * log2(e) folded into the scores), so the score matrix never exists.
  lse = (m + log2 l) * ln 2 at the end.
- Triton tiles are powers of two. A 96- or 192-dim q/k head is two dots into one fp32 score, 64 + 32 or
  128 + 64 dims (no padded MMA work). A 96- or 192-dim v is loaded into a 128- or 256-wide tile whose
  extra columns are masked to 0 (D_VP); they are never stored.
- Visibility of key j from query i, with off = seqlen_k - seqlen_q: j < seqlen_k; window
  (left, right), -1 unbounded: i + off - left <= j <= i + off + right; causal is right = 0. A
  program only visits the key blocks its rows can see, and splits them into masked edge blocks and
  unmasked interior blocks: the interior loop (MASK=False) does no index arithmetic and no select,
  which is where almost all blocks are for long sequences.
- Row tiles are visited heaviest first (for causal masks the last query tiles see the most keys).
- With seqlen_q <= seqlen_k every query sees at least key i + off, so no valid row is empty; a row
  that saw nothing would get out = 0 and lse = +inf (flash-attn's convention). A zero-length
  sequence launches programs that exit at once.
- Offsets of the packed tensors are int64 (total * h_q * head_dim can pass 2^31).

Family params (spec.params), all optional:
- causal: bool, default true (flash-attn: causal means window right = 0).
- window: [left, right], flash-attn's window_size: -1 is unbounded, default [-1, -1]. With causal,
  right must be 0 or -1 (both mean 0). Deprecated alias: an int W (the old spelling) maps to
  [W - 1, 0] when causal and [W - 1, W - 1] when not; 0 maps to [-1, -1].
- prefix: int >= 0 or a list cycled over the batch (default 0): cached keys before each
  sequence's queries (chunked prefill), so seqlen_k = seqlen_q + prefix.
- seqlens: "uniform" (default: every sequence has seqlen query tokens), "spread" (same total,
  uneven lengths) or a list of lengths >= 0 cycled over the batch (see ``seq_lengths``).
- head_dim_v: the v head dim (32, 64, 96, 128, 192 or 256, a pair of HEAD_DIM_PAIRS with each of
  head_dims); default the shape's head_dim (128 when head_dim is 192).
- softmax_scale: float > 0, default d_qk ** -0.5.
- head_dims: the head_dims (d_qk) the spec's shapes use, e.g. [192]; the AOT compile (which sees
  no shapes) builds one kernel per entry and reports the heaviest. Default [64, 128].
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch
import triton
import triton.language as tl

from kregress.core.family import (check_bool_param, check_positive_number, check_seqlens_param, reversed_rank_pair,
                                  structure_scale_factor, CompileUnit, Rule, Space, TritonFamily, register)
from kernels.dtypes import TRITON_PTR
from kernels.latency import HBM_US, L2_HIT_US, SUSTAINED
from kernels.softmax import SOFTMAX_FILE, online_softmax_step


@triton.jit
def _attn_blocks(acc, l_i, m_i, q, q_pe, k_base, v_base, stride_kt, stride_vt, offs_m, seqlen_k, diag, qk_scale,
                 win_left, win_right, lo, hi,
                 D_QK: tl.constexpr, D_PE: tl.constexpr, D_V: tl.constexpr, D_VP: tl.constexpr, BLOCK_N: tl.constexpr,
                 HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, MASK: tl.constexpr):
    """Online-softmax update over key blocks [lo, hi); MASK=False only for blocks fully visible to all rows.
    ``diag`` = seqlen_k - seqlen_q: query row i sits at key position i + diag. V tiles are D_VP wide
    (D_V padded to a power of two), the columns past D_V masked to 0."""
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D_QK)
    offs_v = tl.arange(0, D_VP)
    v_col_ok = offs_v[None, :] < D_V
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        k_rows = k_base + cols[:, None].to(tl.int64) * stride_kt
        v_ptrs = tl.multiple_of(v_base + cols[:, None].to(tl.int64) * stride_vt + offs_v[None, :], [16, 16])
        k_ptrs = tl.multiple_of(k_rows + offs_d[None, :], [16, 16])
        if MASK:
            k = tl.load(k_ptrs, mask=cols[:, None] < seqlen_k, other=0.0)
        else:
            k = tl.load(k_ptrs)
        qk = tl.dot(q, tl.trans(k))
        if D_PE > 0:  # the rest of a 96- or 192-dim head (32 or 64 dims): a second dot into the same scores
            pe_ptrs = tl.multiple_of(k_rows + D_QK + tl.arange(0, D_PE)[None, :], [16, 16])
            if MASK:
                k_pe = tl.load(pe_ptrs, mask=cols[:, None] < seqlen_k, other=0.0)
            else:
                k_pe = tl.load(pe_ptrs)
            qk = tl.dot(q_pe, tl.trans(k_pe), qk)
        if MASK:
            v = tl.load(v_ptrs, mask=(cols[:, None] < seqlen_k) & v_col_ok, other=0.0)
        elif D_VP != D_V:
            v = tl.load(v_ptrs, mask=v_col_ok, other=0.0)
        else:
            v = tl.load(v_ptrs)
        qk = qk * qk_scale
        if MASK:
            ok = cols[None, :] < seqlen_k
            pos = offs_m[:, None] + diag
            if HAS_RIGHT:
                ok = ok & (cols[None, :] <= pos + win_right)
            if HAS_LEFT:
                ok = ok & (cols[None, :] >= pos - win_left)
            qk = tl.where(ok, qk, float("-inf"))
        acc, l_i, m_i = online_softmax_step(acc, l_i, m_i, qk, v)
    return acc, l_i, m_i


@triton.jit
def attn_fwd_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, cu_q_ptr, cu_k_ptr,
    sm_scale,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh, stride_lh,
    GROUP, WIN_LEFT, WIN_RIGHT, NUM_M_BLOCKS,
    D_QK: tl.constexpr, D_PE: tl.constexpr, D_V: tl.constexpr, D_VP: tl.constexpr, HAS_LEFT: tl.constexpr,
    HAS_RIGHT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    pid_m = NUM_M_BLOCKS - 1 - tl.program_id(0)  # heaviest row tiles first
    h = tl.program_id(1)
    b = tl.program_id(2)
    q_start = tl.load(cu_q_ptr + b)
    seqlen_q = tl.load(cu_q_ptr + b + 1) - q_start
    k_start = tl.load(cu_k_ptr + b)
    seqlen_k = tl.load(cu_k_ptr + b + 1) - k_start
    diag = seqlen_k - seqlen_q  # bottom-right alignment: query i is key position i + diag
    start_m = pid_m * BLOCK_M
    if start_m < seqlen_q:
        offs_m = start_m + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, D_QK)
        offs_v = tl.arange(0, D_VP)
        row_ok = offs_m < seqlen_q
        tq0 = q_start.to(tl.int64)
        tk0 = k_start.to(tl.int64)
        q_rows = q_ptr + (tq0 + offs_m[:, None]) * stride_qt + h * stride_qh
        q = tl.load(tl.multiple_of(q_rows + offs_d[None, :], [16, 16]), mask=row_ok[:, None], other=0.0)
        q_pe = q
        if D_PE > 0:
            q_pe = tl.load(tl.multiple_of(q_rows + D_QK + tl.arange(0, D_PE)[None, :], [16, 16]), mask=row_ok[:, None], other=0.0)
        hk = h // GROUP
        k_base = k_ptr + tk0 * stride_kt + hk * stride_kh
        v_base = v_ptr + tk0 * stride_vt + hk * stride_vh

        # Keys any row of this tile can see: [lo, hi). lo is block aligned.
        lo = 0
        hi = seqlen_k
        if HAS_RIGHT:
            hi = tl.minimum(seqlen_k, start_m + BLOCK_M + diag + WIN_RIGHT)
        if HAS_LEFT:
            lo = tl.maximum(start_m + diag - WIN_LEFT, 0) // BLOCK_N * BLOCK_N
        # Blocks [full_lo, full_hi) are visible to every row of the tile: no mask needed.
        full_lo = lo
        if HAS_LEFT:
            full_lo = (tl.maximum(start_m + BLOCK_M - 1 + diag - WIN_LEFT, 0) + BLOCK_N - 1) // BLOCK_N * BLOCK_N
        full_hi = seqlen_k // BLOCK_N * BLOCK_N
        if HAS_RIGHT:
            full_hi = tl.minimum(full_hi, (start_m + diag + WIN_RIGHT + 1) // BLOCK_N * BLOCK_N)
        mid_lo = tl.minimum(tl.maximum(full_lo, lo), hi)
        mid_hi = tl.minimum(tl.maximum(full_hi, mid_lo), hi)

        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, D_VP], dtype=tl.float32)
        qk_scale = sm_scale * 1.4426950408889634
        acc, l_i, m_i = _attn_blocks(acc, l_i, m_i, q, q_pe, k_base, v_base, stride_kt, stride_vt, offs_m, seqlen_k,
                                     diag, qk_scale, WIN_LEFT, WIN_RIGHT, lo, mid_lo,
                                     D_QK, D_PE, D_V, D_VP, BLOCK_N, HAS_LEFT, HAS_RIGHT, True)
        acc, l_i, m_i = _attn_blocks(acc, l_i, m_i, q, q_pe, k_base, v_base, stride_kt, stride_vt, offs_m, seqlen_k,
                                     diag, qk_scale, WIN_LEFT, WIN_RIGHT, mid_lo, mid_hi,
                                     D_QK, D_PE, D_V, D_VP, BLOCK_N, HAS_LEFT, HAS_RIGHT, False)
        acc, l_i, m_i = _attn_blocks(acc, l_i, m_i, q, q_pe, k_base, v_base, stride_kt, stride_vt, offs_m, seqlen_k,
                                     diag, qk_scale, WIN_LEFT, WIN_RIGHT, mid_hi, hi,
                                     D_QK, D_PE, D_V, D_VP, BLOCK_N, HAS_LEFT, HAS_RIGHT, True)
        empty = l_i == 0.0
        l_safe = tl.where(empty, 1.0, l_i)
        out = acc / l_safe[:, None]
        o_ptrs = o_ptr + (tq0 + offs_m[:, None]) * stride_ot + h * stride_oh + offs_v[None, :]
        o_ok = row_ok[:, None]
        if D_VP != D_V:  # the padded columns of a 96- or 192-dim v are never stored
            o_ok = o_ok & (offs_v[None, :] < D_V)
        tl.store(tl.multiple_of(o_ptrs, [16, 16]), out.to(o_ptr.dtype.element_ty), mask=o_ok)
        lse = tl.where(empty, float("inf"), (m_i + tl.math.log2(l_safe)) * 0.6931471805599453)
        tl.store(lse_ptr + h * stride_lh + tq0 + offs_m, lse, mask=row_ok)


HEAD_DIMS = (32, 64, 96, 128, 192, 256)  # d_qk
V_HEAD_DIMS = (32, 64, 96, 128, 192, 256)
# (d_qk, d_v) pairs: q/k = v for every head dim (flash-attn), DeepSeek's 192/128 (flash-attn 3 allows
# d_qk in (128, 192] with d_v in (96, 128]), the pairs this family always took, and 128/192 (no
# flash-attn build takes it; the kernel does).
HEAD_DIM_PAIRS = tuple((d, d) for d in HEAD_DIMS) + ((64, 128), (128, 64), (192, 64), (192, 128), (128, 192))
SEQLEN_PATTERNS = ("uniform", "spread")
# The gate's ragged structure cases: sequences, query lengths 1..RAGGED_Q_MAX, cached prefixes in steps of
# RAGGED_PREFIX_STEP (64-79, 128-143, ...: the key lengths rank as the prefixes do); small (at most 48 queries and
# 320 keys a sequence), so their cost is the heads'
RAGGED_BATCH, RAGGED_Q_MAX, RAGGED_PREFIX_STEP = 4, 48, 64
PARAM_KEYS = ("causal", "window", "prefix", "seqlens", "softmax_scale", "head_dims", "head_dim_v")
DEFAULT_HEAD_DIMS = (64, 128)


def _causal(params: dict[str, Any]) -> bool:
    return bool((params or {}).get("causal", True))


def window_size(params: dict[str, Any]) -> tuple[int, int]:
    """flash-attn's (left, right), -1 unbounded, with causal folded in (right = 0). The deprecated int
    spelling W maps to (W - 1, 0) when causal and (W - 1, W - 1) when not; 0 or absent to (-1, -1)."""
    params = params or {}
    w = params.get("window")
    causal = _causal(params)
    if w is None or (isinstance(w, int) and not isinstance(w, bool) and w == 0):
        left, right = -1, -1
    elif isinstance(w, int) and not isinstance(w, bool):
        left, right = w - 1, (w - 1 if not causal else 0)
    else:
        left, right = int(w[0]), int(w[1])
    if causal:
        right = 0
    return left, right


def _deprecated_window_text(w: int, causal: bool) -> str:
    new = "[-1, -1]" if w == 0 else (f"[{w - 1}, 0]" if causal else f"[{w - 1}, {w - 1}]")
    return (f"params.window: {w} is the deprecated single-W spelling; it maps to flash-attn's window [left, right] = "
            f"{new} (causal={str(causal).lower()}); write window: {new}")


def _head_dims(params: dict[str, Any]) -> tuple[int, ...]:
    return tuple(sorted(set((params or {}).get("head_dims") or DEFAULT_HEAD_DIMS)))


def v_head_dim(params: dict[str, Any], d_qk: int) -> int:
    v = (params or {}).get("head_dim_v")
    if v:
        return int(v)
    return 128 if d_qk == 192 else d_qk


def _scale(params: dict[str, Any], head_dim: int) -> float:
    return float((params or {}).get("softmax_scale", head_dim ** -0.5))


def _split(d_qk: int) -> tuple[int, int]:
    """(power-of-two main part, power-of-two rest) of a q/k head dim: 96 = 64 + 32, 192 = 128 + 64 (two dots
    into one score, no padded MMA work); a power of two is all main part."""
    main = 1 << (d_qk.bit_length() - 1)
    return (main, d_qk - main) if d_qk != main else (d_qk, 0)


def padded_v(d_v: int) -> int:
    """The v tile's width: d_v rounded up to a power of two (96 -> 128, 192 -> 256), the columns past d_v masked."""
    return triton.next_power_of_2(d_v)


def _pairs_of(params: dict[str, Any]) -> list[tuple[int, int]]:
    return [(d, v_head_dim(params, d)) for d in _head_dims(params)]


def smem_bytes(c: dict[str, int], d_qk: int, d_v: int) -> int:
    """Shared memory of one program as Triton lays it out on sm_90 for this kernel: the Q tile, and per
    pipeline stage one K tile (d_qk wide) and one V tile (d_v padded), 2 bytes each."""
    return (c["BLOCK_M"] * d_qk + c["num_stages"] * c["BLOCK_N"] * (d_qk + padded_v(d_v))) * 2


def _smem_fits(c: dict[str, int], p: dict[str, Any], lim: Any) -> bool:
    return all(smem_bytes(c, d, dv) <= lim.max_shared_memory_per_block for d, dv in _pairs_of(p))


# Registers, from sm_90 AOT compiles of every head-dim pair (scripts/attention_head_dim_facts.py prints
# them): what one thread keeps live is about the fp32 accumulator (BLOCK_M x padded d_v), three copies of
# the scores (BLOCK_M x BLOCK_N: the fp32 scores, their exponentials, and P in bf16 for the second MMA
# counted as one more) and its share of the Q tile (BLOCK_M x d_qk, two bf16 per register), over
# 32 * num_warps threads. With 4 or more warps the MMA is a warpgroup MMA that reads K and V from shared
# memory: 280 such values fit in 255 registers (96/96 at BLOCK_M 64, BLOCK_N 128, 4 warps: 280, 254
# registers, no spill), 288 spill (128/128 at BLOCK_M 64, BLOCK_N 128, 4 warps: 96 bytes; 256/256 at
# BLOCK_M 64, BLOCK_N 64, 4 warps: 168 bytes). With 2 warps the MMA is mma.sync and the K and V fragments
# take registers too: 120 fits (64/64 at BLOCK_M 16, BLOCK_N 128: 193 registers), 136 spills (192/192 at
# BLOCK_M 16, BLOCK_N 64: 80 bytes). A 256-wide v tile against 128 keys spills at 4 warps (128/192 at
# BLOCK_M 32, BLOCK_N 128: 8 bytes, though it counts only 176), so 4 warps take BLOCK_N <= 64 there. The
# 256-dim head (one 256-wide Q operand, a 256-wide accumulator) fits less: 144 fits (BLOCK_M 64, BLOCK_N
# 64, 8 warps: 253 registers), 240 spills (BLOCK_M 64, BLOCK_N 32, 4 warps: 64 bytes), and with 2 warps
# even BLOCK_M 16, BLOCK_N 32 spills (64 bytes): LIVE_256 with 4 or more warps, none with 2. A 192-dim
# q/k (two dots, 128 + 64) on one warpgroup fits less too: 208 spills (192/128 at BLOCK_M 64, BLOCK_N 64,
# 4 stages, 4 warps: 48 bytes), so 4 warps take LIVE_192_W4 there (8 warps: 208 fits, 230 registers).
# And a v narrower than q/k (128/64, 192/64) at BLOCK_M 32 against 128 keys gets an 8- or 16-byte stack
# frame at 128 to 168 registers (not pressure: 8 warps too), so those tiles are refused for such pairs.
ACC_REGS = 128
LIVE_WARPGROUP = 280
LIVE_MMA_SYNC = 120
LIVE_256 = 160
LIVE_192_W4 = 200


def live_values(c: dict[str, int], d_qk: int, d_v: int) -> float:
    """fp32-register-sized values one thread keeps live (see the comment above)."""
    return c["BLOCK_M"] * (padded_v(d_v) + 3 * c["BLOCK_N"] + d_qk / 2) / (32 * c["num_warps"])


def _regs_fit(c: dict[str, int], p: dict[str, Any], lim: Any) -> bool:
    for d, dv in _pairs_of(p):
        if c["BLOCK_M"] * padded_v(dv) > ACC_REGS * 32 * c["num_warps"]:
            return False
        if d >= 256 or dv >= 256:
            bound = LIVE_256 if c["num_warps"] >= 4 else 0
        elif d == 192 and c["num_warps"] == 4:
            bound = LIVE_192_W4
        else:
            bound = LIVE_WARPGROUP if c["num_warps"] >= 4 else LIVE_MMA_SYNC
        if live_values(c, d, dv) > bound:
            return False
        if c["num_warps"] == 4 and padded_v(dv) > 128 and c["BLOCK_N"] > 64:
            return False
        if dv < d and c["BLOCK_M"] == 32 and c["BLOCK_N"] == 128:
            return False
    return True


SPACE = Space(
    params={
        "BLOCK_M": (16, 32, 64, 128),
        "BLOCK_N": (16, 32, 64, 128),
        "num_stages": (1, 2, 3, 4),
        "num_warps": (2, 4, 8),
    },
    rules=(
        Rule("acc_in_registers", f"BLOCK_M * d_v / (32 * num_warps) <= {ACC_REGS} and BLOCK_M * (d_v + 3 * BLOCK_N + d_qk / 2) / "
             f"(32 * num_warps) <= {LIVE_WARPGROUP} ({LIVE_MMA_SYNC} with 2 warps; {LIVE_256} and no 2 warps for a 256-wide "
             f"head; {LIVE_192_W4} for a 192-wide q/k at 4 warps), and BLOCK_N <= 64 with 4 warps and "
             "d_v > 128, not BLOCK_M 32 with BLOCK_N 128 when d_v < d_qk, for every (d_qk, d_v) of params.head_dims (d_v padded to a power of two): fp32 accumulator, "
             "scores and Q per thread, measured on sm_90 to fit 255 registers without spilling", _regs_fit),
        Rule("rows_per_warp", "BLOCK_M >= 16 * num_warps / 4 (a warp's MMA needs 16 rows; a warpgroup shares them)",
             lambda c, p, lim: 4 * c["BLOCK_M"] >= 16 * c["num_warps"]),
        Rule("smem_ring", "(BLOCK_M * d_qk + num_stages * BLOCK_N * (d_qk + d_v)) * 2 bytes <= "
             "hardware.limits.max_shared_memory_per_block for every (d_qk, d_v) of params.head_dims (d_v padded to a "
             "power of two; 227 KiB on an H100)", _smem_fits),
    ),
)


def _cycled(v: Any, n: int, default: int = 0) -> list[int]:
    if v is None:
        return [default] * n
    if isinstance(v, list):
        return [int(v[b % len(v)]) for b in range(n)]
    return [int(v)] * n


def seq_lengths(shape: dict[str, int], params: dict[str, Any]) -> list[int]:
    """Per-sequence query lengths, a pure function of the shape and params (so FLOP counts are exact).

    - "uniform" (default): every sequence has seqlen tokens.
    - "spread": the same total batch * seqlen tokens, uneven: weights 0.25 + 1.5 * frac(b * 0.618...)
      normalised to the total, the last sequence takes the rounding remainder (b = 0 of a batch of 1
      keeps seqlen).
    - a list: sequence b has list[b % len(list)] tokens (0 allowed); seqlen is then only a label.
    """
    pattern = (params or {}).get("seqlens", "uniform")
    n, base = shape["batch"], shape["seqlen"]
    if isinstance(pattern, list):
        return [int(pattern[b % len(pattern)]) for b in range(n)]
    if pattern == "uniform" or n == 1:
        return [base] * n
    phi = (math.sqrt(5.0) - 1.0) / 2.0
    w = [0.25 + 1.5 * ((b * phi) % 1.0) for b in range(n)]
    total = n * base
    lens = [max(1, round(total * x / sum(w))) for x in w[:-1]]
    lens.append(max(1, total - sum(lens)))
    return lens


def key_lengths(shape: dict[str, int], params: dict[str, Any]) -> list[int]:
    """Per-sequence key lengths: the query length plus the cached prefix (params.prefix)."""
    lens = seq_lengths(shape, params)
    return [n + p for n, p in zip(lens, _cycled((params or {}).get("prefix"), len(lens)))]


def _sum_min(n: int, c: int, cap: int) -> int:
    """sum over i in [0, n) of min(i + c, cap)."""
    t = max(0, min(n, cap - c + 1))
    return t * c + t * (t - 1) // 2 + (n - t) * cap


def _sum_max0(n: int, c: int) -> int:
    """sum over i in [0, n) of max(i + c, 0)."""
    u = max(0, min(n, -c + 1))
    return (n * (n - 1) // 2 - u * (u - 1) // 2) + (n - u) * c


def visible_pairs(n_q: int, n_k: int, left: int, right: int) -> int:
    """(query, key) pairs that are not masked in one sequence: query i sees keys
    [max(0, i + off - left), min(n_k - 1, i + off + right)], off = n_k - n_q (bottom-right), -1 unbounded."""
    if n_q <= 0 or n_k <= 0:
        return 0
    off = n_k - n_q
    upper = _sum_min(n_q, off + right, n_k - 1) if right >= 0 else n_q * (n_k - 1)
    lower = _sum_max0(n_q, off - left) if left >= 0 else 0
    return upper - lower + n_q


class AttentionFamily(TritonFamily):
    helper_files = (SOFTMAX_FILE,)  # _attn_blocks calls softmax.online_softmax_step
    launch_wrappers = ("attention",)  # the entry point run() calls
    interpreter_ignores = ("num_warps", "num_stages")  # passed to the launch only

    # --- shapes and params --------------------------------------------------------------------
    def check_shape_values(self, shape):
        if shape["head_dim"] not in HEAD_DIMS:
            return f"head_dim={shape['head_dim']} is not allowed; allowed: {', '.join(map(str, HEAD_DIMS))} (q/k head dim)"
        if shape["h_q"] % shape["h_kv"]:
            return f"h_kv={shape['h_kv']} must divide h_q={shape['h_q']} (grouped-query heads)"
        return None

    param_keys = PARAM_KEYS

    def check_param_values(self, params):
        problem = check_bool_param(params, "causal")
        if problem:
            return problem
        w = params.get("window")
        if w is not None:
            if isinstance(w, int) and not isinstance(w, bool):
                if w < 0:
                    return f"window={w!r}: write flash-attn's [left, right] (-1 unbounded), e.g. [127, 0]"
                warnings.warn(_deprecated_window_text(w, _causal(params)), FutureWarning, stacklevel=3)  # the caller of check_params
            elif (not isinstance(w, list) or len(w) != 2
                  or any(isinstance(x, bool) or not isinstance(x, int) or x < -1 for x in w)):
                return f"window={w!r} must be [left, right] with integers >= -1 (-1: unbounded), e.g. [127, 0]"
            elif _causal(params) and w[1] > 0:
                return (f"window={w!r}: causal=true means right = 0 (flash-attn); write [{w[0]}, 0], "
                        "or set causal: false for a two-sided window")
        if "prefix" in params:
            v = params["prefix"]
            bad = (isinstance(v, bool) or not isinstance(v, (int, list)) or (isinstance(v, int) and v < 0)
                   or (isinstance(v, list) and (not v or any(isinstance(x, bool) or not isinstance(x, int) or x < 0 for x in v))))
            if bad:
                return f"prefix={v!r} must be an integer >= 0 or a non-empty list of them (cached keys before the queries)"
        if "seqlens" in params:
            problem = check_seqlens_param(params["seqlens"], SEQLEN_PATTERNS)
            if problem:
                return problem
        if "softmax_scale" in params:
            problem = check_positive_number("softmax_scale", params["softmax_scale"])
            if problem:
                return problem
        if "head_dims" in params:
            v = params["head_dims"]
            if not isinstance(v, list) or not v or any(isinstance(x, bool) or x not in HEAD_DIMS for x in v):
                return f"head_dims={v!r} must be a non-empty list drawn from {', '.join(map(str, HEAD_DIMS))}"
        if "head_dim_v" in params:
            v = params["head_dim_v"]
            if isinstance(v, bool) or v not in V_HEAD_DIMS:
                return f"head_dim_v={v!r} is not allowed; allowed: {', '.join(map(str, V_HEAD_DIMS))}"
        bad = [pair for pair in _pairs_of(params) if pair not in HEAD_DIM_PAIRS]
        if bad:
            return (f"head_dims/head_dim_v: (q/k, v) = {', '.join(f'({a}, {b})' for a, b in bad)} is not allowed; allowed pairs: "
                    f"{', '.join(f'({a}, {b})' for a, b in HEAD_DIM_PAIRS)}")
        return None

    # --- inputs, launch, reference -------------------------------------------------------------
    def make_inputs(self, shape, dtype, device, seed, params):
        if shape["head_dim"] not in _head_dims(params):
            raise ValueError(f"shape head_dim={shape['head_dim']} is not in params.head_dims={list(_head_dims(params))}: "
                             "the compile stats would not describe this shape")
        lens_q = seq_lengths(shape, params)
        lens_k = key_lengths(shape, params)
        d, dv = shape["head_dim"], v_head_dim(params, shape["head_dim"])
        g = torch.Generator(device=device).manual_seed(seed)
        q = torch.randn(sum(lens_q), shape["h_q"], d, generator=g, device=device).to(dtype)
        k = torch.randn(sum(lens_k), shape["h_kv"], d, generator=g, device=device).to(dtype)
        v = torch.randn(sum(lens_k), shape["h_kv"], dv, generator=g, device=device).to(dtype)

        def cu(lens):
            return torch.tensor([0] + list(torch.tensor(lens).cumsum(0).tolist()), dtype=torch.int32, device=device)

        return {"q": q, "k": k, "v": v, "cu_seqlens_q": cu(lens_q), "cu_seqlens_k": cu(lens_k),
                "max_seqlen_q": max(lens_q + [0])}

    def run(self, inputs, config, params):
        """(out, lse): both are checked against the reference."""
        return attention(inputs["q"], inputs["k"], inputs["v"], inputs["cu_seqlens_q"], inputs["cu_seqlens_k"],
                         inputs["max_seqlen_q"], config, window_size=window_size(params),
                         softmax_scale=_scale(params, inputs["q"].shape[-1]))

    def reference(self, inputs, params):
        return reference_attention(inputs["q"], inputs["k"], inputs["v"], inputs["cu_seqlens_q"], inputs["cu_seqlens_k"],
                                   window_size(params), _scale(params, inputs["q"].shape[-1]))

    # --- the gate's hidden structure ------------------------------------------------------------
    structure_keys = ("h_q", "h_kv")  # the GQA ratio: hidden shapes keep it; structure_cases vary it
    # no reduction_keys: seqlen is the queries too (a longer one is minutes on the interpreter); the long
    # structure case goes past the timed keys with a cached prefix instead

    def structure_inputs(self, params):
        return ("cu_seqlens_q", "cu_seqlens_k")

    def structure_cases(self, shapes, params, rng, timed=()):
        """The spec's GQA ratio and another one, each with 2 KV heads (a wrong KV-head map shows); one long
        sequence (>= 4096 keys: ~128 queries after a cached prefix, so the interpreter can afford it while the
        mask still hides 3% of the keys from the first query) with one head; and two ragged batches of
        RAGGED_BATCH sequences whose query and key lengths have their ranks reversed between the two."""
        base = max(shapes, key=lambda s: s["batch"] * s["seqlen"] * s["h_q"])
        ratio = max(1, base["h_q"] // base["h_kv"])
        # the other ratio: larger than the spec's and not a power of two, drawn among those up to
        # max(2 x the spec's, 7) and at most 8 above it, so a kernel right only up to the spec's ratio, or only
        # for powers of two (packed heads padded to one, a shift for the KV-head map), is wrong here whatever
        # the draw (a ratio below the spec's is not drawn)
        other = rng.choice([r for r in range(ratio + 1, min(max(2 * ratio, 7), ratio + 8) + 1) if r & (r - 1)])
        out = [(f"structure_gqa{r}", dict(base, h_kv=2, h_q=2 * r), {}) for r in (ratio, other)]
        # the softmax scale is a run-time argument the kernel must honour: one case takes another value, on
        # inputs as made (x8 values make the softmax one-hot, where a 20% scale change hardly shows)
        out[1][2]["softmax_scale"] = round(_scale(params, base["head_dim"]) * structure_scale_factor(rng), 6)
        out[1][2]["_gate_inputs_as_made"] = True
        n_q = 128 + rng.randint(1, 15)
        longest = max([max(key_lengths(s, params) + [0]) for s in timed] + [0])
        over: dict[str, Any] = {"prefix": [max(4096, longest) - n_q + rng.randint(1, 63)]}
        if isinstance((params or {}).get("seqlens"), list):
            over["seqlens"] = [n_q]
        out.append(("structure_long", dict(base, batch=1, seqlen=n_q, h_q=1, h_kv=1), over))
        # ragged batches, whatever the spec's seqlens (a uniform batch hides a kernel that ignores cu_seqlens):
        # distinct query lengths and distinct cached prefixes per sequence, the second draw's placed by the
        # first's ranks reversed (kregress.core.family.reversed_rank_pair). The prefixes are RAGGED_PREFIX_STEP
        # or more apart, more than any two query lengths, so the key lengths (query + prefix) rank as the
        # prefixes do: a kernel that takes sequence b's query length, key length or query-to-key offset (the
        # mask's diagonal) from another sequence, alone or in max/min with its own, is wrong in one of them
        step = RAGGED_PREFIX_STEP
        q_lens = reversed_rank_pair(rng, lambda: rng.sample(range(1, RAGGED_Q_MAX + 1), RAGGED_BATCH))
        prefixes = reversed_rank_pair(rng, lambda: [step * (b + 1) + rng.randint(0, step - RAGGED_Q_MAX)
                                                    for b in range(RAGGED_BATCH)])
        for i, (lq, pre) in enumerate(zip(q_lens, prefixes)):
            shape = dict(base, batch=RAGGED_BATCH, seqlen=max(lq), h_q=2 * ratio, h_kv=2)
            out.append((f"structure_ragged{i}", shape, {"seqlens": lq, "prefix": pre}))
        return out

    # --- formulas ------------------------------------------------------------------------------
    def _pairs(self, shape, params) -> int:
        left, right = window_size(params)
        return sum(visible_pairs(nq, nk, left, right) for nq, nk in zip(seq_lengths(shape, params), key_lengths(shape, params)))

    def flops(self, shape, params):
        # 2 * d_qk for the score and 2 * d_v for P @ V, per visible (query, key) pair and query head.
        d, dv = shape["head_dim"], v_head_dim(params, shape["head_dim"])
        return 2.0 * (d + dv) * shape["h_q"] * self._pairs(shape, params)

    def bytes_moved(self, shape, dtype_bytes, params):
        # Compulsory traffic: q, k, v read once, out written once, lse (fp32) written once.
        tq, tk = sum(seq_lengths(shape, params)), sum(key_lengths(shape, params))
        d, dv = shape["head_dim"], v_head_dim(params, shape["head_dim"])
        return float(dtype_bytes * (tq * shape["h_q"] * (d + dv) + tk * shape["h_kv"] * (d + dv)) + 4 * tq * shape["h_q"])

    def masked_fraction(self, shape, params) -> float:
        full = sum(nq * nk for nq, nk in zip(seq_lengths(shape, params), key_lengths(shape, params)))
        return 1.0 - self._pairs(shape, params) / full if full else 0.0

    def tolerance(self, shape, dtype, base_tol, params):
        """The output is a convex mix of V rows (|v| ~ 1): P is rounded to the input dtype before
        P @ V and the result once more; fp32 sums over the keys grow ~sqrt(keys) ulps. The bound
        grows slowly with the reduction length (the longest visible key range). The same bound
        holds for lse (|lse| ~ log(keys) + a few)."""
        n = max(key_lengths(shape, params) + [1])
        left, right = window_size(params)
        if left >= 0 and right >= 0:
            n = min(n, left + right + 1)
        grow = max(1.0, (n / 1024.0) ** 0.25)
        if dtype == "bf16":
            return 2.0 * base_tol * grow, 2.0 * base_tol
        return base_tol * grow, base_tol

    def compile_units(self, config, dtype, params):
        """One unit per head_dim the spec may use (params.head_dims, default both 64 and 128): compile
        units see no shapes, and a variant is as constrained as its heaviest kernel."""
        ptr = TRITON_PTR[dtype]
        sig = {
            "q_ptr": ptr, "k_ptr": ptr, "v_ptr": ptr, "o_ptr": ptr, "lse_ptr": "*fp32",
            "cu_q_ptr": "*i32", "cu_k_ptr": "*i32",
            "sm_scale": "fp32",
            "stride_qt": "i32", "stride_qh": "i32", "stride_kt": "i32", "stride_kh": "i32",
            "stride_vt": "i32", "stride_vh": "i32", "stride_ot": "i32", "stride_oh": "i32", "stride_lh": "i32",
            "GROUP": "i32", "WIN_LEFT": "i32", "WIN_RIGHT": "i32", "NUM_M_BLOCKS": "i32",
            "D_QK": "constexpr", "D_PE": "constexpr", "D_V": "constexpr", "D_VP": "constexpr", "HAS_LEFT": "constexpr",
            "HAS_RIGHT": "constexpr", "BLOCK_M": "constexpr", "BLOCK_N": "constexpr",
        }
        # What the GPU JIT specializes as divisible by 16: every pointer and every q/k/v/o stride (all
        # are multiples of the head dims); not the lse head stride (total_q), GROUP, the window or
        # NUM_M_BLOCKS, which depend on the shape.
        DIVISIBLE = tuple(k for k, v in sig.items() if v.startswith("*") or (k.startswith("stride_") and k != "stride_lh"))
        left, right = window_size(params)
        units = []
        for d in _head_dims(params):
            main, pe = _split(d)
            dv = v_head_dim(params, d)
            consts = {"D_QK": main, "D_PE": pe, "D_V": dv, "D_VP": padded_v(dv), "HAS_LEFT": left >= 0,
                      "HAS_RIGHT": right >= 0, "BLOCK_M": config["BLOCK_M"], "BLOCK_N": config["BLOCK_N"]}
            units.append(CompileUnit(attn_fwd_kernel, sig, consts, config["num_warps"], config["num_stages"], DIVISIBLE))
        return units

    def model_latency_ms(self, shape, config, stats, hw, dtype_bytes, params):
        """Tensor-core roofline over the padded tile work, with software pipelining (kernels/latency.py).

        Sees: every program runs its visible key blocks in full (BLOCK_M x BLOCK_N x (d_qk + d_v), twice
        each), the causal and window masks deciding which blocks are visible; the MMA efficiency of the
        tile; the softmax (exp2, max, sum: per score) at about 64 MMA-FLOPs per score; pipelining depth:
        num_stages - 1 K/V blocks in flight per resident block hide the load latency (resident blocks from
        the compile's registers and shared memory); waves over the SMs, the longest program bounding the
        tail; memory: q, out and K/V once from HBM, the row tiles of one head re-reading their K/V blocks
        side by side (90% L2 hits); spills; a 4 us launch.

        Ignores: num_warps except through the resident blocks; the order in which heads and row tiles
        are launched (cross-head L2 reuse); L2 and shared-memory bandwidth; clocks and power limits.
        """
        lim = hw.limits
        bm, bn, d = config["BLOCK_M"], config["BLOCK_N"], shape["head_dim"]
        dv = v_head_dim(params, d)
        left, right = window_size(params)
        blocks = 0  # key blocks visited, summed over row tiles of one head
        longest = 0
        for nq, nk in zip(seq_lengths(shape, params), key_lengths(shape, params)):
            off = nk - nq
            for t in range(math.ceil(nq / bm)):
                s = t * bm
                hi = min(nk, s + bm + off + right) if right >= 0 else nk
                lo = (max(s + off - left, 0) // bn * bn) if left >= 0 else 0
                nb = max(0, math.ceil((hi - lo) / bn))
                blocks += nb
                longest = max(longest, nb)
        per_block = 2.0 * bm * bn * (d + dv) + 64.0 * bm * bn
        mma_eff = min(1.0, (bm * bn) / (128 * 128)) ** 0.3
        per_sm_peak = SUSTAINED * lim.peak_tflops * 1e12 / lim.sm_count * mma_eff
        t_mma = per_block / per_sm_peak  # one key block of one program, the SM's tensor cores to itself
        latency = (0.9 * L2_HIT_US + 0.1 * HBM_US) * 1e-6  # K/V re-reads of one head mostly hit L2
        resident = max(1, int(stats.blocks_per_sm or 1))
        stages = config["num_stages"]

        def block_time(resident_blocks: int) -> float:
            in_flight = resident_blocks * (stages - 1)
            return max(t_mma, latency / in_flight) if in_flight >= 1 else max(t_mma, (latency + t_mma) / resident_blocks)

        t_compute = blocks * shape["h_q"] * block_time(resident) / lim.sm_count
        t_tail = longest * block_time(1)  # the longest program, alone on its SM at the end
        t_compute = max(t_compute, t_tail)
        tq, tk = sum(seq_lengths(shape, params)), sum(key_lengths(shape, params))
        kv_unique = tk * shape["h_kv"]
        kv_reads = blocks * bn * shape["h_q"]
        traffic = dtype_bytes * ((d + dv) * tq * shape["h_q"]
                                 + (d + dv) * (kv_unique + 0.1 * max(0, kv_reads - kv_unique)))
        t_memory = traffic / (lim.hbm_gbps * 1e9)
        spill_penalty = 1.0 + min(1.0, stats.spill_bytes / 256.0)
        return (max(t_compute, t_memory) * spill_penalty + 4e-6) * 1e3


def _aligned_rows(t: torch.Tensor) -> bool:
    """Last dim contiguous, every other stride and the base pointer 16-byte aligned."""
    return (t.stride(-1) == 1 and t.data_ptr() % 16 == 0
            and all((s * t.element_size()) % 16 == 0 for s in t.stride()[:-1]))


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
              max_seqlen_q: int, config: dict[str, int], window_size: tuple[int, int] = (-1, 0),
              softmax_scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed varlen attention forward; returns (out [total_q, h_q, d_v], lse [h_q, total_q] fp32).

    window_size is flash-attn's (left, right), -1 unbounded; causal is right = 0 (the default
    (-1, 0)). Queries are bottom-right aligned with their keys (seqlen_q <= seqlen_k is the caller's
    promise: this wrapper does not read cu_seqlens, so nothing here syncs with the device).
    (1) check shapes (metadata only), (2) allocate, (3) launch one program per (row tile, head, sequence)."""
    if q.ndim != 3 or k.ndim != 3 or v.ndim != 3:
        raise ValueError(f"attention: q, k, v must be [total, heads, head_dim], got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    total_q, h_q, d = q.shape
    total_k, h_kv, _ = k.shape
    if k.shape[2] != d or v.shape[:2] != k.shape[:2]:
        raise ValueError(f"attention: k must be [total_k, h_kv, {d}] and v [total_k, h_kv, d_v], got {tuple(k.shape)} and {tuple(v.shape)}")
    dv = v.shape[2]
    if (d, dv) not in HEAD_DIM_PAIRS:
        raise ValueError(f"attention: head dims q/k={d}, v={dv} not supported; allowed (q/k, v): "
                         f"{', '.join(f'({a}, {b})' for a, b in HEAD_DIM_PAIRS)}")
    if h_q % h_kv:
        raise ValueError(f"attention: h_kv={h_kv} must divide h_q={h_q}")
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"attention: q, k, v must share fp16 or bf16, got {q.dtype}, {k.dtype}, {v.dtype}")
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if cu.ndim != 1 or cu.dtype != torch.int32 or cu.shape != cu_seqlens_q.shape:
            raise ValueError(f"attention: {name} must be int32 [batch + 1], got {cu.dtype} {tuple(cu.shape)}")
    left, right = window_size
    if left < -1 or right < -1:
        raise ValueError(f"attention: window_size={window_size} must hold integers >= -1 (-1: unbounded)")
    # The kernel promises the compiler 16-byte aligned rows (tl.multiple_of); copy anything else.
    q, k, v = (t if _aligned_rows(t) else t.contiguous() for t in (q, k, v))
    out = torch.empty((total_q, h_q, dv), device=q.device, dtype=q.dtype)
    lse = torch.empty((h_q, total_q), device=q.device, dtype=torch.float32)
    batch = cu_seqlens_q.shape[0] - 1
    scale = d ** -0.5 if softmax_scale is None else softmax_scale
    main, pe = _split(d)
    n_m = triton.cdiv(max(max_seqlen_q, 1), config["BLOCK_M"])
    attn_fwd_kernel[(n_m, h_q, batch)](
        q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, scale,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), out.stride(0), out.stride(1),
        lse.stride(0),
        h_q // h_kv, max(left, 0), max(right, 0), n_m,
        D_QK=main, D_PE=pe, D_V=dv, D_VP=padded_v(dv), HAS_LEFT=left >= 0, HAS_RIGHT=right >= 0,
        BLOCK_M=config["BLOCK_M"], BLOCK_N=config["BLOCK_N"],
        num_warps=config["num_warps"], num_stages=config["num_stages"],
    )
    return out, lse


def reference_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, window_size: tuple[int, int],
                        softmax_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Float64 reference, one sequence at a time, same visibility rule (bottom-right aligned,
    flash-attn window); (out [total_q, h_q, d_v], lse [h_q, total_q]); a row that sees no key gets
    out = 0 and lse = +inf (flash-attn's convention)."""
    out = torch.zeros((q.shape[0], q.shape[1], v.shape[2]), dtype=torch.float64)
    lse = torch.full((q.shape[1], q.shape[0]), float("inf"), dtype=torch.float64)
    group = q.shape[1] // k.shape[1]
    left, right = window_size
    cq = [int(x) for x in cu_seqlens_q]
    ck = [int(x) for x in cu_seqlens_k]
    for b in range(len(cq) - 1):
        qs, qe, ks, ke = cq[b], cq[b + 1], ck[b], ck[b + 1]
        nq, nk = qe - qs, ke - ks
        if nq == 0:
            continue
        qb = q[qs:qe].double().transpose(0, 1)  # [h_q, nq, d]
        kb = k[ks:ke].double().transpose(0, 1).repeat_interleave(group, 0)
        vb = v[ks:ke].double().transpose(0, 1).repeat_interleave(group, 0)
        scores = qb @ kb.transpose(1, 2) * softmax_scale
        pos = torch.arange(nq)[:, None] + (nk - nq)
        j = torch.arange(nk)[None, :]
        ok = torch.ones(nq, nk, dtype=torch.bool)
        if right >= 0:
            ok &= j <= pos + right
        if left >= 0:
            ok &= j >= pos - left
        scores = scores.masked_fill(~ok, float("-inf"))
        row_lse = torch.logsumexp(scores, dim=-1)  # [h_q, nq]
        seen = torch.isfinite(row_lse)
        p = torch.where(seen[..., None], torch.exp(scores - row_lse.masked_fill(~seen, 0.0)[..., None]), 0.0)
        out[qs:qe] = (p @ vb).transpose(0, 1)
        lse[:, qs:qe] = torch.where(seen, row_lse, float("inf"))
    return out, lse


import sys as _sys  # noqa: E402

FAMILY = register(
    AttentionFamily(name="attention", space=SPACE, shape_keys=("batch", "seqlen", "h_q", "h_kv", "head_dim"),
                    headline_metric="tflops", module=_sys.modules[__name__])
)
