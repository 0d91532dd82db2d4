"""Seconds per judged patch, per family (issue 30, item 7): each red-team set of tests/redteam/families (or
the ones named) judged in one judgement on the CPU interpreter; per set the wall time, the reference stage
(shared by the set), and the median and largest per-patch gate time (``GateReport.seconds``: compile and
cases of one patch, side by side with the others).

    .venv/bin/python bench/judge_cost.py [--sets gemm,mla_fp8] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
FAMILIES = REPO / "tests" / "redteam" / "families"


def main() -> None:
    import yaml

    from kernel_assets.judge import judge, read_patch_args

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sets", default="")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
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
