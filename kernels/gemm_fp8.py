"""DeepGEMM-like FP8 GEMMs with fine-grained scaling: dense (``gemm_fp8``) and grouped MoE
(``grouped_gemm_fp8``, contiguous and masked layouts). D = A @ B^T in bf16.

Operands (DeepGEMM's "NT" layout, both K-major as the FP8 WGMMA wants them):
- A [M, K] float8_e4m3fn with A scales [M, K / 128] fp32: one scale per token per 128 channels (1x128).
- B [N, K] float8_e4m3fn with B scales [ceil(N / 128), K / 128] fp32: one scale per 128x128 block.
- D [M, N] bf16. The value of A is ``A_fp8 * A_scale`` (scale broadcast over its 1x128 block), of B
  ``B_fp8 * B_scale`` (over its 128x128 block).

Math and why:
- K is walked in steps of BLOCK_K = 128, the scale block: each step's tensor-core product
  ``dot(a, b^T)`` is a fresh fp32 tile that is multiplied by ``a_scale[:, None] * b_scale[None, :]``
  and added to the fp32 accumulator (DeepGEMM's "promotion": the FP8 MMA accumulates in limited
  precision on Hopper, so the partial sum is promoted to full fp32 every 128 K). Because K % 128 == 0
  there is no K mask; M and N edges are masked.
- The float64 reference dequantizes exactly as the kernel reads the operands (fp8 values times their
  block's scale) and multiplies in float64; the quantization helpers are DeepGEMM's test helpers
  (amax per block / 448, clamped at 1e-4).
- Grouped order GROUP_M as in the dense ``gemm`` family.

Grouped layouts (DeepGEMM ``m_grouped_fp8_gemm_nt_contiguous`` / ``..._masked``), B [G, N, K] with
scales [G, ceil(N / 128), K / 128]:
- contiguous: the experts' rows are concatenated in A [M_total, K]; each group's rows are padded to
  a multiple of 128 (``ALIGN_M``); ``m_indices`` [M_total] int32 holds each row's group, -1 for a
  padding row. A tile (BLOCK_M divides 128) therefore belongs to one group or is all padding.
- masked: A [G, max_m, K]; ``masked_m`` [G] int32 valid rows per group (the decode layout for CUDA
  graphs: shapes fixed, counts change); D [G, max_m, N].
- As in DeepGEMM, whole row tiles are computed (padding rows and rows past masked_m are in bounds
  of A) and only the store is restricted to the valid rows; tiles with no valid row exit at once.
- Rows that are not valid (padding / beyond masked_m) are never written: the output buffer is
  allocated once with the inputs (zeros), as DeepGEMM's callers pass ``out``, so the check sees 0
  there and no memset is timed. Groups of 0 rows launch programs that exit at once.

Interpreter: Triton 3.9's CPU interpreter executes ``tl.dot`` on float8e4nv operands (it converts
them to fp32, which is exact for e4m3), so interpreter runs of these kernels are the real kernel on
CPU, not an emulation.

FLOPs: 2 * M * N * K (DeepGEMM's tests), for grouped the valid rows only. Headline TFLOPs are set
against the FP8 dense peak: params.fp8_peak_tflops, default 2 x hardware.limits.peak_tflops (an
H100 SXM: 1979 vs 989 bf16).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import triton
import triton.language as tl

from kregress.core.family import (check_positive_number, check_seqlens_param, CompileUnit, reversed_rank_pair, Rule,
                                  Space, TritonFamily, register)
from kernels.latency import tile_gemm_ms
from kernels.tiles import TILES_FILE, grouped_pid

SCALE_BLOCK = 128  # DeepGEMM's scaling granularity: 1x128 for A, 128x128 for B
ALIGN_M = 128  # contiguous layout: each group's rows are padded to a multiple of this
FP8_MAX = 448.0  # largest finite float8_e4m3fn
FP8_PEAK_RATIO = 2.0  # dense FP8 / dense BF16 tensor-core peak on Hopper
LAYOUT_DENSE, LAYOUT_CONTIGUOUS, LAYOUT_MASKED = 0, 1, 2
K_RULE = "K % 128 == 0 (one A scale per 1x128 block and one B scale per 128x128 block: DeepGEMM's scaling granularity)"


@triton.jit
def fp8_gemm_kernel(
    a_ptr, as_ptr, b_ptr, bs_ptr, d_ptr, grp_ptr,
    M, N, K,
    stride_am, stride_asm, stride_ask, stride_bn, stride_bsn, stride_bsk, stride_dm,
    stride_ag, stride_asg, stride_bg, stride_bsg, stride_dg,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    LAYOUT: tl.constexpr, SCALE_K: tl.constexpr, SCALE_N: tl.constexpr,
):
    pid = tl.program_id(0)
    pid_m, pid_n = grouped_pid(pid, M, N, BLOCK_M, BLOCK_N, GROUP_M)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    in_m = offs_m < M
    col_ok = offs_n < N
    g = pid * 0  # dense: group 0
    m_valid = M
    if LAYOUT == 1:  # contiguous: the tile's group is its first row's (groups are 128-row aligned); -1 = padding
        g = tl.load(grp_ptr + pid_m * BLOCK_M)
    if LAYOUT == 2:  # masked: one grid column per group, masked_m[g] valid rows
        g = tl.program_id(1)
        m_valid = tl.load(grp_ptr + g)
    if (g >= 0) & (pid_m * BLOCK_M < m_valid):
        g64 = g.to(tl.int64)
        offs_k = tl.arange(0, BLOCK_K)
        a_ptrs = a_ptr + g64 * stride_ag + offs_m[:, None].to(tl.int64) * stride_am + offs_k[None, :]
        b_ptrs = b_ptr + g64 * stride_bg + offs_n[:, None].to(tl.int64) * stride_bn + offs_k[None, :]
        as_ptrs = as_ptr + g64 * stride_asg + offs_m * stride_asm
        bs_ptrs = bs_ptr + g64 * stride_bsg + (offs_n // SCALE_N) * stride_bsn
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        # Like DeepGEMM, whole tiles are computed (padding rows and rows past masked_m are in bounds);
        # only the store is restricted to the valid rows.
        for k in range(0, K // BLOCK_K):
            a = tl.load(a_ptrs, mask=in_m[:, None], other=0.0)
            b = tl.load(b_ptrs, mask=col_ok[:, None], other=0.0)
            kb = (k * BLOCK_K) // SCALE_K
            sa = tl.load(as_ptrs + kb * stride_ask, mask=in_m, other=0.0)
            sb = tl.load(bs_ptrs + kb * stride_bsk, mask=col_ok, other=0.0)
            # Promotion: this K block's FP8 product is scaled and added in full fp32.
            acc += tl.dot(a, tl.trans(b)) * (sa[:, None] * sb[None, :])
            a_ptrs += BLOCK_K
            b_ptrs += BLOCK_K
        row_ok = in_m
        if LAYOUT == 1:
            row_ok = row_ok & (tl.load(grp_ptr + offs_m, mask=in_m, other=-1) == g)
        if LAYOUT == 2:
            row_ok = row_ok & (offs_m < m_valid)
        d_ptrs = d_ptr + g64 * stride_dg + offs_m[:, None].to(tl.int64) * stride_dm + offs_n[None, :]
        tl.store(d_ptrs, acc.to(d_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


# --- quantization helpers (DeepGEMM's test helpers) ------------------------------------------------


def per_token_cast_to_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] (K % 128 == 0) -> (e4m3 [M, K], fp32 scales [M, K / 128]); x ~ fp8 * scale per 1x128."""
    if x.ndim != 2 or x.shape[1] % SCALE_BLOCK:
        raise ValueError(f"per_token_cast_to_fp8: x must be [M, K] with {K_RULE}; got {tuple(x.shape)}")
    m, k = x.shape
    xv = x.float().view(m, k // SCALE_BLOCK, SCALE_BLOCK)
    amax = xv.abs().amax(dim=2).clamp(min=1e-4)
    scale = amax / FP8_MAX
    return (xv / scale[:, :, None]).to(torch.float8_e4m3fn).view(m, k), scale


def per_block_cast_to_fp8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] (K % 128 == 0) -> (e4m3 [N, K], fp32 scales [ceil(N / 128), K / 128]) per 128x128 block."""
    if w.ndim != 2 or w.shape[1] % SCALE_BLOCK:
        raise ValueError(f"per_block_cast_to_fp8: w must be [N, K] with {K_RULE}; got {tuple(w.shape)}")
    n, k = w.shape
    nb = math.ceil(n / SCALE_BLOCK)
    padded = torch.zeros(nb * SCALE_BLOCK, k, dtype=torch.float32, device=w.device)
    padded[:n] = w.float()
    wv = padded.view(nb, SCALE_BLOCK, k // SCALE_BLOCK, SCALE_BLOCK)
    amax = wv.abs().amax(dim=(1, 3)).clamp(min=1e-4)
    scale = amax / FP8_MAX
    q = (wv / scale[:, None, :, None]).to(torch.float8_e4m3fn).view(nb * SCALE_BLOCK, k)[:n].contiguous()
    return q, scale


def dequantize_a(a: torch.Tensor, sa: torch.Tensor) -> torch.Tensor:
    """Float64 value of A as the kernel reads it: fp8 value times its 1x128 block's scale."""
    return a.double() * sa.double().repeat_interleave(SCALE_BLOCK, dim=-1)[..., : a.shape[-1]]


def dequantize_b(b: torch.Tensor, sb: torch.Tensor) -> torch.Tensor:
    """Float64 value of B [.., N, K]: fp8 value times its 128x128 block's scale."""
    s = sb.double().repeat_interleave(SCALE_BLOCK, dim=-1).repeat_interleave(SCALE_BLOCK, dim=-2)
    return b.double() * s[..., : b.shape[-2], : b.shape[-1]]


# --- host wrappers ---------------------------------------------------------------------------------


def _check_operands(a, sa, b, sb) -> None:
    if a.dtype != torch.float8_e4m3fn or b.dtype != torch.float8_e4m3fn:
        raise ValueError(f"gemm_fp8: A and B must be float8_e4m3fn, got {a.dtype} and {b.dtype}")
    if sa.dtype != torch.float32 or sb.dtype != torch.float32:
        raise ValueError(f"gemm_fp8: scales must be float32, got {sa.dtype} and {sb.dtype}")
    K = a.shape[-1]
    if K % SCALE_BLOCK:
        raise ValueError(f"gemm_fp8: K={K} violates {K_RULE}")
    if b.shape[-1] != K:
        raise ValueError(f"gemm_fp8: A{tuple(a.shape)} and B{tuple(b.shape)} disagree on K (B is [N, K], K-major)")
    want_sa = tuple(a.shape[:-1]) + (K // SCALE_BLOCK,)
    want_sb = tuple(b.shape[:-2]) + (math.ceil(b.shape[-2] / SCALE_BLOCK), K // SCALE_BLOCK)
    if tuple(sa.shape) != want_sa:
        raise ValueError(f"gemm_fp8: A scales must be {list(want_sa)} (1x128 blocks), got {list(sa.shape)}")
    if tuple(sb.shape) != want_sb:
        raise ValueError(f"gemm_fp8: B scales must be {list(want_sb)} (128x128 blocks), got {list(sb.shape)}")
    if a.stride(-1) != 1 or b.stride(-1) != 1:
        raise ValueError("gemm_fp8: A and B need a contiguous K dimension (K-major)")


def _launch(a, sa, b, sb, d, grp, M, N, K, groups, layout, config, strides_g):
    if M == 0 or N == 0 or groups == 0:
        return d
    grid = (triton.cdiv(M, config["BLOCK_M"]) * triton.cdiv(N, config["BLOCK_N"]), groups)
    fp8_gemm_kernel[grid](
        a, sa, b, sb, d, grp, M, N, K,
        a.stride(-2), sa.stride(-2), sa.stride(-1), b.stride(-2), sb.stride(-2), sb.stride(-1), d.stride(-2),
        *strides_g,
        BLOCK_M=config["BLOCK_M"], BLOCK_N=config["BLOCK_N"], BLOCK_K=config["BLOCK_K"], GROUP_M=config["GROUP_M"],
        LAYOUT=layout, SCALE_K=SCALE_BLOCK, SCALE_N=SCALE_BLOCK,
        num_warps=config["num_warps"], num_stages=config["num_stages"],
    )
    return d


def fp8_gemm_nt(a, sa, b, sb, config: dict[str, int], out: torch.Tensor | None = None) -> torch.Tensor:
    """D [M, N] bf16 = (A * sa) @ (B * sb)^T for e4m3 A [M, K], B [N, K] (DeepGEMM ``fp8_gemm_nt``)."""
    if a.ndim != 2 or b.ndim != 2:
        raise ValueError(f"gemm_fp8: A must be [M, K] and B [N, K], got {tuple(a.shape)} and {tuple(b.shape)}")
    _check_operands(a, sa, b, sb)
    M, K = a.shape
    N = b.shape[0]
    d = out if out is not None else torch.empty((M, N), device=a.device, dtype=torch.bfloat16)
    return _launch(a, sa, b, sb, d, sa, M, N, K, 1, LAYOUT_DENSE, config, (0, 0, 0, 0, 0))


def m_grouped_fp8_gemm_nt_contiguous(a, sa, b, sb, m_indices, config: dict[str, int], out: torch.Tensor) -> torch.Tensor:
    """Contiguous layout: A [M_total, K] rows of all groups (each padded to a multiple of 128),
    m_indices [M_total] int32 (group per row, -1 padding), B [G, N, K]; writes valid rows of out [M_total, N]."""
    if a.ndim != 2 or b.ndim != 3 or m_indices.shape != (a.shape[0],) or m_indices.dtype != torch.int32:
        raise ValueError(f"grouped_gemm_fp8: contiguous needs A [M, K], B [G, N, K], m_indices int32 [M]; got "
                         f"{tuple(a.shape)}, {tuple(b.shape)}, {m_indices.dtype} {tuple(m_indices.shape)}")
    if a.shape[0] % ALIGN_M or ALIGN_M % config["BLOCK_M"]:
        raise ValueError(f"grouped_gemm_fp8: contiguous needs M_total % {ALIGN_M} == 0 and BLOCK_M dividing {ALIGN_M}")
    _check_operands(a, sa, b, sb)
    M, K = a.shape
    N = b.shape[1]
    return _launch(a, sa, b, sb, out, m_indices, M, N, K, 1, LAYOUT_CONTIGUOUS, config,
                   (0, 0, b.stride(0), sb.stride(0), 0))


def m_grouped_fp8_gemm_nt_masked(a, sa, b, sb, masked_m, config: dict[str, int], out: torch.Tensor) -> torch.Tensor:
    """Masked layout: A [G, max_m, K], masked_m [G] int32 valid rows per group, B [G, N, K];
    writes the valid rows of out [G, max_m, N]."""
    G = b.shape[0] if b.ndim == 3 else -1
    if a.ndim != 3 or b.ndim != 3 or a.shape[0] != G or masked_m.shape != (G,) or masked_m.dtype != torch.int32:
        raise ValueError(f"grouped_gemm_fp8: masked needs A [G, max_m, K], B [G, N, K], masked_m int32 [G]; got "
                         f"{tuple(a.shape)}, {tuple(b.shape)}, {masked_m.dtype} {tuple(masked_m.shape)}")
    _check_operands(a, sa, b, sb)
    _, M, K = a.shape
    N = b.shape[1]
    return _launch(a, sa, b, sb, out, masked_m, M, N, K, G, LAYOUT_MASKED, config,
                   (a.stride(0), sa.stride(0), b.stride(0), sb.stride(0), out.stride(0)))


# --- the space ---------------------------------------------------------------------------------------


def _smem_fits(c: dict[str, int], _p: dict[str, Any], lim: Any) -> bool:
    # Pre-compile bound: the stages' A+B ring of 1-byte fp8 slabs. On sm_90 this is exactly what Triton
    # 3.9 allocates for this kernel (the bf16 output is stored from registers, no staging tile).
    return (c["BLOCK_M"] + c["BLOCK_N"]) * c["BLOCK_K"] * c["num_stages"] <= lim.max_shared_memory_per_block


def _layout(params: dict[str, Any]) -> str:
    return (params or {}).get("layout", "contiguous")


RULES = (
    Rule("k_step_is_scale_block", "BLOCK_K == 128 (each K step must use exactly one A and one B scale block)",
         lambda c, p, lim: c["BLOCK_K"] == SCALE_BLOCK),
    # Measured on sm_90 (Triton 3.9): 128x128 at 8 warps and 64x128 at 4 warps fit (219-229 registers);
    # every tile with more than 64 accumulator values per thread hit 255 registers and spilled.
    Rule("acc_in_registers", "BLOCK_M * BLOCK_N <= 64 * 32 * num_warps (64 fp32 accumulator values per thread: "
         "the promoted per-K-block product needs as many again)",
         lambda c, p, lim: c["BLOCK_M"] * c["BLOCK_N"] <= 64 * 32 * c["num_warps"]),
    Rule("warps_fit_tile", "num_warps <= BLOCK_M / 16 (a warpgroup's FP8 WGMMA takes 64 rows; fewer rows idle warps)",
         lambda c, p, lim: c["num_warps"] * 16 <= c["BLOCK_M"]),
    Rule("smem_ring", "(BLOCK_M + BLOCK_N) * BLOCK_K * 1 byte * num_stages <= hardware.limits.max_shared_memory_per_block",
         _smem_fits),
)

SPACE = Space(
    params={
        "BLOCK_M": (64, 128, 256),  # DeepGEMM: 64, 128, 256 (one or more m64 WGMMAs)
        # DeepGEMM goes to 256; here 256 is never valid at 4 or 8 warps (acc_in_registers, measured spills)
        "BLOCK_N": (16, 32, 64, 128),
        "BLOCK_K": (128,),
        "GROUP_M": (1, 8, 16),
        "num_stages": (2, 3, 4, 5, 6),
        "num_warps": (4, 8),
    },
    rules=RULES,
)

GROUPED_SPACE = Space(
    params=dict(SPACE.params),
    rules=RULES + (
        Rule("tile_in_one_group", "contiguous layout: BLOCK_M divides 128 (groups are padded to 128 rows, a row tile "
             "must not straddle two experts)",
             lambda c, p, lim: _layout(p) != "contiguous" or ALIGN_M % c["BLOCK_M"] == 0),
    ),
)


# --- families ----------------------------------------------------------------------------------------


def _fp8_peak(params: dict[str, Any], lim: Any) -> float:
    return float((params or {}).get("fp8_peak_tflops") or FP8_PEAK_RATIO * lim.peak_tflops)


def _tolerance(K: int, base_tol: float) -> tuple[float, float]:
    # |D| ~ sqrt(K) (unit-variance inputs); fp32 promotion every 128 K keeps the sum error ~ sqrt(K / 128)
    # ulps; the bf16 output adds 2^-9 relative. The fp8 rounding itself is in the reference (exact dequant).
    return base_tol * max(1.0, math.sqrt(K / 128.0)), 2.0 * base_tol


def _randn(rows: int, cols: int, g: torch.Generator, device: str) -> torch.Tensor:
    return torch.randn(rows, cols, generator=g).to(device)


class Fp8Checks:
    """The checks every FP8 GEMM family makes, however its kernel is written (Triton or CUDA C++): e4m3
    inputs, K a multiple of the scale block, the fp8_peak_tflops param and the FP8 peak it sets."""

    dtypes = ("fp8_e4m3",)

    def check_shape_values(self, shape):
        if shape["K"] % SCALE_BLOCK:
            return f"K={shape['K']} violates {K_RULE}"
        return None

    def peak_tflops(self, hw, params):
        return _fp8_peak(params, hw.limits)

    def check_param_values(self, params):
        if "fp8_peak_tflops" in params:
            return check_positive_number("fp8_peak_tflops", params["fp8_peak_tflops"], " (an H100 SXM: 1979)")
        return None


class DenseFp8Problem(Fp8Checks):
    """The dense FP8 GEMM problem, apart from the kernel that solves it: its inputs (per-token A and
    per-block B scales, DeepGEMM's layout), the exact-dequantization reference, FLOPs, bytes and tolerance.
    The Triton family (``GemmFp8Family``) and the CUDA C++ one (``kernels.cuda.gemm_fp8_cuda``) both use it,
    so a variant of either is checked against the same inputs and reference."""

    param_keys = ("fp8_peak_tflops",)

    def make_inputs(self, shape, dtype, device, seed, params):
        g = torch.Generator(device="cpu").manual_seed(seed)
        a, sa = per_token_cast_to_fp8(_randn(shape["M"], shape["K"], g, device))
        b, sb = per_block_cast_to_fp8(_randn(shape["N"], shape["K"], g, device))
        return {"a": a, "sa": sa, "b": b, "sb": sb}

    def reference(self, inputs, params):
        return dequantize_a(inputs["a"], inputs["sa"]) @ dequantize_b(inputs["b"], inputs["sb"]).T

    def flops(self, shape, params):
        return 2.0 * shape["M"] * shape["N"] * shape["K"]

    def bytes_moved(self, shape, dtype_bytes, params):
        M, N, K = shape["M"], shape["N"], shape["K"]
        scales = 4 * (M * K // SCALE_BLOCK + math.ceil(N / SCALE_BLOCK) * K // SCALE_BLOCK)
        return float(M * K + N * K + scales + 2 * M * N)  # fp8 A, B once, fp32 scales, bf16 D

    def tolerance(self, shape, dtype, base_tol, params):
        return _tolerance(shape["K"], base_tol)


class Fp8FamilyBase(Fp8Checks, TritonFamily):
    """What the dense and grouped Triton FP8 families share: ``Fp8Checks`` and the tile-order helper file in
    the source hash."""

    helper_files = (TILES_FILE,)  # fp8_gemm_kernel calls tiles.grouped_pid


# What both FP8 GEMMs' latency estimate sees and ignores: the report quotes each model_latency_ms docstring.
_MODEL_NOTES = """Sees: the tile grid over the SMs; the tensor-core efficiency of the tile shape and the fp32
promotion's FFMAs; pipelining depth (num_stages - 1 K-slabs in flight per resident block, blocks
from the compile's registers and shared memory); L2 reuse of the A and B bands within a wave in
GROUP_M order; fp8 operands with their fp32 scales, bf16 output; spills; a 4 us launch.

Ignores: num_warps except through the resident blocks; L2 reuse between waves; L2 and shared-memory
bandwidth; the scale loads' latency; clocks and power limits."""


def _model_doc(summary: str):
    """A ``model_latency_ms`` docstring: ``summary``, then the FP8 GEMMs' shared notes."""

    def set_doc(fn):
        fn.__doc__ = f"{summary}\n\n{_MODEL_NOTES}"
        return fn

    return set_doc


class GemmFp8Family(DenseFp8Problem, Fp8FamilyBase):
    launch_wrappers = ("fp8_gemm_nt", "_launch", "_check_operands")  # the entry point run() calls
    interpreter_ignores = ("num_warps", "num_stages")  # passed to the launch only
    reduction_keys = ("K",)  # the gate's least-work shape keeps the timed K

    def run(self, inputs, config, params):
        return fp8_gemm_nt(inputs["a"], inputs["sa"], inputs["b"], inputs["sb"], config)

    def compile_units(self, config, dtype, params):
        return [_unit(config, LAYOUT_DENSE)]

    @_model_doc("The tiled-GEMM estimate at the FP8 peak (``_model_ms``, kernels/latency.py).")
    def model_latency_ms(self, shape, config, stats, hw, dtype_bytes, params):
        return _model_ms(shape["M"], shape["N"], shape["K"], 1, config, stats, hw, params)


def _unit(config: dict[str, int], layout: int) -> CompileUnit:
    sig = {
        "a_ptr": "*fp8e4nv", "as_ptr": "*fp32", "b_ptr": "*fp8e4nv", "bs_ptr": "*fp32", "d_ptr": "*bf16",
        "grp_ptr": "*i32" if layout else "*fp32",
        "M": "i32", "N": "i32", "K": "i32",
        "stride_am": "i32", "stride_asm": "i32", "stride_ask": "i32", "stride_bn": "i32", "stride_bsn": "i32",
        "stride_bsk": "i32", "stride_dm": "i32",
        "stride_ag": "i32", "stride_asg": "i32", "stride_bg": "i32", "stride_bsg": "i32", "stride_dg": "i32",
        "BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr", "GROUP_M": "constexpr",
        "LAYOUT": "constexpr", "SCALE_K": "constexpr", "SCALE_N": "constexpr",
    }
    consts = {k: config[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M")}
    consts.update({"LAYOUT": layout, "SCALE_K": SCALE_BLOCK, "SCALE_N": SCALE_BLOCK})
    # On the timed shapes K and N are multiples of 128 (so are the row strides of A, B and D);
    # M is not (M = 64 decode rows, masked counts). The scale strides are K / 128 (not aligned).
    divisible = ("a_ptr", "as_ptr", "b_ptr", "bs_ptr", "d_ptr", "grp_ptr", "N", "K", "stride_am", "stride_bn", "stride_dm")
    if layout == LAYOUT_MASKED:
        divisible += ("stride_ag", "stride_bg", "stride_dg")
    elif layout == LAYOUT_CONTIGUOUS:
        divisible += ("M", "stride_bg")
    return CompileUnit(fp8_gemm_kernel, sig, consts, config["num_warps"], config["num_stages"], divisible)


def _model_ms(M: int, N: int, K: int, groups: int, config, stats, hw, params, valid_rows: int | None = None) -> float:
    """The tiled-GEMM estimate of kernels/latency.py at the FP8 peak: fp8 A and B (plus one fp32 scale per
    128 elements), bf16 D; the fp32 promotion costs ~2 FFMA per accumulator element per K block, which
    share the SM with the WGMMA (MMA efficiency x0.9)."""
    bm, bn, bk = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"]
    mma_eff = min(1.0, (bm * bn) / (128 * 128)) ** 0.35 * 0.9
    in_bytes = 1.0 + 4.0 / SCALE_BLOCK
    return tile_gemm_ms(M, N, K, bm, bn, bk, config["GROUP_M"], config["num_stages"], stats, hw.limits, in_bytes, 2.0,
                        _fp8_peak(params, hw.limits), mma_eff, groups=groups, valid_rows=valid_rows)


# --- grouped ------------------------------------------------------------------------------------------

GROUP_PATTERNS = ("uniform", "spread")
GROUPED_PARAMS = ("layout", "group_sizes", "fp8_peak_tflops")


def group_sizes(shape: dict[str, int], params: dict[str, Any]) -> list[int]:
    """Valid rows per group (expert), a pure function of the shape and params.

    - "uniform" (default): every group has m rows.
    - "spread": uneven token routing with the same total groups * m: weights 0.25 + 1.5 * frac(g * 0.618...),
      normalised; in the masked layout each count is capped at m (max_m).
    - a list: group g has list[g % len(list)] rows (0 allowed; masked: at most m).
    """
    pattern = (params or {}).get("group_sizes", "uniform")
    G, m = shape["groups"], shape["m"]
    if isinstance(pattern, list):
        sizes = [int(pattern[g % len(pattern)]) for g in range(G)]
    elif pattern == "uniform" or G == 1:
        sizes = [m] * G
    else:
        phi = (math.sqrt(5.0) - 1.0) / 2.0
        w = [0.25 + 1.5 * ((g * phi) % 1.0) for g in range(G)]
        sizes = [max(0, round(G * m * x / sum(w))) for x in w]
    if _layout(params) == "masked":
        sizes = [min(s, m) for s in sizes]
    return sizes


def _aligned(n: int) -> int:
    return math.ceil(n / ALIGN_M) * ALIGN_M


class GroupedGemmFp8Family(Fp8FamilyBase):
    launch_wrappers = ("m_grouped_fp8_gemm_nt_contiguous", "m_grouped_fp8_gemm_nt_masked", "_launch", "_check_operands")
    interpreter_ignores = ("num_warps", "num_stages")  # passed to the launch only
    param_keys = GROUPED_PARAMS

    def check_param_values(self, params):
        if _layout(params) not in ("contiguous", "masked"):
            return f"layout={params['layout']!r} is not allowed; allowed: contiguous (MoE prefill), masked (decode)"
        if "group_sizes" in params:
            problem = check_seqlens_param(params["group_sizes"], GROUP_PATTERNS)
            if problem:
                return problem.replace("seqlens", "group_sizes")
        return super().check_param_values(params)  # fp8_peak_tflops

    def make_inputs(self, shape, dtype, device, seed, params):
        G, m, N, K = shape["groups"], shape["m"], shape["N"], shape["K"]
        sizes = group_sizes(shape, params)
        g = torch.Generator(device="cpu").manual_seed(seed)
        bs, bss = zip(*(per_block_cast_to_fp8(_randn(N, K, g, device)) for _ in range(G)))
        b, sb = torch.stack(bs), torch.stack(bss)
        if _layout(params) == "masked":
            a, sa = per_token_cast_to_fp8(_randn(G * m, K, g, device))
            a, sa = a.view(G, m, K), sa.view(G, m, K // SCALE_BLOCK)
            grp = torch.tensor(sizes, dtype=torch.int32, device=device)
            out = torch.zeros((G, m, N), dtype=torch.bfloat16, device=device)
        else:
            total = sum(_aligned(s) for s in sizes)
            a, sa = per_token_cast_to_fp8(_randn(max(total, ALIGN_M), K, g, device))
            a, sa = a[:total], sa[:total]
            idx = []
            for gi, s in enumerate(sizes):
                idx += [gi] * s + [-1] * (_aligned(s) - s)
            grp = torch.tensor(idx, dtype=torch.int32, device=device)
            out = torch.zeros((total, N), dtype=torch.bfloat16, device=device)
        return {"a": a, "sa": sa, "b": b, "sb": sb, "grp": grp, "out": out}

    def run(self, inputs, config, params):
        fn = m_grouped_fp8_gemm_nt_masked if _layout(params) == "masked" else m_grouped_fp8_gemm_nt_contiguous
        return fn(inputs["a"], inputs["sa"], inputs["b"], inputs["sb"], inputs["grp"], config, inputs["out"])

    def reference(self, inputs, params):
        """Float64, exact dequantization; starts from ``out`` as handed in: padding rows and rows past
        ``masked_m`` keep what the caller put there (a correct kernel never writes them)."""
        a, b, grp = dequantize_a(inputs["a"], inputs["sa"]), dequantize_b(inputs["b"], inputs["sb"]), inputs["grp"]
        out = inputs["out"].detach().to("cpu", torch.float64, copy=True)
        if _layout(params) == "masked":
            for gi in range(a.shape[0]):
                n = int(grp[gi])
                out[gi, :n] = a[gi, :n] @ b[gi].T
            return out
        for gi in range(b.shape[0]):
            rows = (grp == gi).nonzero().flatten()
            if rows.numel():
                out[rows] = a[rows] @ b[gi].T
        return out

    reduction_keys = ("K",)

    def output_buffers(self, params):
        return {"out": 0}  # DeepGEMM's callers pass D; rows past masked_m and padding rows stay as passed

    def structure_inputs(self, params):
        return ("grp",)  # m_indices (contiguous) or masked_m (masked)

    def structure_cases(self, shapes, params, rng, timed=()):
        """Masked: ``masked_m`` per expert from 0 to full (shuffled); the second draw's counts are placed by
        the first draw's ranks reversed, so the emptiest expert of one draw is the fullest of the other (a
        kernel that reads another expert's count, max or min with its own, writes past or short of
        ``masked_m`` in one of the two, whichever expert it reads). Contiguous: ragged group sizes (0, below
        and above the 128-row alignment, and one that fills its 128-row blocks exactly, last in the second
        draw: the layout then ends on a block boundary with a valid last row). Two draws each, on the
        largest checked shape with at least 4 groups."""
        base = max(shapes, key=lambda s: s["groups"] * s["m"] * s["N"] * s["K"])
        shape = dict(base, groups=max(4, base["groups"]))
        G, m = shape["groups"], shape["m"]
        if _layout(params) == "masked":
            draws = reversed_rank_pair(rng, lambda: [0, m] + [rng.randint(1, max(1, m - 1)) for _ in range(G - 2)])
        else:
            draws = []
            for i in range(2):
                full = ALIGN_M * rng.randint(1, 2)
                sizes = [0, rng.randint(1, ALIGN_M - 1), ALIGN_M + rng.randint(1, ALIGN_M - 1), full]
                sizes += [rng.randint(0, 2 * max(m, ALIGN_M)) for _ in range(G - 4)]
                rng.shuffle(sizes)
                if i == 1:
                    sizes.remove(full)
                    sizes.append(full)
                draws.append(sizes)
        return [(f"structure_groups{i}", shape, {"group_sizes": sizes}) for i, sizes in enumerate(draws)]

    def flops(self, shape, params):
        return 2.0 * sum(group_sizes(shape, params)) * shape["N"] * shape["K"]

    def bytes_moved(self, shape, dtype_bytes, params):
        rows = sum(group_sizes(shape, params))
        G, N, K = shape["groups"], shape["N"], shape["K"]
        scales = 4 * (rows * K // SCALE_BLOCK + G * math.ceil(N / SCALE_BLOCK) * K // SCALE_BLOCK)
        return float(rows * K + G * N * K + scales + 2 * rows * N)

    def tolerance(self, shape, dtype, base_tol, params):
        return _tolerance(shape["K"], base_tol)

    def compile_units(self, config, dtype, params):
        return [_unit(config, LAYOUT_MASKED if _layout(params) == "masked" else LAYOUT_CONTIGUOUS)]

    @_model_doc("The tiled-GEMM estimate at the FP8 peak over the groups' padded rows (masked: every group's grid) "
                "(``_model_ms``, kernels/latency.py).")
    def model_latency_ms(self, shape, config, stats, hw, dtype_bytes, params):
        sizes = group_sizes(shape, params)
        if _layout(params) == "masked":  # every group's grid column runs; tiles past masked_m exit at once
            return _model_ms(max(max(sizes), 1), shape["N"], shape["K"], shape["groups"], config, stats, hw, params,
                             valid_rows=sum(sizes))
        total = sum(_aligned(s) for s in sizes)
        return _model_ms(max(total, 1), shape["N"], shape["K"], 1, config, stats, hw, params, valid_rows=sum(sizes))


import sys as _sys  # noqa: E402

FAMILY = register(
    GemmFp8Family(name="gemm_fp8", space=SPACE, shape_keys=("M", "N", "K"), headline_metric="tflops",
                  module=_sys.modules[__name__])
)
GROUPED_FAMILY = register(
    GroupedGemmFp8Family(name="grouped_gemm_fp8", space=GROUPED_SPACE, shape_keys=("groups", "m", "N", "K"),
                         headline_metric="tflops", module=_sys.modules[__name__])
)
