"""The model gateway: OpenAI-compatible chat completions through taotoken.net (the openai SDK).

One place to configure (``TaotokenResource``): the API root (default ``$TAOTOKEN_BASE_URL``, else
https://taotoken.net/api; the SDK base ``.../api/v1`` is derived from it), the model id
(``$TAOTOKEN_MODEL_ID``; missing or unknown is an error, never a guessed name), timeouts (connect 10 s,
read 120 s), ``max_tokens`` per task type and the retry policy.

Keys come from the environment, per role: ``TAOTOKEN_KEY_SUGGEST``, ``TAOTOKEN_KEY_REPORT``,
``TAOTOKEN_KEY_REVIEW`` (several keys each, comma or whitespace separated), ``TAOTOKEN_API_KEY`` as the
fallback for every role. Logs, errors, the ledger and reports show a key alias (``suggest#3f9a``: role +
4 hex digits of the key's SHA-256), never the key.

``Gateway.chat`` owns the retries (the SDK's ``max_retries`` is 0): 429, 408, 5xx, timeouts and dropped
connections back off exponentially with jitter (Retry-After honoured), cool the key down and fail over
to another key of the role. 400, 401, 403, 404, 422 (and other 4xx) are never retried; they raise a
``CredentialsError``, ``RequestError`` or ``ContentError`` whose text says what to fix, diagnosed in that
order. Before anything is sent the call's estimate (prompt estimate + max_tokens) is reserved in the
ledger (atomically across processes); a prompt that does not fit is rebuilt with fewer history rows,
and if even that does not fit no call is made (``BudgetExceeded``). Responses are cached in the ledger
by request hash, so a re-run does not pay twice. Every attempt is one ledger row.
"""

from __future__ import annotations

import email.utils
import hashlib
import json
import logging
import os
import random
import re
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import dagster as dg
import httpx2
import openai
from pydantic import Field

from kregress.core.endpoints import (  # noqa: F401  (re-exported: the gateway's public names)
    BASE_URL_ENV,
    DEFAULT_ROOT,
    FALLBACK_KEY_ENV,
    KEY_PATTERN,
    KNOWN_ENV,
    MODEL_ENV,
    OTHER_TOOLS_ENV,
    ROLE_KEY_ENV,
    ContentError,
    CredentialsError,
    GatewayError,
    RequestError,
    RetriesExhausted,
    fingerprint,
    resolve_base_url,
    split_keys,
)
from kregress.core.names import ROLES
from kregress.core.records import UsageRecord
from kregress.core.spec import Budget
from resources.ledger import CACHE_ALIAS, BudgetExceeded, Ledger, LedgerResource, Reservation

__all__ = [
    "ROLES",
    "DEFAULT_ROOT",
    "ApiKey",
    "KeyPool",
    "CallContext",
    "ChatResult",
    "Gateway",
    "TaotokenResource",
    "GatewayError",
    "CredentialsError",
    "RequestError",
    "ContentError",
    "RetriesExhausted",
    "BudgetExceeded",
    "resolve_base_url",
    "estimate_tokens",
    "estimate_messages_tokens",
    "request_hash",
]

RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504}) | frozenset(range(520, 530))

log_default = logging.getLogger("kregress.gateway")


# --- token estimates and request hashing ---------------------------------------------------------

_PIECE = re.compile(r"[A-Za-z]+|\d+|\s+|[^\sA-Za-z\d]")


def estimate_tokens(text: str) -> int:
    """A conservative token count for BPE tokenizers (no tokenizer download needed).

    Letters: one token per word of up to 6 letters, one more per further 6; digits: one per 3 (how
    BPE vocabularies split numbers); each punctuation or symbol character one (CJK two); whitespace runs
    longer than one character one (a single space merges with the next word). It over-counts a little
    against real tokenizers, the safe side for a budget reservation; settlement uses the real usage.
    """
    n = 0
    for m in _PIECE.finditer(text or ""):
        s = m.group()
        c = s[0]
        if c.isascii() and c.isalpha():
            n += 1 + (len(s) - 1) // 6
        elif c.isascii() and c.isdigit():
            n += (len(s) + 2) // 3
        elif c.isspace():
            n += 1 if len(s) > 1 else 0
        else:
            n += 2 if ord(c) >= 0x2E80 else 1
    return n


def estimate_messages_tokens(messages: Sequence[Mapping[str, Any]]) -> int:
    """Prompt tokens of a chat request: content plus a few tokens of framing per message."""
    return sum(4 + estimate_tokens(str(m.get("content") or "")) for m in messages) + 3


def request_hash(model: str, messages: Sequence[Mapping[str, Any]], params: Mapping[str, Any]) -> str:
    """Cache key: the model, the messages and the parameters that change the answer (never a key)."""
    blob = json.dumps({"v": 1, "model": model, "messages": list(messages), "params": dict(params)}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


# --- keys --------------------------------------------------------------------------------------------


class ApiKey:
    """One API key. ``repr``/``str`` show only the alias; the secret is read with ``reveal()``."""

    __slots__ = ("role", "alias", "env_var", "_secret")

    def __init__(self, role: str, secret: str, env_var: str, alias: str) -> None:
        self.role = role
        self.alias = alias
        self.env_var = env_var
        self._secret = secret

    def reveal(self) -> str:
        return self._secret

    def __repr__(self) -> str:
        return f"<ApiKey {self.alias} from {self.env_var}>"

    __str__ = __repr__

    def __reduce__(self) -> Any:
        raise TypeError(f"{self!r} cannot be pickled: keys stay in the process that read them from the environment")


class KeyPool:
    """Keys per role with per-key cooldowns; picks the least recently used key that is not cooling down."""

    def __init__(self, keys: dict[str, list[ApiKey]], environ: Mapping[str, str] | None = None) -> None:
        self._keys = {r: list(keys.get(r, [])) for r in ROLES}
        self._env_names = {k: bool(v) for k, v in (environ or {}).items() if k.startswith("TAOTOKEN_") or k in OTHER_TOOLS_ENV}
        self._env_keycount = {
            name: len(split_keys((environ or {}).get(name, ""))) for name in [FALLBACK_KEY_ENV, *ROLE_KEY_ENV.values()]
        }
        self._cool_until: dict[str, float] = {}
        self._last_used: dict[str, float] = {}
        self._use_counter = 0

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> KeyPool:
        env = dict(os.environ if environ is None else environ)
        fallback = split_keys(env.get(FALLBACK_KEY_ENV, ""))
        keys: dict[str, list[ApiKey]] = {}
        for role in ROLES:
            var = ROLE_KEY_ENV[role]
            secrets, source = split_keys(env.get(var, "")), var
            if not secrets:
                secrets, source = fallback, FALLBACK_KEY_ENV
            seen: set[str] = set()
            out = []
            for s in secrets:
                alias = f"{role}#{fingerprint(s)}"
                n = 2
                while alias in seen:
                    alias = f"{role}#{fingerprint(s)}-{n}"
                    n += 1
                seen.add(alias)
                out.append(ApiKey(role, s, source, alias))
            keys[role] = out
        return cls(keys, env)

    # -- queries -----------------------------------------------------------------------------
    def keys(self, role: str) -> list[ApiKey]:
        return list(self._keys.get(role, []))

    def has(self, role: str) -> bool:
        return bool(self._keys.get(role))

    def aliases(self, role: str | None = None) -> list[str]:
        roles = [role] if role else list(ROLES)
        return [k.alias for r in roles for k in self._keys.get(r, [])]

    def __repr__(self) -> str:
        inner = ", ".join(f"{r}: [{', '.join(self.aliases(r))}]" for r in ROLES)
        return f"KeyPool({inner})"

    def scrub_exact(self, text: str) -> str:
        """Replace every key this pool holds with ``<alias>`` (used on model output: nothing else is touched)."""
        text = str(text)
        for r in ROLES:
            for k in self._keys[r]:
                if k.reveal() and k.reveal() in text:
                    text = text.replace(k.reveal(), f"<{k.alias}>")
        return text

    def scrub(self, text: str) -> str:
        """Replace every key this pool holds (and anything shaped like a bearer token) with an alias / mask."""
        return KEY_PATTERN.sub("<redacted>", self.scrub_exact(text))

    # -- scheduling --------------------------------------------------------------------------
    def pick(self, role: str, now: float) -> tuple[ApiKey, float]:
        """(key, seconds to wait before using it): a free key if any, else the one that cools down first."""
        keys = self._keys.get(role) or []
        if not keys:
            raise CredentialsError(self.no_key_message(role), role=role)
        free = [k for k in keys if self._cool_until.get(k.alias, 0.0) <= now]
        if free:
            key = min(free, key=lambda k: self._last_used.get(k.alias, -1.0))
            wait = 0.0
        else:
            key = min(keys, key=lambda k: self._cool_until[k.alias])
            wait = self._cool_until[key.alias] - now
        self._use_counter += 1
        self._last_used[key.alias] = self._use_counter
        return key, wait

    def cool(self, key: ApiKey, until: float) -> None:
        self._cool_until[key.alias] = max(until, self._cool_until.get(key.alias, 0.0))

    def cooldown_remaining(self, alias: str, now: float) -> float:
        return max(0.0, self._cool_until.get(alias, 0.0) - now)

    # -- diagnosis ---------------------------------------------------------------------------
    def _env_state(self, name: str) -> str:
        if name not in self._env_names:
            return f"{name} is not set"
        if not self._env_names[name] or not self._env_keycount.get(name):
            return f"{name} is set but empty"
        n = self._env_keycount[name]
        return f"{name} is set ({n} key{'s' if n != 1 else ''})"

    def env_notes(self) -> list[str]:
        notes = []
        other = [n for n in OTHER_TOOLS_ENV if self._env_names.get(n)]
        if other:
            notes.append(
                f"{', '.join(other)} {'is' if len(other) == 1 else 'are'} set, but that is another tool's variable; "
                f"the gateway reads only TAOTOKEN_KEY_<ROLE> and {FALLBACK_KEY_ENV}"
            )
        unknown = sorted(n for n in self._env_names if n.startswith("TAOTOKEN_") and n not in KNOWN_ENV)
        for n in unknown:
            notes.append(f"{n} is set but the gateway does not read it (known: {', '.join(sorted(KNOWN_ENV))})")
        return notes

    def credentials_hint(self, role: str) -> str:
        var = ROLE_KEY_ENV.get(role, "TAOTOKEN_KEY_<ROLE>")
        parts = [self._env_state(var), self._env_state(FALLBACK_KEY_ENV) + " (fallback for all roles)"]
        used = self._keys.get(role) or []
        if used:
            parts.append(f"role {role} uses {used[0].env_var}")
        return "; ".join(parts) + "".join(f". Note: {n}" for n in self.env_notes())

    def no_key_message(self, role: str) -> str:
        var = ROLE_KEY_ENV.get(role, "TAOTOKEN_KEY_<ROLE>")
        return (
            f"[credentials] no TAOTOKEN key for role {role}: {self.credentials_hint(role)}. "
            f"Fix: export {var}=<key>[,<key2>] (or {FALLBACK_KEY_ENV} for every role)."
        )


# --- calls -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CallContext:
    """Who is calling: what the ledger row and the budget scope are keyed by."""

    run_id: str = ""
    partition: str = ""
    round: int = 0  # 1..N for suggest rounds; 0 for the report / review calls (sweep budget only)
    task: str = ""  # e.g. "round_2_suggestions", "verdict_report"
    sweep: str = ""  # budget scope; default: run_id, else partition

    @property
    def scope(self) -> str:
        return self.sweep or self.run_id or self.partition or "default"


@dataclass
class ChatResult:
    text: str
    role: str
    model: str
    key_alias: str
    request_id: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    finish_reason: str = ""
    cache_hit: bool = False
    attempts: int = 0
    rows: int | None = None  # history rows the prompt was built with (when a builder was given)
    estimated_prompt_tokens: int = 0
    max_tokens: int = 0
    latency_ms: float = 0.0
    truncated: bool = False
    usage_estimated: bool = False


@dataclass
class _Outcome:
    ok: bool
    kind: str = ""  # ok, rate_limited, server_error, timeout, connection, http_error, invalid_response
    status: int | None = None
    retry_after: float | None = None
    body_text: str = ""
    request_id: str = ""
    text: str = ""
    finish_reason: str = ""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    truncated: bool = False
    error: GatewayError | None = None


def _retry_after(headers: Mapping[str, str] | None, now_wall: float) -> float | None:
    if not headers:
        return None
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    ra = headers.get("retry-after")
    if not ra:
        return None
    try:
        return max(0.0, float(ra))
    except ValueError:
        try:
            dt = email.utils.parsedate_to_datetime(ra)
            return max(0.0, dt.timestamp() - now_wall)
        except (TypeError, ValueError):
            return None


def _body_message(body: Any) -> tuple[str, str]:
    """(message, code) from an error body in OpenAI's shape or whatever the server sent."""
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict):
            return str(err.get("message") or err.get("detail") or json.dumps(err)[:300]), str(err.get("code") or err.get("type") or "")
        return str(err), ""
    if body is None:
        return "", ""
    text = str(body)
    if "<html" in text.lower():
        title = re.search(r"<title>(.*?)</title>", text, re.IGNORECASE | re.DOTALL)
        return f"an HTML page{f' ({title.group(1).strip()[:80]})' if title else ''}", "html"
    return text[:300], ""


class Gateway:
    """Chat completions with key failover, retries, budgets, a response cache and one ledger row per attempt."""

    def __init__(
        self,
        *,
        base_url: str,
        model_id: str,
        keys: KeyPool,
        ledger: Ledger,
        connect_timeout_s: float = 10.0,
        read_timeout_s: float = 120.0,
        max_tokens: Mapping[str, int] | None = None,
        temperature: float = 0.2,
        stream: bool = False,
        max_attempts: int = 5,
        backoff_base_s: float = 1.0,
        backoff_max_s: float = 60.0,
        max_retry_after_s: float = 300.0,
        max_response_chars: int = 200_000,
        verify_model: bool = True,
        use_cache: bool = True,
        log: Any = None,
        sleep: Callable[[float], None] | None = None,
        clock: Callable[[], float] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.root, self.sdk_base = resolve_base_url(base_url)
        self.model = (model_id or "").strip()
        self.keys = keys
        self.ledger = ledger
        self.timeout = openai.Timeout(read_timeout_s, connect=connect_timeout_s)
        self.max_tokens = {"suggest": 1536, "report": 1024, "review": 1536, **dict(max_tokens or {})}
        self.temperature = temperature
        self.stream = stream
        self.max_attempts = max(1, int(max_attempts))
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        self.max_retry_after_s = max_retry_after_s
        self.max_response_chars = max_response_chars
        self.verify_model = verify_model
        self.use_cache = use_cache
        self.log = log or log_default
        self.sleep = sleep or time.sleep
        self.clock = clock or time.monotonic
        self.rng = rng or random.Random()
        self._clients: dict[str, openai.OpenAI] = {}
        self._model_checked = False

    def __repr__(self) -> str:
        return f"Gateway(root={self.root!r}, model={self.model!r}, keys={self.keys!r}, ledger={self.ledger!r})"

    # -- small helpers -----------------------------------------------------------------------
    def has_key(self, role: str) -> bool:
        return self.keys.has(role)

    def aliases(self, role: str | None = None) -> list[str]:
        return self.keys.aliases(role)

    def close(self) -> None:
        for c in self._clients.values():
            c.close()
        self._clients.clear()

    def _say(self, level: str, msg: str) -> None:
        getattr(self.log, level)(self.keys.scrub(msg))

    def _client(self, key: ApiKey) -> openai.OpenAI:
        c = self._clients.get(key.alias)
        if c is None:
            c = openai.OpenAI(api_key=key.reveal(), base_url=self.sdk_base, timeout=self.timeout, max_retries=0)
            self._clients[key.alias] = c
        return c

    def backoff(self, n: int) -> float:
        """Delay before retry n (0-based): exponential, capped, with 'equal jitter' (half fixed, half random)."""
        d = min(self.backoff_max_s, self.backoff_base_s * (2**n))
        return d * (0.5 + 0.5 * self.rng.random())

    # -- diagnosis ---------------------------------------------------------------------------
    def classify(self, status: int | None, body_text: str, code: str, role: str, key: ApiKey | None, *, path: str, est_prompt: int = 0, max_tokens: int = 0) -> GatewayError:
        """A non-retryable HTTP answer -> the error that says what to fix (credentials, then request, then content)."""
        alias = key.alias if key else ""
        where = f"HTTP {status} from POST {self.sdk_base}{path}" if path.endswith("completions") else f"HTTP {status} from GET {self.sdk_base}{path}"
        said = f": {body_text}" if body_text else ""
        low = f"{body_text} {code}".lower()
        head = f"{where} (role {role}, key {alias or '-'}, model {self.model or '-'}){said}."
        # 1. credentials
        if status in (401, 403) or (status == 400 and re.search(r"api[ _-]?key|unauthori[sz]ed|authenticat|invalid.*token", low)):
            if status == 403 or re.search(r"quota|balance|insufficient|permission|forbidden|not allowed", low):
                fix = (
                    f"key {alias} is valid but not allowed this request (permissions, quota or balance for model {self.model!r}); "
                    f"top it up, enable the model for it, or use another key. {self.keys.credentials_hint(role)}."
                )
            else:
                fix = (
                    f"key {alias} was rejected. {self.keys.credentials_hint(role)}. Make sure the variable holds a complete, "
                    "current taotoken.net API key (not an OpenAI or Anthropic key)."
                )
            return CredentialsError(self.keys.scrub(f"[credentials] {head} Fix: {fix}"), role=role, key_alias=alias, status=status)
        # 2. request: base URL / path, model id, parameters
        if status == 404 or code == "html" or re.search(r"model", low) and re.search(r"not (?:found|exist|support|available)|does not exist|unknown|invalid|no such", low):
            if re.search(r"model", low) and code != "html":
                fix = (
                    f"model id {self.model!r} is not served here; set {MODEL_ENV} to one that is "
                    f"(GET {self.sdk_base}/models lists them). The gateway never guesses a model."
                )
            else:
                fix = (
                    f"the path was not found: {BASE_URL_ENV} must be the API root (e.g. {DEFAULT_ROOT}); the gateway "
                    f"appends /v1 and the SDK appends {path}. Currently root={self.root}."
                )
            return RequestError(self.keys.scrub(f"[request] {head} Fix: {fix}"), role=role, key_alias=alias, status=status)
        # 3. content
        if status == 413 or re.search(r"context[_ ]length|maximum context|too many tokens|too long|prompt is too|reduce the length|max_tokens", low):
            fix = (
                f"the prompt is too large for the model (about {est_prompt} tokens estimated + max_tokens {max_tokens}); "
                "show fewer history rows (search.top_k) or lower max_tokens for this role."
            )
            return ContentError(self.keys.scrub(f"[content] {head} Fix: {fix}"), role=role, key_alias=alias, status=status)
        if re.search(r"json|response_format|schema", low):
            fix = "the request asked for JSON output in a form the server does not accept; drop response_format or check the message format."
            return ContentError(self.keys.scrub(f"[content] {head} Fix: {fix}"), role=role, key_alias=alias, status=status)
        fix = (
            f"the server refused the request as sent; check {BASE_URL_ENV} (root={self.root}), {MODEL_ENV} ({self.model!r}) "
            "and the parameters (max_tokens, temperature) against what the server supports."
        )
        return RequestError(self.keys.scrub(f"[request] {head} Fix: {fix}"), role=role, key_alias=alias, status=status)

    def _check_model(self, role: str) -> None:
        if not self.model:
            raise RequestError(
                f"[request] no model id configured: set {MODEL_ENV} (or TaotokenResource(model_id=...)) to a model served at "
                f"{self.sdk_base}/models. The gateway never guesses a model.",
                role=role,
            )
        if self._model_checked or not self.verify_model:
            return
        key, _ = self.keys.pick(role, self.clock())
        served: list[str] | None = None
        err: GatewayError | None = None
        try:
            page = self._client(key).models.list()
            served = [m.id for m in page.data]
        except openai.APIStatusError as e:
            status = e.status_code
            if status in (401, 403):
                msg, code = _body_message(e.body)
                err = self.classify(status, self.keys.scrub(msg)[:300], code, role, key, path="/models")
            else:
                self._say("debug", f"model list unavailable (HTTP {status}); the model id is checked by the first call")
        except (openai.APIConnectionError, openai.APIResponseValidationError, ValueError, TypeError, AttributeError) as e:
            self._say("debug", f"model list unavailable ({type(e).__name__}); the model id is checked by the first call")
        if err is not None:
            raise err
        self._model_checked = True
        if served is not None and self.model not in served:
            sample = ", ".join(sorted(served)[:12]) + (" ..." if len(served) > 12 else "")
            raise RequestError(
                f"[request] model id {self.model!r} is not served at {self.sdk_base} ({len(served)} models are: {sample or 'none'}). "
                f"Fix: set {MODEL_ENV} to one of them. The gateway never guesses a model.",
                role=role,
            )

    # -- one attempt -------------------------------------------------------------------------
    def _attempt(self, key: ApiKey, body: dict[str, Any], role: str, est_prompt: int) -> _Outcome:
        client = self._client(key)
        now_wall = time.time()
        try:
            if self.stream:
                return self._attempt_stream(client, body)
            raw = client.chat.completions.with_raw_response.create(**body)
            request_id = raw.headers.get("x-request-id", "")
            completion = raw.parse()
        except openai.APITimeoutError:
            return _Outcome(False, "timeout")
        except openai.APIConnectionError:
            return _Outcome(False, "connection")
        except httpx2.TimeoutException:  # raised while reading a stream
            return _Outcome(False, "timeout")
        except httpx2.TransportError:
            return _Outcome(False, "connection")
        except openai.APIStatusError as e:
            status = e.status_code
            msg, code = _body_message(e.body)
            msg = self.keys.scrub(msg)[:300]
            ra = _retry_after(e.response.headers, now_wall)
            rid = e.response.headers.get("x-request-id", "")
            if status in RETRYABLE_STATUS:
                return _Outcome(False, "rate_limited" if status == 429 else ("timeout" if status == 408 else "server_error"), status, ra, msg, rid)
            err = self.classify(status, msg, code, role, key, path="/chat/completions", est_prompt=est_prompt, max_tokens=body.get("max_tokens", 0))
            return _Outcome(False, err.category, status, None, msg, rid, error=err)
        except openai.APIResponseValidationError as e:
            err = RequestError(
                self.keys.scrub(f"[request] the server at {self.sdk_base} answered with data that is not a chat completion "
                                f"(HTTP {e.status_code}). Fix: check {BASE_URL_ENV}; it must be the OpenAI-compatible API root, e.g. {DEFAULT_ROOT}."),
                role=role, key_alias=key.alias, status=e.status_code,
            )
            return _Outcome(False, "request", e.status_code, error=err)
        return self._read_completion(completion, request_id, role, key)

    def _read_completion(self, completion: Any, request_id: str, role: str, key: ApiKey) -> _Outcome:
        choices = getattr(completion, "choices", None)
        if isinstance(completion, (str, bytes)) or not choices:
            what = "an HTML/text page" if isinstance(completion, (str, bytes)) else "a JSON object with no choices"
            err = RequestError(
                f"[request] POST {self.sdk_base}/chat/completions answered with {what}, not a chat completion. "
                f"Fix: {BASE_URL_ENV} must be the OpenAI-compatible API root, e.g. {DEFAULT_ROOT} (root now: {self.root}).",
                role=role, key_alias=key.alias, status=200,
            )
            return _Outcome(False, "request", 200, error=err)
        choice = choices[0]
        msg = getattr(choice, "message", None)
        text = (getattr(msg, "content", None) or "") if msg is not None else ""
        usage = getattr(completion, "usage", None)
        truncated = len(text) > self.max_response_chars
        return _Outcome(
            True,
            "ok",
            200,
            request_id=request_id or str(getattr(completion, "id", "") or ""),
            text=self.keys.scrub_exact(text[: self.max_response_chars]),
            finish_reason=str(getattr(choice, "finish_reason", "") or ""),
            prompt_tokens=getattr(usage, "prompt_tokens", None) if usage else None,
            completion_tokens=getattr(usage, "completion_tokens", None) if usage else None,
            truncated=truncated,
        )

    def _attempt_stream(self, client: openai.OpenAI, body: dict[str, Any]) -> _Outcome:
        raw = client.chat.completions.with_raw_response.create(**body, stream=True, stream_options={"include_usage": True})
        request_id = raw.headers.get("x-request-id", "")
        stream = raw.parse()
        chunks: list[str] = []
        size = 0
        finish = ""
        pt = ct = None
        truncated = False
        cid = ""
        try:
            for chunk in stream:
                cid = cid or str(getattr(chunk, "id", "") or "")
                for ch in getattr(chunk, "choices", None) or []:
                    delta = getattr(ch, "delta", None)
                    piece = getattr(delta, "content", None) or ""
                    if piece:
                        chunks.append(piece)
                        size += len(piece)
                    if getattr(ch, "finish_reason", None):
                        finish = ch.finish_reason
                usage = getattr(chunk, "usage", None)
                if usage:
                    pt, ct = usage.prompt_tokens, usage.completion_tokens
                if size > self.max_response_chars:
                    truncated = True
                    break
        finally:
            stream.close()
        text = self.keys.scrub_exact("".join(chunks)[: self.max_response_chars])
        return _Outcome(True, "ok", 200, request_id=request_id or cid, text=text, finish_reason=finish, prompt_tokens=pt, completion_tokens=ct, truncated=truncated)

    # -- the call ----------------------------------------------------------------------------
    def chat(
        self,
        role: str,
        messages: Sequence[Mapping[str, Any]] | Callable[[int], Sequence[Mapping[str, Any]]],
        *,
        ctx: CallContext | None = None,
        budget: Budget | None = None,
        max_tokens: int | None = None,
        max_rows: int | None = None,
        temperature: float | None = None,
        response_format: Mapping[str, Any] | None = None,
        use_cache: bool | None = None,
    ) -> ChatResult:
        """One chat completion for ``role``.

        ``messages`` is a list of {"role", "content"} dicts, or a builder ``rows -> messages``; with a builder
        the prompt is first built with ``max_rows`` history rows and rebuilt with fewer while it does not
        fit the round's budget. Raises BudgetExceeded (nothing sent), CredentialsError / RequestError /
        ContentError (not retried) or RetriesExhausted.
        """
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}; allowed: {', '.join(ROLES)}")
        ctx = ctx or CallContext()
        if not self.keys.has(role):
            raise CredentialsError(self.keys.no_key_message(role), role=role)
        self._check_model(role)
        mt = int(max_tokens or self.max_tokens.get(role, 1024))
        temp = self.temperature if temperature is None else temperature
        cache_on = self.use_cache if use_cache is None else use_cache
        params: dict[str, Any] = {"max_tokens": mt, "temperature": temp}
        if response_format:
            params["response_format"] = dict(response_format)

        if callable(messages):
            top = max(0, int(max_rows if max_rows is not None else 8))
            candidates = list(range(top, -1, -1)) if top <= 32 else sorted({top, *(top >> i for i in range(1, 12)), 0}, reverse=True)
        else:
            candidates = [None]

        reservation: Reservation | None = None
        for i, rows in enumerate(candidates):
            msgs = [dict(m) for m in (messages(rows) if callable(messages) else messages)]  # type: ignore[operator]
            for m in msgs:
                if not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                    raise ValueError("each message needs a 'role' and a string 'content'")
            est = estimate_messages_tokens(msgs)
            h = request_hash(self.model, msgs, params)
            if cache_on:
                hit = self.ledger.cache_get(h)
                if hit is not None:
                    return self._cache_hit(hit, role, ctx, rows, est, mt)
            try:
                reservation = self.ledger.reserve(
                    sweep=ctx.scope, round=ctx.round, est_input=est, est_output=mt, budget=budget, run_id=ctx.run_id,
                    partition=ctx.partition, role=role, task=ctx.task, record_refusal=(i == len(candidates) - 1),
                )
                break
            except BudgetExceeded as e:
                if i == len(candidates) - 1:
                    tried = f" (tried {candidates[0]}..{rows} history rows)" if callable(messages) else ""
                    self._say("warning", f"{role}: no call made: {e.reason}{tried}")
                    raise BudgetExceeded(e.reason + tried, scope=e.scope, round=e.round) from None
        assert reservation is not None
        if callable(messages) and rows != candidates[0]:
            self._say("info", f"{role}: prompt shrunk to {rows} history rows to fit the round budget")

        body = {"model": self.model, "messages": msgs, **params}
        used_in = used_out = 0
        try:
            result = self._send(role, body, ctx, reservation, est, mt)
            used_in, used_out = result.prompt_tokens, result.completion_tokens
        finally:
            self.ledger.settle(reservation, used_in, used_out)
        result.rows = rows
        if cache_on and result.text and not result.truncated:
            self.ledger.cache_put(h, model=self.model, role=role, content=result.text, finish_reason=result.finish_reason,
                                  request_id=result.request_id, prompt_tokens=result.prompt_tokens, completion_tokens=result.completion_tokens)
        return result

    def _cache_hit(self, hit: dict[str, Any], role: str, ctx: CallContext, rows: int | None, est: int, mt: int) -> ChatResult:
        self.ledger.record(
            UsageRecord(ts=time.time(), run_id=ctx.run_id, partition=ctx.partition, round=ctx.round, role=role, task=ctx.task,  # type: ignore[arg-type]
                        key_alias=CACHE_ALIAS, model=self.model, request_id=hit["request_id"], attempt=1, status="ok", cache_hit=True),
            sweep=ctx.scope,
        )
        self._say("info", f"{role}: response served from the cache (request {hit['request_id'] or '-'}); no tokens spent")
        return ChatResult(text=hit["content"], role=role, model=self.model, key_alias=CACHE_ALIAS, request_id=hit["request_id"],
                          finish_reason=hit["finish_reason"], cache_hit=True, attempts=0, rows=rows, estimated_prompt_tokens=est, max_tokens=mt)

    def _send(self, role: str, body: dict[str, Any], ctx: CallContext, reservation: Reservation, est: int, mt: int) -> ChatResult:
        failures = 0
        attempt = 0
        while True:
            attempt += 1
            key, wait = self.keys.pick(role, self.clock())
            if wait > 0:
                self._say("info", f"{role}: every key is cooling down; waiting {wait:.2f}s for {key.alias}")
                self.sleep(wait)
            t0 = time.perf_counter()
            out = self._attempt(key, body, role, est)
            latency = (time.perf_counter() - t0) * 1000.0
            usage_estimated = out.ok and (out.prompt_tokens is None or out.completion_tokens is None)
            pt = out.prompt_tokens if out.prompt_tokens is not None else (est if out.ok else 0)
            ct = out.completion_tokens if out.completion_tokens is not None else (estimate_tokens(out.text) if out.ok else 0)
            self.ledger.record(
                UsageRecord(
                    ts=time.time(), run_id=ctx.run_id, partition=ctx.partition, round=ctx.round, role=role, task=ctx.task,  # type: ignore[arg-type]
                    key_alias=key.alias, model=self.model, request_id=out.request_id, prompt_tokens=int(pt), completion_tokens=int(ct),
                    total_tokens=int(pt) + int(ct), latency_ms=round(latency, 2), attempt=attempt,
                    status="ok" if out.ok else "error",
                    error_class=("usage_estimated" if usage_estimated else "") if out.ok else (out.kind + (f":{out.status}" if out.status else "")),
                ),
                sweep=ctx.scope, reservation_id=reservation.id,
            )
            if out.ok:
                self._say("info", f"{role}: {key.alias} ok in {latency:.0f} ms (attempt {attempt}, {pt}+{ct} tokens, request {out.request_id or '-'})")
                return ChatResult(
                    text=out.text, role=role, model=self.model, key_alias=key.alias, request_id=out.request_id, prompt_tokens=int(pt),
                    completion_tokens=int(ct), total_tokens=int(pt) + int(ct), finish_reason=out.finish_reason, attempts=attempt,
                    estimated_prompt_tokens=est, max_tokens=mt, latency_ms=latency, truncated=out.truncated, usage_estimated=usage_estimated,
                )
            if out.error is not None:
                self._say("error", str(out.error))
                raise out.error
            what = out.kind + (f" (HTTP {out.status})" if out.status else "")
            if out.retry_after is not None and out.retry_after > self.max_retry_after_s:
                raise RetriesExhausted(
                    f"[transient] {role}: {key.alias} got {what} with Retry-After {out.retry_after:.0f}s, beyond max_retry_after_s "
                    f"{self.max_retry_after_s:.0f}s; not waiting. Fix: try later, add keys for this role, or raise max_retry_after_s.",
                    role=role, key_alias=key.alias, status=out.status,
                )
            if attempt >= self.max_attempts:
                raise RetriesExhausted(
                    f"[transient] {role}: gave up after {attempt} attempts (last: {what} on {key.alias}"
                    f"{': ' + out.body_text if out.body_text else ''}). Fix: the service is overloaded or unreachable from here; "
                    f"try later, add keys to TAOTOKEN_KEY_{role.upper()}, or raise max_attempts / read_timeout_s.",
                    role=role, key_alias=key.alias, status=out.status,
                )
            delay = out.retry_after if out.retry_after is not None else self.backoff(failures)
            failures += 1
            self.keys.cool(key, self.clock() + delay)
            others = [k.alias for k in self.keys.keys(role) if k.alias != key.alias and self.keys.cooldown_remaining(k.alias, self.clock()) <= 0]
            nxt = f"failing over to {others[0]}" if others else "retrying"
            self._say("warning", f"{role}: {key.alias} {what} on attempt {attempt}; cooling it down {delay:.2f}s"
                      f"{' (Retry-After)' if out.retry_after is not None else ''}, {nxt}")


# --- the Dagster resource -------------------------------------------------------------------------------


def _env_base_url() -> str:
    return os.environ.get(BASE_URL_ENV, "").strip() or DEFAULT_ROOT


def _env_model() -> str:
    return os.environ.get(MODEL_ENV, "").strip()


class TaotokenResource(dg.ConfigurableResource):
    """The model gateway's configuration (no keys: they are read from the environment when a gateway is made)."""

    base_url: str = Field(default_factory=_env_base_url, description=f"API root (default ${BASE_URL_ENV}, else {DEFAULT_ROOT}); /v1 is derived")
    model_id: str = Field(default_factory=_env_model, description=f"model id (default ${MODEL_ENV}); required for llm calls, never guessed")
    connect_timeout_s: float = Field(default=10.0, gt=0)
    read_timeout_s: float = Field(default=120.0, gt=0)
    max_tokens_suggest: int = Field(default=1536, gt=0)
    max_tokens_report: int = Field(default=1024, gt=0)
    max_tokens_review: int = Field(default=1536, gt=0)
    temperature: float = Field(default=0.2, ge=0)
    stream: bool = Field(default=False, description="streaming responses; off for batch work")
    max_attempts: int = Field(default=5, ge=1, description="attempts per call, failovers included")
    backoff_base_s: float = Field(default=1.0, ge=0)
    backoff_max_s: float = Field(default=60.0, ge=0)
    max_retry_after_s: float = Field(default=300.0, ge=0)
    max_response_chars: int = Field(default=200_000, gt=0)
    verify_model: bool = Field(default=True, description="check the model id against GET /models once per gateway")
    use_cache: bool = Field(default=True, description="serve identical requests from the ledger's response cache")

    def key_pool(self, environ: Mapping[str, str] | None = None) -> KeyPool:
        return KeyPool.from_env(environ)

    def has_key(self, role: str, environ: Mapping[str, str] | None = None) -> bool:
        return self.key_pool(environ).has(role)

    def get_gateway(
        self,
        ledger: Ledger | None = None,
        *,
        log: Any = None,
        environ: Mapping[str, str] | None = None,
        sleep: Callable[[float], None] | None = None,
        clock: Callable[[], float] | None = None,
        rng: random.Random | None = None,
    ) -> Gateway:
        """A gateway with the keys in the environment now (``environ`` overrides os.environ, for tests)."""
        return Gateway(
            base_url=self.base_url,
            model_id=self.model_id,
            keys=KeyPool.from_env(environ),
            ledger=ledger if ledger is not None else LedgerResource().get_ledger(),
            connect_timeout_s=self.connect_timeout_s,
            read_timeout_s=self.read_timeout_s,
            max_tokens={"suggest": self.max_tokens_suggest, "report": self.max_tokens_report, "review": self.max_tokens_review},
            temperature=self.temperature,
            stream=self.stream,
            max_attempts=self.max_attempts,
            backoff_base_s=self.backoff_base_s,
            backoff_max_s=self.backoff_max_s,
            max_retry_after_s=self.max_retry_after_s,
            max_response_chars=self.max_response_chars,
            verify_model=self.verify_model,
            use_cache=self.use_cache,
            log=log,
            sleep=sleep,
            clock=clock,
            rng=rng,
        )
