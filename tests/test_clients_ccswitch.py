"""CC Switch 3.x export: the .sql CC Switch's import accepts, the merge file, the deeplink, and linting its db.

The database below is created with CC Switch's own schema, written out from its source (farion1231/cc-switch
commit 5ca9459d50ea4beea6a81bbc509de6ec5b6b09ca, CC Switch 3.20.0, src-tauri/src/database/schema.rs
``create_tables_on_conn``; the import rules from src-tauri/src/database/backup.rs ``import_sql_string_inner``:
the export header, the temporary database, the authorizer allowing only the foreign_keys/user_version pragmas
and no ATTACH, the transaction must be closed, the required tables, and user_version no newer than 17).
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
import tomllib

from kernel_assets.clients.ccswitch import export_deeplink, export_merge_sql, export_sql
from kernel_assets.clients.export import ExportError, ExportOptions
from kernel_assets.clients.lint import lint_file, lint_text

KEY = "sk" "-CCSCANARY-review-0123456789abcdef"
ENV = {"TAOTOKEN_KEY_REVIEW": KEY, "TAOTOKEN_MODEL_ID": "kregress-test-model", "TAOTOKEN_BASE_URL": "https://taotoken.net/api"}

# CC Switch 3.20.0 schema (commit 5ca9459d, src-tauri/src/database/schema.rs), the tables a fresh install has
# that its SQL import checks for, plus proxy_config as one of the tables it creates itself.
CC_SWITCH_SCHEMA = """
CREATE TABLE providers (id TEXT NOT NULL, app_type TEXT NOT NULL, name TEXT NOT NULL, settings_config TEXT NOT NULL,
  website_url TEXT, category TEXT, created_at INTEGER, sort_index INTEGER, notes TEXT, icon TEXT, icon_color TEXT,
  meta TEXT NOT NULL DEFAULT '{}', is_current BOOLEAN NOT NULL DEFAULT 0, in_failover_queue BOOLEAN NOT NULL DEFAULT 0,
  PRIMARY KEY (id, app_type));
CREATE TABLE provider_endpoints (id INTEGER PRIMARY KEY AUTOINCREMENT, provider_id TEXT NOT NULL, app_type TEXT NOT NULL,
  url TEXT NOT NULL, added_at INTEGER, FOREIGN KEY (provider_id, app_type) REFERENCES providers(id, app_type) ON DELETE CASCADE);
CREATE TABLE mcp_servers (id TEXT PRIMARY KEY, name TEXT NOT NULL, server_config TEXT NOT NULL, description TEXT, homepage TEXT,
  docs TEXT, tags TEXT NOT NULL DEFAULT '[]', enabled_claude BOOLEAN NOT NULL DEFAULT 0, enabled_codex BOOLEAN NOT NULL DEFAULT 0,
  enabled_gemini BOOLEAN NOT NULL DEFAULT 0, enabled_grokbuild BOOLEAN NOT NULL DEFAULT 0, enabled_opencode BOOLEAN NOT NULL DEFAULT 0,
  enabled_hermes BOOLEAN NOT NULL DEFAULT 0);
CREATE TABLE prompts (id TEXT NOT NULL, app_type TEXT NOT NULL, name TEXT NOT NULL, content TEXT NOT NULL, description TEXT,
  enabled BOOLEAN NOT NULL DEFAULT 1, created_at INTEGER, updated_at INTEGER, PRIMARY KEY (id, app_type));
CREATE TABLE skills (id TEXT PRIMARY KEY, name TEXT NOT NULL, description TEXT, directory TEXT NOT NULL, repo_owner TEXT,
  repo_name TEXT, repo_branch TEXT DEFAULT 'main', readme_url TEXT, enabled_claude BOOLEAN NOT NULL DEFAULT 0,
  enabled_codex BOOLEAN NOT NULL DEFAULT 0, enabled_gemini BOOLEAN NOT NULL DEFAULT 0, enabled_grokbuild BOOLEAN NOT NULL DEFAULT 0,
  enabled_opencode BOOLEAN NOT NULL DEFAULT 0, enabled_hermes BOOLEAN NOT NULL DEFAULT 0, installed_at INTEGER NOT NULL DEFAULT 0,
  content_hash TEXT, updated_at INTEGER NOT NULL DEFAULT 0);
CREATE TABLE skill_repos (owner TEXT NOT NULL, name TEXT NOT NULL, branch TEXT NOT NULL DEFAULT 'main',
  enabled BOOLEAN NOT NULL DEFAULT 1, PRIMARY KEY (owner, name));
CREATE TABLE settings (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE proxy_config (app_type TEXT PRIMARY KEY CHECK (app_type IN ('claude','codex','gemini','grokbuild')),
  proxy_enabled INTEGER NOT NULL DEFAULT 0, listen_address TEXT NOT NULL DEFAULT '127.0.0.1');
PRAGMA user_version=17;
"""
REQUIRED = ("providers", "provider_endpoints", "mcp_servers", "prompts", "skills", "skill_repos", "settings")
HEADER = "-- CC Switch SQLite 导出"
SCHEMA_VERSION = 17


def cc_switch_db(path: Path, *, other_current: bool = True) -> None:
    """A CC Switch database as a user has it: schema 17 and one provider of their own per app."""
    conn = sqlite3.connect(path)
    conn.executescript(CC_SWITCH_SCHEMA)
    for app, sc in (("claude", {"env": {"ANTHROPIC_BASE_URL": "https://api.example.com"}}), ("codex", {"auth": {}, "config": 'model = "x"\n'})):
        conn.execute("INSERT INTO providers (id, app_type, name, settings_config, is_current) VALUES (?, ?, ?, ?, ?)",
                     ("mine", app, "My provider", json.dumps(sc), int(other_current)))
    conn.commit()
    conn.close()


def cc_switch_import_check(sql: str, tmp: Path) -> sqlite3.Connection:
    """What CC Switch's SQL import does before it replaces its database; returns the staging database."""
    text = sql.lstrip("\ufeff")
    assert text.lstrip().startswith(HEADER), "Only SQL backups exported by CC Switch are supported."

    def authorizer(action: int, arg1, arg2, db, trigger) -> int:
        if action in (sqlite3.SQLITE_ATTACH, sqlite3.SQLITE_DETACH):
            return sqlite3.SQLITE_DENY
        if action == sqlite3.SQLITE_PRAGMA and str(arg1).lower() not in ("foreign_keys", "user_version"):
            return sqlite3.SQLITE_DENY
        return sqlite3.SQLITE_OK

    conn = sqlite3.connect(tmp / "staging.db")
    conn.set_authorizer(authorizer)
    conn.executescript(text)
    conn.set_authorizer(None)
    assert not conn.in_transaction, "The SQL backup transaction is incomplete; the file may be truncated."
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert not set(REQUIRED) - tables, f"The imported SQL is missing required CC Switch tables: {set(REQUIRED) - tables}"
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    assert 0 <= version <= SCHEMA_VERSION
    return conn


def rows(conn: sqlite3.Connection) -> dict[tuple[str, str], dict]:
    conn.row_factory = sqlite3.Row
    return {(r["id"], r["app_type"]): dict(r) for r in conn.execute("SELECT * FROM providers")}


def check_taotoken_rows(found: dict, *, current: int) -> None:
    claude, codex = found[("taotoken", "claude")], found[("taotoken", "codex")]
    sc = json.loads(claude["settings_config"])
    assert sc["env"] == {"ANTHROPIC_BASE_URL": "https://taotoken.net/api", "ANTHROPIC_MODEL": "kregress-test-model"}
    assert "TAOTOKEN_KEY_REVIEW" in sc["apiKeyHelper"] and "Bash(git push:*)" in sc["permissions"]["deny"]
    cx = json.loads(codex["settings_config"])
    cfg = tomllib.loads(cx["config"])
    assert cx["auth"] == {} and cfg["model_providers"]["taotoken"]["base_url"] == "https://taotoken.net/api/v1"
    assert cfg["model_providers"]["taotoken"]["wire_api"] == "responses" and cfg["model_providers"]["taotoken"]["env_key"] == "TAOTOKEN_KEY_REVIEW"
    for r in (claude, codex):
        assert r["website_url"] == "https://taotoken.net" and r["category"] == "third_party" and r["meta"] == "{}"
        assert r["is_current"] == current and r["in_failover_queue"] == 0 and r["created_at"] > 1.6e12  # milliseconds


def test_sql_export_passes_cc_switch_import_checks_and_holds_the_providers(tmp_path):
    opts = ExportOptions()
    sql = export_sql(opts, dict(ENV))
    assert KEY not in sql and "CCSCANARY" not in sql
    staging = cc_switch_import_check(sql, tmp_path)
    assert staging.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    found = rows(staging)
    assert set(found) == {("taotoken", "claude"), ("taotoken", "codex")}
    check_taotoken_rows(found, current=1)
    assert any("REPLACES" in n and "cc-switch-merge-sql" in n for n in opts.notes)
    # the same file applied with sqlite3 to a database created with CC Switch's schema (a fresh install)
    db = tmp_path / "cc-switch.db"
    conn = sqlite3.connect(db)
    conn.executescript(CC_SWITCH_SCHEMA)
    conn.executescript(sql)
    check_taotoken_rows(rows(conn), current=1)
    conn.close()
    assert lint_text(sql, "taotoken.ccswitch.sql", dict(ENV)) == []


def test_cc_switch_import_would_refuse_a_file_without_the_header_or_tables(tmp_path):
    sql = export_sql(ExportOptions(), dict(ENV))
    with pytest.raises(AssertionError, match="Only SQL backups"):
        cc_switch_import_check(sql.replace(HEADER, "-- some dump", 1), tmp_path)
    with pytest.raises(AssertionError, match="missing required CC Switch tables"):
        (tmp_path / "b").mkdir()
        cc_switch_import_check("\n".join(line for line in sql.splitlines() if "skill_repos" not in line), tmp_path / "b")


def test_include_key_puts_the_environment_s_key_in_the_rows_and_lint_flags_it():
    opts = ExportOptions(include_key=True)
    sql = export_sql(opts, dict(ENV))
    conn = sqlite3.connect(":memory:")
    conn.executescript(sql)
    found = rows(conn)
    assert json.loads(found[("taotoken", "claude")]["settings_config"])["env"]["ANTHROPIC_AUTH_TOKEN"] == KEY
    assert json.loads(found[("taotoken", "codex")]["settings_config"])["auth"] == {"OPENAI_API_KEY": KEY}
    findings = lint_text(sql, "t.sql", dict(ENV))
    assert {f.code for f in findings} == {"literal_key"} and KEY not in "\n".join(f.render() for f in findings)
    assert any("--include-key" in n for n in opts.notes)


def test_merge_sql_adds_to_an_existing_database_and_keeps_the_user_s_providers(tmp_path):
    db = tmp_path / "cc-switch.db"
    cc_switch_db(db)
    sql = export_merge_sql(ExportOptions(), dict(ENV))
    assert not sql.lstrip().startswith(HEADER) and "PRAGMA user_version" not in sql and "CREATE TABLE" not in sql
    if shutil.which("sqlite3"):  # the documented command, when the CLI is installed
        subprocess.run(["sqlite3", str(db)], input=sql, text=True, check=True, capture_output=True)
    else:
        conn = sqlite3.connect(db)
        conn.executescript(sql)
        conn.close()
    conn = sqlite3.connect(db)
    found = rows(conn)
    assert found[("mine", "claude")]["is_current"] == 1 and found[("mine", "codex")]["is_current"] == 1
    check_taotoken_rows(found, current=0)
    conn.execute("UPDATE providers SET is_current = CASE id WHEN 'taotoken' THEN 1 ELSE 0 END")  # user switches in CC Switch
    conn.commit()
    conn.executescript(export_merge_sql(ExportOptions(model="other-model"), dict(ENV)))  # re-export: an upsert
    found = rows(conn)
    assert len(found) == 4 and found[("taotoken", "claude")]["is_current"] == 1
    assert json.loads(found[("taotoken", "claude")]["settings_config"])["env"]["ANTHROPIC_MODEL"] == "other-model"
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    conn.close()


def test_deeplink_needs_the_key_and_carries_it_only_when_asked():
    with pytest.raises(ExportError, match="refuses a provider without an API key"):
        export_deeplink(ExportOptions(), dict(ENV))
    links = export_deeplink(ExportOptions(include_key=True), dict(ENV)).split()
    assert len(links) == 2
    by_app = {}
    for link in links:
        u = urlsplit(link)
        assert (u.scheme, u.netloc, u.path) == ("ccswitch", "v1", "/import")
        q = {k: v[0] for k, v in parse_qs(u.query).items()}
        by_app[q["app"]] = q
        assert q["resource"] == "provider" and q["apiKey"] == KEY and q["model"] == "kregress-test-model" and q["name"]
    assert by_app["claude"]["endpoint"] == "https://taotoken.net/api" and by_app["codex"]["endpoint"] == "https://taotoken.net/api/v1"


def test_lint_reads_a_cc_switch_database_read_only_and_finds_planted_mistakes(tmp_path):
    db = tmp_path / "cc-switch.db"
    cc_switch_db(db)
    conn = sqlite3.connect(db)
    conn.executescript(export_merge_sql(ExportOptions(), dict(ENV)))
    bad = 'model = "m"\nmodel_provider = "t"\n[model_providers.t]\nbase_url = "https://taotoken.net/api/v1"\nenv_key = "ANTHROPIC_AUTH_TOKEN"\nwire_api = "chat"\n'
    conn.execute("UPDATE providers SET settings_config = ? WHERE id = 'taotoken' AND app_type = 'codex'", (json.dumps({"auth": {}, "config": bad}),))
    conn.execute("UPDATE providers SET settings_config = ? WHERE id = 'taotoken' AND app_type = 'claude'",
                 (json.dumps({"env": {"ANTHROPIC_BASE_URL": "https://taotoken.net/api", "ANTHROPIC_AUTH_TOKEN": KEY}}),))
    conn.commit()
    conn.close()
    before = db.read_bytes()
    findings = lint_file(db, dict(ENV))
    codes = {(f.where.split(".")[0], f.code) for f in findings}
    assert ("providers[codex/taotoken]", "wire_api_chat") in codes and ("providers[codex/taotoken]", "wrong_tool_vars") in codes
    assert ("providers[claude/taotoken]", "literal_key") in codes
    assert db.read_bytes() == before and KEY not in "\n".join(f.render() for f in findings)


def test_lint_of_a_sql_file_cannot_reach_another_file(tmp_path):
    target = tmp_path / "elsewhere.db"
    sql = f"{HEADER}\nATTACH DATABASE '{target}' AS x;\nCREATE TABLE x.t (a);\n"
    [f] = lint_text(sql, "evil.sql", dict(ENV))
    assert f.code == "parse_error" and not target.exists()
