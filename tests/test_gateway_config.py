"""Gateway configuration: base URL resolution, model id, key pool and aliases (no network)."""

from __future__ import annotations

import pickle

import pytest

from resources.ledger import Ledger
from resources.taotoken import (
    DEFAULT_ROOT,
    CredentialsError,
    KeyPool,
    RequestError,
    TaotokenResource,
    fingerprint,
    resolve_base_url,
)


@pytest.mark.parametrize(
    "url,root,sdk",
    [
        ("https://taotoken.net/api", "https://taotoken.net/api", "https://taotoken.net/api/v1"),
        ("https://taotoken.net/api/", "https://taotoken.net/api", "https://taotoken.net/api/v1"),
        ("https://taotoken.net/api/v1", "https://taotoken.net/api", "https://taotoken.net/api/v1"),
        ("  https://taotoken.net/api/v1/ ", "https://taotoken.net/api", "https://taotoken.net/api/v1"),
        ("http://127.0.0.1:8080/api", "http://127.0.0.1:8080/api", "http://127.0.0.1:8080/api/v1"),
        ("", DEFAULT_ROOT, DEFAULT_ROOT + "/v1"),
    ],
)
def test_base_url_is_derived_from_the_root(url, root, sdk):
    assert resolve_base_url(url) == (root, sdk)


@pytest.mark.parametrize(
    "url,needle",
    [
        ("https://taotoken.net/api?utm_source=newsletter&utm_medium=email", "query string (parameters: utm_medium, utm_source)"),
        ("https://taotoken.net/api/v1/v1", "duplicated /v1"),
        ("https://taotoken.net/api/v1/api/v1", "/v1 twice"),
        ("https://taotoken.net", "site homepage with no API path"),
        ("https://taotoken.net/", "site homepage with no API path"),
        ("https://taotoken.net/api/v1/chat/completions", "is an endpoint, not the API root"),
        ("https://taotoken.net/api#docs", "a #fragment"),
        ("taotoken.net/api", "is not an http(s) URL"),
        ("https://user:secretpass@taotoken.net/api", "carries credentials"),
    ],
)
def test_bad_base_urls_are_refused_with_the_fix(url, needle):
    with pytest.raises(RequestError) as ei:
        resolve_base_url(url)
    text = str(ei.value)
    assert needle in text and f"Fix: use the API root, e.g. {DEFAULT_ROOT}" in text and "TAOTOKEN_BASE_URL" in text
    assert "secretpass" not in text and "newsletter" not in text  # values in the URL are not echoed


def test_resource_defaults_come_from_the_environment(monkeypatch):
    monkeypatch.delenv("TAOTOKEN_BASE_URL", raising=False)
    monkeypatch.delenv("TAOTOKEN_MODEL_ID", raising=False)
    r = TaotokenResource()
    assert r.base_url == DEFAULT_ROOT and r.model_id == ""
    assert (r.connect_timeout_s, r.read_timeout_s, r.retry_horizon_s) == (10.0, 120.0, 60.0)
    assert "stream" not in TaotokenResource.model_fields and "response_format" not in TaotokenResource.model_fields
    assert (r.max_tokens_suggest, r.max_tokens_report, r.max_tokens_review) == (1536, 1024, 1536)
    monkeypatch.setenv("TAOTOKEN_BASE_URL", "https://example.org/api/v1")
    monkeypatch.setenv("TAOTOKEN_MODEL_ID", "some-model")
    r = TaotokenResource()
    assert r.base_url == "https://example.org/api/v1" and r.model_id == "some-model"
    assert TaotokenResource(base_url="https://x.org/api").base_url == "https://x.org/api"  # a config value wins


def test_bad_base_url_fails_when_the_gateway_is_made(tmp_path):
    r = TaotokenResource(base_url="https://taotoken.net/?utm_source=x", model_id="m")  # configuring alone is fine
    with pytest.raises(RequestError, match="query string"):
        r.get_gateway(Ledger(tmp_path / "l.sqlite"), environ={})


def test_key_pool_roles_fallback_and_aliases():
    env = {
        "TAOTOKEN_KEY_SUGGEST": "sk-aaaaaaaaaaaaaaaa, sk-bbbbbbbbbbbbbbbb\nsk-cccccccccccccccc",
        "TAOTOKEN_API_KEY": "Bearer sk-fallbackfallback",
        "TAOTOKEN_KEY_REVIEW": "'sk-reviewreviewrev'",
    }
    pool = KeyPool.from_env(env)
    assert [k.reveal() for k in pool.keys("suggest")] == ["sk-aaaaaaaaaaaaaaaa", "sk-bbbbbbbbbbbbbbbb", "sk-cccccccccccccccc"]
    assert [k.reveal() for k in pool.keys("report")] == ["sk-fallbackfallback"]  # fallback for roles without their own
    assert [k.env_var for k in pool.keys("report")] == ["TAOTOKEN_API_KEY"]
    assert [k.reveal() for k in pool.keys("review")] == ["sk-reviewreviewrev"]
    assert pool.aliases("suggest") == [f"suggest#{fingerprint(s)}" for s in ("sk-aaaaaaaaaaaaaaaa", "sk-bbbbbbbbbbbbbbbb", "sk-cccccccccccccccc")]
    assert all(len(a.split("#")[1]) == 4 for a in pool.aliases())
    assert pool.aliases("report") == [f"report#{fingerprint('sk-fallbackfallback')}"]


def test_key_pool_picks_least_recently_used_free_key_then_waits_for_the_first_to_cool():
    pool = KeyPool.from_env({"TAOTOKEN_KEY_SUGGEST": "k1-xxxxxxxxxxxxxxx,k2-yyyyyyyyyyyyyyy"})
    a, w = pool.pick("suggest", 0.0)
    b, _ = pool.pick("suggest", 0.0)
    assert a is not b and w == 0.0
    pool.cool(a, 10.0)
    pool.cool(b, 5.0)
    c, wait = pool.pick("suggest", 1.0)
    assert c is b and wait == pytest.approx(4.0)
    with pytest.raises(CredentialsError, match="no TAOTOKEN key for role report"):
        pool.pick("report", 0.0)


def test_keys_never_show_in_repr_str_or_pickle(tmp_path):
    secret = "sk" "-NEVER-SHOW-THIS-0123456789"
    env = {"TAOTOKEN_KEY_SUGGEST": secret}
    pool = KeyPool.from_env(env)
    key = pool.keys("suggest")[0]
    for text in (repr(key), str(key), repr(pool), f"{key}", repr(pool.keys("suggest"))):
        assert secret not in text and key.alias in text
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(key)
    res = TaotokenResource(base_url="https://taotoken.net/api", model_id="m")
    g = res.get_gateway(Ledger(tmp_path / "l.sqlite"), environ=env)
    assert secret not in repr(res) and secret not in repr(g) and secret not in str(res.model_dump())
    assert pool.scrub(f"oops {secret} and Bearer abc.def") == f"oops <{key.alias}> and <redacted>"


def test_resource_holds_no_key_fields():
    def suspicious(f: str) -> bool:
        f = f.lower()
        return "key" in f or "secret" in f or "token" in f and not (f.startswith("max_tokens") or f == "min_output_tokens")

    assert [f for f in TaotokenResource.model_fields if suspicious(f)] == []
