"""`kregress judge SPEC PATCH...` as a user runs it (a real subprocess): exit codes, one line per patch,
a config per patch, the report's tables and diffs, the working tree untouched."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[1]
REDTEAM = REPO / "tests" / "redteam"
LINE = re.compile(r"^(\S+) (PASS|REGRESS|NEEDS_REVIEW) (\S+): (.*)$")


def run(args: list[str], home: Path, timeout: float = 1200) -> subprocess.CompletedProcess:
    env = {**os.environ, "DAGSTER_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "kernel_assets.cli", "judge", *args], capture_output=True, text=True,
                          cwd=REPO, env=env, timeout=timeout)


@pytest.mark.parametrize("make,why", [
    (lambda d: d / "missing.patch", "no such file"),
    (lambda d: (d / "notes.patch").write_text("just some notes\n") and d / "notes.patch", "not a patch"),
    (lambda d: (d / "blob.patch").write_bytes(b"\xff\xfe\x00binary") and d / "blob.patch", "not UTF-8"),
])
def test_an_argument_that_is_not_a_patch_exits_2_with_the_reason(tmp_path, make, why):
    bad = make(tmp_path)
    p = run(["specs/gemm_smoke.yaml", str(REDTEAM / "gemm_cheat_torch_matmul.patch"), str(bad)], tmp_path / "home", 300)
    assert p.returncode == 2, p.stderr
    assert why in p.stderr and str(bad) in p.stderr
    assert p.stdout == ""  # nothing was judged


def test_judge_lines_tables_diffs_and_clean_tree(tmp_path):
    before = {f: f.read_bytes() for f in (REPO / "kernels").glob("*.py")}
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps({"BLOCK_K": 16}))
    legit = tmp_path / "even_k.patch"
    legit.write_text((REDTEAM / "gemm_legit_even_k.patch").read_text())
    broken = tmp_path / "broken.patch"
    broken.write_text("--- a/kernels/gemm.py\n+++ b/kernels/gemm.py\n@@ -40,2 +40,2 @@\n-nothing like this\n+here\n context\n")
    home = tmp_path / "home"
    p2 = run(["specs/gemm_smoke.yaml", str(broken)], home, 300)  # an input error: one line, exit 2, nothing judged
    assert p2.returncode == 2 and p2.stdout == "" and "does not apply to kernels/gemm.py line 40" in p2.stderr, p2.stderr[-3000:]
    p = run(["specs/gemm_smoke.yaml", f"{legit}:{cfg}", str(REDTEAM / "gemm_cheat_loosen_tolerance.patch")], home)
    assert p.returncode == 0, p.stderr[-3000:]
    lines = p.stdout.strip().splitlines()
    assert len(lines) == 2 and all(LINE.match(x) for x in lines), lines
    got = {LINE.match(x).group(1): LINE.match(x).groups()[1:] for x in lines}
    assert got["even_k"][0] == "NEEDS_REVIEW" and got["even_k"][1] == "-"  # correct; latency is a model estimate on a CPU
    assert got["gemm_cheat_loosen_tolerance"][:2] == ("REGRESS", "rejected")
    from kregress.core.family import get_family
    from kregress.core.patch import apply_and_check, editable_set, parse_patch, read_sources

    patch = parse_patch((REDTEAM / "gemm_cheat_loosen_tolerance.patch").read_text())
    apply_and_check(patch, read_sources(editable_set(get_family("gemm"))))  # the line where the hunk applies today
    where = f"kernels/gemm.py:{patch.files[0].hunks[0].removed_old_lines()[0][0]}"
    assert where in got["gemm_cheat_loosen_tolerance"][2] and "outside_region" in got["gemm_cheat_loosen_tolerance"][2]
    (out,) = [d for d in (home / "reports" / "gemm_smoke" / "judge").iterdir() if d.is_dir()]  # its own record
    assert f"report: {out / 'report.md'}" in p.stderr
    df = pd.read_parquet(out / "verdicts.parquet")
    assert {"variant_id", "verdict", "cause", "patch_sha256", "config_label"} <= set(df.columns)
    assert set(df["variant_id"]) == {"even_k", "gemm_cheat_loosen_tolerance"}
    even = df[df["variant_id"] == "even_k"].iloc[0]
    assert even["BLOCK_K"] == 16 and even["max_abs_err"] is not None and even["regs_per_thread"] > 0
    md = (out / "report.md").read_text()
    assert md.startswith("# kregress judge: gemm_smoke")
    assert "### even_k: NEEDS_REVIEW" in md and "+    EVEN_K: tl.constexpr = False," in md
    assert "### gemm_cheat_loosen_tolerance: REGRESS rejected" in md
    assert {f: f.read_bytes() for f in (REPO / "kernels").glob("*.py")} == before
