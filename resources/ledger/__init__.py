"""The token ledger: three stores over one database engine, split by concern.

- ``ledger.usage`` (``UsageStore``, usage.py): one row per model-call attempt, written before it is sent, and
  the budget reservations (atomic across processes; the rule is ``kregress.core.budget``).
- ``ledger.cooldowns`` (``CooldownStore``, cooldowns.py): key aliases resting after a rate limit or a rejection,
  shared by every process on the ledger.
- ``ledger.cache`` (``ResponseCache``, cache.py): model answers by request hash.

``Ledger(path_or_url)`` opens a SQLite file (default ``$DAGSTER_HOME/ledger.sqlite``) or a PostgreSQL database
(``postgresql://`` / ``postgresql+psycopg://``); engine.py holds the schema, the URLs and the connections.
``LedgerResource`` is where the ledger lives, as a Dagster resource.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import Field

from resources.ledger.cache import CACHE_ALIAS, ResponseCache
from resources.ledger.cooldowns import CooldownStore, new_owner
from resources.ledger.engine import (
    METADATA,
    Engine,
    LedgerConfigError,
    LedgerConnectionError,
    LedgerWriteError,
    default_ledger_path,
    is_postgres_url,
    ledger_error_line,
    mask_url,
    postgres_url,
    sqlite_path_from_url,
)
from resources.ledger.usage import (
    GROUPABLE,
    INTERRUPTED,
    RECONCILE_COLUMNS,
    SENT,
    USAGE_FIELDS,
    BudgetExceeded,
    Recovered,
    Reservation,
    RoundRow,
    UsageStore,
)


class Ledger:
    """One ledger database and its three stores: ``usage`` (attempts and budgets), ``cooldowns``, ``cache``."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.engine = Engine(path)
        self.usage = UsageStore(self.engine)
        self.cooldowns = CooldownStore(self.engine)
        self.cache = ResponseCache(self.engine)

    @property
    def path(self) -> Path | None:
        return self.engine.path

    @property
    def location(self) -> str:
        return self.engine.location

    @property
    def backend(self) -> str:
        return self.engine.backend

    def close(self) -> None:
        self.engine.close()

    def __repr__(self) -> str:
        return f"Ledger({self.location!r})"

    def __getstate__(self) -> dict[str, Any]:  # a ledger travels to child processes as its location only
        return {"engine": self.engine}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.engine = state["engine"]
        self.usage = UsageStore(self.engine)
        self.cooldowns = CooldownStore(self.engine)
        self.cache = ResponseCache(self.engine)


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


__all__ = [
    "Ledger", "LedgerResource", "ledger_from_url", "Engine", "UsageStore", "CooldownStore", "ResponseCache",
    "BudgetExceeded", "Reservation", "Recovered", "RoundRow", "LedgerConfigError", "LedgerConnectionError", "LedgerWriteError",
    "CACHE_ALIAS", "GROUPABLE", "RECONCILE_COLUMNS", "USAGE_FIELDS", "SENT", "INTERRUPTED", "METADATA",
    "default_ledger_path", "is_postgres_url", "ledger_error_line", "mask_url", "postgres_url", "sqlite_path_from_url", "new_owner",
]
