"""N sweeps queued on a shared instance (PostgreSQL + daemon + one code server per simulated GPU host) against the
same N sweeps run one after another in one process.

    .venv/bin/python bench/scale.py --sweeps 4 --json scale.json

It starts its own throwaway PostgreSQL, code servers and daemon (kernel_assets/testing/shared_instance.py) and stops them. Three
phases, printed as one table:

1. shared: the N sweeps (copies of the replay spec, or of gemm_smoke with ``--spec gemm``) submitted at once with
   ``dagster job launch``, spread over ``--devices`` simulated hosts (KREGRESS_DEVICE gpu-0, gpu-1, ...), run by the
   daemon; from the event log: the largest number of benchmark steps on one device at once (must be 1); from
   pg_stat_activity, sampled every 0.2 s: the peak number of PostgreSQL connections;
2. kill: one more sweep (a gemm_smoke copy, whose first benchmark step compiles and checks for seconds), its run
   worker SIGKILLed inside that step; seconds until its slot is free again (``free_slots_after_run_end_seconds``
   is set by ``--free-slots``; deploy/dagster.yaml ships 120); the automatic retry is waited for;
3. sequential: the same N specs materialized one after another in one process on the embedded default
   (SQLite, in-process executor), the way ``kregress sweep`` runs them.

``throughput_ratio`` = sequential wall time / shared wall time (above 1: the shared instance finished the N
sweeps sooner). Both sides pay their own start-up (the shared side: queue, code-server run workers; the
sequential side: one import), and both run on this machine's cores; on a machine with few cores the ratio
says how much the queue and pools cost, not what several GPU hosts gain.
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
import json, os, sys, time
t0 = time.perf_counter()
import dagster as dg
from kernel_assets.definitions import build_resources, defs
instance = dg.DagsterInstance.get()
job = defs.resolve_job_def("sweep_job")
instance.add_dynamic_partitions("specs", sys.argv[1:])
failed = 0
for task in sys.argv[1:]:
    res = job.execute_in_process(partition_key=task, instance=instance, raise_on_error=False)
    failed += 0 if res.success else 1
print(json.dumps({"wall_s": time.perf_counter() - t0, "failed": failed}))
"""


def gemm_spec(task_id: str) -> dict:
    spec = yaml.safe_load((REPO / "specs" / "gemm_smoke.yaml").read_text())
    spec["task_id"] = task_id
    return spec


def make_specs(kind: str, n: int, prefix: str) -> list[dict]:
    return [replay_spec(f"{prefix}{i}") if kind == "replay" else gemm_spec(f"{prefix}{i}") for i in range(n)]


def shared_phase(si: SharedInstance, tasks: list[str], locations: list[str]) -> dict:
    si.reset_peak()
    t0 = time.perf_counter()
    launched = [si.launch(locations[i % len(locations)], task) for i, task in enumerate(tasks)]
    for _, p in launched:
        out = p.communicate(timeout=600)[0]
        if p.returncode:
            raise RuntimeError(f"dagster job launch failed: {out[-2000:]}")
    run_ids = [rid for rid, _ in launched]
    statuses = si.wait_finished(run_ids, timeout_s=3600)
    wall = time.perf_counter() - t0
    ivs = si.intervals(run_ids)
    per_device = max_benchmark_steps_per_device(ivs)
    return {"wall_s": wall, "failed": sum(1 for s in statuses.values() if s != "SUCCESS"), "per_device": per_device,
            "runs_at_once": max_concurrent(si.run_intervals(run_ids)),
            "steps_at_once": max_concurrent([(iv.start, iv.end) for iv in ivs]), "peak": si.peak_connections()}


def kill_phase(si: SharedInstance, task: str, location: str, pool: str) -> dict:
    import dagster as dg

    from kernel_assets.run_guard import worker_process

    rid, p = si.launch(location, task)
    p.communicate(timeout=600)
    deadline = time.monotonic() + 900
    while not any(e.step_key == "baseline_metrics"  # the first benchmark step: AOT compile, checks, timing
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
    retry_status = si.wait_finished([r.run_id for r in retries], 1800) if retries else {}
    return {"killed_inside_benchmark_step": inside, "kill_to_failed_s": t_failed - t_kill,
            "kill_to_slot_freed_s": t_freed - t_kill, "run_end_to_slot_freed_s": t_freed - end,
            "retry": list(retry_status.values())}


def sequential_phase(specs: list[dict], root: Path) -> dict:
    home = root / "seq_home"
    specs_dir = root / "seq_specs"
    home.mkdir(parents=True)
    specs_dir.mkdir(parents=True)
    (home / "dagster.yaml").write_text((REPO / "dagster_home" / "dagster.yaml").read_text())
    for spec in specs:
        (specs_dir / f"{spec['task_id']}.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KREGRESS_", "DAGSTER_", "TAOTOKEN_"))}
    env.update(DAGSTER_HOME=str(home), KREGRESS_SPECS_DIR=str(specs_dir), TRITON_DEFAULT_FP_FUSION="1",
               KREGRESS_EXECUTOR="in_process")
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-c", SEQUENTIAL, *[s["task_id"] for s in specs]], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=7200)
    wall = time.perf_counter() - t0
    if res.returncode:
        raise RuntimeError(f"sequential sweeps failed: {res.stderr[-3000:]}")
    got = json.loads(res.stdout.strip().splitlines()[-1])
    return {"wall_s": wall, "failed": got["failed"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sweeps", type=int, default=4, help="sweeps queued at once (default 4)")
    ap.add_argument("--spec", choices=("replay", "gemm"), default="replay", help="replay copies or gemm_smoke copies")
    ap.add_argument("--devices", type=int, default=2, help="simulated GPU hosts, one code server each (default 2)")
    ap.add_argument("--max-runs", type=int, default=8, help="concurrency.runs.max_concurrent_runs (deploy ships 8)")
    ap.add_argument("--free-slots", type=int, default=10,
                    help="run_monitoring.free_slots_after_run_end_seconds for the kill phase (deploy ships 120)")
    ap.add_argument("--executor", choices=("in_process", "multiprocess"), default="in_process",
                    help="the run workers' executor (default in_process: fewest processes on a small machine)")
    ap.add_argument("--steps-per-run", type=int, default=2, help="KREGRESS_STEPS_PER_RUN under --executor multiprocess")
    ap.add_argument("--json", metavar="OUT", help="write the figures as JSON")
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

    root = Path(tempfile.mkdtemp(prefix="kregress-scale-"))
    hosts = {f"host_{i}": {"KREGRESS_DEVICE": f"gpu-{i}"} for i in range(args.devices)}
    specs = make_specs(args.spec, args.sweeps, "scale_")
    kill_spec = gemm_spec("scale_kill")  # a benchmark step that lasts (AOT compile, interpreter checks) to be killed in
    overrides = {**TEST_TIMING, ("concurrency", "runs", "max_concurrent_runs"): args.max_runs,
                 ("run_monitoring", "free_slots_after_run_end_seconds"): args.free_slots}
    env_extra = {"KREGRESS_EXECUTOR": args.executor}
    if args.executor == "multiprocess":
        env_extra["KREGRESS_STEPS_PER_RUN"] = str(args.steps_per_run)
    si = SharedInstance(root, hosts=hosts, specs={s["task_id"]: s for s in specs + [kill_spec]}, env_extra=env_extra,
                        overrides=overrides)
    try:
        print(f"starting PostgreSQL, {args.devices} code server(s) and the daemon under {root} ...", file=sys.stderr)
        si.start()
        print(f"  up in {si.start_seconds:.1f} s (PostgreSQL {si.postgres_version}); {args.sweeps} sweeps queued ...",
              file=sys.stderr)
        shared = shared_phase(si, [s["task_id"] for s in specs], list(hosts))
        print(f"  shared: {shared['wall_s']:.1f} s; killing a run worker ...", file=sys.stderr)
        kill = kill_phase(si, kill_spec["task_id"], "host_0", device_pool(socket.gethostname(), "gpu-0"))
    finally:
        si.stop()
    print("  running the same sweeps one after another in one process ...", file=sys.stderr)
    seq = sequential_phase(specs, root)
    bound = pg_connection_bound(args.max_runs, args.steps_per_run, executor=args.executor, code_servers=args.devices)
    figures = {
        "postgres_version": si.postgres_version,
        "sweeps": args.sweeps,
        "failed": shared["failed"],
        "max_benchmark_steps_per_device": max(shared["per_device"].values()) if shared["per_device"] else 0,
        "slot_recovery_s": round(kill["kill_to_slot_freed_s"], 2),
        "free_slots_after_run_end_seconds": float(args.free_slots),
        "throughput_ratio": round(seq["wall_s"] / shared["wall_s"], 3),
        "peak_pg_connections": int(shared["peak"].get("total", 0)),
        # the details behind the headline figures
        "spec": args.spec, "devices": args.devices, "executor": args.executor, "max_concurrent_runs": args.max_runs,
        "shared_wall_s": round(shared["wall_s"], 1), "sequential_wall_s": round(seq["wall_s"], 1),
        "sequential_failed": seq["failed"], "benchmark_steps_per_device": shared["per_device"],
        "runs_at_once": shared["runs_at_once"], "steps_at_once": shared["steps_at_once"],
        "peak_pg_connections_by_db": {k: v for k, v in shared["peak"].items() if k != "total"},
        "pg_connection_bound": bound, "kill_to_failed_s": round(kill["kill_to_failed_s"], 2),
        "run_end_to_slot_freed_s": round(kill["run_end_to_slot_freed_s"], 2),
        "killed_inside_benchmark_step": kill["killed_inside_benchmark_step"], "retry_of_killed_run": kill["retry"],
        "startup_s": round(si.start_seconds, 1),
    }
    rows = [("sweeps (failed)", f"{args.sweeps} ({figures['failed']})"),
            ("shared instance wall", f"{figures['shared_wall_s']} s ({shared['runs_at_once']} runs, "
                                     f"{shared['steps_at_once']} steps at once)"),
            ("one process, one after another", f"{figures['sequential_wall_s']} s"),
            ("throughput ratio (sequential / shared)", f"{figures['throughput_ratio']}"),
            ("max benchmark steps on one device", f"{figures['max_benchmark_steps_per_device']} {shared['per_device']}"),
            ("kill -> run failed", f"{figures['kill_to_failed_s']} s"),
            ("kill -> slot free", f"{figures['slot_recovery_s']} s (free_slots_after_run_end_seconds {args.free_slots})"),
            ("run end -> slot free", f"{figures['run_end_to_slot_freed_s']} s"),
            ("retry of the killed run", ", ".join(kill["retry"]) or "none"),
            ("peak PostgreSQL connections", f"{figures['peak_pg_connections']} (bound {bound})"),
            ("PostgreSQL", figures["postgres_version"])]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    return 0 if figures["failed"] == 0 and figures["max_benchmark_steps_per_device"] <= 1 else 1


if __name__ == "__main__":
    sys.exit(main())
