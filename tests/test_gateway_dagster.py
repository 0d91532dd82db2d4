"""A classified gateway error leaves a Dagster step with its one line intact: Dagster wraps
step errors, and the CLI finds ``[class] ... Fix: ...`` in the failure with ``gateway_error_line``."""

from __future__ import annotations

import dagster as dg
import pytest

from kregress.core.endpoints import gateway_error_line
from kregress.testing.fake_gateway import FakeOpenAI, Reply
from resources.ledger import LedgerResource
from resources.taotoken import TaotokenResource

KEY = "sk" "-dagster-test-key-00000000000"


@dg.asset
def asks_the_model(taotoken: TaotokenResource, ledger: LedgerResource) -> str:
    gw = taotoken.get_gateway(ledger.get_ledger())
    try:
        return gw.chat("suggest", [{"role": "user", "content": "propose"}]).text
    finally:
        gw.close()


@pytest.mark.parametrize("reply,category", [
    (Reply(status=503, headers={"Retry-After": "0.2"}), "transient"),
    (Reply(status=401, body={"error": {"message": "Invalid API key", "code": "invalid_api_key"}}), "credentials"),
    (Reply(status=400, body={"error": {"message": "max_tokens is too large for this model", "type": "invalid_request_error"}}), "request"),
])
def test_the_one_line_survives_dagster_step_failure(tmp_path, monkeypatch, reply, category):
    monkeypatch.setenv("TAOTOKEN_KEY_SUGGEST", KEY)
    with FakeOpenAI() as srv, dg.DagsterInstance.ephemeral() as instance:
        srv.default = reply
        res = dg.materialize(
            [asks_the_model], instance=instance, raise_on_error=False,
            resources={"taotoken": TaotokenResource(base_url=srv.root, model_id=srv.models[0], retry_horizon_s=0.5),
                       "ledger": LedgerResource(url=str(tmp_path / "ledger.sqlite"))},
        )
    assert not res.success
    (failure,) = res.get_step_failure_events()
    err = failure.step_failure_data.error
    line = gateway_error_line(err.to_string())
    assert line is not None and line.startswith(f"[{category}] ") and " Fix: " in line
    cause = err.cause
    assert cause is not None and cause.message.splitlines()[0].endswith(line)  # the exception's message is that line
    assert KEY not in err.to_string()
