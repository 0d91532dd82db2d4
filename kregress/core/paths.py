"""Every path kregress writes under DAGSTER_HOME, resolved one way (no Dagster import).

``home()`` is ``$DAGSTER_HOME`` when set, else ``<repo>/dagster_home`` (the folder shipped with the
project, which holds its dagster.yaml). The CLI sets DAGSTER_HOME before anything runs, so the ledger,
the compile cache, the reports and the history of one sweep always land in the same home, whatever the
current directory.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
HOME_ENV = "DAGSTER_HOME"


def home() -> Path:
    """The instance home: ``$DAGSTER_HOME``, else the project's own ``dagster_home/`` (absolute)."""
    env = os.environ.get(HOME_ENV, "").strip()
    return Path(env).expanduser().resolve() if env else (REPO_ROOT / "dagster_home")


def cache_dir() -> Path:
    """Compile and correctness cache (one JSON file per entry)."""
    return home() / "cache"


def reports_dir(task_id: str | None = None) -> Path:
    """``reports/`` or ``reports/<task_id>/``: report.md, the Parquet tables, the plots."""
    d = home() / "reports"
    return d / task_id if task_id else d


def history_dir() -> Path:
    """Append-only Parquet history of every sweep."""
    return home() / "kregress_history"


def ledger_path() -> Path:
    """The default SQLite token ledger."""
    return home() / "ledger.sqlite"


def review_dir() -> Path:
    """What ``kregress review`` remembers between runs (the last reviewed revision per task)."""
    return home() / "review"
