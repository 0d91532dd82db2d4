"""FlashMLA-like decode attention over a paged latent KV cache, split-K with a log-sum-exp combine.

Shapes (DeepSeek-V3 MLA, weights absorbed into the query):
- q            [batch, s_q, h_q, 576]   576 = 512 latent ("nope") + 64 rope dims
- kv_cache     [num_blocks, page_size, 1, 576]   one latent head; K is all 576 dims, V the first 512
- block_table  [batch, max_pages] int32: page i of sequence b lives in kv_cache[block_table[b, i]]
- cache_seqlens[batch] int32: tokens in each sequence's cache (they differ per sequence)
- out          [batch, s_q, h_q, 512] in the input dtype, lse [batch, h_q, s_q] float32 (natural log,
  FlashMLA's layout: ``flash_mla_with_kvcache`` returns softmax_lse as [batch, h_q, s_q])

Math and why:
- There is a single KV head, so every query head of a sequence reads the same tokens. The s_q * h_q
  query rows of a sequence are flattened into one "M" axis (row r is query r // h_q, head r % h_q)
  and a program takes BLOCK_H of them: one pass over the KV tokens serves BLOCK_H rows, which is what
  turns decode from a GEMV into a (small) GEMM on the tensor cores.
- Scores are q_nope . k_nope + q_pe . k_pe (two dots into one fp32 accumulator) times softmax_scale.
  The same [BLOCK_N, 512] latent tile is then the V operand: it is loaded once per step and used twice.
- Online softmax in base 2: scores are pre-multiplied by scale * log2(e) so exp2 is used; the running
  max m and sum l are per row; lse = (m + log2 l) * ln 2 at the end.
- causal (FlashMLA's flag of ``flash_mla_with_kvcache``, default False as upstream): False, every query
  token sees the whole cache; True, query i of s_q sees keys 0 .. seqlen - s_q + i (the s_q queries are
  the last s_q tokens of the cache, speculative/MTP decode). With s_q = 1 the two are the same (FlashMLA
  itself turns causal off then). A constexpr: the non-causal kernel has no per-row key bound.
- Paging: BLOCK_N divides page_size, so a BLOCK_N tile never straddles a page and one block-table
  lookup per tile gives its page. Page offsets are int64 (a 132 x 32k-token cache has > 2^31
  elements). Tokens past the sequence end are masked at the load (other=0): the unused tail of the
  last page and unused block-table entries may hold garbage; the tests fill them with NaN.
- Split-K: the KV blocks of each sequence are cut into num_splits contiguous ranges of
  ceil(ceil(seqlen / BLOCK_N) / num_splits) blocks; grid = (row tiles, batch, num_splits), so a small
  batch still fills the SMs. Each split writes its normalised partial output o_s (fp32) and its lse_s.
  The combine kernel (second launch) merges them: m = max_s lse_s, w_s = exp(lse_s - m),
  out = sum_s w_s o_s / sum_s w_s, lse = m + log(sum_s w_s). With num_splits = 1 the main kernel
  writes out and lse directly and there is no combine launch.
- Pipelining: the KV load depends on the block-table load of the same step, so num_stages buys
  (num_stages - 1) // 2 KV tiles in flight (num_stages 3 prefetches only the page index); the space
  offers 1, 2, 3, 5 and 7.
- Splits that receive no blocks (num_splits larger than the number of KV blocks, or a short
  sequence) write o_s = 0 and lse_s = -inf, i.e. weight 0 in the combine.

Zero-length policy (FlashMLA's convention, not an error): a row that sees no key at all (a sequence
with cache_seqlens = 0, or, causal, query i of s_q when seqlen - s_q + i < 0) gets out = 0 and lse = +inf,
as FlashMLA's kernel and reference mark it (a split partial with no key keeps lse_s = -inf inside,
its weight 0 in the combine). No NaN is produced. The float64 reference does the same, and the
check requires the infinities to match exactly.

Family params (spec.params), all optional:
- softmax_scale: float > 0, default 576 ** -0.5.
- page_size: 16, 32, 64 (default), 128 or 256 tokens per KV page; BLOCK_N must divide it.
- seqlens: "spread" (default), "uniform" or a list of non-negative ints (see ``cache_seqlens``).
- causal: bool, default false (FlashMLA's default; see above).
- kv_dtype: "fp8_e4m3" for kregress's FP8 KV cache: e4m3 values with one fp32 scale per token
  (``kv_scale`` [num_blocks, page_size]; a cached token is ``kv_fp8 * scale``, quantized with
  amax / 448 over its 576 values). The kernel dequantizes each tile in fp32 and rounds it to q's
  dtype before the same two dots; the float64 reference dequantizes the same way.
  "fp8_flashmla" for FlashMLA's FP8 cache: 656 bytes per token (512 e4m3 latent values, 4 fp32
  scales, one per 128 values, rounded up to powers of two, and the 64 rope values in bf16), seen as
  [num_blocks, page_size, 1, 656] float8_e4m3fn, written by ``pack_kv_flashmla`` from a bf16 cache as
  FlashMLA's quantizer does. The kernel reads the same bytes three ways (e4m3 latent, fp32 scales, bf16
  rope), multiplies each 128-value tile by its scale in fp32 and rounds to q's dtype (exact: the
  products of e4m3 values and powers of two are bf16 and fp16 numbers); the reference dequantizes
  exactly in float64 (``unpack_kv_flashmla``). Default: the cache has q's dtype.
- check_lse: bool, default true: ``run`` returns (out, lse) and the correctness check compares both
  (the kernel writes lse anyway, so nothing extra is timed); false returns out only.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import triton
import triton.language as tl

from kernels.dtypes import TRITON_PTR
from kernels.softmax import SOFTMAX_FILE, online_softmax_step
from kregress.core.family import (CompileUnit, Rule, Space, TritonFamily, check_bool_param, check_positive_number,
                                  check_seqlens_param, reversed_rank_pair, structure_scale_factors, register)

D_LATENT = 512
D_ROPE = 64
D_QK = D_LATENT + D_ROPE


@triton.jit
def mla_decode_kernel(
    q_ptr, kv_ptr, block_table_ptr, seqlens_ptr,
    out_ptr, lse_ptr, o_part_ptr, lse_part_ptr, kv_scale_ptr, kv_rope_ptr,
    sm_scale,
    stride_qb, stride_qs, stride_qh,
    stride_kvb, stride_kvt,
    stride_btb,
    stride_ob, stride_os, stride_oh,
    stride_lb, stride_lh,
    H_Q, S_Q, M,
    PAGE_SIZE: tl.constexpr, D_V: tl.constexpr, D_PE: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr, KV_FMT: tl.constexpr,
    CAUSAL: tl.constexpr,
):
    pid_h = tl.program_id(0)
    b = tl.program_id(1)
    split = tl.program_id(2)
    seqlen = tl.load(seqlens_ptr + b)

    rows = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
    row_ok = rows < M
    s_idx = rows // H_Q
    h_idx = rows % H_Q
    last_key = seqlen - S_Q + s_idx  # causal: query s sees keys 0..last_key (may be < 0: sees none)

    # This split's token range [start, end): whole BLOCK_N blocks, contiguous, possibly empty.
    n_blocks = (seqlen + BLOCK_N - 1) // BLOCK_N
    blocks_per_split = (n_blocks + NUM_SPLITS - 1) // NUM_SPLITS
    start = split * blocks_per_split * BLOCK_N
    end = tl.minimum(start + blocks_per_split * BLOCK_N, seqlen)

    offs_v = tl.arange(0, D_V)
    offs_pe = tl.arange(0, D_PE)
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, D_V], dtype=tl.float32)
    if start < end:  # an empty split (or sequence) reads nothing and stores o = 0, lse = -inf
        q_row = b.to(tl.int64) * stride_qb + s_idx * stride_qs + h_idx * stride_qh
        # Alignment hints (16-byte rows, checked by the host wrapper) let loads and stores vectorize
        # even when the kernel is compiled ahead of time without the JIT's argument specialization.
        q_nope = tl.load(tl.multiple_of(q_ptr + q_row[:, None] + offs_v[None, :], [16, 16]),
                         mask=row_ok[:, None], other=0.0)
        q_pe = tl.load(tl.multiple_of(q_ptr + q_row[:, None] + D_V + offs_pe[None, :], [16, 16]),
                       mask=row_ok[:, None], other=0.0)
        qk_scale = sm_scale * 1.4426950408889634
        offs_n = tl.arange(0, BLOCK_N)
        bt_row = block_table_ptr + b.to(tl.int64) * stride_btb
        for start_n in range(start, end, BLOCK_N):
            page = tl.load(bt_row + start_n // PAGE_SIZE).to(tl.int64)
            tok = start_n + offs_n
            tok_ok = tok < end
            tok_off = page * stride_kvb + ((start_n % PAGE_SIZE) + offs_n) * stride_kvt  # [BLOCK_N] int64
            kv_rows = kv_ptr + tok_off[:, None]
            kv = tl.load(tl.multiple_of(kv_rows + offs_v[None, :], [16, 16]), mask=tok_ok[:, None], other=0.0)  # K_nope = V
            if KV_FMT == 2:  # FlashMLA's 656-byte token: bytes 512..527 are 4 fp32 scales, 528..655 the bf16 rope
                k_pe = tl.load(kv_rope_ptr + (tok_off // 2 + (D_V + 16) // 2)[:, None] + offs_pe[None, :],
                               mask=tok_ok[:, None], other=0.0).to(q_nope.dtype)
                # one fp32 scale per 128 values: [BLOCK_N, 4] scales times the [BLOCK_N, 4, 128] view of the tile
                tile_scale = tl.load(kv_scale_ptr + (tok_off // 4 + D_V // 4)[:, None] + tl.arange(0, D_V // 128)[None, :],
                                     mask=tok_ok[:, None], other=0.0)
                kv = tl.reshape(tl.reshape(kv.to(tl.float32), [BLOCK_N, D_V // 128, 128]) * tile_scale[:, :, None],
                                [BLOCK_N, D_V]).to(q_nope.dtype)
            else:
                k_pe = tl.load(tl.multiple_of(kv_rows + D_V + offs_pe[None, :], [16, 16]), mask=tok_ok[:, None], other=0.0)
            if KV_FMT == 1:  # kregress's e4m3 cache, one fp32 scale per token: dequantize in fp32, round to q's dtype
                tok_scale = tl.load(kv_scale_ptr + page * PAGE_SIZE + (start_n % PAGE_SIZE) + offs_n, mask=tok_ok, other=0.0)
                kv = (kv.to(tl.float32) * tok_scale[:, None]).to(q_nope.dtype)
                k_pe = (k_pe.to(tl.float32) * tok_scale[:, None]).to(q_nope.dtype)
            qk = tl.dot(q_pe, tl.trans(k_pe), acc=tl.dot(q_nope, tl.trans(kv)))
            if CAUSAL:
                visible = tok_ok[None, :] & (tok[None, :] <= last_key[:, None])
            else:  # FlashMLA's default: every query sees the whole cache
                visible = tok_ok[None, :]
            qk = tl.where(visible, qk * qk_scale, float("-inf"))
            acc, l_i, m_i = online_softmax_step(acc, l_i, m_i, qk, kv)  # kv is both K and V (MLA)

    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    o = acc / l_safe[:, None]
    lse = (m_i + tl.math.log2(l_safe)) * 0.6931471805599453
    if NUM_SPLITS == 1:
        lse = tl.where(empty, float("inf"), lse)  # FlashMLA: a row that sees no key has lse = +inf
        o_row = b.to(tl.int64) * stride_ob + s_idx * stride_os + h_idx * stride_oh
        tl.store(tl.multiple_of(out_ptr + o_row[:, None] + offs_v[None, :], [16, 16]), o.to(out_ptr.dtype.element_ty),
                 mask=row_ok[:, None])
        tl.store(lse_ptr + b.to(tl.int64) * stride_lb + h_idx * stride_lh + s_idx, lse, mask=row_ok)
    else:
        lse = tl.where(empty, float("-inf"), lse)  # an empty split weighs 0 in the combine
        part = (b.to(tl.int64) * M + rows) * NUM_SPLITS + split  # o_part [batch, M, NUM_SPLITS, 512]
        tl.store(tl.multiple_of(o_part_ptr + part[:, None] * D_V + offs_v[None, :], [16, 16]), o, mask=row_ok[:, None])
        tl.store(lse_part_ptr + part, lse, mask=row_ok)


@triton.jit
def mla_combine_kernel(
    o_part_ptr, lse_part_ptr, out_ptr, lse_ptr,
    stride_ob, stride_os, stride_oh,
    stride_lb, stride_lh,
    H_Q, M,
    D_V: tl.constexpr, NUM_SPLITS: tl.constexpr, SPLITS_P2: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_DV: tl.constexpr,
):
    # One program merges the splits of BLOCK_R query rows of one sequence.
    pid_r = tl.program_id(0)
    b = tl.program_id(1)
    rows = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < M
    part = (b.to(tl.int64) * M + rows) * NUM_SPLITS  # first split of each row in o_part / lse_part
    offs_s = tl.arange(0, SPLITS_P2)
    ok = row_ok[:, None] & (offs_s < NUM_SPLITS)[None, :]
    lse_s = tl.load(lse_part_ptr + part[:, None] + offs_s[None, :], mask=ok, other=float("-inf"))
    m = tl.max(lse_s, 1)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp(lse_s - m_safe[:, None])  # 0 for an empty split (lse_s = -inf) and for the padding
    denom = tl.sum(w, 1)
    empty = denom == 0.0
    w = w / tl.where(empty, 1.0, denom)[:, None]
    lse = tl.where(empty, float("inf"), m_safe + tl.log(tl.where(empty, 1.0, denom)))  # FlashMLA: +inf when empty
    s_idx = rows // H_Q
    h_idx = rows % H_Q
    out_rows = b.to(tl.int64) * stride_ob + s_idx * stride_os + h_idx * stride_oh
    offs_d = tl.arange(0, BLOCK_DV)
    slab = (part[:, None] + offs_s[None, :])[:, :, None] * D_V + offs_d[None, None, :]  # [R, splits, BLOCK_DV]
    for d0 in range(0, D_V, BLOCK_DV):  # [BLOCK_R, splits, BLOCK_DV] slabs keep registers bounded
        o_s = tl.load(tl.multiple_of(o_part_ptr + slab + d0, [16, 16, 16]), mask=ok[:, :, None], other=0.0)
        o = tl.sum(w[:, :, None] * o_s, 1)
        tl.store(tl.multiple_of(out_ptr + out_rows[:, None] + d0 + offs_d[None, :], [16, 16]),
                 o.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])
    tl.store(lse_ptr + b.to(tl.int64) * stride_lb + h_idx * stride_lh + s_idx, lse, mask=row_ok)


PAGE_SIZES = (16, 32, 64, 128, 256)
SEQLEN_PATTERNS = ("spread", "uniform")
PARAM_KEYS = ("softmax_scale", "page_size", "seqlens", "check_lse", "kv_dtype", "causal")
KV_DTYPES = ("fp8_e4m3", "fp8_flashmla")
FP8_MAX = 448.0
# FlashMLA's FP8 token ("V32" layout of its tests/quant.py): 512 e4m3 latent values, 4 fp32 scales (one per
# 128 values), 64 bf16 rope values: 512 + 16 + 128 = 656 bytes.
FLASHMLA_TILE = 128
FLASHMLA_SCALES = D_LATENT // FLASHMLA_TILE
FLASHMLA_TOKEN_BYTES = D_LATENT + 4 * FLASHMLA_SCALES + 2 * D_ROPE
KV_FMT_SAME, KV_FMT_TOKEN_SCALE, KV_FMT_FLASHMLA = 0, 1, 2
COMBINE_WARPS = 4
COMBINE_ROWS = 8


def _combine_meta(splits: int) -> dict[str, int]:
    """Combine tile: BLOCK_R rows x all splits x BLOCK_DV columns, about 4096 fp32 values per slab."""
    p2 = triton.next_power_of_2(splits)
    return {"NUM_SPLITS": splits, "SPLITS_P2": p2, "BLOCK_R": COMBINE_ROWS,
            "BLOCK_DV": max(16, min(128, 4096 // (COMBINE_ROWS * p2)))}


def _kv_fp8(params: dict[str, Any]) -> bool:
    return (params or {}).get("kv_dtype") == "fp8_e4m3"


def _kv_flashmla(params: dict[str, Any]) -> bool:
    return (params or {}).get("kv_dtype") == "fp8_flashmla"


def _kv_fmt(params: dict[str, Any]) -> int:
    return KV_FMT_FLASHMLA if _kv_flashmla(params) else (KV_FMT_TOKEN_SCALE if _kv_fp8(params) else KV_FMT_SAME)


def _causal(params: dict[str, Any]) -> bool:
    """FlashMLA's flash_mla_with_kvcache defaults to causal=False: every query token sees the whole cache."""
    return bool((params or {}).get("causal", False))


def kv_token_bytes(params: dict[str, Any], dtype_bytes: int) -> int:
    """Bytes one cached token occupies: 576 values in q's dtype, 576 e4m3 + one fp32 scale, or FlashMLA's 656."""
    if _kv_flashmla(params):
        return FLASHMLA_TOKEN_BYTES
    return D_QK + 4 if _kv_fp8(params) else D_QK * dtype_bytes


def quantize_kv_per_token(kv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[num_blocks, page, 1, 576] -> (e4m3 cache, fp32 scale [num_blocks, page]): amax / 448 per token
    (clamped at 1e-4); a NaN token (poison) stays NaN."""
    x = kv.float()
    scale = x.abs().amax(dim=(2, 3)).clamp(min=1e-4) / FP8_MAX
    return (x / scale[:, :, None, None]).to(torch.float8_e4m3fn), scale


def _ue8m0(scale: torch.Tensor) -> torch.Tensor:
    """A scale rounded up to a power of two (FlashMLA stores its scales so): 2 ** ceil(log2(max(s, 1e-4)))."""
    return torch.pow(2.0, torch.clamp_min(scale, 1e-4).log2().ceil())


def pack_kv_flashmla(kv: torch.Tensor) -> torch.Tensor:
    """A bf16 cache [num_blocks, page, 1, 576] -> FlashMLA's FP8 cache [num_blocks, page, 1, 656] float8_e4m3fn.

    Per token: bytes 0..511 the latent values quantized to e4m3 by tiles of 128, each tile divided by its
    scale 2 ** ceil(log2(max(amax / 448, 1e-4))) (a power of two, FlashMLA's ue8m0 rounding); bytes
    512..527 those 4 scales as fp32 (multiply to dequantize); bytes 528..655 the 64 rope values as bf16,
    unquantized. Pages are (page + 1) * 656 bytes apart, as FlashMLA's packer allocates them (one spare token
    row per page), so the result is a non-contiguous view. A NaN token (poison) stays NaN in all three parts.
    """
    if kv.dtype != torch.bfloat16 or kv.ndim != 4 or kv.shape[2] != 1 or kv.shape[3] != D_QK:
        raise ValueError(f"pack_kv_flashmla: the cache must be bf16 [num_blocks, page, 1, {D_QK}], got {kv.dtype} {tuple(kv.shape)}")
    blocks, page = kv.shape[0], kv.shape[1]
    src = kv[:, :, 0, :]
    full = torch.zeros((blocks, page + 1, FLASHMLA_TOKEN_BYTES), dtype=torch.float8_e4m3fn, device=kv.device)
    out = full[:, :page, :]
    scales = out[..., D_LATENT:D_LATENT + 4 * FLASHMLA_SCALES].view(torch.float32)
    out[..., D_LATENT + 4 * FLASHMLA_SCALES:].view(torch.bfloat16)[:] = src[..., D_LATENT:]
    for t in range(FLASHMLA_SCALES):
        tile = src[..., t * FLASHMLA_TILE:(t + 1) * FLASHMLA_TILE].float()
        scale = _ue8m0(tile.abs().amax(dim=-1) / FP8_MAX)  # [blocks, page]
        scales[..., t] = scale
        out[..., t * FLASHMLA_TILE:(t + 1) * FLASHMLA_TILE] = (tile / scale[..., None]).to(torch.float8_e4m3fn)
    return out.unsqueeze(2)  # [num_blocks, page, 1, 656], page stride (page + 1) * 656


def unpack_kv_flashmla(cache: torch.Tensor) -> torch.Tensor:
    """FlashMLA's FP8 cache [..., 656] -> its exact values in float64 [..., 576]: e4m3 times its tile's fp32
    scale for the 512 latent values, the bf16 rope as is. (With power-of-two scales every product is exact
    in bf16 too, so the kernel's dequantized bf16 tile holds exactly these numbers.)"""
    if cache.dtype != torch.float8_e4m3fn or cache.shape[-1] != FLASHMLA_TOKEN_BYTES:
        raise ValueError(f"unpack_kv_flashmla: expected float8_e4m3fn [..., {FLASHMLA_TOKEN_BYTES}], got {cache.dtype} {tuple(cache.shape)}")
    nope = cache[..., :D_LATENT].double()
    scales = cache[..., D_LATENT:D_LATENT + 4 * FLASHMLA_SCALES].contiguous().view(torch.float32).double()
    rope = cache[..., D_LATENT + 4 * FLASHMLA_SCALES:].contiguous().view(torch.bfloat16).double()
    nope = (nope.unflatten(-1, (FLASHMLA_SCALES, FLASHMLA_TILE)) * scales[..., None]).flatten(-2)
    return torch.cat([nope, rope], dim=-1)


def _page_size(params: dict[str, Any]) -> int:
    return int((params or {}).get("page_size", 64))


def _check_lse(params: dict[str, Any]) -> bool:
    return bool((params or {}).get("check_lse", True))


def _softmax_scale(params: dict[str, Any]) -> float:
    return float((params or {}).get("softmax_scale", D_QK ** -0.5))


def kv_buffers(num_stages: int) -> int:
    """KV tiles in flight. The KV load's address depends on the block-table load of the same step
    (an indirect load), so Triton's pipeliner gives each of the two loads half the latency budget:
    (num_stages - 1) // 2 tiles ahead, and num_stages 3 and 4 only prefetch the page index."""
    return max(1, (num_stages - 1) // 2)


def _smem_fits(cfg: dict[str, int], _params: dict[str, Any], lim: Any) -> bool:
    # Coarse pre-compile bound: a Q-sized staging tile plus the KV ring, 576 two-byte values per row.
    return (cfg["BLOCK_H"] + kv_buffers(cfg["num_stages"]) * cfg["BLOCK_N"]) * D_QK * 2 <= lim.max_shared_memory_per_block


SPACE = Space(
    params={
        "BLOCK_H": (16, 32, 64),
        "BLOCK_N": (16, 32, 64),
        "num_splits": (1, 2, 4, 8, 16, 32),
        "num_stages": (1, 2, 3, 5, 7),  # 1, 1, 1, 2, 3 KV tiles in flight (see kv_buffers)
        "num_warps": (4, 8),
    },
    rules=(
        Rule("page_divisible", "page_size % BLOCK_N == 0 (a KV tile must not straddle a page)",
             lambda c, p, lim: _page_size(p) % c["BLOCK_N"] == 0),
        Rule("acc_in_registers", "BLOCK_H * 512 / (32 * num_warps) <= 128 (fp32 accumulator registers per thread)",
             lambda c, p, lim: c["BLOCK_H"] * D_LATENT <= 128 * 32 * c["num_warps"]),
        Rule("smem_ring", "(BLOCK_H + max(1, (num_stages - 1) // 2) * BLOCK_N) * 576 * 2 bytes <= hardware.limits.max_shared_memory_per_block (227 KiB on an H100)", _smem_fits),
    ),
)


def cache_seqlens(shape: dict[str, int], params: dict[str, Any]) -> list[int]:
    """Per-sequence cache lengths, a pure function of the shape and params (never of the seed), so
    FLOP and byte counts are exact.

    - "uniform": every sequence has seqlen_k tokens.
    - "spread" (default): sequence b has round(seqlen_k * (0.5 + frac(0.5 + b * 0.618...))) tokens
      (0.5x .. 1.5x seqlen_k, a low-discrepancy spread; b = 0 gets exactly seqlen_k), except every
      fourth sequence (b % 4 == 3), which is short: 1 + (29 * b) % 130 tokens, so a batch mixes long
      sequences with ones that fill 1 or 2 pages partly.
    - a list: sequence b has list[b % len(list)] tokens (0 allowed); seqlen_k is then only a label.
    """
    pattern = (params or {}).get("seqlens", "spread")
    n, base = shape["batch"], shape["seqlen_k"]
    if isinstance(pattern, list):
        return [int(pattern[b % len(pattern)]) for b in range(n)]
    if pattern == "uniform":
        return [base] * n
    phi = (math.sqrt(5.0) - 1.0) / 2.0
    out = []
    for b in range(n):
        if b % 4 == 3:
            out.append(1 + (29 * b) % 130)
        else:
            frac = (0.5 + b * phi) % 1.0
            out.append(max(1, round(base * (0.5 + frac))))
    return out


CAUSAL_EDGE = "_gate_causal_edge"  # a gate-only structure-case param (kernels.gate_cases.GATE_PARAM_PREFIX): see _align_future_keys
EDGE_SCORE = 50.0  # |k| of the aligned keys: its score with the first query beats any visible key's by ~e^20


def _align_future_keys(q: torch.Tensor, kv: torch.Tensor, block_table: torch.Tensor, lens: list[int], page: int) -> None:
    """In place: the keys that only the later queries of a sequence may see (positions n - s_q + 1 .. n - 1,
    past the first query's causal bound) point along the sum of the sequence's query vectors, with norm
    EDGE_SCORE, so their scores dominate every query's softmax and their rows (which are also V) are large.
    A kernel that lets a query see one key past its bound, however long the cache, is then off by O(1)
    instead of ~1/n of its output, which random keys would hide inside the tolerance."""
    s_q = q.shape[1]
    for b, n in enumerate(lens):
        u = q[b].to(torch.float32).sum(dim=(0, 1))  # [D_QK]
        u = u / u.norm().clamp_min(1e-6)
        for t in range(max(0, n - s_q + 1), n):
            kv[block_table[b, t // page].long(), t % page, 0] = (EDGE_SCORE * u).to(kv.dtype)


def _visible_keys(seqlen: int, s_q: int, s: int) -> int:
    return max(0, min(seqlen, seqlen - s_q + s + 1))


class MlaDecodeFamily(TritonFamily):
    helper_files = (SOFTMAX_FILE,)  # mla_decode_kernel calls softmax.online_softmax_step
    launch_wrappers = ("mla_decode",)  # the entry point run() calls
    interpreter_ignores = ("num_warps", "num_stages")  # passed to the launch only

    # --- shapes and params --------------------------------------------------------------------
    def check_shape_values(self, shape):
        if shape["s_q"] > 8:
            return f"s_q={shape['s_q']} must be 1..8 (decode step plus speculative tokens)"
        if shape["h_q"] > 256:
            return f"h_q={shape['h_q']} must be <= 256"
        return None

    param_keys = PARAM_KEYS

    def check_param_values(self, params):
        if "softmax_scale" in params:
            problem = check_positive_number("softmax_scale", params["softmax_scale"], f" (e.g. 576 ** -0.5 = {D_QK ** -0.5:.6f})")
            if problem:
                return problem
        if "page_size" in params:
            v = params["page_size"]
            if isinstance(v, bool) or v not in PAGE_SIZES:
                return f"page_size={v!r} is not allowed; allowed: {', '.join(map(str, PAGE_SIZES))}"
        if "seqlens" in params:
            problem = check_seqlens_param(params["seqlens"], SEQLEN_PATTERNS)
            if problem:
                return problem
        for key in ("check_lse", "causal"):
            problem = check_bool_param(params, key)
            if problem:
                return problem
        if "kv_dtype" in params and params["kv_dtype"] not in KV_DTYPES:
            return (f"kv_dtype={params['kv_dtype']!r} is not allowed; allowed: {', '.join(KV_DTYPES)} (absent: q's dtype; "
                    "fp8_e4m3: 576 e4m3 + one fp32 scale per token; fp8_flashmla: FlashMLA's 656-byte token)")
        return None

    # --- inputs, launch, reference -------------------------------------------------------------
    def make_inputs(self, shape, dtype, device, seed, params):
        """Random q and cache; pages handed out in a seeded random order (non-contiguous, shuffled),
        with spare pages, unused block-table entries and page tails filled with NaN: reading any
        token past a sequence's end shows up as NaN in the output."""
        page = _page_size(params)
        lens = cache_seqlens(shape, params)
        B, s_q, h_q = shape["batch"], shape["s_q"], shape["h_q"]
        pages_per_seq = [math.ceil(n / page) for n in lens]
        max_pages = max(1, max(pages_per_seq))
        used = sum(pages_per_seq)
        spare = 2
        num_blocks = used + spare
        g = torch.Generator(device=device).manual_seed(seed)
        q = torch.randn(B, s_q, h_q, D_QK, generator=g, device=device).to(dtype)
        kv = torch.randn(num_blocks, page, 1, D_QK, generator=g, device=device).to(dtype)
        perm = torch.randperm(num_blocks, generator=g, device=device).to(torch.int32)
        poison_page = perm[used:used + 1]  # one of the spare pages
        block_table = poison_page.repeat(B, max_pages).reshape(B, max_pages).clone()
        nxt = 0
        for b, n_pages in enumerate(pages_per_seq):
            block_table[b, :n_pages] = perm[nxt:nxt + n_pages]
            nxt += n_pages
        kv[perm[used:].long()] = float("nan")
        for b, n in enumerate(lens):
            if n % page:  # tail of the last page
                kv[block_table[b, n // page].long(), n % page:] = float("nan")
        if params.get(CAUSAL_EDGE) and _causal(params) and s_q > 1:
            _align_future_keys(q, kv, block_table, lens, page)
        seqlens = torch.tensor(lens, dtype=torch.int32, device=device)
        out = {"q": q, "kv_cache": kv, "block_table": block_table, "cache_seqlens": seqlens}
        if _kv_fp8(params):
            out["kv_cache"], out["kv_scale"] = quantize_kv_per_token(kv)
        elif _kv_flashmla(params):  # FlashMLA packs from a bf16 cache, whatever q's dtype
            out["kv_cache"] = pack_kv_flashmla(kv.to(torch.bfloat16))
        return out

    def run(self, inputs, config, params):
        out, lse = mla_decode(inputs["q"], inputs["kv_cache"], inputs["block_table"], inputs["cache_seqlens"],
                              _softmax_scale(params), config, kv_scale=inputs.get("kv_scale"), causal=_causal(params))
        return (out, lse) if _check_lse(params) else out

    def reference(self, inputs, params):
        out, lse = reference_mla_decode(inputs["q"], inputs["kv_cache"], inputs["block_table"],
                                        inputs["cache_seqlens"], _softmax_scale(params), kv_scale=inputs.get("kv_scale"),
                                        causal=_causal(params))
        return (out, lse) if _check_lse(params) else out

    # --- the gate's hidden structure ------------------------------------------------------------
    reduction_keys = ("seqlen_k",)

    def structure_inputs(self, params):
        return ("block_table", "cache_seqlens")

    def structure_cases(self, shapes, params, rng, timed=()):
        """Ragged cache lengths (1, a page boundary and one past it, random; all distinct) over a batch of at
        least 4, twice with the ranks reversed, and one long sequence (>= 4096 keys, and longer than any timed
        cache) with few heads; page tables are shuffled by the seed."""
        base = max(shapes, key=lambda s: s["batch"] * s["h_q"] * s["seqlen_k"])
        page = _page_size(params)
        batch = max(4, base["batch"])
        longest_fill = max(2 * base["seqlen_k"], page + 1 + batch)

        def draw() -> list[int]:
            # distinct lengths: 1, a page boundary and one past it in every draw, the rest random
            filler = [x for x in rng.sample(range(2, longest_fill + 1), batch + 2) if x not in (page, page + 1)]
            return [1, page, page + 1] + filler[:batch - 3]

        # two draws, the second placed by the first's ranks reversed (reversed_rank_pair): a kernel that reads
        # sequence b's cache length from another sequence (a fixed one or a neighbour, alone or in max/min
        # with its own) is wrong for some sequence in one of the two, whatever the secret draw
        lens = reversed_rank_pair(rng, draw)
        longest = max([max(cache_seqlens(s, params) + [0]) for s in timed] + [0])
        long_n = max(4096, longest) + rng.randint(1, page - 1)
        few = min(s["h_q"] for s in shapes)
        # the softmax scale is a run-time argument the kernel must honour: the ragged cases take another value,
        # one below and one above the spec's (a kernel that honours it on one side only shows), on inputs as
        # made (x8 values make the softmax one-hot, where a 20% change hardly shows)
        scales = [round(_softmax_scale(params) * f, 6) for f in structure_scale_factors(rng)]
        cases = [(f"structure_seqlens{i}", dict(base, batch=batch),
                  {"seqlens": lens[i], "softmax_scale": scales[i], "_gate_inputs_as_made": True}) for i in range(2)]
        cases.append(("structure_long", dict(base, batch=1, h_q=few, seqlen_k=long_n), {"seqlens": [long_n]}))
        # causal with several queries: the timed caches' own lengths (whatever length a kernel keys a shortcut
        # on), with the keys just past each query's causal bound made to dominate (_align_future_keys)
        edge = [s for s in list(timed) + list(shapes) if s["s_q"] > 1]
        if _causal(params) and edge:
            top = max(edge, key=lambda s: (s in timed, max(cache_seqlens(s, params) + [0])))
            cases.append(("structure_causal_edge", dict(top, h_q=few),
                          {"seqlens": cache_seqlens(top, params), CAUSAL_EDGE: True, "_gate_inputs_as_made": True}))
        return cases

    # --- formulas ------------------------------------------------------------------------------
    def flops(self, shape, params):
        # Per visible (row, key) pair: a 576-long dot for the score and a 512-long one for P @ V.
        s_q, causal = shape["s_q"], _causal(params)
        pairs = sum(_visible_keys(n, s_q, s) if causal else n for n in cache_seqlens(shape, params) for s in range(s_q))
        return 2.0 * (D_QK + D_LATENT) * shape["h_q"] * pairs

    def bytes_moved(self, shape, dtype_bytes, params):
        # Compulsory traffic: every cached token once (576 values), q once, out once, lse, the tables.
        lens = cache_seqlens(shape, params)
        rows = shape["batch"] * shape["s_q"] * shape["h_q"]
        pages = sum(math.ceil(n / _page_size(params)) for n in lens)
        token = kv_token_bytes(params, dtype_bytes)  # fp8: 576 bytes + the fp32 scale; FlashMLA's fp8: 656
        return float(sum(lens) * token + dtype_bytes * rows * (D_QK + D_LATENT) + 4 * rows + 4 * (pages + shape["batch"]))

    def tolerance(self, shape, dtype, base_tol, params):
        """The output is a convex mix of V rows (|v| ~ 1), so the absolute error is what matters:
        P is rounded to the input dtype before P @ V (2^-8 relative for bf16, 2^-11 for fp16) and
        the result is rounded once more; fp32 accumulation over the keys adds ~sqrt(n) ulp(fp32).
        Long caches lower each p but add terms, so the bound grows slowly with the reduction length."""
        n = max(cache_seqlens(shape, params) + [1])
        grow = max(1.0, (n / 1024.0) ** 0.25)
        if dtype == "bf16":
            return 2.0 * base_tol * grow, 2.0 * base_tol
        return base_tol * grow, base_tol

    def compile_units(self, config, dtype, params):
        splits = config["num_splits"]
        ptr = TRITON_PTR[dtype]
        sig = {
            "q_ptr": ptr, "kv_ptr": "*fp8e4nv" if _kv_fmt(params) else ptr, "block_table_ptr": "*i32", "seqlens_ptr": "*i32",
            "out_ptr": ptr, "lse_ptr": "*fp32", "o_part_ptr": "*fp32", "lse_part_ptr": "*fp32", "kv_scale_ptr": "*fp32",
            "kv_rope_ptr": "*bf16",
            "sm_scale": "fp32",
            "stride_qb": "i32", "stride_qs": "i32", "stride_qh": "i32",
            "stride_kvb": "i32", "stride_kvt": "i32", "stride_btb": "i32",
            "stride_ob": "i32", "stride_os": "i32", "stride_oh": "i32",
            "stride_lb": "i32", "stride_lh": "i32",
            "H_Q": "i32", "S_Q": "i32", "M": "i32",
            "PAGE_SIZE": "constexpr", "D_V": "constexpr", "D_PE": "constexpr",
            "BLOCK_H": "constexpr", "BLOCK_N": "constexpr", "NUM_SPLITS": "constexpr", "KV_FMT": "constexpr",
            "CAUSAL": "constexpr",
        }
        consts = {"PAGE_SIZE": _page_size(params), "D_V": D_LATENT, "D_PE": D_ROPE,
                  "BLOCK_H": config["BLOCK_H"], "BLOCK_N": config["BLOCK_N"], "NUM_SPLITS": splits,
                  "KV_FMT": _kv_fmt(params), "CAUSAL": _causal(params)}
        # What the GPU JIT specializes as divisible by 16 on the timed shapes: every pointer (fresh
        # torch allocations), strides built from the 576/512 head dims, and sizes built from h_q
        # (a multiple of 16 in every DeepSeek config). Not: the block-table row stride (max pages), S_Q,
        # the lse head stride (s_q).
        by_h = ("stride_lb", "H_Q", "M")
        divisible = tuple(k for k, v in sig.items() if v.startswith("*")) + (
            "stride_qb", "stride_qs", "stride_qh", "stride_kvb", "stride_kvt", "stride_ob", "stride_os", "stride_oh") + by_h
        units = [CompileUnit(mla_decode_kernel, sig, consts, config["num_warps"], config["num_stages"], divisible)]
        if splits > 1:
            csig = {
                "o_part_ptr": "*fp32", "lse_part_ptr": "*fp32", "out_ptr": ptr, "lse_ptr": "*fp32",
                "stride_ob": "i32", "stride_os": "i32", "stride_oh": "i32", "stride_lb": "i32", "stride_lh": "i32",
                "H_Q": "i32", "M": "i32",
                "D_V": "constexpr", "NUM_SPLITS": "constexpr", "SPLITS_P2": "constexpr",
                "BLOCK_R": "constexpr", "BLOCK_DV": "constexpr",
            }
            cconsts = {"D_V": D_LATENT, **_combine_meta(splits)}
            cdiv16 = tuple(k for k, v in csig.items() if v.startswith("*")) + ("stride_ob", "stride_os", "stride_oh") + by_h
            units.append(CompileUnit(mla_combine_kernel, csig, cconsts, COMBINE_WARPS, 1, cdiv16))
        return units

    def model_latency_ms(self, shape, config, stats, hw, dtype_bytes, params):
        """Bandwidth roofline with a critical path, from the real compile stats.

        memory: every cached token is read once per row tile of the same (sequence, split); tiles of
        one sequence run side by side, so re-reads after the first mostly hit L2 (charged at 15%).
        Split partials add fp32 writes plus the combine's read. compute: padded tensor-core FLOPs,
        with BLOCK_H < 64 wasting the rest of a 64-row warpgroup MMA. critical path: the longest
        program (the longest sequence's split) streams its tokens at about twice an SM's fair share
        of HBM bandwidth, discounted by the KV tiles in flight (kv_buffers) and occupancy. Launch: 3 us per kernel
        (CUDA-graph replay). Spills add local-memory traffic.

        causal: a row tile holds every query of a sequence and the last query sees the whole cache, so
        each program streams the same tokens and issues the same (masked) MMAs whether causal is true or
        false; causal changes the visible pairs (``flops``, the TFLOP/s column), never this estimate.

        Sees: the KV bytes per token (q's dtype, fp8 with its per-token scale, or FlashMLA's 656-byte
        token), row tiles (BLOCK_H), splits and their
        fp32 partials, the KV tiles in flight (num_stages through kv_buffers), occupancy from the compile.
        Ignores: the order of pages in the block table (scattered pages cost more on the GPU); the
        combine kernel's own time beyond its launch; num_warps except through occupancy; clocks.
        """
        lim = hw.limits
        bh, bn, splits = config["BLOCK_H"], config["BLOCK_N"], config["num_splits"]
        lens = cache_seqlens(shape, params)
        rows = shape["s_q"] * shape["h_q"]
        tiles_h = math.ceil(rows / bh)
        token_bytes = kv_token_bytes(params, dtype_bytes)
        kv_bytes = sum(lens) * token_bytes
        traffic = kv_bytes * (1.0 + 0.15 * (tiles_h - 1)) + shape["batch"] * rows * (D_QK + D_LATENT) * dtype_bytes
        if splits > 1:
            traffic += shape["batch"] * rows * splits * (D_LATENT + 1) * 4 * 2
        stages = config["num_stages"]
        pipe = 0.55 if stages == 1 else min(1.0, 0.7 + (0.05 if stages >= 3 else 0.0) + 0.12 * (kv_buffers(stages) - 1))
        hide = pipe * min(1.0, 0.5 + stats.occupancy)
        t_memory = traffic / (lim.hbm_gbps * 1e9 * hide)
        padded_keys = sum(math.ceil(n / bn) * bn for n in lens)
        padded_flops = 2.0 * (D_QK + D_LATENT) * tiles_h * max(bh, 64) * padded_keys
        t_compute = padded_flops / (lim.peak_tflops * 1e12 * 0.6)
        longest = max(lens + [0])
        per_split = math.ceil(math.ceil(longest / bn) / splits) * bn
        per_program_bw = 2.0 * lim.hbm_gbps * 1e9 / lim.sm_count * hide
        t_critical = per_split * token_bytes / per_program_bw
        spill_penalty = 1.0 + min(1.0, stats.spill_bytes / 256.0)
        launches = 1 if splits == 1 else 2
        return (max(t_memory, t_compute, t_critical) * spill_penalty + 3e-6 * launches) * 1e3

    def use_cudagraph(self):
        return True


def _aligned_rows(t: torch.Tensor) -> bool:
    """Last dim contiguous, every other stride and the base pointer 16-byte aligned."""
    return (t.stride(-1) == 1 and t.data_ptr() % 16 == 0
            and all((s * t.element_size()) % 16 == 0 for s in t.stride()[:-1]))


def mla_decode(q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor, cache_seqlens: torch.Tensor,
               softmax_scale: float, config: dict[str, int],
               kv_scale: torch.Tensor | None = None, causal: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode attention over a paged latent cache; returns (out [B, s_q, h_q, 512], lse [B, h_q, s_q] fp32, FlashMLA layout).

    causal: FlashMLA's flag (default False: every query sees the whole cache; True: query i of s_q sees
    keys 0 .. seqlen - s_q + i). kv_cache is [num_blocks, page, 1, 576] in q's dtype, or float8_e4m3fn
    with kv_scale (one fp32 per token), or FlashMLA's FP8 cache [num_blocks, page, 1, 656] float8_e4m3fn
    (``pack_kv_flashmla``; no kv_scale: its scales are in the token).
    (1) check shapes (metadata only: nothing here syncs with the device, so it can be captured in a
    CUDA graph), (2) allocate, (3) launch the split kernel and, when num_splits > 1, the combine.
    """
    if q.ndim != 4 or q.shape[-1] != D_QK:
        raise ValueError(f"mla_decode: q must be [batch, s_q, h_q, {D_QK}], got {tuple(q.shape)}")
    fp8 = kv_cache.dtype == torch.float8_e4m3fn
    flashmla = fp8 and kv_cache.ndim == 4 and kv_cache.shape[3] == FLASHMLA_TOKEN_BYTES
    if kv_cache.ndim != 4 or kv_cache.shape[2] != 1 or kv_cache.shape[3] != (FLASHMLA_TOKEN_BYTES if flashmla else D_QK):
        raise ValueError(f"mla_decode: kv_cache must be [num_blocks, page_size, 1, {D_QK}] (or float8_e4m3fn "
                         f"[..., {FLASHMLA_TOKEN_BYTES}], FlashMLA's FP8 cache), got {tuple(kv_cache.shape)}")
    if q.dtype not in (torch.float16, torch.bfloat16) or (kv_cache.dtype != q.dtype and not fp8):
        raise ValueError(f"mla_decode: q must be fp16 or bf16 and kv_cache the same or float8_e4m3fn, got {q.dtype} and {kv_cache.dtype}")
    if (fp8 and not flashmla) != (kv_scale is not None):
        raise ValueError("mla_decode: a float8_e4m3fn [..., 576] kv_cache needs kv_scale (one fp32 scale per token), and only it "
                         f"(FlashMLA's [..., {FLASHMLA_TOKEN_BYTES}] cache carries its scales)")
    if kv_scale is not None and (kv_scale.shape != kv_cache.shape[:2] or kv_scale.dtype != torch.float32 or not kv_scale.is_contiguous()):
        raise ValueError(f"mla_decode: kv_scale must be contiguous fp32 [{kv_cache.shape[0]}, {kv_cache.shape[1]}], "
                         f"got {kv_scale.dtype} {tuple(kv_scale.shape)}")
    B, s_q, h_q, _ = q.shape
    page = kv_cache.shape[1]
    if block_table.ndim != 2 or block_table.shape[0] != B or block_table.dtype != torch.int32:
        raise ValueError(f"mla_decode: block_table must be int32 [batch={B}, max_pages], got {block_table.dtype} {tuple(block_table.shape)}")
    if cache_seqlens.shape != (B,) or cache_seqlens.dtype != torch.int32:
        raise ValueError(f"mla_decode: cache_seqlens must be int32 [batch={B}], got {cache_seqlens.dtype} {tuple(cache_seqlens.shape)}")
    if page % config["BLOCK_N"]:
        raise ValueError(f"mla_decode: BLOCK_N={config['BLOCK_N']} must divide the page size {page}")
    # The kernels promise the compiler 16-byte aligned rows (tl.multiple_of): q is copied if it is not,
    # a misaligned cache is refused (copying a whole cache per step would hide a real problem).
    q = q if _aligned_rows(q) else q.contiguous()
    if not _aligned_rows(kv_cache):
        raise ValueError("mla_decode: kv_cache needs a contiguous last dim and 16-byte aligned pages and tokens")
    block_table = block_table.contiguous()
    kv_fmt = KV_FMT_FLASHMLA if flashmla else (KV_FMT_TOKEN_SCALE if fp8 else KV_FMT_SAME)
    # FlashMLA's token seen as fp32 (its scales at 128..131) and as bf16 (its rope at 264..327): same bytes
    kv_f32 = kv_cache.view(torch.float32) if flashmla else None
    kv_rope = kv_cache.view(torch.bfloat16) if flashmla else None
    M = s_q * h_q
    splits = config["num_splits"]
    out = torch.empty((B, s_q, h_q, D_LATENT), device=q.device, dtype=q.dtype)
    lse = torch.empty((B, h_q, s_q), device=q.device, dtype=torch.float32)  # FlashMLA's layout
    if splits > 1:
        o_part = torch.empty((B, M, splits, D_LATENT), device=q.device, dtype=torch.float32)
        lse_part = torch.empty((B, M, splits), device=q.device, dtype=torch.float32)
    else:
        o_part = lse_part = lse  # unused by the kernel when NUM_SPLITS == 1
    grid = lambda META: (triton.cdiv(M, META["BLOCK_H"]), B, META["NUM_SPLITS"])  # noqa: E731
    mla_decode_kernel[grid](
        q, kv_cache, block_table, cache_seqlens, out, lse, o_part, lse_part,
        kv_f32 if flashmla else (kv_scale if fp8 else lse), kv_rope if flashmla else lse,
        softmax_scale,
        q.stride(0), q.stride(1), q.stride(2),
        kv_cache.stride(0), kv_cache.stride(1),
        block_table.stride(0),
        out.stride(0), out.stride(1), out.stride(2),
        lse.stride(0), lse.stride(1),  # batch and head strides
        h_q, s_q, M,
        PAGE_SIZE=page, D_V=D_LATENT, D_PE=D_ROPE,
        BLOCK_H=config["BLOCK_H"], BLOCK_N=config["BLOCK_N"], NUM_SPLITS=splits, KV_FMT=kv_fmt, CAUSAL=bool(causal),
        num_warps=config["num_warps"], num_stages=config["num_stages"],
    )
    if splits > 1:
        meta = _combine_meta(splits)
        mla_combine_kernel[(triton.cdiv(M, meta["BLOCK_R"]), B)](
            o_part, lse_part, out, lse,
            out.stride(0), out.stride(1), out.stride(2), lse.stride(0), lse.stride(1),
            h_q, M,
            D_V=D_LATENT, **meta,
            num_warps=COMBINE_WARPS, num_stages=1,
        )
    return out, lse


def reference_mla_decode(q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                         cache_seqlens: torch.Tensor, softmax_scale: float,
                         kv_scale: torch.Tensor | None = None, causal: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Float64 reference that gathers each sequence's pages; lse [B, h_q, s_q]; empty rows give out = 0,
    lse = +inf (FlashMLA's convention). causal as FlashMLA's flag (False: every query sees the whole
    cache). FlashMLA's 656-byte FP8 cache is dequantized exactly (``unpack_kv_flashmla``)."""
    B, s_q, h_q, _ = q.shape
    page = kv_cache.shape[1]
    out = torch.zeros((B, s_q, h_q, D_LATENT), dtype=torch.float64)
    lse = torch.full((B, h_q, s_q), float("inf"), dtype=torch.float64)
    for b in range(B):
        n = int(cache_seqlens[b])
        if n == 0:
            continue
        pages = block_table[b, : math.ceil(n / page)].long()
        if kv_cache.shape[-1] == FLASHMLA_TOKEN_BYTES:
            kv = unpack_kv_flashmla(kv_cache[pages].reshape(-1, FLASHMLA_TOKEN_BYTES)[:n])  # [n, 576] exact
        else:
            kv = kv_cache[pages].reshape(-1, D_QK)[:n].double()  # [n, 576]
        if kv_scale is not None:  # FP8 cache: the exact value, fp8 times its token's scale (no rounding)
            kv = kv * kv_scale[pages].reshape(-1)[:n, None].double()
        scores = torch.einsum("shd,nd->shn", q[b].double(), kv) * softmax_scale
        keys = torch.arange(n)
        if causal:
            last = n - s_q + torch.arange(s_q)  # query s sees keys <= n - s_q + s
            scores = scores.masked_fill(keys[None, None, :] > last[:, None, None], float("-inf"))
        row_lse = torch.logsumexp(scores, dim=-1)
        seen = torch.isfinite(row_lse)
        p = torch.where(seen[..., None], torch.exp(scores - row_lse.masked_fill(~seen, 0.0)[..., None]), 0.0)
        out[b] = torch.einsum("shn,nd->shd", p, kv[:, :D_LATENT])
        lse[b] = torch.where(seen, row_lse, float("inf")).transpose(0, 1)  # [s_q, h_q] -> [h_q, s_q]
    return out, lse


import sys as _sys  # noqa: E402

FAMILY = register(
    MlaDecodeFamily(name="mla_decode", space=SPACE, shape_keys=("batch", "s_q", "h_q", "seqlen_k"),
                    headline_metric="gbps", module=_sys.modules[__name__])
)
