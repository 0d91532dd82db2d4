"""Analytic latency of a tiled GEMM: the ``model`` evidence of the GEMM families (no Triton, no torch).

A tile program computes BLOCK_M x BLOCK_N of the output, walking K in BLOCK_K slabs. The estimate is a
roofline with two effects the plain roofline cannot see, both read off real facts:

- Software pipelining. A block keeps ``num_stages - 1`` K-slabs in flight while it multiplies the
  current one; with ``blocks_per_sm`` resident blocks (the compile's registers and shared memory decide
  it) an SM has ``blocks_per_sm * (num_stages - 1)`` loads in flight, so by Little's law it completes at
  most that many slabs per load latency. A slab costs ``max(MMA time, latency / loads in flight)``:
  deeper pipelines help until the latency is hidden, and then only cost shared memory (fewer blocks).
- L2 reuse from the program order. The programs that run at once (one wave: ``sm_count * blocks_per_sm``
  consecutive program ids in the kernel's grouped order) read each A row-band and B column-band they
  share from HBM once; every other read of a band in the wave hits L2. The hit fraction sets the load
  latency the pipeline has to hide (L2 hits are faster than HBM) and the HBM traffic. GROUP_M shapes a
  wave: one band of GROUP_M row tiles sweeping the columns.

The tensor peak is derated to what a tuned GEMM sustains (``SUSTAINED``). The latencies are loaded-system figures for an H100-class GPU (an L2 hit about 0.35 us and an HBM read
about 1 us under a saturating GEMM, roughly twice the idle pointer-chase figures); they set where
pipelining stops mattering, not the compute time.
"""

from __future__ import annotations

import math

import numpy as np

L2_HIT_US = 0.35
HBM_US = 1.0
LAUNCH_US = 4.0
# The share of the datasheet tensor peak a well-tuned GEMM sustains (cuBLAS reaches about 700-750 of an
# H100 SXM's 989 dense bf16 TFLOPs): clocks drop under a full tensor load.
SUSTAINED = 0.75


def grouped_order(tiles_m: int, tiles_n: int, group_m: int) -> tuple[np.ndarray, np.ndarray]:
    """(pid_m, pid_n) of every program in launch order; the same arithmetic as ``kernels.tiles.grouped_pid``."""
    pid = np.arange(tiles_m * tiles_n, dtype=np.int64)
    in_group = group_m * tiles_n
    first_m = (pid // in_group) * group_m
    size_m = np.minimum(tiles_m - first_m, group_m)
    pid_m = first_m + (pid % in_group) % size_m
    pid_n = (pid % in_group) // size_m
    return pid_m, pid_n


def wave_traffic(tiles_m: int, tiles_n: int, group_m: int, wave: int, band_a: float, band_b: float,
                 groups: int = 1) -> tuple[float, float]:
    """(bytes read from HBM, bytes requested) for A and B over the whole grid.

    ``band_a`` / ``band_b`` are the bytes of one A row-band (BLOCK_M x K) and one B column-band
    (K x BLOCK_N). A wave reads each distinct band once from HBM; ``groups`` independent problems
    (grouped GEMM) repeat the grid."""
    pid_m, pid_n = grouped_order(tiles_m, tiles_n, max(1, min(group_m, tiles_m)))
    tiles = pid_m.size
    wave_id = np.arange(tiles, dtype=np.int64) // max(1, wave)
    rows_read = np.unique(wave_id * tiles_m + pid_m).size  # distinct (wave, row-band) pairs
    cols_read = np.unique(wave_id * tiles_n + pid_n).size
    hbm = rows_read * band_a + cols_read * band_b
    requested = tiles * (band_a + band_b)
    return groups * hbm, groups * requested


def tile_gemm_ms(M: int, N: int, K: int, bm: int, bn: int, bk: int, group_m: int, num_stages: int, stats, limits,
                 in_bytes: float, out_bytes: float, peak_tflops: float, mma_eff: float, groups: int = 1,
                 valid_rows: int | None = None) -> float:
    """Estimated ms of a tiled GEMM (see the module docstring). ``stats`` are the variant's compile facts
    (blocks_per_sm, occupancy, spill_bytes); ``mma_eff`` the family's tensor-core efficiency of the tile
    shape; ``valid_rows`` the rows that are really read and written (grouped layouts pad M)."""
    tiles_m, tiles_n = math.ceil(M / bm), math.ceil(N / bn)
    tiles = groups * tiles_m * tiles_n
    k_steps = math.ceil(K / bk)
    blocks = max(1, int(getattr(stats, "blocks_per_sm", 1) or 1))
    sms = limits.sm_count
    per_sm_peak = SUSTAINED * peak_tflops * 1e12 / sms
    t_mma = 2.0 * bm * bn * bk / (per_sm_peak * mma_eff)  # one slab of one tile, the SM's tensor cores to itself

    rows = valid_rows if valid_rows is not None else M * groups
    row_share = rows / max(1, M * groups)  # grouped layouts: padded rows are masked, not read
    hbm_ab, requested = wave_traffic(tiles_m, tiles_n, group_m, sms * blocks, bm * K * in_bytes * row_share,
                                     K * bn * in_bytes, groups)
    hit = 1.0 - hbm_ab / requested if requested else 0.0
    latency = (hit * L2_HIT_US + (1.0 - hit) * HBM_US) * 1e-6
    in_flight = blocks * (num_stages - 1)
    if in_flight >= 1:
        t_slab = max(t_mma, latency / in_flight)
    else:  # num_stages 1: a block waits for each slab, other resident blocks overlap it
        t_slab = max(t_mma, (latency + t_mma) / blocks)
    tiles_per_sm = math.ceil(tiles / sms)
    # each batch of resident tiles first waits for its first slab: the pipeline fill is never hidden
    t_compute = tiles_per_sm * k_steps * t_slab + math.ceil(tiles_per_sm / blocks) * latency
    t_memory = (hbm_ab + rows * N * out_bytes) / (limits.hbm_gbps * 1e9)
    spill_penalty = 1.0 + min(1.0, getattr(stats, "spill_bytes", 0) / 256.0)
    return (max(t_compute, t_memory) * spill_penalty + LAUNCH_US * 1e-6) * 1e3
