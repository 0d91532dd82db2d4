"""A sample of bench/mutants.py's guarded (conditional) mutants judged through `kregress judge`'s code path, so the
tool cannot rot: one judgement per key of one mutant per condition class (size, programs, structure, interpreter),
the survivors run through the independent equivalence check (their forced twins), and the report's breakdowns
checked. GEMM keys only: a judgement of 4 guarded GEMM mutants measured 92 s of CPU (357 s wall on a shared
2-core host); an MLA decode or attention judgement costs several minutes on the interpreter (their long hidden
cases), so those keys are generated and checked without judging in tests/test_mutants_guarded.py and judged by
the benchmark (`python bench/mutants.py --guarded-only --json OUT`)."""

from __future__ import annotations

import pytest

from bench import mutants

pytestmark = [pytest.mark.slow, pytest.mark.judging, pytest.mark.timeout(1500)]
JUDGED = ("gemm", "grouped_gemm_fp8/masked")

# Guards today's gate cannot see, with why. A guard keyed on a config constexpr past the spec's baseline value is
# never true in a judgement (the gate judges a patch at the spec's baseline config, GROUP_M 4 or 8), although the
# family's space allows it (GROUP_M 8 and 16): such a mutant survives while the check tells it from the original.
# A fix kills it and the test then fails until the entry is removed.
KNOWN_SURVIVOR_GUARDS: dict[str, str] = {
    "GROUP_M >= 5": "config-keyed: the gate judges gemm at the baseline GROUP_M 4 only",
    "GROUP_M >= 9": "config-keyed: the gate judges grouped masked at the baseline GROUP_M 8 only",
}


def test_a_guarded_sample_is_judged(tmp_path, monkeypatch):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    known, problems = [], []
    for key in JUDGED:
        r = mutants.run_guarded(mutants.TARGETS[key], 40, 0, tmp_path / "patches", False, lambda m: None, sample=4)
        assert r["generated"] == 4
        assert set(r["by_condition"]) == set(mutants.GUARD_CLASSES)  # one per class
        assert sum(v["generated"] for v in r["by_operator"].values()) == 4
        assert r["killed"] + r["equivalent"] + len(r["survived"]) - len(r["false_alarms"]) == 4
        for name in r["survived"]:
            d = r["details"][name]
            assert d["check"] not in (None, "not checked"), (key, name, d)  # a survivor was told apart by the check
            if d["guard"] in KNOWN_SURVIVOR_GUARDS:
                known.append(f"{key}:{name} ({KNOWN_SURVIVOR_GUARDS[d['guard']]})")
            else:
                problems.append(f"{key}:{name} survived: {d['verdict']} check={d['check']}\n{d['diff']}")
        for name, d in r["details"].items():
            if d["guard"] in KNOWN_SURVIVOR_GUARDS and name not in r["survived"] and d["verdict"][0] != "PASS" \
                    and mutants.killed(*d["verdict"][:2]):
                problems.append(f"{key}:{name} ({d['guard']}) is killed now: remove it from KNOWN_SURVIVOR_GUARDS")
    assert not problems, "\n".join(problems)
    if known:
        pytest.xfail("; ".join(known))
