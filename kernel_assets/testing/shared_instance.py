"""A shared Dagster deployment on one machine, for real: PostgreSQL, code servers standing in for GPU hosts, the
daemon, and what the tests and bench/scale.py read back from the event log.

``SharedInstance`` starts, each as its own process group (stopped by its id at the end):

* a throwaway PostgreSQL (``kregress.testing.postgres.PgServer``) with two databases, ``dagster``
  (Dagster's run, event-log and schedule storage) and ``ledger`` (the token ledger and its response cache);
* one code server per simulated host, ``dagster api grpc -m kernel_assets.definitions``, each with its own
  ``KREGRESS_DEVICE`` (so its benchmark steps take the pool ``gpu/<host>/<device>``) and the same
  ``DAGSTER_HOME`` (compile cache, IO manager storage, reports), ``KREGRESS_LEDGER_URL`` and specs;
* ``dagster-daemon run`` on a workspace naming those code servers.

``$DAGSTER_HOME/dagster.yaml`` is ``deploy/dagster.yaml`` with only the timing keys of ``TEST_TIMING`` changed
(poll intervals and the slot-freeing delay, so a test takes seconds, not minutes); storage, run queue, pools,
the run launcher and run retries are the file's own.

Runs are submitted the way a user would: ``dagster job launch`` and ``dagster job backfill`` against the
workspace; the daemon dequeues and launches them.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from kregress.testing.postgres import PG_PASSWORD, PG_USER, PgServer, free_port, pg_bin_dir

REPO = Path(__file__).resolve().parents[2]

REQUIRE_ENV = "KREGRESS_REQUIRE_POSTGRES"
REPLAY_SPEC = REPO / "specs" / "replay_clblast_rtx3090.yaml"
BIN = Path(sys.executable).parent

# The keys of deploy/dagster.yaml a test shortens (seconds), and nothing else.
TEST_TIMING = {
    ("run_queue", "dequeue_interval_seconds"): 1,
    ("run_queue", "user_code_failure_retry_delay"): 2,
    ("run_monitoring", "poll_interval_seconds"): 1,
    ("run_monitoring", "free_slots_after_run_end_seconds"): 4,
    ("run_launcher", "config", "unreachable_grace_seconds"): 6,
}


def require_postgres() -> bool:
    return os.environ.get(REQUIRE_ENV, "") not in ("", "0")


def instance_yaml(overrides: dict | None = None) -> dict:
    """deploy/dagster.yaml with ``overrides`` ({(key, ...): value}) applied."""
    cfg = yaml.safe_load((REPO / "deploy" / "dagster.yaml").read_text())
    for path, value in (overrides or {}).items():
        node = cfg
        for k in path[:-1]:
            if k not in node:
                raise KeyError(f"deploy/dagster.yaml has no {'.'.join(path[:-1])} (override {'.'.join(path)})")
            node = node[k]
        if path[-1] not in node:
            raise KeyError(f"deploy/dagster.yaml has no {'.'.join(path)}")
        node[path[-1]] = value
    return cfg


def replay_spec(task_id: str, **search) -> dict:
    """The replay spec under another task_id (one round of a few variants unless ``search`` says otherwise)."""
    spec = yaml.safe_load(REPLAY_SPEC.read_text())
    spec["task_id"] = task_id
    spec["search"].update({"max_rounds": 1, "variants_per_round": 4, **search})
    return spec


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    log: Path

    def stop(self) -> None:
        """SIGKILL this process's group (it was started as its own session, so the group is ours alone)."""
        if self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            self.popen.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass

    def tail(self, n: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-n:]
        except OSError:
            return ""


@dataclass
class Interval:
    run_id: str
    step: str
    pool: str | None
    start: float
    end: float
    location: str


@dataclass
class SharedInstance:
    root: Path
    hosts: dict[str, dict[str, str]]  # location name -> extra environment (KREGRESS_DEVICE, ...)
    specs: dict[str, dict]  # task_id -> spec
    env_extra: dict[str, str] = field(default_factory=dict)
    overrides: dict = field(default_factory=lambda: dict(TEST_TIMING))
    pg: PgServer | None = None
    procs: dict[str, Proc] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    _instance: object = None
    _peak: dict = field(default_factory=dict)
    _poll_stop: threading.Event = field(default_factory=threading.Event)

    # -- paths and environment ----------------------------------------------------------------------
    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def specs_dir(self) -> Path:
        return self.root / "specs"

    @property
    def workspace(self) -> Path:
        return self.root / "workspace.yaml"

    def pg_url(self, db: str) -> str:
        assert self.pg is not None
        return self.pg.url(db)

    def base_env(self) -> dict[str, str]:
        assert self.pg is not None
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("KREGRESS_", "TAOTOKEN_", "DAGSTER_", "PG"))}
        env.update({
            "DAGSTER_HOME": str(self.home), "DAGSTER_PG_HOST": "127.0.0.1", "DAGSTER_PG_PORT": str(self.pg.port),
            "DAGSTER_PG_USER": PG_USER, "DAGSTER_PG_PASSWORD": PG_PASSWORD, "DAGSTER_PG_DB": "dagster",
            "KREGRESS_LEDGER_URL": self.pg_url("ledger"), "KREGRESS_SPECS_DIR": str(self.specs_dir),
            "KREGRESS_EXECUTOR": "in_process", "TRITON_DEFAULT_FP_FUSION": "1", "PYTHONUNBUFFERED": "1",
            "DAGSTER_DISABLE_TELEMETRY": "1",
        })
        env.update(self.env_extra)
        return env

    def add_spec(self, spec: dict) -> None:
        self.specs[spec["task_id"]] = spec
        self.specs_dir.mkdir(parents=True, exist_ok=True)
        (self.specs_dir / f"{spec['task_id']}.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
        if self._instance is not None:
            self.instance.add_dynamic_partitions("specs", [spec["task_id"]])

    # -- start and stop -------------------------------------------------------------------------------
    def start(self, timeout_s: float = 300.0) -> None:
        import psycopg

        from kernel_assets.run_guard import init_lock

        t0 = time.monotonic()
        bindir = pg_bin_dir()
        if bindir is None:
            raise RuntimeError("PostgreSQL server binaries (initdb, pg_ctl, postgres) not found on PATH or in "
                               "/usr/lib/postgresql/*/bin")
        self.pg = PgServer(bindir)
        self.pg.start()
        with psycopg.connect(self.pg.url("postgres"), autocommit=True) as con:
            con.execute("CREATE DATABASE dagster")
            con.execute("CREATE DATABASE ledger")
            self.postgres_version = con.execute("SHOW server_version").fetchone()[0]
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / "dagster.yaml").write_text(yaml.safe_dump(instance_yaml(self.overrides), sort_keys=False))
        for spec in list(self.specs.values()):
            self.add_spec(spec)
        # Dagster's tables are created once here, before several processes would race to create them.
        with init_lock(self.home):
            inst = self.instance
            inst.get_runs(limit=1)
            inst.event_log_storage.get_concurrency_keys()
            inst.all_instigator_state()
            inst.add_dynamic_partitions("specs", sorted(self.specs))
        from resources.ledger import Ledger

        Ledger(self.pg_url("ledger")).usage.rows()  # the ledger's tables, likewise
        self._start_poller()
        base = self.base_env()
        for loc, extra in self.hosts.items():
            self.ports[loc] = free_port()
            self._spawn(loc, [str(BIN / "dagster"), "api", "grpc", "-m", "kernel_assets.definitions", "-h", "127.0.0.1",
                              "-p", str(self.ports[loc]), "--location-name", loc], {**base, **extra})
        self.workspace.write_text(yaml.safe_dump({"load_from": [
            {"grpc_server": {"host": "localhost", "port": self.ports[loc], "location_name": loc}} for loc in self.hosts]}))
        for loc in self.hosts:
            self.wait_code_server(loc, deadline=t0 + timeout_s)
        self._spawn("daemon", [str(BIN / "dagster-daemon"), "run", "-w", str(self.workspace)], base)
        self.wait_daemon(deadline=t0 + timeout_s)
        self.start_seconds = time.monotonic() - t0

    def _spawn(self, name: str, argv: list[str], env: dict[str, str]) -> Proc:
        log = self.root / f"{name}.log"
        fh = open(log, "ab")
        popen = subprocess.Popen(argv, cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        fh.close()
        self.procs[name] = Proc(name, popen, log)
        return self.procs[name]

    def restart_code_server(self, loc: str, timeout_s: float = 240.0) -> None:
        proc = self.procs[loc]
        proc.stop()
        self._spawn(loc, list(proc.popen.args), {**self.base_env(), **self.hosts[loc]})
        self.wait_code_server(loc, deadline=time.monotonic() + timeout_s)

    def wait_code_server(self, loc: str, deadline: float) -> None:
        from dagster._grpc.client import DagsterGrpcClient

        client = DagsterGrpcClient(port=self.ports[loc], host="127.0.0.1")
        while True:
            if self.procs[loc].popen.poll() is not None:
                raise RuntimeError(f"code server {loc} exited: {self.procs[loc].tail()}")
            try:
                client.ping("up")
                return
            except Exception:  # noqa: BLE001 - not up yet
                if time.monotonic() > deadline:
                    raise RuntimeError(f"code server {loc} did not answer: {self.procs[loc].tail()}") from None
                time.sleep(0.5)

    def wait_daemon(self, deadline: float) -> None:
        want = {"QUEUED_RUN_COORDINATOR", "MONITORING", "EVENT_LOG_CONSUMER", "BACKFILL", "SCHEDULER", "SENSOR"}
        while True:
            proc = self.procs["daemon"]
            if proc.popen.poll() is not None:
                raise RuntimeError(f"dagster-daemon exited: {proc.tail()}")
            beats = self.instance.get_daemon_heartbeats()
            if want <= set(beats):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"daemon heartbeats {sorted(beats)} lack {sorted(want - set(beats))}: {proc.tail()}")
            time.sleep(0.5)

    def stop(self) -> None:
        self._poll_stop.set()
        for name in list(self.procs)[::-1]:
            self.procs[name].stop()
        if self._instance is not None:
            try:
                self._instance.dispose()
            except Exception:  # noqa: BLE001 - the server may be gone already
                pass
            self._instance = None
        if self.pg is not None:
            self.pg.stop()

    # -- the instance, seen from this process ---------------------------------------------------------
    @property
    def instance(self):
        if self._instance is None:
            import dagster as dg

            for k, v in self.base_env().items():
                if k.startswith(("DAGSTER_", "KREGRESS_")):
                    os.environ[k] = v
            self._instance = dg.DagsterInstance.from_config(str(self.home))
        return self._instance

    # -- submitting work the way a user does ----------------------------------------------------------
    def launch(self, loc: str, partition: str) -> tuple[str, subprocess.Popen]:
        """``dagster job launch`` of sweep_job for one spec partition (queued; the daemon launches it)."""
        run_id = str(uuid.uuid4())
        argv = [str(BIN / "dagster"), "job", "launch", "-w", str(self.workspace), "-l", loc, "-j", "sweep_job",
                "--run-id", run_id, "--tags", json.dumps({"dagster/partition": partition})]
        return run_id, subprocess.Popen(argv, cwd=REPO, env=self.base_env(), stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True)

    def backfill(self, loc: str, partitions: list[str]) -> tuple[str, str]:
        """``dagster job backfill`` of sweep_job over ``partitions``; returns (backfill id, its output)."""
        argv = [str(BIN / "dagster"), "job", "backfill", "-w", str(self.workspace), "-l", loc, "-j", "sweep_job",
                "--partitions", ",".join(partitions), "--noprompt"]
        res = subprocess.run(argv, cwd=REPO, env=self.base_env(), capture_output=True, text=True, timeout=300)
        out = res.stdout + res.stderr
        m = re.search(r"Launched backfill job `([^`]+)`", out)
        if res.returncode or not m:
            raise RuntimeError(f"dagster job backfill failed ({res.returncode}): {out[-3000:]}")
        return m.group(1), out

    def wait_finished(self, run_ids: list[str], timeout_s: float) -> dict[str, str]:
        """Wait until every run is finished; {run_id: status}."""
        from dagster._core.storage.dagster_run import FINISHED_STATUSES

        deadline = time.monotonic() + timeout_s
        while True:
            runs = {rid: self.instance.get_run_by_id(rid) for rid in run_ids}
            if all(r is not None and r.status in FINISHED_STATUSES for r in runs.values()):
                return {rid: r.status.value for rid, r in runs.items()}
            if time.monotonic() > deadline:
                state = {rid: (r.status.value if r else "missing") for rid, r in runs.items()}
                raise TimeoutError(f"runs not finished after {timeout_s:.0f} s: {state}\n{self.procs['daemon'].tail(1500)}")
            time.sleep(1.0)

    # -- reading the event log ------------------------------------------------------------------------
    def step_pools(self, run) -> dict[str, str | None]:
        snap = self.instance.get_execution_plan_snapshot(run.execution_plan_snapshot_id)
        return {s.key: s.pool for s in snap.steps}

    def intervals(self, run_ids: list[str]) -> list[Interval]:
        """Every step that started, with its pool and its start and end (a step the worker never finished
        ends when its run ended: that is when it stopped running)."""
        import dagster as dg

        out = []
        for rid in run_ids:
            run = self.instance.get_run_by_id(rid)
            pools = self.step_pools(run)
            starts, ends = {}, {}
            for rec in self.instance.all_logs(rid, of_type={dg.DagsterEventType.STEP_START, dg.DagsterEventType.STEP_SUCCESS,
                                                            dg.DagsterEventType.STEP_FAILURE}):
                key = rec.step_key
                if rec.dagster_event.event_type == dg.DagsterEventType.STEP_START:
                    starts[key] = rec.timestamp
                else:
                    ends[key] = rec.timestamp
            record = self.instance.get_run_record_by_id(rid)
            loc = run.remote_job_origin.location_name if run.remote_job_origin else ""
            for key, t0 in starts.items():
                t1 = ends.get(key) or record.end_time or time.time()
                out.append(Interval(rid, key, pools.get(key), t0, t1, loc))
        return out

    def run_intervals(self, run_ids: list[str]) -> list[tuple[float, float]]:
        """(RUN_START, run end) of each run that started."""
        import dagster as dg

        out = []
        for rid in run_ids:
            rec = self.instance.get_run_record_by_id(rid)
            starts = self.instance.all_logs(rid, of_type=dg.DagsterEventType.RUN_START)
            if starts and rec.end_time:
                out.append((starts[0].timestamp, rec.end_time))
        return out

    def logs(self, run_id: str) -> list[str]:
        """Every message of a run: the assets' log lines and Dagster's own event messages."""
        return [r.user_message or (r.dagster_event.message if r.dagster_event else "") or ""
                for r in self.instance.all_logs(run_id)]

    # -- PostgreSQL connections -------------------------------------------------------------------------
    def _start_poller(self) -> None:
        import psycopg

        url = self.pg_url("postgres")

        def poll() -> None:
            try:
                con = psycopg.connect(url, autocommit=True)
            except Exception:  # noqa: BLE001 - nothing to measure then
                return
            with con:
                while not self._poll_stop.wait(0.2):
                    try:
                        rows = con.execute("SELECT datname, count(*) FROM pg_stat_activity WHERE backend_type = "
                                           "'client backend' AND pid <> pg_backend_pid() GROUP BY datname").fetchall()
                    except Exception:  # noqa: BLE001 - the server is stopping
                        return
                    now = {d or "": n for d, n in rows}
                    now["total"] = sum(n for d, n in rows if d in ("dagster", "ledger"))
                    for k, n in now.items():
                        self._peak[k] = max(self._peak.get(k, 0), n)

        threading.Thread(target=poll, daemon=True, name="pg-connections").start()

    def peak_connections(self) -> dict[str, int]:
        return dict(self._peak)

    def reset_peak(self) -> None:
        self._peak.clear()


# --- what the event log shows ------------------------------------------------------------------------


def overlaps(a: Interval, b: Interval) -> bool:
    return a.start < b.end and b.start < a.end


def max_concurrent(intervals: list[tuple[float, float]]) -> int:
    """The largest number of (start, end) intervals open at one instant."""
    points = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    best = cur = 0
    for _, d in points:  # an end at the same instant as a start closes first (-1 sorts before +1)
        cur += d
        best = max(best, cur)
    return best


def max_benchmark_steps_per_device(intervals: list[Interval]) -> dict[str, int]:
    """{pool: the largest number of benchmark steps in that device's pool running at one instant}."""
    from kregress.core.names import is_benchmark_pool

    by_pool: dict[str, list[tuple[float, float]]] = {}
    for iv in intervals:
        if is_benchmark_pool(iv.pool):
            by_pool.setdefault(iv.pool, []).append((iv.start, iv.end))
    return {pool: max_concurrent(ivs) for pool, ivs in by_pool.items()}


# --- where a run's seconds go -----------------------------------------------------------------------------

BLOCKED_PREFIX = "Step blocked by limit for pool"  # Dagster's engine event while a step waits for a pool slot
_INPUT_EVENTS = {"STEP_START", "LOADED_INPUT", "STEP_INPUT"}
_OUTPUT_EVENTS = {"STEP_OUTPUT", "HANDLED_OUTPUT", "ASSET_MATERIALIZATION", "ASSET_CHECK_EVALUATION",
                  "STEP_SUCCESS", "STEP_FAILURE"}


@dataclass
class RunTimeline:
    """One run's seconds from its event log. ``own_s``: the steps' own work (from a step's last input event to
    its first output event: the asset's compute); ``slot_wait_s``: benchmark steps waiting for their device's
    pool slot (from Dagster's first "Step blocked by limit" event to STEP_START); ``queued_s``: in the run queue
    (RUN_ENQUEUED to RUN_STARTING); ``launch_s``: RUN_STARTING to RUN_START (the run worker's process start,
    imports and definitions); ``in_steps_s``: inside steps but not their own work (loading inputs, storing
    outputs, materialization and check events); ``between_steps_s``: from one step's end to the next one's start,
    slot waits excluded; ``tail_s``: from the last step's end to the run's end. Orchestration =
    launch + in_steps + between_steps + tail."""

    run_id: str
    steps: int
    queued_s: float
    launch_s: float
    own_s: float
    slot_wait_s: float
    in_steps_s: float
    between_steps_s: float
    tail_s: float
    start: float  # RUN_STARTING (or RUN_START for a run launched in process)
    end: float

    @property
    def overhead_s(self) -> float:
        return self.launch_s + self.in_steps_s + self.between_steps_s + self.tail_s


def run_timeline(instance, run_id: str) -> RunTimeline:
    """Where one finished run's seconds went (see ``RunTimeline``)."""
    first: dict[str, float] = {}
    steps: dict[str, dict] = {}
    for rec in instance.all_logs(run_id):
        ev = rec.dagster_event
        if ev is None:
            continue
        kind, t = ev.event_type_value, rec.timestamp
        first.setdefault(kind, t)
        if not rec.step_key:
            continue
        s = steps.setdefault(rec.step_key, {"start": None, "begin": None, "finish": None, "end": None, "blocked": None})
        if kind == "ENGINE_EVENT" and (ev.message or "").startswith(BLOCKED_PREFIX):
            s["blocked"] = s["blocked"] or t
        elif kind == "STEP_START":
            s["start"] = t
        if kind in _INPUT_EVENTS and s["finish"] is None:
            s["begin"] = t
        if kind in _OUTPUT_EVENTS and s["start"] is not None:
            s["finish"] = s["finish"] or t
        if kind in ("STEP_SUCCESS", "STEP_FAILURE"):
            s["end"] = t
    import dagster as dg

    kinds = dg.DagsterEventType
    record = instance.get_run_record_by_id(run_id)
    end = record.end_time or max([s["end"] or 0.0 for s in steps.values()] + [first.get(kinds.RUN_START.value, 0.0)])
    start_t = first.get(kinds.RUN_START.value, end)
    starting = first.get(kinds.RUN_STARTING.value, start_t)
    ran = sorted((s for s in steps.values() if s["start"] is not None), key=lambda s: s["start"])
    own = wait = inside = between = 0.0
    prev_end = start_t
    for s in ran:
        s_end = s["end"] or end
        begin, finish = s["begin"] or s["start"], s["finish"] or s_end
        own += max(0.0, finish - begin)
        inside += max(0.0, (s_end - s["start"]) - max(0.0, finish - begin))
        w = max(0.0, s["start"] - s["blocked"]) if s["blocked"] is not None else 0.0
        wait += w
        between += max(0.0, s["start"] - prev_end - w)
        prev_end = max(prev_end, s_end)
    return RunTimeline(run_id, len(ran), max(0.0, starting - first.get(kinds.RUN_ENQUEUED.value, starting)),
                       max(0.0, start_t - starting), own, wait, inside, between, max(0.0, end - prev_end),
                       starting, end)


def submit_backfill(instance, workspace: Path, loc: str, partitions: list[str], tags: dict | None = None) -> str:
    """What ``dagster job backfill -l LOC --partitions ... --tags ... --noprompt`` does (Dagster's own
    ``execute_backfill_command``: the runs are created and queued at once), without a new Python process per
    call; returns the backfill id."""
    from dagster._cli.job import execute_backfill_command
    from dagster._cli.workspace.cli_target import RepositoryOpts, WorkspaceOpts

    said: list[str] = []
    execute_backfill_command(workspace_opts=WorkspaceOpts(workspace=[str(workspace)]),
                             repository_opts=RepositoryOpts(location=loc), partitions=",".join(partitions),
                             tags=json.dumps(tags) if tags else None, noprompt=True, job_name="sweep_job",
                             print_fn=said.append, instance=instance)
    m = re.search(r"Launched backfill job `([^`]+)`", "\n".join(said))
    if not m:
        raise RuntimeError(f"backfill of {partitions} on {loc} was not launched: {' '.join(said)[-2000:]}")
    return m.group(1)
