"""The Dagster internals that kernel_assets/pool_storage.py and pool_storage_postgres.py rely on, by name.

Both subclass Dagster's instance storage to make pool-slot claims atomic. Nothing public promises these
names, so every Dagster upgrade must re-check them: this test names each one and fails, naming the installed
Dagster version and what changed, when a Dagster renames, removes or re-signs one, adds a method that touches
the pool tables, or sets other attributes in the storages' constructors. The range they were checked against
is pinned in pyproject.toml and declared in the module (DAGSTER_CHECKED): the two must agree."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# module -> names the pool storages import from it
IMPORTS = {
    "dagster._core.storage.base_storage": ["DagsterStorage"],
    "dagster._core.storage.event_log.sqlite.sqlite_event_log": ["SqliteEventLogStorage"],
    "dagster._core.storage.event_log.sql_event_log": ["SqlEventLogStorage"],
    "dagster._core.storage.runs.sqlite.sqlite_run_storage": ["SqliteRunStorage"],
    "dagster._core.storage.schedules.sqlite.sqlite_schedule_storage": ["SqliteScheduleStorage"],
    "dagster._core.storage.sqlite_storage": ["DagsterSqliteStorage", "_event_logs_directory", "_runs_directory",
                                            "_schedule_directory"],
    "dagster._utils": ["mkdir_p"],
    "dagster_postgres.event_log": ["PostgresEventLogStorage"],
    "dagster_postgres.run_storage": ["PostgresRunStorage"],
    "dagster_postgres.schedule_storage": ["PostgresScheduleStorage"],
    "dagster_postgres.storage": ["DagsterPostgresStorage"],
    "dagster_postgres.utils": ["get_token_provider_from_config", "pg_url_from_config"],
}

# Every method of Dagster's SQL event log that touches the pool tables (claims, frees, the pending-step queue,
# limits), as checked: the public writers are SLOT_WRITERS (serialised); the private ones are called by them;
# the rest only read. A new one must be classified (a writer goes into SLOT_WRITERS) before this list grows.
POOL_METHODS = {
    "_allocate_concurrency_slots", "_claim_concurrency_slot", "_free_concurrency_slots",
    "_reconcile_concurrency_limits_from_slots", "_remove_pending_steps", "add_pending_step", "assign_pending_steps",
    "check_concurrency_claim", "claim_concurrency_slot", "delete_concurrency_limit", "free_concurrency_slot_for_step",
    "free_concurrency_slots_for_run", "get_concurrency_info", "get_concurrency_infos", "get_concurrency_keys",
    "get_concurrency_run_ids", "get_pool_config", "get_pool_limits", "has_pending_step", "has_unassigned_slots",
    "initialize_concurrency_limit_to_default", "set_concurrency_slots",
}
POOL_PATTERN = re.compile(r"concurrency|slot|pending_step|pool")

# constructor -> its parameters, as the subclasses call them
SIGNATURES = {
    ("dagster._core.storage.sqlite_storage", "DagsterSqliteStorage", "__init__"): ["self", "base_dir", "inst_data"],
    ("dagster._core.storage.event_log.sqlite.sqlite_event_log", "SqliteEventLogStorage", "__init__"):
        ["self", "base_dir", "inst_data"],
    ("dagster_postgres.storage", "DagsterPostgresStorage", "__init__"):
        ["self", "postgres_url", "should_autocreate_tables", "inst_data", "token_provider"],
    ("dagster_postgres.event_log", "PostgresEventLogStorage", "__init__"):
        ["self", "postgres_url", "should_autocreate_tables", "inst_data", "token_provider"],
    ("dagster_postgres.run_storage", "PostgresRunStorage", "__init__"):
        ["self", "postgres_url", "should_autocreate_tables", "inst_data", "token_provider"],
    ("dagster_postgres.schedule_storage", "PostgresScheduleStorage", "__init__"):
        ["self", "postgres_url", "should_autocreate_tables", "inst_data", "token_provider"],
}

# the attributes each parent constructor sets, which the subclasses' own constructors set in its place
INIT_ATTRIBUTES = {
    ("dagster._core.storage.sqlite_storage", "DagsterSqliteStorage"):
        {"base_dir", "_run_storage", "_event_log_storage", "_schedule_storage", "_inst_data"},
    ("dagster_postgres.storage", "DagsterPostgresStorage"):
        {"postgres_url", "should_autocreate_tables", "_inst_data", "_run_storage", "_event_log_storage",
         "_schedule_storage"},
}


def versions() -> str:
    from importlib.metadata import version

    return f"dagster {version('dagster')}, dagster-postgres {version('dagster-postgres')}"


def where() -> str:
    return (f"on {versions()}; kernel_assets/pool_storage*.py were checked against dagster "
            f"{_module().DAGSTER_CHECKED}: re-check them against this Dagster, then update this test and the pins")


def _module():
    return importlib.import_module("kernel_assets.pool_storage")


def _attr(module: str, name: str):
    return getattr(importlib.import_module(module), name)


def test_every_imported_internal_exists():
    missing = []
    for module, names in IMPORTS.items():
        try:
            mod = importlib.import_module(module)
        except ImportError as exc:
            missing.append(f"{module} ({exc})")
            continue
        missing += [f"{module}.{n}" for n in names if not hasattr(mod, n)]
    assert not missing, f"Dagster internals the pool storages import are gone {where()}: {', '.join(missing)}"


def test_the_modules_import_exactly_the_names_this_test_checks():
    """A new import from a Dagster internal must be named here (so it is checked on the next upgrade)."""
    found: dict[str, set[str]] = {}
    for path in ("kernel_assets/pool_storage.py", "kernel_assets/pool_storage_postgres.py"):
        for node in ast.walk(ast.parse((REPO / path).read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("dagster"):
                found.setdefault(node.module, set()).update(a.name for a in node.names)
    checked = {m: set(n) - {"SqlEventLogStorage"} for m, n in IMPORTS.items()}
    checked = {m: n for m, n in checked.items() if n}
    assert found == checked, f"the pool storages' Dagster imports changed: add them to IMPORTS here ({found})"


@pytest.mark.parametrize("key", sorted(SIGNATURES), ids=lambda k: f"{k[1]}.{k[2]}")
def test_constructor_signatures(key):
    module, cls, method = key
    params = list(inspect.signature(getattr(_attr(module, cls), method)).parameters)
    assert params == SIGNATURES[key], f"{cls}.{method} takes {params}, not {SIGNATURES[key]} {where()}"


@pytest.mark.parametrize("key", sorted(INIT_ATTRIBUTES), ids=lambda k: k[1])
def test_parent_constructors_set_the_attributes_the_subclasses_set(key):
    """PoolSafe*Storage.__init__ replace their parent's: a parent that sets another attribute would leave it unset."""
    module, cls = key
    src = textwrap.dedent(inspect.getsource(_attr(module, cls).__init__))
    got = {t.attr for node in ast.walk(ast.parse(src)) if isinstance(node, ast.Assign) for t in node.targets
           if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"}
    assert got == INIT_ATTRIBUTES[key], f"{cls}.__init__ sets {sorted(got)}, not {sorted(INIT_ATTRIBUTES[key])} {where()}"


def test_the_postgres_event_log_keeps_its_engine():
    """The advisory lock takes its own connection from ``self._engine``."""
    src = inspect.getsource(_attr("dagster_postgres.event_log", "PostgresEventLogStorage").__init__)
    assert "self._engine =" in src, f"PostgresEventLogStorage.__init__ no longer sets self._engine {where()}"


@pytest.mark.parametrize("module,cls", [("dagster._core.storage.event_log.sqlite.sqlite_event_log", "SqliteEventLogStorage"),
                                        ("dagster_postgres.event_log", "PostgresEventLogStorage")])
def test_pool_methods_are_the_checked_ones(module, cls):
    base = _attr(module, cls)
    got = {n for n in dir(base) if POOL_PATTERN.search(n) and callable(getattr(base, n))}
    writers = set(_module().SLOT_WRITERS)
    assert writers <= got, f"{cls} lacks the slot writers {sorted(writers - got)} {where()}"
    assert got == POOL_METHODS, (f"{cls}'s pool methods changed {where()}: new {sorted(got - POOL_METHODS)}, gone "
                                 f"{sorted(POOL_METHODS - got)} (a new writer goes into SLOT_WRITERS)")


def test_the_subclasses_serialise_every_slot_writer():
    from kernel_assets.pool_storage import SLOT_WRITERS, PoolSafeSqliteEventLogStorage

    for name in SLOT_WRITERS:
        assert getattr(PoolSafeSqliteEventLogStorage, name).__qualname__ == f"PoolSafeSqliteEventLogStorage.{name}"
    pg = pytest.importorskip("kernel_assets.pool_storage_postgres")
    for name in SLOT_WRITERS:
        assert getattr(pg.PoolSafePostgresEventLogStorage, name).__qualname__ == f"PoolSafePostgresEventLogStorage.{name}"


def test_the_sqlite_storage_builds_with_dagsters_storages(tmp_path):
    """Built as dagster.yaml builds it: the same attributes as Dagster's own storage, our event log in place."""
    from dagster._core.storage.sqlite_storage import DagsterSqliteStorage

    from kernel_assets.pool_storage import PoolSafeSqliteEventLogStorage, PoolSafeSqliteStorage

    ours = PoolSafeSqliteStorage.from_local(str(tmp_path / "ours"))
    theirs = DagsterSqliteStorage.from_local(str(tmp_path / "theirs"))
    assert set(vars(ours)) == set(vars(theirs)), f"{sorted(set(vars(theirs)) ^ set(vars(ours)))} {where()}"
    assert isinstance(ours.event_log_storage, PoolSafeSqliteEventLogStorage)
    assert type(ours.run_storage) is type(theirs.run_storage)
    assert type(ours.schedule_storage) is type(theirs.schedule_storage)


def test_pyproject_pins_the_checked_range_and_this_dagster_is_in_it():
    from importlib.metadata import version

    from packaging.specifiers import SpecifierSet

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    mod = _module()
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    reqs = project["dependencies"] + project["optional-dependencies"]["deploy"] + project["optional-dependencies"]["test"]
    pins = {m.group(1): m.group(2) for r in reqs if (m := re.fullmatch(r"(dagster|dagster-postgres)([<>=!~,.\d]+)", r))}
    assert pins.get("dagster") == mod.DAGSTER_CHECKED, (f"pyproject pins dagster{pins.get('dagster')}; the pool storage was "
                                                         f"checked against {mod.DAGSTER_CHECKED} (kernel_assets/pool_storage.py)")
    assert pins.get("dagster-postgres") == mod.DAGSTER_POSTGRES_CHECKED, pins
    assert version("dagster") in SpecifierSet(mod.DAGSTER_CHECKED), where()
    assert version("dagster-postgres") in SpecifierSet(mod.DAGSTER_POSTGRES_CHECKED), where()
