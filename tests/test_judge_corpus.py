"""The red-team corpus (tests/redteam/corpus.yaml) through `kregress judge`'s code path on the CPU
interpreter: every cheat is REGRESS or NEEDS_REVIEW with its cause, every legitimate patch is correct and
not REGRESS. One judgement per family: one sandbox zygote, the secret cases made once, the candidates
judged side by side; the seconds per judged patch are printed (pytest -s)."""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from kernel_assets.judge import judge, read_patch_args

REPO = Path(__file__).resolve().parents[1]
REDTEAM = REPO / "tests" / "redteam"
CORPUS = yaml.safe_load((REDTEAM / "corpus.yaml").read_text())
ENTRIES = {e["patch"]: dict(e, legit=False) for e in CORPUS["cheats"]} | {e["patch"]: dict(e, legit=True) for e in CORPUS["legit"]}


def _family(name: str) -> str:
    return next(f for f in CORPUS["specs"] if name.startswith(f + "_"))


@pytest.fixture(scope="module")
def judged(tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DAGSTER_HOME", str(home))
        out, timing = {}, {}
        before = {p: p.read_bytes() for p in (REPO / "kernels").glob("*.py")}
        for fam, spec in CORPUS["specs"].items():
            names = [n for n in ENTRIES if _family(n) == fam]
            t0 = time.perf_counter()
            res = judge(REPO / spec, read_patch_args([str(REDTEAM / f"{n}.patch") for n in names]), log=lambda m: None)
            timing[fam] = (time.perf_counter() - t0, len(names))
            for row in res.rows:
                out[row.variant_id] = (row, res.verdicts[row.variant_id], res.report_dir)
        after = {p: p.read_bytes() for p in (REPO / "kernels").glob("*.py")}
        assert before == after, "judging modified the working tree"
    total = sum(t for t, _ in timing.values())
    n = sum(k for _, k in timing.values())
    print(f"\nred-team corpus: {n} patches judged in {total:.1f}s = {total / n:.2f}s per judged patch "
          f"({', '.join(f'{f}: {t:.1f}s/{k}' for f, (t, k) in timing.items())})")
    return out


@pytest.mark.parametrize("name", [e["patch"] for e in CORPUS["cheats"]])
def test_cheat_is_caught_with_its_cause(judged, name):
    row, verdict, _ = judged[name]
    want = ENTRIES[name]
    allowed = [(want["verdict"], want["cause"])] + ([tuple(want["or"])] if "or" in want else [])
    assert (verdict.verdict, verdict.cause) in allowed, (verdict.reasons, row.error_detail)
    assert verdict.verdict != "PASS"


@pytest.mark.parametrize("name", [e["patch"] for e in CORPUS["legit"]])
def test_legitimate_patch_is_correct_and_not_regress(judged, name):
    row, verdict, _ = judged[name]
    assert verdict.verdict != "REGRESS", (verdict.reasons, row.error_detail)
    assert row.error is None and row.correctness is not None and row.correctness.ok
    gate = row.gate
    assert gate.round_trip_ok and gate.seeds >= 3 and len(gate.distributions) == 4
    assert gate.cases >= 8 and len(gate.hidden_shapes) >= 3
    assert row.compile is not None and row.compile.regs_per_thread > 0  # the patched kernel, AOT-compiled for sm_90


def test_every_issue_class_is_covered():
    classes = " ".join(e["class"] for e in CORPUS["cheats"])
    for needle in ("torch", "reference", "try/except", "never writes", "mutates its inputs", "shapes shown", "caches",
                   "do_bench", "side stream", "thread", "frame", "sniffs", "precision"):
        assert needle in classes, needle
    assert len(CORPUS["cheats"]) >= 15 and len(CORPUS["legit"]) >= 5
    assert {_family(e["patch"]) for e in CORPUS["cheats"]} == {"gemm", "attention"}


def test_even_k_compiles_with_the_new_constexpr_from_the_launch(judged):
    row, _, _ = judged["gemm_legit_even_k"]
    assert any("EVEN_K=True taken from the wrapper launch" in n for n in row.gate.notes), row.gate.notes


def test_reports_carry_verdicts_causes_hashes_and_diffs(judged):
    row, verdict, report_dir = judged["gemm_cheat_torch_matmul"]
    df = pd.read_parquet(report_dir / "verdicts.parquet")
    rec = df[df["variant_id"] == "gemm_cheat_torch_matmul"].iloc[0]
    assert (rec["verdict"], rec["cause"]) == ("REGRESS", "rejected")
    assert rec["patch_sha256"] == row.patch_sha256 and len(rec["patch_sha256"]) == 64
    md = (report_dir / "report.md").read_text()
    assert "### gemm_cheat_torch_matmul: REGRESS rejected" in md
    assert "+    return (a.float() @ b.float()).to(a.dtype)" in md
    from kregress.core.patch import apply_file, parse_patch

    fp = parse_patch(row.patch).files[0]
    apply_file((REPO / "kernels" / "gemm.py").read_text(), fp)  # findings name the line where the hunk applied
    line = next(n for h in fp.hunks for n, t in h.added_new_lines() if "@" in t)
    assert f"kernels/gemm.py:{line}: [torch_compute]" in md
    assert (report_dir / "patches" / "gemm_cheat_torch_matmul.patch").read_text() == \
        (REDTEAM / "gemm_cheat_torch_matmul.patch").read_text()
