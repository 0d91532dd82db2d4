"""Reports list what the gate saw and could not settle first: the patch section and the verdict table."""

from __future__ import annotations

import pandas as pd

from kernel_assets.report import patch_section, verdict_view
from kregress.core.checks import Evidence, Unsettled
from kregress.core.gate_report import GateReport
from kregress.core.records import VariantResult, Verdict


def _patched(vid: str, unsettled: list[Unsettled]) -> VariantResult:
    return VariantResult(variant_id=vid, round=1, source="judge", config={"BLOCK_M": 64}, config_hash=vid,
                         patch="--- a/k.py\n+++ b/k.py\n", gate=GateReport(unsettled=unsettled))


def test_unsettled_patches_lead_the_patch_section_with_their_evidence():
    seen = Unsettled(case="wide", kind=list(Evidence)[0], evidence="wrote 0 elements, the baseline's 2048",
                     program="3,6,1", why_unsettled="a full run estimated at 383 s")
    rows = [_patched("quiet", []), _patched("odd", [seen])]
    verdicts = {"quiet": Verdict(variant_id="quiet", verdict="NEEDS_REVIEW", reasons=["model estimate only"]),
                "odd": Verdict(variant_id="odd", verdict="NEEDS_REVIEW", cause="unsettled", reasons=[seen.text()])}
    lines = patch_section(rows, verdicts)
    heads = [x for x in lines if x.startswith("### ")]
    assert heads == ["### odd: NEEDS_REVIEW unsettled", "### quiet: NEEDS_REVIEW"]
    assert f"- unsettled: {seen.text()}" in lines and "program (3,6,1)" in seen.text()
    # the record carries the evidence through a dump and back (judgement.json, Parquet)
    again = GateReport.model_validate_json(rows[1].gate.model_dump_json())
    assert again.unsettled == [seen]


def test_the_verdict_table_puts_unsettled_rows_first_and_keeps_the_rest_in_order():
    df = pd.DataFrame({"variant_id": ["a", "b", "c", "d"], "cause": [None, "wrong", "unsettled", None]})
    verdicts = {v: Verdict(variant_id=v, verdict="NEEDS_REVIEW", reasons=["x"], cause=c)
                for v, c in zip(df["variant_id"], ["precision", "wrong", "unsettled", None])}
    view, _cols, _h = verdict_view(df, verdicts, "model")
    assert list(view["variant_id"]) == ["c", "a", "b", "d"]
