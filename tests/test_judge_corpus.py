"""The red-team corpora (tests/redteam/corpus.yaml and the independent set, tests/redteam/independent/)
through `kregress judge`'s code path on the CPU interpreter: every cheat is REGRESS or NEEDS_REVIEW with its
cause, every legitimate patch is correct and not REGRESS, and a cheat only a GPU can see is never PASS. One
judgement per family for both corpora together: one sandbox zygote, the secret cases made once, the
candidates judged side by side; the seconds per judged patch are printed (pytest -s)."""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from kernel_assets.judge import judge, read_patch_args

# One judgement of ~105 patches (about 12 s each on a 2-core CPU host: full-size sampled launches in the
# interpreter) happens in the module fixture, which pytest-timeout counts against the first test.
pytestmark = pytest.mark.timeout(3600)
REPO = Path(__file__).resolve().parents[1]
REDTEAM = REPO / "tests" / "redteam"
CORPUS = yaml.safe_load((REDTEAM / "corpus.yaml").read_text())
INDEPENDENT = yaml.safe_load((REDTEAM / "independent" / "corpus.yaml").read_text())
CORPORA = ((CORPUS, REDTEAM), (INDEPENDENT, REDTEAM / "independent"))
SPECS = {fam: spec for corpus, _ in CORPORA for fam, spec in corpus["specs"].items()}
ENTRIES = {e["patch"]: dict(e, legit=False, gpu_only=False, dir=d) for c, d in CORPORA for e in c["cheats"]} | \
    {e["patch"]: dict(e, legit=False, gpu_only=True, dir=d) for c, d in CORPORA for e in c.get("gpu_only", [])} | \
    {e["patch"]: dict(e, legit=True, gpu_only=False, dir=d) for c, d in CORPORA for e in c["legit"]}
CHEATS = [e["patch"] for c, _ in CORPORA for e in c["cheats"]]
LEGIT = [e["patch"] for c, _ in CORPORA for e in c["legit"]]
GPU_ONLY = [e["patch"] for c, _ in CORPORA for e in c.get("gpu_only", [])]


def _family(name: str) -> str:
    return next(f for f in SPECS if name.startswith(f + "_"))


@pytest.fixture(scope="module")
def judged(tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DAGSTER_HOME", str(home))
        out, timing = {}, {}
        before = {p: p.read_bytes() for p in (REPO / "kernels").glob("*.py")}
        for fam, spec in SPECS.items():
            names = [n for n in ENTRIES if _family(n) == fam]
            t0 = time.perf_counter()
            res = judge(REPO / spec, read_patch_args([str(ENTRIES[n]["dir"] / f"{n}.patch") for n in names]), log=lambda m: None)
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


def test_corpus_names_are_unique():
    names = [e["patch"] for c, _ in CORPORA for key in ("cheats", "gpu_only", "legit") for e in c.get(key, [])]
    assert len(names) == len(set(names))
    assert all((ENTRIES[n]["dir"] / f"{n}.patch").is_file() for n in names)


@pytest.mark.parametrize("name", CHEATS)
def test_cheat_is_caught_with_its_cause(judged, name):
    row, verdict, _ = judged[name]
    want = ENTRIES[name]
    allowed = [(want["verdict"], want["cause"])] + ([tuple(want["or"])] if "or" in want else [])
    assert (verdict.verdict, verdict.cause) in allowed, (verdict.reasons, row.error_detail)
    assert verdict.verdict != "PASS"


@pytest.mark.parametrize("name", GPU_ONLY)
def test_gpu_only_cheat_is_never_pass_on_the_interpreter(judged, name):
    """The trick works under the interpreter (the kernel does what it is asked there), so the CPU verdict
    cannot name it; it is still never PASS (latency from the model is NEEDS_REVIEW), and a GPU judgement
    must give the entry's verdict (tests/test_judge_gpu.py)."""
    row, verdict, _ = judged[name]
    allowed = [tuple(x) for x in ENTRIES[name]["cpu"]]
    assert (verdict.verdict, verdict.cause) in allowed, (verdict.reasons, row.error_detail)
    assert verdict.verdict != "PASS"


@pytest.mark.parametrize("name", LEGIT)
def test_legitimate_patch_is_correct_and_not_regress(judged, name):
    row, verdict, _ = judged[name]
    assert verdict.verdict != "REGRESS", (verdict.reasons, row.error_detail)
    assert row.error is None and row.correctness is not None and row.correctness.ok
    gate = row.gate
    assert gate.round_trip_ok and gate.seeds >= 3 and len(gate.distributions) == 4
    assert gate.cases >= 8 and len(gate.hidden_shapes) >= 3
    assert row.compile is not None and row.compile.regs_per_thread > 0  # the patched kernel, AOT-compiled for sm_90


def test_the_independent_set_reaches_every_layer(judged):
    """The independent cheats are refused statically, at run time in the sandbox, as wrong on the secret,
    hidden or timed shapes (sampled programs, every program of the timed grid), for precision and for the
    compiled launch: each layer of the gate catches some, and the timed shape is checked on the CPU."""
    causes = {judged[e["patch"]][1].cause for e in INDEPENDENT["cheats"]}
    assert {"rejected", "wrong", "infeasible"} <= causes
    # the precision layer: a precision cheat's error against the calibrated tolerance depends on the secret
    # draw, so in some judgements every one of them is caught as wrong (the stronger verdict, which their
    # entries allow); otherwise at least one is NEEDS_REVIEW for precision (seen: a run with all five wrong)
    imprecise = [e["patch"] for e in INDEPENDENT["cheats"] if "precision" in (e["cause"], *e.get("or", ()))]
    assert len(imprecise) >= 3
    got = {n: (judged[n][1].verdict, judged[n][1].cause) for n in imprecise}
    assert "precision" in causes or all(v == ("REGRESS", "wrong") for v in got.values()), got
    details = " ".join(judged[e["patch"]][0].error_detail or "" for e in INDEPENDENT["cheats"])
    # (the timed shape itself is checked below through the notes of a legitimate patch: since the hidden case
    # past the timed K, the cheats that skip work past a length are caught there first, not on the timed shape)
    for layer in ("sandbox:", "(full run)"):
        assert layer in details, (layer, {e["patch"]: (judged[e["patch"]][1].cause, (judged[e["patch"]][0].error_detail or "")[:120])
                                          for e in INDEPENDENT["cheats"]})
    assert len(INDEPENDENT["cheats"]) + len(INDEPENDENT["gpu_only"]) >= 30 and len(INDEPENDENT["legit"]) >= 10
    row, _, _ = judged["gemm_legit_even_k"]  # the baseline's grid: its sampled programs compare one by one
    assert any(n.startswith("sampled 1024x1024x1024") and "to settle" not in n for n in row.gate.notes), row.gate.notes
    row, verdict, _ = judged["gemm_legit_persistent"]  # another grid: settled by a full run, and kept
    assert any(n.startswith("sampled 1024x1024x1024") and "not comparable program by program" in n
               for n in row.gate.notes), row.gate.notes
    assert verdict.verdict != "REGRESS" and row.correctness is not None and row.correctness.ok


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
    from kregress.core.family import get_family
    from kregress.core.patch import apply_and_check, editable_set, parse_patch, read_sources

    patch = parse_patch(row.patch)
    apply_and_check(patch, read_sources(editable_set(get_family("gemm"))))  # the lines where the hunks apply today
    line = next(n for h in patch.files[0].hunks for n, t in h.added_new_lines() if "@" in t)
    assert f"kernels/gemm.py:{line}: [torch_compute]" in md
    assert (report_dir / "patches" / "gemm_cheat_torch_matmul.patch").read_text() == \
        (REDTEAM / "gemm_cheat_torch_matmul.patch").read_text()
