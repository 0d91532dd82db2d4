"""The timing protocol on a GPU, with no Dagster import (the lent GPU machine has none): the spec's timing plan
(``kregress.core.batching.TimingPlan``) drives ``kernels.measure.batch_measurements`` (the worker's batch: the
baseline re-timed between every two variants, in one process), and the sequential verdict reads its samples.
Skipped on hosts without a CUDA GPU; ``scripts/gpu_check.sh`` runs it on the lent machine."""

from __future__ import annotations

import pytest

from kregress.core import stats
from kregress.core.batching import TimingPlan
from kregress.core.spec import parse_spec

pytestmark = pytest.mark.gpu

SPEC = parse_spec({
    "task_id": "gemm_gpu_timing", "kernel_family": "gemm", "dtype": "fp16",
    "shape_matrix": [{"M": 1024, "N": 1024, "K": 1024}], "correctness_shapes": [{"M": 64, "N": 64, "K": 64}],
    "baseline": dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, GROUP_M=8, num_stages=3, num_warps=4),
    "hardware": {"arch": "sm_90"},
    "benchmark": {"batch_rounds": 7, "max_batch_rounds": 16, "rep_ms": 70, "warmup_ms": 14},
})


def test_the_plan_times_the_baseline_and_a_variant_in_one_batch_without_dagster():
    from kernels.measure import batch_measurements
    from kregress.core.family import get_family

    plan = TimingPlan.from_spec(SPEC)
    assert plan.looks()[0] == 7 and plan.adaptive
    fam = get_family("gemm")
    var = {**SPEC.baseline, "BLOCK_N": 128}
    f = plan.job_fields()
    out = batch_measurements(fam, SPEC.baseline, {"v1": var}, SPEC.shape_matrix, SPEC.dtype, {}, f["warmup_ms"],
                             f["rep_ms"], batch_id="gpu-plan", rounds=f["rounds"], order=f["order"])
    (b,), (v,) = out["baseline"], out["v1"]
    assert b.batch == v.batch == "gpu-plan" and b.gpu_name
    assert len(v.samples_ms) >= 7 and len(b.samples_ms) >= 2 * 7  # every round: one variant slot, two baseline slots
    # the verdict at the plan's first look reads these samples (a real interval, not a refusal)
    res = stats.judge_look(plan.design(), 0, [v.samples_ms], [b.samples_ms], min_samples=SPEC.regression_guard.min_samples)
    assert res.combined.confidence == pytest.approx(plan.look_confidence(0)) and res.combined.low <= res.combined.high
