"""``kregress doctor``: is the gateway set up for what you use it for, and will each coding tool work?

    kregress doctor                      # environment (masked), base URL, model id, a key per role, tool configs
    kregress doctor --ping               # plus one tiny request per role and per configured tool
    kregress doctor --ping --tool codex  # only Codex: one request to /v1/responses, as Codex sends it

Tools and the request each ping sends (the endpoint that tool itself calls):

- ``kregress`` (strategy llm / hybrid): ``POST <root>/v1/chat/completions`` once per role, after
  ``GET /v1/models`` checks the model id is served.
- ``codex``: ``POST <root>/v1/responses`` (the Responses API; ``wire_api = "responses"``), bearer key.
- ``claude-code``: ``POST <root>/v1/messages`` in the Anthropic Messages shape, with ``x-api-key`` and
  ``Authorization: Bearer`` (what Claude Code sends with an apiKeyHelper) and ``anthropic-version``.

A tool is checked when ``--tool`` names it, or when its user config (``~/.codex/config.toml``,
``~/.claude/settings.json``) points at the TaoToken gateway (its lint findings are reported too); kregress
itself whenever a ``TAOTOKEN_*`` variable is set. With none set, the default keyless workflow (strategy
local, no model calls) is reported as fine for sweeps.

Exit status (the class of the first problem, in the order to fix them):

    0  the configured use works (or nothing needs the gateway: strategy local)
    2  configuration: base URL, model id, a TAOTOKEN_* typo, a tool config mistake, a refused request
    3  credentials: no key for a role or tool, key rejected (401) or not allowed (403)
    4  endpoint missing: the gateway has no such path (404 / an HTML page), e.g. no /v1/responses for Codex
    5  network or transient: cannot connect, timeout, rate limited (429), server error (5xx)

Keys never appear in the output: a key is shown as its length and a 4-hex-digit fingerprint.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence, TextIO

import tomllib

from kernel_assets.clients.common import env_state, helper_variables, is_secret_name, key_alias, looks_like_key, role_keys, scrub
from kernel_assets.clients.export import claude_user_settings, codex_user_config
from kernel_assets.clients.lint import Finding, check_url, lint_file
from kregress.core.endpoints import (
    BASE_URL_ENV,
    DEFAULT_ROOT,
    FALLBACK_KEY_ENV,
    KNOWN_ENV,
    MODEL_ENV,
    OTHER_TOOLS_ENV,
    ROLE_KEY_ENV,
    RequestError,
    mask_endpoint_url,
    mask_secret,
    resolve_base_url,
    split_keys,
)
from kregress.core.names import ROLES

if TYPE_CHECKING:  # the SDK is imported by the pings only: `kregress --help` stays fast
    import openai

EXIT_OK, EXIT_CONFIG, EXIT_CREDENTIALS, EXIT_ENDPOINT, EXIT_TRANSIENT = 0, 2, 3, 4, 5
EXIT_CODES = {"credentials": EXIT_CREDENTIALS, "config": EXIT_CONFIG, "endpoint": EXIT_ENDPOINT, "transient": EXIT_TRANSIENT}
ORDER = ("credentials", "config", "endpoint", "transient")  # the order to fix things in
DOCTOR_TOOLS = ("kregress", "codex", "claude-code")
ENV_PREFIXES = ("TAOTOKEN_", "ANTHROPIC_", "OPENAI_")
PING_TEXT = "Reply with the single word: pong"
ANTHROPIC_VERSION = "2023-06-01"
# lint findings that mean "no usable key reaches the tool"
_CREDENTIAL_CODES = {"no_auth", "env_key_unset", "env_key_multi", "helper_vars_unset", "empty_key", "placeholder", "wrong_tool_vars"}


@dataclass
class Problem:
    category: str  # credentials | config | endpoint | transient
    subject: str
    message: str
    fix: str

    def render(self, n: int) -> str:
        return f"  {n}. [{self.category}] {self.subject}: {self.message}\n     fix: {self.fix}"


@dataclass
class Target:
    """What one tool would send: to which URL, with which key and model (from its config, else the export defaults)."""

    tool: str
    base: str  # what the tool appends its endpoint path to (the SDK base, ending in /v1)
    path: str  # /chat/completions, /responses or /messages
    key: str | None
    key_source: str
    model: str
    notes: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.base.rstrip("/") + self.path


def split_fix(text: str, subject: str = "") -> tuple[str, str]:
    """An error 'message ... Fix: what to do' -> (message, fix), without a leading '[class]' or 'SUBJECT:'."""
    text = re.sub(r"^\[(credentials|request|content|transient|config|endpoint)\]\s*", "", str(text))
    if subject and text.startswith(f"{subject}: "):
        text = text[len(subject) + 2:]
    if " Fix: " in text:
        msg, fix = text.split(" Fix: ", 1)
        return msg.strip(), fix.strip()
    return text.strip(), ""


def _show_value(name: str, value: str) -> str:
    if value == "":
        return "set but empty"
    if is_secret_name(name) or looks_like_key(value):
        return mask_secret(value)
    if value.strip().lower().startswith(("http://", "https://")) or name.endswith(("_URL", "_BASE", "_HOST")):
        return mask_endpoint_url(value)
    return value if len(value) <= 80 else value[:77] + "..."


def _body_message(body: Any) -> str:
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict):
            return str(err.get("message") or err.get("type") or "")[:300]
        return str(err)[:300]
    return "" if body is None else str(body)[:300]


def classify(exc: BaseException, tool: str, target: Target) -> tuple[str, str, str]:
    """(class, what happened, fix) for a failed ping of ``tool``."""
    import openai

    path = ("/v1" if target.base.rstrip("/").endswith("/v1") else "") + target.path
    who = {"kregress": "kregress", "codex": "Codex", "claude-code": "Claude Code"}[tool]
    if isinstance(exc, openai.APITimeoutError):
        return ("transient", f"timed out: no answer from {path} within --timeout",
                "check the network path to the gateway (proxy: HTTPS_PROXY / NO_PROXY), then retry with a larger --timeout")
    if isinstance(exc, openai.APIConnectionError):
        return ("transient", f"could not connect to {mask_endpoint_url(target.url)}",
                f"check the host and port of {BASE_URL_ENV}, DNS and the proxy (HTTPS_PROXY); the service may be down")
    if isinstance(exc, openai.APIStatusError):
        status, said = exc.status_code, _body_message(exc.body)
        low = said.lower()
        head = f"HTTP {status} from POST {path}" + (f": {said}" if said else "")
        alias = target.key_source
        if status == 401:
            return ("credentials", f"{head}; the key ({alias}) was rejected",
                    f"put a complete, current taotoken.net key (not an OpenAI or Anthropic key) in {target.key_source.split(' ')[0]}")
        if status == 403:
            return ("credentials", f"{head}; the key ({alias}) is valid but not allowed this request",
                    f"top it up, enable model {target.model!r} for it, or use another key")
        if status == 429:
            return ("transient", "rate limited (HTTP 429): the key works but is over its rate or concurrency limit",
                    "wait and retry, or add keys for this role: TAOTOKEN_KEY_<ROLE>=k1,k2")
        if status >= 500:
            return "transient", f"server error (HTTP {status})", "the gateway is failing; retry later"
        if status == 404 and not re.search(r"model", low):
            if tool == "codex":
                return ("endpoint", f"{head}; the gateway has no {path}, the Responses API that Codex calls (wire_api = \"responses\" "
                        "is the only one current Codex loads)", "use a gateway (or a gateway plan) that serves /v1/responses for Codex")
            if tool == "claude-code":
                return ("endpoint", f"{head}; the gateway has no {path}, the Anthropic Messages API that Claude Code calls",
                        "use a gateway that serves /v1/messages for Claude Code")
            return ("endpoint", f"{head}; the path was not found",
                    f"{BASE_URL_ENV} must be the API root (e.g. {DEFAULT_ROOT}); kregress appends /v1{target.path}")
        if re.search(r"model", low):
            return "config", f"{head}; model id {target.model!r} is not served here", f"set {MODEL_ENV} to a model the gateway lists at /v1/models"
        return "config", f"{head}; the server refused the request as {who} sends it", f"check {BASE_URL_ENV} and {MODEL_ENV} ({target.model!r})"
    if isinstance(exc, openai.APIResponseValidationError):
        return "endpoint", f"{path} answered with something that is not an API reply", f"{BASE_URL_ENV} must be the API root (e.g. {DEFAULT_ROOT})"
    return "config", f"{type(exc).__name__}: {str(exc)[:200]}", f"check {BASE_URL_ENV} and {MODEL_ENV}"


def _client(base: str, key: str, timeout_s: float, headers: Mapping[str, str] | None = None) -> openai.OpenAI:
    import openai

    return openai.OpenAI(api_key=key, base_url=base, timeout=openai.Timeout(timeout_s, connect=min(10.0, timeout_s)),
                         max_retries=0, default_headers=dict(headers or {}))


def send_ping(target: Target, timeout_s: float) -> str:
    """One tiny request as ``target.tool`` sends it; returns what came back (raises the SDK's errors)."""
    import openai

    assert target.key is not None
    base, path = target.base, target.path
    if target.tool == "codex":
        with _client(base, target.key, timeout_s) as c:
            r = c.responses.create(model=target.model, input=PING_TEXT, max_output_tokens=16)
        return f"response {r.id or '-'}, {r.usage.input_tokens if r.usage else '?'}+{r.usage.output_tokens if r.usage else '?'} tokens"
    if target.tool == "claude-code":
        headers = {"x-api-key": target.key, "anthropic-version": ANTHROPIC_VERSION}
        with _client(base, target.key, timeout_s, headers) as c:
            body = c.post(path, cast_to=object, body={"model": target.model, "max_tokens": 8,
                                                             "messages": [{"role": "user", "content": PING_TEXT}]})
        if not (isinstance(body, dict) and body.get("type") == "message" and isinstance(body.get("content"), list)):
            raise openai.APIResponseValidationError(response=None, body=body, message="not an Anthropic Messages reply")  # type: ignore[arg-type]
        usage = body.get("usage") or {}
        return f"message {body.get('id') or '-'}, {usage.get('input_tokens', '?')}+{usage.get('output_tokens', '?')} tokens"
    with _client(base, target.key, timeout_s) as c:
        r = c.chat.completions.create(model=target.model, messages=[{"role": "user", "content": PING_TEXT}], max_tokens=8, temperature=0.0)
    usage = r.usage
    return f"request {r.id or '-'}, {usage.prompt_tokens if usage else '?'}+{usage.completion_tokens if usage else '?'} tokens"


# --- what each tool is configured to send -------------------------------------------------------------


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return ""


def _mentions_gateway(text: str, root: str) -> bool:
    host = (re.match(r"https?://([^/]+)", root) or [None, ""])[1]
    return "TAOTOKEN_" in text or (bool(host) and host in text) or "taotoken" in text.lower()


def codex_target(env: Mapping[str, str], root: str, sdk: str, model: str, role: str) -> Target:
    """Codex's active provider from its config when there is one, else what `export-config --tool codex` writes."""
    var, keys = role_keys(role, env)
    t = Target("codex", sdk, "/responses", keys[0] if keys else None, f"{key_alias(role, keys[0])} from {var}" if keys else var, model)
    path = codex_user_config(env)
    try:
        cfg = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError):
        return t
    prov = (cfg.get("model_providers") or {}).get(cfg.get("model_provider") or "")
    if not isinstance(prov, dict):
        return t
    t.notes.append(f"from {path}: provider {cfg.get('model_provider')!r}")
    if isinstance(prov.get("base_url"), str):
        t.base = prov["base_url"]
    t.model = str(cfg.get("model") or model)
    if isinstance(prov.get("experimental_bearer_token"), str):
        t.key, t.key_source = prov["experimental_bearer_token"], f"experimental_bearer_token in {path.name}"
    elif isinstance(prov.get("env_key"), str):
        name = prov["env_key"]
        value = (env.get(name) or "").strip()  # Codex sends the variable's whole value
        t.key, t.key_source = (value or None), f"${name}"
    return t


def claude_target(env: Mapping[str, str], root: str, model: str, role: str) -> Target:
    """What Claude Code sends: its user settings' env when present, else what `export-config --tool claude-code` writes."""
    var, keys = role_keys(role, env)
    t = Target("claude-code", root + "/v1", "/messages", keys[0] if keys else None, f"{key_alias(role, keys[0])} from {var}" if keys else var, model)
    path = claude_user_settings(env)
    try:
        settings = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        settings = {}
    senv = settings.get("env") if isinstance(settings, dict) and isinstance(settings.get("env"), dict) else {}
    base = str(senv.get("ANTHROPIC_BASE_URL") or env.get("ANTHROPIC_BASE_URL") or "").strip()
    if base:
        t.base = base.rstrip("/") + "/v1"
    t.model = str(senv.get("ANTHROPIC_MODEL") or env.get("ANTHROPIC_MODEL") or model)
    helper = settings.get("apiKeyHelper") if isinstance(settings, dict) else None
    token = next((str(src[n]) for src in (senv, env) for n in ("ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_API_KEY") if n in src), None)
    if isinstance(helper, str) and helper.strip():
        names = helper_variables(helper)
        held = next(((n, split_keys(env.get(n, ""))[0]) for n in names if split_keys(env.get(n, ""))), None)
        if held:
            t.key, t.key_source = held[1], f"${held[0]} (via apiKeyHelper, not run)"
        elif names:
            t.key, t.key_source = None, f"apiKeyHelper's ${', $'.join(names)}"
        t.notes.append(f"from {path}")
    elif token is not None:
        t.key, t.key_source = (token.strip() or None), "ANTHROPIC_AUTH_TOKEN"
    return t


# --- the diagnosis --------------------------------------------------------------------------------------


def run_doctor(
    *,
    ping: bool = False,
    timeout_s: float = 20.0,
    roles: Sequence[str] | None = None,
    tools: Sequence[str] | None = None,
    tool_role: str = "review",
    environ: Mapping[str, str] | None = None,
    out: TextIO | None = None,
) -> int:
    """Print the diagnosis; return the exit code (module docstring)."""
    do_ping = ping
    out = out or sys.stdout
    env = dict(os.environ if environ is None else environ)
    roles = list(roles or ROLES)
    problems: list[Problem] = []
    explicit = list(tools or [])

    def say(line: str = "") -> None:
        print(scrub(line, env), file=out)

    # 1. environment, masked
    names = sorted(n for n in env if n.startswith(ENV_PREFIXES))
    say("Environment (TAOTOKEN_*, ANTHROPIC_*, OPENAI_*; keys masked)")
    if not names:
        say("  (none of these variables is set)")
    width = max([len(n) for n in names] + [20])
    for n in names:
        note = "   (read by Claude Code)" if n.startswith("ANTHROPIC_") else "   (read by Codex / OpenAI tools)" if n.startswith("OPENAI_") else ""
        say(f"  {n:<{width}} {_show_value(n, env[n])}{note}")
    tool_files = {"codex": codex_user_config(env), "claude-code": claude_user_settings(env)}
    tool_texts = {t: _read(p) for t, p in tool_files.items()}
    for n in names:  # a variable a tool config names (env_key, apiKeyHelper) is read by that tool, not a typo
        if n.startswith("TAOTOKEN_") and n not in KNOWN_ENV and not any(re.search(rf"\b{n}\b", t) for t in tool_texts.values()):
            problems.append(Problem("credentials" if "KEY" in n else "config", n, "is set but the gateway does not read it (a typo?)",
                                    f"rename it to one of: {', '.join(sorted(KNOWN_ENV))}"))
    for n, tool in (("ANTHROPIC_BASE_URL", "claude"), ("OPENAI_BASE_URL", "openai"), ("OPENAI_API_BASE", "openai")):
        if env.get(n, "").strip():
            for code, problem, fix in check_url(env[n], tool):
                problems.append(Problem("config", n, f"[{code}] {problem}", fix))
    wants_gateway = any(env.get(n, "").strip() for n in names if n.startswith("TAOTOKEN_")) or bool(explicit)

    # 2. base URL and model id
    say()
    say("Gateway")
    configured_base = env.get(BASE_URL_ENV, "").strip()
    url_ok, root, sdk = True, DEFAULT_ROOT, DEFAULT_ROOT + "/v1"
    try:
        root, sdk = resolve_base_url(configured_base or DEFAULT_ROOT)
        say(f"  base URL   ok: API root {root}, SDK base {sdk}{'' if configured_base else ' (default)'}")
    except RequestError as e:
        url_ok = False
        msg, fix = split_fix(str(e), BASE_URL_ENV)
        say(f"  base URL   WRONG: {msg}")
        problems.append(Problem("config", BASE_URL_ENV, msg, fix))
    model = env.get(MODEL_ENV, "").strip()
    say(f"  model id   {model or ('MISSING' if wants_gateway else 'not set (needed only for strategy llm / hybrid and the coding tools)')}")
    if not wants_gateway:
        say()
        say("Strategy local (the default) makes no model calls and needs no gateway: sweeps are fine as set up.")
        say(f"  For strategy llm / hybrid or a coding tool: export TAOTOKEN_KEY_<ROLE> (or {FALLBACK_KEY_ENV}) and {MODEL_ENV}; "
            "`kregress doctor --tool codex` checks one tool.")
        return _summary(problems, say, do_ping)
    if not model:
        problems.append(Problem("config", MODEL_ENV, "no model id is configured (the gateway never guesses one)",
                                f"export {MODEL_ENV}=<a model id served at the gateway's /v1/models>"))

    checked = list(explicit) if explicit else ["kregress"]
    if not explicit:
        checked += [t for t, text in tool_texts.items() if text and _mentions_gateway(text, root)]

    # 3. keys per role (kregress itself)
    say()
    say("Keys per role" + ("" if "kregress" in checked else " (not checked: kregress is not among --tool)"))
    for role in roles if "kregress" in checked else []:
        var, keys = role_keys(role, env)
        if keys:
            fallback = " (fallback for every role)" if var != ROLE_KEY_ENV[role] else ""
            say(f"  {role:<8} ok: {', '.join(key_alias(role, k) for k in keys)} from {var}{fallback}")
        else:
            say(f"  {role:<8} MISSING")
            hint = f"{env_state(ROLE_KEY_ENV[role], env)}; {env_state(FALLBACK_KEY_ENV, env)} (fallback for all roles)"
            problems.append(Problem("credentials", f"role {role}", f"no TAOTOKEN key for role {role}: {hint}",
                                    f"export {ROLE_KEY_ENV[role]}=<key>[,<key2>] (or {FALLBACK_KEY_ENV} for every role)"))
    other = [n for n in OTHER_TOOLS_ENV if env.get(n, "").strip()]
    if other:
        say(f"  note: {', '.join(other)} {'is' if len(other) == 1 else 'are'} set, but that is another tool's variable; "
            f"the gateway reads only TAOTOKEN_KEY_<ROLE> and {FALLBACK_KEY_ENV}")

    # 4. the coding tools: which are checked, and their config files
    say()
    say("Tools")
    for tool, path in tool_files.items():
        text = tool_texts[tool]
        if tool in checked and text:
            findings: list[Finding] = lint_file(path, env, "codex" if tool == "codex" else "claude-code")
            say(f"  {tool:<12} {path}: {len(findings)} finding(s)" if findings else f"  {tool:<12} {path}: lint clean")
            for f in findings:
                problems.append(Problem("credentials" if f.code in _CREDENTIAL_CODES else "config", f"{path.name}: {f.where}",
                                        f"[{f.code}] {f.problem}", f.fix))
        elif tool in checked:
            say(f"  {tool:<12} no {path} (pinged with what `kregress export-config --tool {tool}` writes)")
    say(f"  checked: {', '.join(checked)}")

    # 5. pings
    if do_ping:
        say()
        say(f"Ping (one tiny request per role and per tool, timeout {timeout_s:g}s)")
        if not url_ok or not model:
            say("  skipped: fix the base URL and the model id first (every ping would fail the same way)")
        else:
            _pings(checked, roles, tool_role, env, root, sdk, model, timeout_s, problems, say)
    return _summary(problems, say, do_ping)


def _pings(checked: list[str], roles: list[str], tool_role: str, env: Mapping[str, str], root: str, sdk: str, model: str,
           timeout_s: float, problems: list[Problem], say: Any) -> None:
    targets: list[tuple[str, Target]] = []
    if "kregress" in checked:
        served = _served_models(env, roles, sdk, timeout_s)
        if served is not None and model not in served:
            sample = ", ".join(sorted(served)[:12]) + (" ..." if len(served) > 12 else "")
            say(f"  models   {model!r} is not served at {sdk} ({len(served)} models)")
            problems.append(Problem("config", MODEL_ENV, f"model id {model!r} is not served at {sdk} ({len(served)} models are: {sample or 'none'})",
                                    f"set {MODEL_ENV} to one of them (the gateway never guesses a model)"))
            for role in roles:
                say(f"  {role:<8} FAIL (config): model id {model!r} is not served")
        else:
            for role in roles:
                var, keys = role_keys(role, env)
                targets.append((role, Target("kregress", sdk, "/chat/completions", keys[0] if keys else None,
                                             f"{key_alias(role, keys[0])} from {var}" if keys else var, model)))
    if "codex" in checked:
        targets.append(("codex", codex_target(env, root, sdk, model, tool_role)))
    if "claude-code" in checked:
        targets.append(("claude", claude_target(env, root, model, tool_role)))
    for label, t in targets:
        shown = mask_endpoint_url(t.url)
        if t.key is None:
            say(f"  {label:<8} skipped: no key ({t.key_source})")
            if t.tool != "kregress":
                problems.append(Problem("credentials", f"ping {t.tool}", f"no key reaches {t.tool}: {t.key_source} holds none",
                                        f"export {ROLE_KEY_ENV[tool_role]}=<key> (what `kregress export-config --tool {t.tool}` reads)"))
            continue
        t0 = time.perf_counter()
        try:
            what = send_ping(t, timeout_s)
            say(f"  {label:<8} ok in {(time.perf_counter() - t0) * 1000:.0f} ms (POST {shown}, {what})")
        except Exception as exc:  # classified below; nothing is retried
            category, msg, fix = classify(exc, t.tool, t)
            say(f"  {label:<8} FAIL ({category}): {msg}")
            problems.append(Problem(category, f"ping {label}", msg, fix))


def _served_models(env: Mapping[str, str], roles: list[str], sdk: str, timeout_s: float) -> list[str] | None:
    """The gateway's model list (GET /v1/models), or None when it cannot be read (the chat ping then tells)."""
    import openai

    key = next((role_keys(r, env)[1][0] for r in roles if role_keys(r, env)[1]), None)
    if key is None:
        return None
    try:
        with _client(sdk, key, timeout_s) as c:
            return [m.id for m in c.models.list().data]
    except (openai.OpenAIError, ValueError, TypeError, AttributeError):
        return None


def _summary(problems: list[Problem], say: Any, pinged: bool) -> int:
    say()
    if not problems:
        say("Everything looks right." + ("" if pinged else " (run with --ping to try one request per role and tool)"))
        return EXIT_OK
    problems.sort(key=lambda p: ORDER.index(p.category))
    say(f"Problems, in the order to fix them (credentials, config, endpoint, transient): {len(problems)}")
    for i, p in enumerate(problems, 1):
        say(p.render(i))
    code = EXIT_CODES[problems[0].category]
    say(f"exit {code} ({problems[0].category})")
    return code
