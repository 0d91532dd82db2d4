"""What an HTTP answer from an OpenAI-compatible server means, and the one-line error that says what to fix.

Classification reads, in this order: the HTTP status, the error body's ``code`` / ``type`` / ``param``
fields (OpenAI: ``{"error": {"message", "type", "param", "code"}}``; vLLM: the same fields at the top level
or under ``error`` with ``type: "BadRequestError"`` and a numeric ``code``; OpenRouter: ``{"error": {"code":
402, "message", "metadata"}}``), and only then the message text. ``classify`` returns None for answers
worth retrying (408, 429 without a quota code, 5xx).
"""

from __future__ import annotations

import email.utils
import json
import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from kregress.core.endpoints import (
    BASE_URL_ENV,
    DEFAULT_ROOT,
    MODEL_ENV,
    ContentError,
    CredentialsError,
    GatewayError,
    RequestError,
)

RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504}) | frozenset(range(520, 530))

# error-body codes / types, as OpenAI-compatible servers send them (lower-cased before the lookup)
CREDENTIAL_CODES = frozenset({
    "invalid_api_key", "authentication_error", "authenticationerror", "unauthorized", "permission_denied",
    "permissiondeniederror", "insufficient_quota", "billing_hard_limit_reached", "account_deactivated", "access_terminated",
    "insufficient_balance", "payment_required",
})
MODEL_CODES = frozenset({"model_not_found", "model_not_available", "unknown_model", "invalid_model"})
LENGTH_CODES = frozenset({"context_length_exceeded", "string_above_max_length", "request_too_large", "tokens_exceeded"})
MODERATION_CODES = frozenset({"content_filter", "content_policy_violation", "moderation", "flagged"})
MAX_TOKENS_PARAMS = ("max_tokens", "max_completion_tokens")

_MODEL_MISSING = re.compile(
    r"\bmodel\b[^.;]{0,80}?\b(?:not found|does not exist|is not (?:served|available|supported)|not supported|unknown)"
    r"|\b(?:unknown|invalid|no such|unsupported) model\b|\bnot a valid model\b",
    re.I,
)
_LENGTH = re.compile(r"context[_ ]length|maximum context|too many tokens|prompt is too long|reduce the length|input is too long", re.I)
_MAX_TOKENS = re.compile(r"\bmax_(?:completion_)?tokens\b", re.I)
_CREDENTIAL_TEXT = re.compile(r"api[ _-]?key|unauthori[sz]ed|authenticat|invalid.*token", re.I)
_QUOTA_TEXT = re.compile(r"quota|balance|insufficient|credits|permission|forbidden|not allowed", re.I)


@dataclass(frozen=True)
class ErrorBody:
    message: str = ""
    code: str = ""  # the body's code (a string code, or "" when numeric/absent)
    type: str = ""
    param: str = ""
    flagged: bool = False  # OpenRouter moderation metadata
    html: bool = False

    @property
    def codes(self) -> set[str]:
        return {c.lower() for c in (self.code, self.type) if c}


def parse_error_body(body: Any) -> ErrorBody:
    """The fields of an error body in OpenAI's shape (or vLLM's, OpenRouter's), or of whatever the server sent."""
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict):
            code = err.get("code")
            meta = err.get("metadata") if isinstance(err.get("metadata"), dict) else {}
            return ErrorBody(
                message=str(err.get("message") or err.get("detail") or json.dumps(err)[:300]),
                code="" if code is None or isinstance(code, (int, float)) else str(code),
                type=str(err.get("type") or ""),
                param=str(err.get("param") or ""),
                flagged=bool(meta.get("flagged_input") or meta.get("reasons")),
            )
        return ErrorBody(message=str(err))
    if body is None:
        return ErrorBody()
    text = str(body)
    if "<html" in text.lower():
        title = re.search(r"<title>(.*?)</title>", text, re.IGNORECASE | re.DOTALL)
        return ErrorBody(message=f"an HTML page{f' ({title.group(1).strip()[:80]})' if title else ''}", html=True)
    return ErrorBody(message=text[:300])


def retry_after(headers: Mapping[str, str] | None, now_wall: float) -> float | None:
    """Seconds to wait from Retry-After-Ms / Retry-After (seconds or an HTTP date), or None."""
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
            return max(0.0, email.utils.parsedate_to_datetime(ra).timestamp() - now_wall)
        except (TypeError, ValueError):
            return None


@dataclass(frozen=True)
class Where:
    """What the error text names: the endpoint, the role, the key alias, the model, the request's sizes."""

    sdk_base: str
    root: str
    model: str
    role: str
    alias: str = ""
    path: str = "/chat/completions"
    est_prompt: int = 0
    max_tokens: int = 0
    credentials_hint: str = ""
    scrub: Callable[[str], str] = str


def classify(status: int | None, body: ErrorBody, w: Where) -> GatewayError | None:
    """A non-retryable answer -> the error that says what to fix; None when the answer is worth retrying."""
    codes = body.codes
    if status in RETRYABLE_STATUS and not (codes & CREDENTIAL_CODES):
        return None
    method = "POST" if w.path.endswith("completions") else "GET"
    said = f": {w.scrub(body.message)[:300].rstrip('.')}" if body.message else ""
    head = f"HTTP {status} from {method} {w.sdk_base}{w.path} (role {w.role}, key {w.alias or '-'}, model {w.model or '-'}){said}."

    def make(cls: type[GatewayError], fix: str) -> GatewayError:
        return cls(w.scrub(f"[{cls.category}] {head} Fix: {fix}"), role=w.role, key_alias=w.alias, status=status)

    def credentials(quota: bool) -> GatewayError:
        if quota:
            return make(CredentialsError, f"key {w.alias} is valid but not allowed this request (permissions, quota or balance for model "
                                          f"{w.model!r}); top it up, enable the model for it, or use another key. {w.credentials_hint}.")
        return make(CredentialsError, f"key {w.alias} was rejected. {w.credentials_hint}. Make sure the variable holds a complete, "
                                      "current taotoken.net API key (not an OpenAI or Anthropic key).")

    model_fix = (f"model id {w.model!r} is not served here; set {MODEL_ENV} to one that is (GET {w.sdk_base}/models lists them). "
                 "The gateway never guesses a model.")
    path_fix = (f"the path was not found: {BASE_URL_ENV} must be the API root (e.g. {DEFAULT_ROOT}); the gateway appends /v1 and the "
                f"SDK appends {w.path}. Currently root={w.root}.")
    length_fix = (f"the prompt is too large for the model (about {w.est_prompt} tokens estimated + max_tokens {w.max_tokens}); "
                  "show fewer history rows (search.top_k) or lower max_tokens for this role.")
    max_tokens_fix = (f"max_tokens {w.max_tokens} is more than model {w.model!r} accepts; lower it for role {w.role} "
                      f"(TaotokenResource max_tokens_{w.role}) to the limit the server names.")

    # 1. the status alone
    if status == 401:
        return credentials(quota=False)
    if status == 402:
        return credentials(quota=True)
    if status == 403:
        if body.flagged or codes & MODERATION_CODES:
            return make(ContentError, "the server's moderation flagged the prompt; nothing in it was used. Check what the prompt carries "
                                      "(kernel source, notes) or use a model without moderation.")
        return credentials(quota=True)
    if status == 413:
        return make(ContentError, length_fix)
    # 2. the body's code / type / param fields
    if codes & CREDENTIAL_CODES:
        return credentials(quota=bool(codes - {"invalid_api_key", "authentication_error", "authenticationerror", "unauthorized"}))
    if codes & MODEL_CODES or body.param == "model":
        return make(RequestError, model_fix)
    if codes & LENGTH_CODES:
        return make(ContentError, length_fix)
    if codes & MODERATION_CODES:
        return make(ContentError, "the server's moderation refused the prompt; check what it carries or use another model.")
    if body.param in MAX_TOKENS_PARAMS:
        return make(RequestError, max_tokens_fix)
    # 3. a 404: the model (named so by the server) or the path
    if status == 404:
        return make(RequestError, model_fix if (not body.html and _MODEL_MISSING.search(body.message)) else path_fix)
    if body.html:
        return make(RequestError, path_fix)
    if body.param:
        return make(RequestError, f"the server refused parameter {body.param!r}; check it against what {w.sdk_base} supports.")
    # 4. the message text, last
    msg = body.message
    if _MAX_TOKENS.search(msg):
        return make(RequestError, max_tokens_fix)
    if _LENGTH.search(msg):
        return make(ContentError, length_fix)
    if _MODEL_MISSING.search(msg):
        return make(RequestError, model_fix)
    if _CREDENTIAL_TEXT.search(msg):
        return credentials(quota=bool(_QUOTA_TEXT.search(msg)))
    return make(RequestError, f"the server refused the request as sent; check {BASE_URL_ENV} (root={w.root}), {MODEL_ENV} ({w.model!r}) "
                              "and the parameters (max_tokens, temperature) against what the server supports.")
