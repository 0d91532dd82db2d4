"""Gateway failures and budgets as the terminal shows them (`kregress sweep`, strategy llm, the real openai SDK
against the local scripted server kregress/testing/fake_gateway.py on 127.0.0.1).

- a 401 on every key of the suggest role: one line with the error's class and fix, exit 1;
- a model id the server does not list: one line, exit 1;
- a server that reports far more input tokens than the round's budget: the summary says the budget was
  exceeded and the sweep exits 3; with --budget-overshoot warn it warns and exits 0.
One home for the module, so the baseline compiles once (the compile cache) and each scenario runs quickly.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from kernel_assets.agent.prompt import SUGGEST_SYSTEM_PROMPT
from kernel_assets.cli import EXIT_BUDGET, EXIT_FAILED, main
from kregress.testing.fake_gateway import FakeOpenAI, Reply

REPO = Path(__file__).resolve().parent.parent
KEYS = {"TAOTOKEN_KEY_SUGGEST": "sk" "-CLIGW-suggest-11112222333344445555,sk" "-CLIGW-suggest-66667777888899990000",
        "TAOTOKEN_KEY_REPORT": "sk" "-CLIGW-report-aaaabbbbccccddddeeee"}
CONFIG = dict(BLOCK_M=32, BLOCK_N=64, BLOCK_K=32, GROUP_M=4, num_stages=2, num_warps=4)


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    h = tmp_path_factory.mktemp("cli_gw") / "home"
    h.mkdir()
    (h / "dagster.yaml").write_text((REPO / "dagster_home" / "dagster.yaml").read_text())
    return h


@pytest.fixture
def spec_file(tmp_path):
    spec = yaml.safe_load((REPO / "specs" / "gemm_smoke.yaml").read_text())
    spec.update(task_id="cli_gateway", correctness_shapes=[{"M": 40, "N": 24, "K": 40}],
                shape_matrix=[{"M": 256, "N": 256, "K": 256}],
                baseline=dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=32, GROUP_M=4, num_stages=2, num_warps=4),
                budget={"max_input_tokens_per_round": 4000, "max_output_tokens_per_round": 2000, "max_total_tokens": 20000})
    spec["search"].update(strategy="llm", variants_per_round=1, max_rounds=1, no_improve_rounds=1)
    p = tmp_path / "cli_gateway.yaml"
    p.write_text(yaml.safe_dump(spec))
    return p


@pytest.fixture
def gateway(monkeypatch, home):
    with FakeOpenAI() as srv:
        monkeypatch.setenv("DAGSTER_HOME", str(home))
        monkeypatch.setenv("TAOTOKEN_BASE_URL", srv.root)
        monkeypatch.setenv("TAOTOKEN_MODEL_ID", "kregress-test-model")
        for k, v in KEYS.items():
            monkeypatch.setenv(k, v)
        yield srv


def _suggestion(seen, **usage) -> Reply:
    if seen.body["messages"][0]["content"] == SUGGEST_SYSTEM_PROMPT:
        items = [{"variant_id": "llm_r1_0", "config": CONFIG, "patch_summary": "wider N tile",
                  "expected_effect": "fewer blocks", "risk": "low"}]
        return Reply(content="```json\n" + json.dumps(items) + "\n```", **usage)
    return Reply(content="One round on the interpreter: latency verdicts need cuda evidence.", **usage)


def _one_failed_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if " FAILED round_1_suggestions: " in ln]
    assert len(lines) == 1, err[-3000:]
    assert "DagsterExecutionStepExecutionError" not in err and "Traceback" not in err
    return lines[0]


def test_401_on_every_key_is_one_line_with_class_and_fix(gateway, spec_file, capsys):
    gateway.handler = lambda seen: Reply(status=401, body={"error": {
        "message": "Incorrect API key provided: sk-***. You can find your API key at https://example.invalid.",
        "type": "invalid_request_error", "param": None, "code": "invalid_api_key"}})
    rc = main(["sweep", str(spec_file), "--force"])
    err = capsys.readouterr().err
    assert rc == EXIT_FAILED, err[-3000:]
    line = _one_failed_line(err)
    assert "[credentials]" in line and "Fix: " in line, line
    summary = [ln for ln in err.splitlines() if ln.startswith("kregress: sweep cli_gateway FAILED")]
    assert summary and "failed steps: round_1_suggestions" in summary[0]
    # one line per error: the classified line is printed once (not by the gateway, the policy and the summary again)
    assert sum("all 2 keys of role suggest were rejected" in ln for ln in err.splitlines()) == 1, err[-3000:]
    for v in KEYS.values():
        for k in v.split(","):
            assert k not in err


def test_model_not_listed_is_one_line(gateway, spec_file, capsys):
    gateway.models = ["some-other-model"]
    gateway.handler = _suggestion
    rc = main(["sweep", str(spec_file), "--force"])
    err = capsys.readouterr().err
    assert rc == EXIT_FAILED, err[-3000:]
    line = _one_failed_line(err)
    assert "[request]" in line and "kregress-test-model" in line and "Fix: " in line, line


def test_over_reporting_server_exceeds_the_budget_and_the_exit_code_says_so(gateway, spec_file, capsys):
    gateway.handler = lambda seen: _suggestion(seen, prompt_tokens=16000)  # 4x the round's input budget
    rc = main(["sweep", str(spec_file), "--force"])
    err = capsys.readouterr().err
    assert rc == EXIT_BUDGET, err[-3000:]
    assert "token budget EXCEEDED in sweep cli_gateway" in err and "warning" not in err
    assert "4000" in err.split("token budget EXCEEDED", 1)[1].splitlines()[0]  # names the limit it went over

    gateway.handler = lambda seen: _suggestion(seen, prompt_tokens=16000)
    rc = main(["sweep", str(spec_file), "--force", "--budget-overshoot", "warn"])
    err = capsys.readouterr().err
    assert rc == 0, err[-3000:]
    assert "warning: token budget EXCEEDED" in err
