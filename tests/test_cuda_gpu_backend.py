"""A CUDA family through the cuda backend and the .cu patch judge on a GPU (gpu-marked; needs Dagster for
the backend resources: scripts/fetch_gpu_wheels.sh --with-dagster carries it to the lent GPU machine)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kregress.core import cuda_source

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(cuda_source.find_nvcc() is None, reason="needs nvcc (CUDA toolkit or the [cuda] extra)")]

REPO = Path(__file__).resolve().parents[1]
SPEC = REPO / "specs" / "gemm_fp8_cuda_h100.yaml"
REL = "kernels/cuda/gemm_fp8_cuda.cu"


def test_cuda_backend_checks_and_times_a_cuda_family(tmp_path):
    from kernel_assets.sweep import verdict_for
    from kregress.core.bind import load_bound
    from kregress.core.records import Suggestion
    from resources.gpu import CudaBackend

    bound = load_bound(SPEC)
    spec = bound.spec.model_copy(update={"shape_matrix": bound.spec.shape_matrix[:1]})
    bound = type(bound)(spec=spec, family=bound.family, kernel_hash=bound.kernel_hash)
    other = {"BLOCK_M": 128, "BLOCK_N": 64, "STAGES": 1, "TM": 8, "TN": 4}
    sugg = [Suggestion(variant_id=v, config=c, patch_summary="t", source="t", round=1, risk="low")
            for v, c in (("base", spec.baseline), ("other", other))]
    rows, _ = CudaBackend(cache_dir=str(tmp_path)).evaluate(bound, sugg, log=print)
    for r in rows:
        assert r.error is None, (r.variant_id, r.error, r.error_detail)
        assert r.correctness.ok and r.evidence == "cuda" and r.compile.regs_per_thread > 0
    v = verdict_for(rows[1], rows[0], spec)
    assert v.verdict in ("PASS", "REGRESS", "NEEDS_REVIEW") and "compile facts only" not in " ".join(v.reasons)


def test_cu_patches_are_checked_and_timed_on_the_gpu(tmp_path, monkeypatch):
    import yaml

    from kernel_assets.judge import PatchArg, judge
    from kregress.core.patch import unified_diff

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    data = yaml.safe_load(SPEC.read_text())
    data["shape_matrix"] = data["shape_matrix"][:1]  # one timed shape: the GPU check's time is short
    spec_path = tmp_path / SPEC.name
    spec_path.write_text(yaml.safe_dump(data))
    old = (REPO / REL).read_text()
    edits = {
        "honest": old.replace("#pragma unroll 1\n", "#pragma unroll 2\n"),
        # a wrong promotion: the B scale dropped
        "wrong": old.replace("sSA[stage][ty + i * (BLOCK_M / TM)] * sb, acc[i][j]", "sSA[stage][ty + i * (BLOCK_M / TM)], acc[i][j]"),
    }
    assert edits["wrong"] != old
    patches = [PatchArg(path=tmp_path / f"{k}.patch", text=unified_diff(REL, old, v), variant_id=k) for k, v in edits.items()]
    result = judge(spec_path, patches, backend="cuda")
    rows = {r.variant_id: r for r in result.rows}
    assert rows["honest"].error is None and rows["honest"].evidence == "cuda" and rows["honest"].correctness.ok
    assert "compile facts only" not in " ".join(result.verdicts["honest"].reasons)
    assert (result.verdicts["wrong"].verdict, result.verdicts["wrong"].cause) == ("REGRESS", "wrong")
