"""The GPU stage of the CUDA patch judge on a real GPU (gpu-marked: skipped on a CPU host): every timed
shape, the hidden and structure cases with NaN-poisoned outputs, in a bwrap-confined child with no
network. A kernel wrong only at the timed K (K >= 2048), one that leaves an output tile unwritten, and an
honest edit, judged through the API beneath ``kregress judge``. What a CPU host can check of the same
stage (the case list, the child's command line, the child starting confined) is in tests/test_cuda_confine.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernels.cuda import confine
from kregress.core import cuda_source

pytestmark = [pytest.mark.gpu, pytest.mark.slow,
              pytest.mark.skipif(cuda_source.find_nvcc() is None, reason="needs nvcc (CUDA toolkit or the [cuda] extra)"),
              pytest.mark.skipif(confine.problem() is not None, reason="needs bubblewrap (apt-get install bubblewrap)")]

REPO = Path(__file__).resolve().parents[1]
SPEC = REPO / "specs" / "gemm_fp8_cuda_h100.yaml"
REL = "kernels/cuda/gemm_fp8_cuda.cu"
LOOP = "    for (int kb = 0; kb < kslabs; ++kb) {\n"
STORE = "            if (n < N) C[static_cast<size_t>(m) * N + n] = __float2bfloat16(acc[i][j]);\n"


@pytest.fixture(scope="module")
def judged(tmp_path_factory):
    import yaml

    from kernel_assets.judge import PatchArg, judge
    from kregress.core.patch import unified_diff

    tmp = tmp_path_factory.mktemp("cuda_gpu_stage")
    mp = pytest.MonkeyPatch()
    mp.setenv("DAGSTER_HOME", str(tmp))
    data = yaml.safe_load(SPEC.read_text())
    data["shape_matrix"] = data["shape_matrix"][:1]  # 128 x 7168 x 2048: the timed K is 2048
    spec_path = tmp / SPEC.name
    spec_path.write_text(yaml.safe_dump(data))
    old = (REPO / REL).read_text()
    assert LOOP in old and STORE in old
    edits = {
        "honest": old.replace("#pragma unroll 1\n", "#pragma unroll 2\n"),
        "wrong_at_timed_k": old.replace(LOOP, LOOP + "        if (K >= 2048 && kb == kslabs - 1) break;\n"),
        "unwritten_tail": old.replace(STORE, STORE.replace("if (n < N)", "if (n < N && n < 7000)")),
    }
    patches = [PatchArg(path=tmp / f"{k}.patch", text=unified_diff(REL, old, v), variant_id=k) for k, v in edits.items()]
    try:
        yield judge(spec_path, patches, backend="cuda")
    finally:
        mp.undo()


def test_wrong_only_at_the_timed_k_is_regress_wrong(judged):
    v = judged.verdicts["wrong_at_timed_k"]
    assert (v.verdict, v.cause) == ("REGRESS", "wrong"), v.reasons


def test_an_unwritten_output_tile_is_caught_by_the_poison(judged):
    v = judged.verdicts["unwritten_tail"]
    assert (v.verdict, v.cause) == ("REGRESS", "wrong"), v.reasons


def test_honest_edit_is_checked_on_every_case_and_timed(judged):
    rows = {r.variant_id: r for r in judged.rows}
    r = rows["honest"]
    assert r.error is None and r.evidence == "cuda" and r.correctness.ok, (r.error, r.error_detail)
    from kernels.cuda.gemm_fp8_cuda import FAMILY

    notes = " ".join(r.gate.notes)
    assert "timed " + FAMILY.shape_label({"M": 128, "N": 7168, "K": 2048}) in notes  # the timed shape itself is checked
    assert r.gate.cases >= 7
    assert any(h.startswith("past_timed") for h in r.gate.hidden_shapes)
    assert r.measurements and r.batch_baseline
