"""``kregress lint-config``: the mistakes in Claude Code, Codex and CC Switch files that cost kernel engineers hours.

Reads ``settings.json`` (Claude Code), ``config.toml`` (Codex), and CC Switch's store in any of its forms:
the 3.x database ``cc-switch.db`` (opened read-only), an exported ``.sql`` (run into an in-memory database
that may not touch any file), or the pre-3.0 ``config.json``. Each finding names the file, the key path in
it, what goes wrong in the real tool, and the fix. A key is never printed (only its length and a
4-hex-digit fingerprint).
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping
from urllib.parse import parse_qsl, urlsplit

import tomllib

from kernel_assets.clients.common import ENV_NAME, environment_secrets, helper_variables, is_placeholder, is_secret_name, looks_like_key
from kernel_assets.clients.export import CODEX_CHAT_REMOVED
from kregress.core.endpoints import DEFAULT_ROOT, OTHER_TOOLS_ENV, RequestError, fingerprint, resolve_base_url, split_keys
from kregress.core.endpoints import mask_endpoint_url as mask_url

KINDS = ("claude-code", "codex", "cc-switch")
_ENDPOINTS = (("chat", "completions"), ("completions",), ("responses",), ("messages",), ("models",))
_CLAUDE_VARS = ("ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_API_KEY")
@dataclass(frozen=True)
class Finding:
    file: str
    where: str  # a key path in the file, e.g. env.ANTHROPIC_BASE_URL or model_providers.taotoken.env_key
    code: str
    problem: str
    fix: str

    def render(self) -> str:
        return f"{self.file}: {self.where}: [{self.code}] {self.problem}\n    fix: {self.fix}"


def _suggest_base(url: str, tool: str) -> str:
    """The URL the user most likely meant, for the tool: API root (Claude Code) or root + /v1 (Codex, OpenAI)."""
    try:
        p = urlsplit(url.strip())
        segs = [s for s in p.path.split("/") if s]
    except ValueError:
        p, segs = None, []
    candidate = DEFAULT_ROOT
    if p is not None and p.scheme in ("http", "https") and p.hostname:
        for end in _ENDPOINTS:
            if len(segs) >= len(end) and tuple(segs[-len(end):]) == end:
                segs = segs[: -len(end)]
                break
        dedup: list[str] = []
        for s in segs:
            if not (dedup and dedup[-1] == s) and not (s == "v1" and "v1" in dedup):
                dedup.append(s)
        dedup = [s for s in dedup if s != "v1"]
        host = p.hostname + (f":{p.port}" if p.port else "")
        if not dedup:
            if p.hostname.endswith("taotoken.net"):
                dedup = ["api"]
            else:
                return f"the API root of {p.scheme}://{host} (its API path, e.g. {DEFAULT_ROOT})" + ("" if tool == "claude" else ", plus /v1")
        candidate = f"{p.scheme}://{host}/" + "/".join(dedup)
    try:
        root, sdk = resolve_base_url(candidate)
    except RequestError:
        root, sdk = DEFAULT_ROOT, DEFAULT_ROOT + "/v1"
    return root if tool == "claude" else sdk


def check_url(url: str, tool: str) -> list[tuple[str, str, str]]:
    """(code, problem, fix) for a base URL used by ``tool``: claude (root; Claude Code appends /v1/messages),
    codex / openai (root + /v1; they append /responses or /chat/completions). Empty when it is usable."""
    raw = (url or "").strip()
    who = {"claude": "Claude Code", "codex": "Codex", "openai": "OpenAI-SDK tools"}[tool]
    good = _suggest_base(raw, tool)
    fix = f"use {good}"
    try:
        p = urlsplit(raw)
    except ValueError:
        return [("url_invalid", "not a URL", fix)]
    if p.scheme not in ("http", "https") or not p.hostname:
        return [("url_invalid", f"{mask_url(raw)!r} is not an http(s) URL", fix)]
    shown = mask_url(raw)
    out: list[tuple[str, str, str]] = []
    if p.username or p.password:
        out.append(("url_credentials", f"{shown} carries credentials in the URL",
                    f"{fix}; the key belongs in the tool's key variable, never in the URL"))
    if p.query or p.fragment:
        names = sorted({k for k, _ in parse_qsl(p.query, keep_blank_values=True)})
        what = f"a query string (parameters: {', '.join(names) or '?'})" if p.query else "a #fragment"
        out.append(("url_query", f"{shown} carries {what}; it looks copied from a browser link and the API takes none", fix))
    segs = [s for s in p.path.split("/") if s]
    if not segs:
        out.append(("url_homepage", f"{shown} is a site homepage, not the API", fix))
        return out
    for end in _ENDPOINTS:
        if len(segs) >= len(end) and tuple(segs[-len(end):]) == end:
            out.append(("url_endpoint", f"{shown} is an endpoint (/{'/'.join(end)}), not the base URL; {who} appends the endpoint itself", fix))
            segs = segs[: -len(end)]
            break
    if segs.count("v1") > 1 or any(a == b for a, b in zip(segs, segs[1:])):
        dup = "v1" if segs.count("v1") > 1 else next(a for a, b in zip(segs, segs[1:]) if a == b)
        out.append(("url_duplicate_v1" if dup == "v1" else "url_duplicate_segment", f"{shown} has /{dup} twice", fix))
    elif tool == "claude" and segs and segs[-1] == "v1":
        out.append(("url_duplicate_v1", f"{shown} ends in /v1, and Claude Code appends /v1/messages itself: requests would go to .../v1/v1/messages", fix))
    elif tool != "claude" and "v1" not in segs:
        out.append(("url_missing_v1", f"{shown} has no /v1: {who} {'append' if tool == 'openai' else 'appends'} /responses or /chat/completions to the base URL directly", fix))
    if not out:
        try:  # the gateway's own validator has the last word
            resolve_base_url(raw)
        except RequestError as e:
            text = re.sub(r"^\[request\] TAOTOKEN_BASE_URL: ", "", str(e))
            out.append(("url_invalid", text.split(" Fix:")[0], fix))
    return out


def _walk(obj: Any, path: str = "") -> Iterator[tuple[str, str, Any]]:
    """(path, key, value) for every scalar in nested dicts / lists."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            p = f"{path}.{k}" if path else str(k)
            if isinstance(v, (dict, list)):
                yield from _walk(v, p)
            else:
                yield p, str(k), v
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _walk(v, f"{path}[{i}]")


class _Linter:
    def __init__(self, name: str, environ: Mapping[str, str]):
        self.name = name
        self.env = environ
        self.secrets = environment_secrets(environ)
        self.findings: list[Finding] = []
        self._seen: set[tuple[str, str]] = set()

    def add(self, where: str, code: str, problem: str, fix: str) -> None:
        if (where, code) in self._seen:
            return
        self._seen.add((where, code))
        self.findings.append(Finding(self.name, where, code, problem, fix))

    def url(self, where: str, value: Any, tool: str) -> None:
        if not isinstance(value, str):
            self.add(where, "url_invalid", f"expected a URL string, got {type(value).__name__}", "write the base URL as a string")
            return
        for code, problem, fix in check_url(value, tool):
            self.add(where, code, problem, fix)

    def literal(self, where: str, value: str, what: str, fix: str) -> None:
        keys = split_keys(value) or [value]
        self.add(where, "literal_key", f"{what} is a literal key ({len(keys[0])} chars, fingerprint #{fingerprint(keys[0])}) written in the file", fix)

    def scan_secrets(self, obj: Any, prefix: str, fix: str) -> None:
        """Any value that is one of the environment's keys, or is shaped like a key, or sits under a secret name."""
        for path, key, value in _walk(obj):
            if not isinstance(value, str) or not value.strip():
                continue
            where = f"{prefix}.{path}" if prefix else path
            if is_placeholder(value):
                if is_secret_name(key):
                    self.add(where, "placeholder", f"{key} is an unfilled placeholder ({value.strip()[:40]!r}); the tool sends it as the key and gets 401",
                             "put the key in the environment and let the tool read it from there (apiKeyHelper / env_key), or fill it in a file kept out of git")
                continue
            hit = any(s in value for s in self.secrets) or looks_like_key(value)
            if hit or (is_secret_name(key) and key != "env_key" and len(value.strip()) >= 8 and " " not in value.strip()):
                self.literal(where, value, key, fix)

    # -- Claude Code ---------------------------------------------------------------------------------
    def claude(self, settings: Any, prefix: str = "") -> None:
        pre = f"{prefix}." if prefix else ""
        if not isinstance(settings, dict):
            self.add(prefix or "(top)", "shape", "a Claude Code settings object must be a JSON object", "start from `kregress export-config --tool claude-code`")
            return
        env = settings.get("env") or {}
        if not isinstance(env, dict):
            self.add(f"{pre}env", "shape", "env must be an object of VARIABLE: string", "write env as {\"ANTHROPIC_BASE_URL\": \"...\"}")
            env = {}
        for name in env:
            if str(name).startswith(("OPENAI_", "CODEX_")) or name in ("TAOTOKEN_BASE_URL",):
                self.add(f"{pre}env.{name}", "wrong_tool_vars",
                         f"{name} is another tool's variable; Claude Code reads ANTHROPIC_BASE_URL, ANTHROPIC_AUTH_TOKEN (or ANTHROPIC_API_KEY) and ANTHROPIC_MODEL",
                         f"replace {name} with the ANTHROPIC_* variable it was meant to be (`kregress export-config --tool claude-code` writes them)")
        if "ANTHROPIC_BASE_URL" in env:
            self.url(f"{pre}env.ANTHROPIC_BASE_URL", env["ANTHROPIC_BASE_URL"], "claude")
        helper = settings.get("apiKeyHelper")
        token_names = [n for n in ("ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_API_KEY") if str(env.get(n) or "").strip()]
        if isinstance(helper, str) and helper.strip():
            names = helper_variables(helper)
            if names and not any(split_keys(self.env.get(n, "")) for n in names):
                self.add(f"{pre}apiKeyHelper", "helper_vars_unset",
                         f"apiKeyHelper reads ${', $'.join(names)}, and none of them holds a key in this environment: the helper prints no key "
                         "and Claude Code still sends its requests, with an empty key (401)",
                         f"export {names[0]}=<key> in the shell that starts Claude Code")
            if looks_like_key(helper) or any(s in helper for s in self.secrets):
                self.literal(f"{pre}apiKeyHelper", helper, "apiKeyHelper", "make the helper print the key from a variable, e.g. printf '%s' \"$TAOTOKEN_KEY_REVIEW\"")
        for n in _CLAUDE_VARS:
            if n in env and isinstance(env[n], str) and not env[n].strip():
                self.add(f"{pre}env.{n}", "empty_key", f"{n} is an empty string: Claude Code sends an empty key to the gateway (401)",
                         f"remove {n} and let apiKeyHelper print the key from $TAOTOKEN_KEY_REVIEW (`kregress export-config --tool claude-code`)")
        base = str(env.get("ANTHROPIC_BASE_URL") or "")
        third_party = bool(base) and "anthropic.com" not in base
        shell_auth = any(str(self.env.get(n) or "").strip() for n in ("ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_API_KEY"))
        if third_party and not token_names and not (isinstance(helper, str) and helper.strip()) and not shell_auth:
            self.add(f"{pre}env", "no_auth", "ANTHROPIC_BASE_URL points at a gateway but no key reaches Claude Code (no ANTHROPIC_AUTH_TOKEN, "
                     "no apiKeyHelper, nothing exported in this shell): it would send its own login to the gateway and get 401",
                     "add an apiKeyHelper that prints the key from $TAOTOKEN_KEY_REVIEW (`kregress export-config --tool claude-code` writes one)")
        self.scan_secrets(settings, prefix, "remove the key from the file; use apiKeyHelper reading $TAOTOKEN_KEY_REVIEW (or keep the file out of git)")
        perms = settings.get("permissions") or {}
        if isinstance(perms, dict) and not prefix:
            self.trust(perms)
        if isinstance(perms, dict):
            for i, rule in enumerate(perms.get("allow") or []):
                if isinstance(rule, str) and rule.replace(" ", "") in ("Bash", "Bash(*)", "Bash(:*)"):
                    self.add(f"{pre}permissions.allow[{i}]", "allow_all_bash", f"{rule!r} lets the agent run any shell command (rm, git push, kubectl ...) unasked",
                             "allow specific prefixes instead, e.g. Bash(git diff:*), Bash(pytest:*), Bash(kregress:*)")
                elif isinstance(rule, str) and re.match(r"^[a-z]\w*(\(|$)", rule):
                    self.add(f"{pre}permissions.allow[{i}]", "rule_syntax", f"{rule!r}: tool names are capitalised (Bash, Read, Grep ...), so this rule matches nothing",
                             f"write {rule[:1].upper() + rule[1:]!r}")

    def trust(self, perms: dict[str, Any]) -> None:
        """A project's .claude/settings.json: its allow rules apply only once Claude Code trusts the workspace."""
        allow = [r for r in perms.get("allow") or [] if isinstance(r, str)]
        p = Path(self.name).expanduser()
        if not allow or p.parent.name != ".claude" or p.name not in ("settings.json", "settings.local.json"):
            return
        cfg_dir = self.env.get("CLAUDE_CONFIG_DIR", "").strip()
        home = Path(self.env.get("HOME") or Path.home())
        if p.resolve().parent == (Path(cfg_dir).expanduser() if cfg_dir else home / ".claude").resolve():
            return  # user settings: no trust needed
        project = p.resolve().parent.parent
        state_file = (Path(cfg_dir).expanduser() if cfg_dir else home) / ".claude.json"
        try:
            state = json.loads(state_file.read_text(encoding="utf-8"))
            trusted = bool(((state.get("projects") or {}).get(str(project)) or {}).get("hasTrustDialogAccepted"))
        except (OSError, ValueError, AttributeError):
            trusted = False
        if not trusted:
            self.add("permissions.allow", "workspace_untrusted",
                     f"{project} is not a trusted Claude Code workspace (per {state_file}): Claude Code ignores these {len(allow)} "
                     "permissions.allow entries until it is",
                     f"run `claude` in {project} once and accept \"trust the files in this folder\", or put the rules in the user settings "
                     "(`kregress export-config --tool claude-code --install` writes ~/.claude/settings.json)")

    # -- Codex -----------------------------------------------------------------------------------------
    def codex(self, text: str, prefix: str = "") -> None:
        pre = f"{prefix}." if prefix else ""
        try:
            cfg = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            self.add(prefix or "(file)", "parse_error", f"not valid TOML: {e}", "fix the syntax (every string quoted, one [table] header per table)")
            return
        for path, key, value in _walk(cfg):
            other = next((n for n in OTHER_TOOLS_ENV if n != "OPENAI_API_KEY" and isinstance(value, str) and n in value), "")
            if "ANTHROPIC_" in key or other or (isinstance(value, str) and "ANTHROPIC_" in value):
                var = other or (value if isinstance(value, str) and "ANTHROPIC_" in value else key)
                whose = "Claude Code's" if "ANTHROPIC_" in var else "another tool's"
                self.add(f"{pre}{path}", "wrong_tool_vars",
                         f"{var} is {whose} variable, not the gateway's: Codex reads it and sends its value to this provider "
                         "(a key for another service: 401 at best, and that key leaves for the wrong host)",
                         "name the gateway's variable instead, e.g. env_key = \"TAOTOKEN_KEY_REVIEW\" in [model_providers.<id>]")
        if not str(cfg.get("model") or "").strip():
            self.add(f"{pre}model", "model_missing", "no model: Codex would use its own default, which the gateway may not serve",
                     "set model = \"<a model id the gateway serves>\" (the value of TAOTOKEN_MODEL_ID)")
        if "openai_base_url" in cfg:
            self.url(f"{pre}openai_base_url", cfg["openai_base_url"], "codex")
        providers = cfg.get("model_providers") or {}
        active = cfg.get("model_provider")
        if isinstance(active, str) and active and active not in providers and active not in ("openai", "oss", "ollama", "lmstudio"):
            self.add(f"{pre}model_provider", "provider_missing", f"model_provider = {active!r} but there is no [model_providers.{active}] table",
                     f"add [model_providers.{active}] with base_url, env_key and wire_api, or fix the name")
        for pid, prov in providers.items() if isinstance(providers, dict) else []:
            where = f"{pre}model_providers.{pid}"
            if not isinstance(prov, dict):
                continue
            if "base_url" in prov:
                self.url(f"{where}.base_url", prov["base_url"], "codex")
            else:
                self.add(f"{where}.base_url", "url_missing", "no base_url", f"set base_url = \"{DEFAULT_ROOT}/v1\"")
            env_key = prov.get("env_key")
            bearer = prov.get("experimental_bearer_token")
            if isinstance(env_key, str) and env_key.strip():
                if looks_like_key(env_key) or any(s in env_key for s in self.secrets) or not ENV_NAME.match(env_key.strip()):
                    self.literal(f"{where}.env_key", env_key, "env_key", "env_key takes the NAME of a variable, e.g. env_key = \"TAOTOKEN_KEY_REVIEW\"; export the key in that variable")
                elif not any(n in env_key for n in OTHER_TOOLS_ENV if n != "OPENAI_API_KEY") and "ANTHROPIC_" not in env_key:
                    held = split_keys(self.env.get(env_key, ""))
                    if not held:
                        state = "is set but empty" if env_key in self.env else "is not set"
                        self.add(f"{where}.env_key", "env_key_unset", f"env_key names {env_key}, which {state} in this environment: Codex will have no key",
                                 f"export {env_key}=<key> in the shell that starts Codex (or point env_key at the variable that holds it)")
                    elif len(held) > 1:
                        self.add(f"{where}.env_key", "env_key_multi", f"{env_key} holds {len(held)} keys; Codex sends the whole value as one bearer token (401)",
                                 f"point env_key at a variable holding one key, e.g. export TAOTOKEN_CODEX_KEY=${{{env_key}%%,*}}")
            elif not (isinstance(bearer, str) and bearer.strip()) and not prov.get("requires_openai_auth"):
                self.add(f"{where}.env_key", "no_auth", "no env_key: Codex sends no key to this provider",
                         "add env_key = \"TAOTOKEN_KEY_REVIEW\" (the variable's NAME; the key stays in the environment)")
            wire = prov.get("wire_api")
            if wire == "chat":
                self.add(f"{where}.wire_api", "wire_api_chat", "current Codex refuses to load this config: " + CODEX_CHAT_REMOVED.replace("\n", " "),
                         "use wire_api = \"responses\" (`kregress doctor --ping --tool codex` checks the gateway serves /v1/responses)")
            elif wire is not None and wire != "responses":
                self.add(f"{where}.wire_api", "wire_api_unknown", f"wire_api = {wire!r} is not a Codex wire API", "use wire_api = \"responses\"")
        self.scan_secrets(cfg, prefix, "remove the key; set env_key = \"TAOTOKEN_KEY_REVIEW\" and export the key in that variable")

    # -- CC Switch -------------------------------------------------------------------------------------
    def cc_provider(self, app: str, settings: Any, where: str) -> None:
        """One CC Switch provider's settings: the Claude settings object, or Codex's {auth, config}."""
        if app == "claude":
            self.claude(settings if settings is not None else {}, where)
            return
        if app != "codex":
            return
        sc = settings if isinstance(settings, dict) else {}
        cfg_text = sc.get("config", "")
        if isinstance(cfg_text, str) and cfg_text.strip():
            self.codex(cfg_text, f"{where}.config")
        auth = sc.get("auth") or {}
        self.scan_secrets(auth, f"{where}.auth", "leave auth empty and let config.toml's env_key name the variable that holds the key")
        for k in auth if isinstance(auth, dict) else []:
            if str(k).startswith("ANTHROPIC_"):
                self.add(f"{where}.auth.{k}", "wrong_tool_vars", f"{k} in Codex auth: Codex reads only OPENAI_API_KEY from auth.json, so this key is never sent",
                         "Codex takes the key from env_key's variable (or OPENAI_API_KEY in auth)")

    def cc_switch_json(self, doc: dict[str, Any]) -> None:
        for app in [a for a in ("claude", "codex") if isinstance(doc.get(a), dict)]:
            mgr = doc[app]
            providers = mgr.get("providers") or {}
            if not isinstance(providers, dict):
                self.add(f"{app}.providers", "shape", "providers must be an object keyed by provider id", "re-export with `kregress export-config --tool cc-switch`")
                continue
            cur = mgr.get("current")
            if cur and cur not in providers:
                self.add(f"{app}.current", "current_missing", f"current = {cur!r} is not one of the providers ({', '.join(providers) or 'none'})",
                         "set current to a provider id that exists")
            for pid, prov in providers.items():
                self.cc_provider(app, prov.get("settingsConfig") if isinstance(prov, dict) else None, f"{app}.providers.{pid}.settingsConfig")

    def cc_switch_db(self, conn: sqlite3.Connection) -> None:
        """CC Switch 3.x providers table (a cc-switch.db, or an exported .sql run into memory)."""
        try:
            rows = conn.execute("SELECT app_type, id, settings_config, is_current FROM providers ORDER BY app_type, id").fetchall()
        except sqlite3.Error as e:
            self.add("providers", "shape", f"no CC Switch providers table ({e})", "re-export with `kregress export-config --tool cc-switch`")
            return
        current: dict[str, int] = {}
        for app, pid, text, is_current in rows:
            where = f"providers[{app}/{pid}].settings_config"
            current[app] = current.get(app, 0) + bool(is_current)
            try:
                settings = json.loads(text)
            except (TypeError, ValueError) as e:
                self.add(where, "parse_error", f"settings_config is not JSON ({e})", "re-export with `kregress export-config --tool cc-switch`")
                continue
            self.cc_provider(app, settings, where)
        for app, n in current.items():
            if n > 1:
                self.add(f"providers[{app}]", "current_many", f"{n} {app} providers are marked is_current", "select one provider in CC Switch")


# Only these SQLite actions may run when a .sql file is linted: nothing that reaches another file.
_SQL_DENY = {sqlite3.SQLITE_ATTACH, sqlite3.SQLITE_DETACH}


def _sql_authorizer(action: int, arg1: Any, arg2: Any, db: Any, trigger: Any) -> int:
    if action in _SQL_DENY or (action == sqlite3.SQLITE_PRAGMA and str(arg1).lower() not in ("foreign_keys", "user_version")):
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK


def lint_text(text: str, name: str = "<config>", environ: Mapping[str, str] | None = None, kind: str | None = None) -> list[Finding]:
    """Findings for one file's text. ``kind``: claude-code, codex or cc-switch (guessed from name and content when None)."""
    env = dict(os.environ if environ is None else environ)
    lint = _Linter(name, env)
    if kind is None:
        kind = "codex" if name.endswith(".toml") else "cc-switch" if name.endswith(".sql") else None
    if kind == "codex":
        lint.codex(text)
        return lint.findings
    if kind == "cc-switch" and not text.lstrip().startswith("{"):
        from kernel_assets.clients.ccswitch import REQUIRED_TABLES_DDL

        conn = sqlite3.connect(":memory:")
        try:
            conn.execute(REQUIRED_TABLES_DDL[0])  # a merge file only inserts: give it the table it inserts into
            conn.set_authorizer(_sql_authorizer)
            conn.executescript(text)
            conn.set_authorizer(None)
        except sqlite3.Error as e:
            lint.add("(file)", "parse_error", f"the SQL does not run in SQLite ({e})", "re-export with `kregress export-config --tool cc-switch`")
            return lint.findings
        try:
            lint.cc_switch_db(conn)
        finally:
            conn.close()
        return lint.findings
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        if kind is None:
            try:
                tomllib.loads(text)
            except tomllib.TOMLDecodeError:
                pass
            else:
                lint.codex(text)
                return lint.findings
        lint.add("(file)", "parse_error", f"not valid JSON ({e.msg} at line {e.lineno} column {e.colno})", "fix the syntax (no trailing commas, no comments)")
        return lint.findings
    if kind is None:
        is_ccs = isinstance(doc, dict) and any(isinstance(doc.get(a), dict) and "providers" in doc[a] for a in ("claude", "codex"))
        kind = "cc-switch" if is_ccs else "claude-code"
    if kind == "cc-switch":
        if not isinstance(doc, dict):
            lint.add("(top)", "shape", "a CC Switch document is a JSON object", "re-export with `kregress export-config --tool cc-switch`")
        else:
            lint.cc_switch_json(doc)
    else:
        lint.claude(doc)
    return lint.findings


def lint_file(path: str | Path, environ: Mapping[str, str] | None = None, kind: str | None = None) -> list[Finding]:
    p = Path(path).expanduser()
    try:
        with p.open("rb") as fh:
            head = fh.read(16)
        if head.startswith(b"SQLite format 3"):
            env = dict(os.environ if environ is None else environ)
            lint = _Linter(str(p), env)
            conn = sqlite3.connect(f"{p.resolve().as_uri()}?mode=ro", uri=True)
            try:
                lint.cc_switch_db(conn)
            finally:
                conn.close()
            return lint.findings
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError, sqlite3.Error) as e:
        return [Finding(str(p), "(file)", "unreadable", f"cannot read the file ({type(e).__name__})", "check the path and permissions")]
    return lint_text(text, str(p), environ, kind)
