"""The device pool: two runs launched together never benchmark on one device at the same time.

Two processes materialize `baseline_metrics` (a real compile + interpreter check, a few seconds each)
for two specs against one DAGSTER_HOME whose dagster.yaml gives pools a limit of 1. The step
intervals read back from the event log must not overlap, and the second run must have waited.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
from pathlib import Path

import dagster as dg
import yaml

REPO = Path(__file__).resolve().parent.parent


def _run(home: str, spec_file: str, task_id: str, out: str) -> None:
    os.environ["DAGSTER_HOME"] = home
    os.environ["KREGRESS_SPEC_FILES"] = spec_file
    from kernel_assets.assets import baseline_metrics
    from kernel_assets.definitions import build_resources

    instance = dg.DagsterInstance.get()
    res = dg.materialize([baseline_metrics], partition_key=task_id, instance=instance, resources=build_resources("local"))
    Path(out).write_text(res.run_id if res.success else "FAILED")


def test_two_runs_never_benchmark_together(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    shutil.copy(REPO / "dagster_home" / "dagster.yaml", home)
    base = yaml.safe_load((REPO / "specs" / "gemm_smoke.yaml").read_text())
    files = []
    for i, cfg in enumerate([dict(BLOCK_M=32, BLOCK_N=64, BLOCK_K=32, GROUP_M=4, num_stages=2, num_warps=4),
                             dict(BLOCK_M=64, BLOCK_N=32, BLOCK_K=32, GROUP_M=8, num_stages=2, num_warps=4)]):
        spec = dict(base, task_id=f"pool_{i}", baseline=cfg)
        p = tmp_path / f"pool_{i}.yaml"
        p.write_text(yaml.safe_dump(spec))
        files.append(p)
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    instance = dg.DagsterInstance.get()
    instance.add_dynamic_partitions("specs", ["pool_0", "pool_1"])
    # Plain processes, each exiting on its own (Dagster handles SIGTERM in a run worker, so a Pool's
    # terminate() would wait on it).
    ctx = mp.get_context("spawn")
    outs = [tmp_path / f"run_{i}.txt" for i in range(2)]
    procs = [ctx.Process(target=_run, args=(str(home), str(f), f"pool_{i}", str(outs[i]))) for i, f in enumerate(files)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=600)
        if p.is_alive():
            p.kill()
    run_ids = [o.read_text() for o in outs]
    assert "FAILED" not in run_ids

    intervals = []
    for rid in run_ids:
        logs = instance.all_logs(rid)
        start = [e.timestamp for e in logs if e.dagster_event and e.dagster_event.event_type_value == "STEP_START"]
        end = [e.timestamp for e in logs if e.dagster_event and e.dagster_event.event_type_value == "STEP_SUCCESS"]
        intervals.append((start[0], end[0]))
    (a0, a1), (b0, b1) = sorted(intervals)
    assert a1 - a0 > 1.0 and b1 - b0 > 1.0  # both really benchmarked something
    assert a1 <= b0, f"baseline steps overlapped: {intervals}"
    from kernel_assets.assets import BENCH_POOL  # the pool of this host's device: what both processes took

    assert instance.event_log_storage.get_concurrency_info(BENCH_POOL).slot_count == 1
