"""Key failover on rejected credentials, retries bounded by time, and cooldowns shared across processes
against the fake server through the real openai SDK."""

from __future__ import annotations

import time

import pytest
from gateway_helpers import cooldown_worker, make_gateway, run_spawned

from kregress.testing.fake_gateway import FakeClock, Reply
from resources.ledger import Ledger
from resources.taotoken import CredentialsError, RetriesExhausted, TaotokenResource, fingerprint

K1 = "sk" "-failover-key-one-000000000000"
K2 = "sk" "-failover-key-two-111111111111"
MSG = [{"role": "user", "content": "propose 2 variants"}]


def alias(key: str) -> str:
    return f"suggest#{fingerprint(key)}"


def test_401_on_one_key_fails_over_to_the_other(srv, ledger):
    clock = FakeClock()
    g = make_gateway(srv, ledger, {"TAOTOKEN_KEY_SUGGEST": f"{K1},{K2}"}, clock, verify_model=False)
    srv.handler = lambda seen: Reply(status=401, body={"error": {"message": "Invalid API key", "code": "invalid_api_key"}}) \
        if seen.token == K1 else Reply(content="[]")
    res = g.chat("suggest", MSG)
    assert res.key_alias == alias(K2) and clock.sleeps == []
    assert [(r.key_alias, r.error_class) for r in ledger.usage.rows()] == [(alias(K1), "credentials:401"), (alias(K2), "")]
    # the rejected key stays out for this gateway: the next call goes straight to the good key
    g.chat("suggest", [{"role": "user", "content": "again"}])
    assert [s.token for s in srv.chat_requests()] == [K1, K2, K2]


def test_credentials_error_only_when_every_key_of_the_role_failed(srv, ledger):
    g = make_gateway(srv, ledger, {"TAOTOKEN_KEY_SUGGEST": f"{K1},{K2}"}, verify_model=False)
    srv.default = Reply(status=403, body={"error": {"message": "insufficient balance"}})
    with pytest.raises(CredentialsError) as ei:
        g.chat("suggest", MSG)
    text = ei.value.one_line()
    assert text.startswith("[credentials] all 2 keys of role suggest were rejected")
    assert f"{alias(K1)}: HTTP 403" in text and f"{alias(K2)}: HTTP 403" in text and " Fix: " in text
    assert K1 not in text and K2 not in text
    assert len(srv.chat_requests()) == 2


def test_401_on_the_model_list_fails_over_too(srv, ledger):
    g = make_gateway(srv, ledger, {"TAOTOKEN_KEY_SUGGEST": f"{K1},{K2}"})
    srv.models_handler = lambda seen: Reply(status=401, body={"error": {"message": "Incorrect API key provided", "code": "invalid_api_key"}}) \
        if seen.token == K1 else None
    res = g.chat("suggest", MSG)
    assert res.key_alias == alias(K2)
    assert [(s.method, s.token) for s in srv.requests] == [("GET", K1), ("GET", K2), ("POST", K2)]


def test_an_outage_longer_than_five_attempts_is_ridden_out_within_the_horizon(srv, tmp_path):
    """Real time: 8 answers of 429 with Retry-After 0.2 s (the old gateway gave up after 5 attempts), then success."""
    ledger = Ledger(tmp_path / "ledger.sqlite")
    g = TaotokenResource(base_url=srv.root, model_id=srv.models[0], retry_horizon_s=5.0, verify_model=False).get_gateway(
        ledger, environ={"TAOTOKEN_KEY_SUGGEST": K1})
    for _ in range(8):
        srv.push(status=429, headers={"Retry-After": "0.2"})
    srv.push(content="[]")
    t0 = time.monotonic()
    res = g.chat("suggest", MSG)
    took = time.monotonic() - t0
    assert res.attempts == 9 and len(srv.chat_requests()) == 9
    assert 8 * 0.2 <= took < 5.0  # waited out every Retry-After, within the horizon
    assert [r.error_class for r in ledger.usage.rows()][-1] == "" and len(ledger.usage.rows()) == 9


def test_an_outage_longer_than_the_horizon_gives_up_with_one_line(srv, tmp_path):
    ledger = Ledger(tmp_path / "ledger.sqlite")
    g = TaotokenResource(base_url=srv.root, model_id=srv.models[0], retry_horizon_s=1.0, verify_model=False).get_gateway(
        ledger, environ={"TAOTOKEN_KEY_SUGGEST": f"{K1},{K2}"})
    srv.default = Reply(status=503, headers={"Retry-After": "0.3"})
    t0 = time.monotonic()
    with pytest.raises(RetriesExhausted) as ei:
        g.chat("suggest", MSG)
    assert time.monotonic() - t0 < 3.0
    line = ei.value.one_line()
    assert line.startswith("[transient] suggest: gave up after") and "passes the retry horizon of 1s" in line
    assert "last: server_error (HTTP 503)" in line and "raise retry_horizon_s" in line and ei.value.kind == "server_error"
    assert len(srv.chat_requests()) == len(ledger.usage.rows()) >= 4  # both keys, several Retry-After periods


def _second_run(srv, db: str, keys: str) -> str:
    (got,) = run_spawned(cooldown_worker, [(srv.root, db, keys)])
    return got


def test_a_rate_limit_seen_by_one_run_is_skipped_by_a_second_process(srv, tmp_path):
    db = str(tmp_path / "ledger.sqlite")
    # control: on a fresh ledger a new run starts with the first key
    assert _second_run(srv, str(tmp_path / "fresh.sqlite"), f"{K1},{K2}") == alias(K1)
    # run 1 (this process): K1 is rate limited for 30 s; it fails over to K2
    g = make_gateway(srv, Ledger(db), {"TAOTOKEN_KEY_SUGGEST": f"{K1},{K2}"}, verify_model=False)
    srv.push(status=429, headers={"Retry-After": "30"})
    assert g.chat("suggest", MSG).key_alias == alias(K2)
    n = len(srv.chat_requests())
    # run 2 (another process, same ledger) never sends to K1 while it cools down
    assert _second_run(srv, db, f"{K1},{K2}") == alias(K2)
    assert [s.token for s in srv.chat_requests()[n:]] == [K2]


def test_a_key_rejected_in_one_run_is_skipped_by_a_second_process(srv, tmp_path):
    db = str(tmp_path / "ledger.sqlite")
    srv.handler = lambda seen: Reply(status=401, body={"error": {"message": "bad key", "code": "invalid_api_key"}}) \
        if seen.token == K1 else Reply(content="[]")
    g = make_gateway(srv, Ledger(db), {"TAOTOKEN_KEY_SUGGEST": f"{K1},{K2}"}, verify_model=False)
    assert g.chat("suggest", MSG).key_alias == alias(K2)
    n = len(srv.chat_requests())
    assert _second_run(srv, db, f"{K1},{K2}") == alias(K2)
    assert [s.token for s in srv.chat_requests()[n:]] == [K2]
    # a run whose only key another run saw rejected still tries it once (its own answer decides)
    assert _second_run(srv, db, K1).startswith("CredentialsError: [credentials] HTTP 401")
