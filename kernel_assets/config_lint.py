"""Coding-tool configuration for the TaoToken gateway: export files for Claude Code, Codex and CC Switch,
and lint such files for the mistakes that cost kernel engineers hours (not kernel bugs).

Formats (looked up for issue 6; see the report of that issue for the sources):

- Claude Code ``settings.json``: ``env`` (ANTHROPIC_BASE_URL, ANTHROPIC_AUTH_TOKEN, ANTHROPIC_MODEL; Claude
  Code itself appends ``/v1/messages`` to the base URL), ``apiKeyHelper`` (a command run by ``/bin/sh`` whose
  output is sent as ``X-Api-Key`` and ``Authorization: Bearer``), ``permissions.allow`` / ``permissions.deny``
  rules ``Tool`` or ``Tool(specifier)``, e.g. ``Bash(git diff:*)`` (prefix) or ``Bash(curl *prod*)`` (glob);
  deny is evaluated before allow.
- Codex ``config.toml``: ``model``, ``model_provider`` and a ``[model_providers.<id>]`` table with ``name``,
  ``base_url`` (Codex appends ``/responses``, so it ends in ``/v1``), ``env_key`` (the NAME of the variable
  holding the key) and ``wire_api`` (``"responses"``; ``"chat"`` is deprecated and removed in current Codex).
- CC Switch: its v2 store shape ``{"version": 2, "claude": {"providers": {id: Provider}, "current": id},
  "codex": {...}}``; a Provider is ``{id, name, settingsConfig, websiteUrl, category, notes}`` where
  ``settingsConfig`` is the Claude ``settings.json`` object, or ``{"auth": {...}, "config": "<config.toml>"}``
  for Codex.

No exported file holds a key unless ``include_key`` is asked for; the lint never prints a key (only its
length and a 4-hex-digit fingerprint).
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping
from urllib.parse import parse_qsl, urlsplit

from kregress.core.endpoints import mask_endpoint_url as mask_url  # noqa: F401
from kregress.core.endpoints import mask_secret  # noqa: F401
from resources.taotoken import (
    DEFAULT_ROOT,
    FALLBACK_KEY_ENV,
    MODEL_ENV,
    ROLE_KEY_ENV,
    KeyPool,
    RequestError,
    split_keys,
    fingerprint,
    resolve_base_url,
)

TOOLS = ("claude-code", "codex", "cc-switch")
PROVIDER_ID = "taotoken"
PROVIDER_NAME = "TaoToken (kregress)"
CLAUDE_SCHEMA = "https://json.schemastore.org/claude-code-settings.json"
WIRE_APIS = ("responses", "chat")

# What a coding agent may do in a kernel repository without asking, and what it must never do.
CLAUDE_ALLOW = (
    "Read",
    "Grep",
    "Glob",
    "Bash(git diff:*)",
    "Bash(git status:*)",
    "Bash(git log:*)",
    "Bash(git show:*)",
    "Bash(grep:*)",
    "Bash(rg:*)",
    "Bash(pytest:*)",
    "Bash(python -m pytest:*)",
    "Bash(.venv/bin/python -m pytest:*)",
    "Bash(kregress:*)",
)
CLAUDE_DENY = (
    "Bash(rm:*)",
    "Bash(git push:*)",
    "Bash(kubectl:*)",
    "Bash(psql:*)",
    "Bash(mysql:*)",
    "Bash(docker push:*)",
    "Read(./.env)",
    "Read(./.env.*)",
)
DEFAULT_PROD_HOSTS = ("*prod*",)

_KEYLIKE = re.compile(r"\b(?:sk|tk|tt|pk|key)[-_][A-Za-z0-9_\-]{12,}|\bBearer\s+\S{8,}", re.IGNORECASE)
_PLACEHOLDER = re.compile(r"^\s*(?:<[^>]*>|\$\{?[A-Za-z_]\w*\}?|your[-_ ].*|x{3,}|changeme|replace[-_ ]?me.*|todo)\s*$", re.IGNORECASE)
_SECRET_NAME = re.compile(r"(?:KEY|TOKEN|SECRET|PASSWORD)$", re.IGNORECASE)
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SHELL_VAR = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)")
_ENDPOINTS = (("chat", "completions"), ("completions",), ("responses",), ("messages",), ("models",))


class ExportError(ValueError):
    """An export that cannot be written as asked; the message says what to set or pass."""


# --- small helpers shared with the doctor ----------------------------------------------------------------


def is_secret_name(name: str) -> bool:
    return bool(_SECRET_NAME.search(name)) or name.upper().endswith(("_KEYS", "AUTH_TOKEN"))


def looks_like_key(value: str) -> bool:
    return bool(_KEYLIKE.search(value or ""))


def is_placeholder(value: str) -> bool:
    return bool(_PLACEHOLDER.match(value or ""))


def environment_secrets(environ: Mapping[str, str]) -> list[str]:
    """Every key held by a variable whose name says it is a secret (to recognise them pasted into a file)."""
    out: list[str] = []
    for name, value in environ.items():
        if name.startswith(("TAOTOKEN_", "ANTHROPIC_", "OPENAI_")) and is_secret_name(name):
            out += [k for k in split_keys(value) if len(k) >= 8]
    return out


def first_key(role: str, environ: Mapping[str, str]) -> tuple[str, str | None]:
    """(variable the role's key comes from, the first key or None) exactly as the gateway would pick it."""
    pool = KeyPool.from_env(environ)
    keys = pool.keys(role)
    if keys:
        return keys[0].env_var, keys[0].reveal()
    return ROLE_KEY_ENV[role], None


def key_variable(role: str, environ: Mapping[str, str]) -> str:
    """The variable a coding tool should read the role's key from (its own variable, else the fallback)."""
    own = ROLE_KEY_ENV[role]
    if split_keys(environ.get(own, "")):
        return own
    if split_keys(environ.get(FALLBACK_KEY_ENV, "")):
        return FALLBACK_KEY_ENV
    return own


def api_key_helper(role: str) -> str:
    """A /bin/sh command printing the role's first key from the environment at run time (never stored)."""
    own = ROLE_KEY_ENV[role]
    return f"printf '%s' \"${{{own}:-${FALLBACK_KEY_ENV}}}\" | tr ',; ' '\\n\\n\\n' | grep -m1 ."


# --- export ----------------------------------------------------------------------------------------------


@dataclass
class ExportOptions:
    base_url: str = ""  # the gateway's API root as configured (TAOTOKEN_BASE_URL); empty: env, else default
    model: str = ""  # empty: TAOTOKEN_MODEL_ID; never guessed
    role: str = "review"
    env_key: str = ""  # Codex: variable holding the key; empty: the role's variable (or the fallback)
    wire_api: str = "responses"
    include_key: bool = False
    prod_hosts: tuple[str, ...] = DEFAULT_PROD_HOSTS
    notes: list[str] = field(default_factory=list)  # filled by the exporters: what the user should know


def _resolve(opts: ExportOptions, environ: Mapping[str, str]) -> tuple[str, str, str]:
    base = (opts.base_url or environ.get("TAOTOKEN_BASE_URL", "") or DEFAULT_ROOT).strip()
    try:
        root, sdk = resolve_base_url(base)
    except RequestError as e:
        raise ExportError(str(e)) from None
    model = (opts.model or environ.get(MODEL_ENV, "")).strip()
    if not model:
        raise ExportError(f"no model id: set {MODEL_ENV} or pass --model (the exported file never guesses a model)")
    if opts.role not in ROLE_KEY_ENV:
        raise ExportError(f"unknown role {opts.role!r}; allowed: {', '.join(ROLE_KEY_ENV)}")
    if opts.wire_api not in WIRE_APIS:
        raise ExportError(f"wire_api {opts.wire_api!r} is unknown; allowed: {', '.join(WIRE_APIS)}")
    return root, sdk, model


def _literal_key(opts: ExportOptions, environ: Mapping[str, str]) -> str:
    var, key = first_key(opts.role, environ)
    if key is None:
        raise ExportError(
            f"--include-key: no key for role {opts.role} in {ROLE_KEY_ENV[opts.role]} or {FALLBACK_KEY_ENV}; export one first"
        )
    opts.notes.append(f"the file contains the literal key from {var} (asked for with --include-key): keep it out of git "
                      "(for Claude Code use .claude/settings.local.json) and readable only by you")
    return key


def claude_settings(opts: ExportOptions, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Claude Code settings.json as a dict."""
    env_map = dict(os.environ if environ is None else environ)
    root, _sdk, model = _resolve(opts, env_map)
    env: dict[str, str] = {"ANTHROPIC_BASE_URL": root, "ANTHROPIC_MODEL": model}
    settings: dict[str, Any] = {"$schema": CLAUDE_SCHEMA, "env": env}
    if opts.include_key:
        env["ANTHROPIC_AUTH_TOKEN"] = _literal_key(opts, env_map)
    else:
        settings["apiKeyHelper"] = api_key_helper(opts.role)
        var = key_variable(opts.role, env_map)
        opts.notes.append(
            f"no key in the file: Claude Code runs apiKeyHelper, which prints the first key of ${ROLE_KEY_ENV[opts.role]} "
            f"(else ${FALLBACK_KEY_ENV}) at run time"
            + ("" if split_keys(env_map.get(var, "")) else f"; neither is set now: export {ROLE_KEY_ENV[opts.role]}=<key>")
        )
    deny = list(CLAUDE_DENY) + [f"Bash(curl {h})" if h.startswith("*") else f"Bash(curl *{h}*)" for h in opts.prod_hosts]
    deny += [f"WebFetch(domain:{h})" for h in opts.prod_hosts if "*" not in h]
    settings["permissions"] = {"allow": list(CLAUDE_ALLOW), "deny": deny}
    return settings


def export_claude_code(opts: ExportOptions, environ: Mapping[str, str] | None = None) -> str:
    return json.dumps(claude_settings(opts, environ), indent=2) + "\n"


def _toml_str(s: str) -> str:
    return json.dumps(s, ensure_ascii=True)  # a JSON string with ASCII escapes is a valid TOML basic string


def export_codex(opts: ExportOptions, environ: Mapping[str, str] | None = None) -> str:
    """Codex config.toml text."""
    env_map = dict(os.environ if environ is None else environ)
    _root, sdk, model = _resolve(opts, env_map)
    lines = [
        "# Codex CLI configuration for the TaoToken gateway, written by `kregress export-config --tool codex`.",
    ]
    table = [f"[model_providers.{PROVIDER_ID}]", f"name = {_toml_str(PROVIDER_NAME)}", f"base_url = {_toml_str(sdk)}"]
    if opts.include_key:
        table.append(f"experimental_bearer_token = {_toml_str(_literal_key(opts, env_map))}")
        lines.append("# This file holds a literal key (--include-key): keep it out of git.")
    else:
        var = opts.env_key or key_variable(opts.role, env_map)
        if not _ENV_NAME.match(var):
            raise ExportError(f"--env-key {var!r} is not a variable name (env_key names the variable that holds the key)")
        table.append(f"env_key = {_toml_str(var)}")
        lines.append(f"# The key is read from ${var} when Codex starts; it is not stored here.")
        held = split_keys(env_map.get(var, ""))
        if not held:
            opts.notes.append(f"{var} is not set now: export {var}=<key> before starting Codex")
        elif len(held) > 1:
            opts.notes.append(f"{var} holds {len(held)} keys; Codex sends the whole value as one token: point --env-key at a variable with one key")
    table.append(f"wire_api = {_toml_str(opts.wire_api)}")
    if opts.wire_api == "chat":
        opts.notes.append('wire_api = "chat" is deprecated and removed in current Codex releases; use it only with an old Codex')
    lines += [f"model = {_toml_str(model)}", f"model_provider = {_toml_str(PROVIDER_ID)}", "", *table]
    return "\n".join(lines) + "\n"


def export_cc_switch(opts: ExportOptions, environ: Mapping[str, str] | None = None) -> str:
    """A CC Switch store document (v2 shape) with one provider for Claude Code and one for Codex."""
    env_map = dict(os.environ if environ is None else environ)
    root, _sdk, _model = _resolve(opts, env_map)
    p = urlsplit(root)
    website = f"{p.scheme}://{p.netloc}"
    claude = claude_settings(opts, env_map)
    claude.pop("$schema", None)
    codex_opts = ExportOptions(**{**opts.__dict__, "notes": []})
    codex_toml = export_codex(codex_opts, env_map)
    auth: dict[str, str] = {}
    if opts.include_key:  # already in the TOML as experimental_bearer_token; CC Switch writes auth.json too
        auth["OPENAI_API_KEY"] = _literal_key(ExportOptions(role=opts.role), env_map)
    opts.notes += [n for n in codex_opts.notes if n not in opts.notes]
    note = f"written by kregress export-config; gateway {root}; role {opts.role}"

    def provider(settings: dict[str, Any]) -> dict[str, Any]:
        return {"id": PROVIDER_ID, "name": PROVIDER_NAME, "settingsConfig": settings, "websiteUrl": website,
                "category": "third_party", "notes": note}

    doc = {
        "version": 2,
        "claude": {"providers": {PROVIDER_ID: provider(claude)}, "current": PROVIDER_ID},
        "codex": {"providers": {PROVIDER_ID: provider({"auth": auth, "config": codex_toml})}, "current": PROVIDER_ID},
    }
    return json.dumps(doc, indent=2) + "\n"


EXPORTERS = {"claude-code": export_claude_code, "codex": export_codex, "cc-switch": export_cc_switch}
DEFAULT_FILENAMES = {"claude-code": "settings.json", "codex": "config.toml", "cc-switch": "cc-switch-taotoken.json"}


# --- lint ------------------------------------------------------------------------------------------------


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
            names = sorted(set(_SHELL_VAR.findall(helper)))
            if names and not any(split_keys(self.env.get(n, "")) for n in names):
                self.add(f"{pre}apiKeyHelper", "helper_vars_unset", f"apiKeyHelper reads ${', $'.join(names)}, and none of them is set in this environment",
                         f"export {names[0]}=<key> in the shell that starts Claude Code")
            if looks_like_key(helper) or any(s in helper for s in self.secrets):
                self.literal(f"{pre}apiKeyHelper", helper, "apiKeyHelper", "make the helper print the key from a variable, e.g. printf '%s' \"$TAOTOKEN_KEY_REVIEW\"")
        base = str(env.get("ANTHROPIC_BASE_URL") or "")
        third_party = bool(base) and "anthropic.com" not in base
        shell_auth = any(str(self.env.get(n) or "").strip() for n in ("ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_API_KEY"))
        if third_party and not token_names and not (isinstance(helper, str) and helper.strip()) and not shell_auth:
            self.add(f"{pre}env", "no_auth", "ANTHROPIC_BASE_URL points at a gateway but no key reaches Claude Code (no ANTHROPIC_AUTH_TOKEN, "
                     "no apiKeyHelper, nothing exported in this shell): it would send its own login to the gateway and get 401",
                     "add an apiKeyHelper that prints the key from $TAOTOKEN_KEY_REVIEW (`kregress export-config --tool claude-code` writes one)")
        self.scan_secrets(settings, prefix, "remove the key from the file; use apiKeyHelper reading $TAOTOKEN_KEY_REVIEW (or keep the file out of git)")
        perms = settings.get("permissions") or {}
        if isinstance(perms, dict):
            for i, rule in enumerate(perms.get("allow") or []):
                if isinstance(rule, str) and rule.replace(" ", "") in ("Bash", "Bash(*)", "Bash(:*)"):
                    self.add(f"{pre}permissions.allow[{i}]", "allow_all_bash", f"{rule!r} lets the agent run any shell command (rm, git push, kubectl ...) unasked",
                             "allow specific prefixes instead, e.g. Bash(git diff:*), Bash(pytest:*), Bash(kregress:*)")
                elif isinstance(rule, str) and re.match(r"^[a-z]\w*(\(|$)", rule):
                    self.add(f"{pre}permissions.allow[{i}]", "rule_syntax", f"{rule!r}: tool names are capitalised (Bash, Read, Grep ...), so this rule matches nothing",
                             f"write {rule[:1].upper() + rule[1:]!r}")

    # -- Codex -----------------------------------------------------------------------------------------
    def codex(self, text: str, prefix: str = "") -> None:
        pre = f"{prefix}." if prefix else ""
        try:
            cfg = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            self.add(prefix or "(file)", "parse_error", f"not valid TOML: {e}", "fix the syntax (every string quoted, one [table] header per table)")
            return
        for path, key, value in _walk(cfg):
            if "ANTHROPIC_" in key or (isinstance(value, str) and "ANTHROPIC_" in value):
                self.add(f"{pre}{path}", "wrong_tool_vars", "ANTHROPIC_* is Claude Code's variable; Codex does not read it",
                         "Codex reads the key from the variable named by env_key in [model_providers.<id>], e.g. env_key = \"TAOTOKEN_KEY_REVIEW\"")
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
                if looks_like_key(env_key) or any(s in env_key for s in self.secrets) or not _ENV_NAME.match(env_key.strip()):
                    self.literal(f"{where}.env_key", env_key, "env_key", "env_key takes the NAME of a variable, e.g. env_key = \"TAOTOKEN_KEY_REVIEW\"; export the key in that variable")
                elif "ANTHROPIC_" not in env_key:
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
            if wire is not None and wire not in WIRE_APIS:
                self.add(f"{where}.wire_api", "wire_api_unknown", f"wire_api = {wire!r} is not a Codex wire API", "use wire_api = \"responses\"")
            elif wire == "chat":
                self.add(f"{where}.wire_api", "wire_api_chat", "wire_api = \"chat\" is deprecated and rejected by current Codex releases",
                         "use wire_api = \"responses\" (the gateway must serve /v1/responses), or pin an older Codex")
        self.scan_secrets(cfg, prefix, "remove the key; set env_key = \"TAOTOKEN_KEY_REVIEW\" and export the key in that variable")

    # -- CC Switch -------------------------------------------------------------------------------------
    def cc_switch(self, doc: dict[str, Any]) -> None:
        apps = [a for a in ("claude", "codex") if isinstance(doc.get(a), dict)]
        for app in apps:
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
                where = f"{app}.providers.{pid}.settingsConfig"
                sc = prov.get("settingsConfig") if isinstance(prov, dict) else None
                if app == "claude":
                    self.claude(sc if sc is not None else {}, where)
                else:
                    sc = sc if isinstance(sc, dict) else {}
                    cfg_text = sc.get("config", "")
                    if isinstance(cfg_text, str) and cfg_text.strip():
                        self.codex(cfg_text, f"{where}.config")
                    auth = sc.get("auth") or {}
                    self.scan_secrets(auth, f"{where}.auth", "leave auth empty and let config.toml's env_key name the variable that holds the key")
                    for k, v in (auth.items() if isinstance(auth, dict) else []):
                        if str(k).startswith("ANTHROPIC_"):
                            self.add(f"{where}.auth.{k}", "wrong_tool_vars", f"{k} in Codex auth: Codex does not read ANTHROPIC_* variables",
                                     "Codex takes the key from env_key's variable (or OPENAI_API_KEY in auth)")


def lint_text(text: str, name: str = "<config>", environ: Mapping[str, str] | None = None, kind: str | None = None) -> list[Finding]:
    """Findings for one file's text. ``kind``: claude-code, codex or cc-switch (guessed from name and content when None)."""
    env = dict(os.environ if environ is None else environ)
    lint = _Linter(name, env)
    if kind is None:
        kind = "codex" if name.endswith(".toml") else None
    if kind == "codex":
        lint.codex(text)
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
            lint.cc_switch(doc)
    else:
        lint.claude(doc)
    return lint.findings


def lint_file(path: str | Path, environ: Mapping[str, str] | None = None, kind: str | None = None) -> list[Finding]:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        return [Finding(str(p), "(file)", "unreadable", f"cannot read the file ({type(e).__name__})", "check the path and permissions")]
    return lint_text(text, str(p), environ, kind)


__all__ = [
    "TOOLS", "EXPORTERS", "DEFAULT_FILENAMES", "ExportOptions", "ExportError", "Finding", "check_url", "lint_text", "lint_file",
    "export_claude_code", "export_codex", "export_cc_switch", "claude_settings", "mask_secret", "mask_url", "api_key_helper",
]
