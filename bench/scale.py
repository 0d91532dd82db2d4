"""A GPU fleet as the shared instance sees it: N sweeps on K simulated GPUs (PostgreSQL + daemon + one code server
per device) against the same N sweeps one after another in one process on the embedded default, for each K.

    .venv/bin/python bench/scale.py --devices 1,2,4,8 --json scale.json

Every benchmark step holds a simulated device (``KREGRESS_DEVICE=sim-gpu-<k>``, resources/simgpu.py) for the
batch's recorded kernel time x runs x ``KREGRESS_SIM_SCALE``, sleeping, so the host's CPU is free as on a real
fleet; everything else in the step (replay, ledger, verdict, report) is real. The scale is set so that a
benchmark step holds its device ``--step-device-s`` (default 15 s) on average: a batch of a few variants
timed on a real GPU. It starts its own throwaway PostgreSQL, code servers and daemon
(kernel_assets/testing/shared_instance.py) and stops them. Phases:

1. for each K: N = ``--per-device`` x K replay sweeps, one Dagster backfill per device (the code server of
   sim-gpu-0 .. sim-gpu-<K-1>), run by the daemon. From the event log: steps per device at once (must be 1;
   the devices' own hold logs are checked too), queue wait per sweep (run queue + waiting for a device slot),
   orchestration seconds per step (``RunTimeline``: run launch, input/output handling and events inside steps,
   gaps between steps, run end: all but the steps' own work and the slot waits); from pg_stat_activity,
   sampled every 0.2 s: the peak PostgreSQL connections;
2. kill: one more sweep, its run worker SIGKILLed while its first benchmark step holds sim-gpu-0; seconds
   until its slot is free again (``--free-slots``; deploy/dagster.yaml ships 120); its retry is waited for;
3. backfill: ``--backfill`` (24) new replay specs, found by the spec sensor's own logic (``evaluate_specs``)
   and submitted as two teams' backfills (tag ``team``: a first, then b) spread over the devices; the
   ``team`` tag concurrency limit (deploy/dagster.yaml, here half the run cap) makes them interleave; every
   partition must be materialized exactly once, and the sensor's logic run again with nothing changed must
   start no benchmark step;
4. sequential: the largest N specs materialized one after another in one process on the embedded default
   (SQLite, in-process executor, sim-gpu-0 at the same scale); the time for K's N sweeps is that process's
   start plus its first N sweeps.

``throughput_ratio`` = sequential wall time / shared wall time for the same N sweeps (K would be perfect).
``pays_off_above_device_s_per_step``: the device seconds per benchmark step above which the shared instance
beats the embedded default on this machine (each side's measured non-device seconds plus device time scaled).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import yaml  # noqa: E402

from kernel_assets.testing.shared_instance import (  # noqa: E402
    TEST_TIMING,
    SharedInstance,
    max_benchmark_steps_per_device,
    max_concurrent,
    replay_spec,
)

SEQUENTIAL = r"""
import json, sys, time
import dagster as dg
from kernel_assets.definitions import defs
from kernel_assets.testing.shared_instance import run_timeline
instance = dg.DagsterInstance.get()
job = defs.resolve_job_def("sweep_job")
instance.add_dynamic_partitions("specs", sys.argv[1:])
ready = time.time()
out = []
for task in sys.argv[1:]:
    res = job.execute_in_process(partition_key=task, instance=instance, raise_on_error=False)
    tl = run_timeline(instance, res.run_id)
    out.append({"task": task, "end": time.time(), "ok": res.success, "steps": tl.steps, "own_s": tl.own_s,
                "overhead_s": tl.overhead_s})
print(json.dumps({"ready": ready, "sweeps": out}))
"""

HOLDS = "simgpu"  # the simulated devices' lock and hold log, under each DAGSTER_HOME


def gemm_spec(task_id: str) -> dict:
    spec = yaml.safe_load((REPO / "specs" / "gemm_smoke.yaml").read_text())
    spec["task_id"] = task_id
    return spec


def make_specs(kind: str, n: int, prefix: str) -> list[dict]:
    return [replay_spec(f"{prefix}{i}") if kind == "replay" else gemm_spec(f"{prefix}{i}") for i in range(n)]


def scale_for(step_device_s: float, variants: int) -> tuple[float, float]:
    """(KREGRESS_SIM_SCALE, unscaled device seconds of one variant): the factor that makes a replay sweep's
    benchmark steps hold their device ``step_device_s`` on average. A sweep of one round has two benchmark
    steps: the baseline alone, then the round's variants with the baseline re-timed beside them; each variant
    is about the baseline's recorded runs (32 runs of its recorded kernel time)."""
    from kernel_assets.testing.shared_instance import REPLAY_SPEC
    from kregress.core.bind import load_bound

    bound = load_bound(REPLAY_SPEC)
    spec = bound.spec
    per_variant = sum(sum(m.samples_ms) for shape in spec.shape_matrix
                      for m in bound.family.replay(spec.baseline, shape, spec.params)[0]) / 1e3
    per_step = (1 + (variants + 1)) / 2 * per_variant
    return step_device_s / per_step, per_variant


def quantiles(xs: list[float]) -> tuple[float, float]:
    import numpy as np

    return (float(np.quantile(xs, 0.5)), float(np.quantile(xs, 0.9))) if xs else (0.0, 0.0)


def holds_between(home: Path, t0: float, t1: float) -> dict[str, list]:
    """{pool: the simulated device's holds that began in [t0, t1]}."""
    from resources.simgpu import all_holds

    return {pool: [h for h in hs if t0 <= h.start <= t1] for pool, hs in all_holds(home / HOLDS).items()}


def backfill_runs(si: SharedInstance, backfill_ids: list[str]) -> list[str]:
    import dagster as dg

    return [r.run_id for b in backfill_ids
            for r in si.instance.get_runs(filters=dg.RunsFilter(tags={"dagster/backfill": b}))]


def fleet_figures(si: SharedInstance, run_ids: list[str], t0: float) -> dict:
    """What the event log and the devices say about a set of finished runs submitted at ``t0``."""
    from kernel_assets.testing.shared_instance import run_timeline

    statuses = {rid: si.instance.get_run_by_id(rid).status.value for rid in run_ids}
    tls = [run_timeline(si.instance, rid) for rid in run_ids]
    end = max(tl.end for tl in tls)
    ivs = si.intervals(run_ids)
    per_device = max_benchmark_steps_per_device(ivs)
    holds = holds_between(si.home, t0, end)
    hold_overlap = {p: max_concurrent([(h.start, h.end) for h in hs]) for p, hs in holds.items() if hs}
    n_steps = sum(tl.steps for tl in tls)
    held = [h.seconds for hs in holds.values() for h in hs]
    waits = [tl.queued_s + tl.slot_wait_s for tl in tls]
    p50, p90 = quantiles(waits)

    def per_step(attr: str) -> float:
        return round(sum(getattr(tl, attr) for tl in tls) / max(1, n_steps), 3)

    return {
        "wall_s": end - t0, "failed": sum(1 for s in statuses.values() if s != "SUCCESS"),
        "per_device": per_device, "holds_at_once": hold_overlap,
        "contended_holds": sum(1 for hs in holds.values() for h in hs if h.contended),
        "device_pools": sorted(p for p, hs in holds.items() if hs), "event_log_pools": sorted(per_device),
        "device_s": sum(held), "device_s_per_step": sum(held) / max(1, len(held)), "benchmark_steps": len(held),
        "busiest_device_s": max((sum(h.seconds for h in hs) for hs in holds.values()), default=0.0),
        "queue_wait_p50_s": p50, "queue_wait_p90_s": p90,
        "run_queue_p50_s": quantiles([tl.queued_s for tl in tls])[0],
        "slot_wait_p50_s": quantiles([tl.slot_wait_s for tl in tls])[0],
        "steps": n_steps, "runs": len(tls),
        "overhead_per_step_s": per_step("overhead_s"),
        "overhead_per_run_s": round(sum(tl.overhead_s for tl in tls) / max(1, len(tls)), 3),
        "overhead_parts_per_step_s": {"run_launch": per_step("launch_s"), "inside_steps": per_step("in_steps_s"),
                                      "between_steps": per_step("between_steps_s"), "run_end": per_step("tail_s")},
        "own_work_per_step_s": per_step("own_s"),
        "runs_at_once": max_concurrent([(tl.start, tl.end) for tl in tls]),
        "steps_at_once": max_concurrent([(iv.start, iv.end) for iv in ivs]), "peak": si.peak_connections(),
        "timelines": tls, "intervals": ivs,
    }


def fleet_phase(si: SharedInstance, k: int, tasks: list[str]) -> dict:
    """The N sweeps as one backfill per device (host_0 .. host_<k-1>, round robin), run by the daemon."""
    from kernel_assets.testing.shared_instance import submit_backfill

    si.reset_peak()
    t0 = time.time()
    ids = [submit_backfill(si.instance, si.root / f"ws_host_{d}.yaml", f"host_{d}", tasks[d::k])
           for d in range(k) if tasks[d::k]]
    submit_s = time.time() - t0
    run_ids = backfill_runs(si, ids)
    if len(run_ids) != len(tasks):
        raise RuntimeError(f"{len(tasks)} sweeps submitted, {len(run_ids)} runs found")
    si.wait_finished(run_ids, timeout_s=3600)
    return {**fleet_figures(si, run_ids, t0), "submit_s": submit_s}


def kill_phase(si: SharedInstance, task: str, location: str, pool: str) -> dict:
    import dagster as dg

    from kernel_assets.run_guard import worker_process

    rid, p = si.launch(location, task)  # `dagster job launch`: a run outside any backfill is retried by the daemon
    p.communicate(timeout=600)
    deadline = time.monotonic() + 900
    while not any(e.step_key == "baseline_metrics"  # the first benchmark step: holding its device
                  for e in si.instance.all_logs(rid, of_type=dg.DagsterEventType.STEP_START)):
        if time.monotonic() > deadline:
            raise TimeoutError("the sweep to kill never reached baseline_metrics")
        time.sleep(0.05)
    pid, _ = worker_process(si.instance, rid)
    os.kill(pid, signal.SIGKILL)
    t_kill = time.time()
    done = {e.step_key for e in si.instance.all_logs(rid, of_type=dg.DagsterEventType.STEP_SUCCESS)}
    inside = "baseline_metrics" not in done
    storage = si.instance.event_log_storage
    while (si.instance.get_run_by_id(rid).status != dg.DagsterRunStatus.FAILURE):
        if time.time() - t_kill > 300:
            raise TimeoutError("the killed run was never marked failed")
        time.sleep(0.1)
    t_failed = time.time()
    while rid in {s.run_id for s in storage.get_concurrency_info(pool).claimed_slots}:
        if time.time() - t_kill > 600:
            raise TimeoutError("the killed run's slot was never freed")
        time.sleep(0.1)
    t_freed = time.time()
    end = si.instance.get_run_record_by_id(rid).end_time
    retries = []
    while not retries and time.time() - t_kill < 300:
        retries = si.instance.get_runs(filters=dg.RunsFilter(tags={"dagster/parent_run_id": rid}))
        time.sleep(0.5)
    try:  # its retry re-runs the sweep from the failed step; its status when it ended (or after 5 minutes)
        retry_status = si.wait_finished([r.run_id for r in retries], 300) if retries else {}
    except TimeoutError:
        retry_status = {r.run_id: si.instance.get_run_by_id(r.run_id).status.value for r in retries}
    return {"killed_inside_benchmark_step": inside, "kill_to_failed_s": t_failed - t_kill,
            "kill_to_slot_freed_s": t_freed - t_kill, "run_end_to_slot_freed_s": t_freed - end,
            "retry": list(retry_status.values())}


def backfill_phase(si: SharedInstance, k: int, n: int, team_limit: int) -> dict:
    """``n`` new replay specs, found by the spec sensor's own logic (``evaluate_specs``: new, changed, not yet
    swept), submitted as two teams' backfills (team a's half first, then team b's), tagged ``team``, one
    partition per device in turn; then the same logic again with nothing changed."""
    from datetime import datetime, timezone

    import dagster as dg

    from kernel_assets.automation import evaluate_specs
    from kernel_assets.specs_resource import SpecStore
    from kernel_assets.testing.shared_instance import submit_backfill
    from kregress.core.names import is_benchmark_pool

    store = SpecStore(specs_dir=str(si.specs_dir), extra_files=[])
    before = evaluate_specs(None, si.instance, store)  # the sensor's cursor: every spec so far (all swept)
    tasks = [f"bf_{i:02d}" for i in range(n)]
    for t in tasks:  # files only: the sensor adds their partitions
        (si.specs_dir / f"{t}.yaml").write_text(yaml.safe_dump(replay_spec(t), sort_keys=False))
    t0 = time.time()
    found = evaluate_specs(before.cursor, si.instance, store)
    for req in found.dynamic_partitions_requests:
        si.instance.add_dynamic_partitions(req.partitions_def_name, list(req.partition_keys))
    todo = [r.partition_key for r in found.run_requests]
    if sorted(todo) != tasks:
        raise RuntimeError(f"the sensor's logic asked for {sorted(todo)}, expected the {n} new specs")
    teams = {t: ("a" if i < n // 2 else "b") for i, t in enumerate(tasks)}
    ids = [submit_backfill(si.instance, si.root / f"ws_host_{i % k}.yaml", f"host_{i % k}", [t],
                           tags={"team": teams[t], "kregress/trigger": "new spec"}) for i, t in enumerate(tasks)]
    submit_s = time.time() - t0
    run_ids = backfill_runs(si, ids)
    si.wait_finished(run_ids, timeout_s=3600)
    figures = fleet_figures(si, run_ids, t0)
    # exactly once: one run and one materialization of each asset per partition
    per_partition = {}
    for t in tasks:
        runs = si.instance.get_runs(filters=dg.RunsFilter(tags={"dagster/partition": t}))
        mats = [len(si.instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=dg.AssetKey(key), asset_partitions=[t]), limit=10).records)
            for key in ("baseline_metrics", "verdict_report")]
        per_partition[t] = (len(runs), *mats)
    exactly_once = all(v == (1, 1, 1) for v in per_partition.values())
    # fairness: the order in which the teams' runs started, overall and on each device
    team_of = {rid: si.instance.get_run_by_id(rid).tags.get("team", "?") for rid in run_ids}
    starts = sorted((tl.start, team_of[tl.run_id]) for tl in figures["timelines"])
    by_device: dict[str, list] = {}
    for iv in sorted(figures["intervals"], key=lambda iv: iv.start):
        if is_benchmark_pool(iv.pool) and iv.step == "baseline_metrics":
            by_device.setdefault(iv.pool, []).append(team_of[iv.run_id])
    a_runs = [tl for tl in figures["timelines"] if team_of[tl.run_id] == "a"]
    b_runs = [tl for tl in figures["timelines"] if team_of[tl.run_id] == "b"]
    a_last_start = max(tl.start for tl in a_runs)
    b_first_start = min(tl.start for tl in b_runs)
    # the rerun: the sensor's logic with nothing changed (its own cursor, and a fresh one); whatever it asks for
    # would be backfilled the same way
    t1 = time.time()
    again = evaluate_specs(found.cursor, si.instance, store)
    fresh = evaluate_specs(None, si.instance, store)
    rerun = [r.partition_key for r in again.run_requests]
    rerun_ids = backfill_runs(si, [submit_backfill(si.instance, si.root / f"ws_host_{i % k}.yaml", f"host_{i % k}",
                                                   [t]) for i, t in enumerate(rerun)])
    if rerun_ids:
        si.wait_finished(rerun_ids, timeout_s=3600)
    since = si.instance.get_runs(filters=dg.RunsFilter(created_after=datetime.fromtimestamp(t1, tz=timezone.utc)))
    rerun_steps = sum(1 for iv in si.intervals([r.run_id for r in since]) if is_benchmark_pool(iv.pool))
    return {**figures, "submit_s": submit_s, "exactly_once": exactly_once, "per_partition": per_partition,
            "rerun_requests": len(rerun), "rerun_requests_fresh_cursor": sum(1 for r in fresh.run_requests if r.partition_key in tasks),
            "rerun_runs": len(since), "rerun_steps": rerun_steps, "rerun_s": time.time() - t1,
            "team_limit": team_limit, "start_order": "".join(t for _, t in starts),
            "device_order": {p: "".join(ts) for p, ts in by_device.items()},
            "b_first_start_before_a_last_start": b_first_start < a_last_start,
            "a_started_before_b_first": sum(1 for tl in a_runs if tl.start < b_first_start)}


def sequential_phase(specs: list[dict], root: Path, scale: float) -> dict:
    """The specs one after another in one process on the embedded default, on one simulated device."""
    home = root / "seq_home"
    specs_dir = root / "seq_specs"
    home.mkdir(parents=True)
    specs_dir.mkdir(parents=True)
    (home / "dagster.yaml").write_text((REPO / "dagster_home" / "dagster.yaml").read_text())
    for spec in specs:
        (specs_dir / f"{spec['task_id']}.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KREGRESS_", "DAGSTER_", "TAOTOKEN_"))}
    env.update(DAGSTER_HOME=str(home), KREGRESS_SPECS_DIR=str(specs_dir), TRITON_DEFAULT_FP_FUSION="1",
               KREGRESS_EXECUTOR="in_process", KREGRESS_DEVICE="sim-gpu-0", KREGRESS_SIM_SCALE=repr(scale))
    t0 = time.time()
    res = subprocess.run([sys.executable, "-c", SEQUENTIAL, *[s["task_id"] for s in specs]], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=7200)
    if res.returncode:
        raise RuntimeError(f"sequential sweeps failed: {res.stderr[-3000:]}")
    got = json.loads(res.stdout.strip().splitlines()[-1])
    holds = holds_between(home, t0, time.time())
    held = sorted((h for hs in holds.values() for h in hs), key=lambda h: h.start)
    return {"t0": t0, "startup_s": got["ready"] - t0, "sweeps": got["sweeps"], "holds": held}


def sequential_prefix(seq: dict, n: int) -> dict:
    """The sequential side of the first ``n`` sweeps: its process start plus those sweeps, one after another."""
    sweeps = seq["sweeps"][:n]
    end = sweeps[-1]["end"]
    held = [h.seconds for h in seq["holds"] if h.start <= end]
    steps = sum(s["steps"] for s in sweeps)
    return {"wall_s": end - seq["t0"], "failed": sum(1 for s in sweeps if not s["ok"]), "device_s": sum(held),
            "overhead_per_step_s": sum(s["overhead_s"] for s in sweeps) / max(1, steps),
            "overhead_per_run_s": sum(s["overhead_s"] for s in sweeps) / max(1, len(sweeps))}


def pays_off_above(shared: dict, seq: dict, n: int) -> float | None:
    """The device seconds per benchmark step above which the shared instance finishes the n sweeps sooner than
    the embedded default, on this machine: each side's wall is its non-device seconds (measured: wall minus
    device time, the shared side's device time being its busiest device's) plus device time, which a longer
    batch stretches by the same factor on both sides. None when the shared side never catches up (one device)."""
    seq_fixed = seq["wall_s"] - seq["device_s"]
    shared_fixed = shared["wall_s"] - shared["busiest_device_s"]
    gain = seq["device_s"] - shared["busiest_device_s"]
    if gain <= 1e-9:
        return None
    x = max(0.0, (shared_fixed - seq_fixed) / gain)
    return round(x * shared["device_s_per_step"], 2)


def run_backfill(si: SharedInstance, max_k: int, n: int, team_limit: int, figures: dict) -> dict:
    print(f"  change-driven backfill of {n} new specs, teams a and b ...", file=sys.stderr)
    bf = backfill_phase(si, max_k, n, team_limit)
    figures.update(backfill_24_s=round(bf["wall_s"], 1), backfill_24_rerun_steps=bf["rerun_steps"])
    figures["backfill"] = {
        "specs": n, "exactly_once": bf["exactly_once"], "failed": bf["failed"],
        "runs": bf["runs"], "submit_s": round(bf["submit_s"], 1),
        "max_steps_per_device": max(list(bf["per_device"].values()) + list(bf["holds_at_once"].values())),
        "device_s_per_step": round(bf["device_s_per_step"], 2),
        "overhead_per_step_s": bf["overhead_per_step_s"], "overhead_per_run_s": bf["overhead_per_run_s"],
        "queue_wait_p50_s": round(bf["queue_wait_p50_s"], 2), "queue_wait_p90_s": round(bf["queue_wait_p90_s"], 2),
        "pg_connections": int(bf["peak"].get("total", 0)),
        "rerun_requests": bf["rerun_requests"], "rerun_requests_fresh_cursor": bf["rerun_requests_fresh_cursor"],
        "rerun_runs": bf["rerun_runs"], "rerun_s": round(bf["rerun_s"], 1),
        "fairness": {"tag": "team", "limit_per_team": bf["team_limit"], "run_start_order": bf["start_order"],
                     "baseline_step_order_per_device": bf["device_order"],
                     "team_b_started_before_team_a_finished_starting": bf["b_first_start_before_a_last_start"],
                     "team_a_runs_started_before_team_b_first": bf["a_started_before_b_first"]},
    }
    print(f"  backfill: {bf['wall_s']:.1f} s, exactly once: {bf['exactly_once']}, rerun steps "
          f"{bf['rerun_steps']}; run starts {bf['start_order']}", file=sys.stderr)
    return bf


def k_figures(k: int, n: int, f: dict, s: dict) -> dict:
    """The per-K entry of the JSON: the shared phase ``f`` against the sequential prefix ``s``."""
    return {
        "throughput_ratio": round(s["wall_s"] / f["wall_s"], 3),
        "queue_wait_p50_s": round(f["queue_wait_p50_s"], 2), "queue_wait_p90_s": round(f["queue_wait_p90_s"], 2),
        "overhead_per_step_s": f["overhead_per_step_s"],
        "max_steps_per_device": max(list(f["per_device"].values()) + list(f["holds_at_once"].values()) + [0]),
        "pg_connections": int(f["peak"].get("total", 0)), "failed": f["failed"] + s["failed"],
        # the details behind them
        "sweeps": n, "shared_wall_s": round(f["wall_s"], 1), "sequential_wall_s": round(s["wall_s"], 1),
        "ideal_ratio": k, "device_s_per_step": round(f["device_s_per_step"], 2),
        "shared_device_s": round(f["device_s"], 1), "sequential_device_s": round(s["device_s"], 1),
        "overhead_per_run_s": f["overhead_per_run_s"], "overhead_parts_per_step_s": f["overhead_parts_per_step_s"],
        "own_work_per_step_s": f["own_work_per_step_s"], "steps_per_run": round(f["steps"] / max(1, f["runs"]), 1),
        "sequential_overhead_per_step_s": round(s["overhead_per_step_s"], 3),
        "sequential_overhead_per_run_s": round(s["overhead_per_run_s"], 3),
        "run_queue_p50_s": round(f["run_queue_p50_s"], 2), "slot_wait_p50_s": round(f["slot_wait_p50_s"], 2),
        "pays_off_above_device_s_per_step": pays_off_above(f, s, n),
        "submit_s": round(f["submit_s"], 1), "runs_at_once": f["runs_at_once"], "steps_at_once": f["steps_at_once"],
        "contended_device_holds": f["contended_holds"], "pools": f["device_pools"],
        "pools_match_event_log": f["device_pools"] == f["event_log_pools"],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--devices", default="1,2,4,8", help="simulated GPUs to run on, comma-separated (default 1,2,4,8)")
    ap.add_argument("--per-device", type=int, default=2, help="sweeps per device: N = this x K (default 2)")
    ap.add_argument("--step-device-s", type=float, default=15.0,
                    help="mean simulated device seconds per benchmark step (sets KREGRESS_SIM_SCALE; default 15)")
    ap.add_argument("--backfill", type=int, default=24, help="new specs in the change-driven backfill (default 24; 0: skip)")
    ap.add_argument("--max-runs", type=int, default=0,
                    help="concurrency.runs.max_concurrent_runs (default 0: 2 x the largest K, so every device has a "
                         "run waiting behind the one it times)")
    ap.add_argument("--free-slots", type=int, default=10,
                    help="run_monitoring.free_slots_after_run_end_seconds for the kill phase (deploy ships 120)")
    ap.add_argument("--monitor-s", type=int, default=5,
                    help="run_monitoring.poll_interval_seconds (deploy ships 30; each poll asks a code server per run)")
    ap.add_argument("--executor", choices=("in_process", "multiprocess"), default="in_process",
                    help="the run workers' executor (default in_process: fewest processes on a small machine)")
    ap.add_argument("--steps-per-run", type=int, default=2, help="KREGRESS_STEPS_PER_RUN under --executor multiprocess")
    ap.add_argument("--skip-kill", action="store_true", help="leave out the kill phase (and the summary table)")
    ap.add_argument("--json", metavar="OUT", help="write the figures as JSON (also after each phase, as they stand)")
    args = ap.parse_args(argv)
    import importlib.util

    missing = [m for m in ("dagster_postgres", "dagster_k8s") if importlib.util.find_spec(m) is None]
    if missing:  # the shared instance's storage and executor: without them Dagster stops with a CheckError
        print(f"bench/scale.py: needs the deploy extra ({', '.join(missing)} not installed). Fix: "
              f"{Path(sys.executable).parent / 'pip'} install -e '.[deploy]'", file=sys.stderr)
        return 2

    import socket

    from kernel_assets.executors import pg_connection_bound
    from kregress.core.names import device_pool

    ks = sorted({int(x) for x in args.devices.split(",") if x.strip()})
    if not ks or ks[0] < 1:
        ap.error(f"--devices {args.devices!r}: give positive integers, e.g. --devices 1,2,4,8")
    max_k, max_n = ks[-1], args.per_device * ks[-1]
    max_runs = args.max_runs or 2 * max_k
    variants = replay_spec("x")["search"]["variants_per_round"]
    scale, per_variant_s = scale_for(args.step_device_s, variants)
    root = Path(tempfile.mkdtemp(prefix="kregress-scale-"))
    hosts = {f"host_{i}": {"KREGRESS_DEVICE": f"sim-gpu-{i}"} for i in range(max_k)}
    specs = make_specs("replay", max_n, "scale_")
    kill_spec = replay_spec("scale_kill")  # killed while its first benchmark step holds device 0
    team_limit = max(1, max_runs // 2)
    overrides = {**TEST_TIMING, ("concurrency", "runs", "max_concurrent_runs"): max_runs,
                 ("run_monitoring", "free_slots_after_run_end_seconds"): args.free_slots,
                 ("run_monitoring", "poll_interval_seconds"): args.monitor_s,
                 ("concurrency", "runs", "tag_concurrency_limits"): [
                     {"key": "team", "value": {"applyLimitPerUniqueValue": True}, "limit": team_limit}]}
    env_extra = {"KREGRESS_EXECUTOR": args.executor, "KREGRESS_SIM_SCALE": repr(scale)}
    if args.executor == "multiprocess":
        env_extra["KREGRESS_STEPS_PER_RUN"] = str(args.steps_per_run)
    bound = pg_connection_bound(max_runs, args.steps_per_run, executor=args.executor, code_servers=max_k)
    t_bench = time.time()
    figures: dict = {
        "spec": "replay", "devices": ks, "per_device": args.per_device, "executor": args.executor,
        "max_concurrent_runs": max_runs, "sim_scale": round(scale, 3), "step_device_s_target": args.step_device_s,
        "recorded_device_s_per_variant": round(per_variant_s, 4), "pg_connection_bound": bound,
        "free_slots_after_run_end_seconds": float(args.free_slots), "monitor_poll_s": args.monitor_s,
    }

    def checkpoint(phase: str) -> None:
        figures["bench_wall_s"] = round(time.time() - t_bench, 1)
        figures["phases_done"] = figures.get("phases_done", []) + [phase]
        if args.json:
            Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")

    # 1. the embedded default first: every K's ratio can be written as soon as its shared phase ends
    print(f"the largest N ({max_n}) sweeps one after another in one process on sim-gpu-0 "
          f"(KREGRESS_SIM_SCALE={scale:.2f}) under {root} ...", file=sys.stderr)
    if max_n:
        seq = sequential_phase(specs, root, scale)
        figures["sequential_startup_s"] = round(seq["startup_s"], 1)
        print(f"  {len(seq['sweeps'])} sweeps in {seq['sweeps'][-1]['end'] - seq['t0']:.1f} s", file=sys.stderr)
        checkpoint("sequential")

    si = SharedInstance(root, hosts=hosts, specs={s["task_id"]: s for s in specs + [kill_spec]}, env_extra=env_extra,
                        overrides=overrides)
    per_k: dict[int, dict] = {}
    kill = bf = None
    try:
        print(f"starting PostgreSQL, {max_k} code server(s) (sim-gpu-0..{max_k - 1}) and the daemon ...", file=sys.stderr)
        si.start()
        for loc, port in si.ports.items():  # one workspace file per device: a backfill loads only its location
            (root / f"ws_{loc}.yaml").write_text(yaml.safe_dump({"load_from": [
                {"grpc_server": {"host": "localhost", "port": port, "location_name": loc}}]}))
        figures.update(postgres_version=si.postgres_version, startup_s=round(si.start_seconds, 1))
        print(f"  up in {si.start_seconds:.1f} s (PostgreSQL {si.postgres_version})", file=sys.stderr)
        # the largest K first and the backfill after the two largest: on a loaded machine the phases that matter
        # most are written (checkpoint) first
        order: list = sorted(ks, reverse=True) if max_n else []  # --per-device 0: the backfill alone
        order.insert(min(2, len(order)), "backfill")
        for k in order:
            if k == "backfill":
                if args.backfill:
                    try:
                        bf = run_backfill(si, max_k, args.backfill, team_limit, figures)
                    except Exception as exc:  # noqa: BLE001 - recorded; the other phases still run
                        figures["backfill_error"] = f"{type(exc).__name__}: {exc}"[:2000]
                        print(f"  backfill failed: {figures['backfill_error']}", file=sys.stderr)
                    checkpoint("backfill")
                continue
            n = args.per_device * k
            per_k[k] = f = fleet_phase(si, k, [s["task_id"] for s in specs[:n]])
            figures[str(k)] = k_figures(k, n, f, sequential_prefix(seq, n))
            print(f"  K={k}: {n} sweeps in {f['wall_s']:.1f} s (ratio {figures[str(k)]['throughput_ratio']}), "
                  f"{f['failed']} failed, device {f['device_s_per_step']:.1f} s/step, overhead "
                  f"{f['overhead_per_step_s']:.2f} s/step", file=sys.stderr)
            checkpoint(f"K={k}")
        if max_n == 0 and args.backfill:
            bf = run_backfill(si, max_k, args.backfill, team_limit, figures)
            checkpoint("backfill")
        if args.skip_kill:
            return 0 if (not bf or (bf["exactly_once"] and bf["rerun_steps"] == 0 and bf["failed"] == 0)) else 1
        print("  killing a run worker inside its benchmark step ...", file=sys.stderr)
        kill = kill_phase(si, kill_spec["task_id"], "host_0", device_pool(socket.gethostname(), "sim-gpu-0"))
        figures.update(slot_recovery_s=round(kill["kill_to_slot_freed_s"], 2),
                       kill_to_failed_s=round(kill["kill_to_failed_s"], 2),
                       run_end_to_slot_freed_s=round(kill["run_end_to_slot_freed_s"], 2),
                       killed_inside_benchmark_step=kill["killed_inside_benchmark_step"],
                       retry_of_killed_run=kill["retry"])
    finally:
        si.stop()

    by_k = {str(k): figures[str(k)] for k in ks}  # in K order in the table
    top = per_k[max_k]
    figures.update({
        "sweeps": max_n,
        "failed": sum(v["failed"] for v in by_k.values()) + (bf["failed"] if bf else 0),
        "max_benchmark_steps_per_device": max([v["max_steps_per_device"] for v in by_k.values()]
                                              + ([figures["backfill"]["max_steps_per_device"]] if bf else [])),
        "throughput_ratio": by_k[str(max_k)]["throughput_ratio"],
        "peak_pg_connections": max([int(f["peak"].get("total", 0)) for f in per_k.values()]
                                   + ([figures["backfill"]["pg_connections"]] if bf else [])),
        "peak_pg_connections_by_db": {k: v for k, v in top["peak"].items() if k != "total"},
    })
    checkpoint("kill")
    header = ("K", "sweeps", "shared s", "sequential s", "ratio", "ideal", "wait p50/p90 s", "overhead s/step",
              "device s/step", "max steps/device", "PG conns", "failed", "pays off above s/step")
    rows = [(k, v["sweeps"], v["shared_wall_s"], v["sequential_wall_s"], v["throughput_ratio"], v["ideal_ratio"],
             f"{v['queue_wait_p50_s']}/{v['queue_wait_p90_s']}", v["overhead_per_step_s"], v["device_s_per_step"],
             v["max_steps_per_device"], v["pg_connections"], v["failed"], v["pays_off_above_device_s_per_step"])
            for k, v in by_k.items()]
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    for r in [header, *rows]:
        print("  ".join(f"{str(x):>{w}}" for x, w in zip(r, widths)))
    print(f"kill -> slot free {figures['slot_recovery_s']} s (free_slots_after_run_end_seconds {args.free_slots}); "
          f"retry {', '.join(kill['retry']) or 'none'}; peak PostgreSQL connections {figures['peak_pg_connections']} "
          f"(bound {bound}); PostgreSQL {figures['postgres_version']}")
    if bf:
        print(f"backfill of {args.backfill}: {figures['backfill_24_s']} s, exactly once {bf['exactly_once']}, rerun "
              f"{bf['rerun_requests']} request(s), {bf['rerun_steps']} benchmark step(s); run starts by team "
              f"{bf['start_order']} (limit {bf['team_limit']} per team)")
    ok = figures["failed"] == 0 and figures["max_benchmark_steps_per_device"] <= 1 and "backfill_error" not in figures
    if bf:
        ok = ok and bf["exactly_once"] and bf["rerun_steps"] == 0
    return 0 if ok else 1


def _interrupt_once(_signo, _frame) -> None:
    """The first Ctrl-C unwinds main() (its ``finally`` stops PostgreSQL, the code servers and the daemon); any
    further one is ignored, so the tidying up is not cut short."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt


def cli(argv: list[str] | None = None) -> int:
    """main() with Ctrl-C as one line and exit 130: no traceback, no process left behind."""
    signal.signal(signal.SIGINT, _interrupt_once)
    try:
        return main(argv)
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        print("bench/scale.py: interrupted (Ctrl-C); PostgreSQL, the code servers and the daemon it started are "
              "stopped; figures of the phases done so far are in --json OUT if given", file=sys.stderr, flush=True)
        return 130


if __name__ == "__main__":
    sys.exit(cli())
