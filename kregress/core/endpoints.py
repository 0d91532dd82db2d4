"""The gateway's endpoint and key rules, one definition shared by the gateway and the client tools.

Environment variable names, the default API root, how a configured URL becomes the SDK base (and which
URLs are refused, with the fix), how keys are read from a variable, how a key is fingerprinted and how
secrets and URLs are shown (never a character of a key). No Dagster, no Triton, no network.
"""

from __future__ import annotations

import hashlib
import re
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from kregress.core.names import ROLES

DEFAULT_ROOT = "https://taotoken.net/api"
BASE_URL_ENV = "TAOTOKEN_BASE_URL"
MODEL_ENV = "TAOTOKEN_MODEL_ID"
FALLBACK_KEY_ENV = "TAOTOKEN_API_KEY"
ROLE_KEY_ENV = {r: f"TAOTOKEN_KEY_{r.upper()}" for r in ROLES}
KNOWN_ENV = {BASE_URL_ENV, MODEL_ENV, FALLBACK_KEY_ENV, *ROLE_KEY_ENV.values()}
# Variables other tools read; a common mistake is to export one of these and expect the gateway to use it.
OTHER_TOOLS_ENV = ("OPENAI_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_API_KEY", "OPENROUTER_API_KEY", "DEEPSEEK_API_KEY")


# --- errors ----------------------------------------------------------------------------------------


class GatewayError(RuntimeError):
    """A model call that could not be made or failed; ``category`` is credentials, request, content or transient.

    The message is one line, ``[category] what happened. Fix: what to do`` (``one_line()``), so whatever shows
    only the first line of an error (a terminal, Dagster's step failure) shows all of it.
    """

    category = "gateway"
    default_fix = "see the message; the gateway settings are TAOTOKEN_BASE_URL, TAOTOKEN_MODEL_ID and TAOTOKEN_KEY_<ROLE>"

    def __init__(self, message: str, *, role: str = "", key_alias: str = "", status: int | None = None, kind: str = "") -> None:
        super().__init__(_one_line(message, self.category, self.default_fix))
        self.role = role
        self.key_alias = key_alias
        self.status = status
        self.kind = kind  # transient errors: rate_limited, server_error, timeout, connection

    def one_line(self) -> str:
        """``[category] what happened. Fix: ...`` on one line (what the CLI prints)."""
        return str(self)

    @property
    def what(self) -> str:
        return str(self).split("] ", 1)[-1].split(" Fix: ", 1)[0].rstrip(".")

    @property
    def fix(self) -> str:
        return str(self).split(" Fix: ", 1)[1] if " Fix: " in str(self) else ""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self)!r})"


def _one_line(message: str, category: str, default_fix: str) -> str:
    text = " ".join(str(message).split())
    if not text.startswith("["):
        text = f"[{category}] {text}"
    if " Fix: " not in text:
        text = f"{text.rstrip('.')}. Fix: {default_fix}"
    return text


class CredentialsError(GatewayError):
    category = "credentials"
    default_fix = "export TAOTOKEN_KEY_<ROLE>=<key>[,<key2>] (or TAOTOKEN_API_KEY for every role) with a current taotoken.net key"


class RequestError(GatewayError):
    category = "request"
    default_fix = "check TAOTOKEN_BASE_URL (the API root, e.g. https://taotoken.net/api), TAOTOKEN_MODEL_ID and the request parameters"


class ContentError(GatewayError):
    category = "content"
    default_fix = "show fewer history rows (search.top_k) or lower max_tokens for this role"


class RetriesExhausted(GatewayError):
    category = "transient"
    default_fix = "the service is overloaded or unreachable from here; try later or add keys for this role"


GATEWAY_ERROR_CATEGORIES = ("credentials", "request", "content", "transient")
# A classified gateway error's one line, wherever it was embedded (Dagster's step failure text, a log).
GATEWAY_ERROR_LINE = re.compile(r"\[(?:credentials|request|content|transient)\] [^\n]*? Fix: [^\n]*")


def gateway_error_line(text: str) -> str | None:
    """The first ``[class] ... Fix: ...`` line in ``text`` (e.g. a failed run's error), or None."""
    m = GATEWAY_ERROR_LINE.search(text or "")
    return m.group(0).strip() if m else None


# --- base URL ----------------------------------------------------------------------------------------


def resolve_base_url(url: str | None) -> tuple[str, str]:
    """(API root, SDK base) from what the user configured; refuses URLs that cannot be the API.

    ``https://taotoken.net/api`` -> (``https://taotoken.net/api``, ``https://taotoken.net/api/v1``);
    ``.../api/v1`` is accepted as well. Refused with a message that says what to write instead: a query
    string or fragment (e.g. ``?utm_source=...``), credentials in the URL, a duplicated ``/v1``, an
    endpoint path (``/chat/completions``), a site homepage with no API path, a non-http(s) scheme.
    """
    raw = (url or "").strip() or DEFAULT_ROOT
    example = f"use the API root, e.g. {DEFAULT_ROOT}"
    try:
        parts = urlsplit(raw)
    except ValueError:
        raise RequestError(f"[request] {BASE_URL_ENV}: not a URL. Fix: {example}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise RequestError(f"[request] {BASE_URL_ENV}: {raw[:80]!r} is not an http(s) URL. Fix: {example}")
    shown = urlunsplit((parts.scheme, parts.hostname + (f":{parts.port}" if parts.port else ""), parts.path, "", ""))
    if parts.username or parts.password:
        raise RequestError(
            f"[request] {BASE_URL_ENV}: the URL carries credentials (user:password@host); keys go in "
            f"TAOTOKEN_KEY_<ROLE> / {FALLBACK_KEY_ENV}, never in the URL. Fix: {example}"
        )
    if parts.query or parts.fragment:
        names = sorted({k for k, _ in parse_qsl(parts.query, keep_blank_values=True)})
        what = f"a query string (parameters: {', '.join(names)})" if parts.query else "a #fragment"
        raise RequestError(
            f"[request] {BASE_URL_ENV}: {shown} carries {what}, which looks copied from a browser link; "
            f"the API takes no query string. Fix: {example}"
        )
    segs = [s for s in parts.path.split("/") if s]
    if not segs:
        raise RequestError(
            f"[request] {BASE_URL_ENV}: {shown} is a site homepage with no API path. Fix: {example} "
            "(the gateway appends /v1 itself)"
        )
    for a, b in zip(segs, segs[1:]):
        if a == b:
            raise RequestError(f"[request] {BASE_URL_ENV}: {shown} has a duplicated /{a} in its path. Fix: {example}")
    if len(segs) >= 2 and segs[-2:] == ["chat", "completions"] or segs[-1] in ("completions", "models", "responses"):
        raise RequestError(f"[request] {BASE_URL_ENV}: {shown} is an endpoint, not the API root. Fix: {example}")
    if segs.count("v1") > 1:
        raise RequestError(f"[request] {BASE_URL_ENV}: {shown} has /v1 twice. Fix: {example}")
    origin = f"{parts.scheme}://{parts.netloc}"
    if segs[-1] == "v1":
        root = origin + "/" + "/".join(segs[:-1]) if segs[:-1] else origin
        return root.rstrip("/"), origin + "/" + "/".join(segs)
    if "v1" in segs:
        raise RequestError(f"[request] {BASE_URL_ENV}: {shown} has /v1 in the middle of its path. Fix: {example}")
    root = origin + "/" + "/".join(segs)
    return root, root + "/v1"


# --- keys ----------------------------------------------------------------------------------------------


def fingerprint(secret: str) -> str:
    """4 hex digits of the key's SHA-256: what aliases and masks show of a key."""
    return hashlib.sha256(secret.encode()).hexdigest()[:4]


def split_keys(value: str) -> list[str]:
    """The keys in a variable: comma, semicolon or whitespace separated, quotes and a "Bearer " prefix dropped."""
    out = []
    for part in re.split(r"[,;\s]+", value or ""):
        part = part.strip().strip("'\"")
        if part.lower().startswith("bearer"):
            part = part[len("bearer"):].strip()
        if part and part not in out:
            out.append(part)
    return out


# What a key looks like in free text (logs, files, exceptions): the one pattern every scan uses.
KEY_PATTERN = re.compile(r"\b(?:sk|tk|tt|pk|key)[-_][A-Za-z0-9_\-]{12,}|\bBearer\s+[A-Za-z0-9._~+/=-]{6,}", re.IGNORECASE)


def mask_secret(value: str) -> str:
    """How a secret is shown: never a character of it, only how many keys, its length and a fingerprint."""
    keys = split_keys(value)
    if not keys:
        return "set but empty"
    if len(keys) == 1:
        return f"set ({len(keys[0])} chars, fingerprint #{fingerprint(keys[0])})"
    prints = ", ".join(f"#{fingerprint(k)}" for k in keys)
    return f"set ({len(keys)} keys, fingerprints {prints})"


def mask_endpoint_url(value: str) -> str:
    """A URL with credentials dropped and query values hidden (their names kept: they explain the mistake)."""
    try:
        p = urlsplit(value.strip())
    except ValueError:
        return "(not a URL)"
    if not p.scheme or not p.hostname:
        return value.strip()[:80]
    host = p.hostname + (f":{p.port}" if p.port else "")
    cred = "<credentials>@" if (p.username or p.password) else ""
    out = f"{p.scheme}://{cred}{host}{p.path}"
    if p.query:
        out += "?" + "&".join(f"{k}=..." for k, _ in parse_qsl(p.query, keep_blank_values=True))
    if p.fragment:
        out += "#..."
    return out
