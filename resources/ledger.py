"""The token ledger: one row per model-call attempt, budget reservations, key cooldowns and the response cache.

Storage goes through SQLAlchemy Core: a SQLite file by default (``paths.ledger_path()``, i.e.
``$DAGSTER_HOME/ledger.sqlite``, in WAL mode) or PostgreSQL by URL (``postgresql://`` /
``postgresql+psycopg://``, psycopg 3). The schema is defined once (``METADATA``); SQLAlchemy renders it
per dialect (identity ids, double precision times, byte-ordered ``COLLATE "C"`` text on PostgreSQL so
ORDER BY sorts like SQLite's BINARY). URLs are parsed and masked with ``sqlalchemy.engine.make_url``.

Tables:

- ``usage``: one row per attempt, the fields of ``kregress.core.records.UsageRecord`` (plus the sweep and the
  reservation it belonged to). Cache hits are rows with ``cache_hit`` set and no tokens.
- ``reservations``: one row per logical call. ``reserved`` rows count their estimate (prompt estimate +
  max_tokens); ``settled`` rows count the usage the server reported; ``released`` rows count nothing;
  ``refused`` rows are calls that were never sent because the budget would have been exceeded. A settled
  row that reports more than it reserved is an *overshoot*: it blocks every further call of its sweep.
- ``key_cooldowns``: key alias -> wall-clock time until which the key should not be used (rate limits and
  rejected credentials), shared by every process using this ledger. Aliases only, never keys.
- ``response_cache``: model text by request hash (model, messages, parameters). Keys are never stored.

Reservations are atomic across processes: on SQLite every write is one ``BEGIN IMMEDIATE`` transaction
(one writer at a time, whole file); on PostgreSQL a reservation takes ``pg_advisory_xact_lock`` on its
sweep inside the transaction, so reservations of one sweep are serialised across processes and hosts
while other sweeps proceed. The password may be in the URL or in PGPASSWORD (libpq's own rules,
``~/.pgpass`` included); it never appears in reprs or error messages (``mask_url``).
"""

from __future__ import annotations

import csv
import os
import sqlite3
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import dagster as dg
import sqlalchemy as sa
from pydantic import Field
from sqlalchemy.engine import URL, make_url

from kregress.core import paths
from kregress.core.records import USAGE_GROUPABLE, UsageRecord
from kregress.core.spec import Budget

USAGE_FIELDS = tuple(UsageRecord.model_fields)
GROUPABLE = USAGE_GROUPABLE
# The reconciliation table's numeric columns, in order: every table of usage (CLI, assets, reports) uses these.
RECONCILE_COLUMNS = ("calls", "ok", "errors", "cache_hits", "input", "output", "total")
CACHE_ALIAS = "(cache)"

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
    sa.Index("reservations_by_sweep", "sweep", "round"),
    sa.Index("reservations_by_partition", "partition", "ts"),
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

_r = reservations_t.c
# Tokens a reservation counts, by state: the estimate while in flight, the reported usage once settled.
_CHARGED_IN = sa.case((_r.state == "reserved", _r.est_input), (_r.state == "settled", _r.input_tokens), else_=0)
_CHARGED_OUT = sa.case((_r.state == "reserved", _r.est_output), (_r.state == "settled", _r.output_tokens), else_=0)
_OVER_IN = sa.case((sa.and_(_r.state == "settled", _r.input_tokens > _r.est_input), _r.input_tokens - _r.est_input), else_=0)
_OVER_OUT = sa.case((sa.and_(_r.state == "settled", _r.output_tokens > _r.est_output), _r.output_tokens - _r.est_output), else_=0)
_OVERSHOT = sa.and_(_r.state == "settled", sa.or_(_r.input_tokens > _r.est_input, _r.output_tokens > _r.est_output))
_in_round = _r.round == sa.bindparam("round")
# Everything a reservation checks, in one statement built once (binds: sweep, round).
_BUDGET_STATE = sa.select(
    sa.func.coalesce(sa.func.sum(sa.case((_in_round, _CHARGED_IN), else_=0)), 0).label("round_in"),
    sa.func.coalesce(sa.func.sum(sa.case((_in_round, _CHARGED_OUT), else_=0)), 0).label("round_out"),
    sa.func.coalesce(sa.func.sum(_CHARGED_IN + _CHARGED_OUT), 0).label("total"),
    sa.func.count(sa.case((_OVERSHOT, 1))).label("over_calls"),
    sa.func.coalesce(sa.func.sum(_OVER_IN), 0).label("over_in"),
    sa.func.coalesce(sa.func.sum(_OVER_OUT), 0).label("over_out"),
    sa.func.min(sa.case((_OVERSHOT, _r.round))).label("over_first"),
).where(_r.sweep == sa.bindparam("sweep"))
_INSERT_RESERVATION = sa.insert(reservations_t).returning(_r.id)
_INSERT_USAGE = sa.insert(usage_t).returning(usage_t.c.id)
_SETTLE = sa.update(reservations_t).where(_r.id == sa.bindparam("b_id"), _r.state == "reserved").values(
    state=sa.bindparam("b_state"), input_tokens=sa.bindparam("b_in"), output_tokens=sa.bindparam("b_out"), settled_ts=sa.bindparam("b_ts"))
_COOLDOWNS = sa.select(cooldowns_t.c.key_alias, cooldowns_t.c.cool_until, cooldowns_t.c.reason, cooldowns_t.c.owner).where(
    cooldowns_t.c.key_alias.in_(sa.bindparam("aliases", expanding=True)), cooldowns_t.c.cool_until > sa.bindparam("now"))


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
    est_output: int  # the max_tokens the call may use (possibly lowered to what the budget has left)


@dataclass(frozen=True)
class Overshoot:
    """Usage the server reported beyond what was reserved, for one sweep."""

    calls: int = 0
    input: int = 0
    output: int = 0
    first_round: int | None = None

    @property
    def tokens(self) -> int:
        return self.input + self.output

    def __bool__(self) -> bool:
        return self.calls > 0


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


class Ledger:
    """Append-only usage rows, atomic budget reservations, shared key cooldowns and the response cache.

    ``Ledger(path)`` opens a SQLite file; ``Ledger("postgresql://user@host:5432/db")`` (or
    ``postgresql+psycopg://``) a PostgreSQL database. ``path`` is None for PostgreSQL; ``location`` is the
    file path or the URL with its password masked.
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
    def _eng(self) -> sa.Engine:
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
                    self.path.parent.mkdir(parents=True, exist_ok=True)
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
            else:
                with eng.begin() as con:  # concurrent CREATE IF NOT EXISTS can race: serialise it
                    con.execute(sa.select(sa.func.pg_advisory_xact_lock(_PG_LOCK_NS, 0)))
                    METADATA.create_all(con)
        except sa.exc.OperationalError as e:
            raise LedgerConnectionError(f"ledger: cannot connect to {self.location}: {self._scrub(e)}") from None
        _READY.add((self._key, os.getpid()))  # type: ignore[arg-type]

    @contextmanager
    def _write(self, lock: str | None = None) -> Iterator[sa.Connection]:
        """One atomic write transaction (SQLite: BEGIN IMMEDIATE; PostgreSQL: with ``lock``, an advisory lock on that scope)."""
        try:
            with self._eng().connect().execution_options(kregress_write=True) as con, con.begin():
                if lock is not None and self.backend == "postgresql":
                    con.execute(sa.select(sa.func.pg_advisory_xact_lock(_PG_LOCK_NS, sa.func.hashtext(lock))))
                yield con
        except sa.exc.OperationalError as e:
            raise LedgerConnectionError(f"ledger: cannot use {self.location}: {self._scrub(e)}") from None

    @contextmanager
    def _read(self) -> Iterator[sa.Connection]:
        try:
            with self._eng().connect() as con:
                yield con
        except sa.exc.OperationalError as e:
            raise LedgerConnectionError(f"ledger: cannot use {self.location}: {self._scrub(e)}") from None

    def close(self) -> None:
        """Close this process's connections (the next call reopens them)."""
        if self._engine is not None and self._pid == os.getpid():
            self._engine.dispose()
        self._engine = None

    # -- usage rows --------------------------------------------------------------------------
    def record(self, rec: UsageRecord, *, sweep: str = "", reservation_id: int | None = None) -> int:
        """Append one attempt; returns its row id."""
        data = rec.model_dump()
        data["cache_hit"] = int(bool(data["cache_hit"]))
        with self._write() as con:
            return int(con.execute(_INSERT_USAGE, {**data, "sweep": sweep, "reservation_id": reservation_id}).scalar_one())

    @staticmethod
    def _where(table: sa.Table, filters: dict[str, Any], allowed: Sequence[str]) -> list[Any]:
        out = []
        for k, v in filters.items():
            if v is None:
                continue
            if k not in allowed:
                raise ValueError(f"cannot filter on {k!r}; allowed: {', '.join(sorted(allowed))}")
            out.append(table.c[k] == (int(v) if isinstance(v, bool) else v))
        return out

    def rows(self, **filters: Any) -> list[UsageRecord]:
        """Usage rows in insertion order, filtered by equality on run_id, partition, round, role, task, sweep, ..."""
        cond = self._where(usage_t, filters, [*USAGE_FIELDS, "sweep", "reservation_id"])
        q = sa.select(*(usage_t.c[f] for f in USAGE_FIELDS)).where(*cond).order_by(usage_t.c.id)
        with self._read() as con:
            return [UsageRecord(**{**r._asdict(), "cache_hit": bool(r.cache_hit)}) for r in con.execute(q)]

    def reconcile(self, group_by: Sequence[str] = ("role", "key_alias"), **filters: Any) -> list[dict[str, Any]]:
        """The reconciliation table: calls (attempts), ok, errors, cache hits, input, output, total per group."""
        group_by = list(group_by)
        bad = [g for g in group_by if g not in GROUPABLE]
        if bad or not group_by:
            raise ValueError(f"cannot group by {', '.join(bad) or '(nothing)'}; allowed: {', '.join(GROUPABLE)}")
        c = usage_t.c
        cond = self._where(usage_t, filters, [*USAGE_FIELDS, "sweep"])
        sums = dict(zip(RECONCILE_COLUMNS, (
            sa.func.count(), sa.func.sum(sa.case((c.status == "ok", 1), else_=0)), sa.func.sum(sa.case((c.status != "ok", 1), else_=0)),
            sa.func.sum(c.cache_hit), sa.func.sum(c.prompt_tokens), sa.func.sum(c.completion_tokens), sa.func.sum(c.total_tokens),
        )))
        keys = [c[g] for g in group_by]
        q = sa.select(*keys, *(v.label(k) for k, v in sums.items())).where(*cond).group_by(*keys).order_by(*keys)
        with self._read() as con:
            return [{**{g: r._mapping[g] for g in group_by}, **{k: int(r._mapping[k] or 0) for k in RECONCILE_COLUMNS}} for r in con.execute(q)]

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
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        with p.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(USAGE_FIELDS))
            w.writeheader()
            w.writerows(r.model_dump() for r in rows)
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
        min_output: int | None = None,
    ) -> Reservation:
        """Atomically check the budget and reserve ``est_input + est_output``; raise BudgetExceeded if it does not fit.

        Per-round limits apply to rounds >= 1; the sweep total applies to every call of the sweep (the
        report and review calls included). ``min_output`` (<= est_output) lets the reservation lower
        ``est_output`` (the call's max_tokens) to what the round and the sweep have left, down to
        ``min_output``; the returned reservation says what was granted. After any call of the sweep was
        billed more than it reserved (an overshoot) nothing more is reserved for that sweep.
        ``budget=None`` reserves without limits.
        """
        est_input, est_output = int(est_input), int(est_output)
        floor = est_output if min_output is None else min(max(1, int(min_output)), est_output)
        now = time.time()
        reason = ""
        with self._write(lock=sweep) as con:  # every check below reads this sweep's reservations only
            over = Overshoot()
            if budget is not None:
                st = con.execute(_BUDGET_STATE, {"sweep": sweep, "round": round}).one()
                over = Overshoot(int(st.over_calls), int(st.over_in), int(st.over_out), None if st.over_first is None else int(st.over_first))
                used_in, used_out, used_total = int(st.round_in), int(st.round_out), int(st.total)
                if over:
                    reason = (
                        f"sweep blocked: {over.calls} call(s) from round {over.first_round} on were billed {over.tokens} tokens more "
                        "than they reserved (the server reported more usage than estimated); no further calls in this sweep"
                    )
                if not reason and round >= 1:
                    left_out = budget.max_output_tokens_per_round - used_out
                    if used_in + est_input > budget.max_input_tokens_per_round:
                        reason = (
                            f"round {round} input: {used_in} used + {est_input} estimated > max_input_tokens_per_round "
                            f"{budget.max_input_tokens_per_round}"
                        )
                    elif left_out < floor:
                        reason = (
                            f"round {round} output: {used_out} used + {floor} (max_tokens{' at least' if floor < est_output else ''}) "
                            f"> max_output_tokens_per_round {budget.max_output_tokens_per_round}"
                        )
                    else:
                        est_output = min(est_output, left_out)
                if not reason:
                    left = budget.max_total_tokens - used_total - est_input
                    if left < floor:
                        reason = (
                            f"sweep total: {used_total} used + {est_input + floor} estimated > max_total_tokens "
                            f"{budget.max_total_tokens}"
                        )
                    else:
                        est_output = min(est_output, left)
            state = "refused" if reason else "reserved"
            rid = 0
            if not reason or record_refusal or over:  # a blocked sweep's refusal is final: always on record
                rid = int(con.execute(_INSERT_RESERVATION, dict(
                    ts=now, sweep=sweep, run_id=run_id, partition=partition, round=round, role=role, task=task,
                    est_input=est_input, est_output=est_output, state=state, reason=reason,
                )).scalar_one())
        if reason:
            raise BudgetExceeded(reason, scope=sweep, round=round)
        return Reservation(rid, sweep, round, est_input, est_output)

    def settle(self, reservation: Reservation | int, input_tokens: int, output_tokens: int) -> None:
        """Replace the estimate with the usage the server reported (zero for both releases it).

        Usage above the reservation is recorded as reported: that is what was billed, and it blocks the sweep.
        """
        rid = reservation.id if isinstance(reservation, Reservation) else int(reservation)
        state = "settled" if (input_tokens or output_tokens) else "released"
        with self._write() as con:
            con.execute(_SETTLE, {"b_id": rid, "b_state": state, "b_in": int(input_tokens), "b_out": int(output_tokens), "b_ts": time.time()})

    def overshoot(self, sweep: str) -> Overshoot:
        """How much the server billed beyond the reservations of ``sweep`` (falsy when it never did)."""
        with self._read() as con:
            st = con.execute(_BUDGET_STATE, {"sweep": sweep, "round": -1}).one()
        return Overshoot(int(st.over_calls), int(st.over_in), int(st.over_out), None if st.over_first is None else int(st.over_first))

    def exceeded(self, sweep: str, budget: Budget) -> list[str]:
        """Why ``sweep`` is over ``budget`` (settled usage + in-flight estimates; overshoots), one reason a line; [] if within."""
        out = []
        spend = self.spend(sweep)
        for rnd, s in sorted(spend.items()):
            if rnd >= 1 and s["input"] > budget.max_input_tokens_per_round:
                out.append(f"round {rnd} input {s['input']} > max_input_tokens_per_round {budget.max_input_tokens_per_round}")
            if rnd >= 1 and s["output"] > budget.max_output_tokens_per_round:
                out.append(f"round {rnd} output {s['output']} > max_output_tokens_per_round {budget.max_output_tokens_per_round}")
        total = sum(s["total"] for s in spend.values())
        if total > budget.max_total_tokens:
            out.append(f"sweep total {total} > max_total_tokens {budget.max_total_tokens}")
        over = self.overshoot(sweep)
        if over:
            out.append(f"{over.calls} call(s) billed {over.tokens} tokens beyond their reservation (from round {over.first_round})")
        return out

    def spend(self, sweep: str) -> dict[int, dict[str, int]]:
        """round -> {input, output, total, in_flight, refused, calls} for one sweep."""
        q = (
            sa.select(
                _r.round, sa.func.coalesce(sa.func.sum(_CHARGED_IN), 0).label("input"),
                sa.func.coalesce(sa.func.sum(_CHARGED_OUT), 0).label("output"),
                sa.func.sum(sa.case((_r.state == "reserved", 1), else_=0)).label("in_flight"),
                sa.func.sum(sa.case((_r.state == "refused", 1), else_=0)).label("refused"),
                sa.func.sum(sa.case((_r.state.in_(("settled", "released", "reserved")), 1), else_=0)).label("calls"),
            ).where(_r.sweep == sweep).group_by(_r.round).order_by(_r.round)
        )
        with self._read() as con:
            return {
                int(r.round): {"input": int(r.input), "output": int(r.output), "total": int(r.input) + int(r.output),
                               "in_flight": int(r.in_flight or 0), "refused": int(r.refused or 0), "calls": int(r.calls or 0)}
                for r in con.execute(q)
            }

    def refusals(self, sweep: str) -> list[dict[str, Any]]:
        q = sa.select(_r.round, _r.role, _r.task, _r.est_input, _r.est_output, _r.reason).where(
            _r.sweep == sweep, _r.state == "refused").order_by(_r.id)
        with self._read() as con:
            return [dict(r._mapping) for r in con.execute(q)]

    def latest_sweep(self, partition: str) -> str | None:
        """The sweep (budget scope) of the most recent call for a partition (a reservation or a cache hit)."""
        u = usage_t.c
        calls = sa.union_all(
            sa.select(_r.sweep, _r.ts).where(_r.partition == partition),
            sa.select(u.sweep, u.ts).where(u.partition == partition, u.sweep != ""),
        ).subquery("calls")
        with self._read() as con:
            r = con.execute(sa.select(calls.c.sweep).order_by(calls.c.ts.desc()).limit(1)).first()
            return r[0] if r else None

    # -- key cooldowns (shared by every process on this ledger) -------------------------------
    def cool_key(self, alias: str, until_wall: float, *, reason: str = "", owner: str = "") -> None:
        """Record that ``alias`` should not be used before ``until_wall`` (time.time()); a later time wins."""
        with self._write() as con:
            c = cooldowns_t.c
            old = con.execute(sa.select(c.cool_until).where(c.key_alias == alias)).scalar_one_or_none()
            if old is None:
                con.execute(sa.insert(cooldowns_t).values(key_alias=alias, cool_until=until_wall, reason=reason, owner=owner, ts=time.time()))
            elif until_wall > old:
                con.execute(sa.update(cooldowns_t).where(c.key_alias == alias).values(
                    cool_until=until_wall, reason=reason, owner=owner, ts=time.time()))

    def cooldowns(self, aliases: Sequence[str], *, now_wall: float | None = None) -> dict[str, tuple[float, str, str]]:
        """alias -> (cool_until wall time, reason, owner) for the given aliases still cooling down."""
        now_wall = time.time() if now_wall is None else now_wall
        if not aliases:
            return {}
        with self._read() as con:
            rows = con.execute(_COOLDOWNS, {"aliases": list(aliases), "now": now_wall})
            return {r.key_alias: (float(r.cool_until), r.reason, r.owner) for r in rows}

    # -- response cache ----------------------------------------------------------------------
    def cache_get(self, request_hash: str) -> dict[str, Any] | None:
        with self._read() as con:
            r = con.execute(sa.select(cache_t).where(cache_t.c.request_hash == request_hash)).first()
            return dict(r._mapping) if r else None

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
        values = dict(ts=time.time(), model=model, role=role, content=content, finish_reason=finish_reason, request_id=request_id,
                      prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)
        with self._write() as con:
            if con.execute(sa.select(cache_t.c.request_hash).where(cache_t.c.request_hash == request_hash)).first():
                con.execute(sa.update(cache_t).where(cache_t.c.request_hash == request_hash).values(**values))
            else:
                con.execute(sa.insert(cache_t).values(request_hash=request_hash, **values))


_PG_LOCK_NS = 0x6B72  # first key of every advisory lock the ledger takes ("kr")


def new_owner() -> str:
    """A tag for the cooldowns one gateway writes (it reads back only the others')."""
    return uuid.uuid4().hex[:12]


# --- the Dagster resource ------------------------------------------------------------------------


def ledger_from_url(url: str | None, dagster_home: str | os.PathLike | None = None) -> Ledger:
    """A ledger from a URL: postgresql:// / postgresql+psycopg://, sqlite:///PATH, a file path, or empty for the default file."""
    if is_postgres_url(url or ""):
        return Ledger(str(url).strip())
    return Ledger(sqlite_path_from_url(url or "", dagster_home))


class LedgerResource(dg.ConfigurableResource):
    """Where the token ledger lives. Empty ``url``: ``paths.ledger_path()`` ($DAGSTER_HOME/ledger.sqlite)."""

    url: str = Field(
        default="",
        description="sqlite:///PATH (sqlite:////abs/path), a plain file path, empty for $DAGSTER_HOME/ledger.sqlite, or "
        "postgresql://USER@HOST:5432/DB (also postgresql+psycopg://) for a ledger shared by several hosts. Keep the "
        "password out of run config: use PGPASSWORD or ~/.pgpass, or pass the whole URL as dg.EnvVar(...).",
    )

    def get_ledger(self) -> Ledger:
        return ledger_from_url(self.url)
