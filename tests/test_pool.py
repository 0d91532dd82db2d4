"""The device pool: two runs launched together never benchmark on one device at the same time.

Two processes materialize `baseline_metrics` (a real compile + interpreter check, a few seconds each)
for two specs against one DAGSTER_HOME whose dagster.yaml gives pools a limit of 1. The step
intervals read back from the event log must not overlap, and the second run must have waited.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
from pathlib import Path

import dagster as dg
import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent


def _run(home: str, spec_file: str, task_id: str, out: str) -> None:
    os.environ["DAGSTER_HOME"] = home
    os.environ["KREGRESS_SPEC_FILES"] = spec_file
    from kernel_assets.assets import baseline_metrics
    from kernel_assets.definitions import build_resources

    instance = dg.DagsterInstance.get()
    res = dg.materialize([baseline_metrics], partition_key=task_id, instance=instance, resources=build_resources("local"))
    Path(out).write_text(res.run_id if res.success else "FAILED")


def test_two_runs_never_benchmark_together(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    shutil.copy(REPO / "dagster_home" / "dagster.yaml", home)
    base = yaml.safe_load((REPO / "specs" / "gemm_smoke.yaml").read_text())
    files = []
    for i, cfg in enumerate([dict(BLOCK_M=32, BLOCK_N=64, BLOCK_K=32, GROUP_M=4, num_stages=2, num_warps=4),
                             dict(BLOCK_M=64, BLOCK_N=32, BLOCK_K=32, GROUP_M=8, num_stages=2, num_warps=4)]):
        spec = dict(base, task_id=f"pool_{i}", baseline=cfg)
        p = tmp_path / f"pool_{i}.yaml"
        p.write_text(yaml.safe_dump(spec))
        files.append(p)
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    instance = dg.DagsterInstance.get()
    instance.add_dynamic_partitions("specs", ["pool_0", "pool_1"])
    # Plain processes, each exiting on its own (Dagster handles SIGTERM in a run worker, so a Pool's
    # terminate() would wait on it).
    ctx = mp.get_context("spawn")
    outs = [tmp_path / f"run_{i}.txt" for i in range(2)]
    procs = [ctx.Process(target=_run, args=(str(home), str(f), f"pool_{i}", str(outs[i]))) for i, f in enumerate(files)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=600)
        if p.is_alive():
            p.kill()
    run_ids = [o.read_text() for o in outs]
    assert "FAILED" not in run_ids

    intervals = []
    for rid in run_ids:
        logs = instance.all_logs(rid)
        start = [e.timestamp for e in logs if e.dagster_event and e.dagster_event.event_type_value == "STEP_START"]
        end = [e.timestamp for e in logs if e.dagster_event and e.dagster_event.event_type_value == "STEP_SUCCESS"]
        intervals.append((start[0], end[0]))
    (a0, a1), (b0, b1) = sorted(intervals)
    assert a1 - a0 > 1.0 and b1 - b0 > 1.0  # both really benchmarked something
    assert a1 <= b0, f"baseline steps overlapped: {intervals}"
    from kernel_assets.assets import BENCH_POOL  # the pool of this host's device: what both processes took

    assert instance.event_log_storage.get_concurrency_info(BENCH_POOL).slot_count == 1


def _claim(home: str, barrier, i: int, q) -> None:
    os.environ["DAGSTER_HOME"] = home
    instance = dg.DagsterInstance.get()
    barrier.wait()
    q.put((i, instance.event_log_storage.claim_concurrency_slot("gpu/race/cpu", f"run_{i}", "baseline_metrics").is_claimed))


def _race(ctx, storage, n: int, trial: int, target, args: tuple) -> list[int]:
    """``n`` processes run ``target(*args, barrier, i, q)`` (a claim of the limit-1 pool at one barrier):
    exactly one may hold the slot, the others wait in the queue. Returns the winners."""
    barrier, q = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args, barrier, i, q)) for i in range(n)]
    for p in procs:
        p.start()
    got = dict(q.get(timeout=300) for _ in range(n))
    for p in procs:
        p.join(timeout=60)
    winners = [i for i, claimed in got.items() if claimed]
    assert len(winners) == 1, f"trial {trial}: {len(winners)} processes hold the one slot: {winners}"
    info = storage.get_concurrency_info("gpu/race/cpu")
    assert info.slot_count == 1 and len(info.claimed_slots) == 1 and len(info.pending_steps) == n
    return winners


def test_claims_at_the_same_instant_take_one_slot(tmp_path, monkeypatch):
    """Dagster's SQLite storage lets processes that claim a limit-1 pool at one instant all take its slot
    (measured: 2-4 of 4 on 3 of 6 tries); the shipped instance's storage (kernel_assets/pool_storage.py)
    serialises the claim, so exactly one process holds the slot and the rest wait in the queue, and freeing
    it hands it to exactly one of them."""
    from kernel_assets.pool_storage import PoolSafeSqliteEventLogStorage

    ctx = mp.get_context("spawn")
    n = 6
    for trial in range(3):
        home = tmp_path / f"home_{trial}"
        home.mkdir()
        shutil.copy(REPO / "dagster_home" / "dagster.yaml", home)
        monkeypatch.setenv("DAGSTER_HOME", str(home))
        instance = dg.DagsterInstance.get()
        storage = instance.event_log_storage
        assert isinstance(storage, PoolSafeSqliteEventLogStorage)
        storage.initialize_concurrency_limit_to_default("gpu/race/cpu")
        winners = _race(ctx, storage, n, trial, _claim, (str(home),))
        storage.free_concurrency_slot_for_step(f"run_{winners[0]}", "baseline_metrics")
        assigned = [s for s in storage.get_concurrency_info("gpu/race/cpu").pending_steps if s.assigned_timestamp]
        assert len(assigned) == 1 and assigned[0].run_id != f"run_{winners[0]}"
        instance.dispose()


def _claim_pg(home: str, env: dict, barrier, i: int, q) -> None:
    os.environ.update(env)
    _claim(home, barrier, i, q)


def test_postgres_claims_at_the_same_instant_take_one_slot(tmp_path, monkeypatch):
    """The same on deploy/dagster.yaml's storage (kernel_assets/pool_storage_postgres.py) against a throwaway
    PostgreSQL 15: Dagster's own PostgreSQL storage let more than one of six simultaneous claims hold a limit-1
    slot in 3 of 8 tries; under the advisory lock exactly one of eight does, every time."""
    from urllib.parse import urlparse

    from kregress.testing.postgres import PgServer, pg_bin_dir

    required = os.environ.get("KREGRESS_REQUIRE_POSTGRES", "") not in ("", "0")
    psycopg = pytest.importorskip("psycopg") if not required else __import__("psycopg")
    pytest.importorskip("dagster_postgres") if not required else __import__("dagster_postgres")
    bindir = pg_bin_dir()
    if bindir is None:
        if required:
            pytest.fail("PostgreSQL required (KREGRESS_REQUIRE_POSTGRES=1) but its server binaries are not found")
        pytest.skip("PostgreSQL server binaries (initdb, pg_ctl, postgres) not found")
    from kernel_assets.pool_storage_postgres import PoolSafePostgresEventLogStorage

    server = PgServer(bindir)
    server.start()
    try:
        ctx = mp.get_context("spawn")
        n = 8
        for trial in range(4):
            name = f"pool_{trial}"
            with psycopg.connect(server.url("postgres"), autocommit=True) as con:
                con.execute(f"CREATE DATABASE {name}")
            u = urlparse(server.url(name))
            env = {"DAGSTER_PG_HOST": u.hostname, "DAGSTER_PG_PORT": str(u.port), "DAGSTER_PG_USER": u.username,
                   "DAGSTER_PG_PASSWORD": u.password or "", "DAGSTER_PG_DB": name}
            for k, v in env.items():
                monkeypatch.setenv(k, v)
            home = tmp_path / f"home_{trial}"
            home.mkdir()
            shutil.copy(REPO / "deploy" / "dagster.yaml", home)
            monkeypatch.setenv("DAGSTER_HOME", str(home))
            instance = dg.DagsterInstance.get()
            storage = instance.event_log_storage
            assert isinstance(storage, PoolSafePostgresEventLogStorage)
            storage.set_concurrency_slots("gpu/race/cpu", 1)
            _race(ctx, storage, n, trial, _claim_pg, (str(home), env))
            instance.dispose()
    finally:
        server.stop()
