"""A full sweep with strategy llm through the real openai SDK against a local scripted server, then a
leak search: recognisable fake keys must appear nowhere the sweep left anything."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import dagster as dg
import pandas as pd
import pytest
import yaml

from kernel_assets.agent.prompt import SUGGEST_SYSTEM_PROMPT
from kernel_assets.cli import EXIT_BUDGET
from kregress.testing.fake_gateway import FakeOpenAI, Reply

REPO = Path(__file__).resolve().parent.parent
KEYS = {
    "TAOTOKEN_KEY_SUGGEST": "sk" "-SWEEPCANARY-suggest-11112222333344445555,sk" "-SWEEPCANARY-suggest-66667777888899990000",
    "TAOTOKEN_KEY_REPORT": "sk" "-SWEEPCANARY-report-aaaabbbbccccddddeeee",
}
# Small tiles compile in about a second each; the second round also proposes one config outside the
# space and one duplicate of the baseline, which must be dropped with their reasons.
ROUND_CONFIGS = [
    [dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=32, GROUP_M=4, num_stages=2, num_warps=4),
     dict(BLOCK_M=64, BLOCK_N=32, BLOCK_K=32, GROUP_M=8, num_stages=2, num_warps=4)],
    [dict(BLOCK_M=32, BLOCK_N=64, BLOCK_K=32, GROUP_M=4, num_stages=2, num_warps=4),
     dict(BLOCK_M=48, BLOCK_N=64, BLOCK_K=32, GROUP_M=4, num_stages=2, num_warps=4),
     dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, GROUP_M=4, num_stages=2, num_warps=4)],
]


def scripted(server: FakeOpenAI):
    calls = {"suggest": 0}

    def handler(seen) -> Reply:
        system = seen.body["messages"][0]["content"]
        if system == SUGGEST_SYSTEM_PROMPT:
            k = calls["suggest"]
            items = [{"variant_id": f"llm_r{k + 1}_{i}", "config": cfg, "patch_summary": f"try {i}",
                      "expected_effect": "better wave fill", "risk": "low"} for i, cfg in enumerate(ROUND_CONFIGS[k])]
            # a 429 on the first key of the first call: the round must fail over, not stall
            if k == 0 and not any(r.path.endswith("/chat/completions") for r in server.requests[:-1]):
                return Reply(status=429, headers={"Retry-After": "0"}, body={"error": {"message": "slow down"}})
            calls["suggest"] += 1
            return Reply(content="```json\n" + json.dumps(items) + "\n```")
        return Reply(content="Two rounds, nothing measured on a GPU: every latency verdict waits for cuda evidence.")

    server.handler = handler
    return calls


@pytest.mark.timeout(600)
def test_llm_sweep_end_to_end_and_no_key_leaks(tmp_path, dagster_home, monkeypatch, caplog, capsys):
    spec = yaml.safe_load((REPO / "specs" / "gemm_smoke.yaml").read_text())
    spec.update(task_id="gemm_llm_smoke", correctness_shapes=[{"M": 40, "N": 24, "K": 40}])
    spec["search"].update(strategy="llm", variants_per_round=2, max_rounds=2)
    spec_file = tmp_path / "gemm_llm_smoke.yaml"
    spec_file.write_text(yaml.safe_dump(spec))
    caplog.set_level(logging.DEBUG)
    with FakeOpenAI() as srv:
        calls = scripted(srv)
        monkeypatch.setenv("TAOTOKEN_BASE_URL", srv.root)
        monkeypatch.setenv("TAOTOKEN_MODEL_ID", "kregress-test-model")
        for k, v in KEYS.items():
            monkeypatch.setenv(k, v)
        from kernel_assets.cli import main

        rc = main(["sweep", str(spec_file)])
    out = capsys.readouterr()
    assert rc == 0, out.err[-3000:]
    assert calls["suggest"] == 2
    report_dir = dagster_home / "reports" / "gemm_llm_smoke"
    verdicts = pd.read_parquet(report_dir / "verdicts.parquet")
    assert set(verdicts["source"]) == {"llm"} and len(verdicts) == 3  # 2 + 1 (one invalid, one duplicate dropped)
    report = (report_dir / "report.md").read_text()
    assert "outside the space" in report and "already measured" in report
    assert "(key report#" in report and "without a model" not in report and "every latency verdict waits" in report  # narrative written once, by the model
    assert "## Tokens" in report and "suggest#" in report

    from resources.ledger import LedgerResource

    ledger = LedgerResource().get_ledger()
    rows = ledger.usage.rows()
    chat_rows = [r for r in rows if r.role in ("suggest", "report")]
    assert len(chat_rows) == len(srv.chat_requests()) == 4  # one row per attempt: 429 + 2 suggest + 1 report
    assert [r.status for r in chat_rows].count("ok") == 3 and any("429" in r.error_class for r in chat_rows)
    assert len({r.key_alias for r in chat_rows if r.role == "suggest"}) == 2  # failed over to the other key
    assert sum(r.total_tokens for r in chat_rows) > 0

    texts = [out.out, out.err, caplog.text] + [str(r.msg) + str(r.args) for r in caplog.records]
    instance = dg.DagsterInstance.get()
    for run in instance.get_runs():
        texts += [str(e) for e in instance.all_logs(run.run_id)]
    needles = [k for v in KEYS.values() for k in v.split(",")] + ["SWEEPCANARY"]
    for t in texts:
        for n in needles:
            assert n not in t
    files = [p for p in dagster_home.rglob("*") if p.is_file()]
    assert any(p.suffix == ".parquet" for p in files) and any(p.name == "ledger.sqlite" for p in files)
    for p in files:
        blob = p.read_bytes()
        for n in needles:
            assert n.encode() not in blob, f"key material in {p.relative_to(dagster_home)}"


@pytest.mark.timeout(600)
def test_llm_sweep_with_every_key_rejected_fails_with_the_one_line(tmp_path, dagster_home, monkeypatch, capsys):
    """Both suggest keys rejected (the gateway fails over once, then gives up): the sweep exits non-zero and the
    run's failure carries the classified line intact (what the CLI prints)."""
    from kregress.core.endpoints import gateway_error_line

    spec = yaml.safe_load((REPO / "specs" / "gemm_smoke.yaml").read_text())
    spec.update(task_id="gemm_llm_rejected", correctness_shapes=[{"M": 40, "N": 24, "K": 40}])
    spec["search"].update(strategy="llm", variants_per_round=2, max_rounds=1)
    spec_file = tmp_path / "gemm_llm_rejected.yaml"
    spec_file.write_text(yaml.safe_dump(spec))
    with FakeOpenAI() as srv:
        srv.default = Reply(status=401, body={"error": {"message": "Incorrect API key provided", "type": "invalid_request_error",
                                                        "code": "invalid_api_key"}})
        monkeypatch.setenv("TAOTOKEN_BASE_URL", srv.root)
        monkeypatch.setenv("TAOTOKEN_MODEL_ID", "kregress-test-model")
        for k, v in KEYS.items():
            monkeypatch.setenv(k, v)
        from kernel_assets.cli import main

        rc = main(["sweep", str(spec_file)])
        tokens = [s.token for s in srv.requests]
    out = capsys.readouterr()
    assert rc != 0
    assert "all 2 keys of role suggest were rejected" in out.out + out.err  # the CLI names the failure
    suggest_keys = KEYS["TAOTOKEN_KEY_SUGGEST"].split(",")
    assert sorted(set(tokens)) == sorted(suggest_keys)  # each key tried, then the role gave up
    instance = dg.DagsterInstance.get()
    failures = [e for run in instance.get_runs() for e in instance.all_logs(run.run_id)
                if e.dagster_event is not None and e.dagster_event.event_type_value == "STEP_FAILURE"]
    assert failures
    line = gateway_error_line(failures[0].dagster_event.step_failure_data.error.to_string())
    assert line is not None and line.startswith("[credentials] all 2 keys of role suggest were rejected") and " Fix: " in line
    for n in suggest_keys + ["SWEEPCANARY"]:
        assert n not in out.out + out.err and n not in line


@pytest.mark.timeout(600)
def test_llm_sweep_whose_budget_refuses_every_prompt_says_so(tmp_path, dagster_home, monkeypatch, capsys):
    """A round budget too small for even the shortest suggest prompt: nothing is sent, and the stop
    reason names the budget and the fields to raise instead of "the agent proposed nothing new"."""
    spec = yaml.safe_load((REPO / "specs" / "gemm_smoke.yaml").read_text())
    spec.update(task_id="gemm_llm_tiny_budget", correctness_shapes=[{"M": 40, "N": 24, "K": 40}])
    spec["search"].update(strategy="llm", variants_per_round=2, max_rounds=1)
    spec["budget"] = {"max_input_tokens_per_round": 50, "max_output_tokens_per_round": 8000, "max_total_tokens": 100000}
    spec_file = tmp_path / "gemm_llm_tiny_budget.yaml"
    spec_file.write_text(yaml.safe_dump(spec))
    with FakeOpenAI() as srv:
        scripted(srv)
        monkeypatch.setenv("TAOTOKEN_BASE_URL", srv.root)
        monkeypatch.setenv("TAOTOKEN_MODEL_ID", "kregress-test-model")
        for k, v in KEYS.items():
            monkeypatch.setenv(k, v)
        from kernel_assets.cli import main

        rc = main(["sweep", str(spec_file)])
        suggest_sent = [r for r in srv.chat_requests() if r.body["messages"][0]["content"] == SUGGEST_SYSTEM_PROMPT]
    out = capsys.readouterr()
    assert suggest_sent == []
    text = out.out + out.err
    assert "round 1: the token budget refused the suggest prompt, nothing was sent (BudgetExceeded:" in text, text[-3000:]
    assert "max_input_tokens_per_round" in text and "proposed nothing new" not in text
    # nothing was overspent, but a budget that refuses every prompt cannot run an llm sweep: exit 3, with the reason
    assert rc == EXIT_BUDGET, text[-3000:]
    over = [ln for ln in text.splitlines() if "token budget EXCEEDED" in ln]
    assert len(over) == 1 and "the budget refused every suggest prompt (1 refused, none sent): round 1 input" in over[0]
