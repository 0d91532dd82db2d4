"""``kregress export-config``: a Claude Code or Codex configuration for the TaoToken gateway.

Formats (current tools; Claude Code 2.1, Codex CLI 0.171):

- Claude Code ``settings.json``: ``env`` (ANTHROPIC_BASE_URL, ANTHROPIC_AUTH_TOKEN, ANTHROPIC_MODEL; Claude
  Code appends ``/v1/messages`` to the base URL), ``apiKeyHelper`` (a command run by ``/bin/sh`` whose output
  is sent as ``X-Api-Key`` and ``Authorization: Bearer``), ``permissions.allow`` / ``permissions.deny`` rules
  ``Tool`` or ``Tool(specifier)``. User settings live in ``~/.claude/settings.json`` (``$CLAUDE_CONFIG_DIR``);
  a project's ``.claude/settings.json`` permission rules apply only once that workspace is trusted.
- Codex ``config.toml``: ``model``, ``model_provider`` and ``[model_providers.<id>]`` with ``name``,
  ``base_url`` (Codex appends ``/responses``, so it ends in ``/v1``), ``env_key`` (the NAME of the variable
  holding the key) and ``wire_api = "responses"`` (the only wire API current Codex loads). User config lives
  in ``~/.codex/config.toml`` (``$CODEX_HOME``).

No exported file holds a key unless ``include_key`` is asked for (the key then comes from the environment).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from kernel_assets.clients.common import ENV_NAME, PROVIDER_ID, PROVIDER_NAME, role_keys
from kregress.core.endpoints import BASE_URL_ENV, DEFAULT_ROOT, FALLBACK_KEY_ENV, MODEL_ENV, ROLE_KEY_ENV, RequestError, resolve_base_url, split_keys

CLAUDE_SCHEMA = "https://json.schemastore.org/claude-code-settings.json"
WIRE_APIS = ("responses",)
# What current Codex says when it refuses a config with wire_api = "chat" (codex-rs model provider info).
CODEX_CHAT_REMOVED = '`wire_api = "chat"` is no longer supported.\nHow to fix: set `wire_api = "responses"` in your provider config.'

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


class ExportError(ValueError):
    """An export that cannot be written as asked; the message says what to set or pass."""


def claude_user_settings(environ: Mapping[str, str]) -> Path:
    """Where Claude Code reads user-level settings: ``$CLAUDE_CONFIG_DIR/settings.json``, else ``~/.claude/settings.json``."""
    base = environ.get("CLAUDE_CONFIG_DIR", "").strip()
    home = Path(environ.get("HOME") or Path.home())
    return (Path(base).expanduser() if base else home / ".claude") / "settings.json"


def codex_user_config(environ: Mapping[str, str]) -> Path:
    """Where Codex reads its config: ``$CODEX_HOME/config.toml``, else ``~/.codex/config.toml``."""
    base = environ.get("CODEX_HOME", "").strip()
    home = Path(environ.get("HOME") or Path.home())
    return (Path(base).expanduser() if base else home / ".codex") / "config.toml"


def api_key_helper(role: str) -> str:
    """A /bin/sh command printing the role's first key from the environment at run time (never stored).

    Reads ``$TAOTOKEN_KEY_<ROLE>``, else ``$TAOTOKEN_API_KEY`` (the gateway's order). With neither set it
    prints nothing on stdout, says what to export on stderr and exits 1 (never an empty key).
    """
    own = ROLE_KEY_ENV[role]
    return (
        f"k=$(printf '%s' \"${{{own}:-${FALLBACK_KEY_ENV}}}\" | tr ',; ' '\\n\\n\\n' | grep -m1 .) && printf '%s\\n' \"$k\" || "
        f"{{ echo 'kregress apiKeyHelper: no key: export {own}=<key> (or {FALLBACK_KEY_ENV}) in the shell that starts Claude Code' >&2; exit 1; }}"
    )


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


def no_model_note(tool: str) -> str:
    """What a model-less export means for ``tool`` (the file never guesses a model id)."""
    return (f"no model id (--model or {MODEL_ENV}): the file names none, so {tool} asks the gateway for its own default "
            f"model; if the gateway does not serve that one, export again with --model ID (an id the gateway lists "
            f"at /v1/models) or set {MODEL_ENV}")


def resolve(opts: ExportOptions, environ: Mapping[str, str]) -> tuple[str, str, str]:
    """(API root, SDK base, model) for the export; the model is "" when neither --model nor the environment
    names one (the file then sets none). Raises ExportError with the fix."""
    base = (opts.base_url or environ.get(BASE_URL_ENV, "") or DEFAULT_ROOT).strip()
    try:
        root, sdk = resolve_base_url(base)
    except RequestError as e:
        raise ExportError(str(e).removeprefix("[request] ")) from None
    model = (opts.model or environ.get(MODEL_ENV, "")).strip()
    if opts.role not in ROLE_KEY_ENV:
        raise ExportError(f"unknown role {opts.role!r}; allowed: {', '.join(ROLE_KEY_ENV)}")
    if opts.wire_api == "chat":
        raise ExportError(f"--wire-api chat: current Codex refuses to load such a config: {CODEX_CHAT_REMOVED.replace(chr(10), chr(32))} (drop --wire-api)")
    if opts.wire_api not in WIRE_APIS:
        raise ExportError(f"wire_api {opts.wire_api!r} is unknown; Codex loads only: {', '.join(WIRE_APIS)}")
    return root, sdk, model


def literal_key(opts: ExportOptions, environ: Mapping[str, str], where: str = "the file") -> str:
    var, keys = role_keys(opts.role, environ)
    if not keys:
        raise ExportError(f"--include-key: no key for role {opts.role} in {ROLE_KEY_ENV[opts.role]} or {FALLBACK_KEY_ENV}; export one first")
    note = (f"{where} contains the literal key from {var} (asked for with --include-key): keep it out of git "
            "and readable only by you")
    if note not in opts.notes:
        opts.notes.append(note)
    return keys[0]


def key_variable(role: str, environ: Mapping[str, str]) -> str:
    """The variable a coding tool should read the role's key from (its own variable, else the fallback when set)."""
    return role_keys(role, environ)[0]


def claude_settings(opts: ExportOptions, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Claude Code settings.json as a dict."""
    env_map = dict(os.environ if environ is None else environ)
    root, _sdk, model = resolve(opts, env_map)
    env: dict[str, str] = {"ANTHROPIC_BASE_URL": root}
    if model:
        env["ANTHROPIC_MODEL"] = model
    elif (note := no_model_note("Claude Code")) not in opts.notes:
        opts.notes.append(note)
    settings: dict[str, Any] = {"$schema": CLAUDE_SCHEMA, "env": env}
    if opts.include_key:
        env["ANTHROPIC_AUTH_TOKEN"] = literal_key(opts, env_map)
    else:
        settings["apiKeyHelper"] = api_key_helper(opts.role)
        _var, keys = role_keys(opts.role, env_map)
        opts.notes.append(
            f"no key in the file: Claude Code runs apiKeyHelper, which prints the first key of ${ROLE_KEY_ENV[opts.role]} "
            f"(else ${FALLBACK_KEY_ENV}) at run time"
            + ("" if keys else f"; neither is set now, so it would fail: export {ROLE_KEY_ENV[opts.role]}=<key> first")
        )
    deny = list(CLAUDE_DENY) + [f"Bash(curl {h})" if h.startswith("*") else f"Bash(curl *{h}*)" for h in opts.prod_hosts]
    deny += [f"WebFetch(domain:{h})" for h in opts.prod_hosts if "*" not in h]
    settings["permissions"] = {"allow": list(CLAUDE_ALLOW), "deny": deny}
    return settings


def export_claude_code(opts: ExportOptions, environ: Mapping[str, str] | None = None) -> str:
    return json.dumps(claude_settings(opts, environ), indent=2) + "\n"


def merge_claude_settings(existing: dict[str, Any], ours: dict[str, Any]) -> dict[str, Any]:
    """Our env, helper and permission rules merged into a user's settings (their other settings kept)."""
    out = dict(existing)
    out.setdefault("$schema", ours["$schema"])
    env = dict(out.get("env") or {})
    env.update(ours["env"])
    if "ANTHROPIC_AUTH_TOKEN" not in ours["env"]:
        env.pop("ANTHROPIC_AUTH_TOKEN", None)  # a stale token would win over the helper
    out["env"] = env
    if "apiKeyHelper" in ours:
        out["apiKeyHelper"] = ours["apiKeyHelper"]
    else:
        out.pop("apiKeyHelper", None)
    perms = dict(out.get("permissions") or {})
    for kind in ("allow", "deny"):
        have = list(perms.get(kind) or [])
        perms[kind] = have + [r for r in ours["permissions"][kind] if r not in have]
    out["permissions"] = perms
    return out


def _toml_str(s: str) -> str:
    return json.dumps(s, ensure_ascii=True)  # a JSON string with ASCII escapes is a valid TOML basic string


def export_codex(opts: ExportOptions, environ: Mapping[str, str] | None = None) -> str:
    """Codex config.toml text."""
    env_map = dict(os.environ if environ is None else environ)
    _root, sdk, model = resolve(opts, env_map)
    lines = ["# Codex CLI configuration for the TaoToken gateway, written by `kregress export-config --tool codex`."]
    table = [f"[model_providers.{PROVIDER_ID}]", f"name = {_toml_str(PROVIDER_NAME)}", f"base_url = {_toml_str(sdk)}"]
    if opts.include_key:
        table.append(f"experimental_bearer_token = {_toml_str(literal_key(opts, env_map))}")
        lines.append("# This file holds a literal key (--include-key): keep it out of git.")
    else:
        var = opts.env_key or key_variable(opts.role, env_map)
        if not ENV_NAME.match(var):
            raise ExportError(f"--env-key {var!r} is not a variable name (env_key names the variable that holds the key)")
        table.append(f"env_key = {_toml_str(var)}")
        lines.append(f"# The key is read from ${var} when Codex starts; it is not stored here.")
        held = split_keys(env_map.get(var, ""))
        if not held:
            opts.notes.append(f"{var} is not set now: export {var}=<key> before starting Codex")
        elif len(held) > 1:
            opts.notes.append(f"{var} holds {len(held)} keys; Codex sends the whole value as one token: point --env-key at a variable with one key")
    table.append(f"wire_api = {_toml_str('responses')}")
    if model:
        lines.append(f"model = {_toml_str(model)}")
    else:
        lines.append(f"# No model here: Codex uses its default. Pin one: model = \"<id>\" (an id the gateway serves, {MODEL_ENV}).")
        if (note := no_model_note("Codex")) not in opts.notes:
            opts.notes.append(note)
    lines += [f"model_provider = {_toml_str(PROVIDER_ID)}", "", *table]
    return "\n".join(lines) + "\n"
