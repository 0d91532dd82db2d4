"""Issue 53 item 3: no silent outcome. A difference the gate observes between a candidate's sampled run and
the baseline's (a program that wrote less, or elsewhere, another grid) is REGRESS unless a check settles it
in the candidate's favour, and NEEDS_REVIEW with cause ``unsettled``, naming the program and the evidence,
where no settling check fits this host. These tests feed recorded child replies (the dicts a sandboxed child
returns, packed as it packs them) to the judging parent's comparison and to the verdict rule: no interpreter,
no child process."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import torch

from kernels import sandbox
from kernels.candidate import _Judgement
from kernels.gate_compare import _Tally, program_differences, sampled_suspicions
from kregress.core.checks import (
    Evidence,
    Settlement,
    SettlingCheck,
    Suspicion,
    decide_sampled,
    reduced_run_check,
)
from kregress.core.gate_verdict import JudgedReport, gate_verdict
from kregress.core.records import ERROR_CAUSES, REVIEW_CAUSES

P0, P1 = "0,0,0", "1,0,0"


def stats(filled: list[int], where: list[str], grid: int = 4, full_seconds: float = 300.0) -> dict:
    """A sampled run's statistics as ``_ProgramSampler.stats`` records them: programs 0 and 1 of a 4-program launch."""
    pids = [P0, P1]
    return {"outputs": [{"launches": [{"grid": grid, "index": 0, "filled": list(filled), "where": list(where),
                                        "pids": pids}]}],
            "ran": [{"dims": [grid, 1, 1], "pids": pids, "wrote": list(filled), "times": [0.1, 0.1]}],
            "launches": 1, "programs": 2, "grid": grid, "full_seconds": full_seconds}


BASE = [[{"grid": 4, "writes": {P0: 2, P1: 2}, "where": {P0: "w0", P1: "w1"}}]]


class Recorded:
    """A child that answers each job with its recorded reply (what the sandboxed child sent back)."""

    def __init__(self, replies: dict[str, tuple[dict, list[bytes]]]):
        self.replies, self.jobs = replies, []

    def call(self, header: dict, blobs=(), timeout: float = 0.0):
        self.jobs.append(header["job"])
        return self.replies[header["job"]]


def judgement(settle: bool, wide: bool, ref: Recorded | None = None) -> _Judgement:
    j = object.__new__(_Judgement)
    fam = SimpleNamespace(name="toy")
    j.family, j.spec = fam, SimpleNamespace(dtype="fp32", params={}, baseline={"BLOCK": 2})
    timed = {"M": 8}
    j.cases = [{"id": "g1", "kind": "sampled", "label": "M8", "shape": timed, "sampled": True, "settle": settle,
                "full_seconds": 10.0 if settle else 300.0, "tol": [1e-3, 1e-3], "dist": "normal", "buffers": {},
                "base_writes": BASE, "seed_index": 0}]
    j.data = {"g1": {"inputs": {"x": torch.ones(8)}, "ref": torch.ones(8, dtype=torch.float64)}}
    j.groups = {"g1": {"id": "g1", "shapes": [timed], "sample": True}}
    if wide:
        j.cases.append({"id": "g2", "kind": "wide", "label": "M8 k1", "shape": {"M": 8, "K": 1}, "tol": [1e-3, 1e-3],
                        "dist": "normal", "buffers": {}, "seed_index": 0})
        j.data["g2"] = {"inputs": {"x": torch.ones(8)}, "ref": torch.ones(8, dtype=torch.float64)}
        j.groups["g2"] = {"id": "g2", "shapes": [], "wide_of": timed}
    j.base_tally = _Tally(fam, "fp32")
    j.case_timeout, j.device, j.secret = 10.0, "cpu", 7
    j.ref, j.ref_lock = ref, threading.Lock()
    return j


def reply_run(out: torch.Tensor, st: dict, wide_ok: bool = True) -> tuple[dict, list[bytes]]:
    """The candidate child's reply to its ``run`` job: the sampled case (and the wide case, run whole)."""
    blobs: list[bytes] = []
    results = [{"id": "g1", "sampled": st, "problems": [], "seconds": 1.0,
                "payload": sandbox.pack({"out": out, "after": {"x": torch.ones(8)}}, blobs)}]
    wide_out = torch.ones(8) if wide_ok else torch.zeros(8)
    results.append({"id": "g2", "problems": [], "seconds": 0.1,
                    "payload": sandbox.pack({"out": wide_out, "after": {"x": torch.ones(8)}}, blobs)})
    return {"results": results}, blobs


def reply_sampled(st: dict) -> tuple[dict, list[bytes]]:
    blobs: list[bytes] = []
    return {"results": [{"id": "g2", "sampled": st, "problems": [], "seconds": 0.1,
                         "payload": sandbox.pack({"out": torch.ones(8), "after": {"x": torch.ones(8)}}, blobs)}]}, blobs


def reply_full(out: torch.Tensor) -> tuple[dict, list[bytes]]:
    blobs: list[bytes] = []
    return {"results": [{"id": "g1", "problems": [], "payload": sandbox.pack({"out": out}, blobs)}]}, blobs


def zero_write_out() -> torch.Tensor:
    """Program 0 wrote its 2 elements right; program 1 (whose baseline program wrote 2) wrote nothing."""
    out = torch.full((8,), float("nan"))
    out[:2] = 1.0
    return out


def judge(j: _Judgement, head: dict, blobs: list[bytes], child: Recorded | None):
    row = SimpleNamespace(variant_id="p1", error=None, config={"BLOCK": 2}, evidence="model", correctness=None)
    rep = JudgedReport()
    crashes = j._compare(row, rep, {**head}, blobs, child)
    assert crashes == []
    if not row.correctness.ok:  # _conclude's rule
        row.error = "nan_inf" if row.correctness.nan_inf else "numeric_mismatch"
    return row, rep, gate_verdict(row, rep)


ZERO = stats([2, 0], ["w0", ""])


def test_the_recorded_zero_write_is_a_suspicion_naming_the_program():
    sus = sampled_suspicions(zero_write_out(), torch.ones(8, dtype=torch.float64), ZERO, 1e-3, 1e-3, base=BASE)
    assert [(s.kind, s.program) for s in sus] == [(Evidence.WROTE_LESS, P1)]


def test_zero_write_with_no_settling_check_is_needs_review_unsettled_naming_the_program():
    j = judgement(settle=False, wide=False)
    head, blobs = reply_run(zero_write_out(), ZERO)
    head["results"] = head["results"][:1]
    row, rep, v = judge(j, head, blobs, Recorded({}))
    assert row.error is None and row.correctness.ok
    assert v is not None and v.verdict == "NEEDS_REVIEW" and v.cause == "unsettled"
    assert f"program ({P1})" in v.reasons[0] and "wrote 0 elements, the baseline's 2" in v.reasons[0]
    assert "~300s" in v.reasons[0]  # why: the full run's estimate, said, not silent
    assert [u.program for u in rep.unsettled] == [P1]


def test_zero_write_settled_by_a_full_run_that_matched_is_the_honest_verdict():
    child = Recorded({"full": reply_full(torch.ones(8))})
    head, blobs = reply_run(zero_write_out(), ZERO)
    row, rep, v = judge(judgement(settle=True, wide=True), head, blobs, child)
    assert child.jobs == ["full"]
    assert row.error is None and row.correctness.ok and rep.unsettled == [] and v is None


def test_zero_write_settled_by_a_full_run_that_differed_is_regress_wrong():
    bad = torch.ones(8)
    bad[4:6] = float("nan")
    child = Recorded({"full": reply_full(bad)})
    head, blobs = reply_run(zero_write_out(), ZERO)
    row, rep, v = judge(judgement(settle=True, wide=True), head, blobs, child)
    assert row.error in ("numeric_mismatch", "nan_inf") and ERROR_CAUSES[row.error] == "wrong"
    assert "full run" in row.correctness.mismatch_sample and f"({P1})" in row.correctness.mismatch_sample
    assert v is None  # a failed row: the evidence rule's REGRESS with cause wrong


def test_a_reduced_run_with_the_same_difference_settles_a_remap():
    # past the full run's budget; the wide case (same programs, least work) is right whole, and program 1 is idle
    # there too where the baseline's writes: a property of the grid (an honest remap)
    ref = Recorded({"run": reply_sampled(stats([2, 2], ["v0", "v1"]))})
    child = Recorded({"run": reply_sampled(stats([2, 0], ["v0", ""]))})
    head, blobs = reply_run(zero_write_out(), ZERO)
    row, rep, v = judge(judgement(settle=False, wide=True, ref=ref), head, blobs, child)
    assert child.jobs == ["run"] and ref.jobs == ["run"]
    assert row.error is None and rep.unsettled == [] and v is None


def test_a_reduced_run_where_the_program_acts_as_the_baseline_is_regress_wrong():
    # program 1 writes on the reduced case and nothing on the timed shape: a skip keyed on the timed size
    ref = Recorded({"run": reply_sampled(stats([2, 2], ["v0", "v1"]))})
    child = Recorded({"run": reply_sampled(stats([2, 2], ["v0", "v1"]))})
    head, blobs = reply_run(zero_write_out(), ZERO)
    row, rep, v = judge(judgement(settle=False, wide=True, ref=ref), head, blobs, child)
    assert row.error == "numeric_mismatch" and ERROR_CAUSES[row.error] == "wrong"
    assert "acts as the baseline's on the reduced case" in row.correctness.mismatch_sample


def test_a_reduced_run_on_other_grids_settles_nothing():
    ref = Recorded({"run": reply_sampled(stats([2, 2], ["v0", "v1"]))})
    child = Recorded({"run": reply_sampled(stats([4, 4], ["v0", "v1"], grid=2))})
    head, blobs = reply_run(zero_write_out(), ZERO)
    row, rep, v = judge(judgement(settle=False, wide=True, ref=ref), head, blobs, child)
    assert v is not None and v.cause == "unsettled" and "not the same programs" in v.reasons[0]


def test_values_wrong_in_a_sampled_run_are_wrong_without_any_settling_check():
    out = zero_write_out()
    out[0] = 5.0
    head, blobs = reply_run(out, ZERO)
    head["results"] = head["results"][:1]
    row, rep, v = judge(judgement(settle=False, wide=False), head, blobs, Recorded({}))
    assert row.error == "numeric_mismatch" and "differ from the reference" in row.correctness.mismatch_sample


@pytest.mark.parametrize("outcome,expect", [(Settlement.MATCHED, ([], [])), (Settlement.DIFFERED, (1, [])),
                                            (Settlement.NONE, ([], [P1])), (None, ([], [P1]))])
def test_decide_sampled(outcome, expect):
    sus = [Suspicion(Evidence.WROTE_LESS, "program (1,0,0) wrote 0", 0, P1)]
    check = SettlingCheck("full run", outcome, "why") if outcome is not None else None
    got = decide_sampled("M8", sus, check, why_none="too costly")
    wrong, progs = expect
    assert (len(got.wrong) if wrong else got.wrong) == wrong
    assert [u.program for u in got.unsettled] == progs
    if progs:
        assert got.unsettled[0].why_unsettled in ("why", "too costly")


def test_reduced_run_check_rules():
    timed = {(0, 0, P1): Evidence.WROTE_LESS}
    g = [(4, 1, 1)]
    assert reduced_run_check(timed, g, dict(timed), g, True, "r").outcome == Settlement.MATCHED
    assert reduced_run_check(timed, g, {}, g, True, "r").outcome == Settlement.DIFFERED
    assert reduced_run_check(timed, g, dict(timed), g, False, "r").outcome == Settlement.DIFFERED
    assert reduced_run_check(timed, g, dict(timed), [(2, 1, 1)], True, "r").outcome == Settlement.NONE
    assert program_differences(ZERO, BASE) == timed
    assert program_differences(stats([2, 2], ["w0", "wX"]), BASE) == {(0, 0, P1): Evidence.WROTE_ELSEWHERE}


def test_unsettled_is_a_review_cause_from_the_enum():
    from kregress.core.checks import ReviewCause

    assert {c.value for c in ReviewCause} <= set(REVIEW_CAUSES) and ReviewCause.UNSETTLED.value == "unsettled"
