"""The ledger's engine: one SQLAlchemy engine per database, the schema, URLs and what an unusable database means.

Storage goes through SQLAlchemy Core: a SQLite file by default (``paths.ledger_path()``, i.e.
``$DAGSTER_HOME/ledger.sqlite``, in WAL mode) or PostgreSQL by URL (``postgresql://`` /
``postgresql+psycopg://``, psycopg 3). The schema is defined once (``METADATA``); SQLAlchemy renders it
per dialect (identity ids, double precision times, byte-ordered ``COLLATE "C"`` text on PostgreSQL so
ORDER BY sorts like SQLite's BINARY). A database made by an older version gets the columns and indexes it
lacks when first opened. URLs are parsed and masked with ``sqlalchemy.engine.make_url``.

Writes are atomic across processes: on SQLite every write is one ``BEGIN IMMEDIATE`` transaction (one writer
at a time, whole file); on PostgreSQL a write may take ``pg_advisory_xact_lock`` on a scope (a sweep) inside
the transaction, so writes of one sweep are serialised across processes and hosts while other sweeps
proceed. The password may be in the URL or in PGPASSWORD (libpq's own rules, ``~/.pgpass`` included); it
never appears in reprs or error messages (``mask_url``). A SQLite file this user cannot write is one line
naming the file and what to do (``LedgerWriteError``).
"""

from __future__ import annotations

import os
import re
import sqlite3
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import sqlalchemy as sa
from sqlalchemy.engine import URL, make_url

from kregress.core import paths

_PG_LOCK_NS = 0x6B72  # first key of every advisory lock the ledger takes ("kr")


class LedgerConfigError(ValueError):
    """A ledger URL that cannot be used; the message says what to write instead."""


class LedgerConnectionError(RuntimeError):
    """The ledger database could not be reached; the message names it with its password masked."""


class LedgerWriteError(LedgerConnectionError):
    """The ledger file cannot be written (read-only file or folder, full disk); one line: the file and the fix."""


LEDGER_ERROR_LINE = re.compile(r"\[ledger\] [^\n]*? Fix: [^\n]*")


def ledger_error_line(text: str) -> str | None:
    """The ``[ledger] ... Fix: ...`` line in ``text`` (e.g. a failed step's error), or None."""
    m = LEDGER_ERROR_LINE.search(text or "")
    return m.group(0).strip() if m else None


# --- the schema (defined once; SQLAlchemy renders it for SQLite and PostgreSQL) ---------------------

_TEXT = sa.Text().with_variant(sa.Text(collation="C"), "postgresql")
_ID = sa.Integer().with_variant(sa.BigInteger(), "postgresql")
METADATA = sa.MetaData()


def _text(name: str, **kw: Any) -> sa.Column:
    return sa.Column(name, _TEXT, nullable=False, server_default="", **kw)


def _int(name: str) -> sa.Column:
    return sa.Column(name, sa.Integer, nullable=False, server_default="0")


usage_t = sa.Table(
    "usage", METADATA,
    sa.Column("id", _ID, sa.Identity(), primary_key=True),
    sa.Column("ts", sa.Double, nullable=False),
    _text("run_id"), _text("partition"), _int("round"), sa.Column("role", _TEXT, nullable=False), _text("task"),
    _text("key_alias"), _text("model"), _text("request_id"),
    _int("prompt_tokens"), _int("completion_tokens"), _int("total_tokens"),
    sa.Column("latency_ms", sa.Double, nullable=False, server_default="0"),
    sa.Column("attempt", sa.Integer, nullable=False, server_default="1"),
    _text("status"), _text("error_class"), _int("cache_hit"),
    _text("sweep"), sa.Column("reservation_id", sa.Integer),
    sa.Index("usage_by_partition", "partition", "round"),
    sa.Index("usage_by_sweep", "sweep", "round"),
    sqlite_autoincrement=True,
)
reservations_t = sa.Table(
    "reservations", METADATA,
    sa.Column("id", _ID, sa.Identity(), primary_key=True),
    sa.Column("ts", sa.Double, nullable=False),
    sa.Column("sweep", _TEXT, nullable=False), _text("run_id"), _text("partition"), _int("round"), _text("role"), _text("task"),
    sa.Column("est_input", sa.Integer, nullable=False), sa.Column("est_output", sa.Integer, nullable=False),
    _int("input_tokens"), _int("output_tokens"),
    sa.Column("state", _TEXT, nullable=False), _text("reason"), sa.Column("settled_ts", sa.Double),
    _text("owner"),  # host:pid:start of the process that reserved it (kregress.core.process.owner_tag)
    _text("breach"),  # a refused reservation: the typed breach that refused it, as JSON (kregress.core.budget.Breach)
    sa.Index("reservations_by_sweep", "sweep", "round"),
    sa.Index("reservations_by_partition", "partition", "ts"),
    sa.Index("reservations_by_state", "state"),
    sqlite_autoincrement=True,
)
cache_t = sa.Table(
    "response_cache", METADATA,
    sa.Column("request_hash", _TEXT, primary_key=True),
    sa.Column("ts", sa.Double, nullable=False), sa.Column("model", _TEXT, nullable=False), _text("role"),
    sa.Column("content", _TEXT, nullable=False), _text("finish_reason"), _text("request_id"),
    _int("prompt_tokens"), _int("completion_tokens"),
)
cooldowns_t = sa.Table(
    "key_cooldowns", METADATA,
    sa.Column("key_alias", _TEXT, primary_key=True),
    sa.Column("cool_until", sa.Double, nullable=False),  # wall clock (time.time())
    _text("reason"),  # rate_limited, server_error, credentials, ...
    _text("owner"),  # the gateway that wrote it (it keeps its own cooldowns in memory)
    sa.Column("ts", sa.Double, nullable=False),
)


# --- URLs ------------------------------------------------------------------------------------------


def default_ledger_path(dagster_home: str | os.PathLike | None = None) -> Path:
    """``<dagster_home>/ledger.sqlite``; by default ``paths.ledger_path()`` (the one home)."""
    return Path(dagster_home) / "ledger.sqlite" if dagster_home else paths.ledger_path()


def _parse(url: str) -> URL | None:
    try:
        return make_url(url.strip())
    except Exception:  # noqa: BLE001 - not a URL: a plain path, or garbage the caller reports
        return None


def _backend(u: URL) -> str:
    return u.drivername.partition("+")[0].lower()


def is_postgres_url(url: str | os.PathLike | None) -> bool:
    if not isinstance(url, str) or "://" not in url:
        return False
    u = _parse(url)
    return u is not None and _backend(u) in ("postgres", "postgresql")


def mask_url(url: str | URL) -> str:
    """The URL with any password replaced by ``***`` (in the user info and in a ``password=`` parameter)."""
    u = url if isinstance(url, URL) else _parse(str(url))
    if u is None:
        return "(not a URL)"
    hidden_query = "password" in u.query
    text = u.difference_update_query(["password"]).render_as_string(hide_password=True)
    return text + (("&" if "?" in text else "?") + "password=***" if hidden_query else "")


def postgres_url(url: str) -> URL:
    """The SQLAlchemy URL (psycopg 3 driver) for a ledger URL; other drivers are refused with the fix."""
    u = _parse(url)
    if u is None or _backend(u) not in ("postgres", "postgresql"):
        raise LedgerConfigError(f"ledger url: {mask_url(url)!r} is not a postgresql:// URL")
    driver = u.drivername.partition("+")[2].lower()
    if driver not in ("", "psycopg"):
        raise LedgerConfigError(
            f"ledger url: driver {driver!r} is not supported (the ledger uses psycopg 3); "
            "write postgresql://user@host:5432/db or postgresql+psycopg://user@host:5432/db"
        )
    return u.set(drivername="postgresql+psycopg")


def sqlite_path_from_url(url: str, dagster_home: str | os.PathLike | None = None) -> Path:
    """The SQLite file of a ledger URL: ``sqlite:///PATH``, a plain path, or empty for the default file."""
    url = (url or "").strip()
    if not url:
        return default_ledger_path(dagster_home)
    if "://" not in url:
        return Path(url)  # a plain file path
    u = _parse(url)
    if u is None:
        raise LedgerConfigError(f"ledger url: {mask_url(url)} is not a URL; use sqlite:///PATH or leave it empty")
    if _backend(u) in ("postgres", "postgresql"):
        raise LedgerConfigError(
            f"ledger url: {mask_url(u)} names a PostgreSQL ledger, not a SQLite file; open it with "
            "ledger_from_url() or LedgerResource(url=...).get_ledger() (postgresql ledgers are not supported yet "
            "where a SQLite file path is required, e.g. `kregress usage --ledger-url`)"
        )
    if _backend(u) != "sqlite":
        raise LedgerConfigError(f"ledger url: unsupported scheme {u.drivername!r}; use sqlite:///PATH or leave it empty")
    if not u.database:
        raise LedgerConfigError("ledger url: sqlite:/// needs a file path, e.g. sqlite:////tmp/ledger.sqlite")
    if u.database == ":memory:":
        raise LedgerConfigError("ledger url: an in-memory ledger cannot be shared across processes; give a file path")
    return Path(u.database)  # sqlite:////abs -> /abs ; sqlite:///rel -> rel


# --- engines ---------------------------------------------------------------------------------------

_INHERITED: list[Any] = []  # engines inherited across fork: never used or closed in the child
_READY: set[str] = set()  # databases whose schema this process has created


def _sqlite_engine(path: Path) -> sa.Engine:
    eng = sa.create_engine(f"sqlite:///{path}", connect_args={"timeout": 60.0, "check_same_thread": False},
                           pool_size=2, max_overflow=8)

    @sa.event.listens_for(eng, "connect")
    def _on_connect(dbapi_con: Any, _rec: Any) -> None:
        dbapi_con.isolation_level = None  # SQLAlchemy's begin event below says how a transaction starts
        cur = dbapi_con.cursor()
        cur.execute("PRAGMA busy_timeout = 60000")
        for _ in range(100):
            try:
                cur.execute("PRAGMA journal_mode = WAL")  # persistent; a no-op once the file is in WAL mode
                break
            except sqlite3.OperationalError:  # another process is switching it right now
                time.sleep(0.05)
        cur.execute("PRAGMA synchronous = NORMAL")  # WAL: durable at checkpoints, never corrupt
        cur.close()

    @sa.event.listens_for(eng, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        # Writes take the file's write lock up front, so their checks and inserts are one atomic step.
        conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get("kregress_write") else "BEGIN")

    return eng


def _import_psycopg() -> Any:
    try:
        import psycopg
        import psycopg.conninfo
    except ImportError as e:
        raise LedgerConfigError(
            f"ledger url: a postgresql ledger needs the psycopg 3 driver ({e}); install it with: pip install 'psycopg[binary]>=3.2'"
        ) from None
    return psycopg


_UNWRITABLE = ("readonly database", "read-only", "unable to open database file", "disk i/o error", "database or disk is full",
               "permission denied")


class Engine:
    """One ledger database: its location, a per-process engine, the schema created (and upgraded) once, and
    read / atomic write transactions. The stores (usage and budgets, key cooldowns, the response cache) share it.

    ``Engine(path)`` opens a SQLite file; ``Engine("postgresql://user@host:5432/db")`` (or ``postgresql+psycopg://``)
    a PostgreSQL database. ``path`` is None for PostgreSQL; ``location`` is the file path or the URL with its
    password masked.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self._lock = threading.Lock()
        self._engine: sa.Engine | None = None
        self._pid = 0
        if is_postgres_url(path):
            self.path: Path | None = None
            self.backend = "postgresql"
            self._url = postgres_url(str(path))
            self.location = mask_url(self._url)
            pg = _import_psycopg()
            libpq = self._url.set(drivername="postgresql").render_as_string(hide_password=False)
            try:
                params = pg.conninfo.conninfo_to_dict(libpq)
            except pg.Error as e:
                raise LedgerConfigError(f"ledger url: {self.location} is not a valid libpq URI: {self._scrub(e)}") from None
            self._connect_args = {} if "connect_timeout" in params else {"connect_timeout": 10}
            self._key = self.location
        else:
            self.path = Path(path)
            self.backend = "sqlite"
            self.location = str(self.path)
            self._key = str(self.path.resolve())

    def __repr__(self) -> str:
        return f"Ledger({self.location!r})"

    def __getstate__(self) -> dict[str, Any]:  # a ledger travels to child processes as its location only
        state = dict(self.__dict__)
        state.update(_engine=None, _pid=0, _lock=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def _scrub(self, err: BaseException) -> str:
        msg = " ".join(str(getattr(err, "orig", None) or err).split())
        pw = self._url.password if self.backend == "postgresql" else None
        return msg.replace(str(pw), "***") if pw else msg

    # -- connections -------------------------------------------------------------------------
    def engine(self) -> sa.Engine:
        if self._engine is not None and self._pid == os.getpid():
            return self._engine
        with self._lock:
            if self._engine is not None and self._pid != os.getpid():
                # Inherited across fork: its pooled sockets are the parent's; never use or close them here.
                self._engine.dispose(close=False)
                _INHERITED.append(self._engine)
                self._engine = None
            if self._engine is None:
                if self.backend == "sqlite":
                    assert self.path is not None
                    try:
                        self.path.parent.mkdir(parents=True, exist_ok=True)
                    except OSError as e:
                        raise self._unusable(e) from None
                    eng = _sqlite_engine(self.path)
                else:
                    eng = sa.create_engine(self._url, connect_args={"application_name": "kregress-ledger", **self._connect_args},
                                           pool_pre_ping=True)
                self._init(eng)
                self._engine, self._pid = eng, os.getpid()
        return self._engine

    def _init(self, eng: sa.Engine) -> None:
        if (self._key, os.getpid()) in _READY:  # type: ignore[comparison-overlap]
            return
        try:
            if self.backend == "sqlite":
                with eng.connect().execution_options(kregress_write=True) as con, con.begin():
                    METADATA.create_all(con)
                    _upgrade(con)
            else:
                with eng.begin() as con:  # concurrent CREATE IF NOT EXISTS can race: serialise it
                    con.execute(sa.select(sa.func.pg_advisory_xact_lock(_PG_LOCK_NS, 0)))
                    METADATA.create_all(con)
                    _upgrade(con)
        except sa.exc.OperationalError as e:
            if self.backend == "postgresql":
                raise LedgerConnectionError(f"ledger: cannot connect to {self.location}: {self._scrub(e)}") from None
            raise self._unusable(e) from None
        _READY.add((self._key, os.getpid()))  # type: ignore[arg-type]

    @contextmanager
    def write(self, lock: str | None = None) -> Iterator[sa.Connection]:
        """One atomic write transaction (SQLite: BEGIN IMMEDIATE; PostgreSQL: with ``lock``, an advisory lock on that scope)."""
        try:
            with self.engine().connect().execution_options(kregress_write=True) as con, con.begin():
                if lock is not None and self.backend == "postgresql":
                    con.execute(sa.select(sa.func.pg_advisory_xact_lock(_PG_LOCK_NS, sa.func.hashtext(lock))))
                yield con
        except sa.exc.OperationalError as e:
            raise self._unusable(e) from None

    @contextmanager
    def read(self) -> Iterator[sa.Connection]:
        try:
            with self.engine().connect() as con:
                yield con
        except sa.exc.OperationalError as e:
            raise self._unusable(e) from None

    def close(self) -> None:
        """Close this process's connections (the next call reopens them)."""
        if self._engine is not None and self._pid == os.getpid():
            self._engine.dispose()
        self._engine = None

    def _unusable(self, e: BaseException) -> LedgerConnectionError:
        msg = self._scrub(e)
        if self.backend == "sqlite" and any(s in msg.lower() for s in _UNWRITABLE):
            assert self.path is not None
            return LedgerWriteError(
                f"[ledger] cannot write the token ledger {self.path}: {msg}. Fix: make {self.path} and its folder "
                f"{self.path.parent} writable by this user (the WAL journal lives beside the file), free disk space, or "
                "point the ledger elsewhere (DAGSTER_HOME, or LedgerResource(url=sqlite:///PATH))")
        return LedgerConnectionError(f"ledger: cannot use {self.location}: {msg}")


def _upgrade(con: sa.Connection) -> None:
    """Add the columns and indexes a database made by an older version lacks (new columns are text, default '')."""
    insp = sa.inspect(con)
    for table in METADATA.sorted_tables:
        have = {c["name"] for c in insp.get_columns(table.name)}
        for col in table.columns:
            if col.name not in have:
                kind = col.type.compile(dialect=con.dialect)
                con.exec_driver_sql(f'ALTER TABLE "{table.name}" ADD COLUMN "{col.name}" {kind} NOT NULL DEFAULT \'\'')
        indexes = {i["name"] for i in insp.get_indexes(table.name)}
        for idx in table.indexes:
            if idx.name not in indexes:
                idx.create(con)
