"""A sample of bench/mutants.py's guarded (conditional) mutants judged through `kregress judge`'s code path, so the
tool cannot rot: one judgement per key of one mutant per condition class (size, programs, structure, interpreter),
the survivors run through the independent equivalence check (their forced twins), and the report's breakdowns
checked. GEMM keys only: a judgement of 4 guarded GEMM mutants measured about 90 s of CPU (357 to 451 s wall on
a 2-core host shared by 8 jobs); an MLA decode or attention judgement costs several minutes on the interpreter (their long hidden
cases), so those keys are generated and checked without judging in tests/test_mutants_guarded.py and judged by
the benchmark (`python bench/mutants.py --guarded-only --json OUT`)."""

from __future__ import annotations

import pytest

from bench import mutants

pytestmark = [pytest.mark.slow, pytest.mark.judging, pytest.mark.timeout(1500)]
JUDGED = ("gemm", "grouped_gemm_fp8/masked")

# Sampled guarded mutants today's gate lets through although the check tells their forced twins from the original
# (bench/mutants.py --family gemm --family grouped_gemm_fp8/masked --guarded-only --sample 4, docs/mutants.md),
# with the class of weakness. A fix kills the mutant and this test then fails until the entry is removed.
KNOWN_SURVIVORS: dict[str, str] = {
    "gemm:g35_structure_bound_bound_plus_one_L44":
        "config-keyed (GROUP_M >= 5): the gate judges a patch at the spec's baseline GROUP_M 4 only, while the "
        "family's space allows 8 and 16",
    "grouped_gemm_fp8/masked:g15_programs_count_skip_program_ids_L98":
        "a program class (tl.program_id(1) >= 4, the groups past the timed 4, and tl.program_id(0) % 7 == 3) skips "
        "the K loop: the gate passed it (NEEDS_REVIEW on model evidence) while the check's forced twin differs",
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
            tag = f"{key}:{name}"
            if tag in KNOWN_SURVIVORS:
                known.append(f"{tag} ({KNOWN_SURVIVORS[tag]})")
            else:
                problems.append(f"{tag} survived: {d['verdict']} check={d['check']}\n{d['diff']}")
        for name, d in r["details"].items():
            if f"{key}:{name}" in KNOWN_SURVIVORS and name not in r["survived"]:
                problems.append(f"{key}:{name} ({d['guard']}) no longer survives ({d['verdict'][:2]}, check {d['check']}): "
                                "remove it from KNOWN_SURVIVORS")
    assert not problems, "\n".join(problems)
    if known:
        pytest.xfail("; ".join(known))
