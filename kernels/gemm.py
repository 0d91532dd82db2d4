"""DeepGEMM-like dense GEMM: C[M, N] = A[M, K] @ B[K, N], fp16/bf16 in, fp32 accumulate.

Math and why:
- Each program computes one BLOCK_M x BLOCK_N tile of C, walking K in BLOCK_K steps and keeping the
  partial sums in fp32 registers (``acc``); inputs stay fp16/bf16 so tensor cores (HGMMA on sm_90)
  do the multiply.
- Program order is grouped ("swizzled"): GROUP_M consecutive row-tiles are visited for each column
  tile before moving on, so a band of A stays in L2 while B tiles stream past it. With GROUP_M=1 the
  order is plain row-major, which re-reads B from HBM far more often on large N.
- Ragged edges (M, N, K not multiples of the block) are masked: loads outside the matrix read 0,
  which adds nothing to the dot product, and stores outside C are dropped.
- num_stages is the software-pipelining depth: each stage holds one (BLOCK_M + BLOCK_N) x BLOCK_K
  slab of A and B in shared memory, so shared memory grows linearly with it.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import triton
import triton.language as tl

from kregress.core.family import CompileUnit, Rule, Space, TritonFamily, register
from kernels.dtypes import TRITON_PTR
from kernels.tiles import TILES_FILE, grouped_pid


@triton.jit
def gemm_kernel(
    a_ptr, b_ptr, c_ptr,
    M, N, K,
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    pid_m, pid_n = grouped_pid(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    mask_m = offs_m[:, None] < M
    mask_n = offs_n[None, :] < N

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=mask_m & (offs_k[None, :] < k_left), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < k_left) & mask_n, other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    c = acc.to(c_ptr.dtype.element_ty)
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, c, mask=mask_m & mask_n)




def _smem_fits(cfg: dict[str, int], _params: dict[str, Any], lim: Any) -> bool:
    # Coarse pre-compile bound (2-byte inputs): the multi-stage A+B ring must not exceed twice the per-block limit.
    # The real number comes from the compile; this only spares ptxas obviously hopeless configs.
    return (cfg["BLOCK_M"] + cfg["BLOCK_N"]) * cfg["BLOCK_K"] * 2 * cfg["num_stages"] <= 2 * lim.max_shared_memory_per_block


def _warps_fit_tile(cfg: dict[str, int], _params: dict[str, Any], _lim: Any) -> bool:
    # A warp group's MMA needs at least 16 rows per warp along M (or N): more warps than that idle.
    return cfg["num_warps"] * 16 <= max(cfg["BLOCK_M"], cfg["BLOCK_N"]) * 4


SPACE = Space(
    params={
        "BLOCK_M": (16, 32, 64, 128, 256),
        "BLOCK_N": (16, 32, 64, 128, 256),
        "BLOCK_K": (16, 32, 64, 128),
        "GROUP_M": (1, 4, 8, 16),
        "num_stages": (1, 2, 3, 4, 5),
        "num_warps": (2, 4, 8),
    },
    rules=(
        Rule("tile_not_huge", "BLOCK_M * BLOCK_N <= 256 * 128 (accumulator must fit in registers)",
             lambda c, p, lim: c["BLOCK_M"] * c["BLOCK_N"] <= 256 * 128),
        Rule("smem_ring", "(BLOCK_M + BLOCK_N) * BLOCK_K * 2 bytes * num_stages <= 2 x hardware.limits.max_shared_memory_per_block", _smem_fits),
        Rule("warps_fit_tile", "num_warps * 16 <= 4 * max(BLOCK_M, BLOCK_N)", _warps_fit_tile),
    ),
)


class GemmFamily(TritonFamily):
    helper_files = (TILES_FILE,)  # gemm_kernel calls tiles.grouped_pid
    launch_wrappers = ("matmul",)  # the entry point run() calls
    interpreter_ignores = ("num_warps", "num_stages")  # passed to the launch only
    reduction_keys = ("K",)  # the gate's least-work shape keeps the timed K

    def make_inputs(self, shape, dtype, device, seed, params):
        g = torch.Generator(device="cpu").manual_seed(seed)
        a = torch.randn(shape["M"], shape["K"], generator=g).to(dtype).to(device)
        b = torch.randn(shape["K"], shape["N"], generator=g).to(dtype).to(device)
        return {"a": a, "b": b}

    def run(self, inputs, config, params):
        return matmul(inputs["a"], inputs["b"], config)

    def reference(self, inputs, params):
        return inputs["a"].double() @ inputs["b"].double()

    def flops(self, shape, params):
        return 2.0 * shape["M"] * shape["N"] * shape["K"]

    def bytes_moved(self, shape, dtype_bytes, params):
        # Compulsory traffic: read A and B once, write C once.
        return float(dtype_bytes * (shape["M"] * shape["K"] + shape["K"] * shape["N"] + shape["M"] * shape["N"]))

    def tolerance(self, shape, dtype, base_tol, params):
        # fp32 accumulation of K products: error grows ~sqrt(K); rounding C to bf16 adds ~2^-8 relative.
        scale = math.sqrt(max(shape["K"], 1) / 128.0)
        rtol = base_tol * (2.0 if dtype == "bf16" else 1.0)
        return base_tol * max(1.0, scale), rtol

    def compile_units(self, config, dtype, params):
        sig = {
            "a_ptr": TRITON_PTR[dtype], "b_ptr": TRITON_PTR[dtype], "c_ptr": TRITON_PTR[dtype],
            "M": "i32", "N": "i32", "K": "i32",
            "stride_am": "i32", "stride_ak": "constexpr", "stride_bk": "i32", "stride_bn": "constexpr",
            "stride_cm": "i32", "stride_cn": "constexpr",
            "BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr", "GROUP_M": "constexpr",
        }
        constexprs = {"stride_ak": 1, "stride_bn": 1, "stride_cn": 1}
        constexprs.update({k: config[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M")})
        divisible = ("a_ptr", "b_ptr", "c_ptr", "M", "N", "K", "stride_am", "stride_bk", "stride_cm")
        return [CompileUnit(gemm_kernel, sig, constexprs, config["num_warps"], config["num_stages"], divisible)]

    def model_latency_ms(self, shape, config, stats, hw, dtype_bytes, params):
        """A roofline over the padded tile grid with software pipelining and L2 reuse (kernels/latency.py).

        Sees: the tile grid spread over the SMs (BLOCK_M, BLOCK_N, wave quantization); the tensor-core
        efficiency of the tile shape (BLOCK_M x BLOCK_N, BLOCK_K); pipelining depth: num_stages - 1
        K-slabs in flight per resident block hide the load latency, and the compile's shared memory per
        stage and registers decide how many blocks are resident; L2 reuse from the program order: the
        programs of one wave in GROUP_M order read each A and B band once from HBM, the rest hits L2
        (lower latency to hide, less HBM traffic); spills; a 4 us launch.

        Ignores: num_warps except through the resident blocks (warp scheduling, how the MMA is issued);
        L2 reuse between waves; L2 and shared-memory bandwidth; bank conflicts and the epilogue's store
        pattern; clocks and power limits. Once the pipeline hides the latency, more stages or another
        GROUP_M change nothing here, though they may on the GPU.
        """
        from kernels.latency import tile_gemm_ms  # here, not at the top: the import block is patch context

        bm, bn, bk = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"]
        mma_eff = min(1.0, (bm * bn) / (128 * 128)) ** 0.35 * min(1.0, bk / 64) ** 0.25
        return tile_gemm_ms(shape["M"], shape["N"], shape["K"], bm, bn, bk, config["GROUP_M"], config["num_stages"],
                            stats, hw.limits, dtype_bytes, dtype_bytes, hw.limits.peak_tflops, mma_eff)


def matmul(a: torch.Tensor, b: torch.Tensor, config: dict[str, int]) -> torch.Tensor:
    """C = A @ B with the given tile config. (1) check shapes, (2) allocate, (3) launch.

    Under TRITON_INTERPRET=1 (set before import, see kernels/worker.py) the same call runs on CPU tensors.
    """
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"matmul: incompatible shapes A{tuple(a.shape)} @ B{tuple(b.shape)}")
    if a.dtype != b.dtype or a.dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"matmul: A and B must both be fp16 or bf16, got {a.dtype} and {b.dtype}")
    a = a.contiguous()
    b = b.contiguous()
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), device=a.device, dtype=a.dtype)
    grid = lambda META: (triton.cdiv(M, META["BLOCK_M"]) * triton.cdiv(N, META["BLOCK_N"]),)  # noqa: E731
    gemm_kernel[grid](
        a, b, c, M, N, K,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
        BLOCK_M=config["BLOCK_M"], BLOCK_N=config["BLOCK_N"], BLOCK_K=config["BLOCK_K"], GROUP_M=config["GROUP_M"],
        num_warps=config["num_warps"], num_stages=config["num_stages"],
    )
    return c


import sys as _sys  # noqa: E402

FAMILY = register(
    GemmFamily(name="gemm", space=SPACE, shape_keys=("M", "N", "K"), headline_metric="tflops", module=_sys.modules[__name__])
)
