"""One cheat per stage of the patch gate, in the default test tier (the red-team corpora, which judge every
cheat of every family, are the long tier: `pytest -n 2 -m long`).

Two judgements of the small GEMM spec on the CPU interpreter, nothing mocked:
- through `kregress judge`'s own function (static policy on): the static stage (a torch call: REGRESS
  rejected), the correctness stage (a kernel right only on the shapes shown: REGRESS wrong), the precision
  stage (a bf16 output within tolerance: NEEDS_REVIEW precision); a legitimate patch is kept in
  tests/test_judge_cli.py, also in the default tier;
- with the static policy off, as only a test can: the sandbox (a socket from the candidate's code is
  refused at run time) and the run-time audit (a torch matmul is seen as the aten op it runs).
The plausibility stage needs measured times (a GPU): its unit test is `test_check_plausibility` in
tests/test_gate_checks.py, and tests/test_judge_gpu.py judges it on a GPU."""

from __future__ import annotations

from pathlib import Path

import pytest

# slow (two judgements on the interpreter), but not `judging`: this module is the default tier's share of the gate
pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
REDTEAM = REPO / "tests" / "redteam"
SPEC = REPO / "specs" / "gemm_smoke.yaml"

# stage -> (patch, verdict, cause)
STAGES = {
    "static": ("gemm_cheat_torch_matmul", "REGRESS", "rejected"),
    "correctness": ("gemm_cheat_skip_k_tail", "REGRESS", "wrong"),
    "precision": ("gemm_cheat_precision_bf16_out", "NEEDS_REVIEW", "precision"),
}


@pytest.fixture(scope="module")
def judged(tmp_path_factory):
    from kernel_assets.judge import judge, read_patch_args

    names = [p for p, _, _ in STAGES.values()]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DAGSTER_HOME", str(tmp_path_factory.mktemp("home")))
        res = judge(SPEC, read_patch_args([str(REDTEAM / f"{n}.patch") for n in names]), log=lambda m: None)
    return {row.variant_id: (row, res.verdicts[row.variant_id]) for row in res.rows}


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_one_cheat_per_stage_gets_its_verdict_and_cause(judged, stage):
    name, verdict, cause = STAGES[stage]
    row, v = judged[name]
    allowed = [(verdict, cause)] + ([("REGRESS", "crashed")] if cause == "wrong" else [])  # a child that dies is caught too
    assert (v.verdict, v.cause) in allowed, (stage, v.verdict, v.cause, row.error, row.error_detail)


@pytest.fixture(scope="module")
def judged_without_static(tmp_path_factory):
    from kernels.candidate import JudgeOptions, judge_patches
    from kregress.core.family import get_family
    from kregress.core.patch import unified_diff
    from kregress.core.records import Suggestion
    from kregress.core.spec import load_spec

    spec = load_spec(SPEC)
    gemm = (REPO / "kernels" / "gemm.py").read_text()
    ret = "    )\n    return c\n\n\nimport sys as _sys"
    assert ret in gemm, "kernels/gemm.py's launch wrapper no longer ends as this test expects: update `ret`"
    code = "    import socket\n    socket.create_connection(('1.1.1.1', 80), timeout=2)\n"
    escape = unified_diff("kernels/gemm.py", gemm, gemm.replace(ret, ret.replace("    return c\n", code + "    return c\n"), 1))
    sugg = [Suggestion(variant_id="escape_socket", config=spec.baseline, patch_summary="socket", round=1, source="test",
                       patch=escape),
            Suggestion(variant_id="torch_matmul", config=spec.baseline, patch_summary="torch", round=1, source="test",
                       patch=(REDTEAM / "gemm_cheat_torch_matmul.patch").read_text())]
    res = judge_patches(spec, get_family("gemm"), sugg, backend="interpreter", cache_root=tmp_path_factory.mktemp("cache"),
                        timeout_s=45, log=lambda m: None, options=JudgeOptions(static=False))
    return {row.variant_id: row for row, _ in res}


def test_the_sandbox_refuses_a_socket(judged_without_static):
    row = judged_without_static["escape_socket"]
    assert row.error == "patch_rejected", (row.error, row.error_detail)
    assert "socket." in row.error_detail or "by the candidate's code" in row.error_detail, row.error_detail


def test_the_runtime_audit_sees_a_torch_matmul(judged_without_static):
    row = judged_without_static["torch_matmul"]
    assert row.error == "patch_rejected" and "aten.mm" in row.error_detail, (row.error, row.error_detail)
