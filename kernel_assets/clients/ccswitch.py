"""CC Switch: the TaoToken provider for its Claude Code and Codex apps.

CC Switch 3.x keeps providers in SQLite, ``~/.cc-switch/cc-switch.db``, table ``providers`` (primary key
``(id, app_type)``; ``app_type`` is ``claude`` or ``codex``; ``settings_config`` is JSON text: the Claude
``settings.json`` object, or ``{"auth": {...}, "config": "<config.toml>"}`` for Codex; ``is_current`` marks
the active provider per app; ``created_at`` is milliseconds). Its old ``config.json`` (version 2) is read
only once, as a migration, on a fresh install. Read from CC Switch 3.20.0 (farion1231/cc-switch commit
5ca9459d, ``src-tauri/src/database/schema.rs``, ``backup.rs``, ``deeplink/parser.rs``).

Formats written here:

- ``cc-switch-sql`` (default): a file CC Switch's own import (Settings, import SQL backup) accepts: it starts
  with CC Switch's export header, creates the tables that import checks for (schema version 17) and holds
  the two provider rows. CC Switch's import REPLACES its whole database (after saving a backup), so use it
  on a fresh CC Switch; an older CC Switch refuses it (schema too new) without touching anything.
- ``cc-switch-merge-sql``: only an upsert of the two rows, to add them to an existing database with
  ``sqlite3 ~/.cc-switch/cc-switch.db < file.sql`` while CC Switch is closed (other providers kept).
- ``cc-switch-deeplink``: ``ccswitch://v1/import?resource=provider&app=...`` links, one per app (additive;
  CC Switch refuses a provider without an API key there, so this needs ``--include-key``).
- ``cc-switch-json``: the pre-3.0 ``config.json`` (v2) store document.

No key is written unless ``include_key`` is asked for; then it comes from the environment.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Mapping
from urllib.parse import urlencode, urlsplit

from kernel_assets.clients.common import PROVIDER_ID, PROVIDER_NAME
from kernel_assets.clients.export import ExportError, ExportOptions, claude_settings, export_codex, literal_key, resolve

FORMATS = ("cc-switch-sql", "cc-switch-merge-sql", "cc-switch-deeplink", "cc-switch-json")
DEFAULT_FILENAMES = {
    "cc-switch-sql": "taotoken.ccswitch.sql",
    "cc-switch-merge-sql": "taotoken.ccswitch-merge.sql",
    "cc-switch-deeplink": "",
    "cc-switch-json": "config.json",
}
# The first line CC Switch's SQL import requires (backup.rs CC_SWITCH_SQL_EXPORT_HEADER).
SQL_HEADER = "-- CC Switch SQLite 导出"
SCHEMA_VERSION = 17  # CC Switch 3.20.0 (src-tauri/src/database/mod.rs SCHEMA_VERSION)
PROVIDER_COLUMNS = ("id", "app_type", "name", "settings_config", "website_url", "category", "created_at", "sort_index",
                    "notes", "icon", "icon_color", "meta", "is_current", "in_failover_queue")
# The tables CC Switch's import requires before it accepts a file (backup.rs validate_imported_schema), as
# its create_tables_on_conn creates them at schema 17; it creates every other table itself after import.
REQUIRED_TABLES_DDL = (
    "CREATE TABLE IF NOT EXISTS providers (id TEXT NOT NULL, app_type TEXT NOT NULL, name TEXT NOT NULL, "
    "settings_config TEXT NOT NULL, website_url TEXT, category TEXT, created_at INTEGER, sort_index INTEGER, notes TEXT, "
    "icon TEXT, icon_color TEXT, meta TEXT NOT NULL DEFAULT '{}', is_current BOOLEAN NOT NULL DEFAULT 0, "
    "in_failover_queue BOOLEAN NOT NULL DEFAULT 0, PRIMARY KEY (id, app_type))",
    "CREATE TABLE IF NOT EXISTS provider_endpoints (id INTEGER PRIMARY KEY AUTOINCREMENT, provider_id TEXT NOT NULL, "
    "app_type TEXT NOT NULL, url TEXT NOT NULL, added_at INTEGER, "
    "FOREIGN KEY (provider_id, app_type) REFERENCES providers(id, app_type) ON DELETE CASCADE)",
    "CREATE TABLE IF NOT EXISTS mcp_servers (id TEXT PRIMARY KEY, name TEXT NOT NULL, server_config TEXT NOT NULL, "
    "description TEXT, homepage TEXT, docs TEXT, tags TEXT NOT NULL DEFAULT '[]', enabled_claude BOOLEAN NOT NULL DEFAULT 0, "
    "enabled_codex BOOLEAN NOT NULL DEFAULT 0, enabled_gemini BOOLEAN NOT NULL DEFAULT 0, "
    "enabled_grokbuild BOOLEAN NOT NULL DEFAULT 0, enabled_opencode BOOLEAN NOT NULL DEFAULT 0, "
    "enabled_hermes BOOLEAN NOT NULL DEFAULT 0)",
    "CREATE TABLE IF NOT EXISTS prompts (id TEXT NOT NULL, app_type TEXT NOT NULL, name TEXT NOT NULL, content TEXT NOT NULL, "
    "description TEXT, enabled BOOLEAN NOT NULL DEFAULT 1, created_at INTEGER, updated_at INTEGER, PRIMARY KEY (id, app_type))",
    "CREATE TABLE IF NOT EXISTS skills (id TEXT PRIMARY KEY, name TEXT NOT NULL, description TEXT, directory TEXT NOT NULL, "
    "repo_owner TEXT, repo_name TEXT, repo_branch TEXT DEFAULT 'main', readme_url TEXT, "
    "enabled_claude BOOLEAN NOT NULL DEFAULT 0, enabled_codex BOOLEAN NOT NULL DEFAULT 0, "
    "enabled_gemini BOOLEAN NOT NULL DEFAULT 0, enabled_grokbuild BOOLEAN NOT NULL DEFAULT 0, "
    "enabled_opencode BOOLEAN NOT NULL DEFAULT 0, enabled_hermes BOOLEAN NOT NULL DEFAULT 0, "
    "installed_at INTEGER NOT NULL DEFAULT 0, content_hash TEXT, updated_at INTEGER NOT NULL DEFAULT 0)",
    "CREATE TABLE IF NOT EXISTS skill_repos (owner TEXT NOT NULL, name TEXT NOT NULL, branch TEXT NOT NULL DEFAULT 'main', "
    "enabled BOOLEAN NOT NULL DEFAULT 1, PRIMARY KEY (owner, name))",
    "CREATE TABLE IF NOT EXISTS settings (key TEXT PRIMARY KEY, value TEXT)",
)


def _website(root: str) -> str:
    p = urlsplit(root)
    return f"{p.scheme}://{p.netloc}"


def providers(opts: ExportOptions, environ: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """app_type -> the provider's fields (settings_config as an object) for CC Switch's claude and codex apps."""
    root, sdk, model = resolve(opts, environ)
    claude = claude_settings(opts, environ)
    claude.pop("$schema", None)
    codex_opts = ExportOptions(**{**opts.__dict__, "notes": []})
    codex_toml = export_codex(codex_opts, environ)
    auth: dict[str, str] = {}
    if opts.include_key:  # already in the TOML as experimental_bearer_token; CC Switch writes auth.json as well
        auth["OPENAI_API_KEY"] = literal_key(opts, environ)
    opts.notes += [n for n in codex_opts.notes if n not in opts.notes]
    note = f"written by kregress export-config; gateway {root}; role {opts.role}"
    common = {"id": PROVIDER_ID, "name": PROVIDER_NAME, "website_url": _website(root), "category": "third_party", "notes": note}
    return {
        "claude": {**common, "settings_config": claude, "endpoint": root, "model": model},
        "codex": {**common, "settings_config": {"auth": auth, "config": codex_toml}, "endpoint": sdk, "model": model},
    }


def _sql_value(v: Any) -> str:
    if v is None:
        return "NULL"
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, int):
        return str(v)
    return "'" + str(v).replace("'", "''") + "'"


def _rows(opts: ExportOptions, environ: Mapping[str, str], *, current: bool) -> list[str]:
    now_ms = int(time.time() * 1000)
    out = []
    for app, p in providers(opts, environ).items():
        row = {"id": p["id"], "app_type": app, "name": p["name"], "settings_config": json.dumps(p["settings_config"], ensure_ascii=False),
               "website_url": p["website_url"], "category": p["category"], "created_at": now_ms, "sort_index": None,
               "notes": p["notes"], "icon": None, "icon_color": None, "meta": "{}", "is_current": current, "in_failover_queue": False}
        out.append(f"({', '.join(_sql_value(row[c]) for c in PROVIDER_COLUMNS)})")
    return out


def export_sql(opts: ExportOptions, environ: Mapping[str, str] | None = None) -> str:
    """A file CC Switch's SQL import accepts: header, the required tables, the two providers (current)."""
    env_map = dict(os.environ if environ is None else environ)
    rows = _rows(opts, env_map, current=True)
    opts.notes.append(
        "import it in CC Switch (Settings, import SQL backup) on a fresh CC Switch: its import REPLACES CC Switch's whole "
        "database (it saves a backup first); to add TaoToken to an existing CC Switch use --format cc-switch-merge-sql. "
        f"Made for CC Switch 3.20+ (database schema {SCHEMA_VERSION}); an older CC Switch refuses it without changing anything"
    )
    lines = [
        SQL_HEADER,
        "-- Written by `kregress export-config --tool cc-switch`: the TaoToken provider for Claude Code and Codex.",
        f"-- user_version: {SCHEMA_VERSION}",
        "PRAGMA foreign_keys=OFF;",
        f"PRAGMA user_version={SCHEMA_VERSION};",
        "BEGIN TRANSACTION;",
        *[ddl + ";" for ddl in REQUIRED_TABLES_DDL],
        f"INSERT OR REPLACE INTO providers ({', '.join(PROVIDER_COLUMNS)}) VALUES\n  " + ",\n  ".join(rows) + ";",
        "COMMIT;",
    ]
    return "\n".join(lines) + "\n"


def export_merge_sql(opts: ExportOptions, environ: Mapping[str, str] | None = None) -> str:
    """An upsert of the two providers into an existing CC Switch database (run with sqlite3, CC Switch closed)."""
    env_map = dict(os.environ if environ is None else environ)
    rows = _rows(opts, env_map, current=False)
    keep = ("name", "settings_config", "website_url", "category", "notes")
    opts.notes.append("quit CC Switch, then: sqlite3 ~/.cc-switch/cc-switch.db < FILE; your other providers are kept; "
                      "select TaoToken in CC Switch to make it current")
    lines = [
        "-- The TaoToken provider for CC Switch's Claude Code and Codex apps, written by `kregress export-config`.",
        "-- Quit CC Switch, then: sqlite3 ~/.cc-switch/cc-switch.db < THIS_FILE   (other providers are kept)",
        "BEGIN TRANSACTION;",
        f"INSERT INTO providers ({', '.join(PROVIDER_COLUMNS)}) VALUES\n  " + ",\n  ".join(rows)
        + "\nON CONFLICT (id, app_type) DO UPDATE SET " + ", ".join(f"{c} = excluded.{c}" for c in keep) + ";",
        "COMMIT;",
    ]
    return "\n".join(lines) + "\n"


def export_deeplink(opts: ExportOptions, environ: Mapping[str, str] | None = None) -> str:
    """``ccswitch://v1/import`` links, one per app (CC Switch's deeplink import requires the key)."""
    env_map = dict(os.environ if environ is None else environ)
    if not opts.include_key:
        raise ExportError("CC Switch's deeplink import refuses a provider without an API key: pass --include-key (the link then holds "
                          "the key: open it, never paste it into a chat or ticket), or use --format cc-switch-sql")
    provs = providers(opts, env_map)
    key = literal_key(opts, env_map, "each link")
    out = []
    for app, p in provs.items():
        q = {"resource": "provider", "app": app, "name": p["name"], "homepage": p["website_url"], "endpoint": p["endpoint"],
             "apiKey": key, **({"model": p["model"]} if p["model"] else {}), "notes": p["notes"]}
        out.append("ccswitch://v1/import?" + urlencode(q))
    return "\n".join(out) + "\n"


def export_json(opts: ExportOptions, environ: Mapping[str, str] | None = None) -> str:
    """The pre-3.0 CC Switch store document (``~/.cc-switch/config.json``, version 2)."""
    env_map = dict(os.environ if environ is None else environ)
    provs = providers(opts, env_map)
    opts.notes.append("this is CC Switch's pre-3.0 config.json; CC Switch 3.x reads it only once, on a fresh install with no "
                      "cc-switch.db: for 3.x use the default --format cc-switch-sql")

    def provider(p: dict[str, Any]) -> dict[str, Any]:
        return {"id": p["id"], "name": p["name"], "settingsConfig": p["settings_config"], "websiteUrl": p["website_url"],
                "category": p["category"], "notes": p["notes"]}

    doc = {"version": 2, **{app: {"providers": {PROVIDER_ID: provider(p)}, "current": PROVIDER_ID} for app, p in provs.items()}}
    return json.dumps(doc, indent=2) + "\n"


EXPORTERS = {"cc-switch-sql": export_sql, "cc-switch-merge-sql": export_merge_sql, "cc-switch-deeplink": export_deeplink,
             "cc-switch-json": export_json}
