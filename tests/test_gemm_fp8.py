"""FP8 block-scaled GEMMs (DeepGEMM-like): the real kernels in the Triton interpreter (which executes
tl.dot on float8e4nv operands on CPU: the e4m3 tensors go into the kernel as they are, nothing is
dequantized first) against the float64 dequantizing reference; grouped contiguous and masked layouts
with empty and one-row groups; the scaling granularity refused with the rule's text; real sm_90
compiles (FP8 WGMMA, more stages -> more shared memory); the specs sweep end to end."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

from kernels.compile import compile_units
from kernels.gemm_fp8 import K_RULE, dequantize_a, dequantize_b, fp8_gemm_nt, group_sizes, per_block_cast_to_fp8, per_token_cast_to_fp8
from kernels.measure import compare
from kregress.core.bind import bind
from kregress.core.family import families, get_family
from kregress.core.spec import HardwareLimits, SpecError, load_spec, parse_spec

REPO = Path(__file__).resolve().parent.parent
DENSE = get_family("gemm_fp8")
GROUPED = get_family("grouped_gemm_fp8")
SMALL = dict(BLOCK_M=64, BLOCK_N=32, BLOCK_K=128, GROUP_M=1, num_stages=2, num_warps=4)
WIDE = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=128, GROUP_M=8, num_stages=3, num_warps=8)  # the specs' dense baseline tile


def _ok(res: dict) -> dict:
    assert "correctness" in res, res
    c = res["correctness"]
    assert c["ok"] and not c["nan_inf"] and c["mismatches"] == 0, c["mismatch_sample"]
    return c


@pytest.mark.parametrize("config", [SMALL, WIDE], ids=["64x32", "128x128"])
def test_dense_matches_dequantized_float64_reference(interpreter, config):
    shapes = [{"M": 70, "N": 150, "K": 256}, {"M": 1, "N": 300, "K": 384}]
    c = _ok(interpreter.correctness("gemm_fp8", config, shapes, dtype="fp8_e4m3"))
    assert c["shapes_checked"] == ["70x150x256", "1x300x384"] and c["max_abs_err"] > 0  # bf16 out is not exact


@pytest.mark.parametrize("layout,sizes,m", [("contiguous", [0, 1, 70, 129], 64), ("masked", [0, 1, 9, 40], 40)])
def test_grouped_layouts_with_empty_and_one_row_groups(interpreter, layout, sizes, m):
    shape = {"groups": 4, "m": m, "N": 96, "K": 256}
    params = {"layout": layout, "group_sizes": sizes}
    _ok(interpreter.correctness("grouped_gemm_fp8", SMALL, [shape], dtype="fp8_e4m3", params=params))


def test_masked_rows_past_the_count_are_never_written_and_wrong_scales_fail():
    shape = {"groups": 3, "m": 8, "N": 40, "K": 128}
    params = {"layout": "masked", "group_sizes": [0, 1, 8]}
    inp = GROUPED.make_inputs(shape, torch.float8_e4m3fn, "cpu", 0, params)
    assert inp["a"].dtype == torch.float8_e4m3fn and inp["a"].shape == (3, 8, 128) and inp["sa"].shape == (3, 8, 1)
    assert inp["b"].shape == (3, 40, 128) and inp["sb"].shape == (3, 1, 1) and inp["grp"].tolist() == [0, 1, 8]
    ref = GROUPED.reference(inp, params)
    assert (ref[0] == 0).all() and (ref[1, 1:] == 0).all() and (ref[1, 0] != 0).any() and (ref[2] != 0).all()
    # a kernel that forgot the B scales: caught with readable text
    no_b_scale = dequantize_a(inp["a"][2], inp["sa"][2]) @ inp["b"][2].double().T
    res = compare(no_b_scale, ref[2], *GROUPED.tolerance(shape, "fp8_e4m3", 1e-2, params))
    assert not res["ok"] and "elements outside atol=" in res["sample"]


def test_contiguous_inputs_pad_groups_to_128_rows():
    shape = {"groups": 3, "m": 10, "N": 40, "K": 128}
    params = {"group_sizes": [0, 1, 130]}
    inp = GROUPED.make_inputs(shape, torch.float8_e4m3fn, "cpu", 0, params)
    idx = inp["grp"].tolist()
    assert len(idx) == 128 + 256 and idx[0] == 1 and idx[1:128] == [-1] * 127
    assert idx[128:258] == [2] * 130 and idx[258:] == [-1] * 126 and inp["out"].shape == (384, 40)
    ref = GROUPED.reference(inp, params)
    assert (ref[1:128] == 0).all() and (ref[258:] == 0).all() and (ref[0] != 0).any()


def test_reference_is_the_per_k_block_sum_the_kernel_computes():
    g = torch.Generator().manual_seed(1)
    a, sa = per_token_cast_to_fp8(torch.randn(5, 256, generator=g) * 3)
    b, sb = per_block_cast_to_fp8(torch.randn(130, 256, generator=g))
    assert sa.shape == (5, 2) and sb.shape == (2, 2) and a.dtype == b.dtype == torch.float8_e4m3fn
    ref = DENSE.reference({"a": a, "sa": sa, "b": b, "sb": sb}, {})
    blocks = torch.zeros(5, 130, dtype=torch.float64)
    for kb in range(2):
        ks = slice(128 * kb, 128 * kb + 128)
        part = a[:, ks].double() @ b[:, ks].double().T
        blocks += part * sa[:, kb, None].double() * sb[torch.arange(130) // 128, kb][None, :].double()
    assert torch.allclose(ref, blocks, rtol=1e-12, atol=1e-12)


def test_quantization_helpers_round_trip_within_e4m3_precision():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(7, 384, generator=g) * torch.logspace(-2, 2, 7)[:, None]
    q, s = per_token_cast_to_fp8(x)
    err = (dequantize_a(q, s) - x.double()).abs()
    # e4m3 keeps 3 mantissa bits: relative error <= 2^-4 of the value, and the block's amax maps to 448
    assert (err <= x.double().abs() * 2 ** -4 + s.double().repeat_interleave(128, 1) * 2 ** -9).all()
    assert torch.allclose(s.double() * 448, x.view(7, 3, 128).abs().amax(-1).double(), rtol=1e-6)
    w = torch.randn(200, 256, generator=g)
    qw, sw = per_block_cast_to_fp8(w)
    assert qw.shape == (200, 256) and sw.shape == (2, 2)
    assert ((dequantize_b(qw, sw) - w.double()).abs() <= w.double().abs() * 2 ** -4 + 1e-3).all()


def bind_dict(data: dict):
    return bind(parse_spec(data, "x.yaml"))


def test_k_not_a_multiple_of_128_is_refused_with_the_rules_text():
    assert "K % 128 == 0" in K_RULE and "scaling granularity" in K_RULE
    assert DENSE.check_shape({"M": 64, "N": 128, "K": 200}) == f"K=200 violates {K_RULE}"
    assert GROUPED.check_shape({"groups": 2, "m": 8, "N": 128, "K": 96}) == f"K=96 violates {K_RULE}"
    assert DENSE.check_shape({"M": 64, "N": 128, "K": 256}) is None
    raw = yaml.safe_load((REPO / "specs" / "gemm_fp8_h100.yaml").read_text())
    raw["correctness_shapes"] = [{"M": 64, "N": 64, "K": 130}]
    with pytest.raises(SpecError, match=r"field 'correctness_shapes.0'.*K=130 violates K % 128 == 0"):
        bind(parse_spec(raw, "gemm_fp8_h100.yaml"))
    with pytest.raises(ValueError, match="per_token_cast_to_fp8: x must be"):
        per_token_cast_to_fp8(torch.zeros(4, 100))


def test_scale_tensor_shapes_are_validated():
    a, sa = per_token_cast_to_fp8(torch.randn(4, 256))
    b, sb = per_block_cast_to_fp8(torch.randn(64, 256))
    with pytest.raises(ValueError, match=r"A scales must be \[4, 2\] \(1x128 blocks\), got \[4, 1\]"):
        fp8_gemm_nt(a, sa[:, :1].contiguous(), b, sb, SMALL)
    with pytest.raises(ValueError, match=r"B scales must be \[1, 2\] \(128x128 blocks\), got \[64, 2\]"):
        fp8_gemm_nt(a, sa, b, torch.ones(64, 2), SMALL)
    with pytest.raises(ValueError, match="must be float8_e4m3fn"):
        fp8_gemm_nt(a.float(), sa, b, sb, SMALL)
    with pytest.raises(ValueError, match=r"K=200 violates K % 128 == 0"):
        fp8_gemm_nt(a[:, :200], sa, b[:, :200], sb, SMALL)


def test_space_rules_use_granularity_layout_and_the_specs_limits():
    base = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=128, GROUP_M=8, num_stages=4, num_warps=8)
    assert DENSE.space.check(base) is None
    assert "BLOCK_K=64 is not allowed; allowed: 128" in DENSE.space.check(dict(base, BLOCK_K=64))
    assert "acc_in_registers" in DENSE.space.check(dict(base, BLOCK_M=256))  # measured: 255 regs, 432 B spill
    assert "acc_in_registers" in DENSE.space.check(dict(base, num_warps=4))
    assert DENSE.space.check(dict(base, BLOCK_M=256, BLOCK_N=64)) is None
    assert "smem_ring" in DENSE.space.check(dict(base, BLOCK_M=256, BLOCK_N=64, num_stages=6))  # 320 * 128 * 6 > 227 KiB
    small_gpu = HardwareLimits(max_shared_memory_per_block=101376, shared_memory_per_sm=102400)  # an sm_86
    assert "smem_ring" in DENSE.space.check(base, {}, small_gpu) and DENSE.space.check(base, {}) is None
    assert "BLOCK_N=256 is not allowed" in DENSE.space.check(dict(base, BLOCK_N=256))
    wide_m = dict(base, BLOCK_M=256, BLOCK_N=64)
    assert "tile_in_one_group" in GROUPED.space.check(wide_m, {"layout": "contiguous"})
    assert GROUPED.space.check(wide_m, {"layout": "masked"}) is None
    assert len(list(DENSE.space.enumerate())) > 40


def test_params_flops_and_fp8_peak():
    assert DENSE.dtypes == ("fp8_e4m3",) and families()["gemm_fp8"] is DENSE and families()["grouped_gemm_fp8"] is GROUPED
    assert DENSE.flops({"M": 64, "N": 2112, "K": 7168}, {}) == 2.0 * 64 * 2112 * 7168
    shape = {"groups": 4, "m": 100, "N": 4096, "K": 7168}
    assert group_sizes(shape, {"group_sizes": [0, 1]}) == [0, 1, 0, 1]
    assert GROUPED.flops(shape, {"group_sizes": [0, 1]}) == 2.0 * 2 * 4096 * 7168
    spread = group_sizes(shape, {"group_sizes": "spread"})
    assert abs(sum(spread) - 400) <= 4 and len(set(spread)) == 4
    assert max(group_sizes(shape, {"layout": "masked", "group_sizes": "spread"})) <= 100
    assert "layout='paged' is not allowed" in GROUPED.check_params({"layout": "paged"})
    assert "unknown param(s) window" in DENSE.check_params({"window": 1})
    with pytest.raises(ValueError, match="family gemm_fp8 takes fp8_e4m3"):
        bind_dict({"task_id": "x", "kernel_family": "gemm_fp8", "dtype": "bf16", "shape_matrix": [{"M": 1, "N": 1, "K": 128}],
                    "correctness_shapes": [{"M": 1, "N": 1, "K": 128}],
                   "baseline": dict(SMALL)})
    spec = load_spec(REPO / "specs" / "gemm_fp8_h100.yaml")
    assert len(spec.shape_matrix) == 18 and {s["M"] for s in spec.shape_matrix} == {64, 128, 4096}

    # the compute roof is the FP8 peak (2x the bf16 one unless the spec's params say otherwise)
    assert DENSE.peak_tflops(spec.hardware, {}) == 2 * spec.hardware.limits.peak_tflops
    assert DENSE.peak(spec.hardware, {"fp8_peak_tflops": 989.0}) == pytest.approx(989.0)
    shape = spec.shape_matrix[-1]
    sol = DENSE.speed_of_light_ms(shape, 1, spec.hardware, {})
    assert sol == pytest.approx(max(DENSE.flops(shape, {}) / (2 * spec.hardware.limits.peak_tflops * 1e12),
                                    DENSE.bytes_moved(shape, 1, {}) / (spec.hardware.limits.hbm_gbps * 1e9)) * 1e3)


def test_sm90_fp8_tile_compiles_with_wgmma_and_stages_cost_shared_memory():
    lim = HardwareLimits()
    cfg = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=128, GROUP_M=8, num_stages=2, num_warps=8)
    two = compile_units(DENSE.compile_units(cfg, "fp8_e4m3", {}), "sm_90", lim)
    four = compile_units(DENSE.compile_units(dict(cfg, num_stages=4), "fp8_e4m3", {}), "sm_90", lim)
    assert two.sass_mix.get("tensor_wgmma", 0) > 0  # QGMMA...E4M3.E4M3: the FP8 warpgroup MMA
    assert four.smem_bytes > two.smem_bytes > 0
    # each extra stage holds one (128 + 128) x 128 fp8 slab of A and B
    assert four.smem_bytes - two.smem_bytes == 2 * (128 + 128) * 128
    assert two.spill_bytes == 0 and two.regs_per_thread <= 255


def test_sm90_grouped_masked_compiles():
    cfg = dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=128, GROUP_M=8, num_stages=3, num_warps=4)
    units = GROUPED.compile_units(cfg, "fp8_e4m3", {"layout": "masked"})
    assert units[0].constexprs["LAYOUT"] == 2
    stats = compile_units(units, "sm_90", HardwareLimits())
    assert stats.sass_mix.get("tensor_wgmma", 0) > 0 and stats.smem_bytes > 0


def _small_sweep(spec_path: Path, tmp_path: Path) -> Path:
    """The spec as shipped, searched for one round of two variants (the interpreter is slow on CPU)."""
    raw = yaml.safe_load(spec_path.read_text())
    raw["search"] = {"strategy": "local", "variants_per_round": 2, "max_rounds": 1, "no_improve_rounds": 1, "seed": 0}
    out = tmp_path / spec_path.name
    out.write_text(yaml.safe_dump(raw))
    return out


@pytest.mark.parametrize("name", ["gemm_fp8_h100", "grouped_gemm_fp8_h100", "grouped_gemm_fp8_masked_h100"])
def test_spec_sweeps_end_to_end_on_the_embedded_default(dagster_home, tmp_path, name):
    from kernel_assets.cli import main

    path = _small_sweep(REPO / "specs" / f"{name}.yaml", tmp_path)
    assert main(["sweep", str(path), "--backend", "interpreter"]) == 0
    out = dagster_home / "reports" / name
    variants = pd.read_parquet(out / "variants.parquet")
    base = variants.iloc[0]
    assert base["error"] is None or (isinstance(base["error"], float) and math.isnan(base["error"])), base.to_dict()
    assert base["evidence"] == "model" and base["latency_p50_ms"] > 0 and base["max_abs_err"] > 0
    assert len(variants) >= 2
    v = pd.read_parquet(out / "verdicts.parquet")
    assert len(v) >= 1 and set(v["evidence"].dropna()) <= {"model"}


def test_shipped_fp8_baselines_compile_without_spills_on_sm90():
    """The specs' constraints say max_spill_bytes 0: their baselines must meet it (measured, sm_90)."""
    for name in ("grouped_gemm_fp8_h100", "grouped_gemm_fp8_masked_h100"):
        spec = load_spec(REPO / "specs" / f"{name}.yaml")
        fam = get_family(spec.kernel_family)
        stats = compile_units(fam.compile_units(spec.baseline, spec.dtype, spec.params), spec.hardware.arch,
                              spec.hardware.limits)
        assert stats.spill_bytes <= spec.constraints.max_spill_bytes, (name, stats.spill_bytes)
        assert stats.smem_bytes <= spec.constraints.max_shared_memory_bytes
