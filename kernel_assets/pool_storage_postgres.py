"""PostgreSQL instance storage whose pool limits hold when runs claim a slot at the same instant.

Dagster's PostgreSQL event log claims a pool slot in autocommit statements: it asks whether the pool has an
unassigned slot, then queues the step as assigned; it selects a free slot row ``FOR UPDATE SKIP LOCKED``,
whose lock ends with that statement, and writes the step into the row by id without checking the row is
still free. Measured on PostgreSQL 15 with six processes claiming a limit-1 pool at one barrier: in 3 of 8
tries more than one held the slot (``tests/test_pool.py`` has the SQLite twin of that test).

``PoolSafePostgresStorage`` is ``DagsterPostgresStorage`` whose event log runs every call that claims,
frees, assigns or sizes pool slots (``kernel_assets.pool_storage.SLOT_WRITERS``) under a session-level
advisory lock (``pg_advisory_lock``) on a connection of its own, so the runs of every host serialise there;
PostgreSQL releases it if the holder's connection dies. A process doing slot work holds one connection more
while it does (``kernel_assets.executors.pg_connection_bound`` counts it). ``deploy/dagster.yaml``::

    storage:
      custom:
        module: kernel_assets.pool_storage_postgres
        class: PoolSafePostgresStorage
        config:
          postgres_db: {...}          # as under storage: postgres:

Needs dagster-postgres (the ``deploy`` extra); imports nothing of kregress.
"""

from __future__ import annotations

from dagster._core.storage.base_storage import DagsterStorage
from dagster_postgres.event_log import PostgresEventLogStorage
from dagster_postgres.run_storage import PostgresRunStorage
from dagster_postgres.schedule_storage import PostgresScheduleStorage
from dagster_postgres.storage import DagsterPostgresStorage
from dagster_postgres.utils import get_token_provider_from_config, pg_url_from_config
from sqlalchemy import text

from kernel_assets.pool_storage import SlotLock, serialise_slot_writers

# The advisory lock's key (a bigint): "kregress pool slots", one per database.
ADVISORY_KEY = 0x6B72_6567_706F_6F6C


class PoolSafePostgresEventLogStorage(PostgresEventLogStorage):
    """Dagster's PostgreSQL event log with every pool-slot write serialised across processes and hosts."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._slot_lock = SlotLock(self._lock_acquire, self._lock_release)

    def _lock_acquire(self):
        conn = self._engine.connect()
        try:
            conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": ADVISORY_KEY})
        except BaseException:
            conn.close()
            raise
        return conn

    @staticmethod
    def _lock_release(conn) -> None:
        try:
            conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": ADVISORY_KEY})
        finally:
            conn.close()


serialise_slot_writers(PoolSafePostgresEventLogStorage, PostgresEventLogStorage)


class PoolSafePostgresStorage(DagsterPostgresStorage):
    """``storage: postgres`` with ``PoolSafePostgresEventLogStorage`` as its event log (same database, same
    schema: an instance can switch to it and back)."""

    def __init__(self, postgres_url: str, should_autocreate_tables: bool = True, inst_data=None, token_provider=None):
        self.postgres_url = postgres_url
        self.should_autocreate_tables = bool(should_autocreate_tables)
        self._inst_data = inst_data
        self._run_storage = PostgresRunStorage(postgres_url, should_autocreate_tables, token_provider=token_provider)
        self._event_log_storage = PoolSafePostgresEventLogStorage(postgres_url, should_autocreate_tables,
                                                                  token_provider=token_provider)
        self._schedule_storage = PostgresScheduleStorage(postgres_url, should_autocreate_tables, token_provider=token_provider)
        DagsterStorage.__init__(self)

    @classmethod
    def from_config_value(cls, inst_data, config_value):
        return cls(postgres_url=pg_url_from_config(config_value),
                   should_autocreate_tables=config_value.get("should_autocreate_tables", True),
                   inst_data=inst_data, token_provider=get_token_provider_from_config(config_value))
