"""Classification of error answers, with bodies shaped as OpenAI, vLLM and OpenRouter send them.

Status and the body's code / type / param decide first, message text last: the old classifier sent any 400
mentioning "model" to "model id ... is not served" (a max_tokens error got the model-id fix).
"""

from __future__ import annotations

import pytest
from gateway_helpers import make_gateway

from kregress.core.endpoints import gateway_error_line
from kregress.testing.fake_gateway import FakeClock
from resources.taotoken import (
    ContentError,
    CredentialsError,
    RequestError,
    RetriesExhausted,
    Where,
    classify,
    parse_error_body,
)

W = Where(sdk_base="https://gw.example/api/v1", root="https://gw.example/api", model="m-1", role="suggest", alias="suggest#abcd",
          est_prompt=900, max_tokens=1536, credentials_hint="TAOTOKEN_KEY_SUGGEST is set (1 key)")

MODEL_FIX = "is not served here"
MAX_TOKENS_FIX = "max_tokens 1536 is more than model 'm-1' accepts"
LENGTH_FIX = "the prompt is too large"

CASES = [
    # --- OpenAI -------------------------------------------------------------------------------
    ("openai 401 bad key", 401, {"error": {"message": "Incorrect API key provided: abc***def.", "type": "invalid_request_error",
                                           "param": None, "code": "invalid_api_key"}}, CredentialsError, "was rejected"),
    ("openai 404 model", 404, {"error": {"message": "The model `gpt-4x` does not exist or you do not have access to it.",
                                         "type": "invalid_request_error", "param": None, "code": "model_not_found"}}, RequestError, MODEL_FIX),
    ("openai 400 context", 400, {"error": {"message": "This model's maximum context length is 128000 tokens. However, your messages "
                                           "resulted in 130000 tokens. Please reduce the length of the messages.",
                                           "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}},
     ContentError, LENGTH_FIX),
    ("openai 400 max_tokens param", 400, {"error": {"message": "max_tokens is too large: 100000. This model supports at most 16384 "
                                                    "completion tokens, whereas you provided 100000.", "type": "invalid_request_error",
                                                    "param": "max_tokens", "code": None}}, RequestError, MAX_TOKENS_FIX),
    ("short max_tokens message, no param", 400,
     {"error": {"message": "max_tokens is too large for this model", "type": "invalid_request_error", "code": None}},
     RequestError, MAX_TOKENS_FIX),
    ("openai 400 unsupported temperature", 400, {"error": {"message": "Unsupported parameter: 'temperature' is not supported with this "
                                                           "model.", "type": "invalid_request_error", "param": "temperature",
                                                           "code": "unsupported_parameter"}}, RequestError, "parameter 'temperature'"),
    ("openai 429 no quota", 429, {"error": {"message": "You exceeded your current quota, please check your plan and billing details.",
                                            "type": "insufficient_quota", "param": None, "code": "insufficient_quota"}},
     CredentialsError, "quota or balance"),
    # --- vLLM (top-level and nested shapes, numeric code) --------------------------------------
    ("vllm 404 model", 404, {"object": "error", "message": "The model `foo` does not exist.", "type": "NotFoundError", "param": None,
                             "code": 404}, RequestError, MODEL_FIX),
    ("vllm 400 prompt too long", 400, {"object": "error", "message": "This model's maximum context length is 4096 tokens. However, you "
                                       "requested 5000 tokens (4900 in the messages, 100 in the completion). Please reduce the length of "
                                       "the messages or completion.", "type": "BadRequestError", "param": None, "code": 400},
     ContentError, LENGTH_FIX),
    ("vllm 400 max_tokens too large", 400, {"error": {"message": "'max_tokens' is too large: 5000. This model's maximum context length is "
                                                      "4096 tokens and your request has 20 input tokens (5000 > 4096 - 20).",
                                                      "type": "BadRequestError", "param": None, "code": 400}}, RequestError, MAX_TOKENS_FIX),
    # --- OpenRouter ------------------------------------------------------------------------------
    ("openrouter 401", 401, {"error": {"code": 401, "message": "No auth credentials found"}}, CredentialsError, "was rejected"),
    ("openrouter 402 credits", 402, {"error": {"code": 402, "message": "Insufficient credits. Add more using https://openrouter.ai/credits"}},
     CredentialsError, "quota or balance"),
    ("openrouter 403 moderation", 403, {"error": {"code": 403, "message": "Your chosen model requires moderation and your input was flagged",
                                                  "metadata": {"reasons": ["harassment"], "flagged_input": "..."}}}, ContentError, "moderation"),
    ("openrouter 400 bad model id", 400, {"error": {"code": 400, "message": "anthropic/claude-x is not a valid model ID"}}, RequestError, MODEL_FIX),
    # --- anything else ---------------------------------------------------------------------------
    ("html 404", 404, "<html><head><title>Not Found</title></head></html>", RequestError, "must be the API root"),
    ("fastapi 422", 422, {"detail": [{"loc": ["body", "messages"], "msg": "field required"}]}, RequestError, "refused the request"),
]


@pytest.mark.parametrize("name,status,body,cls,fix", CASES, ids=[c[0] for c in CASES])
def test_real_error_bodies_are_classified_by_status_and_code_first(name, status, body, cls, fix):
    err = classify(status, parse_error_body(body), W)
    assert type(err) is cls, (name, err)
    line = err.one_line()
    assert line == str(err) and "\n" not in line
    assert line.startswith(f"[{cls.category}] HTTP {status} from POST https://gw.example/api/v1/chat/completions")
    assert fix in err.fix, (name, err.fix)
    assert gateway_error_line(f"dagster: step failed\nCaused by: {type(err).__name__}: {line}\n  File x.py") == line


@pytest.mark.parametrize("status,body", [
    (429, {"error": {"code": 429, "message": "Rate limit exceeded"}}),
    (503, {"error": {"message": "overloaded", "type": "server_error", "code": None}}),
    (408, None), (502, "<html><title>502 Bad Gateway</title></html>"),
])
def test_transient_answers_are_not_classified(status, body):
    assert classify(status, parse_error_body(body), W) is None


K1 = "sk" "-errors-test-key-0000000000000"


@pytest.mark.parametrize("status,body,cls,fix", [(c[1], c[2], c[3], c[4]) for c in CASES if c[3] is not CredentialsError][:6])
def test_through_the_sdk_no_retry_and_the_row_names_the_class(srv, ledger, status, body, cls, fix):
    clock = FakeClock()
    g = make_gateway(srv, ledger, {"TAOTOKEN_KEY_SUGGEST": K1}, clock)
    srv.push(status=status, body=body)
    with pytest.raises(cls) as ei:
        g.chat("suggest", [{"role": "user", "content": "hi"}])
    assert fix.replace("'m-1'", "'kregress-test-model'") in ei.value.fix and len(srv.chat_requests()) == 1 and clock.sleeps == []
    assert [r.error_class for r in ledger.usage.rows()] == [f"{cls.category}:{status}"]


def test_quota_429_is_not_retried_as_a_rate_limit(srv, ledger):
    clock = FakeClock()
    g = make_gateway(srv, ledger, {"TAOTOKEN_KEY_SUGGEST": K1}, clock)
    srv.push(status=429, body=CASES[6][2])
    with pytest.raises(CredentialsError, match="quota or balance"):
        g.chat("suggest", [{"role": "user", "content": "hi"}])
    assert len(srv.chat_requests()) == 1 and clock.sleeps == []


def test_every_error_class_has_a_one_line_form():
    for cls in (CredentialsError, RequestError, ContentError, RetriesExhausted):
        e = cls("something broke\n  on two lines")
        assert e.one_line() == f"[{cls.category}] something broke on two lines. Fix: {cls.default_fix}"
        assert e.what == "something broke on two lines" and e.fix == cls.default_fix
