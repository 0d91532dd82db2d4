"""Several sweeps started at once on a fresh DAGSTER_HOME: the CLI's instance set-up (storage schemas, the
spec partition, dead-run reaping) runs once at a time under $DAGSTER_HOME/.kregress-init.lock, so none of
them dies in a concurrent schema migration. Four real processes, released together at a barrier time."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg

REPO = Path(__file__).resolve().parent.parent

PREP = """
import json, os, sys, time
from pathlib import Path
from kernel_assets.cli import _ensure_home
from kernel_assets.run_guard import prepared_instance
home = _ensure_home(sys.argv[1])
import dagster  # imported before the barrier so that all four reach the storage at the same moment
while time.time() < float(sys.argv[2]):
    time.sleep(0.005)
t0 = time.time()
instance = prepared_instance(home, sys.argv[3])
instance.get_runs(limit=1)
print(json.dumps({"ok": True, "waited_s": time.time() - t0}))
"""


def test_four_first_uses_at_once_on_a_fresh_home(tmp_path):
    home = tmp_path / "fresh_home"  # does not exist yet: no dagster.yaml, no storage
    barrier = time.time() + 15
    procs = [subprocess.Popen([sys.executable, "-c", PREP, str(home), str(barrier), f"spec_{i % 2}"], cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(4)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
        assert json.loads(out.strip().splitlines()[-1])["ok"]
    assert (home / ".kregress-init.lock").exists() and (home / "dagster.yaml").exists()
    with _instance(home) as instance:
        assert sorted(instance.get_dynamic_partitions("specs")) == ["spec_0", "spec_1"]


def _instance(home: Path):
    import os

    old = os.environ.get("DAGSTER_HOME")
    os.environ["DAGSTER_HOME"] = str(home)
    try:
        return dg.DagsterInstance.get()
    finally:
        if old is None:
            os.environ.pop("DAGSTER_HOME", None)
        else:
            os.environ["DAGSTER_HOME"] = old
