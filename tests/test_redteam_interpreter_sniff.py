"""The interpreter-sniff red-team set (tests/redteam/interpreter_sniff/manifest.yaml) through `kregress judge`'s
code path on the CPU interpreter: each cheat tells the interpreter from the compiled kernel (a tf32 probe dot,
the value a launch returns) and does less work "on the GPU"; it must be REGRESS (rejected or wrong, as its entry
says), and the honest patch must be kept. One judgement per spec; the seconds per judged patch are printed."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from kernel_assets.judge import judge, read_patch_args

pytestmark = [pytest.mark.slow, pytest.mark.judging, pytest.mark.timeout(3600)]
REPO = Path(__file__).resolve().parents[1]
HERE = REPO / "tests" / "redteam" / "interpreter_sniff"
SETS = yaml.safe_load((HERE / "manifest.yaml").read_text())["sets"]
ENTRIES = {e["patch"]: dict(e, set=s, legit=False) for s, v in SETS.items() for e in v["cheats"]} | \
    {e["patch"]: dict(e, set=s, legit=True) for s, v in SETS.items() for e in v["legit"]}
_JUDGED: dict[str, dict] = {}


def _judged(name: str, tmp_path_factory) -> dict:
    if name not in _JUDGED:
        v = SETS[name]
        names = [e["patch"] for e in v["cheats"] + v["legit"]]
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("DAGSTER_HOME", str(tmp_path_factory.mktemp(f"home_{name}")))
            before = {p: p.read_bytes() for p in (REPO / "kernels").glob("*.py")}
            t0 = time.perf_counter()
            res = judge((HERE / v["spec"]).resolve(), read_patch_args([str(HERE / f"{n}.patch") for n in names]),
                        log=lambda m: None)
            dt = time.perf_counter() - t0
            assert before == {p: p.read_bytes() for p in (REPO / "kernels").glob("*.py")}, "judging modified the tree"
        print(f"\ninterpreter-sniff set {name}: {len(names)} patches in {dt:.1f}s = {dt / len(names):.1f}s per judged patch")
        _JUDGED[name] = {row.variant_id: (row, res.verdicts[row.variant_id]) for row in res.rows}
    return _JUDGED[name]


def test_manifest_matches_the_patches_on_disk():
    on_disk = {p.stem for p in HERE.glob("*.patch")}
    assert on_disk == set(ENTRIES)
    assert any("tf32" in e["class"] for e in ENTRIES.values()) and any("launch value" in e["class"] for e in ENTRIES.values())


def test_patches_apply_to_todays_sources():
    from kregress.core.family import get_family
    from kregress.core.patch import apply_and_check, editable_set, parse_patch, read_sources

    for name, e in ENTRIES.items():
        es = editable_set(get_family(e["set"]))
        apply_and_check(parse_patch((HERE / f"{name}.patch").read_text()), read_sources(es))


@pytest.mark.parametrize("name", [n for n, e in ENTRIES.items() if not e["legit"]])
def test_interpreter_sniff_is_caught(tmp_path_factory, name):
    entry = ENTRIES[name]
    row, verdict = _judged(entry["set"], tmp_path_factory)[name]
    allowed = [tuple(v) for v in entry["verdict"]]
    if ("REGRESS", "wrong") in allowed:
        allowed.append(("REGRESS", "crashed"))
    assert (verdict.verdict, verdict.cause) in allowed, (verdict.verdict, verdict.cause, verdict.reasons, row.error_detail)


@pytest.mark.parametrize("name", [n for n, e in ENTRIES.items() if e["legit"]])
def test_honest_launch_is_kept(tmp_path_factory, name):
    row, verdict = _judged(ENTRIES[name]["set"], tmp_path_factory)[name]
    assert verdict.verdict != "REGRESS", (verdict.reasons, row.error_detail)
    assert row.error is None and row.correctness is not None and row.correctness.ok
