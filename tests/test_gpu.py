"""GPU path (cuda backend). Skipped on hosts without a CUDA GPU (CI has none): run on a GPU host with
`.venv/bin/python -m pytest -q -m gpu`."""

from __future__ import annotations

import pytest

from kregress.core.bind import bind
from kregress.core.records import Suggestion
from kregress.core.spec import parse_spec

# CudaBackend is a Dagster resource: without Dagster (the lent GPU machine, unless its wheels were carried) these
# tests skip and say why; the timing protocol's own GPU tests (tests/test_gpu_timing.py) import no Dagster.
pytest.importorskip("dagster", reason="CudaBackend is a Dagster resource and Dagster is not importable here "
                                      "(carry it: scripts/fetch_gpu_wheels.sh --with-dagster)")
from resources.gpu import CudaBackend  # noqa: E402

pytestmark = pytest.mark.gpu

SPEC = parse_spec({
    "task_id": "gemm_gpu", "kernel_family": "gemm", "dtype": "bf16",
    "shape_matrix": [{"M": 4096, "N": 4096, "K": 4096}], "correctness_shapes": [{"M": 257, "N": 193, "K": 131}],
    "baseline": dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_stages=3, num_warps=8),
    "hardware": {"arch": "sm_90"},
})


def test_cuda_backend_measures_and_matches_aot_stats(tmp_path):
    import torch
    import triton

    bench = CudaBackend(cache_dir=str(tmp_path))
    good = Suggestion(variant_id="b", config=SPEC.baseline, patch_summary="baseline", round=0)
    oom = Suggestion(variant_id="oom", config=dict(BLOCK_M=256, BLOCK_N=128, BLOCK_K=128, GROUP_M=8, num_stages=4, num_warps=8),
                     patch_summary="too much smem", round=1)
    rows, _ = bench.evaluate(bind(SPEC), [good, oom], log=print)
    row = rows[0]
    assert row.error is None and row.correctness.ok and row.evidence == "cuda"
    m = row.measurements[0]
    assert len(m.samples_ms) >= 10 and 0 < m.p20_ms <= m.p50_ms <= m.p80_ms
    assert m.device == torch.cuda.get_device_name() and m.tflops > 50  # a 4096^3 bf16 GEMM on Hopper
    assert rows[1].error == "out_of_resources"
    # the AOT stats are what the GPU JIT produces for the same specialization
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    from kernels.gemm import gemm_kernel, matmul

    matmul(a, a, SPEC.baseline)
    compiled = [k for cache in gemm_kernel.device_caches.values() for k in cache[0].values()]
    compiled[-1]._init_handles()
    assert compiled[-1].n_regs == row.compile.regs_per_thread
    assert compiled[-1].metadata.shared == row.compile.smem_bytes
    assert triton.__version__ == m.triton_version


def test_external_kernel_family_timed_like_a_triton_variant(tmp_path):
    """torch_sdpa (PyTorch's fused attention kernels) on the cuda backend: no compile stats, real timings."""
    from pathlib import Path

    from kregress.core.bind import load_bound

    bound = load_bound(Path(__file__).resolve().parents[1] / "specs" / "torch_sdpa_h100.yaml")
    sugg = [Suggestion(variant_id=f"b{i}", config={"backend": i}, patch_summary="sdpa backend", round=1) for i in range(4)]
    rows, stats = CudaBackend(cache_dir=str(tmp_path)).evaluate(bound, sugg, log=print)
    assert stats.compiles == 0 and all(r.compile is None for r in rows)
    ran = [r for r in rows if r.error is None]
    assert ran and all(r.evidence == "cuda" and r.correctness.ok and r.measurements[0].p50_ms > 0 for r in ran)
    # a backend PyTorch cannot run for this shape/dtype is a row with its error, not a crash
    assert all(r.error in (None, "runtime_error") for r in rows)
