"""Prefill attention (DeepSeek-style main attention): packed variable-length sequences, causal or not,
sliding window, grouped-query heads. Flash-attention forward in Triton.

Shapes (packed "varlen" layout, as flash_attn_varlen_func):
- q [total, h_q, head_dim], k and v [total, h_kv, head_dim], cu_seqlens [batch + 1] int32 (prefix
  sums of the sequence lengths; self-attention, so queries and keys share them), out like q.
- head_dim is 64 or 128; h_kv divides h_q and query head h reads KV head h // (h_q / h_kv).

Math and why:
- One program owns BLOCK_M query rows of one head of one sequence and walks that sequence's keys in
  BLOCK_N steps with an online softmax (running max m and sum l per row, fp32 accumulator for
  P @ V, exp2 with scale * log2(e) folded into the scores), so the L x L score matrix never exists.
- Visibility of key j from query i: j < L; causal: j <= i; window W: j >= i - W + 1 and, when not
  causal, also j <= i + W - 1 (a symmetric band). A program only visits the key blocks its rows
  can see, and splits them into masked edge blocks and unmasked interior blocks: the interior loop
  (MASK=False) does no index arithmetic and no select, which is where almost all blocks are for long
  sequences.
- Row tiles are visited heaviest first (for causal masks the last query tiles see the most keys),
  so the tail of the grid is made of short programs.
- Every visible query row sees at least its own key (causal) or some key (non-causal), so no valid
  row is empty; a zero-length sequence in the batch launches programs that exit at once.
- Offsets of the packed tensors are int64 (total * h_q * head_dim can pass 2^31).

Family params (spec.params), all optional:
- causal: bool, default true.
- window: int >= 1, the sliding window (keys i - window + 1 .. i, and up to i + window - 1 when not
  causal); absent or 0 means no window.
- seqlens: "uniform" (default: every sequence has seqlen tokens), "spread" (same total, uneven
  lengths) or a list of lengths >= 0 cycled over the batch (see ``seq_lengths``).
- softmax_scale: float > 0, default head_dim ** -0.5.
- head_dims: the head_dims the spec's shapes use, e.g. [128]; the AOT compile (which sees no shapes)
  builds one kernel per entry and reports the heaviest. Default [64, 128].
"""

from __future__ import annotations

import math
from typing import Any

import torch
import triton
import triton.language as tl

from kregress.core.family import check_param_keys, check_positive_number, check_seqlens_param, CompileUnit, Family, Rule, Space, register


@triton.jit
def _attn_blocks(acc, l_i, m_i, q, k_base, v_base, stride_kt, stride_vt, offs_m, seqlen, qk_scale, window,
                 lo, hi,
                 HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr,
                 MASK: tl.constexpr):
    """Online-softmax update over key blocks [lo, hi); MASK=False only for blocks fully visible to all rows."""
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        k_ptrs = tl.multiple_of(k_base + cols[:, None].to(tl.int64) * stride_kt + offs_d[None, :], [16, 16])
        v_ptrs = tl.multiple_of(v_base + cols[:, None].to(tl.int64) * stride_vt + offs_d[None, :], [16, 16])
        if MASK:
            k = tl.load(k_ptrs, mask=cols[:, None] < seqlen, other=0.0)
            v = tl.load(v_ptrs, mask=cols[:, None] < seqlen, other=0.0)
        else:
            k = tl.load(k_ptrs)
            v = tl.load(v_ptrs)
        qk = tl.dot(q, tl.trans(k)) * qk_scale
        if MASK:
            ok = cols[None, :] < seqlen
            if CAUSAL:
                ok = ok & (cols[None, :] <= offs_m[:, None])
            if HAS_WINDOW:
                ok = ok & (cols[None, :] > offs_m[:, None] - window)
                if not CAUSAL:
                    ok = ok & (cols[None, :] < offs_m[:, None] + window)
            qk = tl.where(ok, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows that have seen nothing yet
        p = tl.math.exp2(qk - m_safe[:, None])
        alpha = tl.math.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def attn_fwd_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, cu_seqlens_ptr,
    sm_scale,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
    GROUP, WINDOW, NUM_M_BLOCKS,
    HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    pid_m = NUM_M_BLOCKS - 1 - tl.program_id(0)  # heaviest row tiles first
    h = tl.program_id(1)
    b = tl.program_id(2)
    seq_start = tl.load(cu_seqlens_ptr + b)
    seqlen = tl.load(cu_seqlens_ptr + b + 1) - seq_start
    start_m = pid_m * BLOCK_M
    if start_m < seqlen:
        offs_m = start_m + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, HEAD_DIM)
        row_ok = offs_m < seqlen
        tok0 = seq_start.to(tl.int64)
        q_ptrs = q_ptr + (tok0 + offs_m[:, None]) * stride_qt + h * stride_qh + offs_d[None, :]
        q = tl.load(tl.multiple_of(q_ptrs, [16, 16]), mask=row_ok[:, None], other=0.0)
        hk = h // GROUP
        k_base = k_ptr + tok0 * stride_kt + hk * stride_kh
        v_base = v_ptr + tok0 * stride_vt + hk * stride_vh

        # Keys any row of this tile can see: [lo, hi). lo is block aligned.
        lo = 0
        hi = seqlen
        if CAUSAL:
            hi = tl.minimum(seqlen, start_m + BLOCK_M)
        if HAS_WINDOW:
            lo = tl.maximum(start_m - WINDOW + 1, 0) // BLOCK_N * BLOCK_N
            if not CAUSAL:
                hi = tl.minimum(seqlen, start_m + BLOCK_M - 1 + WINDOW)
        # Blocks [full_lo, full_hi) are visible to every row of the tile: no mask needed.
        full_lo = lo
        if HAS_WINDOW:
            full_lo = (tl.maximum(start_m + BLOCK_M - WINDOW, 0) + BLOCK_N - 1) // BLOCK_N * BLOCK_N
        full_hi = seqlen // BLOCK_N * BLOCK_N
        if CAUSAL:
            full_hi = tl.minimum(full_hi, (start_m + 1) // BLOCK_N * BLOCK_N)
        elif HAS_WINDOW:
            full_hi = tl.minimum(full_hi, (start_m + WINDOW) // BLOCK_N * BLOCK_N)
        mid_lo = tl.minimum(tl.maximum(full_lo, lo), hi)
        mid_hi = tl.minimum(tl.maximum(full_hi, mid_lo), hi)

        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
        qk_scale = sm_scale * 1.4426950408889634
        acc, l_i, m_i = _attn_blocks(acc, l_i, m_i, q, k_base, v_base, stride_kt, stride_vt, offs_m, seqlen, qk_scale,
                                     WINDOW, lo, mid_lo, HEAD_DIM, BLOCK_N, CAUSAL, HAS_WINDOW, True)
        acc, l_i, m_i = _attn_blocks(acc, l_i, m_i, q, k_base, v_base, stride_kt, stride_vt, offs_m, seqlen, qk_scale,
                                     WINDOW, mid_lo, mid_hi, HEAD_DIM, BLOCK_N, CAUSAL, HAS_WINDOW, False)
        acc, l_i, m_i = _attn_blocks(acc, l_i, m_i, q, k_base, v_base, stride_kt, stride_vt, offs_m, seqlen, qk_scale,
                                     WINDOW, mid_hi, hi, HEAD_DIM, BLOCK_N, CAUSAL, HAS_WINDOW, True)
        out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        o_ptrs = o_ptr + (tok0 + offs_m[:, None]) * stride_ot + h * stride_oh + offs_d[None, :]
        tl.store(tl.multiple_of(o_ptrs, [16, 16]), out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None])


TRITON_PTR = {"fp16": "*fp16", "bf16": "*bf16"}
HEAD_DIMS = (64, 128)
SEQLEN_PATTERNS = ("uniform", "spread")
PARAM_KEYS = ("causal", "window", "seqlens", "softmax_scale", "head_dims")
MAX_HEAD_DIM = max(HEAD_DIMS)


def _causal(params: dict[str, Any]) -> bool:
    return bool((params or {}).get("causal", True))


def _window(params: dict[str, Any]) -> int:
    return int((params or {}).get("window") or 0)


def _head_dims(params: dict[str, Any]) -> tuple[int, ...]:
    return tuple(sorted(set((params or {}).get("head_dims") or HEAD_DIMS)))


def _scale(params: dict[str, Any], head_dim: int) -> float:
    return float((params or {}).get("softmax_scale", head_dim ** -0.5))


SPACE = Space(
    params={
        "BLOCK_M": (16, 32, 64, 128),
        "BLOCK_N": (16, 32, 64, 128),
        "num_stages": (1, 2, 3, 4),
        "num_warps": (2, 4, 8),
    },
    rules=(
        Rule("acc_in_registers", "BLOCK_M * 128 / (32 * num_warps) <= 128 (fp32 accumulator at head_dim 128)",
             lambda c, p, lim: c["BLOCK_M"] * MAX_HEAD_DIM <= 128 * 32 * c["num_warps"]),
        Rule("rows_per_warp", "BLOCK_M >= 16 * num_warps / 4 (a warp's MMA needs 16 rows; a warpgroup shares them)",
             lambda c, p, lim: 4 * c["BLOCK_M"] >= 16 * c["num_warps"]),
        Rule("smem_ring", "(BLOCK_M + 2 * num_stages * BLOCK_N) * 128 * 2 bytes <= hardware.limits.max_shared_memory_per_block (227 KiB on an H100)",
             lambda c, p, lim: (c["BLOCK_M"] + 2 * c["num_stages"] * c["BLOCK_N"]) * MAX_HEAD_DIM * 2 <= lim.max_shared_memory_per_block),
    ),
)


def seq_lengths(shape: dict[str, int], params: dict[str, Any]) -> list[int]:
    """Per-sequence lengths, a pure function of the shape and params (so FLOP counts are exact).

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


def visible_pairs(n: int, causal: bool, window: int) -> int:
    """(query, key) pairs that are not masked in one sequence of n tokens."""
    if n <= 0:
        return 0
    c = n - 1 if window <= 0 else min(window - 1, n - 1)

    def below(c: int) -> int:  # sum over i of min(i, c): keys strictly before i that are visible
        return c * (c + 1) // 2 + (n - 1 - c) * c

    return n + below(c) + (0 if causal else below(c))


class AttentionFamily(Family):
    # --- shapes and params --------------------------------------------------------------------
    def check_shape(self, shape):
        problem = super().check_shape(shape)
        if problem:
            return problem
        if shape["head_dim"] not in HEAD_DIMS:
            return f"head_dim={shape['head_dim']} is not allowed; allowed: {', '.join(map(str, HEAD_DIMS))}"
        if shape["h_q"] % shape["h_kv"]:
            return f"h_kv={shape['h_kv']} must divide h_q={shape['h_q']} (grouped-query heads)"
        return None

    def check_params(self, params):
        params = params or {}
        problem = check_param_keys(params, PARAM_KEYS)
        if problem:
            return problem
        if "causal" in params and not isinstance(params["causal"], bool):
            return f"causal={params['causal']!r} must be true or false"
        if params.get("window") is not None:
            v = params["window"]
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                return f"window={v!r} must be an integer >= 1 (0 or absent: no window)"
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
        return None

    # --- inputs, launch, reference -------------------------------------------------------------
    def make_inputs(self, shape, dtype, device, seed, params):
        if shape["head_dim"] not in _head_dims(params):
            raise ValueError(f"shape head_dim={shape['head_dim']} is not in params.head_dims={list(_head_dims(params))}: "
                             "the compile stats would not describe this shape")
        lens = seq_lengths(shape, params)
        total = sum(lens)
        d = shape["head_dim"]
        g = torch.Generator(device=device).manual_seed(seed)
        q = torch.randn(total, shape["h_q"], d, generator=g, device=device).to(dtype)
        k = torch.randn(total, shape["h_kv"], d, generator=g, device=device).to(dtype)
        v = torch.randn(total, shape["h_kv"], d, generator=g, device=device).to(dtype)
        cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0).tolist()), dtype=torch.int32, device=device)
        return {"q": q, "k": k, "v": v, "cu_seqlens": cu, "max_seqlen": max(lens + [0])}

    def run(self, inputs, config, params):
        return attention(inputs["q"], inputs["k"], inputs["v"], inputs["cu_seqlens"], inputs["max_seqlen"],
                         config, causal=_causal(params), window=_window(params),
                         softmax_scale=_scale(params, inputs["q"].shape[-1]))

    def reference(self, inputs, params):
        return reference_attention(inputs["q"], inputs["k"], inputs["v"], inputs["cu_seqlens"], _causal(params),
                                   _window(params), _scale(params, inputs["q"].shape[-1]))

    # --- formulas ------------------------------------------------------------------------------
    def flops(self, shape, params):
        # 2 * d for the score and 2 * d for P @ V, per visible (query, key) pair and query head.
        pairs = sum(visible_pairs(n, _causal(params), _window(params)) for n in seq_lengths(shape, params))
        return 4.0 * shape["head_dim"] * shape["h_q"] * pairs

    def bytes_moved(self, shape, dtype_bytes, params):
        # Compulsory traffic: q, k, v read once, out written once.
        total = sum(seq_lengths(shape, params))
        return float(dtype_bytes * total * shape["head_dim"] * (2 * shape["h_q"] + 2 * shape["h_kv"]))

    def masked_fraction(self, shape, params) -> float:
        lens = seq_lengths(shape, params)
        full = sum(n * n for n in lens)
        seen = sum(visible_pairs(n, _causal(params), _window(params)) for n in lens)
        return 1.0 - seen / full if full else 0.0

    def tolerance(self, shape, dtype, base_tol, params):
        """The output is a convex mix of V rows (|v| ~ 1): P is rounded to the input dtype before
        P @ V and the result once more; fp32 sums over the keys grow ~sqrt(keys) ulps. The bound
        grows slowly with the reduction length (the longest visible key range)."""
        n = max(seq_lengths(shape, params) + [1])
        if _window(params):
            n = min(n, _window(params) * (1 if _causal(params) else 2))
        grow = max(1.0, (n / 1024.0) ** 0.25)
        if dtype == "bf16":
            return 2.0 * base_tol * grow, 2.0 * base_tol
        return base_tol * grow, base_tol

    def compile_units(self, config, dtype, params):
        """One unit per head_dim the spec may use (params.head_dims, default both 64 and 128): compile
        units see no shapes, and a variant is as constrained as its heaviest kernel."""
        ptr = TRITON_PTR[dtype]
        sig = {
            "q_ptr": ptr, "k_ptr": ptr, "v_ptr": ptr, "o_ptr": ptr, "cu_seqlens_ptr": "*i32",
            "sm_scale": "fp32",
            "stride_qt": "i32", "stride_qh": "i32", "stride_kt": "i32", "stride_kh": "i32",
            "stride_vt": "i32", "stride_vh": "i32", "stride_ot": "i32", "stride_oh": "i32",
            "GROUP": "i32", "WINDOW": "i32", "NUM_M_BLOCKS": "i32",
            "HEAD_DIM": "constexpr", "CAUSAL": "constexpr", "HAS_WINDOW": "constexpr",
            "BLOCK_M": "constexpr", "BLOCK_N": "constexpr",
        }
        # What the GPU JIT specializes as divisible by 16: every pointer and every stride (all are
        # multiples of head_dim); not GROUP, WINDOW or NUM_M_BLOCKS, which depend on the shape.
        DIVISIBLE = tuple(k for k, v in sig.items() if v.startswith("*") or k.startswith("stride_"))
        units = []
        for d in _head_dims(params):
            consts = {"HEAD_DIM": d, "CAUSAL": _causal(params), "HAS_WINDOW": _window(params) > 0,
                      "BLOCK_M": config["BLOCK_M"], "BLOCK_N": config["BLOCK_N"]}
            units.append(CompileUnit(attn_fwd_kernel, sig, consts, config["num_warps"], config["num_stages"], DIVISIBLE))
        return units

    def model_latency_ms(self, shape, config, stats, hw, dtype_bytes, params):
        """Tensor-core roofline over the padded tile work, from the real compile stats.

        compute: every program runs its visible key blocks in full (BLOCK_M x BLOCK_N x head_dim,
        twice); the MMA efficiency grows with the tile, the softmax (exp2, max, sum: per score, not
        per head_dim) costs about 64 MMA-FLOPs per score, and the pipeline depth and occupancy hide
        load latency. Waves: the programs are spread over the SMs, the longest program bounds the
        tail. memory: q, out and K/V once from HBM; every row tile re-reads its K/V blocks, and the
        row tiles of one head run side by side, so 90% of the re-reads hit L2 and 10% are charged
        to HBM. Spills add local-memory traffic. Launch 4 us.
        """
        lim = hw.limits
        bm, bn, d = config["BLOCK_M"], config["BLOCK_N"], shape["head_dim"]
        causal, window = _causal(params), _window(params)
        lens = seq_lengths(shape, params)
        blocks = 0  # key blocks visited, summed over row tiles of one head
        longest = 0
        for n in lens:
            for t in range(math.ceil(n / bm)):
                s = t * bm
                hi = min(n, s + bm) if causal else (min(n, s + bm - 1 + window) if window else n)
                lo = (max(s - window + 1, 0) // bn * bn) if window else 0
                nb = max(0, math.ceil((hi - lo) / bn))
                blocks += nb
                longest = max(longest, nb)
        per_block = 4.0 * bm * bn * d + 64.0 * bm * bn
        mma_eff = min(1.0, (bm * bn) / (128 * 128)) ** 0.3
        hide = min(1.0, 0.55 + 0.15 * config["num_stages"]) * min(1.0, 0.5 + stats.occupancy)
        peak = lim.peak_tflops * 1e12 * mma_eff * hide
        t_compute = blocks * shape["h_q"] * per_block / peak
        # Waves: blocks resident on one SM share its tensor cores, so the SMs drain the total work
        # in parallel, and the longest program alone bounds the tail.
        t_tail = longest * per_block / (peak / lim.sm_count)
        t_compute = max(t_compute, t_tail)
        kv_unique = 2 * sum(lens) * shape["h_kv"]
        kv_reads = 2 * blocks * bn * shape["h_q"]
        traffic = dtype_bytes * d * (2 * shape["h_q"] * sum(lens) + kv_unique + 0.1 * max(0, kv_reads - kv_unique))
        t_memory = traffic / (lim.hbm_gbps * 1e9)
        spill_penalty = 1.0 + min(1.0, stats.spill_bytes / 256.0)
        return (max(t_compute, t_memory) * spill_penalty + 4e-6) * 1e3

    def profile_fields(self, shape, config, measurement, hw, params):
        peak = hw.limits.peak_tflops
        tiles = sum(math.ceil(n / config["BLOCK_M"]) for n in seq_lengths(shape, params))
        return {
            "tflops": measurement.tflops,
            "frac_of_peak": measurement.tflops / peak if peak else 0.0,
            "masked_fraction": self.masked_fraction(shape, params),
            "programs": tiles * shape["h_q"],
        }


def _aligned_rows(t: torch.Tensor) -> bool:
    """Last dim contiguous, every other stride and the base pointer 16-byte aligned."""
    return (t.stride(-1) == 1 and t.data_ptr() % 16 == 0
            and all((s * t.element_size()) % 16 == 0 for s in t.stride()[:-1]))


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
              config: dict[str, int], causal: bool = True, window: int = 0,
              softmax_scale: float | None = None) -> torch.Tensor:
    """Packed varlen attention forward. (1) check shapes (metadata only, no device sync),
    (2) allocate, (3) launch one program per (row tile, query head, sequence)."""
    if q.ndim != 3 or k.ndim != 3 or v.ndim != 3:
        raise ValueError(f"attention: q, k, v must be [total, heads, head_dim], got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    total, h_q, d = q.shape
    if k.shape != v.shape or k.shape[0] != total or k.shape[2] != d:
        raise ValueError(f"attention: k and v must be [{total}, h_kv, {d}], got {tuple(k.shape)} and {tuple(v.shape)}")
    h_kv = k.shape[1]
    if d not in HEAD_DIMS:
        raise ValueError(f"attention: head_dim={d} is not supported; allowed: {', '.join(map(str, HEAD_DIMS))}")
    if h_q % h_kv:
        raise ValueError(f"attention: h_kv={h_kv} must divide h_q={h_q}")
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"attention: q, k, v must share fp16 or bf16, got {q.dtype}, {k.dtype}, {v.dtype}")
    if cu_seqlens.ndim != 1 or cu_seqlens.dtype != torch.int32:
        raise ValueError(f"attention: cu_seqlens must be int32 [batch + 1], got {cu_seqlens.dtype} {tuple(cu_seqlens.shape)}")
    if window < 0:
        raise ValueError(f"attention: window={window} must be >= 0 (0: no window)")
    # The kernel promises the compiler 16-byte aligned rows (tl.multiple_of); copy anything else.
    q, k, v = (t if _aligned_rows(t) else t.contiguous() for t in (q, k, v))
    out = torch.empty_like(q)
    batch = cu_seqlens.shape[0] - 1
    scale = d ** -0.5 if softmax_scale is None else softmax_scale
    grid = lambda META: (triton.cdiv(max(max_seqlen, 1), META["BLOCK_M"]), h_q, batch)  # noqa: E731
    attn_fwd_kernel[grid](
        q, k, v, out, cu_seqlens, scale,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), out.stride(0), out.stride(1),
        h_q // h_kv, window, triton.cdiv(max(max_seqlen, 1), config["BLOCK_M"]),
        HEAD_DIM=d, CAUSAL=causal, HAS_WINDOW=window > 0,
        BLOCK_M=config["BLOCK_M"], BLOCK_N=config["BLOCK_N"],
        num_warps=config["num_warps"], num_stages=config["num_stages"],
    )
    return out


def reference_attention(q, k, v, cu_seqlens, causal: bool, window: int, softmax_scale: float) -> torch.Tensor:
    """Float64 reference, one sequence at a time, with the same visibility rule as the kernel."""
    out = torch.zeros(q.shape, dtype=torch.float64)
    group = q.shape[1] // k.shape[1]
    cu = [int(x) for x in cu_seqlens]
    for b in range(len(cu) - 1):
        s, e = cu[b], cu[b + 1]
        n = e - s
        if n == 0:
            continue
        qb = q[s:e].double().transpose(0, 1)  # [h_q, n, d]
        kb = k[s:e].double().transpose(0, 1).repeat_interleave(group, 0)
        vb = v[s:e].double().transpose(0, 1).repeat_interleave(group, 0)
        scores = qb @ kb.transpose(1, 2) * softmax_scale
        i = torch.arange(n)[:, None]
        j = torch.arange(n)[None, :]
        ok = torch.ones(n, n, dtype=torch.bool)
        if causal:
            ok &= j <= i
        if window > 0:
            ok &= j > i - window
            if not causal:
                ok &= j < i + window
        p = torch.softmax(scores.masked_fill(~ok, float("-inf")), dim=-1)
        out[s:e] = (p @ vb).transpose(0, 1)
    return out


import sys as _sys  # noqa: E402

FAMILY = register(
    AttentionFamily(name="attention", space=SPACE, shape_keys=("batch", "seqlen", "h_q", "h_kv", "head_dim"),
                    headline_metric="tflops", module=_sys.modules[__name__])
)
