"""bench/mutants.py's guarded (conditional) mutants, without judging: the generator gives 30 or more per key over
every condition class, each a patch the gate's region rules accept, written in the kernel's own terms; thresholds
sit just past the checked, hidden and timed values; the static reachability and the report's equivalence
classification are checked on hand-built cases; every mutant and its forced twin import under TRITON_INTERPRET=1.
The judged sample is tests/test_mutants_guarded_judged.py (long tier)."""

from __future__ import annotations

import ast
import re
from collections import Counter

import pytest

from bench import mutants
from bench.mutants import Guard, Mutant, classify_guarded, guard_reachable

KINDS = {"size": {"bound"}, "structure": {"bound"}, "programs": {"count", "residue", "affine"},
         "interpreter": {"probe_dot", "launch_return"}}


@pytest.fixture(scope="module")
def guarded() -> dict[str, list[Mutant]]:
    return {k: mutants.generate_guarded(t, 40, seed=0) for k, t in mutants.TARGETS.items()}


def test_every_key_gets_30_guarded_mutants_over_every_class(guarded):
    kinds_seen: Counter = Counter()
    for key, ms in guarded.items():
        assert len(ms) >= 30, (key, len(ms))
        by_class = Counter(m.cls for m in ms)
        assert set(by_class) == set(mutants.GUARD_CLASSES), (key, by_class)
        assert min(by_class.values()) >= 5, (key, by_class)
        assert len({m.name for m in ms}) == len(ms) and len({m.source for m in ms}) == len(ms)
        assert len({m.op for m in ms}) >= 8, (key, Counter(m.op for m in ms))
        terms = {c: {n for t in mutants.TERMS[key] if t.cls == c for n in t.names} for c in ("size", "structure")}
        for m in ms:
            g = m.guard
            assert g.kind in KINDS[m.cls], (key, m.name, g)
            kinds_seen[g.kind] += 1
            tree = ast.parse(m.source)  # valid Python, and its forced twin too
            ast.parse(m.forced)
            if g.kind == "bound":  # a threshold on a name the kernel reads, of the guard's own class
                name, value = re.fullmatch(r"(\w+) >= (\d+)", g.text).groups()
                assert name in terms[m.cls], (key, m.name, g.text)
            if g.kind == "launch_return":
                assert "COMPILED: tl.constexpr = False" in m.source and ".compiled = " in m.source
                assert "if COMPILED:" in m.source and "if True:" in m.forced
            else:
                assert f"if {g.text}:" in m.source, (key, m.name)
                assert "if True:" in m.forced and f"if {g.text}:" not in m.forced, (key, m.name)
            # the mutated statement runs under the guard, the original under else
            assert any(isinstance(n, ast.If) and n.orelse for n in ast.walk(tree))
    assert set(kinds_seen) == set().union(*KINDS.values()), kinds_seen
    assert mutants.generate_guarded(mutants.TARGETS["gemm"], 40, seed=0)[7].diff == guarded["gemm"][7].diff  # seeded


def test_guarded_mutants_are_patches_the_gate_takes(guarded):
    from kregress.core.family import get_family
    from kregress.core.patch import DEFAULT_MAX_CHANGED_LINES, apply_and_check, check_region, editable_set, parse_patch, read_sources

    assert mutants.MAX_CHANGED_LINES == DEFAULT_MAX_CHANGED_LINES
    for key, ms in guarded.items():
        es = editable_set(get_family(key.split("/")[0]))
        old = read_sources(es)
        for m in ms:
            patch = parse_patch(m.diff)
            applied = apply_and_check(patch, old)
            assert check_region(es, patch, old, applied.new_texts) == [], (key, m.name)


def test_thresholds_sit_just_past_the_checked_hidden_and_timed_values():
    levels = mutants.term_levels(mutants.TARGETS["gemm"])
    # timed K = 1024; the gate's past_K case (kernels/gate_cases.py) checks the least shape at 1024 + 16
    assert 1025 in levels["K"][0] and max(levels["K"][0]) == 1041 and levels["K"][1] is None
    assert levels["M"][0] == [1025] and levels["GROUP_M"] == ([5], 16)  # config: just past the baseline's 4
    mla = mutants.term_levels(mutants.TARGETS["mla_decode"])
    assert 3 in mla["S_Q"][0] and 17 in mla["H_Q"][0] and mla["NUM_SPLITS"] == ([3], 32)
    assert mla["PAGE_SIZE"] == ([65], 64)  # the spec's page_size is the problem's: past it is unreachable
    att = mutants.term_levels(mutants.TARGETS["attention"])
    assert att["D_QK"] == ([65], 64) and att["WIN_RIGHT"] == ([1], 0)
    assert min(att["GROUP"][0]) == 5  # the timed GQA ratio 16 / 4, plus one


@pytest.mark.parametrize("guard, reachable", [
    (Guard("size", "bound", "K >= 1025", ("K",), (None,), 1025), True),
    (Guard("structure", "bound", "NUM_SPLITS >= 3", ("NUM_SPLITS",), (32,), 3), True),
    (Guard("structure", "bound", "NUM_SPLITS >= 33", ("NUM_SPLITS",), (32,), 33), False),
    (Guard("structure", "bound", "PAGE_SIZE >= 65", ("PAGE_SIZE",), (64,), 65), False),
    (Guard("programs", "count", "tl.program_id(0) >= 256", (), (None,), 256), True),
    (Guard("programs", "count", "tl.program_id(1) >= 1", (), (1,), 1), False),
    (Guard("programs", "count", "tl.program_id(2) >= 32", (), (32,), 32), False),
    (Guard("programs", "residue", "tl.program_id(2) % 5 == 3", (), (3,), 3, 5), False),
    (Guard("programs", "residue", "tl.program_id(2) % 5 == 3", (), (4,), 3, 5), True),
    (Guard("programs", "affine", "(tl.program_id(0) + 2 * tl.program_id(1)) % 4 == 3", (), (2, 1), 3, 4, 2), False),
    (Guard("programs", "affine", "(tl.program_id(0) + 2 * tl.program_id(1)) % 4 == 3", (), (2, 2), 3, 4, 2), True),
    (Guard("programs", "affine", "(pid_m + 3 * pid_n) % 7 == 6", ("pid_m", "pid_n"), (None, None), 6, 7, 3), True),
    (Guard("interpreter", "probe_dot", mutants.PROBE_COND), True),
    (Guard("interpreter", "launch_return", "COMPILED"), True),
])
def test_static_reachability(guard, reachable):
    ok, why = guard_reachable(guard)
    assert ok is reachable, why
    assert guard.text in why and ("unreachable" in why) is (not reachable)


def test_the_equivalence_classification_counts_each_reason_apart():
    def mk(name, cls, op, guard):
        return Mutant(name=name, op=op, line=1, source="", cls=cls, guard=guard, forced="")

    reach = Guard("size", "bound", "K >= 1025", ("K",), (None,), 1025)
    never = Guard("structure", "bound", "PAGE_SIZE >= 65", ("PAGE_SIZE",), (64,), 65)
    ms = [mk("a", "size", "drop_mask_term", reach),       # killed
          mk("b", "size", "skip_first_iteration", reach),  # passed, the forced twin differs: a survivor
          mk("c", "structure", "drop_mask_term", never),   # passed, unreachable: equivalent
          mk("d", "size", "drop_increment", reach),        # passed, the forced twin not told apart: equivalent
          mk("e", "structure", "scale_to_one", never)]     # killed although unreachable: a false alarm
    verdicts = {"a": ("REGRESS", "correctness", ""), "b": ("PASS", None, ""), "c": ("PASS", None, ""),
                "d": ("NEUTRAL", None, ""), "e": ("REGRESS", "correctness", "")}
    static = {m.name: guard_reachable(m.guard) for m in ms}
    eq = {"b": "[67x45x33] call 1 output 0: error 3.2 vs the original's 0.01", "d": None}
    r = classify_guarded(ms, verdicts, static, eq)
    assert r["generated"] == 5 and r["killed"] == 2 and r["equivalent"] == 3
    assert r["survived"] == ["b"] and r["false_alarms"] == ["e"]
    assert r["equivalent_reasons"] == {"unreachable": ["c", "e"], "no_effect_when_true": ["d"]}
    assert r["score"] == 0.5  # a killed, b survived; c, d, e equivalent
    assert r["by_condition"] == {"size": {"generated": 3, "equivalent": 1, "killed": 1},
                                 "structure": {"generated": 2, "equivalent": 2, "killed": 0}}
    assert r["by_operator"]["drop_mask_term"] == {"generated": 2, "equivalent": 1, "killed": 1}
    assert "diff" in r["details"]["b"] and r["details"]["c"]["check"].startswith("unreachable")
    # a reachable mutant the gate passes whose twin was never checked is a survivor, never silently equivalent
    r2 = classify_guarded(ms[1:2], {"b": ("PASS", None, "")}, {"b": static["b"]}, {})
    assert r2["survived"] == ["b"] and r2["equivalent"] == 0


def test_a_spread_sample_covers_every_class(guarded):
    sample = mutants.spread_sample(guarded["gemm"], 4, seed=0)
    assert len(sample) == 4 and {m.cls for m in sample} == set(mutants.GUARD_CLASSES)


def test_every_guarded_mutant_imports_under_the_interpreter(guarded):
    # one child for all keys (a spread of each key's mutants, every class), the forced twins too
    ms = [m for k, v in guarded.items() for m in mutants.spread_sample(v, 8, seed=1)]
    res = mutants.import_check([Mutant(name=f"{i}_{m.name}", op=m.op, line=m.line, source=m.source, forced=m.forced)
                                for i, m in enumerate(ms)])
    assert len(res) == len(ms) and not {k: v for k, v in res.items() if v}
    broken = Mutant(name="broken", op="none", line=0, source="import triton\n@triton.jit\ndef f(:\n    pass\n")
    assert "does not import" in mutants.import_check([broken])["broken"]
