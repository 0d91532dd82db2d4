"""Review hand-off: `kregress review --patch VARIANT_ID` reviews a patch `kregress judge` judged, as it
reviews a git diff, with the judgement's verdict and compile statistics as facts."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernel_assets.cli import build_parser
from kernel_assets.judge import judge, read_patch_args
from kernel_assets.review import ReviewError, run_review
from kregress.core.spec import load_spec

REPO = Path(__file__).resolve().parents[1]
REDTEAM = REPO / "tests" / "redteam"


def test_review_takes_a_judged_patch_by_variant_id(tmp_path, monkeypatch):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    res = judge(REPO / "specs" / "gemm_smoke.yaml", read_patch_args([str(REDTEAM / "gemm_legit_acc_plus_dot.patch"),
                                                                       str(REDTEAM / "gemm_legit_even_k.patch")]),
                log=lambda m: None)
    assert res.verdicts["gemm_legit_acc_plus_dot"].verdict == "NEEDS_REVIEW"
    spec = load_spec(REPO / "specs" / "gemm_smoke.yaml")
    r = run_review(spec, patch_variant="gemm_legit_acc_plus_dot", no_model_reason="offline test", home=tmp_path)
    assert r.files_reviewed == ["kernels/gemm.py"]
    assert r.base_ref == "judged patch gemm_legit_acc_plus_dot"
    assert any(n.startswith("judged patch gemm_legit_acc_plus_dot (sha256 ") for n in r.notes)
    assert any("registers/thread" in n for n in r.notes)
    text = Path(r.report_path).read_text()
    assert "acc += tl.dot(a, b)" in text or "kernels/gemm.py" in text
    # the compile needs no GPU: base (the working tree) and new (with the patch) are both compiled and compared
    assert r.compile is not None and r.compile.base.ok and r.compile.new.ok, r.compile
    assert r.compile.new.label.startswith("new (working tree + the judged patch)")
    assert any(row["metric"] == "regs_per_thread" for row in r.compile.rows)
    assert "not compiled" not in text.split("## Compile statistics")[1].split("##")[0]
    # a patch that adds a constexpr its wrapper passes: the family's compile units cannot compile it alone, so the
    # judgement's own compile figures stand for the new side (said so), beside the working tree's compile
    even = run_review(spec, patch_variant="gemm_legit_even_k", no_model_reason="offline test", home=tmp_path)
    assert even.compile is not None and even.compile.base.ok and even.compile.new.ok
    if even.compile.new.label.startswith("new (the judged patch, as judgement"):
        assert "these are the judgement's own compile figures" in even.compile.new.note
        assert not [r for r in even.compile.rows if r["metric"].startswith("sass.")]
    assert any(row["metric"] == "regs_per_thread" for row in even.compile.rows)
    with pytest.raises(ReviewError, match="no judged patch 'nope'"):
        run_review(spec, patch_variant="nope", no_model_reason="offline test", home=tmp_path)
    # a judged patch edited afterwards is refused
    (res.report_dir / "patches" / "gemm_legit_acc_plus_dot.patch").write_text("changed\n")
    with pytest.raises(ReviewError, match="changed since it was judged"):
        run_review(spec, patch_variant="gemm_legit_acc_plus_dot", no_model_reason="offline test", home=tmp_path)


def test_cli_review_has_the_patch_option():
    args = build_parser(["review", "specs/gemm_smoke.yaml", "--patch", "v1", "--offline"]).parse_args(
        ["review", "specs/gemm_smoke.yaml", "--patch", "v1", "--offline"])
    assert args.patch == "v1" and args.offline
