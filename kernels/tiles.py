"""Tile-order helpers shared by the GEMM kernels (``gemm``, ``gemm_fp8``, ``grouped_gemm_fp8``).

Grouped ("swizzled") program order: GROUP_M consecutive row-tiles are visited for each column tile
before moving on, so a band of A stays in L2 while B tiles stream past it. With GROUP_M=1 the order
is plain row-major. Triton inlines this jit function into each kernel that calls it, so the compiled
code is the same as writing it out in the kernel.

A family whose kernel calls a helper here lists this file in its ``helper_files`` (``TILES_FILE``), so
an edit to the helper changes the family's source hash and invalidates its compile cache.
"""

from __future__ import annotations

from pathlib import Path

import triton
import triton.language as tl

TILES_FILE = Path(__file__).resolve()


@triton.jit
def grouped_pid(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """(pid_m, pid_n) of program ``pid`` in grouped order over a cdiv(M, BLOCK_M) x cdiv(N, BLOCK_N) grid."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    # Grouped order: tiles are numbered column-major inside a band of GROUP_M row-tiles.
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)  # the last band may be short
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m
    return pid_m, pid_n
