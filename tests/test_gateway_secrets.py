"""Secrets: run a small sweep with recognisable fake keys, then grep everything it left for them.

The fake server is hostile on purpose: its error bodies echo the key back, as some real providers do.
Checked: exception text and repr, reprs of the resource / gateway / pool, log records at DEBUG from every
logger (openai, httpx2, dagster included), stdout/stderr, every file under the test's DAGSTER_HOME
(ledger + WAL, cache, exports, Dagster's run storage and compute logs).
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import pickle
from pathlib import Path

import dagster as dg
import pytest
from gateway_helpers import make_gateway
from test_llm_agent import VERDICTS, item, make_ctx, make_spec

from kernel_assets.agent.llm import HybridPolicy, LLMPolicy, write_narrative
from kernel_assets.cli_usage import register
from kernel_assets.tokens import build_token_assets
from kregress.testing.fake_gateway import FakeOpenAI
from resources.ledger import LedgerResource
from resources.taotoken import CredentialsError, GatewayError, TaotokenResource

CANARIES = {
    "TAOTOKEN_KEY_SUGGEST": "sk" "-LEAKCANARY-suggest-aaaa1111bbbb2222,tk-LEAKCANARY-suggest-cccc3333dddd4444",
    "TAOTOKEN_KEY_REPORT": "sk" "-LEAKCANARY-report-eeee5555ffff6666",
    "TAOTOKEN_KEY_REVIEW": "LEAKCANARYreview0000000000",
    "TAOTOKEN_API_KEY": "LEAKCANARYfallback999999999",
    "OPENAI_API_KEY": "sk" "-LEAKCANARY-openai-777777777777",
}
SECRETS = [s for v in CANARIES.values() for s in v.split(",")]
NEEDLES = SECRETS + ["LEAKCANARY"]  # no fragment of any key either


def assert_clean(text: str, where: str) -> None:
    for n in NEEDLES:
        assert n not in text, f"{n[:12]}... found in {where}"


def test_no_key_anywhere_after_a_sweep(tmp_path, monkeypatch, caplog, capsys):
    home = tmp_path / "dagster_home"
    home.mkdir()
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    for k, v in CANARIES.items():
        monkeypatch.setenv(k, v)
    caplog.set_level(logging.DEBUG)  # every logger, the SDK's and httpx's included
    monkeypatch.setenv("OPENAI_LOG", "debug")
    texts: list[tuple[str, str]] = []

    with FakeOpenAI() as srv:
        ledger = LedgerResource().get_ledger()  # $DAGSTER_HOME/ledger.sqlite
        g = make_gateway(srv, ledger, dict(CANARIES))
        texts += [(repr(g), "repr(gateway)"), (repr(g.keys), "repr(pool)"), (str(TaotokenResource(base_url=srv.root, model_id="m")), "resource")]
        with pytest.raises(TypeError):
            pickle.dumps(g.keys.keys("suggest")[0])

        def echo(status: int, key: str) -> dict:
            return {"error": {"message": f"request with key {key} failed (Authorization: Bearer {key})", "code": "x"}}

        k1, k2 = CANARIES["TAOTOKEN_KEY_SUGGEST"].split(",")
        # round 1: a 429 that echoes the key, then success on the other key
        srv.push(status=429, body=echo(429, k1), headers={"Retry-After": "1"})
        srv.push(content=json.dumps([item("r1_v1", 32, 64, 8), item("r1_v2", 64, 128, 8)]))
        p1 = LLMPolicy(g).propose(make_ctx(rnd=1))
        # round 2: a 500 echoing the key, then prose
        srv.push(status=500, body=echo(500, k2))
        srv.push(content=f"I cannot answer. Your key is {k2}.")
        p2 = HybridPolicy(LLMPolicy(g), LLMPolicy(g)).propose(make_ctx(rnd=2))
        # round 3: both keys are rejected (the gateway fails over once), and the server says which one
        srv.push(status=401, body=echo(401, k1))
        srv.push(status=401, body=echo(401, k2))
        with pytest.raises(CredentialsError) as ei:
            LLMPolicy(g).propose(make_ctx(rnd=3))
        texts += [(str(ei.value), "exception str"), (repr(ei.value), "exception repr"), (str(ei.value.args), "exception args")]
        # a 403 on the report role, then a successful narrative
        srv.push(status=403, body=echo(403, CANARIES["TAOTOKEN_KEY_REPORT"]))
        n1 = write_narrative(g, make_spec(), VERDICTS)
        srv.push(content="All good.")  # the next step's gateway: the key another gateway saw rejected is tried again
        n2 = write_narrative(make_gateway(srv, ledger, dict(CANARIES), verify_model=False), make_spec(), VERDICTS)
        # budget refusal and retries exhausted carry aliases only
        g2 = make_gateway(srv, ledger, dict(CANARIES), max_attempts=1, verify_model=False)
        srv.push(status=503, body=echo(503, k1))
        try:
            g2.chat("suggest", [{"role": "user", "content": "x"}])
        except GatewayError as e:
            texts.append((str(e), "retries exhausted"))
        assert len(srv.chat_requests()) == 9

    for prop in (p1, p2):
        texts.append((json.dumps([s.model_dump() for s in prop.suggestions]) + json.dumps([d.model_dump() for d in prop.dropped]) + " ".join(prop.notes), "proposal"))
    texts += [(n1[0] + n1[1], "narrative fallback"), (n2[0] + n2[1], "narrative")]
    assert n1[1].startswith("fallback: credentials error") and n2[1].startswith("llm:report#")

    # exports, the CLI and the Dagster assets (run storage under DAGSTER_HOME)
    ledger.usage.export_jsonl(home / "usage.jsonl")
    ledger.usage.export_usage_csv(home / "usage.csv")
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    out = io.StringIO()
    args = parser.parse_args(["usage", "--csv", str(home / "table.csv")])
    args.func(args, out)
    texts.append((out.getvalue(), "cli output"))
    assert "suggest#" in out.getvalue()
    defs = build_token_assets(dg.StaticPartitionsDefinition(["toy-sweep"]), lambda k: make_spec())
    (home / "instance").mkdir()
    with dg.DagsterInstance.local_temp(tempdir=str(home / "instance")) as instance:
        res = dg.materialize(defs, partition_key="toy-sweep", instance=instance, resources={"ledger": LedgerResource()})
        assert res.success
        for ev in instance.all_logs(res.run_id):
            texts.append((str(ev), "dagster event log"))

    texts.append((caplog.text, "log records"))
    texts.append(("\n".join(str(r.args) + str(r.msg) for r in caplog.records), "log record args"))
    captured = capsys.readouterr()
    texts += [(captured.out, "stdout"), (captured.err, "stderr")]
    assert "suggest#" in caplog.text  # the logs do name keys, by alias

    for text, where in texts:
        assert_clean(text, where)
    files = [p for p in home.rglob("*") if p.is_file()]
    assert any(p.name == "ledger.sqlite" for p in files) and any(p.name.endswith(".jsonl") for p in files)
    for p in files:
        data = p.read_bytes()
        for n in NEEDLES:
            assert n.encode() not in data, f"{n[:12]}... found in {p.relative_to(home)}"
    # the ledger did record the attempts, under aliases
    aliases = {r.key_alias for r in ledger.usage.rows()}
    assert any(a.startswith("suggest#") for a in aliases) and any(a.startswith("report#") for a in aliases)
    assert all(Path(p).exists() for p in [home / "usage.jsonl", home / "table.csv"])
