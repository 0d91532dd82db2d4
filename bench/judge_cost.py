"""Seconds per judged patch, per family (issue 30, item 7): each red-team set of tests/redteam/families (or
the ones named) judged in one judgement on the CPU interpreter; per set the wall time, the reference stage
(shared by the set), and the median and largest per-patch gate time (``GateReport.seconds``: compile and
cases of one patch, side by side with the others).

    .venv/bin/python bench/judge_cost.py [--sets gemm,mla_fp8] [--json OUT]

``--versus-sweep`` (issue 32): one honest patch judged on ``specs/gemm_h100_bf16.yaml`` against the cold
default sweep of the same spec, each a whole ``kregress`` process as a user runs it, each in its own fresh
DAGSTER_HOME (no compile, correctness or Triton cache), one after the other in one run; prints both walls
and their ratio (judge / sweep), and how many of the timed-shape cases the judgement checked.

    .venv/bin/python bench/judge_cost.py --versus-sweep [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
FAMILIES = REPO / "tests" / "redteam" / "families"


DEFAULT_SPEC = REPO / "specs" / "gemm_h100_bf16.yaml"
HONEST_PATCH = REPO / "tests" / "redteam" / "gemm_legit_eviction_hints.patch"


def _timed_process(argv: list[str], home: str) -> tuple[float, int, str]:
    import subprocess

    env = dict(os.environ, DAGSTER_HOME=home, PYTHONWARNINGS="ignore")
    t0 = time.perf_counter()
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True)
    return time.perf_counter() - t0, proc.returncode, proc.stdout + proc.stderr


def versus_sweep() -> dict:
    """Cold default sweep, then one judged patch, of the default spec: whole processes, fresh homes."""
    kregress = [sys.executable, "-c", "from kernel_assets.cli import main; raise SystemExit(main())"]
    sweep_s, sweep_rc, sweep_out = _timed_process(kregress + ["sweep", str(DEFAULT_SPEC)], tempfile.mkdtemp())
    home = tempfile.mkdtemp()
    judge_s, judge_rc, judge_out = _timed_process(kregress + ["judge", str(DEFAULT_SPEC), str(HONEST_PATCH)], home)
    notes: list[str] = []  # what the gate says of the timed shapes (sampled / full run / not sampled)
    for rec_file in Path(home).rglob("judge/*/report.md"):  # the gate's notes are in the judgement's report
        text = rec_file.read_text()
        notes += sorted({m for m in re.findall(r"(?:sampled|not sampled|full run)[^\n]{0,160}", text)})
    line = next((ln for ln in judge_out.splitlines() if "gemm_legit_eviction_hints" in ln and ("PASS" in ln or "REGRESS" in ln
                                                                                               or "NEEDS_REVIEW" in ln)), "")
    return {"spec": DEFAULT_SPEC.name, "patch": HONEST_PATCH.name, "sweep_s": round(sweep_s, 1), "sweep_rc": sweep_rc,
            "judge_s": round(judge_s, 1), "judge_rc": judge_rc, "ratio": round(judge_s / sweep_s, 2),
            "verdict_line": line.strip()[:300], "timed_shape_notes": notes[:12],
            "judge_tail": judge_out.strip().splitlines()[-12:], "sweep_tail": sweep_out.strip().splitlines()[-3:]}


def main() -> None:
    import yaml

    from kernel_assets.judge import judge, read_patch_args

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sets", default="")
    ap.add_argument("--json", default=None)
    ap.add_argument("--versus-sweep", action="store_true", help="judge one patch on gemm_h100_bf16 vs its cold sweep")
    a = ap.parse_args()
    if a.versus_sweep:
        res = versus_sweep()
        print(json.dumps(res, indent=1))
        if a.json:
            Path(a.json).write_text(json.dumps(res, indent=1))
        return
    sets = yaml.safe_load((FAMILIES / "manifest.yaml").read_text())["sets"]
    names = [s for s in (a.sets.split(",") if a.sets else sets)]
    os.environ["DAGSTER_HOME"] = tempfile.mkdtemp()
    out = {}
    for name in names:
        v = sets[name]
        patches = [str(FAMILIES / name / f"{e['patch']}.patch") for e in v["cheats"] + v["legit"]]
        lines: list[str] = []
        t0 = time.perf_counter()
        res = judge(FAMILIES / v["spec"], read_patch_args(patches), log=lines.append)
        wall = time.perf_counter() - t0
        per = [r.gate.seconds for r in res.rows if r.gate is not None and r.gate.seconds]
        ref = next((ln for ln in lines if "reference:" in ln), "")
        out[name] = {"patches": len(patches), "wall_s": round(wall, 1), "per_patch_wall_s": round(wall / len(patches), 1),
                     "gate_median_s": round(statistics.median(per), 1) if per else None,
                     "gate_max_s": round(max(per), 1) if per else None, "reference": ref.strip()[:160]}
        print(name, out[name], flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
