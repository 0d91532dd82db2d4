"""The token ledger: one row per model-call attempt, budget reservations, and the response cache.

Storage is a SQLite file under DAGSTER_HOME by default (``$DAGSTER_HOME/ledger.sqlite``), opened in
WAL mode; every reservation runs inside ``BEGIN IMMEDIATE`` so several Dagster runs in parallel
processes (or hosts sharing the file) serialise their budget checks and can never overshoot.

Three tables:

- ``usage``: one row per attempt, the fields of ``kregress.core.records.UsageRecord`` (plus the sweep and the
  reservation it belonged to). Cache hits are rows with ``cache_hit`` set and no tokens.
- ``reservations``: one row per logical call. ``reserved`` rows count their estimate (prompt estimate +
  max_tokens); ``settled`` rows count the usage the server reported; ``released`` rows count nothing;
  ``refused`` rows are calls that were never sent because the budget would have been exceeded.
- ``response_cache``: model text by request hash (model, messages, parameters). Keys are never stored.

The SQL is plain and portable (no SQLite-only syntax) and goes through a small backend object that
provides ``write(lock=...)`` (a transaction), ``read()`` and ``insert()`` (returns the new row id):

- ``_SqliteBackend``: ``write()`` is ``BEGIN IMMEDIATE`` (one writer at a time, whole file).
- ``_PostgresBackend`` (``postgresql://`` or ``postgresql+psycopg://`` URLs, psycopg 3): ``write(lock=sweep)``
  takes ``pg_advisory_xact_lock`` on the sweep inside the transaction, so reservations of one sweep (its
  budget scope) are serialised across processes and hosts while other sweeps proceed; READ COMMITTED
  then shows each holder every reservation committed before it. ``?`` placeholders become ``%s``, the
  schema is the SQLite one with identity ids, DOUBLE PRECISION timestamps and ``COLLATE "C"`` text
  (so ORDER BY sorts like SQLite's BINARY). The password may be in the URL or in PGPASSWORD (libpq's
  own rules, ``~/.pgpass`` included); it never appears in reprs or error messages (``mask_url``).
"""

from __future__ import annotations

import csv
import json
import os
import re
import sqlite3
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import dagster as dg
from pydantic import Field

from kregress.core import paths
from kregress.core.records import UsageRecord
from kregress.core.spec import Budget

USAGE_FIELDS = tuple(UsageRecord.model_fields)
GROUPABLE = ("role", "key_alias", "task", "model", "round", "partition", "run_id", "status")
CACHE_ALIAS = "(cache)"

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS usage (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        ts REAL NOT NULL, run_id TEXT NOT NULL DEFAULT '', partition TEXT NOT NULL DEFAULT '',
        round INTEGER NOT NULL DEFAULT 0, role TEXT NOT NULL, task TEXT NOT NULL DEFAULT '',
        key_alias TEXT NOT NULL DEFAULT '', model TEXT NOT NULL DEFAULT '', request_id TEXT NOT NULL DEFAULT '',
        prompt_tokens INTEGER NOT NULL DEFAULT 0, completion_tokens INTEGER NOT NULL DEFAULT 0,
        total_tokens INTEGER NOT NULL DEFAULT 0, latency_ms REAL NOT NULL DEFAULT 0,
        attempt INTEGER NOT NULL DEFAULT 1, status TEXT NOT NULL DEFAULT '', error_class TEXT NOT NULL DEFAULT '',
        cache_hit INTEGER NOT NULL DEFAULT 0,
        sweep TEXT NOT NULL DEFAULT '', reservation_id INTEGER
    )""",
    "CREATE INDEX IF NOT EXISTS usage_by_partition ON usage (partition, round)",
    "CREATE INDEX IF NOT EXISTS usage_by_sweep ON usage (sweep, round)",
    """CREATE TABLE IF NOT EXISTS reservations (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        ts REAL NOT NULL, sweep TEXT NOT NULL, run_id TEXT NOT NULL DEFAULT '', partition TEXT NOT NULL DEFAULT '',
        round INTEGER NOT NULL DEFAULT 0, role TEXT NOT NULL DEFAULT '', task TEXT NOT NULL DEFAULT '',
        est_input INTEGER NOT NULL, est_output INTEGER NOT NULL,
        input_tokens INTEGER NOT NULL DEFAULT 0, output_tokens INTEGER NOT NULL DEFAULT 0,
        state TEXT NOT NULL, reason TEXT NOT NULL DEFAULT '', settled_ts REAL
    )""",
    "CREATE INDEX IF NOT EXISTS reservations_by_sweep ON reservations (sweep, round)",
    "CREATE INDEX IF NOT EXISTS reservations_by_partition ON reservations (partition, ts)",
    """CREATE TABLE IF NOT EXISTS response_cache (
        request_hash TEXT PRIMARY KEY, ts REAL NOT NULL, model TEXT NOT NULL, role TEXT NOT NULL DEFAULT '',
        content TEXT NOT NULL, finish_reason TEXT NOT NULL DEFAULT '', request_id TEXT NOT NULL DEFAULT '',
        prompt_tokens INTEGER NOT NULL DEFAULT 0, completion_tokens INTEGER NOT NULL DEFAULT 0
    )""",
)

# Tokens a reservation counts, by state: the estimate while in flight, the reported usage once settled.
_CHARGED_IN = "CASE state WHEN 'reserved' THEN est_input WHEN 'settled' THEN input_tokens ELSE 0 END"
_CHARGED_OUT = "CASE state WHEN 'reserved' THEN est_output WHEN 'settled' THEN output_tokens ELSE 0 END"


class LedgerConfigError(ValueError):
    """A ledger URL that cannot be used; the message says what to write instead."""


class LedgerConnectionError(RuntimeError):
    """The ledger database could not be reached; the message names it with its password masked."""


class BudgetExceeded(RuntimeError):
    """A call was not sent because its reservation would exceed a budget; ``reason`` says which."""

    def __init__(self, reason: str, *, scope: str = "", round: int = 0) -> None:
        super().__init__(f"BudgetExceeded: {reason}")
        self.reason = reason
        self.scope = scope
        self.round = round


@dataclass(frozen=True)
class Reservation:
    id: int
    sweep: str
    round: int
    est_input: int
    est_output: int


# --- URL -> backend -------------------------------------------------------------------------------


def default_ledger_path(dagster_home: str | os.PathLike | None = None) -> Path:
    """``<dagster_home>/ledger.sqlite``; by default ``paths.ledger_path()`` (the one home)."""
    return Path(dagster_home) / "ledger.sqlite" if dagster_home else paths.ledger_path()


_PG_DRIVERS = ("", "psycopg")  # postgresql://, postgresql+psycopg:// (postgres:// is libpq's alias)


def is_postgres_url(url: str | os.PathLike | None) -> bool:
    return isinstance(url, str) and re.match(r"\s*postgres(ql)?(\+[^:/]*)?://", url, re.I) is not None


def mask_url(url: str) -> str:
    """The URL with any password replaced by ``***`` (in the user info and in a ``password=`` parameter)."""
    m = re.match(r"(?P<head>[^:/?#]+://)(?P<netloc>[^/?#]*)(?P<tail>.*)\Z", url, re.S)
    if not m:
        return url
    netloc = m["netloc"]
    user, at, hosts = netloc.rpartition("@")
    if at and ":" in user:
        netloc = f"{user.split(':', 1)[0]}:***@{hosts}"
    tail = re.sub(r"(?i)([?&]password=)[^&#]*", r"\1***", m["tail"])
    return m["head"] + netloc + tail


def postgres_conninfo(url: str) -> str:
    """A libpq URI from a ledger URL: ``postgresql+psycopg://`` loses its driver suffix; other drivers are refused."""
    url = url.strip()
    m = re.match(r"(?i)(postgres(?:ql)?)(?:\+([^:/]*))?://", url)
    if not m:
        raise LedgerConfigError(f"ledger url: {mask_url(url)!r} is not a postgresql:// URL")
    driver = (m.group(2) or "").lower()
    if driver not in _PG_DRIVERS:
        raise LedgerConfigError(
            f"ledger url: driver {driver!r} is not supported (the ledger uses psycopg 3); "
            "write postgresql://user@host:5432/db or postgresql+psycopg://user@host:5432/db"
        )
    return "postgresql://" + url[m.end():]


def sqlite_path_from_url(url: str, dagster_home: str | os.PathLike | None = None) -> Path:
    url = (url or "").strip()
    if not url:
        return default_ledger_path(dagster_home)
    low = url.lower()
    if is_postgres_url(url) or low.startswith("postgresql+"):
        raise LedgerConfigError(
            f"ledger url: {mask_url(url)} names a PostgreSQL ledger, not a SQLite file; open it with "
            "ledger_from_url() or LedgerResource(url=...).get_ledger() (postgresql ledgers are not supported yet "
            "where a SQLite file path is required, e.g. `kregress usage --ledger-url`)"
        )
    if low.startswith("sqlite:///"):
        rest = url[len("sqlite:///"):]
        if not rest:
            raise LedgerConfigError("ledger url: sqlite:/// needs a file path, e.g. sqlite:////tmp/ledger.sqlite")
        if rest == ":memory:":
            raise LedgerConfigError("ledger url: an in-memory ledger cannot be shared across processes; give a file path")
        return Path(rest)  # sqlite:////abs -> /abs ; sqlite:///rel -> rel (SQLAlchemy's convention)
    if "://" in url:
        raise LedgerConfigError(f"ledger url: unsupported scheme {url.split('://', 1)[0]!r}; use sqlite:///PATH or leave it empty")
    return Path(url)  # a plain file path


_INHERITED: list[sqlite3.Connection] = []


class _SqliteBackend:
    """One connection per process and thread (opened lazily; a forked child opens its own)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._ready = False
        self._local = threading.local()

    def _connect(self) -> sqlite3.Connection:
        con = sqlite3.connect(str(self.path), timeout=60.0, isolation_level=None, check_same_thread=False)
        con.row_factory = sqlite3.Row
        con.execute("PRAGMA busy_timeout = 60000")
        con.execute("PRAGMA synchronous = NORMAL")  # WAL: durable at checkpoints, never corrupt
        return con

    def _conn(self) -> sqlite3.Connection:
        con = getattr(self._local, "con", None)
        if con is None or getattr(self._local, "pid", None) != os.getpid():
            if con is not None:
                # Inherited across fork: never use or close it here (closing could checkpoint the parent's WAL).
                _INHERITED.append(con)
            self._init()
            con = self._connect()
            self._local.con, self._local.pid = con, os.getpid()
        return con

    def _init(self) -> None:
        if self._ready:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        con = self._connect()
        try:
            for _ in range(100):
                try:
                    con.execute("PRAGMA journal_mode = WAL")
                    break
                except sqlite3.OperationalError:  # another process is switching it right now
                    time.sleep(0.05)
            con.execute("BEGIN IMMEDIATE")
            for stmt in _SCHEMA:
                con.execute(stmt)
            con.execute("COMMIT")
        finally:
            con.close()
        self._ready = True

    @contextmanager
    def write(self, lock: str | None = None) -> Iterator[sqlite3.Connection]:
        """An exclusive write transaction (BEGIN IMMEDIATE): checks and inserts inside it are atomic.

        ``lock`` (the scope a check reads) needs nothing more here: the whole file is locked.
        """
        con = self._conn()
        con.execute("BEGIN IMMEDIATE")
        try:
            yield con
        except BaseException:
            con.execute("ROLLBACK")
            raise
        con.execute("COMMIT")

    @contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        yield self._conn()

    @staticmethod
    def insert(con: sqlite3.Connection, sql: str, params: Sequence[Any]) -> int:
        return int(con.execute(sql, params).lastrowid)

    def close(self) -> None:
        con = getattr(self._local, "con", None)
        if con is not None and getattr(self._local, "pid", None) == os.getpid():
            con.close()
        self._local.con = None


def _pg_schema() -> list[str]:
    """The SQLite schema in PostgreSQL types: identity ids, float8 times, byte-ordered ("C") text."""
    out = []
    for stmt in _SCHEMA:
        stmt = stmt.replace("INTEGER PRIMARY KEY AUTOINCREMENT", "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY")
        stmt = re.sub(r"\bREAL\b", "DOUBLE PRECISION", stmt)
        out.append(re.sub(r"\bTEXT\b", 'TEXT COLLATE "C"', stmt))
    return out


_PG_LOCK_NS = 0x6B72  # first key of every advisory lock the ledger takes ("kr")


def _import_psycopg() -> Any:
    try:
        import psycopg
        import psycopg.rows
    except ImportError as e:
        raise LedgerConfigError(
            f"ledger url: a postgresql ledger needs the psycopg 3 driver ({e}); install it with: pip install 'psycopg[binary]>=3.2'"
        ) from None
    return psycopg


class _PgConn:
    """A psycopg connection that takes the ledger's ``?`` placeholders and binds booleans as integers."""

    def __init__(self, con: Any) -> None:
        self._con = con

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return self._con.execute(sql.replace("?", "%s"), [int(v) if isinstance(v, bool) else v for v in params])


class _PostgresBackend:
    """One psycopg connection per process and thread, in autocommit; ``write()`` opens a transaction."""

    def __init__(self, url: str) -> None:
        self.display = mask_url(url.strip())
        self._conninfo = postgres_conninfo(url)
        self._psycopg = _import_psycopg()
        try:
            params = self._psycopg.conninfo.conninfo_to_dict(self._conninfo)
        except self._psycopg.Error as e:
            raise LedgerConfigError(f"ledger url: {self.display} is not a valid libpq URI: {self._scrub(e)}") from None
        self._password = str(params.get("password") or "")
        self._connect_kw = {} if "connect_timeout" in params else {"connect_timeout": 10}
        self._ready = False
        self._local = threading.local()

    def _scrub(self, err: BaseException) -> str:
        msg = str(err).strip()
        return msg.replace(self._password, "***") if getattr(self, "_password", "") else msg

    def _connect(self) -> Any:
        pg = self._psycopg
        try:
            return pg.connect(self._conninfo, autocommit=True, row_factory=pg.rows.dict_row,
                              application_name="kregress-ledger", **self._connect_kw)
        except pg.Error as e:
            raise LedgerConnectionError(f"ledger: cannot connect to {self.display}: {self._scrub(e)}") from None

    def _conn(self) -> Any:
        con = getattr(self._local, "con", None)
        if con is not None and getattr(self._local, "pid", None) != os.getpid():
            # Inherited across fork: the socket is the parent's; never use it, and keep it referenced so that
            # garbage collection never sends a Terminate message down it.
            _INHERITED.append(con)
            con = None
        if con is None or con.closed or con.broken:
            con = self._connect()
            self._local.con, self._local.pid = con, os.getpid()
            self._init(con)
        return con

    def _init(self, con: Any) -> None:
        if self._ready:
            return
        with con.transaction():
            con.execute(f"SELECT pg_advisory_xact_lock({_PG_LOCK_NS}, 0)")  # concurrent CREATE IF NOT EXISTS can race
            for stmt in _pg_schema():
                con.execute(stmt)
        self._ready = True

    @contextmanager
    def write(self, lock: str | None = None) -> Iterator[_PgConn]:
        """A transaction; with ``lock``, first an advisory lock on that scope (held until commit or rollback)."""
        con = self._conn()
        with con.transaction():
            if lock is not None:
                con.execute(f"SELECT pg_advisory_xact_lock({_PG_LOCK_NS}, hashtext(%s))", (lock,))
            yield _PgConn(con)

    @contextmanager
    def read(self) -> Iterator[_PgConn]:
        yield _PgConn(self._conn())

    @staticmethod
    def insert(con: _PgConn, sql: str, params: Sequence[Any]) -> int:
        return int(con.execute(sql + " RETURNING id", params).fetchone()["id"])

    def close(self) -> None:
        con = getattr(self._local, "con", None)
        if con is not None and getattr(self._local, "pid", None) == os.getpid():
            con.close()
        self._local.con = None


# --- the ledger ----------------------------------------------------------------------------------


def _where(filters: dict[str, Any], allowed: Iterable[str]) -> tuple[str, list[Any]]:
    allowed = set(allowed)
    clauses, params = [], []
    for k, v in filters.items():
        if v is None:
            continue
        if k not in allowed:
            raise ValueError(f"cannot filter on {k!r}; allowed: {', '.join(sorted(allowed))}")
        clauses.append(f"{k} = ?")
        params.append(v)
    return (" WHERE " + " AND ".join(clauses)) if clauses else "", params


class Ledger:
    """Append-only usage rows, atomic budget reservations and the response cache.

    ``Ledger(path)`` opens a SQLite file; ``Ledger("postgresql://user@host:5432/db")`` (or
    ``postgresql+psycopg://``) a PostgreSQL database. ``path`` is None for PostgreSQL; ``location`` is the
    file path or the URL with its password masked.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self._db: _SqliteBackend | _PostgresBackend
        if is_postgres_url(path):
            self.path: Path | None = None
            self.backend = "postgresql"
            self._db = _PostgresBackend(str(path))
            self.location = self._db.display
        else:
            self.path = Path(path)
            self.backend = "sqlite"
            self._db = _SqliteBackend(self.path)
            self.location = str(self.path)

    def __repr__(self) -> str:
        return f"Ledger({self.location!r})"

    def close(self) -> None:
        """Close this thread's connection (the next call reopens it)."""
        self._db.close()

    # -- usage rows --------------------------------------------------------------------------
    def record(self, rec: UsageRecord, *, sweep: str = "", reservation_id: int | None = None) -> int:
        """Append one attempt; returns its row id."""
        data = rec.model_dump()
        data["cache_hit"] = int(bool(data["cache_hit"]))
        cols = list(USAGE_FIELDS) + ["sweep", "reservation_id"]
        vals = [data[c] for c in USAGE_FIELDS] + [sweep, reservation_id]
        with self._db.write() as con:
            return self._db.insert(con, f"INSERT INTO usage ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})", vals)

    def rows(self, **filters: Any) -> list[UsageRecord]:
        """Usage rows in insertion order, filtered by equality on run_id, partition, round, role, task, sweep, ..."""
        where, params = _where(filters, list(USAGE_FIELDS) + ["sweep", "reservation_id"])
        with self._db.read() as con:
            cur = con.execute(f"SELECT {', '.join(USAGE_FIELDS)} FROM usage{where} ORDER BY id", params)
            return [UsageRecord(**{**dict(r), "cache_hit": bool(r["cache_hit"])}) for r in cur.fetchall()]

    def reconcile(self, group_by: Sequence[str] = ("role", "key_alias"), **filters: Any) -> list[dict[str, Any]]:
        """The reconciliation table: calls (attempts), ok, errors, cache hits, input, output, total per group."""
        group_by = list(group_by)
        bad = [g for g in group_by if g not in GROUPABLE]
        if bad or not group_by:
            raise ValueError(f"cannot group by {', '.join(bad) or '(nothing)'}; allowed: {', '.join(GROUPABLE)}")
        where, params = _where(filters, list(USAGE_FIELDS) + ["sweep"])
        cols = ", ".join(group_by)
        sql = (
            f"SELECT {cols}, COUNT(*) AS calls, SUM(CASE WHEN status = 'ok' THEN 1 ELSE 0 END) AS ok, "
            "SUM(CASE WHEN status != 'ok' THEN 1 ELSE 0 END) AS errors, "
            "SUM(cache_hit) AS cache_hits, SUM(prompt_tokens) AS input, SUM(completion_tokens) AS output, "
            f"SUM(total_tokens) AS total FROM usage{where} GROUP BY {cols} ORDER BY {cols}"
        )
        with self._db.read() as con:
            return [{k: (int(v) if k in ("calls", "ok", "errors", "cache_hits", "input", "output", "total") else v) for k, v in dict(r).items()} for r in con.execute(sql, params)]

    def export_jsonl(self, path: str | os.PathLike, **filters: Any) -> int:
        """usage.jsonl: one UsageRecord per line. Returns the number of rows written."""
        rows = self.rows(**filters)
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        with p.open("w") as f:
            for r in rows:
                f.write(r.model_dump_json() + "\n")
        return len(rows)

    def export_usage_csv(self, path: str | os.PathLike, **filters: Any) -> int:
        """Every attempt as CSV (the same columns as usage.jsonl)."""
        rows = self.rows(**filters)
        write_csv(path, [r.model_dump() for r in rows], list(USAGE_FIELDS))
        return len(rows)

    # -- budgets -----------------------------------------------------------------------------
    def reserve(
        self,
        *,
        sweep: str,
        round: int,
        est_input: int,
        est_output: int,
        budget: Budget | None,
        run_id: str = "",
        partition: str = "",
        role: str = "",
        task: str = "",
        record_refusal: bool = True,
    ) -> Reservation:
        """Atomically check the budget and reserve ``est_input + est_output``; raise BudgetExceeded if it does not fit.

        Per-round limits apply to rounds >= 1; the sweep total applies to every call of the sweep
        (the report and review calls included). ``budget=None`` reserves without limits.
        """
        est_input, est_output = int(est_input), int(est_output)
        now = time.time()
        reason = ""
        with self._db.write(lock=sweep) as con:  # every check below reads this sweep's reservations only
            if budget is not None:
                if round >= 1:
                    r = con.execute(
                        f"SELECT COALESCE(SUM({_CHARGED_IN}), 0) AS used_in, COALESCE(SUM({_CHARGED_OUT}), 0) AS used_out "
                        "FROM reservations WHERE sweep = ? AND round = ?",
                        (sweep, round),
                    ).fetchone()
                    used_in, used_out = int(r["used_in"]), int(r["used_out"])
                    if used_in + est_input > budget.max_input_tokens_per_round:
                        reason = (
                            f"round {round} input: {used_in} used + {est_input} estimated > max_input_tokens_per_round "
                            f"{budget.max_input_tokens_per_round}"
                        )
                    elif used_out + est_output > budget.max_output_tokens_per_round:
                        reason = (
                            f"round {round} output: {used_out} used + {est_output} (max_tokens) > max_output_tokens_per_round "
                            f"{budget.max_output_tokens_per_round}"
                        )
                if not reason:
                    used_total = int(con.execute(
                        f"SELECT COALESCE(SUM({_CHARGED_IN} + {_CHARGED_OUT}), 0) AS used FROM reservations WHERE sweep = ?", (sweep,)
                    ).fetchone()["used"])
                    if used_total + est_input + est_output > budget.max_total_tokens:
                        reason = (
                            f"sweep total: {used_total} used + {est_input + est_output} estimated > max_total_tokens "
                            f"{budget.max_total_tokens}"
                        )
            if reason and not record_refusal:
                state = None
            else:
                state = "refused" if reason else "reserved"
            rid = 0
            if state is not None:
                rid = self._db.insert(
                    con,
                    "INSERT INTO reservations (ts, sweep, run_id, partition, round, role, task, est_input, est_output, state, reason) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (now, sweep, run_id, partition, round, role, task, est_input, est_output, state, reason),
                )
        if reason:
            raise BudgetExceeded(reason, scope=sweep, round=round)
        return Reservation(rid, sweep, round, est_input, est_output)

    def settle(self, reservation: Reservation | int, input_tokens: int, output_tokens: int) -> None:
        """Replace the estimate with the usage the server reported (zero for both releases it)."""
        rid = reservation.id if isinstance(reservation, Reservation) else int(reservation)
        state = "settled" if (input_tokens or output_tokens) else "released"
        with self._db.write() as con:
            con.execute(
                "UPDATE reservations SET state = ?, input_tokens = ?, output_tokens = ?, settled_ts = ? WHERE id = ? AND state = 'reserved'",
                (state, int(input_tokens), int(output_tokens), time.time(), rid),
            )

    def spend(self, sweep: str) -> dict[int, dict[str, int]]:
        """round -> {input, output, total, reserved_in_flight, refused, calls} for one sweep."""
        sql = (
            f"SELECT round, COALESCE(SUM({_CHARGED_IN}), 0) AS input, COALESCE(SUM({_CHARGED_OUT}), 0) AS output, "
            "SUM(CASE WHEN state = 'reserved' THEN 1 ELSE 0 END) AS in_flight, "
            "SUM(CASE WHEN state = 'refused' THEN 1 ELSE 0 END) AS refused, "
            "SUM(CASE WHEN state IN ('settled', 'released', 'reserved') THEN 1 ELSE 0 END) AS calls "
            "FROM reservations WHERE sweep = ? GROUP BY round ORDER BY round"
        )
        with self._db.read() as con:
            out = {}
            for r in con.execute(sql, (sweep,)):
                out[int(r["round"])] = {
                    "input": int(r["input"]),
                    "output": int(r["output"]),
                    "total": int(r["input"]) + int(r["output"]),
                    "in_flight": int(r["in_flight"] or 0),
                    "refused": int(r["refused"] or 0),
                    "calls": int(r["calls"] or 0),
                }
            return out

    def refusals(self, sweep: str) -> list[dict[str, Any]]:
        with self._db.read() as con:
            return [dict(r) for r in con.execute(
                "SELECT round, role, task, est_input, est_output, reason FROM reservations WHERE sweep = ? AND state = 'refused' ORDER BY id",
                (sweep,),
            )]

    def latest_sweep(self, partition: str) -> str | None:
        """The sweep (budget scope) of the most recent call for a partition (a reservation or a cache hit)."""
        with self._db.read() as con:
            r = con.execute(
                "SELECT sweep FROM (SELECT sweep, ts FROM reservations WHERE partition = ? "
                "UNION ALL SELECT sweep, ts FROM usage WHERE partition = ? AND sweep != '') AS calls ORDER BY ts DESC LIMIT 1",
                (partition, partition),
            ).fetchone()
            return r["sweep"] if r else None

    # -- response cache ----------------------------------------------------------------------
    def cache_get(self, request_hash: str) -> dict[str, Any] | None:
        with self._db.read() as con:
            r = con.execute("SELECT * FROM response_cache WHERE request_hash = ?", (request_hash,)).fetchone()
            return dict(r) if r else None

    def cache_put(
        self,
        request_hash: str,
        *,
        model: str,
        role: str,
        content: str,
        finish_reason: str = "",
        request_id: str = "",
        prompt_tokens: int = 0,
        completion_tokens: int = 0,
    ) -> None:
        with self._db.write() as con:
            con.execute(
                "INSERT INTO response_cache (request_hash, ts, model, role, content, finish_reason, request_id, "
                "prompt_tokens, completion_tokens) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (request_hash) DO UPDATE SET "
                "ts = excluded.ts, model = excluded.model, role = excluded.role, content = excluded.content, "
                "finish_reason = excluded.finish_reason, request_id = excluded.request_id, "
                "prompt_tokens = excluded.prompt_tokens, completion_tokens = excluded.completion_tokens",
                (request_hash, time.time(), model, role, content, finish_reason, request_id, prompt_tokens, completion_tokens),
            )


# --- reports ---------------------------------------------------------------------------------------


@dataclass
class RoundSpend:
    round: int
    input: int
    output: int
    input_limit: int | None  # None: no per-round limit (round 0: the report/review calls)
    output_limit: int | None
    in_flight: int = 0
    refused: int = 0
    calls: int = 0

    @property
    def ok(self) -> bool:
        return (self.input_limit is None or self.input <= self.input_limit) and (
            self.output_limit is None or self.output <= self.output_limit
        )


@dataclass
class BudgetReport:
    sweep: str | None
    rounds: list[RoundSpend] = field(default_factory=list)
    total: int = 0
    total_limit: int = 0
    refusals: list[dict[str, Any]] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.total <= self.total_limit and all(r.ok for r in self.rounds)

    def table(self) -> list[dict[str, Any]]:
        out = []
        for r in self.rounds:
            out.append(
                {
                    "round": r.round,
                    "input": r.input,
                    "input_limit": r.input_limit if r.input_limit is not None else -1,
                    "output": r.output,
                    "output_limit": r.output_limit if r.output_limit is not None else -1,
                    "calls": r.calls,
                    "refused": r.refused,
                    "ok": r.ok,
                }
            )
        return out

    def markdown(self) -> str:
        lines = [
            f"Sweep `{self.sweep}`: {self.total} / {self.total_limit} tokens ({'within' if self.total <= self.total_limit else 'OVER'} budget)",
            "",
            "| round | input | input limit | output | output limit | calls | refused | ok |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in self.rounds:
            lim_in = "-" if r.input_limit is None else str(r.input_limit)
            lim_out = "-" if r.output_limit is None else str(r.output_limit)
            lines.append(f"| {r.round} | {r.input} | {lim_in} | {r.output} | {lim_out} | {r.calls} | {r.refused} | {'yes' if r.ok else 'NO'} |")
        for ref in self.refusals:
            lines.append(f"- refused (round {ref['round']}, {ref['role']}): {ref['reason']}")
        return "\n".join(lines)


def budget_report(ledger: Ledger, budget: Budget, *, sweep: str | None = None, partition: str | None = None) -> BudgetReport:
    """Spend against budget per round for one sweep (by default the latest sweep of ``partition``).

    Spend counts settled usage plus in-flight reservations at their estimate. A sweep with no calls
    reports zero spend and passes.
    """
    if sweep is None:
        if partition is None:
            raise ValueError("budget_report needs a sweep or a partition")
        sweep = ledger.latest_sweep(partition)
    rep = BudgetReport(sweep=sweep, total_limit=budget.max_total_tokens)
    if sweep is None:
        return rep
    for rnd, s in sorted(ledger.spend(sweep).items()):
        per_round = rnd >= 1
        rep.rounds.append(
            RoundSpend(
                round=rnd,
                input=s["input"],
                output=s["output"],
                input_limit=budget.max_input_tokens_per_round if per_round else None,
                output_limit=budget.max_output_tokens_per_round if per_round else None,
                in_flight=s["in_flight"],
                refused=s["refused"],
                calls=s["calls"],
            )
        )
        rep.total += s["total"]
    rep.refusals = ledger.refusals(sweep)
    return rep


def write_csv(path: str | os.PathLike, rows: list[dict[str, Any]], columns: Sequence[str] | None = None) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    cols = list(columns or (rows[0].keys() if rows else []))
    with p.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        for r in rows:
            w.writerow({c: r.get(c) for c in cols})


def totals_row(table: list[dict[str, Any]], group_by: Sequence[str]) -> dict[str, Any]:
    row: dict[str, Any] = {g: "" for g in group_by}
    if group_by:
        row[group_by[0]] = "TOTAL"
    for k in ("calls", "ok", "errors", "cache_hits", "input", "output", "total"):
        row[k] = sum(int(r.get(k) or 0) for r in table)
    return row


def format_table(rows: list[dict[str, Any]], columns: Sequence[str] | None = None) -> str:
    """Plain-text table (right-aligned numbers), for the CLI and logs."""
    if not rows:
        return "(no model calls recorded)"
    cols = list(columns or rows[0].keys())
    cells = [[("" if r.get(c) is None else str(r.get(c))) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    numeric = [all(isinstance(r.get(c), (int, float)) and not isinstance(r.get(c), bool) or r.get(c) in ("", None) for r in rows) for c in cols]
    def fmt(vals: list[str]) -> str:
        return "  ".join(v.rjust(w) if num else v.ljust(w) for v, w, num in zip(vals, widths, numeric)).rstrip()
    out = [fmt(cols), "  ".join("-" * w for w in widths)]
    out += [fmt(r) for r in cells]
    return "\n".join(out)


# --- the Dagster resource ------------------------------------------------------------------------


def ledger_from_url(url: str | None, dagster_home: str | os.PathLike | None = None) -> Ledger:
    """A ledger from a URL: postgresql:// / postgresql+psycopg://, sqlite:///PATH, a file path, or empty for the default file."""
    if is_postgres_url(url or ""):
        return Ledger(str(url).strip())
    return Ledger(sqlite_path_from_url(url or "", dagster_home))


class LedgerResource(dg.ConfigurableResource):
    """Where the token ledger lives. Empty ``url``: ``$DAGSTER_HOME/ledger.sqlite``."""

    url: str = Field(
        default="",
        description="sqlite:///PATH (sqlite:////abs/path), a plain file path, empty for $DAGSTER_HOME/ledger.sqlite, or "
        "postgresql://USER@HOST:5432/DB (also postgresql+psycopg://) for a ledger shared by several hosts. Keep the "
        "password out of run config: use PGPASSWORD or ~/.pgpass, or pass the whole URL as dg.EnvVar(...).",
    )

    def get_ledger(self) -> Ledger:
        return ledger_from_url(self.url)
