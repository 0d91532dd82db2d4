"""A compile-only CUDA sweep's report says what it rests on (issue 54 item 5): compile facts, nothing run, timed or
estimated; never "replay batch(es): recorded data", "evidence None" or "recorded runs are not re-checked". The rows
are the backend's own (the baseline compiled by nvcc; a config over the static shared-memory limit refused before
nvcc), their verdicts the sweep's rule, and report.md is written by the sweep's ``write_report``."""

from __future__ import annotations

from pathlib import Path

import pytest

from kregress.core.cuda_source import find_nvcc

pytestmark = pytest.mark.skipif(find_nvcc() is None, reason="no nvcc on this host: a CUDA spec does not bind here")

REPO = Path(__file__).resolve().parents[1]
SPEC = REPO / "specs" / "gemm_fp8_cuda_h100.yaml"


def test_compile_only_report_says_compile_facts(tmp_path):
    from kernel_assets.report import evidence_of, write_report
    from kernel_assets.sweep import RoundState, verdict_for
    from kregress.core.bind import load_bound
    from kregress.core.records import Suggestion
    from resources.gpu import InterpreterBackend

    bound = load_bound(SPEC)
    spec, fam = bound.spec, bound.family
    sugg = [Suggestion(variant_id="baseline", config=spec.baseline, patch_summary="baseline", source="baseline", round=0,
                       risk="low"),
            Suggestion(variant_id="r1-deep", config={**spec.baseline, "STAGES": 4}, patch_summary="t", source="local",
                       round=1, risk="low")]
    rows, stats = InterpreterBackend(cache_dir=str(tmp_path / "cache"), workers=1).evaluate(bound, sugg, log=lambda _m: None)
    assert stats.compiles == 1  # the baseline only: the deep pipeline is refused before nvcc
    assert evidence_of(rows) == "compile"
    verdicts = {r.variant_id: verdict_for(r, rows[0], spec) for r in rows[1:]}
    state = RoundState(round=1, history=rows, objective={}, best_id="baseline", best_value=None, stopped="max_rounds reached (1)")
    res = write_report(tmp_path / "out", spec, str(SPEC), state, verdicts, list(fam.space.params), family=fam)
    md = (tmp_path / "out" / "report.md").read_text()

    assert res["evidence"] == "compile"
    assert "**Evidence: compile facts only.**" in md and f"compiled by nvcc for {spec.hardware.arch}" in md
    assert "no latency was estimated" in md
    assert "- devices: none: nothing was run or timed (compile facts only)" in md
    assert "- batches: none (nothing was timed)" in md
    assert "evidence compile facts only (nothing run or timed)" in md  # the baseline's line
    assert "nothing ran on this host (compile facts only)" in md  # the tolerance section
    assert "104 regs/thread, 0 B spills, 37376 B shared memory" in md  # ptxas's facts of the baseline
    assert "| r1-deep |" in md and "74752 B > 49152 B" in md  # refused before nvcc, with the formula's figure
    for false in ("replay batch", "recorded data", "evidence None", "none baseline", "as recorded in the file",
                  "recorded runs are not re-checked"):
        assert false not in md, false
