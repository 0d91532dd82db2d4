"""``gemm_fp8_cuda``: a DeepGEMM-like FP8 block-scaled GEMM in plain CUDA C++ (``gemm_fp8_cuda.cu``).

- A [M, K] float8_e4m3fn with A scales [M, K / 128] fp32 (1x128 blocks), B [N, K] float8_e4m3fn with B
  scales [ceil(N / 128), K / 128] fp32 (128x128 blocks), C [M, N] bf16; K % 128 == 0. The inputs and the
  float64 reference are those of the Triton ``gemm_fp8`` family (DeepGEMM's test helpers).
- The kernel: a BLOCK_M x BLOCK_N tile per block, TM x TN per thread, K in 128-wide slabs staged in
  static shared memory by cp.async (STAGES deep), partial sums promoted with the scales per slab.
- Tunables: BLOCK_M, BLOCK_N, STAGES, TM, TN, all template arguments of ``fp8_gemm_kernel``.
- Facts that matter: ptxas refuses static shared memory over 48 KiB on sm_90 (``STAGES * ((BLOCK_M +
  BLOCK_N) * 144 + 4 * BLOCK_M)`` bytes), and big micro-tiles (2 * TM * TN fp32 accumulators a thread)
  spill. The family declares the shared-memory formula (``static_smem_bytes``), so a config over 48 KiB is
  refused before nvcc (the ``static_smem`` rule, with its figure); the space's own rule keeps threads per
  block well-formed; what spills, nvcc says.

The host wrapper launches the cubin nvcc built through the CUDA driver (``kernels.cuda.launch``): on a
GPU a variant is checked and timed like every family's; on a CPU host it has compile facts only.
"""

from __future__ import annotations

import math
import sys

import torch

from kernels.gemm_fp8 import SCALE_BLOCK, DenseFp8Problem
from kregress.core.family import CudaFamily, Rule, Space, register


def _threads(c: dict) -> int:
    return (c["BLOCK_M"] // c["TM"]) * (c["BLOCK_N"] // c["TN"])


ROW_PAD = 16  # KREGRESS_PAD in the .cu: a staged row is SCALE_BLOCK + 16 bytes (144 B stride)


def static_smem_bytes(c: dict) -> int:
    """What the kernel's __shared__ arrays take, in bytes, exactly as ptxas reports it (37,376 B for the
    spec's baseline 64x64, 2 stages): per stage, sA[BLOCK_M][144] and sB[BLOCK_N][144] e4m3 bytes and
    sSA[BLOCK_M] fp32 scales (``gemm_fp8_cuda.cu``; every array a multiple of 16 B, so no padding between)."""
    return c["STAGES"] * ((c["BLOCK_M"] + c["BLOCK_N"]) * (SCALE_BLOCK + ROW_PAD) + 4 * c["BLOCK_M"])


SPACE = Space(
    params={
        "BLOCK_M": (32, 64, 128),
        "BLOCK_N": (32, 64, 128, 256),
        "STAGES": (1, 2, 3, 4),
        "TM": (2, 4, 8),
        "TN": (2, 4, 8, 16),
    },
    rules=(
        Rule("threads", "(BLOCK_M / TM) * (BLOCK_N / TN) threads per block: a multiple of 32, from 64 to 1024",
             lambda c, p, lim: 64 <= _threads(c) <= 1024 and _threads(c) % 32 == 0),
    ),
)


def fp8_gemm_cuda(a: torch.Tensor, sa: torch.Tensor, b: torch.Tensor, sb: torch.Tensor, config: dict[str, int]) -> torch.Tensor:
    """C = (A * SA) @ (B * SB)^T in bf16, with the CUDA kernel of ``config`` (a GPU tensor path only)."""
    from kernels.cuda.launch import kernel_for

    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1]:
        raise ValueError(f"fp8_gemm_cuda: A [M, K] and B [N, K] with the same K, got {tuple(a.shape)} and {tuple(b.shape)}")
    if a.dtype != torch.float8_e4m3fn or b.dtype != torch.float8_e4m3fn:
        raise ValueError(f"fp8_gemm_cuda: A and B must be float8_e4m3fn, got {a.dtype} and {b.dtype}")
    M, K = a.shape
    N = b.shape[0]
    if K % SCALE_BLOCK:
        raise ValueError(f"fp8_gemm_cuda: K={K} must be a multiple of {SCALE_BLOCK}")
    ks = K // SCALE_BLOCK
    if tuple(sa.shape) != (M, ks) or tuple(sb.shape) != (math.ceil(N / SCALE_BLOCK), ks):
        raise ValueError(f"fp8_gemm_cuda: scales must be SA [{M}, {ks}] and SB [{math.ceil(N / SCALE_BLOCK)}, {ks}], "
                         f"got {tuple(sa.shape)} and {tuple(sb.shape)}")
    if not a.is_cuda:
        raise ValueError("fp8_gemm_cuda: a CUDA kernel: the tensors must be on a CUDA device")
    a, b = a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)
    sa, sb = sa.contiguous().float(), sb.contiguous().float()
    c = torch.empty((M, N), device=a.device, dtype=torch.bfloat16)
    (unit,) = FAMILY.cuda_units(config, "fp8_e4m3", {})
    grid = (math.ceil(N / config["BLOCK_N"]), math.ceil(M / config["BLOCK_M"]), 1)
    kernel_for(FAMILY, unit).launch(grid, [a, b, sa, sb, c, M, N, K])
    return c


class GemmFp8CudaFamily(DenseFp8Problem, CudaFamily):
    """The CUDA C++ kernel of the dense FP8 GEMM; the problem (inputs, reference, checks, FLOPs, bytes,
    tolerance) is the Triton family's (``kernels.gemm_fp8.DenseFp8Problem``)."""

    cuda_sources = ("gemm_fp8_cuda.cu",)
    kernel_functions = ("fp8_gemm_kernel", "e4m3_to_float")
    template_params = ("BLOCK_M", "BLOCK_N", "STAGES", "TM", "TN")

    def cuda_units(self, config, dtype, params):
        return [self.unit("fp8_gemm_kernel", config, threads=_threads(config))]

    def static_smem_bytes(self, config):
        return static_smem_bytes(config)

    def run(self, inputs, config, params):
        return fp8_gemm_cuda(inputs["a"], inputs["sa"], inputs["b"], inputs["sb"], config)


FAMILY = register(GemmFp8CudaFamily(name="gemm_fp8_cuda", space=SPACE, shape_keys=("M", "N", "K"),
                                    headline_metric="tflops", module=sys.modules[__name__]))
