"""The GEMM latency model (kernels/latency.py through the families' model_latency_ms): pipelining depth and
L2 reuse from the program order change the estimate where they are real effects, and nothing else moves.
Plain arithmetic on real compile-fact shapes; no compile, no GPU."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from kernels.compile import occupancy
from kernels.latency import grouped_order, wave_traffic
from kregress.core.family import get_family
from kregress.core.records import CompileStats
from kregress.core.spec import HardwareLimits, load_spec

SPEC = load_spec(Path(__file__).resolve().parent.parent / "specs" / "gemm_h100_bf16.yaml")
GEMM = get_family("gemm")
LIM = SPEC.hardware.limits


def _stats(cfg: dict, regs: int = 128, spill: int = 0) -> CompileStats:
    """Compile facts as a compile reports them: shared memory is one (A + B) slab per stage."""
    smem = (cfg["BLOCK_M"] + cfg["BLOCK_N"]) * cfg["BLOCK_K"] * 2 * cfg["num_stages"]
    occ, blocks, limiter = occupancy(regs, smem, cfg["num_warps"], LIM)
    return CompileStats(arch="sm_90", regs_per_thread=regs, spill_bytes=spill, smem_bytes=smem, num_warps=cfg["num_warps"],
                        num_stages=cfg["num_stages"], occupancy=occ, blocks_per_sm=blocks, occupancy_limiter=limiter,
                        sass_instructions=0, sass_mix={}, compile_seconds=0.0)


def est(cfg: dict, shape: dict, **kw) -> float:
    return GEMM.model_latency_ms(shape, cfg, _stats(cfg, **kw), SPEC.hardware, 2, {})


def test_grouped_order_is_the_kernels():
    """Same arithmetic as kernels/tiles.grouped_pid: GROUP_M row tiles per column before moving on."""
    pid_m, pid_n = grouped_order(tiles_m=5, tiles_n=3, group_m=2)
    assert list(zip(pid_m[:6], pid_n[:6])) == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2)]
    assert list(zip(pid_m[12:], pid_n[12:])) == [(4, 0), (4, 1), (4, 2)]  # the short last band
    assert sorted(zip(pid_m, pid_n)) == [(m, n) for m in range(5) for n in range(3)]  # every tile once


def test_l2_reuse_follows_the_program_order():
    """One wave of 132 programs on a 32 x 112 tile grid: row-major order (GROUP_M 1) touches ~2 A bands and
    every B band; GROUP_M 8 touches 8 A bands and ~17 B bands, so HBM reads far less."""
    hbm_1, requested = wave_traffic(32, 112, 1, 132, 1.0, 1.0)
    hbm_8, requested_8 = wave_traffic(32, 112, 8, 132, 1.0, 1.0)
    assert requested == requested_8 == 2 * 32 * 112
    assert hbm_8 < 0.5 * hbm_1
    # wide N: a row-major wave streams all of B again; the estimate says so, and GROUP_M 8 is faster
    wide = {"M": 4096, "N": 14336, "K": 4096}
    base = dict(SPEC.baseline, num_stages=4)  # one block per SM
    assert est(dict(base, GROUP_M=1), wide) > 1.2 * est(dict(base, GROUP_M=8), wide)


def test_pipelining_depth_hides_latency_until_it_is_hidden():
    """A small tile does little MMA work per K slab: with two resident blocks, each extra stage keeps one
    more load in flight and the estimate falls; a tile with enough work and resident blocks has its
    latency hidden already, and more stages (same blocks) change nothing."""
    shape = {"M": 4096, "N": 4096, "K": 4096}
    small = {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8}
    s1, s2, s3, s4 = (est(dict(small, num_stages=s), shape, regs=128) for s in (1, 2, 3, 4))
    assert {_stats(dict(small, num_stages=s), regs=128).blocks_per_sm for s in (1, 2, 3, 4)} == {2}
    assert s1 > s2 > 1.5 * s3 and s3 > s4
    mid = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8, "num_warps": 4}
    hidden = [est(dict(mid, num_stages=s), shape, regs=96) for s in (2, 3, 4)]
    assert len({_stats(dict(mid, num_stages=s), regs=96).blocks_per_sm for s in (2, 3, 4)}) == 1
    assert hidden[0] == pytest.approx(hidden[1], rel=1e-9) == pytest.approx(hidden[2], rel=1e-9)


def test_stages_cost_blocks_when_they_take_shared_memory():
    """Deeper stages of a big tile take shared memory: fewer resident blocks, so the pipeline fill (once
    per batch of resident tiles) is hidden less: the estimate rises a little, it never falls."""
    shape = {"M": 4096, "N": 4096, "K": 4096}
    cfg = dict(SPEC.baseline)
    s3, s4 = est(dict(cfg, num_stages=3), shape), est(dict(cfg, num_stages=4), shape)
    assert _stats(dict(cfg, num_stages=3)).blocks_per_sm > _stats(dict(cfg, num_stages=4)).blocks_per_sm
    assert s4 >= s3


def test_estimates_are_plausible_and_monotone_in_work():
    shape = {"M": 4096, "N": 4096, "K": 4096}
    ms = est(SPEC.baseline, shape)
    tflops = 2 * 4096 ** 3 / (ms * 1e-3) / 1e12
    assert 300 < tflops < LIM.peak_tflops  # below the datasheet peak, in the range tuned GEMMs reach
    assert est(SPEC.baseline, {"M": 8192, "N": 8192, "K": 4096}) > 3.5 * ms  # 4x the work
    spilled = est(SPEC.baseline, shape, spill=512)
    assert spilled > 1.5 * ms


def test_model_docstrings_say_what_they_see_and_ignore():
    """The report quotes these: every built-in Triton family's model names what it leaves out."""
    import inspect

    for name in ("gemm", "gemm_fp8", "grouped_gemm_fp8", "attention", "mla_decode"):
        doc = inspect.getdoc(type(get_family(name)).model_latency_ms) or ""
        assert "Ignores:" in doc, name


def test_fp8_model_uses_the_pipeline_term():
    fp8 = get_family("gemm_fp8")
    cfg = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 128, "GROUP_M": 8, "num_warps": 8}
    shape = {"M": 64, "N": 7168, "K": 16384}  # a decode shape: few tiles, the pipeline decides
    hw = SPEC.hardware.model_copy(update={"limits": HardwareLimits()})

    def fp8_est(stages):
        c = dict(cfg, num_stages=stages)
        return fp8.model_latency_ms(shape, c, _stats(c), hw, 1, {})

    assert fp8_est(1) > fp8_est(3) > 0 and math.isfinite(fp8_est(3))
    assert np.isfinite([fp8_est(s) for s in (2, 4)]).all()
