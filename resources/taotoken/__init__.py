"""The model gateway: OpenAI-compatible chat completions through taotoken.net (the openai SDK).

One place to configure (``TaotokenResource``, the fields of ``GatewaySettings``): the API root (default
``$TAOTOKEN_BASE_URL``, else https://taotoken.net/api; the SDK base ``.../api/v1`` is derived from it), the
model id (``$TAOTOKEN_MODEL_ID``; missing or unknown is an error, never a guessed name), timeouts,
``max_tokens`` per role, the retry horizon and cooldowns.

Keys come from the environment, per role: ``TAOTOKEN_KEY_SUGGEST``, ``TAOTOKEN_KEY_REPORT``,
``TAOTOKEN_KEY_REVIEW`` (several keys each, comma or whitespace separated), ``TAOTOKEN_API_KEY`` as the
fallback for every role. Logs, errors, the ledger and reports show a key alias, never the key.

Modules: ``errors`` (what an HTTP answer means), ``keys`` (ApiKey, KeyPool), ``estimate`` (token upper
bounds, the cache key), ``gateway`` (Gateway.chat: budgets, retries, failover), ``settings`` and
``resource`` (TaotokenResource).
"""

from kregress.core.endpoints import (
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
    gateway_error_line,
    resolve_base_url,
    split_keys,
)
from kregress.core.names import ROLES
from resources.ledger import BudgetExceeded
from resources.taotoken.errors import RETRYABLE_STATUS, ErrorBody, Where, classify, parse_error_body
from resources.taotoken.estimate import estimate_messages_tokens, estimate_tokens, request_hash
from resources.taotoken.gateway import CallContext, ChatResult, Gateway
from resources.taotoken.keys import ApiKey, KeyPool
from resources.taotoken.resource import TaotokenResource
from resources.taotoken.settings import GatewaySettings

__all__ = [
    "ROLES", "DEFAULT_ROOT", "BASE_URL_ENV", "MODEL_ENV", "FALLBACK_KEY_ENV", "ROLE_KEY_ENV", "KNOWN_ENV", "OTHER_TOOLS_ENV",
    "KEY_PATTERN", "RETRYABLE_STATUS",
    "ApiKey", "KeyPool", "CallContext", "ChatResult", "Gateway", "GatewaySettings", "TaotokenResource",
    "GatewayError", "CredentialsError", "RequestError", "ContentError", "RetriesExhausted", "BudgetExceeded",
    "ErrorBody", "Where", "classify", "parse_error_body", "gateway_error_line",
    "resolve_base_url", "split_keys", "fingerprint", "estimate_tokens", "estimate_messages_tokens", "request_hash",
]
