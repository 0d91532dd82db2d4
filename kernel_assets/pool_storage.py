"""SQLite instance storage whose pool limits hold when two runs claim a slot at the same instant.

Dagster's SQL event log claims a pool slot in steps that SQLite does not make atomic: it asks whether the
pool has an unassigned slot, then queues the step as assigned; it then selects a free slot row ``FOR UPDATE
SKIP LOCKED`` (a no-op on SQLite) and writes the step into that row by id, without checking the row is
still free. Two run workers that reach ``baseline_metrics`` within milliseconds of each other both see the
one free slot and both claim it, so two benchmarks time on one device together (seen in CI: two steps of a
limit-1 pool started 4 ms apart and overlapped for 2.5 s).

``PoolSafeSqliteStorage`` is Dagster's SQLite storage with one change: every call that claims, frees,
assigns or sizes pool slots holds an exclusive ``flock`` on ``<event log dir>/pool-slots.lock`` (and a
process-wide re-entrant lock, so threads of one process and nested calls queue instead of deadlocking).
SQLite storage lives on one host's disk, so a host-local lock covers every process that can use it; the
lock is released by the kernel when a holder dies. ``dagster_home/dagster.yaml`` selects it::

    storage:
      custom:
        module: kernel_assets.pool_storage
        class: PoolSafeSqliteStorage
        config:
          base_dir:
            env: DAGSTER_HOME

Everything else (schema, migrations, the UI's views of pools) is Dagster's own. Dagster's PostgreSQL
storage has the same race (its connections autocommit, so the ``FOR UPDATE`` lock ends before the write):
``kernel_assets/pool_storage_postgres.py`` serialises the same calls with a PostgreSQL advisory lock, for
``deploy/dagster.yaml``.

This module is imported by every Dagster process of the instance (webserver, daemon, run workers): it
imports nothing of kregress.
"""

from __future__ import annotations

import fcntl
import os
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from dagster._core.storage.base_storage import DagsterStorage
from dagster._core.storage.event_log.sqlite.sqlite_event_log import SqliteEventLogStorage
from dagster._core.storage.runs.sqlite.sqlite_run_storage import SqliteRunStorage
from dagster._core.storage.schedules.sqlite.sqlite_schedule_storage import SqliteScheduleStorage
from dagster._core.storage.sqlite_storage import (
    DagsterSqliteStorage,
    _event_logs_directory,
    _runs_directory,
    _schedule_directory,
)
from dagster._utils import mkdir_p

LOCK_NAME = "pool-slots.lock"

# The Dagster releases this module and pool_storage_postgres.py were checked against (last: dagster 1.13.27 with
# dagster-postgres 0.29.27). pyproject.toml pins the same ranges; tests/test_pool_storage_dagster.py names every
# Dagster internal both rely on and fails, naming the version, when one changes. Widen the pins only after it passes.
DAGSTER_CHECKED = ">=1.13,<1.14"
DAGSTER_POSTGRES_CHECKED = ">=0.29,<0.30"

# Every method of the event log that reads and then writes the pool tables (claims, frees, queue
# assignment, limits). Reads alone (get_concurrency_info, ...) need no lock.
SLOT_WRITERS = (
    "claim_concurrency_slot",
    "free_concurrency_slot_for_step",
    "free_concurrency_slots_for_run",
    "assign_pending_steps",
    "set_concurrency_slots",
    "initialize_concurrency_limit_to_default",
    "delete_concurrency_limit",
)


class SlotLock:
    """An exclusive lock across processes (``acquire`` returns a handle, ``release`` gives it back),
    re-entrant within a process: threads queue on an RLock and the outermost holder takes the lock, so a
    slot write that calls another (a claim that sizes the pool first) does not wait on itself."""

    def __init__(self, acquire: Callable[[], Any], release: Callable[[Any], None]):
        self._acquire, self._release = acquire, release
        self._rlock = threading.RLock()
        self._depth = 0
        self._handle: Any = None

    @contextmanager
    def held(self) -> Iterator[None]:
        with self._rlock:
            if self._depth == 0:
                self._handle = self._acquire()
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
                if self._depth == 0:
                    handle, self._handle = self._handle, None
                    self._release(handle)


def file_lock(path: str) -> SlotLock:
    """``SlotLock`` on an exclusive ``flock`` of ``path`` (the kernel releases it when a holder dies)."""

    def acquire() -> int:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def release(fd: int) -> None:
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    return SlotLock(acquire, release)


def serialise_slot_writers(cls: type, base: type) -> type:
    """``cls`` (a subclass of the event log ``base``) with every method of ``SLOT_WRITERS`` run under
    ``self._slot_lock``."""

    def wrap(name: str):
        inner = getattr(base, name)

        def method(self, *args, **kwargs):
            with self._slot_lock.held():
                return inner(self, *args, **kwargs)

        method.__name__ = name
        method.__qualname__ = f"{cls.__name__}.{name}"
        method.__doc__ = inner.__doc__
        return method

    for name in SLOT_WRITERS:
        setattr(cls, name, wrap(name))
    return cls


class PoolSafeSqliteEventLogStorage(SqliteEventLogStorage):
    """Dagster's SQLite event log with every pool-slot write serialised across the host's processes."""

    def __init__(self, base_dir: str, inst_data=None):
        super().__init__(base_dir, inst_data=inst_data)
        self.slot_lock_path = os.path.join(base_dir, LOCK_NAME)
        self._slot_lock = file_lock(self.slot_lock_path)


serialise_slot_writers(PoolSafeSqliteEventLogStorage, SqliteEventLogStorage)


class PoolSafeSqliteStorage(DagsterSqliteStorage):
    """``storage: sqlite`` with ``PoolSafeSqliteEventLogStorage`` as its event log (same directories, same
    schema: an instance can switch to it and back)."""

    def __init__(self, base_dir: str, inst_data=None):
        self.base_dir = base_dir
        self._run_storage = SqliteRunStorage.from_local(_runs_directory(base_dir))
        self._event_log_storage = PoolSafeSqliteEventLogStorage(_event_logs_directory(base_dir))
        self._schedule_storage = SqliteScheduleStorage.from_local(_schedule_directory(base_dir))
        self._inst_data = inst_data
        DagsterStorage.__init__(self)

    @classmethod
    def from_config_value(cls, inst_data, config_value):
        return cls.from_local(inst_data=inst_data, **config_value)

    @classmethod
    def from_local(cls, base_dir: str, inst_data=None):
        mkdir_p(base_dir)
        return cls(base_dir, inst_data=inst_data)
