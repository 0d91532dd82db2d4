"""What the CLI does to an instance before a sweep waits on it: safe first use, and no dead run holding a slot.

- ``prepared_instance(home, partition)``: opens the instance and initialises its storage (run, event log,
  schedule storage, the dynamic partition) under an exclusive file lock on ``$DAGSTER_HOME/.kregress-init.lock``,
  so several sweeps started at once on a fresh home do not race Dagster's schema migrations.
- ``reap_dead_runs(instance)``: runs this host launched from the CLI (tags ``kregress/host``, ``kregress/pid``,
  ``kregress/pid_start``) whose process is gone are marked failed and their concurrency slots freed; runs in a
  finished state that still hold slots (a run marked failed by hand) are freed too. Runs launched by the daemon
  or the UI carry no such tags: Dagster's run monitoring (dagster.yaml ``run_monitoring``) watches those.
- ``run_tags()``: the tags the CLI puts on each run it launches.
- ``WorkerCheckingRunLauncher``: Dagster's ``DefaultRunLauncher`` (runs start in a process of the code server
  of their location) that refuses, before it starts, a run whose steps cannot work on this host
  (``host_refusal``: marked canceled with the reason, so no partition reads Failed), and also answers run
  monitoring's health check, so the daemon marks a run failed when
  its run worker is gone. It asks the code server that started the worker; where that server does not vouch
  for it (restarted, or gone) and the worker ran on the daemon's host, the worker's PID and start time decide;
  a server on another host silent for ``unreachable_grace_seconds`` is taken for a dead host. Without it run
  monitoring cannot see a dead worker of the default launcher at all: only the code server that started the
  worker would notice, and not when that server died too.

Dagster is imported inside the functions only, so ``kregress --help`` stays fast.
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from kregress.core.process import pid_start as _pid_start
from kregress.core.process import process_alive

HOST_TAG, PID_TAG, PID_START_TAG = "kregress/host", "kregress/pid", "kregress/pid_start"
LOCK_NAME = ".kregress-init.lock"


def run_tags() -> dict[str, str]:
    pid = os.getpid()
    return {HOST_TAG: socket.gethostname(), PID_TAG: str(pid), PID_START_TAG: _pid_start(pid)}


@contextmanager
def init_lock(home: Path, timeout_s: float = 300.0) -> Iterator[None]:
    """Exclusive lock on ``home/.kregress-init.lock`` (released when the process dies, whatever the cause)."""
    home.mkdir(parents=True, exist_ok=True)
    fd = os.open(home / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{home / LOCK_NAME} held for over {timeout_s:.0f} s by another kregress process") from None
                time.sleep(0.05)
        yield
    finally:
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)


NO_COMPUTE_LOGS = {"compute_logs": {"module": "dagster._core.storage.noop_compute_log_manager",
                                     "class": "NoOpComputeLogManager"}}


def prepared_instance(home: Path, partition: str | None = None, log: Callable[[str], None] | None = None,
                      capture_compute_logs: bool = True):
    """The instance of ``home`` with its storage initialised, ``partition`` added to the specs partitions and
    dead CLI runs reaped, all under the init lock. ``capture_compute_logs=False``: this process's instance does
    not capture its steps' stdout and stderr into files (the instance's other users, the UI and the daemon,
    still do): Dagster's capture mirrors each step's output through a ``tail`` process and a Python watcher
    beside it, in the terminal's process group, where a Ctrl-C reaches them and each prints a traceback; the
    CLI shows its own progress and its steps print nothing to capture."""
    import dagster as dg

    from kernel_assets.constants import SPECS_PARTITIONS

    with init_lock(home):
        if capture_compute_logs:
            instance = dg.DagsterInstance.get()
        else:
            from dagster._core.instance.ref import InstanceRef

            instance = dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(home), overrides=NO_COMPUTE_LOGS))
        # Touch every storage once so its schema is created/migrated here, not concurrently later.
        instance.get_runs(limit=1)
        instance.event_log_storage.get_concurrency_keys()
        instance.all_instigator_state()
        if partition and not instance.has_dynamic_partition(SPECS_PARTITIONS.name, partition):
            instance.add_dynamic_partitions(SPECS_PARTITIONS.name, [partition])
        reap_dead_runs(instance, log)
    return instance


def reap_dead_runs(instance, log: Callable[[str], None] | None = None) -> list[str]:
    """Mark this host's CLI runs whose process is gone as failed and free every slot held by a finished run.
    Returns the run ids freed (each also said through ``log``)."""
    import dagster as dg
    from dagster._core.storage.dagster_run import FINISHED_STATUSES

    say = log or (lambda _msg: None)
    host = socket.gethostname()
    freed: list[str] = []
    live = [dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED,
            dg.DagsterRunStatus.CANCELING, dg.DagsterRunStatus.QUEUED]
    for run in instance.get_runs(filters=dg.RunsFilter(statuses=live, tags={HOST_TAG: host})):
        try:
            pid = int(run.tags.get(PID_TAG, ""))
        except ValueError:
            continue
        if pid == os.getpid() or process_alive(pid, run.tags.get(PID_START_TAG, "")):
            continue
        instance.report_run_failed(run, message=f"kregress: the process of this run (pid {pid} on {host}) is gone; "
                                                "marked failed by the next sweep on this instance")
        instance.event_log_storage.free_concurrency_slots_for_run(run.run_id)
        freed.append(run.run_id)
        say(f"kregress: run {run.run_id} (pid {pid} on {host}) died without finishing: marked it failed and freed its "
            f"concurrency slots")
    # Slots still held by runs that are over (marking a run failed does not free its slots).
    storage = instance.event_log_storage
    holders = set(storage.get_concurrency_run_ids())  # runs with pending (claimed or waiting) steps
    for key in storage.get_concurrency_keys():
        info = storage.get_concurrency_info(key)
        holders |= {s.run_id for s in info.claimed_slots} | {s.run_id for s in info.pending_steps}
    for run_id in sorted(holders):
        if run_id in freed:
            continue
        run = instance.get_run_by_id(run_id)
        if run is None or run.status in FINISHED_STATUSES:
            instance.event_log_storage.free_concurrency_slots_for_run(run_id)
            freed.append(run_id)
            say(f"kregress: run {run_id} is {'gone' if run is None else run.status.value.lower()} but held concurrency "
                "slots: freed them")
    return freed


# --- run monitoring for the default launcher ----------------------------------------------------------

WORKER_STARTED_PREFIX = "Started process for run (pid: "  # Dagster's engine event when a run worker starts
_LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1", "0.0.0.0"}


def _boot_time() -> float | None:
    try:
        for line in Path("/proc/stat").read_text().splitlines():
            if line.startswith("btime "):
                return float(line.split()[1])
    except OSError:
        return None
    return None


def process_started_at(pid: int) -> float | None:
    """The epoch second ``pid`` started at (Linux /proc), None where unknown."""
    ticks, boot = _pid_start(pid), _boot_time()
    if not ticks or boot is None:
        return None
    return boot + int(ticks) / os.sysconf("SC_CLK_TCK")


def worker_process(instance, run_id: str) -> tuple[int, float] | None:
    """(pid, when it said it started) of the newest run worker of ``run_id``, from the run's event log."""
    import dagster as dg

    found = None
    for rec in instance.all_logs(run_id, of_type=dg.DagsterEventType.ENGINE_EVENT):
        msg = (rec.dagster_event.message if rec.dagster_event else "") or rec.user_message or ""
        if msg.startswith(WORKER_STARTED_PREFIX):
            try:
                found = (int(msg[len(WORKER_STARTED_PREFIX):].split(")")[0]), rec.timestamp)
            except ValueError:
                continue
    return found


def is_this_host(host: str | None) -> bool:
    if not host:
        return True  # a unix socket: the server runs here
    names = _LOCAL_HOSTS | {socket.gethostname(), socket.getfqdn()}
    return host in names or host.startswith("127.")


def host_refusal(instance, run) -> str:
    """Why the steps of ``run`` cannot work on this host, '' when they can (or when the run's code server is on
    another host, which this one cannot probe). A benchmark step tagged ``kregress/needs: cuda``
    (``kernel_assets.executors.needs_tags``: a code location with ``KREGRESS_ENV=gpu``) needs a CUDA device and a
    torch built with CUDA; without them it would fail after seconds ("Torch not compiled with CUDA enabled")
    and leave its partitions Failed."""
    from kernel_assets.executors import NEEDS_TAG

    snap = instance.get_execution_plan_snapshot(run.execution_plan_snapshot_id) if run.execution_plan_snapshot_id else None
    steps = [s.key for s in (snap.steps if snap else []) if (s.tags or {}).get(NEEDS_TAG) == "cuda"]
    if not steps:
        return ""
    origin = run.remote_job_origin.repository_origin.code_location_origin if run.remote_job_origin else None
    if not is_this_host(getattr(origin, "host", None)):
        return ""
    from resources.gpu import cuda_unavailable

    why = cuda_unavailable()
    if not why:
        return ""
    shown = ", ".join(steps[:3]) + (f" and {len(steps) - 3} more" if len(steps) > 3 else "")
    return (f"kregress: run refused before it started: {shown} need the cuda backend (KREGRESS_ENV=gpu in the code "
            f"location) and {socket.gethostname()} cannot give it: {why}. Launch it from a GPU host's code location, "
            "or set KREGRESS_ENV=local in this one (the interpreter backend)")


def _make_launcher_class():
    from dagster._core.launcher.default_run_launcher import DefaultRunLauncher

    class WorkerCheckingRunLauncher(DefaultRunLauncher):
        """``DefaultRunLauncher`` plus ``check_run_worker_health`` (see the module docstring).

        dagster.yaml::

            run_launcher:
              module: kernel_assets.run_guard
              class: WorkerCheckingRunLauncher
              config:
                unreachable_grace_seconds: 300
        """

        def __init__(self, inst_data=None, unreachable_grace_seconds: int = 300, grpc_timeout_seconds: int = 10):
            super().__init__(inst_data=inst_data)
            self.unreachable_grace_seconds = int(unreachable_grace_seconds)
            self.grpc_timeout_seconds = int(grpc_timeout_seconds)
            self._unreachable_since: dict[str, float] = {}

        @classmethod
        def config_type(cls):
            from dagster import Field

            return {
                "unreachable_grace_seconds": Field(int, is_required=False, default_value=300,
                                                   description="A run whose code server has not answered for this long "
                                                               "is failed (its host is taken for down)."),
                "grpc_timeout_seconds": Field(int, is_required=False, default_value=10,
                                              description="How long one health question to a code server may take."),
            }

        @classmethod
        def from_config_value(cls, inst_data, config_value):
            return cls(inst_data=inst_data, **dict(config_value))

        def launch_run(self, context) -> None:
            """Refuse a run this host cannot serve (``host_refusal``): it is marked canceled with the reason
            before any step starts, so none of its partitions reads Failed; otherwise launch it as Dagster does."""
            run = context.dagster_run
            why = host_refusal(self._instance, run)
            if why:
                self._instance.report_run_canceled(run, message=why)
                return
            super().launch_run(context)

        @property
        def supports_check_run_worker_health(self) -> bool:
            return True

        def check_run_worker_health(self, run):
            import json

            from dagster._core.launcher import CheckRunHealthResult, WorkerStatus
            from dagster._core.storage.tags import GRPC_INFO_TAG

            info = json.loads(run.tags.get(GRPC_INFO_TAG) or "{}")
            if not info:
                return self._check_cli_run(run)
            # The code server that started the worker knows whether it is alive.
            answer = self._ask_code_server(run, info)
            host = info.get("host") if info.get("port") else None
            if not is_this_host(host) or (answer.status == WorkerStatus.RUNNING and not answer.transient):
                return answer
            # On this host the worker's PID settles what the server cannot vouch for: a server restarted (it
            # forgot the worker, which may live on) or gone (its worker may be gone too, or not).
            worker = worker_process(self._instance, run.run_id)
            if worker is None:  # launched, the worker has not said it started yet (start_timeout covers a hang)
                return CheckRunHealthResult(WorkerStatus.RUNNING, "run worker starting")
            pid, said_at = worker
            started = process_started_at(pid)
            if process_alive(pid) and (started is None or started <= said_at + 1.0):
                return CheckRunHealthResult(WorkerStatus.RUNNING, f"run worker pid {pid} is alive",
                                            run_worker_id=str(pid))
            return CheckRunHealthResult(WorkerStatus.FAILED, f"run worker pid {pid} on {socket.gethostname()} is gone "
                                                             "(killed or crashed)", run_worker_id=str(pid))

        def _check_cli_run(self, run):
            """A run of `kregress sweep` (executed in the CLI's own process, tagged with its host and PID): failed
            when that process is gone from this host; a run of another host, or with no such tags, is left alone."""
            from dagster._core.launcher import CheckRunHealthResult, WorkerStatus

            try:
                pid = int(run.tags.get(PID_TAG, ""))
            except ValueError:
                return CheckRunHealthResult(WorkerStatus.RUNNING, "not started by a code server or the CLI: not checked")
            if run.tags.get(HOST_TAG) != socket.gethostname():
                return CheckRunHealthResult(WorkerStatus.RUNNING, f"CLI run of host {run.tags.get(HOST_TAG)}: not checked here")
            if process_alive(pid, run.tags.get(PID_START_TAG, "")):
                return CheckRunHealthResult(WorkerStatus.RUNNING, f"kregress process pid {pid} is alive", run_worker_id=str(pid))
            return CheckRunHealthResult(WorkerStatus.FAILED, f"the kregress process of this run (pid {pid} on "
                                                             f"{socket.gethostname()}) is gone", run_worker_id=str(pid))

        def _ask_code_server(self, run, info: dict):
            from dagster._core.errors import DagsterUserCodeUnreachableError
            from dagster._core.launcher import CheckRunHealthResult, WorkerStatus
            from dagster._grpc.client import DagsterGrpcClient
            from dagster._grpc.types import CanCancelExecutionRequest, CanCancelExecutionResult
            from dagster._serdes import deserialize_value

            where = f"{info.get('host')}:{info.get('port')}" if info.get("port") else f"socket {info.get('socket')}"
            client = DagsterGrpcClient(port=info.get("port"), socket=None if info.get("port") else info.get("socket"),
                                       host=info.get("host") or "localhost", use_ssl=bool(info.get("use_ssl")))
            try:
                res = deserialize_value(client.can_cancel_execution(CanCancelExecutionRequest(run_id=run.run_id),
                                                                    timeout=self.grpc_timeout_seconds),
                                        CanCancelExecutionResult)
            except DagsterUserCodeUnreachableError:
                now = time.time()
                since = self._unreachable_since.setdefault(run.run_id, now)
                if now - since >= self.unreachable_grace_seconds:
                    self._unreachable_since.pop(run.run_id, None)
                    return CheckRunHealthResult(WorkerStatus.FAILED, f"the code server at {where} that started this run has "
                                                                     f"not answered for {now - since:.0f} s: its host is "
                                                                     "taken for down")
                return CheckRunHealthResult(WorkerStatus.RUNNING, f"code server at {where} unreachable for "
                                                                  f"{now - since:.0f} s (grace {self.unreachable_grace_seconds} s)",
                                            transient=True)
            self._unreachable_since.pop(run.run_id, None)
            if res.can_cancel:
                return CheckRunHealthResult(WorkerStatus.RUNNING, f"code server at {where} has a live run worker")
            return CheckRunHealthResult(WorkerStatus.FAILED, f"the code server at {where} has no live run worker for this "
                                                             "run (it was killed, crashed, or the server restarted)")

    WorkerCheckingRunLauncher.__module__ = __name__
    WorkerCheckingRunLauncher.__qualname__ = "WorkerCheckingRunLauncher"
    return WorkerCheckingRunLauncher


_LAZY: dict[str, type] = {}


def __getattr__(name: str):
    """``WorkerCheckingRunLauncher`` is built on first access (Dagster's instance loader asks for it by name),
    so importing this module for the CLI's helpers does not import Dagster."""
    if name == "WorkerCheckingRunLauncher":
        if name not in _LAZY:
            _LAZY[name] = _make_launcher_class()
        return _LAZY[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
