"""bench/mutants.py cannot rot: its generator gives 30 or more mutants per key, spread over the operators the
issue names, each a diff that applies to today's sources; a sample (one per GEMM key, seeded) is judged through
`kregress judge`'s code path, one judgement per key, and the independent equivalence check tells an identity
edit from a real mutant. The full benchmark runs outside CI (`nice -n 5 python bench/mutants.py --json OUT`)."""

from __future__ import annotations

import random

import pytest

from bench import mutants

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]
REMAP_OPS = ("wrap_program_ids", "clamp_program_ids")
SAMPLE_OPS = ("scale_to_one", "skip_program_ids", "drop_mask_term", "store_shifted_row",
              "skip_last_iteration", "bound_minus_one")


def test_every_key_gets_30_mutants_that_apply():
    from kregress.core.family import get_family
    from kregress.core.patch import apply_and_check, editable_set, parse_patch, read_sources

    assert set(mutants.TARGETS) == {"gemm", "gemm_fp8", "grouped_gemm_fp8/contiguous", "grouped_gemm_fp8/masked",
                                    "mla_decode", "mla_decode/fp8_kv", "attention"}
    for key, target in mutants.TARGETS.items():
        ms = mutants.generate(target, 40, seed=0)
        assert len(ms) >= 30, (key, len(ms))
        assert len({m.name for m in ms}) == len(ms) and len({m.source for m in ms}) == len(ms)
        ops = {m.op for m in ms}
        assert ops & {"drop_mask_term", "drop_where_term"}, key
        for op in ("flip_compare", "bound_minus_one", "offset_plus_one", "skip_first_iteration",
                   "skip_last_iteration", "skip_program_ids", "skip_large_sizes", "store_shifted_row", *REMAP_OPS):
            assert op in ops, (key, op)
        if key.startswith(("gemm_fp8", "grouped", "mla_decode/fp8")):
            assert "scale_to_one" in ops, key
        es = editable_set(get_family(key.split("/")[0]))
        for m in ms:
            apply_and_check(parse_patch(m.diff), read_sources(es))
        assert mutants.generate(target, 40, seed=0)[5].diff == ms[5].diff  # seeded: the same mutants again


# The judged sample covers the GEMM kernels (one judgement each, about a minute on 2 cores); a judgement of
# mla_decode or attention costs several minutes on the CPU interpreter (the gate's long hidden cases), so
# their mutants are only generated and applied here, and judged by the benchmark and, through the same gate,
# by tests/test_redteam_families.py's sets.
JUDGED_SAMPLE_KEYS = ("gemm", "gemm_fp8", "grouped_gemm_fp8/contiguous", "grouped_gemm_fp8/masked")


# Sampled mutants today's gate lets through although the independent check tells them from the original, with
# the class of weakness (/work/notes/redteam.md). A fix kills the mutant and this test then fails until the
# entry is removed.
KNOWN_SURVIVORS: dict[str, str] = {}  # C6 (contiguous m06, a bound off by one on the last row) is killed since the
# structure cases hold a group that fills its 128-row blocks exactly, last in the second draw


def test_a_sample_is_judged_and_killed(tmp_path, monkeypatch):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    rng = random.Random(0)
    known = []
    for key in JUDGED_SAMPLE_KEYS:
        target = mutants.TARGETS[key]
        ms = [m for m in mutants.generate(target, 200, seed=0) if m.op in SAMPLE_OPS]
        # and every mutant that maps the program ids past a count onto those below it (``pid % 40``, ``min(pid, 39)``):
        # right on every spec shape whose grid stays under the count, so only a launch wider than the timed one
        # (the gate's wider cases) or a full run tells it apart
        sample = rng.sample(ms, 1) + [m for m in mutants.generate(target, 200, seed=0) if m.op in REMAP_OPS]
        verdicts = mutants.judge_mutants(target, sample, tmp_path / "patches")
        for m in sample:
            verdict, cause, reason = verdicts[m.name]
            assert verdict != "PASS", (key, m.name)
            tag = f"{key}:{m.name}"
            if mutants.killed(verdict, cause):
                assert tag not in KNOWN_SURVIVORS, f"{tag} is killed now: remove it from KNOWN_SURVIVORS"
                continue
            why = mutants.equivalence(target, [m])[m.name]  # a survivor must be equivalent, or a known miss
            if why is not None and tag in KNOWN_SURVIVORS:
                known.append(f"{tag}: {KNOWN_SURVIVORS[tag]} (check: {why})")
                continue
            assert why is None, (key, m.name, verdict, cause, reason, m.diff)
    if known:
        pytest.xfail("; ".join(known))


def test_the_equivalence_check_tells_an_identity_edit_from_a_mutant():
    target = mutants.TARGETS["gemm"]
    src = (mutants.REPO / target.module).read_text()
    real = next(m for m in mutants.generate(target, 200, seed=0) if m.op == "skip_last_iteration")
    same = mutants.Mutant(name="identity", op="none", line=0, source=src + "\n# an edit that changes nothing\n")
    res = mutants.equivalence(target, [same, real])
    assert res["identity"] is None
    assert res[real.name] is not None and "error" in res[real.name], res[real.name]
