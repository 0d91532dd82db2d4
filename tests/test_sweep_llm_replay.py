"""llm sweeps on the recorded RTX 3090 file (replay: measured evidence, no GPU, no compile), through `kregress sweep`,
the real openai SDK and the local scripted server (kregress.testing.fake_gateway):

- an answer with nothing to measure (prose, configs outside the space, an empty choices list): one line naming the
  cause and the fix, a true stop reason, exit 4; ``hybrid`` goes on with local proposals and says so;
- reused variant_ids keep every valid config, identical configs are measured once; the forecasts are on record
  (the suggestions' materialization) before the round is measured, land in verdicts.parquet, and the report's
  calibration figures are the ones computed independently from the verdict rule's p50 ratios;
- a SIGKILL while the server holds the report call: that attempt keeps its ledger row, the resume settles the
  dead process's reservation, and server attempts equal ledger rows;
- a ledger file that cannot be written: one line with the file and the fix, exit 1.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import dagster as dg
import numpy as np
import pandas as pd
import pytest
import yaml
from scipy.stats import spearmanr

from kernel_assets.agent.llm import NARRATIVE_SYSTEM_PROMPT
from kernel_assets.agent.prompt import SUGGEST_SYSTEM_PROMPT
from kernel_assets.cli import EXIT_FAILED, EXIT_NO_PROPOSAL, main
from kregress.core.family import get_family
from kregress.core.spec import load_spec
from kregress.testing.fake_gateway import FakeOpenAI, Reply

REPO = Path(__file__).resolve().parent.parent
KEYS = {"TAOTOKEN_KEY_SUGGEST": "sk" "-REPLAYLLM-suggest-11112222333344445555",
        "TAOTOKEN_KEY_REPORT": "sk" "-REPLAYLLM-report-aaaabbbbccccddddeeee"}
BASE_SPEC = REPO / "specs" / "replay_clblast_rtx3090.yaml"
_ROUND = re.compile(r"for round (\d+) of")


def write_spec(tmp_path: Path, task_id: str, strategy: str = "llm", **search) -> Path:
    spec = yaml.safe_load(BASE_SPEC.read_text())
    spec["task_id"] = task_id
    spec["search"] = {"strategy": strategy, "variants_per_round": 6, "max_rounds": 1, "no_improve_rounds": 2, "seed": 0, **search}
    spec["params"]["cache_file"] = str(REPO / "data" / "replay" / spec["params"]["cache_file"])
    p = tmp_path / f"{task_id}.yaml"
    p.write_text(yaml.safe_dump(spec))
    return p


def recorded_configs(n: int, skip: int = 0) -> list[list[int]]:
    """``n`` configs of the recorded file (values in the space's key order), the baseline left out."""
    spec = load_spec(BASE_SPEC)
    fam = get_family(spec.kernel_family).for_params(spec.params)
    keys = list(fam.space.params)
    out = [[c[k] for k in keys] for c in fam.space.enumerate(spec.params, spec.hardware.limits) if c != spec.baseline]
    return out[skip * 7 :: 7][:n]  # spread over the space


def suggest_round(seen) -> int | None:
    msgs = seen.body["messages"]
    if msgs[0]["content"] != SUGGEST_SYSTEM_PROMPT:
        return None
    return int(_ROUND.search(msgs[1]["content"]).group(1))


@pytest.fixture
def env(monkeypatch, dagster_home):
    with FakeOpenAI() as srv:
        monkeypatch.setenv("TAOTOKEN_BASE_URL", srv.root)
        monkeypatch.setenv("TAOTOKEN_MODEL_ID", "kregress-test-model")
        for k, v in KEYS.items():
            monkeypatch.setenv(k, v)
        yield srv


NARRATIVE = "Recorded runs only: see the verdict table."


def _answer(reply_for_round):
    def handler(seen) -> Reply:
        rnd = suggest_round(seen)
        if rnd is None:
            return Reply(content=NARRATIVE)
        return reply_for_round(rnd)
    return handler


# --- an answer with nothing to measure ----------------------------------------------------------------

OUTSIDE = json.dumps([{"id": f"r1_v{i}", "c": [96] * 15, "x": [1.2, 1.0, 1.4], "s": "odd tile"} for i in range(1, 7)])
EMPTY_CHOICES = {"id": "chatcmpl-e", "object": "chat.completion", "created": 1, "model": "kregress-test-model", "choices": [],
                 "usage": {"prompt_tokens": 640, "completion_tokens": 0, "total_tokens": 640}}


@pytest.mark.timeout(900)
@pytest.mark.parametrize("case,reply,strategy,cause,fix", [
    ("prose", Reply(content="I would make the work-group tile larger and vectorise the loads."), "llm",
     "the model's reply was prose, not JSON", "use a model that follows a JSON-only instruction"),
    ("outside", Reply(content=OUTSIDE), "llm",
     "every proposed config was outside the family's space or broke its rules (6 of 6 proposal(s); first: outside the space",
     "use a stronger model"),
    ("no_choices", Reply(body=EMPTY_CHOICES), "llm",
     "the provider answered with an empty choices list (no message) (640+0 tokens billed, recorded in the ledger)",
     "retry later, or set TAOTOKEN_MODEL_ID to another model"),
    ("hybrid", Reply(content="Larger tiles should help."), "hybrid",
     "the model's reply was prose, not JSON; continuing with local proposals", "use a model that follows a JSON-only instruction"),
])
def test_an_unusable_answer_is_one_line_with_its_cause_and_fix(env, tmp_path, capsys, case, reply, strategy, cause, fix):
    env.handler = _answer(lambda rnd: reply)
    rc = main(["sweep", str(write_spec(tmp_path, f"replay_llm_{case}", strategy=strategy))])
    out = capsys.readouterr()
    err_lines = out.err.splitlines()
    round_lines = [ln for ln in err_lines if "round 1: no usable proposal from llm: " in ln and " Fix: " in ln]
    assert len(round_lines) == 1, out.err[-3000:]  # one line for the round, naming the cause and the fix
    assert cause in round_lines[0] and f"Fix: {fix}" in round_lines[0], round_lines[0]
    assert "Traceback" not in out.err and "proposed nothing new" not in out.out + out.err
    if strategy == "hybrid":
        assert rc == 0, out.err[-3000:]
        verdicts = pd.read_parquet(Path(os.environ["DAGSTER_HOME"]) / "reports" / f"replay_llm_{case}" / "verdicts.parquet")
        assert set(verdicts["source"]) == {"local"} and len(verdicts) == 6
        return
    assert rc == EXIT_NO_PROPOSAL, out.err[-3000:]
    (stopped,) = [ln for ln in out.out.splitlines() if ln.startswith("verdicts:")]
    assert "stopped: round 1: no usable proposal from llm: " in stopped  # the stop reason is true
    assert sum("no round produced a usable proposal" in ln for ln in err_lines) == 1
    if case == "no_choices":
        assert "empty choices list" in round_lines[0] and "TAOTOKEN_BASE_URL" not in out.err
        from resources.ledger import LedgerResource

        (row,) = LedgerResource().get_ledger().usage.rows(role="suggest")
        assert row.prompt_tokens == 640 and row.error_class == "content:200"  # what the server reported, recorded


# --- duplicate ids, forecasts on record before measurement, calibration -------------------------------


def test_duplicate_ids_forecasts_and_calibration_on_measured_evidence(env, tmp_path, capsys):
    cfgs = recorded_configs(11)
    r1 = cfgs[:6]
    r2 = cfgs[6:11]
    forecasts = {1: [1.3, 0.9, 1.1, 0.7, 1.6, 1.0], 2: [1.2, 0.8, 1.05, 1.4, 0.95]}

    def reply(rnd: int) -> Reply:
        if rnd == 1:  # every proposal reuses one id: all six are valid and must all be measured
            items = [{"id": "r1_v1", "c": c, "x": [f, round(f * 0.85, 3), round(f * 1.2, 3)], "b": "memory", "s": f"try {i}"}
                     for i, (c, f) in enumerate(zip(r1, forecasts[1]))]
        else:  # round-1 ids again, and the first config twice: measured once
            items = [{"id": f"r1_v{i + 1}", "c": c, "x": [f, round(f * 0.85, 3), round(f * 1.2, 3)], "s": "again"}
                     for i, (c, f) in enumerate(zip(r2, forecasts[2]))]
            items.append({"id": "r2_v9", "c": r2[0], "x": [1.2, 1.0, 1.4], "s": "the first one again"})
        return Reply(content=json.dumps(items))

    env.handler = _answer(reply)
    rc = main(["sweep", str(write_spec(tmp_path, "replay_llm_forecasts", max_rounds=2, no_improve_rounds=2))])
    out = capsys.readouterr()
    assert rc == 0, out.err[-3000:]
    home = Path(os.environ["DAGSTER_HOME"])
    report_dir = home / "reports" / "replay_llm_forecasts"
    v = pd.read_parquet(report_dir / "verdicts.parquet")
    assert len(v) == 11 and set(v["source"]) == {"llm"}  # 6 + 5: nothing valid was dropped, the repeat measured once
    assert list(v[v["round"] == 1]["variant_id"]) == [f"r1_v{i}" for i in range(1, 7)]  # renamed by position
    assert list(v[v["round"] == 2]["variant_id"]) == [f"r2_v{i}" for i in range(1, 6)]
    report = (report_dir / "report.md").read_text()
    assert "variant_id r1_v1 was already used earlier in this answer: renamed r1_v2" in report
    assert "variant_id r1_v1 was already used in an earlier round: renamed r2_v1" in report
    assert "the same config as r2_v1 in this answer: measured once" in report
    # the forecast columns, as proposed
    for col in ("expected_speedup", "expected_speedup_low", "expected_speedup_high", "bottleneck", "measured_speedup"):
        assert col in v.columns
    assert list(v["expected_speedup"]) == forecasts[1] + forecasts[2]
    # measured speedup (baseline p50 / variant p50) is the inverse of the verdict rule's own p50 ratio
    assert np.allclose(v["measured_speedup"], 1.0 / v["p50_ratio"], rtol=1e-9)

    # on record before measurement: round k's suggestions carry the forecasts before round k's variants step starts
    instance = dg.DagsterInstance.get()
    (run,) = instance.get_runs(limit=1)
    events = [e for e in instance.all_logs(run.run_id) if e.dagster_event is not None]
    for k in (1, 2):
        mat = next(i for i, e in enumerate(events) if e.dagster_event.event_type_value == "ASSET_MATERIALIZATION"
                   and e.dagster_event.asset_key == dg.AssetKey(f"round_{k}_suggestions"))
        start = next(i for i, e in enumerate(events) if e.dagster_event.event_type_value == "STEP_START"
                     and e.step_key == f"round_{k}_variants")
        assert mat < start
        recorded = events[mat].dagster_event.materialization.metadata["forecasts"].value
        assert {vid: vals[0] for vid, vals in recorded.items()} == {f"r{k}_v{i}": f for i, f in enumerate(forecasts[k], 1)}

    # calibration, computed here from the parquet (the verdict rule's ratios) and compared with the report's table
    f, m = v["expected_speedup"].to_numpy(), v["measured_speedup"].to_numpy()
    med = float(np.median(np.abs(np.log(f / m))))
    cov = float(np.mean((v["expected_speedup_low"] <= v["measured_speedup"]) & (v["measured_speedup"] <= v["expected_speedup_high"])))
    rho = float(np.mean([spearmanr(g["expected_speedup"], g["measured_speedup"]).statistic for _, g in v.groupby("round")]))
    line = next(ln for ln in report.splitlines() if ln.startswith("| llm | kregress-test-model | 11 | 11 |"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[4] == f"{med:.3f}" and cells[5] == f"{cov:.2f} (11)" and cells[6] == f"{rho:.2f}" and cells[7] == "2", line
    assert "rest on model evidence" not in report.split("## Forecasts", 1)[1].split("##", 1)[0]  # all of it is scored


# --- a kill during the report call -------------------------------------------------------------------


def _sweep_proc(spec_file: Path, home: Path, srv: FakeOpenAI) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TAOTOKEN_", "KREGRESS_"))}
    env.update(DAGSTER_HOME=str(home), TRITON_DEFAULT_FP_FUSION="1", TAOTOKEN_BASE_URL=srv.root,
               TAOTOKEN_MODEL_ID="kregress-test-model", **KEYS)
    return subprocess.Popen([sys.executable, "-m", "kernel_assets.cli", "sweep", str(spec_file)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.timeout(900)
def test_a_kill_during_the_report_call_leaves_its_row_and_the_resume_settles_it(tmp_path):
    from resources.ledger import Ledger

    home = tmp_path / "home"
    home.mkdir()
    shutil.copy(REPO / "dagster_home" / "dagster.yaml", home)
    spec_file = write_spec(tmp_path, "replay_llm_kill", variants_per_round=3)
    cfgs = recorded_configs(3)
    procs: dict[str, subprocess.Popen] = {}
    killed = threading.Event()

    def handler(seen) -> Reply:
        if seen.body["messages"][0]["content"] == NARRATIVE_SYSTEM_PROMPT and not killed.is_set():
            killed.set()
            os.kill(procs["first"].pid, signal.SIGKILL)  # while the server holds its report call
            return Reply(drop=True)
        if suggest_round(seen):
            return Reply(content=json.dumps([{"id": f"r1_v{i}", "c": c, "x": [1.1, 1.0, 1.3], "s": "t"} for i, c in enumerate(cfgs, 1)]))
        return Reply(content=NARRATIVE)

    with FakeOpenAI() as srv:
        srv.handler = handler
        procs["first"] = _sweep_proc(spec_file, home, srv)
        out, err = procs["first"].communicate(timeout=600)
        assert procs["first"].returncode == -signal.SIGKILL and killed.is_set(), err[-3000:]
        ledger = Ledger(home / "ledger.sqlite")
        report_rows = ledger.usage.rows(role="report")
        assert [(r.status, r.attempt) for r in report_rows] == [("sent", 1)]  # on record before it was sent
        (dangling,) = ledger.usage.in_flight()
        assert dangling["role"] == "report" and dangling["owner"].split(":")[1] == str(procs["first"].pid)

        procs["second"] = _sweep_proc(spec_file, home, srv)
        out, err = procs["second"].communicate(timeout=600)
        assert procs["second"].returncode == 0, err[-3000:]
        assert "left in flight by a process that died; settled" in err
        rows = ledger.usage.rows()
        sent = [r for r in rows if not r.cache_hit]
        assert len(sent) == len(srv.chat_requests())  # attempts equal ledger rows, the killed one included
        assert [(r.status, r.error_class) for r in rows if r.role == "report"] == [("error", "interrupted"), ("ok", "")]
        assert ledger.usage.in_flight() == []  # no reservation left dangling
        suggest_server = [s for s in srv.chat_requests() if suggest_round(s)]
        assert len(suggest_server) == 1 and sum(r.cache_hit for r in rows if r.role == "suggest") == 1  # not paid twice


# --- a ledger that cannot be written -----------------------------------------------------------------


@pytest.mark.timeout(900)
def test_an_unwritable_ledger_is_one_line_with_the_file_and_the_fix(env, tmp_path, capsys):
    from resources.ledger import Ledger

    if shutil.which("chattr") is None:
        pytest.skip("chattr is not installed: no way to make a file read-only for root here")
    path = Path(os.environ["DAGSTER_HOME"]) / "ledger.sqlite"
    Ledger(path).usage.rows()  # the file exists, with its schema
    if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
        pytest.skip("this filesystem does not support the immutable attribute (chattr +i)")
    try:
        env.handler = _answer(lambda rnd: Reply(content="[]"))
        rc = main(["sweep", str(write_spec(tmp_path, "replay_llm_readonly"))])
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)
    err = capsys.readouterr().err
    assert rc == EXIT_FAILED, err[-3000:]
    lines = [ln for ln in err.splitlines() if "[ledger] cannot write the token ledger" in ln]
    assert len(lines) == 1, err[-3000:]
    assert str(path) in lines[0] and "readonly database" in lines[0] and "Fix: make" in lines[0] and "writable" in lines[0]
    assert "OperationalError" not in err and "Traceback" not in err and "LedgerWriteError" not in err
    assert env.chat_requests() == []  # nothing was sent that the ledger could not record
