"""deploy/dagster.yaml for real: Dagster on a throwaway PostgreSQL 15, the daemon's run queue, one pool per GPU,
dead workers recovered, two hosts sharing one instance.

One module-wide deployment (kernel_assets/testing/shared_instance.py): PostgreSQL with a ``dagster`` and a ``ledger`` database,
two code servers standing in for two GPU hosts (``KREGRESS_DEVICE`` gpu-a and gpu-b, so their benchmark steps
take the pools gpu/<host>/gpu-a and gpu/<host>/gpu-b), one DAGSTER_HOME (compile cache, IO manager storage),
one ledger, and ``dagster-daemon run``. Runs are submitted with ``dagster job launch`` and ``dagster job
backfill`` and run by the daemon; the model is tests/fake_openai.py, reached through the real openai SDK.
Run workers use the in-process executor: two shared cores; the pools, queue and slots are the same code.

Without PostgreSQL binaries the module is skipped, and KREGRESS_REQUIRE_POSTGRES=1 (CI) makes that a failure.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from kernel_assets.testing.shared_instance import (  # noqa: E402
    BIN,
    TEST_TIMING,
    SharedInstance,
    max_benchmark_steps_per_device,
    max_concurrent,
    overlaps,
    replay_spec,
    require_postgres,
)
from kregress.core.names import device_pool, is_benchmark_pool  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
MAX_RUNS = 3  # the run cap of this deployment (deploy/dagster.yaml's concurrency.runs.max_concurrent_runs, lowered)
HOSTS = {"host_a": {"KREGRESS_DEVICE": "gpu-a"}, "host_b": {"KREGRESS_DEVICE": "gpu-b"}}
POOL_A, POOL_B = device_pool(socket.gethostname(), "gpu-a"), device_pool(socket.gethostname(), "gpu-b")
KEYS = {"TAOTOKEN_KEY_SUGGEST": "sk" "-SHAREDCANARY-suggest-0000111122223333",
        "TAOTOKEN_KEY_REPORT": "sk" "-SHAREDCANARY-report-4444555566667777"}
# The killed sweep: a Triton GEMM (AOT compile + interpreter checks on the CPU), one round of three llm variants.
LLM_CONFIGS = [dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=32, GROUP_M=4, num_stages=2, num_warps=4),
               dict(BLOCK_M=64, BLOCK_N=32, BLOCK_K=32, GROUP_M=8, num_stages=2, num_warps=4),
               dict(BLOCK_M=32, BLOCK_N=64, BLOCK_K=32, GROUP_M=4, num_stages=2, num_warps=4)]


def _gemm_llm_spec(task_id: str) -> dict:
    spec = yaml.safe_load((REPO / "specs" / "gemm_smoke.yaml").read_text())
    spec.update(task_id=task_id, correctness_shapes=[{"M": 40, "N": 24, "K": 40}])
    spec["search"].update(strategy="llm", variants_per_round=3, max_rounds=1, no_improve_rounds=1)
    return spec


SPECS = {s["task_id"]: s for s in [
    replay_spec("rp_a1"), replay_spec("rp_a2"), replay_spec("rp_b1"),  # queued at once
    replay_spec("rp_bf1"), replay_spec("rp_bf2"),  # the backfill
    _gemm_llm_spec("gk"),  # killed on host B, then swept again on host A
    replay_spec("rp_b2"),  # queued behind the killed run on device B
]}


@pytest.fixture(scope="module")
def model():
    from kernel_assets.agent.prompt import SUGGEST_SYSTEM_PROMPT
    from kregress.testing.fake_gateway import FakeOpenAI, Reply

    with FakeOpenAI() as srv:
        def handler(seen) -> Reply:
            if seen.body["messages"][0]["content"] == SUGGEST_SYSTEM_PROMPT:
                items = [{"variant_id": f"llm_r1_{i}", "config": c, "patch_summary": f"tile {i}",
                          "expected_effect": "better wave fill", "risk": "low"} for i, c in enumerate(LLM_CONFIGS)]
                return Reply(content=json.dumps(items))
            return Reply(content="One round on the interpreter: latency verdicts wait for cuda evidence.")

        srv.handler = handler
        yield srv


@pytest.fixture(scope="module")
def shared(tmp_path_factory, model):
    if _pg_missing():
        reason = "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found"
        if require_postgres():
            pytest.fail(f"PostgreSQL required (KREGRESS_REQUIRE_POSTGRES=1) but {reason}")
        pytest.skip(reason)
    saved = {k: v for k, v in os.environ.items() if k.startswith(("DAGSTER_", "KREGRESS_"))}
    env_extra = {"TAOTOKEN_BASE_URL": model.root, "TAOTOKEN_MODEL_ID": "kregress-test-model", **KEYS}
    si = SharedInstance(tmp_path_factory.mktemp("shared"), hosts=HOSTS, specs=dict(SPECS), env_extra=env_extra,
                        overrides={**TEST_TIMING, ("concurrency", "runs", "max_concurrent_runs"): MAX_RUNS})
    try:
        si.start()
        print(f"\nshared instance up in {si.start_seconds:.1f} s on PostgreSQL {si.postgres_version}", file=sys.stderr)
        yield si
    finally:
        si.stop()
        for k in [k for k in os.environ if k.startswith(("DAGSTER_", "KREGRESS_"))]:
            os.environ.pop(k)
        os.environ.update(saved)


def _pg_missing() -> bool:
    from kregress.testing.postgres import pg_bin_dir

    return pg_bin_dir() is None


# --- phase 1: sweeps submitted at once, and a backfill ------------------------------------------------


@pytest.fixture(scope="module")
def batch(shared):
    shared.reset_peak()
    t0 = time.time()
    launched = [shared.launch("host_a", "rp_a1"), shared.launch("host_a", "rp_a2"), shared.launch("host_b", "rp_b1")]
    backfill_id, backfill_out = shared.backfill("host_b", ["rp_bf1", "rp_bf2"])
    for _, p in launched:
        out = p.communicate(timeout=300)[0]
        assert p.returncode == 0, out[-2000:]
    import dagster as dg

    backfill_runs = [r.run_id for r in shared.instance.get_runs(filters=dg.RunsFilter(tags={"dagster/backfill": backfill_id}))]
    run_ids = [rid for rid, _ in launched] + backfill_runs
    statuses = shared.wait_finished(run_ids, timeout_s=1200)
    return {"t0": t0, "run_ids": run_ids, "launched": [rid for rid, _ in launched], "backfill_runs": backfill_runs,
            "backfill_id": backfill_id, "backfill_out": backfill_out, "statuses": statuses,
            "intervals": shared.intervals(run_ids), "runs": shared.run_intervals(run_ids),
            "peak": shared.peak_connections()}


@pytest.mark.timeout(1800)
def test_instance_is_postgres_with_the_queue_the_launcher_and_the_daemon(shared):
    inst = shared.instance
    assert type(inst.run_storage).__name__ == "PostgresRunStorage"
    assert type(inst.event_log_storage).__name__ == "PoolSafePostgresEventLogStorage"  # pool slots under an advisory lock
    assert type(inst.schedule_storage).__name__ == "PostgresScheduleStorage"
    assert type(inst.run_coordinator).__name__ == "QueuedRunCoordinator"
    assert type(inst.run_launcher).__name__ == "WorkerCheckingRunLauncher"
    assert inst.run_launcher.supports_check_run_worker_health
    # the real daemon, heartbeating into PostgreSQL
    beats = inst.get_daemon_heartbeats()
    assert {"QUEUED_RUN_COORDINATOR", "MONITORING", "EVENT_LOG_CONSUMER", "BACKFILL", "SCHEDULER", "SENSOR"} <= set(beats)
    # schedule storage: a schedule turned on from the CLI is stored in PostgreSQL, and turned off again
    env = shared.base_env()
    for verb, want in (("start", "RUNNING"), ("stop", "STOPPED")):
        res = subprocess.run([str(BIN / "dagster"), "schedule", verb, "nightly_sweeps", "-w", str(shared.workspace),
                              "-l", "host_a"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stdout[-1500:] + res.stderr[-1500:]
        import psycopg

        with psycopg.connect(shared.pg_url("dagster")) as con:
            rows = con.execute("SELECT status FROM instigators WHERE instigator_type = 'SCHEDULE' "
                               "AND instigator_body LIKE '%nightly_sweeps%'").fetchall()
        assert [r[0] for r in rows] == [want]


@pytest.mark.timeout(1800)
def test_sweeps_and_a_backfill_are_queued_and_run_to_the_end_by_the_daemon(shared, batch):
    assert set(batch["statuses"].values()) == {"SUCCESS"}, batch["statuses"]
    assert len(batch["backfill_runs"]) == 2, batch["backfill_out"]
    import dagster as dg

    for rid in batch["run_ids"]:
        kinds = [e.dagster_event.event_type for e in shared.instance.all_logs(rid) if e.dagster_event]
        # submitted to the queue (QueuedRunCoordinator), launched by the daemon's coordinator, started by a worker
        order = [kinds.index(k) for k in (dg.DagsterEventType.RUN_ENQUEUED, dg.DagsterEventType.RUN_STARTING,
                                          dg.DagsterEventType.RUN_START, dg.DagsterEventType.RUN_SUCCESS)]
        assert order == sorted(order), (rid, kinds)
    by_partition = {shared.instance.get_run_by_id(r).tags["dagster/partition"] for r in batch["backfill_runs"]}
    assert by_partition == {"rp_bf1", "rp_bf2"}
    for task in ("rp_a1", "rp_a2", "rp_b1", "rp_bf1", "rp_bf2"):
        assert (shared.home / "reports" / task / "report.md").is_file()


@pytest.mark.timeout(1800)
def test_benchmark_steps_take_their_devices_pool_one_at_a_time(shared, batch):
    ivs = batch["intervals"]
    pools = {iv.pool for iv in ivs if is_benchmark_pool(iv.pool)}
    assert pools == {POOL_A, POOL_B}  # each host's steps took its own device's pool
    by_loc = {(iv.location, iv.pool) for iv in ivs if is_benchmark_pool(iv.pool)}
    assert by_loc == {("host_a", POOL_A), ("host_b", POOL_B)}
    assert {iv.step for iv in ivs if iv.pool is None} >= {"round_1_suggestions", "verdict_report"}
    per_device = max_benchmark_steps_per_device(ivs)
    assert per_device == {POOL_A: 1, POOL_B: 1}, per_device
    # and the pools really were contended: two runs on one device, so a step of one waited for the other
    bench_a = sorted((iv for iv in ivs if iv.pool == POOL_A), key=lambda iv: iv.start)
    assert len({iv.run_id for iv in bench_a}) == 2
    assert shared.instance.event_log_storage.get_concurrency_info(POOL_A).slot_count == 1


@pytest.mark.timeout(1800)
def test_agent_and_report_steps_run_beside_benchmarks(shared, batch):
    ivs = batch["intervals"]
    bench = [iv for iv in ivs if is_benchmark_pool(iv.pool)]
    other = [iv for iv in ivs if not is_benchmark_pool(iv.pool)]
    beside = [(o.step, b.step) for o in other for b in bench if o.run_id != b.run_id and o.location == b.location
              and overlaps(o, b)]
    assert beside, "no agent/report step ran while another run of the same host benchmarked"
    both_devices = [(a, b) for a in bench for b in bench if a.pool == POOL_A and b.pool == POOL_B and overlaps(a, b)]
    steps_at_once = max_concurrent([(iv.start, iv.end) for iv in ivs])
    assert steps_at_once >= 2
    print(f"\nsteps at once: {steps_at_once}; agent/report beside a benchmark: {len(beside)}; "
          f"benchmarks on both devices at once: {len(both_devices)}", file=sys.stderr)


@pytest.mark.timeout(1800)
def test_run_cap_and_postgres_connections_stay_within_the_documented_bound(shared, batch):
    from kernel_assets.executors import pg_connection_bound

    assert max_concurrent(batch["runs"]) <= MAX_RUNS
    bound = pg_connection_bound(MAX_RUNS, None, executor="in_process", code_servers=len(HOSTS))
    peak = batch["peak"]
    assert 0 < peak["total"] <= bound, (peak, bound)
    print(f"\npeak PostgreSQL connections {peak} <= documented bound {bound}", file=sys.stderr)


# --- phase 2: a run worker killed with SIGKILL during its benchmark step -------------------------------


def _wait(cond, timeout_s: float, what: str, poll: float = 0.2):
    deadline = time.monotonic() + timeout_s
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(poll)


def _step_logs(shared, run_id: str, step: str) -> list[str]:
    return [e.user_message or "" for e in shared.instance.all_logs(run_id) if e.step_key == step and not e.dagster_event]


def _step_events(shared, run_id: str, step: str) -> set[str]:
    return {e.dagster_event.event_type_value for e in shared.instance.all_logs(run_id)
            if e.dagster_event and e.step_key == step}


@pytest.fixture(scope="module")
def killed(shared, model):
    import dagster as dg

    from kernel_assets.run_guard import worker_process

    requests_before = len(model.chat_requests())
    gk_id, p = shared.launch("host_b", "gk")
    assert p.wait(timeout=300) == 0, p.stdout.read()[-2000:]
    _wait(lambda: "STEP_START" in _step_events(shared, gk_id, "round_1_variants"), 900, "gk's round_1_variants to start")
    nxt_id, p2 = shared.launch("host_b", "rp_b2")  # submitted while gk benchmarks on device B
    pid, _ = worker_process(shared.instance, gk_id)
    # Kill once a round-1 variant has compiled (its cache entry is written before that line), or at the latest
    # when the correctness checks start (fresh interpreter workers: seconds before the step can end).
    _wait(lambda: any(m.startswith(("  compiled llm_r1_", "checking ")) for m in _step_logs(shared, gk_id, "round_1_variants")),
          600, "a round-1 variant to compile", poll=0.05)
    os.kill(pid, signal.SIGKILL)
    t_kill = time.time()
    # the slot the dead run holds, until the daemon frees it
    held = [s.run_id for s in shared.instance.event_log_storage.get_concurrency_info(POOL_B).claimed_slots]
    failed = _wait(lambda: (r := shared.instance.get_run_by_id(gk_id)).status == dg.DagsterRunStatus.FAILURE and r,
                   120, "the killed run to be marked failed", poll=0.1)
    t_failed = time.time()
    _wait(lambda: gk_id not in {s.run_id for s in shared.instance.event_log_storage.get_concurrency_info(POOL_B).claimed_slots},
          120, "the dead run's slot to be freed", poll=0.1)
    t_freed = time.time()
    end_time = shared.instance.get_run_record_by_id(gk_id).end_time
    assert p2.wait(timeout=300) == 0, p2.stdout.read()[-2000:]
    compiled_before = sorted(m.split()[1] for m in shared.logs(gk_id) if m.startswith("  compiled llm_r1_"))
    assert compiled_before  # at least one variant had finished compiling
    assert "STEP_SUCCESS" not in _step_events(shared, gk_id, "round_1_variants")  # killed inside the step
    try:
        retry = _wait(lambda: shared.instance.get_runs(filters=dg.RunsFilter(tags={"dagster/parent_run_id": gk_id})),
                      300, "the automatic retry of the killed run")[0]
    except TimeoutError as e:  # say why the retry daemon passed it over (a failure reason, a failed launch)
        run = shared.instance.get_run_by_id(gk_id)
        tags = {k: v for k, v in run.tags.items() if k.startswith("dagster/") and ("retr" in k or "failure" in k)}
        events = [m for m in shared.logs(gk_id) if "retr" in m.lower() or "fail" in m.lower()][-12:]
        raise TimeoutError(f"{e}: run tags {tags}; its retry and failure events {events}") from None
    statuses = shared.wait_finished([nxt_id, retry.run_id], timeout_s=1200)
    return {"gk": gk_id, "next": nxt_id, "retry": retry.run_id, "pid": pid, "held": held, "failed": failed,
            "t_kill": t_kill, "t_failed": t_failed, "t_freed": t_freed, "end_time": end_time, "statuses": statuses,
            "compiled_before": compiled_before, "requests_before": requests_before}


@pytest.mark.timeout(2400)
def test_a_killed_worker_is_failed_its_slot_freed_and_the_queue_moves_on(shared, killed):
    import dagster as dg

    k = killed
    assert k["held"] == [k["gk"]]  # the dead run held device B's only slot
    messages = " ".join(shared.logs(k["gk"]))
    # who noticed: the code server that started the worker, or run monitoring through the launcher
    assert f"Run execution process for {k['gk']}" in messages or "is gone" in messages, messages[-2000:]
    free_after = TEST_TIMING[("run_monitoring", "free_slots_after_run_end_seconds")]
    recovery = k["t_freed"] - k["end_time"]
    assert free_after - 1.0 <= recovery <= free_after + 15.0, recovery
    print(f"\nkill -> failed {k['t_failed'] - k['t_kill']:.1f} s; run end -> slot freed {recovery:.1f} s "
          f"(free_slots_after_run_end_seconds={free_after}); kill -> slot freed {k['t_freed'] - k['t_kill']:.1f} s",
          file=sys.stderr)
    assert k["statuses"] == {k["next"]: "SUCCESS", k["retry"]: "SUCCESS"}
    # the next run on device B (launched by the queue; its benchmark step waited in its worker for the slot)
    # started benchmarking only once the dead run's slot was free
    starts = shared.instance.all_logs(k["next"], of_type=dg.DagsterEventType.STEP_START)
    first_bench = min(e.timestamp for e in starts if e.step_key == "baseline_metrics")
    assert first_bench >= k["t_freed"] - 1.0
    intervals = shared.intervals([k["gk"], k["next"], k["retry"]])
    assert max_benchmark_steps_per_device(intervals)[POOL_B] == 1


@pytest.mark.timeout(2400)
def test_the_retry_pays_no_model_call_twice_and_recompiles_nothing_that_finished(shared, killed, model):
    k = killed
    retry_logs = shared.logs(k["retry"])
    ran = {e.step_key for e in shared.instance.all_logs(k["retry"]) if e.dagster_event
           and e.dagster_event.event_type_value == "STEP_START"}
    assert "baseline_metrics" not in ran and "round_1_suggestions" not in ran  # finished before the kill: not re-run
    assert "round_1_variants" in ran and "verdict_report" in ran
    n = len(k["compiled_before"])
    assert f"compile cache: {n} of {len(LLM_CONFIGS)} variant(s) already compiled for sm_90" in retry_logs, retry_logs
    recompiled = {m.split()[1] for m in retry_logs if m.startswith("  compiled llm_r1_")}
    assert not recompiled & set(k["compiled_before"]), recompiled
    from kernel_assets.agent.prompt import SUGGEST_SYSTEM_PROMPT

    calls = model.chat_requests()[k["requests_before"]:]
    suggest = [c for c in calls if c.body["messages"][0]["content"] == SUGGEST_SYSTEM_PROMPT]
    assert len(suggest) == 1  # paid once, by the killed run; the retry read round 1's proposals back
    bodies = [json.dumps(c.body, sort_keys=True) for c in calls]
    assert len(bodies) == len(set(bodies)), "a model call was paid twice"


# --- phase 3: the other host sweeps the same spec ------------------------------------------------------


@pytest.fixture(scope="module")
def second_host(shared, killed, model):
    before = len(model.chat_requests())
    rid, p = shared.launch("host_a", "gk")
    assert p.wait(timeout=300) == 0, p.stdout.read()[-2000:]
    statuses = shared.wait_finished([rid], timeout_s=1200)
    return {"run": rid, "status": statuses[rid], "new_calls": model.chat_requests()[before:]}


@pytest.mark.timeout(2400)
def test_two_hosts_share_one_instance_ledger_and_compile_cache(shared, killed, second_host):
    from kernel_assets.agent.prompt import SUGGEST_SYSTEM_PROMPT
    from resources.ledger import Ledger

    s = second_host
    assert s["status"] == "SUCCESS"
    logs = shared.logs(s["run"])
    # compiled on host B, read back on host A: nothing compiles again
    assert "compile cache: 1 of 1 variant(s) already compiled for sm_90" in logs
    assert f"compile cache: {len(LLM_CONFIGS)} of {len(LLM_CONFIGS)} variant(s) already compiled for sm_90" in logs
    assert not [m for m in logs if m.startswith("  compiled ")]
    # the suggest prompt was answered from the shared response cache, not the model
    assert not [c for c in s["new_calls"] if c.body["messages"][0]["content"] == SUGGEST_SYSTEM_PROMPT]
    ledger = Ledger(shared.pg_url("ledger"))
    rows = ledger.usage.rows(partition="gk")
    by_run = {}
    for r in rows:
        by_run.setdefault(r.run_id, []).append(r)
    assert killed["gk"] in by_run and s["run"] in by_run  # one ledger, written from both hosts
    assert any(r.cache_hit and r.role == "suggest" for r in by_run[s["run"]])
    locations = {shared.instance.get_run_by_id(rid).remote_job_origin.location_name for rid in by_run}
    assert locations == {"host_a", "host_b"}
    pools = {iv.pool for iv in shared.intervals([s["run"]]) if is_benchmark_pool(iv.pool)}
    assert pools == {POOL_A}
    # no key anywhere in the shared storage
    for path in shared.home.rglob("*"):
        if path.is_file() and path.stat().st_size < 5_000_000:
            text = path.read_bytes()
            assert b"SHAREDCANARY" not in text, path


# --- run monitoring and the launcher's health check -----------------------------------------------------


def _fake_started_run(shared, tags: dict, pid: int | None):
    """A STARTED run whose worker was ``pid`` (Dagster's own start event), not retried, claiming a slot."""
    import uuid

    import dagster as dg
    from dagster._core.events import EngineEventData

    run = dg.DagsterRun(job_name="sweep_job", run_id=str(uuid.uuid4()), status=dg.DagsterRunStatus.STARTED,
                        tags={"dagster/max_retries": "0", **tags})
    shared.instance.add_run(run)
    if pid is not None:
        shared.instance.report_engine_event(f"Started process for run (pid: {pid}).", run, EngineEventData.in_process(pid))
    return run


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


@pytest.mark.timeout(1800)
def test_run_monitoring_fails_a_run_whose_worker_is_gone_and_frees_its_slot(shared):
    import dagster as dg
    from dagster._core.storage.tags import GRPC_INFO_TAG

    grpc = json.dumps({"host": "localhost", "port": shared.ports["host_a"]})
    run = _fake_started_run(shared, {GRPC_INFO_TAG: grpc}, _dead_pid())
    pool = device_pool("monitoring-test", "gpu-x")
    storage = shared.instance.event_log_storage
    storage.initialize_concurrency_limit_to_default(pool)
    assert storage.claim_concurrency_slot(pool, run.run_id, "baseline_metrics").is_claimed
    failed = _wait(lambda: (r := shared.instance.get_run_by_id(run.run_id)).status == dg.DagsterRunStatus.FAILURE and r,
                   60, "run monitoring to fail the run")
    text = " ".join(shared.logs(run.run_id))
    assert "is gone" in text and "Marking run" in text, text  # run monitoring, through WorkerCheckingRunLauncher
    end = shared.instance.get_run_record_by_id(failed.run_id).end_time
    _wait(lambda: not storage.get_concurrency_info(pool).claimed_slots, 60, "the slot to be freed")
    assert time.time() - end >= TEST_TIMING[("run_monitoring", "free_slots_after_run_end_seconds")] - 1.0


@pytest.mark.timeout(1800)
def test_launcher_health_check_by_pid_by_code_server_and_by_silence(shared):
    from dagster._core.events import DagsterEvent, DagsterEventType, EngineEventData
    from dagster._core.launcher import WorkerStatus
    from dagster._core.storage.tags import GRPC_INFO_TAG

    from kernel_assets.run_guard import HOST_TAG, PID_START_TAG, PID_TAG, _pid_start

    launcher = shared.instance.run_launcher
    local = json.dumps({"host": "localhost", "port": shared.ports["host_a"]})
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        time.sleep(0.5)
        live_run = _fake_started_run(shared, {GRPC_INFO_TAG: local}, alive.pid)
        assert launcher.check_run_worker_health(live_run).status == WorkerStatus.RUNNING
        dead_run = _fake_started_run(shared, {GRPC_INFO_TAG: local}, _dead_pid())
        assert launcher.check_run_worker_health(dead_run).status == WorkerStatus.FAILED
        # a PID taken over by a process younger than the worker's start event is not the worker
        reused = _fake_started_run(shared, {GRPC_INFO_TAG: local}, None)
        event = DagsterEvent(event_type_value=DagsterEventType.ENGINE_EVENT.value, job_name="sweep_job",
                             message=f"Started process for run (pid: {alive.pid}).",
                             event_specific_data=EngineEventData.in_process(alive.pid))
        shared.instance.report_dagster_event(event, reused.run_id, timestamp=time.time() - 3600)
        assert launcher.check_run_worker_health(reused).status == WorkerStatus.FAILED
        # another host: ask the code server that started the run
        remote = {"host": "127.0.0.1", "port": shared.ports["host_a"]}
        unknown = _fake_started_run(shared, {GRPC_INFO_TAG: json.dumps(remote)}, None)
        res = launcher._ask_code_server(unknown, remote)
        assert res.status == WorkerStatus.FAILED and "no live run worker" in res.msg
        # a silent server: RUNNING within the grace, FAILED after it
        silent = {"host": "127.0.0.1", "port": _closed_port()}
        gone = _fake_started_run(shared, {GRPC_INFO_TAG: json.dumps(silent)}, None)
        first = launcher._ask_code_server(gone, silent)
        assert first.status == WorkerStatus.RUNNING and first.transient
        time.sleep(TEST_TIMING[("run_launcher", "config", "unreachable_grace_seconds")] + 0.5)
        last = launcher._ask_code_server(gone, silent)
        assert last.status == WorkerStatus.FAILED and "not answered" in last.msg
        # runs of `kregress sweep` (no code server): by their host and PID tags
        me = {HOST_TAG: socket.gethostname(), PID_TAG: str(alive.pid), PID_START_TAG: _pid_start(alive.pid)}
        assert launcher.check_run_worker_health(_fake_started_run(shared, me, None)).status == WorkerStatus.RUNNING
        dead = _dead_pid()
        gone_cli = {HOST_TAG: socket.gethostname(), PID_TAG: str(dead), PID_START_TAG: "1"}
        assert launcher.check_run_worker_health(_fake_started_run(shared, gone_cli, None)).status == WorkerStatus.FAILED
        other = {HOST_TAG: "elsewhere", PID_TAG: str(dead)}
        assert launcher.check_run_worker_health(_fake_started_run(shared, other, None)).status == WorkerStatus.RUNNING
    finally:
        alive.kill()
        alive.wait()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed when this returns: nothing listens there
