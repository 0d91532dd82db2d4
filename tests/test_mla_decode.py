"""MLA decode family: interpreter correctness on the edge cases, zero-length policy, split-K combine,
real sm_90 compile stats, formulas, and the family running through the benchmark resource."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernels.compile import compile_units
from kernels.measure import compare
from kregress.core.bind import bind
from kregress.core.family import families, get_family
from kregress.core.records import Suggestion
from kregress.core.spec import HardwareLimits, load_spec, parse_spec
from resources.gpu import InterpreterBackend

REPO = Path(__file__).resolve().parent.parent
MLA = get_family("mla_decode")
BASE = dict(BLOCK_H=32, BLOCK_N=32, num_splits=2, num_stages=2, num_warps=8)
EDGE = {"seqlens": [1, 63, 64, 65, 0, 130]}  # around one page, two pages, empty; lse is checked by default


def _ok(res: dict) -> dict:
    assert "correctness" in res, res
    c = res["correctness"]
    assert c["ok"] and not c["nan_inf"] and c["mismatches"] == 0, c["mismatch_sample"]
    return c


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("config", [
    dict(BLOCK_H=16, BLOCK_N=16, num_splits=1, num_stages=2, num_warps=4),   # no combine launch
    dict(BLOCK_H=32, BLOCK_N=64, num_splits=3, num_stages=1, num_warps=8),   # splits that do not divide the blocks
], ids=["sp1", "sp3"])
def test_edge_lengths_match_reference(interpreter, config, dtype):
    """Lengths 1, 63, 64, 65, 0, 130 on shuffled pages whose tails are NaN; out and lse both checked."""
    shape = {"batch": 6, "s_q": 1, "h_q": 16, "seqlen_k": 130}
    c = _ok(interpreter.correctness("mla_decode", config, [shape], dtype=dtype, params=EDGE))
    assert c["shapes_checked"] == ["6x1x16x130"]


def test_causal_two_queries_and_more_splits_than_blocks(interpreter):
    """s_q = 2, causal: query 0 sees seqlen - 1 keys (none for seqlen 1); 32 splits over at most 3 blocks."""
    cfg = dict(BLOCK_H=16, BLOCK_N=64, num_splits=32, num_stages=1, num_warps=4)
    shape = {"batch": 4, "s_q": 2, "h_q": 16, "seqlen_k": 129}
    _ok(interpreter.correctness("mla_decode", cfg, [shape], dtype="bf16",
                                params={"seqlens": [1, 2, 65, 129], "check_lse": True, "causal": True}))


def test_long_and_short_sequences_mixed_small_pages(interpreter):
    """One long sequence beside short ones, 16-token pages (BLOCK_N = page), BLOCK_H > h_q rows."""
    cfg = dict(BLOCK_H=64, BLOCK_N=16, num_splits=4, num_stages=2, num_warps=8)
    shape = {"batch": 3, "s_q": 1, "h_q": 16, "seqlen_k": 600}
    params = {"seqlens": [600, 3, 37], "page_size": 16, "softmax_scale": 0.135234}
    _ok(interpreter.correctness("mla_decode", cfg, [shape], dtype="fp16", params=params))


def test_spec_correctness_shapes_pass_with_baseline(interpreter):
    spec = load_spec(REPO / "specs" / "mla_decode_h100_bf16.yaml")
    c = _ok(interpreter.correctness("mla_decode", spec.baseline, spec.correctness_shapes, dtype=spec.dtype,
                                    tolerance=spec.constraints.numeric_tolerance, params=spec.params))
    assert c["max_abs_err"] < c["tolerance"]


def test_block_n_must_divide_the_page(interpreter):
    cfg = dict(BASE, BLOCK_N=64)
    assert "page_size % BLOCK_N" in MLA.space.check(cfg, {"page_size": 32})
    assert MLA.space.check(cfg, {"page_size": 64}) is None
    res = interpreter.correctness("mla_decode", cfg, [{"batch": 1, "s_q": 1, "h_q": 16, "seqlen_k": 8}],
                                  params={"page_size": 32})
    assert res["error"] == "runtime_error" and "BLOCK_N=64 must divide the page size 32" in res["detail"]


def test_too_tight_tolerance_reports_count_and_first_mismatches(interpreter):
    res = interpreter.correctness("mla_decode", BASE, [{"batch": 2, "s_q": 1, "h_q": 16, "seqlen_k": 40}],
                                  dtype="bf16", tolerance=1e-7)
    c = res["correctness"]
    assert not c["ok"] and c["mismatches"] > 0
    assert c["mismatch_sample"].startswith("[2x1x16x40 output 0] ")  # output 0: out, 1: lse and "elements outside atol=" in c["mismatch_sample"]
    assert c["mismatch_sample"].count("got ") >= 5


_DIRECT = r"""
import json, math, sys, torch
from kernels.mla_decode import FAMILY, mla_decode, reference_mla_decode
from kernels.measure import compare
cfg = dict(BLOCK_H=16, BLOCK_N=32, num_splits=4, num_stages=1, num_warps=4)
params = {"seqlens": [0, 1, 70]}
inp = FAMILY.make_inputs({"batch": 3, "s_q": 2, "h_q": 16, "seqlen_k": 70}, torch.float16, "cpu", 0, params)
out, lse = mla_decode(inp["q"], inp["kv_cache"], inp["block_table"], inp["cache_seqlens"], 0.1, cfg, causal=True)
r_out, r_lse = reference_mla_decode(inp["q"], inp["kv_cache"], inp["block_table"], inp["cache_seqlens"], 0.1, causal=True)
res = {"empty_out_zero": bool((out[0] == 0).all()) and bool((out[1, 0] == 0).all()),
       "lse_shape": list(lse.shape),
       # FlashMLA's layout [batch, h_q, s_q]: sequence 0 is empty, query 0 of sequence 1 sees no key
       "empty_lse": [float(lse[0].min()), float(lse[1, :, 0].min())],
       "ref_lse": [float(r_lse[0].min()), float(r_lse[1, :, 0].min())],
       "seen_lse_finite": bool(torch.isfinite(lse[1, :, 1]).all() and torch.isfinite(lse[2]).all()),
       "nan": bool(torch.isnan(out).any() or torch.isnan(lse).any()),
       "lse_err": float((lse[2] - r_lse[2]).abs().max()),
       "good": compare(out, r_out, 1e-2, 1e-2)["ok"]}
# A broken kernel path: launch with the pages in allocation order instead of the block table.
bad_table = torch.sort(inp["block_table"], dim=1).values.contiguous()
bad, _ = mla_decode(inp["q"], inp["kv_cache"], bad_table, inp["cache_seqlens"], 0.1, cfg, causal=True)
res["broken"] = compare(bad, r_out, 1e-2, 1e-2)
print("@@" + json.dumps(res))
"""


@pytest.fixture(scope="module")
def direct():
    """Run the host wrapper itself under the interpreter (a child process: TRITON_INTERPRET must be
    set before the kernels are decorated) for what the correctness job cannot see: exact -inf."""
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(REPO), PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, "-c", _DIRECT], capture_output=True, text=True, cwd=REPO, env=env, timeout=300)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("@@")), None)
    assert line, proc.stderr[-2000:]
    return json.loads(line[2:])


def test_zero_length_rows_give_zero_output_and_plus_inf_lse_in_flashmla_layout(direct):
    # Sequence 0 is empty; query 0 of sequence 1 (s_q = 2, one cached token) sees no key either.
    # FlashMLA: lse is [batch, h_q, s_q] and a row that sees no key has lse = +inf.
    assert direct["lse_shape"] == [3, 16, 2]
    assert direct["empty_out_zero"] and not direct["nan"] and direct["seen_lse_finite"]
    assert direct["empty_lse"] == [math.inf, math.inf] == direct["ref_lse"]
    assert direct["good"] and direct["lse_err"] < 1e-3


def test_wrong_pages_show_as_a_readable_mismatch(direct):
    res = direct["broken"]
    assert not res["ok"] and res["mismatches"] > 100
    assert "elements outside atol=0.01 rtol=0.01; first: (" in res["sample"] and "got " in res["sample"]


def test_compare_on_a_perturbed_output_names_the_mismatches():
    inp = MLA.make_inputs({"batch": 2, "s_q": 1, "h_q": 16, "seqlen_k": 70}, torch.float16, "cpu", 3, {})
    ref = MLA.reference(inp, {"check_lse": False})
    out = ref.clone()
    out[1, 0, 5, 7] += 0.5
    out[0, 0, 2, 100] = float("nan")
    atol, rtol = MLA.tolerance({"batch": 2, "s_q": 1, "h_q": 16, "seqlen_k": 70}, "fp16", 1e-2, {})
    res = compare(out, ref, atol, rtol)
    assert not res["ok"] and res["mismatches"] == 2 and res["nan_inf"]
    assert res["sample"].startswith("2 of 16384 elements outside") and "(1, 0, 5, 7): got " in res["sample"]


def test_inputs_use_shuffled_pages_and_poison_the_rest():
    params = {"seqlens": [130, 65, 1, 64]}
    inp = MLA.make_inputs({"batch": 4, "s_q": 1, "h_q": 16, "seqlen_k": 130}, torch.bfloat16, "cpu", 0, params)
    bt, kv, lens = inp["block_table"], inp["kv_cache"], inp["cache_seqlens"].tolist()
    assert lens == [130, 65, 1, 64] and bt.dtype == torch.int32 and bt.shape == (4, 3)
    used = [bt[b, : math.ceil(n / 64)].tolist() for b, n in enumerate(lens)]
    flat = [p for row in used for p in row]
    assert len(set(flat)) == len(flat) == 3 + 2 + 1 + 1  # no page shared
    assert flat != sorted(flat)  # not handed out in allocation order
    for b, n in enumerate(lens):
        last = kv[used[b][-1]]
        assert not torch.isnan(last[: (n - 1) % 64 + 1]).any()  # the tokens in use are finite
        assert torch.isnan(last[(n - 1) % 64 + 1:]).all()  # the tail of the last page is poison
        assert all(torch.isnan(kv[p]).all() for p in bt[b, len(used[b]):].tolist())  # unused entries too
    again = MLA.make_inputs({"batch": 4, "s_q": 1, "h_q": 16, "seqlen_k": 130}, torch.bfloat16, "cpu", 0, params)
    assert torch.equal(again["block_table"], bt)  # deterministic in the seed


def test_seqlen_patterns_are_deterministic_and_mixed():
    shape = {"batch": 8, "s_q": 1, "h_q": 128, "seqlen_k": 4096}
    from kernels.mla_decode import cache_seqlens

    spread = cache_seqlens(shape, {})
    assert spread == cache_seqlens(shape, {"seqlens": "spread"}) and spread[0] == 4096
    assert all(n <= 130 for n in spread[3::4]) and all(2048 <= n <= 6144 for i, n in enumerate(spread) if i % 4 != 3)
    assert cache_seqlens(shape, {"seqlens": "uniform"}) == [4096] * 8
    assert cache_seqlens(shape, {"seqlens": [5, 0]}) == [5, 0] * 4


def test_flops_and_bytes():
    shape = {"batch": 2, "s_q": 1, "h_q": 128, "seqlen_k": 1000}
    uniform = {"seqlens": "uniform"}
    assert MLA.flops(shape, uniform) == 2.0 * (576 + 512) * 128 * 2 * 1000
    rows = 2 * 128
    pages = 2 * math.ceil(1000 / 64)
    assert MLA.bytes_moved(shape, 2, uniform) == 2 * (2 * 1000 * 576 + rows * (576 + 512)) + 4 * rows + 4 * (pages + 2)
    # causal over s_q = 2: query 0 sees seqlen - 1 keys, query 1 sees all; not causal (the default): both see all
    two = {"batch": 1, "s_q": 2, "h_q": 16, "seqlen_k": 10}
    assert MLA.flops(two, {"seqlens": [10], "causal": True}) == 2.0 * 1088 * 16 * (9 + 10)
    assert MLA.flops(two, {"seqlens": [10]}) == 2.0 * 1088 * 16 * (10 + 10)
    assert MLA.flops(two, {"seqlens": [0]}) == 0.0


def test_tolerance_by_dtype_and_length():
    short = {"batch": 1, "s_q": 1, "h_q": 16, "seqlen_k": 64}
    long = {"batch": 1, "s_q": 1, "h_q": 16, "seqlen_k": 32768}
    a16, r16 = MLA.tolerance(short, "fp16", 1e-2, {})
    ab, rb = MLA.tolerance(short, "bf16", 1e-2, {})
    assert ab > a16 and rb > r16
    assert MLA.tolerance(long, "bf16", 1e-2, {})[0] > ab


def test_params_and_shapes_are_validated_with_clear_messages():
    assert MLA.check_params({"softmax_scale": 0.1, "page_size": 64, "seqlens": "spread", "check_lse": False}) is None
    assert MLA.check_params({"causal": True}) is None and "must be true or false" in MLA.check_params({"causal": "yes"})
    assert "allowed: 16, 32, 64, 128, 256" in MLA.check_params({"page_size": 48})
    assert "positive number" in MLA.check_params({"softmax_scale": -1})
    assert "allowed: spread, uniform" in MLA.check_params({"seqlens": "zipf"})
    assert ">= 0" in MLA.check_params({"seqlens": [3, -1]})
    assert "unknown param(s) window" in MLA.check_params({"window": 3})
    assert "s_q=9 must be 1..8" in MLA.check_shape({"batch": 1, "s_q": 9, "h_q": 16, "seqlen_k": 5})
    assert "shape keys must be exactly batch, s_q, h_q, seqlen_k" in MLA.check_shape({"batch": 1})


def test_registered_like_any_family():
    assert families()["mla_decode"] is MLA and MLA.headline_metric == "gbps" and MLA.use_cudagraph()
    assert MLA.source_hash() and len(list(MLA.space.enumerate({"page_size": 64}))) > 50


def test_sm90_compile_units_and_stats():
    lim = HardwareLimits()
    single = MLA.compile_units(dict(BASE, num_splits=1), "bf16", {})
    split = MLA.compile_units(BASE, "bf16", {})
    assert [u.fn.__name__ for u in single] == ["mla_decode_kernel"]
    assert [u.fn.__name__ for u in split] == ["mla_decode_kernel", "mla_combine_kernel"]
    stats = compile_units(split, "sm_90", lim)
    assert 0 < stats.regs_per_thread <= 255 and stats.spill_bytes == 0  # the spec's baseline does not spill
    assert stats.smem_bytes >= 2 * 32 * 576 * 2  # two stages of a 32-token latent tile
    assert stats.sass_mix.get("tensor_mma", 0) + stats.sass_mix.get("tensor_wgmma", 0) > 0
    assert stats.num_warps == 8  # the main kernel is the heavier unit, not the 4-warp combine


def test_family_runs_through_the_benchmark_resource(tmp_path):
    spec = parse_spec({
        "task_id": "mla_unit", "kernel_family": "mla_decode", "dtype": "fp16",
        "shape_matrix": [{"batch": 64, "s_q": 1, "h_q": 128, "seqlen_k": 4096}],
        "correctness_shapes": [{"batch": 2, "s_q": 1, "h_q": 16, "seqlen_k": 70}],
        "params": {"page_size": 64}, "baseline": BASE, "benchmark": {"timeout_s": 240},
    })
    bench = InterpreterBackend(cache_dir=str(tmp_path), workers=2)
    sugg = [Suggestion(variant_id="base", config=BASE, patch_summary="x", round=1),
            Suggestion(variant_id="bad", config=dict(BASE, BLOCK_N=128), patch_summary="x", round=1)]
    rows, _ = bench.evaluate(bind(spec), sugg, log=lambda m: None)
    ok, bad = rows
    assert ok.error is None and ok.correctness.ok and ok.evidence == "model", ok.error_detail
    m = ok.measurements[0]
    assert m.shape == "64x1x128x4096" and m.p50_ms > 0 and 0 < m.gbps < spec.hardware.limits.hbm_gbps
    assert MLA.headline(m.tflops, m.gbps) == ("gbps", m.gbps, "GB/s")  # memory-bound: GB/s, not TFLOP/s
    assert MLA.peak(spec.hardware, spec.params) == spec.hardware.limits.hbm_gbps
    assert 0 < MLA.speed_of_light_ms(spec.shape_matrix[0], 2, spec.hardware, spec.params) < m.p50_ms
    assert bad.error == "invalid_config" and "BLOCK_N=128 is not allowed" in bad.error_detail


def test_lse_is_flashmla_layout_and_its_infinities_are_checked_exactly():
    """The old kregress convention ([batch, s_q, h_q], -inf for an empty row) fails the check against
    FlashMLA's ([batch, h_q, s_q], +inf): the check compares infinities exactly, not only finite values."""
    shape = {"batch": 2, "s_q": 2, "h_q": 16, "seqlen_k": 5}
    inp = MLA.make_inputs(shape, torch.float16, "cpu", 0, {"seqlens": [0, 5]})
    out, lse = MLA.reference(inp, {"seqlens": [0, 5]})
    assert lse.shape == (2, 16, 2) and torch.isposinf(lse[0]).all() and torch.isfinite(lse[1]).all()
    minus = lse.clone()
    minus[0] = float("-inf")
    res = compare(minus, lse, 1e-2, 1e-2)
    assert not res["ok"] and res["mismatches"] == 16 * 2 and "got -inf, want inf" in res["sample"]
    assert not compare(lse.transpose(1, 2), lse, 1e-2, 1e-2)["ok"]  # the [batch, s_q, h_q] layout
    assert compare(lse.clone(), lse, 1e-2, 1e-2)["ok"]


def test_fp8_kv_cache_matches_the_dequantizing_reference(interpreter):
    """e4m3 cache with one fp32 scale per token; lengths 0 and 1, s_q = 2, split-K; NaN poison past the ends."""
    cfg = dict(BLOCK_H=16, BLOCK_N=32, num_splits=3, num_stages=1, num_warps=4)
    params = {"kv_dtype": "fp8_e4m3", "seqlens": [0, 1, 70, 33]}
    c = _ok(interpreter.correctness("mla_decode", cfg, [{"batch": 4, "s_q": 2, "h_q": 16, "seqlen_k": 70}],
                                    dtype="bf16", params=params))
    assert c["max_abs_err"] > 0


def test_fp8_kv_cache_inputs_formulas_and_sm90_compile():
    from kernels.mla_decode import quantize_kv_per_token, reference_mla_decode

    shape = {"batch": 2, "s_q": 1, "h_q": 16, "seqlen_k": 70}
    params = {"kv_dtype": "fp8_e4m3", "seqlens": [70, 5]}
    assert MLA.check_params(params) is None
    assert "kv_dtype='fp8_e5m2' is not allowed; allowed: fp8_e4m3" in MLA.check_params({"kv_dtype": "fp8_e5m2"})
    inp = MLA.make_inputs(shape, torch.bfloat16, "cpu", 0, params)
    kv, scale = inp["kv_cache"], inp["kv_scale"]
    assert kv.dtype == torch.float8_e4m3fn and scale.dtype == torch.float32 and scale.shape == kv.shape[:2]
    assert torch.isnan(kv[inp["block_table"][1, 0].long(), 5:].float()).all()  # the page tail is still poison
    q8, s8 = quantize_kv_per_token(torch.randn(3, 16, 1, 576))
    assert torch.allclose(q8.float().abs().amax(dim=(2, 3)), torch.full((3, 16), 448.0))
    # the reference reads the fp8 values times their token's scale: without the scales it is far off
    ref, _ = reference_mla_decode(inp["q"], kv, inp["block_table"], inp["cache_seqlens"], 0.1, kv_scale=scale)
    raw, _ = reference_mla_decode(inp["q"], kv, inp["block_table"], inp["cache_seqlens"], 0.1,
                                  kv_scale=torch.ones_like(scale))
    assert not compare(raw, ref, 1e-2, 1e-2)["ok"]
    uniform = {"seqlens": "uniform"}
    assert MLA.bytes_moved(shape, 2, dict(uniform, kv_dtype="fp8_e4m3")) < MLA.bytes_moved(shape, 2, uniform)
    assert (MLA.bytes_moved(shape, 2, uniform) - MLA.bytes_moved(shape, 2, dict(uniform, kv_dtype="fp8_e4m3"))
            == 2 * 70 * (576 * 2 - 576 - 4))
    lim = HardwareLimits()
    cfg = dict(BLOCK_H=16, BLOCK_N=32, num_splits=1, num_stages=2, num_warps=4)
    units = MLA.compile_units(cfg, "bf16", {"kv_dtype": "fp8_e4m3"})
    assert units[0].signature["kv_ptr"] == "*fp8e4nv" and units[0].constexprs["KV_FMT"] == 1
    fp8 = compile_units(units, "sm_90", lim)
    bf16 = compile_units(MLA.compile_units(cfg, "bf16", {}), "sm_90", lim)
    assert fp8.spill_bytes == 0 and 0 < fp8.regs_per_thread <= 255
    assert fp8.sass_mix.get("convert", 0) > bf16.sass_mix.get("convert", 0)  # the in-kernel dequantization
    # (shared memory is not smaller: Triton 3.9 stages the dequantized tile for the MMA besides the fp8 ring)
    assert fp8.smem_bytes > 0
    # measured, not assumed: the dequantized 32-token tile at 8 warps runs out of registers
    assert compile_units(MLA.compile_units(BASE, "bf16", {"kv_dtype": "fp8_e4m3"}), "sm_90", lim).spill_bytes > 0
