"""The CUDA family declares its static shared-memory formula (issue 54 item 5): ``static_smem_bytes(config)`` from
the config alone equals what ptxas reports (37,376 B for the baseline), and a config over the 48 KiB static limit
is refused before nvcc as infeasible, with the formula's figure: by the space (so the local search never proposes
it), by a sweep's backend (never compiled) and by `kregress judge` (exit 2)."""

from __future__ import annotations

import copy
import math
import re

import pytest

from kregress.core.cuda_source import find_nvcc
from kregress.core.family import CUDA_STATIC_SMEM_LIMIT, Space
from kregress.core.records import Measurement, VariantResult, config_hash
from kregress.core.spec import HardwareLimits

needs_nvcc = pytest.mark.skipif(find_nvcc() is None, reason="no nvcc on this host: nothing to compile")
BASELINE = {"BLOCK_M": 64, "BLOCK_N": 64, "STAGES": 2, "TM": 4, "TN": 4}
OVER = {**BASELINE, "STAGES": 3}  # 3 * (128 * 144 + 256) = 56064 B = 0xdb00


def family():
    from kernels.cuda.gemm_fp8_cuda import FAMILY

    return FAMILY


def test_formula_and_the_rule_it_gives():
    fam = family()
    assert fam.static_smem_bytes(BASELINE) == 37376  # ptxas's figure (issue 54)
    assert fam.static_smem_bytes(OVER) == 0xDB00 == 56064
    assert fam.space.check(BASELINE) is None
    why = fam.space.check(OVER)
    assert why.startswith("violates rule static_smem") and "56064 B > 49152 B" in why and "infeasible" in why
    every = list(fam.space.enumerate())
    assert every and all(fam.static_smem_bytes(c) <= CUDA_STATIC_SMEM_LIMIT for c in every)
    threads_only = Space(fam.space.params, tuple(r for r in fam.space.rules if r.name != "static_smem"))
    assert len(list(threads_only.enumerate())) > len(every)  # the rule removes configs the space held before


def _row(vid: str, cfg: dict, rnd: int) -> VariantResult:
    """A timed row whose latency is a smooth function of the config (a stand-in GPU for the policy's model)."""
    lat = 1.0 + abs(math.log2(cfg["BLOCK_M"] / 128)) + abs(math.log2(cfg["BLOCK_N"] / 128)) + 0.2 / cfg["STAGES"]
    m = Measurement(shape="4096x7168x2048", samples_ms=[lat], p20_ms=lat, p50_ms=lat, p80_ms=lat, tflops=1, gbps=1,
                    evidence="model", device="x", torch_version="t", triton_version="t")
    return VariantResult(variant_id=vid, round=rnd, source="local", config=cfg, config_hash=config_hash(cfg),
                         measurements=[m], evidence="model")


def _proposals(fam, rounds: int = 3) -> list[dict]:
    from kernel_assets.agent.base import AgentContext
    from kernel_assets.agent.local import LocalPolicy
    from kregress.core.spec import load_spec

    spec = load_spec("specs/gemm_fp8_cuda_h100.yaml")
    history = [_row("baseline", spec.baseline, 0)]
    out = []
    for rnd in range(1, rounds + 1):
        ctx = AgentContext(spec=spec, family=fam, round=rnd, n=8, history=history, profile_summary="", failures=[],
                           objective={r.config_hash: r.measurements[0].p50_ms for r in history})
        picked = [s.config for s in LocalPolicy().propose(ctx).suggestions]
        out += picked
        history += [_row(f"r{rnd}-{k}", c, rnd) for k, c in enumerate(picked)]
    return out


def test_the_local_search_proposes_only_configs_within_the_limit():
    fam = family()
    proposed = _proposals(fam)
    assert len(proposed) >= 16
    assert all(fam.static_smem_bytes(c) <= CUDA_STATIC_SMEM_LIMIT for c in proposed), \
        [(c, fam.static_smem_bytes(c)) for c in proposed if fam.static_smem_bytes(c) > CUDA_STATIC_SMEM_LIMIT]
    # the same search on the space without the rule wastes compiles on configs ptxas refuses (the test can fail)
    bare = copy.copy(fam)
    bare.space = Space(fam.space.params, tuple(r for r in fam.space.rules if r.name != "static_smem"))
    assert any(fam.static_smem_bytes(c) > CUDA_STATIC_SMEM_LIMIT for c in _proposals(bare))


@needs_nvcc
def test_a_sweep_never_compiles_a_config_over_the_limit(tmp_path):
    from kernel_assets.sweep import verdict_for
    from kregress.core.bind import load_bound
    from kregress.core.records import Suggestion
    from resources.gpu import InterpreterBackend

    bound = load_bound("specs/gemm_fp8_cuda_h100.yaml")
    s = Suggestion(variant_id="over", config=OVER, patch_summary="t", source="t", round=1, risk="low")
    (row,), stats = InterpreterBackend(cache_dir=str(tmp_path), workers=1).evaluate(bound, [s], log=lambda _m: None)
    assert stats.compiles == 0 and row.compile is None
    assert row.error == "invalid_config" and "56064 B > 49152 B" in row.error_detail
    v = verdict_for(row, row, bound.spec)
    assert (v.verdict, v.cause) == ("REGRESS", "infeasible") and "56064 B" in v.reasons[0]


@needs_nvcc
@pytest.mark.slow
def test_the_formula_equals_ptxas_on_several_configs(tmp_path):
    """nvcc compiles a few configs (each a 5-20 s ptxas run): the static shared memory ptxas reports is the formula's
    figure, and a config over the limit compiled anyway is refused by ptxas with the same figure in hex."""
    from kernels.compile import CompileError
    from kernels.cuda.nvcc import compile_variant

    fam = family()
    for cfg in (BASELINE, {"BLOCK_M": 32, "BLOCK_N": 128, "STAGES": 1, "TM": 2, "TN": 8},
                {"BLOCK_M": 128, "BLOCK_N": 32, "STAGES": 2, "TM": 8, "TN": 2}):
        stats, _ = compile_variant(fam, cfg, "fp8_e4m3", {}, "sm_90", HardwareLimits(), cache=tmp_path)
        assert stats.smem_static_bytes == fam.static_smem_bytes(cfg), cfg
    with pytest.raises(CompileError) as exc:
        compile_variant(fam, OVER, "fp8_e4m3", {}, "sm_90", HardwareLimits(), cache=tmp_path)
    used = re.search(r"uses too much shared data \((0x[0-9a-f]+) bytes, 0xc000 max\)", exc.value.detail)
    assert used and int(used.group(1), 16) == fam.static_smem_bytes(OVER)
