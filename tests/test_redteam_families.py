"""The per-family red-team sets (tests/redteam/families/manifest.yaml) through `kregress judge`'s code path on
the CPU interpreter: for every built-in Triton family (gemm, gemm_fp8, grouped_gemm_fp8 contiguous and masked,
mla_decode with bf16 and FP8 KV, attention) at least 8 cheats and 3 legitimate patches. Each set is judged in
ONE judgement (one baseline and one set of secret cases shared by the set); every cheat must get its entry's
verdict and cause (never PASS), every legitimate patch must be correct and not REGRESS. An entry with
``xfail_reason`` is a known miss of today's gate: it is xfailed strictly, so the fix shows as a failure until
the line is removed (``flaky: true``: a miss that depends on the judgement's random draw, e.g. program sampling). The seconds per judged patch are printed (pytest -s)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from kernel_assets.judge import judge, read_patch_args

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]
REPO = Path(__file__).resolve().parents[1]
FAMILIES = REPO / "tests" / "redteam" / "families"
MANIFEST = yaml.safe_load((FAMILIES / "manifest.yaml").read_text())
SETS = MANIFEST["sets"]
ENTRIES = {e["patch"]: dict(e, set=s, legit=False) for s, v in SETS.items() for e in v["cheats"]} | \
    {e["patch"]: dict(e, set=s, legit=True) for s, v in SETS.items() for e in v["legit"]}
CHEATS = [e["patch"] for v in SETS.values() for e in v["cheats"]]
LEGIT = [e["patch"] for v in SETS.values() for e in v["legit"]]
_JUDGED: dict[str, dict] = {}


def _judged_set(name: str, tmp_path_factory) -> dict:
    """One judgement of set ``name`` (cached for the module): patch -> (row, verdict)."""
    if name not in _JUDGED:
        v = SETS[name]
        names = [e["patch"] for e in v["cheats"] + v["legit"]]
        home = tmp_path_factory.mktemp(f"home_{name}")
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("DAGSTER_HOME", str(home))
            before = {p: p.read_bytes() for p in (REPO / "kernels").glob("*.py")}
            t0 = time.perf_counter()
            res = judge(FAMILIES / v["spec"], read_patch_args([str(FAMILIES / name / f"{n}.patch") for n in names]),
                        log=lambda m: None)
            dt = time.perf_counter() - t0
            assert before == {p: p.read_bytes() for p in (REPO / "kernels").glob("*.py")}, "judging modified the tree"
        print(f"\nred-team set {name}: {len(names)} patches in {dt:.1f}s = {dt / len(names):.1f}s per judged patch")
        _JUDGED[name] = {row.variant_id: (row, res.verdicts[row.variant_id]) for row in res.rows}
    return _JUDGED[name]


def _maybe_xfail(entry: dict, ok: bool, why: str) -> None:
    if "xfail_reason" in entry:
        if ok and entry.get("flaky"):
            return  # caught in this judgement (sampling found it): nothing to report
        if ok:
            pytest.fail(f"{entry['patch']} now gets the right verdict: remove its xfail_reason ({entry['xfail_reason']})")
        pytest.xfail(f"{entry['xfail_reason']} (today: {why})")


def test_sets_cover_every_family_and_class():
    assert set(SETS) == {"gemm", "gemm_fp8", "grouped_contiguous", "grouped_masked", "mla_bf16", "mla_fp8", "attention"}
    for name, v in SETS.items():
        assert len(v["cheats"]) >= 8 and len(v["legit"]) >= 3, name
        assert (FAMILIES / v["spec"]).is_file(), v["spec"]
        on_disk = {p.stem for p in (FAMILIES / name).glob("*.patch")}
        assert on_disk == {e["patch"] for e in v["cheats"] + v["legit"]}, name
    assert len(ENTRIES) == len(CHEATS) + len(LEGIT)
    classes = " ".join(e["class"] for e in ENTRIES.values())
    for needle in ("writes nothing", "KV-head map", "causal mask dropped", "expert 0's masked_m", "skips K past",
                   "one program of 8", "past masked_m", "padding rows", "mutates a read-only input", "precision",
                   "bf16", "drops the per", "splits handled wrong", "page table", "alias", "repr()", "device sniffing",
                   "second accumulator", "scale order", "loop restructure", "different but correct masking",
                   "exact dequantization"):
        assert needle in classes, needle


def test_patches_apply_to_todays_sources():
    from kregress.core.family import get_family
    from kregress.core.patch import apply_and_check, editable_set, parse_patch, read_sources

    fam_of = {"gemm": "gemm", "gemm_fp8": "gemm_fp8", "grouped_contiguous": "grouped_gemm_fp8",
              "grouped_masked": "grouped_gemm_fp8", "mla_bf16": "mla_decode", "mla_fp8": "mla_decode", "attention": "attention"}
    for name, e in ENTRIES.items():
        es = editable_set(get_family(fam_of[e["set"]]))
        apply_and_check(parse_patch((FAMILIES / e["set"] / f"{name}.patch").read_text()), read_sources(es))


@pytest.mark.parametrize("name", CHEATS)
def test_cheat_is_caught_with_its_cause(tmp_path_factory, name):
    entry = ENTRIES[name]
    row, verdict = _judged_set(entry["set"], tmp_path_factory)[name]
    allowed = [(entry["verdict"], entry["cause"])] + ([tuple(entry["or"])] if "or" in entry else [])
    if ("REGRESS", "wrong") in allowed:  # a cheat whose child dies or raises is caught as surely
        allowed.append(("REGRESS", "crashed"))
    got = (verdict.verdict, verdict.cause)
    why = f"{got}: {(verdict.reasons or [''])[0][:300]}"
    _maybe_xfail(entry, got in allowed, why)
    assert got in allowed, (verdict.reasons, row.error_detail)
    assert verdict.verdict != "PASS"


@pytest.mark.parametrize("name", LEGIT)
def test_legitimate_patch_is_kept(tmp_path_factory, name):
    entry = ENTRIES[name]
    row, verdict = _judged_set(entry["set"], tmp_path_factory)[name]
    ok = verdict.verdict != "REGRESS" and row.error is None and row.correctness is not None and row.correctness.ok
    _maybe_xfail(entry, ok, f"{verdict.verdict} {verdict.cause}: {(verdict.reasons or [''])[0][:300]}")
    assert verdict.verdict != "REGRESS", (verdict.reasons, row.error_detail)
    assert row.error is None and row.correctness is not None and row.correctness.ok


@pytest.mark.parametrize("name", sorted(SETS))
def test_the_baseline_passes_every_wider_case(tmp_path_factory, name):
    """The wider cases (launches past every timed grid: a kernel that maps or skips the program ids past a count)
    hold only where the baseline itself passes them; a wider case dropped for the baseline's own sake is a check
    that silently does not run. The class: every family's wider shapes keep work in every sampled program (a
    reduction cut to 1 left MLA's causal rows with no key to read, so its sampled programs wrote nothing and the
    case was dropped on every draw)."""
    rows = _judged_set(name, tmp_path_factory)
    dropped = next(iter(rows.values()))[0].gate.cases_dropped
    wider = [d for d in dropped if d.startswith("wider") and "a full run would take" not in d]
    assert not wider, wider
