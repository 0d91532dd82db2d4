"""The ledger on PostgreSQL, against a real, throwaway PostgreSQL server started for this module.

The fixture finds initdb/pg_ctl/postgres (PATH, then /usr/lib/postgresql/*/bin), runs them as an unprivileged
user when the tests run as root (PostgreSQL refuses root: the `postgres` user, else `nobody`), initdb's a
cluster in a fresh /tmp directory (password auth over TCP, scram-sha-256), starts it on 127.0.0.1 on a free
port with fsync off, gives every test its own database (ICU en-US collation where available, so ordering
that only holds under "C" would show), and stops the server and removes the directory at the end, failed
tests or not. Without the binaries, the driver or a server that starts, the server tests are skipped with
the reason; KREGRESS_REQUIRE_POSTGRES=1 turns that skip into a failure (for CI that must test Postgres).
"""

from __future__ import annotations

import atexit
import csv
import itertools
import json
import multiprocessing as mp
import os
import subprocess
import sys

import pytest

from kernel_assets.usage import budget_report
from kregress.core.budget import BudgetScope, budget_scope
from kregress.core.records import UsageRecord
from kregress.core.spec import Budget
from kregress.testing.postgres import PG_PASSWORD, PG_USER, PgServer, pg_bin_dir
from resources.ledger import (
    BudgetExceeded,
    Ledger,
    LedgerConfigError,
    LedgerConnectionError,
    LedgerResource,
    RoundRow,
    is_postgres_url,
    ledger_from_url,
    mask_url,
    postgres_url,
    sqlite_path_from_url,
)

REQUIRE = os.environ.get("KREGRESS_REQUIRE_POSTGRES", "") not in ("", "0")


def _unavailable(reason: str):
    if REQUIRE:
        pytest.fail(f"PostgreSQL required (KREGRESS_REQUIRE_POSTGRES=1) but {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def pg_server():
    try:
        import psycopg  # noqa: F401
    except ImportError:
        _unavailable("the psycopg driver is not installed (pip install 'psycopg[binary]>=3.2')")
    bindir = pg_bin_dir()
    if bindir is None:
        _unavailable("PostgreSQL server binaries (initdb, pg_ctl, postgres) not found on PATH or in /usr/lib/postgresql/*/bin")
    try:
        server = PgServer(bindir)
    except RuntimeError as e:
        _unavailable(str(e))
    atexit.register(server.stop)  # in case the session dies before teardown
    try:
        server.start()
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
        server.stop()
        _unavailable(f"could not start a PostgreSQL server: {e}")
    try:
        print(f"\nPostgreSQL {bindir} as {server.user} on 127.0.0.1:{server.port}: {server.timings}", file=sys.stderr)
        yield server
    finally:
        server.stop()


_db_names = itertools.count()


@pytest.fixture
def pg_db(pg_server):
    """A fresh database for one test: (server, url with password, whether its default collation is linguistic)."""
    import psycopg

    name = f"ledger_{os.getpid()}_{next(_db_names)}"
    with psycopg.connect(pg_server.url("postgres"), autocommit=True) as con:
        try:  # ICU en-US: 'a' < 'B', unlike SQLite's BINARY; the ledger's COLLATE "C" columns must not care
            con.execute(f"CREATE DATABASE {name} TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'en-US' LOCALE 'C'")
        except psycopg.Error:
            con.execute(f"CREATE DATABASE {name}")
    url = pg_server.url(name)
    with psycopg.connect(url) as con:
        linguistic = bool(con.execute("SELECT 'a' < 'B'").fetchone()[0])
    yield pg_server, url, linguistic


# --- no server needed ------------------------------------------------------------------------------


def test_urls_are_recognised_and_passwords_masked():
    assert is_postgres_url("postgresql://u@h/db") and is_postgres_url("postgresql+psycopg://u@h/db")
    assert is_postgres_url("postgres://u@h/db") and not is_postgres_url("sqlite:///x") and not is_postgres_url("/tmp/postgresql.sqlite")
    assert mask_url("postgresql://ledger:p%40ss:w0rd@db1:5432/ledger?sslmode=require") == \
        "postgresql://ledger:***@db1:5432/ledger?sslmode=require"
    assert mask_url("postgresql+psycopg://u@h/db?application_name=x&password=hunter2") == \
        "postgresql+psycopg://u@h/db?application_name=x&password=***"
    assert mask_url("postgresql://u@h/db") == "postgresql://u@h/db"
    # several hosts: SQLAlchemy's form (repeated host= parameters)
    assert mask_url("postgresql://u:pw@/db?host=db1:5432&host=db2") == "postgresql://u:***@/db?host=db1%3A5432&host=db2"
    assert postgres_url("postgresql+psycopg://u:pw@h:5/db").drivername == "postgresql+psycopg"
    assert postgres_url("postgres://u@h/db").render_as_string() == "postgresql+psycopg://u@h/db"
    with pytest.raises(LedgerConfigError, match="driver 'psycopg2' is not supported"):
        postgres_url("postgresql+psycopg2://u:pw@h/db")
    with pytest.raises(LedgerConfigError, match="ledger_from_url") as ei:
        sqlite_path_from_url("postgresql://u:topsecret@h/db")
    assert "topsecret" not in str(ei.value)


def test_ledger_repr_and_errors_never_show_the_password():
    pytest.importorskip("psycopg", reason="the psycopg driver is not installed")
    led = Ledger("postgresql+psycopg://ledger:topsecret@127.0.0.1:1/db")  # nothing connects until first use
    assert led.path is None and led.backend == "postgresql"
    assert repr(led) == "Ledger('postgresql+psycopg://ledger:***@127.0.0.1:1/db')"
    assert "topsecret" not in repr(LedgerResource(url="postgresql://ledger:topsecret@h/db").get_ledger())
    with pytest.raises(LedgerConnectionError) as ei:
        Ledger("postgresql://ledger:topsecret@127.0.0.1:1/db?connect_timeout=2").usage.rows()  # port 1: nothing listens
    assert "topsecret" not in str(ei.value) and "ledger:***@127.0.0.1:1/db" in str(ei.value)
    with pytest.raises(LedgerConfigError, match="not a valid libpq URI"):
        Ledger("postgresql://h/db?nosuchoption=1")


def test_without_the_driver_the_error_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "psycopg", None)  # import psycopg -> ImportError
    with pytest.raises(LedgerConfigError, match=r"pip install 'psycopg\[binary\]"):
        ledger_from_url("postgresql://u@h/db")


# --- against the server ----------------------------------------------------------------------------


def rec(**kw) -> UsageRecord:
    base = dict(ts=1_733_150_000.123456, role="suggest", key_alias="suggest#aaaa", model="m1", partition="p1", run_id="run1",
                round=1, task="round_1_suggestions", status="ok", prompt_tokens=100, completion_tokens=20, total_tokens=120,
                attempt=1, latency_ms=812.25)
    base.update(kw)
    return UsageRecord(**base)


def fill(led: Ledger) -> None:
    """The same calls as tests/test_ledger.py's fixture, plus keys whose order depends on the collation."""
    led.usage.record(rec(), sweep="run1")
    led.usage.record(rec(key_alias="suggest#bbbb", status="error", error_class="rate_limited:429", prompt_tokens=0,
                   completion_tokens=0, total_tokens=0), sweep="run1")
    led.usage.record(rec(key_alias="suggest#bbbb", attempt=2, round=2, task="round_2_suggestions", model="m2"), sweep="run1")
    led.usage.record(rec(role="report", key_alias="report#cccc", round=0, task="verdict_report", prompt_tokens=300,
                   completion_tokens=50, total_tokens=350), sweep="run1")
    led.usage.record(rec(key_alias="(cache)", cache_hit=True, prompt_tokens=0, completion_tokens=0, total_tokens=0, partition="p2",
                   run_id="run2", ts=1_733_150_100.5), sweep="run2")
    led.usage.record(rec(key_alias="B#upper", model="Zeta", partition="p3", task="ü-task"), sweep="run3")
    led.usage.record(rec(key_alias="a#lower", model="alpha", partition="p3", task="u-task"), sweep="run3")


def test_rows_reconcile_and_exports(pg_db, tmp_path):
    _, url, _ = pg_db
    led = Ledger(url)
    fill(led)
    rows = led.usage.rows()
    assert len(rows) == 7 and rows[0] == rec() and rows[4].cache_hit is True and rows[1].error_class == "rate_limited:429"
    assert rows[0].ts == 1_733_150_000.123456  # float8, not float4
    assert [r.key_alias for r in led.usage.rows(partition="p1", round=1)] == ["suggest#aaaa", "suggest#bbbb"]
    assert [r.key_alias for r in led.usage.rows(cache_hit=True)] == ["(cache)"]
    with pytest.raises(ValueError, match="cannot filter on 'nope'"):
        led.usage.rows(nope=1)
    assert led.usage.reconcile(partition="p1") == [
        {"role": "report", "key_alias": "report#cccc", "calls": 1, "ok": 1, "errors": 0, "cache_hits": 0, "input": 300, "output": 50, "total": 350},
        {"role": "suggest", "key_alias": "suggest#aaaa", "calls": 1, "ok": 1, "errors": 0, "cache_hits": 0, "input": 100, "output": 20, "total": 120},
        {"role": "suggest", "key_alias": "suggest#bbbb", "calls": 2, "ok": 1, "errors": 1, "cache_hits": 0, "input": 100, "output": 20, "total": 120},
    ]
    assert [(r["round"], r["partition"], r["total"]) for r in led.usage.reconcile(["round", "partition"], sweep="run1")] == \
        [(0, "p1", 350), (1, "p1", 120), (2, "p1", 120)]
    with pytest.raises(ValueError, match="cannot group by secret"):
        led.usage.reconcile(["secret"])
    assert led.usage.export_jsonl(tmp_path / "u.jsonl", partition="p1") == 4
    lines = [json.loads(x) for x in (tmp_path / "u.jsonl").read_text().splitlines()]
    assert lines[0] == rec().model_dump()
    led.usage.export_usage_csv(tmp_path / "u.csv")
    with open(tmp_path / "u.csv") as f:
        assert [r["total_tokens"] for r in csv.DictReader(f)] == ["120", "0", "120", "350", "0", "120", "120"]
    assert led.usage.latest_sweep("p2") == "run2" and led.usage.latest_sweep("nothing") is None


def test_every_method_answers_exactly_like_sqlite(pg_db, tmp_path):
    """One script of calls on both backends; every answer must be equal (ordering under a linguistic collation included)."""
    _, url, linguistic = pg_db
    answers = []
    for led in (Ledger(tmp_path / "l.sqlite"), Ledger(url)):
        fill(led)
        b = Budget(max_input_tokens_per_round=1000, max_output_tokens_per_round=500, max_total_tokens=1500)
        r1 = led.usage.reserve(BudgetScope("s", "p1"), round=1, est_input=600, est_output=300, budget=b, role="suggest")
        led.usage.settle(r1, 400, 100)
        led.usage.settle(r1, 9, 9)  # a second settle changes nothing
        r2 = led.usage.reserve(BudgetScope("s", "p1"), round=2, est_input=100, est_output=100, budget=b)
        led.usage.settle(r2, 0, 0)
        led.usage.reserve(BudgetScope("s", "p1"), round=2, est_input=50, est_output=50, budget=b)  # stays in flight
        errs = []
        for kw in (dict(round=3, est_input=1001, est_output=1), dict(round=3, est_input=1, est_output=501),
                   dict(round=0, est_input=850, est_output=100), dict(round=3, est_input=900, est_output=100, record_refusal=False)):
            with pytest.raises(BudgetExceeded) as ei:
                led.usage.reserve(BudgetScope("s", "p1"), budget=b, role="report", **kw)
            errs.append((ei.value.reason, ei.value.scope, ei.value.round))
        led.cache.put("h1", model="m", role="suggest", content="[]", prompt_tokens=3, completion_tokens=4)
        led.cache.put("h1", model="m", role="suggest", content='[{"variant_id": "v1"}]', finish_reason="stop", request_id="r")
        cached = led.cache.get("h1")
        assert isinstance(cached.pop("ts"), float)
        rep = budget_report(led, b, led.usage.latest_sweep("p1"))
        answers.append({
            "rows": [r.model_dump() for r in led.usage.rows()],
            "reconcile": [led.usage.reconcile(g) for g in (["role", "key_alias"], ["model"], ["task"], ["key_alias", "round"], ["status", "run_id"])],
            "filtered": led.usage.reconcile(["model"], partition="p3", round=1),
            "spend": led.usage.spend("s"), "by_round": led.usage.spend_by_round("s"), "refusals": led.usage.refusals("s"), "errors": errs,
            "latest": [led.usage.latest_sweep(p) for p in ("p1", "p2", "p3", "none")],
            "cache": cached, "missing": led.cache.get("nope"),
            "report": (rep.sweep, rep.total, rep.passed, rep.table(), rep.markdown()),
        })
    sqlite_answers, pg_answers = answers
    for k in sqlite_answers:
        assert pg_answers[k] == sqlite_answers[k], k
    assert [r["model"] for r in pg_answers["reconcile"][1]] == ["Zeta", "alpha", "m1", "m2"]  # byte order, as in SQLite
    assert pg_answers["by_round"][2] == RoundRow(2, 50, 50, in_flight=1, refused=0, calls=2)
    assert len(pg_answers["refusals"]) == 3 and pg_answers["cache"]["content"] == '[{"variant_id": "v1"}]'
    if not linguistic:
        print("note: this server could not create an ICU en-US database; ordering was compared under the default collation")


def test_password_from_pgpassword_and_scheme_variants(pg_db, monkeypatch):
    server, url, _ = pg_db
    db = url.rsplit("/", 1)[1]
    monkeypatch.delenv("PGPASSWORD", raising=False)
    monkeypatch.setenv("PGPASSFILE", "/nonexistent")
    with pytest.raises(LedgerConnectionError, match="password") as ei:
        Ledger(server.url(db, password=None)).usage.rows()
    with pytest.raises(LedgerConnectionError) as ei:
        Ledger(server.url(db, password="wrong-Pw-42")).usage.rows()
    assert "wrong-Pw-42" not in str(ei.value) and f"{PG_USER}:***@127.0.0.1:{server.port}/{db}" in str(ei.value)
    monkeypatch.setenv("PGPASSWORD", PG_PASSWORD)
    led = Ledger(server.url(db, password=None))
    led.usage.record(rec(), sweep="x")
    psy = ledger_from_url(server.url(db, scheme="postgresql+psycopg"))
    assert psy.usage.rows() == [rec()]
    assert LedgerResource(url=server.url(db, password=None, scheme="postgres")).get_ledger().usage.rows() == [rec()]


def _reserver(url: str, sweeps: int, out, start=None) -> None:
    try:
        led = Ledger(url)
        led.usage.rows()  # connect before the race starts
        if start is not None:
            start.wait(60)  # every process starts racing at once
        budget = Budget(max_input_tokens_per_round=10**9, max_output_tokens_per_round=10**9, max_total_tokens=50)
        got = 0
        for s in range(sweeps):  # each sweep's last tokens are a fresh race between the processes
            for _ in range(7):
                try:
                    led.usage.reserve(BudgetScope(f"tight-{s}"), round=1, est_input=7, est_output=3, budget=budget, record_refusal=False)
                    got += 1
                except BudgetExceeded:
                    pass
        out.put(got)
    except Exception as e:  # noqa: BLE001 - report, do not hang the parent
        out.put(f"{type(e).__name__}: {e}")


def test_processes_racing_for_one_budget_never_overshoot(pg_db):
    """Six processes race for the last tokens of many 50-token budgets: exactly 5 reservations of 10 fit in each."""
    import psycopg

    _, url, _ = pg_db
    parent = Ledger(url)
    parent.usage.record(rec(), sweep="before-fork")  # the parent's connection exists before the fork
    sweeps, nproc = 60, 6
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    start = ctx.Barrier(nproc)
    procs = [ctx.Process(target=_reserver, args=(url, sweeps, q, start)) for _ in range(nproc)]
    for p in procs:
        p.start()
    results = [q.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    assert all(isinstance(r, int) for r in results), results
    assert sum(results) == 5 * sweeps
    with psycopg.connect(url) as con:
        per_sweep = con.execute("SELECT sweep, SUM(est_input + est_output), COUNT(*) FROM reservations "
                                "WHERE state = 'reserved' GROUP BY sweep").fetchall()
    assert len(per_sweep) == sweeps and all(total == 50 and n == 5 for _, total, n in per_sweep), per_sweep
    assert sum(1 for r in results if r) >= 2  # the processes really competed (not one process taking every sweep)
    parent.usage.record(rec(), sweep="after-fork")  # the children never touched the parent's connection
    assert [r.ts for r in parent.usage.rows()] == [rec().ts] * 2


def test_gateway_processes_share_one_postgres_budget(pg_db):
    from gateway_helpers import budget_race_worker, run_spawned

    from kregress.testing.fake_gateway import FakeOpenAI

    _, url, _ = pg_db
    total = 2_000
    with FakeOpenAI() as srv:
        srv.default.completion_tokens = 100
        srv.default.delay_s = 0.02
        results = run_spawned(budget_race_worker, [(srv.root, url, w, total) for w in range(4)])
        assert all(isinstance(r, tuple) for r in results), results
        led = Ledger(url)
        rows = led.usage.rows()
        spent = sum(r.total_tokens for r in rows)
        assert spent <= total and sum(r[1] for r in results) == len(srv.chat_requests()) == len(rows) >= 10
        assert spent > total - 2 * 140
        rep = budget_report(led, Budget(max_total_tokens=total), "shared")
        assert rep.total == spent and rep.passed


def test_token_assets_materialize_from_a_postgres_ledger(pg_db):
    import dagster as dg

    from kernel_assets.tokens import build_token_assets
    from kregress.core.spec import TaskSpec

    _, url, _ = pg_db

    @dg.asset(name="verdict_report", partitions_def=dg.StaticPartitionsDefinition(["p1"]))
    def fake_report(context):  # the sweep's calls, in its run's budget scope
        led = Ledger(url)
        scope = budget_scope(context.run_id, context.partition_key)
        r = led.usage.reserve(scope, round=1, est_input=100, est_output=50, budget=None, role="suggest")
        led.usage.settle(r, 100, 20)
        led.usage.record(rec(run_id=scope.run_id), sweep=scope.sweep, reservation_id=r.id)

    budget = Budget(max_input_tokens_per_round=90, max_output_tokens_per_round=90, max_total_tokens=90)
    spec = TaskSpec.model_construct(task_id="p1", kernel_family="gemm", shape_matrix=[{"M": 1}], correctness_shapes=[{"M": 1}],
                                    baseline={}, budget=budget)
    defs = build_token_assets(dg.StaticPartitionsDefinition(["p1"]), lambda key: spec, deps=["verdict_report"])
    result = dg.materialize([fake_report, *defs], partition_key="p1", resources={"ledger": LedgerResource(url=url)}, raise_on_error=True)
    meta = result.asset_materializations_for_node("token_usage")[0].metadata
    assert meta["total_tokens"].value == 120 and meta["calls"].value == 1 and meta["sweep"].value == result.run_id
    (ev,) = result.get_asset_check_evaluations()
    assert ev.check_name == "token_budget" and ev.passed is False
