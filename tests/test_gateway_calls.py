"""The gateway against a scripted OpenAI-compatible server, through the real openai SDK.

Each test asserts the attempt count, the waits (an injected clock/sleep), key cooldown and failover,
the classified error text, and exactly one ledger row per attempt.
"""

from __future__ import annotations

import random

import pytest
from gateway_helpers import make_gateway

from kregress.testing.fake_gateway import FakeClock
from resources.ledger import CACHE_ALIAS
from resources.taotoken import (
    ContentError,
    CredentialsError,
    RequestError,
    RetriesExhausted,
    TaotokenResource,
    fingerprint,
)

K1 = "sk" "-test-suggest-one-0000000000"
K2 = "sk" "-test-suggest-two-1111111111"
MSG = [{"role": "system", "content": "Reply with a JSON array."}, {"role": "user", "content": "propose 2 variants"}]




def alias(key: str, role: str = "suggest") -> str:
    return f"{role}#{fingerprint(key)}"


def test_success_records_usage_and_settles(srv, ledger):
    env = {"TAOTOKEN_KEY_SUGGEST": K1}
    g = make_gateway(srv, ledger, env)
    srv.push(content='[{"variant_id": "r1_v1"}]', prompt_tokens=123, completion_tokens=45)
    res = g.chat("suggest", MSG)
    assert (res.prompt_tokens, res.completion_tokens, res.total_tokens) == (123, 45, 168)
    assert res.key_alias == alias(K1) and res.attempts == 1 and not res.cache_hit
    assert res.text == '[{"variant_id": "r1_v1"}]' and res.request_id.startswith("req_")
    chats = srv.chat_requests()
    assert len(chats) == 1 and chats[0].token == K1
    sent = chats[0].body
    assert sent["model"] == "kregress-test-model" and sent["max_tokens"] == 1536 and "stream" not in sent
    assert chats[0].path == "/api/v1/chat/completions"  # root .../api -> SDK base .../api/v1
    rows = ledger.usage.rows()
    assert len(rows) == 1
    r = rows[0]
    assert (r.status, r.prompt_tokens, r.completion_tokens, r.total_tokens, r.attempt, r.key_alias) == ("ok", 123, 45, 168, 1, alias(K1))
    assert ledger.usage.spend("default").total == 168  # the reservation was settled with the reported usage


def test_each_attempt_is_on_record_before_the_server_sees_it(srv, ledger):
    """While the server holds a request, the ledger already has that attempt (status sent) and its reservation in
    flight: a process killed right then leaves both, for the next call to settle."""
    from kregress.testing.fake_gateway import Reply

    env = {"TAOTOKEN_KEY_SUGGEST": f"{K1},{K2}"}
    g = make_gateway(srv, ledger, env)
    seen_by_server = []

    def handler(req):
        seen_by_server.append(([(r.status, r.attempt) for r in ledger.usage.rows()], len(ledger.usage.in_flight())))
        if len(seen_by_server) == 1:
            return Reply(status=429, headers={"Retry-After": "0"})
        return Reply(content="[]")

    srv.handler = handler
    g.chat("suggest", MSG)
    assert seen_by_server == [([("sent", 1)], 1), ([("error", 1), ("sent", 2)], 1)]
    assert [(r.status, r.attempt) for r in ledger.usage.rows()] == [("error", 1), ("ok", 2)] and ledger.usage.in_flight() == []


def test_default_timeouts_and_sdk_retries_off(srv, ledger):
    g = TaotokenResource(base_url=srv.root, model_id="m").get_gateway(ledger, environ={"TAOTOKEN_API_KEY": K1})
    assert (g.timeout.connect, g.timeout.read) == (10.0, 120.0)
    client = g._client(g.keys.keys("suggest")[0])
    assert client.max_retries == 0
    assert g.settings.retry_horizon_s == 60.0 and g.settings.max_attempts == 0  # retries bounded by time, not a count


def test_429_retry_after_fails_over_to_other_key(srv, ledger):
    clock = FakeClock()
    g = make_gateway(srv, ledger, {"TAOTOKEN_KEY_SUGGEST": f"{K1},{K2}"}, clock, verify_model=False)
    srv.push(status=429, headers={"Retry-After": "7"})
    srv.push(content="[]")
    res = g.chat("suggest", MSG)
    chats = srv.chat_requests()
    assert len(chats) == 2 and res.attempts == 2
    first, second = chats[0].token, chats[1].token
    assert {first, second} == {K1, K2}  # failed over to the other key of the role
    assert clock.sleeps == []  # another key was free: no waiting
    assert g.keys.cooldown_remaining(alias(first), clock()) == pytest.approx(7.0)  # Retry-After honoured as cooldown
    assert g.keys.cooldown_remaining(alias(second), clock()) == 0
    rows = ledger.usage.rows()
    assert [(r.attempt, r.status, r.error_class, r.key_alias) for r in rows] == [
        (1, "error", "rate_limited:429", alias(first)),
        (2, "ok", "", alias(second)),
    ]
    assert res.key_alias == alias(second)


def test_429_single_key_waits_retry_after(srv, ledger):
    clock = FakeClock()
    g = make_gateway(srv, ledger, {"TAOTOKEN_KEY_SUGGEST": K1}, clock)
    srv.push(status=429, headers={"Retry-After": "3"})
    srv.push(content="[]")
    g.chat("suggest", MSG)
    assert clock.sleeps == [pytest.approx(3.0)]
    assert len(srv.chat_requests()) == 2 and len(ledger.usage.rows()) == 2


def test_503_twice_then_success_backs_off_exponentially(srv, ledger):
    clock = FakeClock()
    g = make_gateway(srv, ledger, {"TAOTOKEN_KEY_SUGGEST": K1}, clock, backoff_base_s=2.0)
    srv.push(status=503)
    srv.push(status=503)
    srv.push(content="[]", prompt_tokens=10, completion_tokens=1)
    res = g.chat("suggest", MSG)
    assert res.attempts == 3 and len(srv.chat_requests()) == 3
    rng = random.Random(7)  # the gateway's injected rng: equal jitter, base 2 s, doubling
    expected = [2.0 * (0.5 + 0.5 * rng.random()), 4.0 * (0.5 + 0.5 * rng.random())]
    assert clock.sleeps == pytest.approx(expected)
    assert 1.0 <= clock.sleeps[0] <= 2.0 and 2.0 <= clock.sleeps[1] <= 4.0
    rows = ledger.usage.rows()
    assert [(r.attempt, r.error_class) for r in rows] == [(1, "server_error:503"), (2, "server_error:503"), (3, "")]
    assert sum(r.total_tokens for r in rows) == 11


def test_retry_after_on_503_is_honoured(srv, ledger):
    clock = FakeClock()
    g = make_gateway(srv, ledger, {"TAOTOKEN_KEY_SUGGEST": K1}, clock)
    srv.push(status=503, headers={"Retry-After": "11"})
    srv.push(content="[]")
    g.chat("suggest", MSG)
    assert clock.sleeps == [pytest.approx(11.0)]


def test_read_timeout_is_retried(srv, ledger):
    clock = FakeClock()
    g = make_gateway(srv, ledger, {"TAOTOKEN_KEY_SUGGEST": K1}, clock, read_timeout_s=0.5)
    assert g.timeout.read == 0.5
    srv.push(content="[]", delay_s=2.0)
    srv.push(content="[]")
    res = g.chat("suggest", MSG)
    assert res.attempts == 2
    rows = ledger.usage.rows()
    assert [(r.status, r.error_class) for r in rows] == [("error", "timeout"), ("ok", "")]
    assert rows[0].latency_ms >= 450
    assert len(clock.sleeps) == 1 and 0.5 <= clock.sleeps[0] <= 1.0


def test_dropped_connection_is_retried_on_the_other_key(srv, ledger):
    clock = FakeClock()
    g = make_gateway(srv, ledger, {"TAOTOKEN_KEY_SUGGEST": f"{K1},{K2}"}, clock, verify_model=False)
    srv.push(drop=True)
    srv.push(content="[]")
    res = g.chat("suggest", MSG)
    rows = ledger.usage.rows()
    assert [r.error_class for r in rows] == ["connection", ""]
    assert rows[0].key_alias != rows[1].key_alias and res.attempts == 2
    assert clock.sleeps == []


def test_retries_exhausted_releases_the_reservation(srv, ledger):
    clock = FakeClock()
    g = make_gateway(srv, ledger, {"TAOTOKEN_KEY_SUGGEST": K1}, clock, max_attempts=3)
    for _ in range(3):
        srv.push(status=502)
    with pytest.raises(RetriesExhausted) as ei:
        g.chat("suggest", MSG)
    assert "gave up after 3 attempt(s)" in str(ei.value) and "max_attempts 3 reached" in str(ei.value) and "Fix:" in str(ei.value)
    assert len(srv.chat_requests()) == 3 and len(ledger.usage.rows()) == 3
    assert len(clock.sleeps) == 2
    assert ledger.usage.spend("default").total == 0  # nothing reported, nothing charged


def test_retry_after_beyond_limit_is_not_waited(srv, ledger):
    clock = FakeClock()
    g = make_gateway(srv, ledger, {"TAOTOKEN_KEY_SUGGEST": K1}, clock, retry_horizon_s=60)
    srv.push(status=429, headers={"Retry-After": "3600"})
    with pytest.raises(RetriesExhausted, match=r"the next wait, 3600.0s for suggest#\w+, passes the retry horizon of 60s"):
        g.chat("suggest", MSG)
    assert clock.sleeps == [] and len(ledger.usage.rows()) == 1


@pytest.mark.parametrize(
    "status,body,exc,needles",
    [
        (400, {"error": {"message": "Unsupported parameter: 'foo'", "code": "invalid_request"}}, RequestError,
         ["[request]", "HTTP 400", "TAOTOKEN_BASE_URL", "TAOTOKEN_MODEL_ID", "Fix:"]),
        (400, {"error": {"message": "This model's maximum context length is 8192 tokens", "code": "context_length_exceeded"}}, ContentError,
         ["[content]", "prompt is too large", "history rows"]),
        (404, {"error": {"message": "The model `kregress-test-model` does not exist", "code": "model_not_found"}}, RequestError,
         ["[request]", "HTTP 404", "TAOTOKEN_MODEL_ID", "never guesses"]),
        (404, "<html><head><title>Not Found</title></head></html>", RequestError, ["[request]", "TAOTOKEN_BASE_URL must be the API root"]),
        (422, {"detail": [{"loc": ["body", "messages"], "msg": "field required"}]}, RequestError, ["[request]", "HTTP 422"]),
        # credentials: raised at once only on a role's last key (with two keys the call fails over)
        (401, {"error": {"message": "Invalid API key", "code": "invalid_api_key"}}, CredentialsError,
         ["[credentials]", "HTTP 401", "TAOTOKEN_KEY_SUGGEST is set (1 key)", "TAOTOKEN_API_KEY is not set", "taotoken.net API key"]),
        (403, {"error": {"message": "insufficient balance"}}, CredentialsError, ["[credentials]", "HTTP 403", "quota or balance"]),
    ],
)
def test_client_errors_are_classified_and_never_retried(srv, ledger, status, body, exc, needles):
    clock = FakeClock()
    keys = K1 if exc is CredentialsError else f"{K1},{K2}"
    g = make_gateway(srv, ledger, {"TAOTOKEN_KEY_SUGGEST": keys}, clock)
    srv.push(status=status, body=body)
    with pytest.raises(exc) as ei:
        g.chat("suggest", MSG)
    text = str(ei.value)
    for n in needles:
        assert n in text, (n, text)
    assert ei.value.status == status
    assert len(srv.chat_requests()) == 1 and clock.sleeps == []  # no retry, no failover
    rows = ledger.usage.rows()
    assert len(rows) == 1 and rows[0].status == "error" and rows[0].error_class == f"{exc.category}:{status}"
    assert ei.value.__cause__ is None and ei.value.__context__ is None  # the SDK exception (with its request) is not attached


def test_401_names_other_tools_variables(srv, ledger):
    env = {"TAOTOKEN_API_KEY": K1, "ANTHROPIC_AUTH_TOKEN": "anthropic-x", "OPENAI_API_KEY": "openai-x", "TAOTOKEN_KEY": "typo"}
    g = make_gateway(srv, ledger, env)
    srv.push(status=401, body={"error": {"message": "bad key"}})
    with pytest.raises(CredentialsError) as ei:
        g.chat("suggest", MSG)
    text = str(ei.value)
    assert "TAOTOKEN_KEY_SUGGEST is not set" in text and "TAOTOKEN_API_KEY is set (1 key)" in text
    assert "OPENAI_API_KEY, ANTHROPIC_AUTH_TOKEN are set, but that is another tool's variable" in text
    assert "TAOTOKEN_KEY is set but the gateway does not read it" in text
    assert "anthropic-x" not in text and "openai-x" not in text


def test_no_key_for_role_fails_before_any_request(srv, ledger):
    env = {"TAOTOKEN_KEY_REPORT": K1, "OPENAI_API_KEY": "sk-openai-123"}
    g = make_gateway(srv, ledger, env)
    with pytest.raises(CredentialsError) as ei:
        g.chat("suggest", MSG)
    text = str(ei.value)
    assert text.startswith("[credentials] no TAOTOKEN key for role suggest")
    assert "TAOTOKEN_KEY_SUGGEST is not set" in text and "export TAOTOKEN_KEY_SUGGEST=" in text
    assert "OPENAI_API_KEY is set, but that is another tool's variable" in text
    assert srv.requests == [] and ledger.usage.rows() == []


def test_empty_key_variable_is_reported_as_empty(srv, ledger):
    g = make_gateway(srv, ledger, {"TAOTOKEN_KEY_SUGGEST": " , ", "TAOTOKEN_API_KEY": ""})
    with pytest.raises(CredentialsError, match="TAOTOKEN_KEY_SUGGEST is set but empty"):
        g.chat("suggest", MSG)


def test_model_id_missing_is_an_error(srv, ledger):
    g = make_gateway(srv, ledger, {"TAOTOKEN_API_KEY": K1}, model_id="")
    with pytest.raises(RequestError, match="no model id configured. Fix: set TAOTOKEN_MODEL_ID"):
        g.chat("suggest", MSG)
    assert srv.requests == []


def test_unknown_model_is_caught_by_the_model_list(srv, ledger):
    g = make_gateway(srv, ledger, {"TAOTOKEN_API_KEY": K1}, model_id="gpt-guess")
    with pytest.raises(RequestError) as ei:
        g.chat("suggest", MSG)
    text = str(ei.value)
    assert "'gpt-guess' is not served" in text and "kregress-test-model" in text and "never guesses" in text
    assert srv.chat_requests() == [] and ledger.usage.rows() == []


def test_html_homepage_answer_is_a_request_error(srv, ledger):
    g = make_gateway(srv, ledger, {"TAOTOKEN_API_KEY": K1})
    srv.push(status=200, body="<html><title>Welcome</title></html>")
    with pytest.raises(RequestError, match="not a chat completion"):
        g.chat("suggest", MSG)
    assert len(ledger.usage.rows()) == 1


def test_cache_hit_is_a_ledger_row_without_tokens(srv, ledger):
    g = make_gateway(srv, ledger, {"TAOTOKEN_API_KEY": K1})
    srv.push(content='["a"]', prompt_tokens=50, completion_tokens=5)
    a = g.chat("suggest", MSG)
    b = g.chat("suggest", MSG)  # a re-run: same model, messages and parameters
    assert len(srv.chat_requests()) == 1
    assert b.cache_hit and b.text == a.text and b.total_tokens == 0 and b.key_alias == CACHE_ALIAS
    rows = ledger.usage.rows()
    assert [(r.cache_hit, r.total_tokens) for r in rows] == [(False, 55), (True, 0)]
    # a new gateway (a resumed run in another process) hits the same cache
    g2 = make_gateway(srv, ledger, {"TAOTOKEN_API_KEY": K1}, verify_model=False)
    assert g2.chat("suggest", MSG).cache_hit
    # different parameters are a different request
    g2.chat("suggest", MSG, max_tokens=100)
    assert len(srv.chat_requests()) == 2
    g2.chat("suggest", MSG, use_cache=False)
    assert len(srv.chat_requests()) == 3


def test_missing_usage_is_estimated_and_flagged(srv, ledger):
    g = make_gateway(srv, ledger, {"TAOTOKEN_API_KEY": K1})
    srv.push(body={"id": "x", "object": "chat.completion", "created": 0, "model": "kregress-test-model",
                   "choices": [{"index": 0, "message": {"role": "assistant", "content": "[1, 2, 3]"}, "finish_reason": "stop"}]})
    res = g.chat("suggest", MSG)
    assert res.usage_estimated and res.prompt_tokens == res.estimated_prompt_tokens > 0 and res.completion_tokens > 0
    assert ledger.usage.rows()[0].error_class == "usage_estimated"


def test_response_size_is_capped(srv, ledger):
    g = make_gateway(srv, ledger, {"TAOTOKEN_API_KEY": K1}, max_response_chars=1000)
    srv.push(content="x" * 50_000)
    res = g.chat("suggest", MSG)
    assert res.truncated and len(res.text) == 1000


def test_call_context_lands_in_the_ledger(srv, ledger):
    from resources.taotoken import CallContext

    g = make_gateway(srv, ledger, {"TAOTOKEN_API_KEY": K1})
    g.chat("suggest", MSG, ctx=CallContext(run_id="run-1", partition="gemm-a", round=2, task="round_2_suggestions"))
    r = ledger.usage.rows()[0]
    assert (r.run_id, r.partition, r.round, r.task, r.model) == ("run-1", "gemm-a", 2, "round_2_suggestions", "kregress-test-model")
