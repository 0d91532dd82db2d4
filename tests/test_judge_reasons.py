"""A verdict's reason is kept whole in the record (issue 55): judgement.json, report.md and verdicts.parquet hold
every character; the terminal line may shorten it, with "..." and the path of the record that holds the rest.
The patch is judged through the CLI's entry point on the external family (static checks only on a CPU host,
so nothing is compiled or run): five edits outside its editable region give a reason of several hundred
characters, one finding per edit."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from kregress.core.patch import unified_diff

REPO = Path(__file__).resolve().parents[1]


def test_a_long_reason_is_whole_in_the_record_and_shortened_on_the_terminal(tmp_path, monkeypatch, capsys):
    from kernel_assets.cli import COMMAND_ENV, main
    from kernel_assets.judge import TERMINAL_REASON_CHARS

    rel = "kernels/torch_sdpa.py"
    old = (REPO / rel).read_text()
    new = old
    for i, anchor in enumerate(["BACKEND_NAMES = ", "PARAM_KEYS = ", "def _backend(", "def _causal(", "def sdpa("]):
        new = new.replace(anchor, f"OUTSIDE_{i} = {i}  # an edit outside the editable region\n{anchor}", 1)
    patch = tmp_path / "five_outside.patch"
    patch.write_text(unified_diff(rel, old, new))
    home = tmp_path / "home"
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.setenv(COMMAND_ENV, "kregress")
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "1")
    assert main(["judge", str(REPO / "specs" / "torch_sdpa_h100.yaml"), str(patch)]) == 0
    out = capsys.readouterr().out.strip()

    (folder,) = [d for d in (home / "reports" / "torch_sdpa_h100" / "judge").iterdir() if d.is_dir()]
    record = json.loads((folder / "judgement.json").read_text())
    (v,) = record["verdicts"]
    reason = v["reasons"][0]
    assert (v["verdict"], v["cause"]) == ("REGRESS", "rejected")
    assert len(reason) > TERMINAL_REASON_CHARS > 200
    assert all(f"OUTSIDE_{i} = {i}" in reason for i in range(5)), reason  # every finding, the last one too
    assert record["lines"] == [f"five_outside REGRESS rejected: {reason}"]
    assert f"- reason: {reason}" in (folder / "report.md").read_text()
    assert reason in pd.read_parquet(folder / "verdicts.parquet")["reasons"].iloc[0]

    # the terminal: cut, marked, and pointing at the record
    assert out.startswith("five_outside REGRESS rejected: ") and "..." in out
    assert out.endswith(f"(whole reason: {folder / 'judgement.json'})")
    assert len(out) < len(record["lines"][0]) + len(str(folder)) + 40
    shown = out.split(": ", 1)[1].split("...", 1)[0]
    assert reason.startswith(shown) and len(shown) <= TERMINAL_REASON_CHARS
