"""What the CLI does to an instance before a sweep waits on it: safe first use, and no dead run holding a slot.

- ``prepared_instance(home, partition)``: opens the instance and initialises its storage (run, event log,
  schedule storage, the dynamic partition) under an exclusive file lock on ``$DAGSTER_HOME/.kregress-init.lock``,
  so several sweeps started at once on a fresh home do not race Dagster's schema migrations.
- ``reap_dead_runs(instance)``: runs this host launched from the CLI (tags ``kregress/host``, ``kregress/pid``,
  ``kregress/pid_start``) whose process is gone are marked failed and their concurrency slots freed; runs in a
  finished state that still hold slots (a run marked failed by hand) are freed too. Runs launched by the daemon
  or the UI carry no such tags: Dagster's run monitoring (dagster.yaml ``run_monitoring``) watches those.
- ``run_tags()``: the tags the CLI puts on each run it launches.

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
                    raise TimeoutError(f"{home / LOCK_NAME} held for over {timeout_s:.0f} s by another kregress process")
                time.sleep(0.05)
        yield
    finally:
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)


def prepared_instance(home: Path, partition: str | None = None, log: Callable[[str], None] | None = None):
    """The instance of ``home`` with its storage initialised, ``partition`` added to the specs partitions and
    dead CLI runs reaped, all under the init lock."""
    import dagster as dg

    from kernel_assets.constants import SPECS_PARTITIONS

    with init_lock(home):
        instance = dg.DagsterInstance.get()
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
