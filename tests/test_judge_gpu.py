"""The gate on a GPU (cuda backend): what only a GPU can check. Correctness on every timed shape, the
candidate timed beside the baseline in the same batch, correctness again after the timing loop, side
streams and replaced timers at run time, and plausibility of a measured speed-up. Skipped on CPU hosts."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kernel_assets.judge import judge, read_patch_args
from kernels.candidate import JudgeOptions, judge_patches
from kregress.core.family import get_family
from kregress.core.patch import unified_diff
from kregress.core.records import Suggestion
from kregress.core.spec import load_spec

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[1]
REDTEAM = REPO / "tests" / "redteam"
CORPUS = yaml.safe_load((REDTEAM / "corpus.yaml").read_text())
GEMM = (REPO / "kernels" / "gemm.py").read_text()
RETURN_C = "    )\n    return c\n\n\nimport sys as _sys"
LAUNCH = "    gemm_kernel[grid](\n"


@pytest.fixture(scope="module")
def gemm_corpus(tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DAGSTER_HOME", str(home))
        names = [e["patch"] for e in CORPUS["cheats"] + CORPUS["legit"] if e["patch"].startswith("gemm_")]
        res = judge(REPO / "specs" / "gemm_smoke.yaml", read_patch_args([str(REDTEAM / f"{n}.patch") for n in names]),
                    backend="cuda", log=print)
    return {r.variant_id: (r, res.verdicts[r.variant_id]) for r in res.rows}


def test_gemm_corpus_on_the_gpu(gemm_corpus):
    for e in CORPUS["cheats"]:
        if not e["patch"].startswith("gemm_"):
            continue
        row, v = gemm_corpus[e["patch"]]
        allowed = [(e["verdict"], e["cause"])] + ([tuple(e["or"])] if "or" in e else [])
        assert (v.verdict, v.cause) in allowed, (e["patch"], v.reasons)
    for e in CORPUS["legit"]:
        if not e["patch"].startswith("gemm_"):
            continue
        row, v = gemm_corpus[e["patch"]]
        assert row.correctness.ok and v.cause not in ("rejected", "wrong"), (e["patch"], v.reasons)
        assert row.evidence == "cuda" and row.batch_baseline, "timed beside the baseline in the same batch"
        assert {m.batch for m in row.measurements} == {m.batch for m in row.batch_baseline}
        assert "1024x1024x1024" in row.correctness.shapes_checked  # the timed shape is checked too


def _sugg(name: str, patch: str, spec) -> Suggestion:
    return Suggestion(variant_id=name, config=spec.baseline, patch_summary=name, round=1, source="test", patch=patch)


def test_runtime_checks_without_the_static_gate(tmp_path):
    """Side streams, replaced timers and state that changes behaviour after the checks, each caught at
    run time with the static policy off."""
    spec = load_spec(REPO / "specs" / "gemm_smoke.yaml")
    late = GEMM.replace(RETURN_C, RETURN_C.replace(
        "    return c\n", "    matmul.calls = getattr(matmul, 'calls', 0) + 1\n    if matmul.calls > 40:\n"
                         "        return torch.empty_like(c)\n    return c\n"), 1)
    sugg = [_sugg(n, (REDTEAM / f"{n}.patch").read_text(), spec) for n in ("gemm_cheat_side_stream", "gemm_cheat_timer_patch")]
    sugg.append(_sugg("late_cheat", unified_diff("kernels/gemm.py", GEMM, late), spec))
    res = {r.variant_id: (r, rep) for r, rep in judge_patches(spec, get_family("gemm"), sugg, backend="cuda",
                                                               cache_root=tmp_path, timeout_s=300, log=print,
                                                               options=JudgeOptions(static=False))}
    row, _ = res["gemm_cheat_timer_patch"]
    assert row.error == "patch_rejected" and "do_bench was replaced" in row.error_detail
    row, _ = res["late_cheat"]
    assert row.error in ("numeric_mismatch", "nan_inf") and "after the timing loop" in row.error_detail
    row, rep = res["gemm_cheat_side_stream"]
    # work left on a side stream: read before it finishes, timed as if free, or both
    from kernel_assets.judge import verdict_with_gate

    base = row.model_copy(update={"measurements": row.batch_baseline, "gate": None, "patch": None})
    v = verdict_with_gate(row, base, spec, get_family("gemm"))
    assert v.verdict != "PASS" and (v.cause in ("wrong", "rejected", "implausible")), (v.reasons, row.error_detail)


def test_a_speedup_beyond_the_factor_is_implausible(tmp_path, monkeypatch):
    """A patch that ignores the tile config for a much larger tile is correct and much faster than a
    deliberately slow baseline: NEEDS_REVIEW implausible, never PASS."""
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    spec_file = tmp_path / "slow.yaml"
    spec_file.write_text(yaml.safe_dump({
        "task_id": "gemm_slow_baseline", "kernel_family": "gemm", "dtype": "fp16",
        "shape_matrix": [{"M": 4096, "N": 4096, "K": 4096}], "correctness_shapes": [{"M": 67, "N": 45, "K": 33}],
        "baseline": {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 1, "num_stages": 1, "num_warps": 2},
        "benchmark": {"timeout_s": 300}}))
    big = GEMM.replace('BLOCK_M=config["BLOCK_M"], BLOCK_N=config["BLOCK_N"], BLOCK_K=config["BLOCK_K"], GROUP_M=config["GROUP_M"],\n'
                       '        num_warps=config["num_warps"], num_stages=config["num_stages"],',
                       'BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8,\n        num_warps=8, num_stages=3,', 1)
    big = big.replace('grid = lambda META: (triton.cdiv(M, META["BLOCK_M"]) * triton.cdiv(N, META["BLOCK_N"]),)',
                      'grid = lambda META: (triton.cdiv(M, 128) * triton.cdiv(N, 128),)', 1)
    patch = tmp_path / "big_tiles.patch"
    patch.write_text(unified_diff("kernels/gemm.py", GEMM, big))
    res = judge(spec_file, read_patch_args([str(patch)]), backend="cuda", log=print)
    v = res.verdicts["big_tiles"]
    assert (v.verdict, v.cause) == ("NEEDS_REVIEW", "implausible"), v.reasons
