"""Prefill attention family: interpreter correctness (out and lse) over masks, flash-attn windows,
packed varlen, chunked prefill (seqlen_q < seqlen_k), d_qk != d_v and grouped heads; the FLOP formula
against brute force; real sm_90 compile stats; the benchmark resource path."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kernels.attention import key_lengths, reference_attention, seq_lengths, visible_pairs, window_size
from kernels.compile import compile_units
from kernels.measure import compare
from kregress.core.bind import bind
from kregress.core.family import families, get_family
from kregress.core.records import Suggestion
from kregress.core.spec import HardwareLimits, load_spec, parse_spec
from resources.gpu import InterpreterBackend

REPO = Path(__file__).resolve().parent.parent
ATTN = get_family("attention")
SMALL = dict(BLOCK_M=16, BLOCK_N=16, num_stages=2, num_warps=2)
WIDE = dict(BLOCK_M=64, BLOCK_N=32, num_stages=2, num_warps=4)
BASE = dict(BLOCK_M=128, BLOCK_N=64, num_stages=3, num_warps=8)

CASES = [
    # (id, shape, params): lengths are never multiples of the blocks
    ("causal-gqa-varlen-empty", {"batch": 3, "seqlen": 50, "h_q": 4, "h_kv": 2, "head_dim": 64},
     {"causal": True, "seqlens": [50, 0, 77]}),
    ("noncausal-d128", {"batch": 2, "seqlen": 45, "h_q": 2, "h_kv": 1, "head_dim": 128}, {"causal": False}),
    ("causal-window-left-spread", {"batch": 3, "seqlen": 60, "h_q": 2, "h_kv": 2, "head_dim": 64},
     {"causal": True, "window": [19, 0], "seqlens": "spread"}),
    ("noncausal-window-left-right", {"batch": 2, "seqlen": 45, "h_q": 2, "h_kv": 1, "head_dim": 64},
     {"causal": False, "window": [16, 5]}),
    ("window-wider-than-seq", {"batch": 2, "seqlen": 30, "h_q": 2, "h_kv": 1, "head_dim": 64},
     {"causal": True, "window": [999, 0]}),
    # chunked prefill: seqlen_q < seqlen_k, queries bottom-right aligned with their cached prefix
    ("prefix-causal-varlen", {"batch": 3, "seqlen": 20, "h_q": 4, "h_kv": 2, "head_dim": 64},
     {"causal": True, "seqlens": [20, 0, 33], "prefix": [5, 3, 40]}),
    ("prefix-window-0-right", {"batch": 2, "seqlen": 30, "h_q": 2, "h_kv": 2, "head_dim": 64},
     {"causal": False, "window": [0, 7], "prefix": 9}),
    ("prefix-window-unbounded", {"batch": 2, "seqlen": 30, "h_q": 2, "h_kv": 2, "head_dim": 64},
     {"causal": False, "window": [-1, -1], "prefix": [0, 17]}),
    ("prefix-window-left-0", {"batch": 2, "seqlen": 25, "h_q": 2, "h_kv": 1, "head_dim": 64},
     {"causal": False, "window": [6, 0], "prefix": 11}),
    # DeepSeek MLA prefill: q/k 192 (128 + 64 rope), v 128; and a v narrower than q/k
    ("deepseek-192-128-prefix", {"batch": 2, "seqlen": 19, "h_q": 4, "h_kv": 4, "head_dim": 192},
     {"causal": True, "head_dims": [192], "prefix": [21, 0]}),
    ("dqk128-dv64-window", {"batch": 2, "seqlen": 30, "h_q": 2, "h_kv": 1, "head_dim": 128},
     {"causal": False, "window": [5, 3], "head_dim_v": 64}),
]


def _ok(res: dict) -> dict:
    assert "correctness" in res, res
    c = res["correctness"]
    assert c["ok"] and not c["nan_inf"] and c["mismatches"] == 0, c["mismatch_sample"]
    return c


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_interpreter_matches_float64_reference(interpreter, case, dtype):
    _, shape, params = case
    config = SMALL if dtype == "fp16" else WIDE  # 16x16 tiles cross every mask edge; 64x32 skips blocks
    c = _ok(interpreter.correctness("attention", config, [shape], dtype=dtype, params=params))
    assert c["shapes_checked"] == [ATTN.shape_label(shape)]


def test_spec_correctness_shapes_pass_with_baseline(interpreter):
    spec = load_spec(REPO / "specs" / "attention_prefill_h100_bf16.yaml")
    c = _ok(interpreter.correctness("attention", spec.baseline, spec.correctness_shapes, dtype=spec.dtype,
                                    tolerance=spec.constraints.numeric_tolerance, params=spec.params))
    assert c["max_abs_err"] < c["tolerance"]


def test_too_tight_tolerance_reports_count_and_first_mismatches(interpreter):
    shape = {"batch": 1, "seqlen": 33, "h_q": 2, "h_kv": 1, "head_dim": 64}
    c = interpreter.correctness("attention", SMALL, [shape], dtype="bf16", tolerance=1e-7)["correctness"]
    assert not c["ok"] and c["mismatches"] > 0
    assert c["mismatch_sample"].startswith("[1x33x2x1x64 output 0] ")  # output 0: out, 1: lse and c["mismatch_sample"].count("got ") >= 5


def test_head_dim_outside_params_is_a_clear_error(interpreter):
    res = interpreter.correctness("attention", SMALL, [{"batch": 1, "seqlen": 8, "h_q": 1, "h_kv": 1, "head_dim": 64}],
                                  params={"head_dims": [128]})
    assert res["error"] == "runtime_error" and "head_dim=64 is not in params.head_dims=[128]" in res["detail"]


def test_a_wrong_mask_is_caught_with_readable_text():
    """What a kernel that forgets the causal mask would produce, through the same compare."""
    shape = {"batch": 2, "seqlen": 20, "h_q": 2, "h_kv": 1, "head_dim": 64}
    inp = ATTN.make_inputs(shape, torch.float16, "cpu", 0, {})
    ref, ref_lse = ATTN.reference(inp, {"causal": True})
    wrong, wrong_lse = reference_attention(inp["q"], inp["k"], inp["v"], inp["cu_seqlens_q"], inp["cu_seqlens_k"],
                                           (-1, -1), 64 ** -0.5)
    atol, rtol = ATTN.tolerance(shape, "fp16", 1e-2, {})
    assert not compare(wrong_lse, ref_lse, atol, rtol)["ok"]  # the lse shows the missing mask too
    res = compare(wrong, ref, atol, rtol)
    assert not res["ok"] and res["mismatches"] > 100
    # the last query of each sequence sees every key either way: only earlier rows differ
    assert torch.allclose(wrong[19], ref[19]) and torch.allclose(wrong[39], ref[39])
    assert "elements outside atol=" in res["sample"] and res["sample"].count("got ") == 5


def test_visible_pairs_match_brute_force():
    for n_q in (1, 2, 7, 33):
        for prefix in (0, 1, 9):
            n_k = n_q + prefix
            for left in (-1, 0, 1, 5, 40):
                for right in (-1, 0, 3, 50):
                    pos = torch.arange(n_q)[:, None] + prefix  # bottom-right alignment
                    j = torch.arange(n_k)[None, :]
                    ok = torch.ones(n_q, n_k, dtype=torch.bool)
                    if right >= 0:
                        ok &= j <= pos + right
                    if left >= 0:
                        ok &= j >= pos - left
                    assert visible_pairs(n_q, n_k, left, right) == int(ok.sum()), (n_q, n_k, left, right)
    assert visible_pairs(0, 5, -1, 0) == 0


def test_flops_bytes_and_masked_fraction():
    shape = {"batch": 2, "seqlen": 1000, "h_q": 8, "h_kv": 2, "head_dim": 128}
    full = ATTN.flops(shape, {"causal": False})
    assert full == 4.0 * 128 * 8 * 2 * 1000 * 1000
    causal = ATTN.flops(shape, {"causal": True})
    assert causal == 4.0 * 128 * 8 * 2 * (1000 * 1001 // 2)
    windowed = ATTN.flops(shape, {"causal": True, "window": [99, 0]})
    assert windowed < causal / 4
    assert ATTN.bytes_moved(shape, 2, {}) == 2 * 2000 * 128 * (2 * 8 + 2 * 2) + 4 * 2000 * 8  # + fp32 lse
    # d_qk = 192, d_v = 128: 2 * 192 for the score, 2 * 128 for P @ V per visible pair
    ds = dict(shape, head_dim=192)
    assert ATTN.flops(ds, {"causal": False}) == 2.0 * (192 + 128) * 8 * 2 * 1000 * 1000
    # a cached prefix of 500: every query sees the whole prefix plus its causal part
    assert ATTN.flops(shape, {"causal": True, "prefix": 500}) == 4.0 * 128 * 8 * 2 * (1000 * 500 + 1000 * 1001 // 2)
    assert ATTN.masked_fraction(shape, {"causal": False}) == 0.0
    assert abs(ATTN.masked_fraction(shape, {"causal": True}) - (1 - 1001 / 2000)) < 1e-12


def test_seqlen_patterns():
    shape = {"batch": 4, "seqlen": 4096, "h_q": 128, "h_kv": 128, "head_dim": 128}
    spread = seq_lengths(shape, {"seqlens": "spread"})
    assert sum(spread) == 4 * 4096 and len(set(spread)) == 4 and min(spread) > 512
    assert seq_lengths(shape, {}) == [4096] * 4
    assert seq_lengths(dict(shape, batch=1), {"seqlens": "spread"}) == [4096]
    assert seq_lengths(shape, {"seqlens": [3, 0]}) == [3, 0, 3, 0]
    inp = ATTN.make_inputs(dict(shape, batch=3, seqlen=10, h_q=4, h_kv=2, head_dim=64), torch.float16, "cpu", 0,
                           {"seqlens": [10, 0, 7]})
    assert inp["cu_seqlens_q"].tolist() == [0, 10, 10, 17] and inp["max_seqlen_q"] == 10
    assert torch.equal(inp["cu_seqlens_k"], inp["cu_seqlens_q"])  # no prefix: self-attention
    assert inp["q"].shape == (17, 4, 64) and inp["k"].shape == (17, 2, 64)


def test_tolerance_by_dtype_and_length():
    short = {"batch": 1, "seqlen": 100, "h_q": 1, "h_kv": 1, "head_dim": 64}
    long = dict(short, seqlen=65536)
    assert ATTN.tolerance(short, "bf16", 1e-2, {}) > ATTN.tolerance(short, "fp16", 1e-2, {})
    assert ATTN.tolerance(long, "fp16", 1e-2, {})[0] > ATTN.tolerance(short, "fp16", 1e-2, {})[0]
    # a window bounds the reduction length
    assert ATTN.tolerance(long, "fp16", 1e-2, {"causal": False, "window": [63, 0]}) == ATTN.tolerance(short, "fp16", 1e-2, {})


def test_shapes_and_params_are_validated_with_clear_messages():
    good = {"batch": 1, "seqlen": 8, "h_q": 8, "h_kv": 2, "head_dim": 128}
    assert ATTN.check_shape(good) is None
    assert "allowed: 32, 64, 96, 128, 192, 256" in ATTN.check_shape(dict(good, head_dim=80))
    assert ATTN.check_shape(dict(good, head_dim=192)) is None
    assert "h_kv=3 must divide h_q=8" in ATTN.check_shape(dict(good, h_kv=3))
    assert ATTN.check_params({"causal": False, "window": [127, 127], "seqlens": "spread", "head_dims": [64]}) is None
    assert ATTN.check_params({"window": [-1, 0], "prefix": [0, 512], "head_dims": [192], "head_dim_v": 128}) is None
    assert "must be true or false" in ATTN.check_params({"causal": "yes"})
    assert "window=-1" in ATTN.check_params({"window": -1})
    assert "[left, right] with integers >= -1" in ATTN.check_params({"window": [3]})
    assert "causal=true means right = 0" in ATTN.check_params({"causal": True, "window": [3, 2]})
    assert "prefix=-3 must be an integer >= 0" in ATTN.check_params({"prefix": -3})
    assert "head_dim_v=80 is not allowed; allowed: 32, 64, 96, 128, 192, 256" in ATTN.check_params({"head_dim_v": 80})
    assert "(q/k, v) = (64, 192) is not allowed" in ATTN.check_params({"head_dim_v": 192})  # 128/192 is, 64/192 not
    assert "allowed: uniform, spread" in ATTN.check_params({"seqlens": "zipf"})
    assert "drawn from 32, 64, 96, 128, 192, 256" in ATTN.check_params({"head_dims": [80]})
    assert "unknown param(s) page_size" in ATTN.check_params({"page_size": 64})


def test_registered_like_any_family():
    assert families()["attention"] is ATTN and ATTN.headline_metric == "tflops" and not ATTN.use_cudagraph()
    assert "BLOCK_M * d_v / (32 * num_warps) <= 128" in ATTN.space.check(dict(BASE, BLOCK_M=128, num_warps=2))


def test_sm90_compile_stats_per_head_dim():
    lim = HardwareLimits()
    both = ATTN.compile_units(BASE, "bf16", {})
    assert [u.constexprs["D_QK"] for u in both] == [64, 128]
    d64 = compile_units(ATTN.compile_units(BASE, "bf16", {"head_dims": [64]}), "sm_90", lim)
    d128 = compile_units(ATTN.compile_units(BASE, "bf16", {"head_dims": [128]}), "sm_90", lim)
    assert d128.smem_bytes > d64.smem_bytes > 0 and d128.spill_bytes == 0 and d128.regs_per_thread <= 255
    # one stage of K and V tiles per pipeline stage plus the Q tile: (128 + 2 * 3 * 64) * 128 * 2 bytes
    assert d128.smem_bytes == (128 + 2 * 3 * 64) * 128 * 2
    assert d128.sass_mix.get("tensor_wgmma", 0) > 0


def test_family_runs_through_the_benchmark_resource(tmp_path):
    spec = parse_spec({
        "task_id": "attn_unit", "kernel_family": "attention", "dtype": "fp16",
        "shape_matrix": [{"batch": 2, "seqlen": 4096, "h_q": 128, "h_kv": 128, "head_dim": 128}],
        "correctness_shapes": [{"batch": 2, "seqlen": 40, "h_q": 2, "h_kv": 1, "head_dim": 128}],
        "params": {"causal": True, "window": [23, 0], "head_dims": [128]},
        "baseline": BASE, "benchmark": {"timeout_s": 240},
    })
    bench = InterpreterBackend(cache_dir=str(tmp_path), workers=2)
    sugg = [Suggestion(variant_id="base", config=BASE, patch_summary="x", round=1),
            Suggestion(variant_id="bad", config=dict(BASE, num_warps=2), patch_summary="x", round=1)]
    rows, _ = bench.evaluate(bind(spec), sugg, log=lambda m: None)
    ok, bad = rows
    assert ok.error is None and ok.correctness.ok and ok.evidence == "model", ok.error_detail
    m = ok.measurements[0]
    assert m.shape == "2x4096x128x128x128" and m.p50_ms > 0 and 0 < m.tflops < spec.hardware.limits.peak_tflops
    assert ATTN.headline(m.tflops, m.gbps)[2] == "TFLOP/s"
    assert 0 < ATTN.speed_of_light_ms(spec.shape_matrix[0], 2, spec.hardware, spec.params) < m.p50_ms
    assert bad.error == "invalid_config" and "acc_in_registers" in bad.error_detail


def test_sm90_compile_stats_deepseek_192_128():
    """d_qk = 192 compiles as a 128-dim and a 64-dim dot into one score; v stays 128 wide."""
    lim = HardwareLimits()
    units = ATTN.compile_units(BASE, "bf16", {"head_dims": [192]})
    assert [(u.constexprs["D_QK"], u.constexprs["D_PE"], u.constexprs["D_V"]) for u in units] == [(128, 64, 128)]
    stats = compile_units(units, "sm_90", lim)
    assert stats.spill_bytes == 0 and stats.sass_mix.get("tensor_wgmma", 0) > 0
    # the Q tile (192 wide) plus one K (192) and V (128) tile per pipeline stage, 2 bytes each
    assert stats.smem_bytes == (128 * 192 + 3 * 64 * (192 + 128)) * 2
    assert "smem_ring" in ATTN.space.check(dict(BASE, BLOCK_M=64, num_stages=4, BLOCK_N=128), {"head_dims": [192]})


def test_deprecated_single_window_maps_to_flash_attn_left_right():
    with pytest.warns(FutureWarning, match=r"window: 32 .* maps to flash-attn's window \[left, right\] = \[31, 0\]"):
        assert ATTN.check_params({"causal": True, "window": 32}) is None
    with pytest.warns(FutureWarning, match=r"\[31, 31\] \(causal=false\)"):
        assert ATTN.check_params({"causal": False, "window": 32}) is None
    assert window_size({"window": 32}) == (31, 0) and window_size({"causal": False, "window": 32}) == (31, 31)
    assert window_size({}) == (-1, 0) and window_size({"causal": False}) == (-1, -1)
    assert window_size({"window": 0}) == (-1, 0) and window_size({"window": [-1, -1]}) == (-1, 0)
    shape = {"batch": 1, "seqlen": 40, "h_q": 2, "h_kv": 1, "head_dim": 64}
    assert ATTN.flops(shape, {"window": 32}) == ATTN.flops(shape, {"window": [31, 0]})


def test_lse_layout_and_prefix_inputs():
    shape = {"batch": 2, "seqlen": 10, "h_q": 4, "h_kv": 2, "head_dim": 192}
    params = {"head_dims": [192], "seqlens": [10, 3], "prefix": [6, 0]}
    assert key_lengths(shape, params) == [16, 3]
    inp = ATTN.make_inputs(shape, torch.float16, "cpu", 0, params)
    assert inp["cu_seqlens_q"].tolist() == [0, 10, 13] and inp["cu_seqlens_k"].tolist() == [0, 16, 19]
    assert inp["q"].shape == (13, 4, 192) and inp["k"].shape == (19, 2, 192) and inp["v"].shape == (19, 2, 128)
    out, lse = ATTN.reference(inp, params)
    assert out.shape == (13, 4, 128) and lse.shape == (4, 13) and torch.isfinite(lse).all()  # flash-attn varlen lse
    # the last query of sequence 0 sees all 16 keys: its lse is the full log-sum-exp
    k = inp["k"][:16].double().repeat_interleave(2, dim=1)  # [16 keys, 4 heads, 192]
    scores = torch.einsum("hd,nhd->hn", inp["q"][9].double(), k) * 192 ** -0.5
    assert torch.allclose(lse[:, 9], torch.logsumexp(scores, dim=-1))
    # the first query of sequence 0 sits at position 6: it sees keys 0..6 only (bottom-right causal)
    scores0 = torch.einsum("hd,nhd->hn", inp["q"][0].double(), k[:7]) * 192 ** -0.5
    assert torch.allclose(lse[:, 0], torch.logsumexp(scores0, dim=-1))


def test_deepseek_prefill_spec_sweeps_end_to_end_on_the_embedded_default(dagster_home, tmp_path):
    """specs/attention_prefill_deepseek_h100.yaml as shipped (192/128 heads, cached prefixes, lse
    checked), searched for one round of two variants."""
    import math

    import pandas as pd
    import yaml

    from kernel_assets.cli import main

    raw = yaml.safe_load((REPO / "specs" / "attention_prefill_deepseek_h100.yaml").read_text())
    raw["search"] = {"strategy": "local", "variants_per_round": 2, "max_rounds": 1, "no_improve_rounds": 1, "seed": 0}
    path = tmp_path / "attention_prefill_deepseek_h100.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert main(["sweep", str(path), "--backend", "interpreter"]) == 0
    out = dagster_home / "reports" / "attention_prefill_deepseek_h100"
    variants = pd.read_parquet(out / "variants.parquet")
    base = variants.iloc[0]
    assert base["error"] is None or (isinstance(base["error"], float) and math.isnan(base["error"])), base.to_dict()
    assert base["evidence"] == "model" and base["latency_p50_ms"] > 0 and 0 < base["max_abs_err"] < 0.05
    assert base["smem_bytes"] == (128 * 192 + 3 * 64 * (192 + 128)) * 2 and len(variants) >= 2
