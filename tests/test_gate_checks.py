"""The gate's home (issue 30, item 6): every run-time check is a named unit in one registry
(kregress/core/checks.py) with its stage, error kind, families and backends, and a unit test here named
``test_check_<name>``; error kinds are one enum; one verdict function with no callback; the gate's modules
import each other without circles and none is much over 800 lines."""

from __future__ import annotations

import ast
import inspect
import sys
from pathlib import Path

import pytest
import torch

from kernels.gate_cases import _fresh, poison_buffers
from kernels.gate_compare import _structure_problem, _Tally, buffer_problems, input_problems, sampled_problems
from kregress.core.checks import CHECKS, ErrorKind, RunSeen, Stage, checks_for, run_problems
from kregress.core.records import ERROR_CLASSES

REPO = Path(__file__).resolve().parents[1]
GATE_FILES = ["kregress/core/checks.py", "kregress/core/gate.py", "kregress/core/gate_facts.py",
              "kregress/core/gate_policy.py", "kregress/core/gate_report.py", "kregress/core/gate_verdict.py",
              "kregress/core/patch.py", "kregress/core/records.py", "kernels/candidate.py", "kernels/gate_cases.py",
              "kernels/gate_child.py", "kernels/gate_compare.py", "kernels/gate_compile.py", "kernels/gate_sampler.py",
              "kernels/sandbox.py"]


def seen(**kw) -> RunSeen:
    base = dict(ops=frozenset({"empty", "copy_"}), op_count=4, threads=0, base_ops=frozenset({"empty"}),
                base_op_count=4, base_threads=0)
    return RunSeen(**(base | kw))


def test_every_check_has_its_test_and_its_implementation():
    tests = {n[len("test_check_"):] for n, f in inspect.getmembers(sys.modules[__name__], inspect.isfunction)
             if n.startswith("test_check_")}
    assert set(CHECKS) == tests, f"checks without a test: {set(CHECKS) - tests}; tests without a check: {tests - set(CHECKS)}"
    for c in CHECKS.values():
        assert c.stage in Stage and c.backends and c.families and c.text
        assert c.fn is not None or c.stage in (Stage.COMPARE, Stage.MEASURE), c.name


def test_error_kinds_are_one_enum():
    assert {e.value for e in ErrorKind} == set(ERROR_CLASSES)


def test_check_threads():
    assert run_problems(seen(threads=2), "gemm", "interpreter")
    assert CHECKS["threads"].fn(seen(threads=0)) == [] and CHECKS["threads"].fn(seen(threads=1, base_threads=1)) == []


def test_check_host_data_ops():
    assert "Python" in CHECKS["host_data_ops"].fn(seen(ops=frozenset({"empty", "_local_scalar_dense"})))[0]
    assert CHECKS["host_data_ops"].fn(seen(ops=frozenset({"_local_scalar_dense"}), base_ops=frozenset({"_local_scalar_dense"}))) == []


def test_check_torch_compute_ops():
    assert "aten.mm" in CHECKS["torch_compute_ops"].fn(seen(ops=frozenset({"mm", "empty"})))[0]
    assert CHECKS["torch_compute_ops"].fn(seen(ops=frozenset({"empty", "view", "copy_"}))) == []


def test_check_op_count():
    assert CHECKS["op_count"].fn(seen(op_count=8 * 4 + 65))
    assert CHECKS["op_count"].fn(seen(op_count=8 * 4 + 64)) == []


def test_check_crashed():
    # the parent turns a case whose call raised into ErrorKind.CRASHED (see _Judgement._compare)
    assert CHECKS["crashed"].error == ErrorKind.CRASHED


def test_check_outputs():
    t = _Tally(None, "fp16")
    t.add("s", torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0], dtype=torch.float64), [1e-3, 1e-3])
    assert t.correctness().ok
    t.add("s", torch.tensor([1.0, float("nan")]), torch.tensor([1.0, 2.0], dtype=torch.float64), [1e-3, 1e-3])
    assert not t.correctness().ok and t.correctness().nan_inf


def test_check_output_structure():
    assert _structure_problem(torch.zeros(2, 3), torch.zeros(2, 3)) is None
    assert "shape" in _structure_problem(torch.zeros(3, 2), torch.zeros(2, 3)) or _structure_problem(torch.zeros(3, 2), torch.zeros(2, 3))
    assert _structure_problem(None, torch.zeros(2))


def test_check_read_only_inputs():
    before = {"a": torch.arange(4.0), "out": torch.zeros(2)}
    after = _fresh(before, "cpu")
    after["out"] += 1  # a declared output buffer may change
    assert input_problems(after, before, {"out": 0}) == []
    after["a"][0] = -0.0  # 0.0 -> -0.0: one bit
    assert input_problems(after, before, {"out": 0})


def _buffer_case():
    before = {"out": torch.zeros(2, 3, dtype=torch.bfloat16)}
    poison_buffers(before, ["out"], "random", 5)
    ref = before["out"].double().clone()
    ref[0] = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)  # row 0 computed, row 1 untouched
    return before, ref


def test_check_output_buffers():
    before, ref = _buffer_case()
    after = _fresh(before, "cpu")
    assert any("does not hold" in w for w in buffer_problems(after["out"], after, before, ref, {"out": 0}, [1e-2, 1e-2], "r"))
    after["out"][0] = ref[0].to(torch.bfloat16)
    assert buffer_problems(after["out"], after, before, ref, {"out": 0}, [1e-2, 1e-2], "r") == []


def test_check_untouched_regions():
    before, ref = _buffer_case()
    after = _fresh(before, "cpu")
    after["out"][0] = ref[0].to(torch.bfloat16)
    after["out"][1, 2] = 0.0
    assert any("leaves untouched" in w for w in buffer_problems(after["out"], after, before, ref, {"out": 0}, [1e-2, 1e-2], "r"))


def test_check_sampled_programs():
    out = torch.full((4,), float("nan"))
    out[:2] = 1.0
    ref = torch.ones(4, dtype=torch.float64)
    stats = {"outputs": [{"launches": [{"grid": 2, "filled": [2, 0], "pids": ["0,0,0", "1,0,0"]}]}]}
    base = [[{"grid": 2, "writes": {"0,0,0": 2, "1,0,0": 2}}]]
    assert any("wrote 0 elements, the baseline's 2" in w for w in sampled_problems(out, ref, stats, 1e-3, 1e-3, base=base))
    stats["outputs"][0]["launches"][0]["filled"] = [2, 2]
    out[:] = 1.0
    assert sampled_problems(out, ref, stats, 1e-3, 1e-3, base=base) == []
    # a launch of another grid (a persistent kernel) divides the work otherwise: not compared program by
    # program, so a full run must settle it
    other = {"outputs": [{"launches": [{"grid": 1, "filled": [4], "pids": ["0,0,0"]}]}]}
    why = sampled_problems(out, ref, other, 1e-3, 1e-3, base=[[{"grid": 4, "writes": {"0,0,0": 1}}]])
    assert why == ["output 0: launch 0 has 1 programs, the baseline's 4 (not comparable program by program)"]


def test_the_reach_of_sampled_programs_counts_only_what_the_reference_holds():
    """An output buffer's elements that no correct program writes stay NaN in the reference (grouped GEMM's padding
    rows: a wider case with 2 groups of a few real rows each in 128-row aligned blocks, every tile mostly padding).
    The programs must reach what the reference holds, not the whole buffer: counted against the buffer, the
    baseline itself failed the wider case (CI, grouped contiguous 2x5x6145x128, reach 198,656 of 1,573,120)."""
    ref = torch.full((8, 4), float("nan"), dtype=torch.float64)
    ref[:3] = 1.0  # 3 real rows of 8: 12 elements to write
    out = ref.to(torch.float32).clone()
    stats = {"outputs": [{"launches": [{"grid": 2, "filled": [12, 0], "pids": ["0,0,0", "1,0,0"]}]}]}
    assert sampled_problems(out, ref, stats, 1e-3, 1e-3) == []
    stats["outputs"][0]["launches"][0]["filled"] = [5, 0]  # 5 x 2 programs < 12
    assert sampled_problems(out, ref, stats, 1e-3, 1e-3) == ["output 0: the launches reach at most 10 of the 12 elements it must hold "
                                                             "(largest write of a sampled program x grid)"]
    full = torch.ones(8, 4, dtype=torch.float64)  # a kernel-allocated output: every element
    stats["outputs"][0]["launches"][0]["filled"] = [12, 0]
    assert any("reach at most 24 of the 32" in w for w in sampled_problems(torch.ones(8, 4), full, stats, 1e-3, 1e-3))
    # a wider shape's upper picks (cover=False) may all be programs of few rows: only nothing written is vacuous
    stats["outputs"][0]["launches"][0]["filled"] = [5, 0]
    assert sampled_problems(out, ref, stats, 1e-3, 1e-3, cover=False) == []
    stats["outputs"][0]["launches"][0]["filled"] = [0, 0]
    assert any("reach at most 0 of the 1 " in w for w in sampled_problems(out, ref, stats, 1e-3, 1e-3, cover=False))
    # a candidate handed the baseline's programs is held to what the baseline's reached, and to no more
    base = [[{"grid": 2, "writes": {"0,0,0": 5, "1,0,0": 0}}]]
    stats["outputs"][0]["launches"][0]["filled"] = [5, 0]
    assert sampled_problems(out, ref, stats, 1e-3, 1e-3, base=base) == []
    stats["outputs"][0]["launches"][0]["filled"] = [4, 0]
    why = sampled_problems(out, ref, stats, 1e-3, 1e-3, base=base)
    assert "output 0: the launches reach at most 8 of the 10 elements it must hold (largest write of a sampled program x grid)" in why


def test_a_sampled_program_that_writes_elsewhere_is_settled_by_a_full_run():
    """A program that writes as many elements as the baseline's program of the same id, with the right
    values, but other elements (its id mapped to another tile, ``pid % 40``) is sent to a full run: the
    where of every sampled program is compared, not its count alone."""
    out = torch.ones(4)
    ref = torch.ones(4, dtype=torch.float64)
    base = [[{"grid": 2, "writes": {"0,0,0": 2, "1,0,0": 2}, "where": {"0,0,0": "a", "1,0,0": "b"}}]]
    same = {"outputs": [{"launches": [{"grid": 2, "filled": [2, 2], "pids": ["0,0,0", "1,0,0"], "where": ["a", "b"]}]}]}
    assert sampled_problems(out, ref, same, 1e-3, 1e-3, base=base) == []
    moved = {"outputs": [{"launches": [{"grid": 2, "filled": [2, 2], "pids": ["0,0,0", "1,0,0"], "where": ["a", "a"]}]}]}
    why = sampled_problems(out, ref, moved, 1e-3, 1e-3, base=base)
    assert why == ["output 0: program (1,0,0) of a 2-program launch wrote other elements than the baseline's program "
                   "of the same id (1 of 2 sampled programs)"]


@pytest.mark.gpu
def test_check_stream_sync():
    """Only a GPU has streams: _call compares the outputs read before and after synchronising."""
    assert CHECKS["stream_sync"].backends == ("cuda",)
    assert torch.cuda.is_available()


@pytest.mark.gpu
def test_check_after_timing():
    """Only a GPU times: tests/test_judge_gpu.py judges the after-timing recheck end to end."""
    assert CHECKS["after_timing"].backends == ("cuda",) and checks_for(Stage.MEASURE, "gemm", "cuda")


def test_check_precision():
    from kregress.core.gate_report import PrecisionMetrics, precision_finding

    m = PrecisionMetrics(candidate_max=0.5, baseline_max=0.05, candidate_rms=0.1, baseline_rms=0.01)
    assert precision_finding(m, 4.0) and precision_finding(m.model_copy(update={"candidate_max": 0.1, "candidate_rms": 0.02}), 4.0) is None


def test_check_plausibility():
    from kregress.core.gate_report import plausibility_findings

    assert plausibility_findings([("s", 0.5, 2.0, 0.1)], 2.0) and plausibility_findings([("s", 1.5, 2.0, 0.1)], 2.0) == []


def test_one_verdict_function_without_a_callback():
    from kregress.core.gate_verdict import gate_verdict

    assert list(inspect.signature(gate_verdict).parameters) == ["row", "report", "per_shape_sol"]


def _imports(path: Path) -> set[str]:
    out = set()
    for n in ast.walk(ast.parse(path.read_text())):
        if isinstance(n, ast.ImportFrom) and n.module:
            out.add(n.module)
            out |= {f"{n.module}.{a.name}" for a in n.names}
        elif isinstance(n, ast.Import):
            out |= {a.name for a in n.names}
    return out


def test_gate_modules_have_no_import_circles_and_stay_small():
    mods = {f.removesuffix(".py").replace("/", "."): REPO / f for f in GATE_FILES}
    graph = {m: {d for d in _imports(p) if d in mods and d != m} for m, p in mods.items()}
    for m, p in mods.items():
        if m.startswith("kernels.") and "from kernels import sandbox" in p.read_text():
            graph[m].add("kernels.sandbox")
    state: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for d in graph[m]:
            assert state.get(d) != 1, f"import circle: {' -> '.join(path + [m, d])}"
            if d not in state:
                visit(d, path + [m])
        state[m] = 2

    for m in graph:
        if m not in state:
            visit(m, [])
    for f in GATE_FILES:
        if f != "kregress/core/records.py":
            assert len((REPO / f).read_text().splitlines()) <= 880, f


def test_a_sampled_programs_cost_is_cpu_time_so_load_does_not_change_what_is_sampled():
    """How many programs a candidate's sampled run draws, and whether a suspicion escalates to a full run, follow
    the baseline's cost per program; that cost is the child's CPU seconds, so a second job on the same cores (the
    child waiting off the CPU, as a sleep is) leaves it, and with it the verdict, unchanged. A program that spins
    on the CPU is charged what it spins."""
    import time

    from kernels.gate_sampler import _ProgramProxy

    class Builder:
        grid_idx = (0, 0, 0)

    def waits() -> None:
        time.sleep(0.3)

    def spins() -> None:
        end = time.process_time() + 0.1
        while time.process_time() < end:
            pass

    for fn, low, high in ((waits, 0.0, 0.05), (spins, 0.09, 0.3)):
        launch = {"tensors": [], "programs": [], "pids": [], "times": [], "sample": {(0, 0, 0)}, "seconds": 0.0,
                  "nan_after": None, "where": []}
        _ProgramProxy(fn, launch, Builder())()
        assert low <= launch["times"][0] <= high and low <= launch["seconds"] <= high, (fn.__name__, launch)
        assert launch["pids"] == ["0,0,0"] and launch["programs"] == [[]]
