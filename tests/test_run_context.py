"""One run context: the bound spec, the budget scope and the evidence backend are made once per run, and a
run re-executed from failure (Dagster's retry) keeps its budget scope.

A real Dagster instance (temp DAGSTER_HOME), the project's Definitions and resources, the real openai SDK
against the local scripted server, the recorded RTX 3090 file (replay: no compile). The first run fails in
verdict_report after the report's model call (its report folder cannot be created: a file is in the way);
the re-execution from failure runs verdict_report again, whose model call must count against the sweep of
the run it continues, the root run, as every suggest call did. The ledger says so row by row.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import dagster as dg
import pytest
import yaml

from kernel_assets.agent.prompt import SUGGEST_SYSTEM_PROMPT
from kregress.core.family import get_family
from kregress.core.spec import load_spec
from kregress.testing.fake_gateway import FakeOpenAI, Reply

REPO = Path(__file__).resolve().parent.parent
BASE_SPEC = REPO / "specs" / "replay_clblast_rtx3090.yaml"
TASK = "retry_scope"
_ROUND = re.compile(r"for round (\d+) of")


def _spec_file(tmp_path: Path) -> Path:
    spec = yaml.safe_load(BASE_SPEC.read_text())
    spec["task_id"] = TASK
    spec["search"] = {"strategy": "llm", "variants_per_round": 3, "max_rounds": 2, "no_improve_rounds": 2, "seed": 0}
    spec["params"]["cache_file"] = str(REPO / "data" / "replay" / spec["params"]["cache_file"])
    p = tmp_path / f"{TASK}.yaml"
    p.write_text(yaml.safe_dump(spec))
    return p


def _configs(n: int) -> list[list[int]]:
    spec = load_spec(BASE_SPEC)
    fam = get_family(spec.kernel_family).for_params(spec.params)
    keys = list(fam.space.params)
    out = [[c[k] for k in keys] for c in fam.space.enumerate(spec.params, spec.hardware.limits) if c != spec.baseline]
    return out[::11][:n]


@pytest.mark.timeout(600)
def test_a_retried_run_keeps_its_budget_scope(tmp_path, dagster_home, monkeypatch):
    from kernel_assets.testing.retry_job import sweep_job
    from kregress.core.paths import reports_dir
    from resources.ledger import LedgerResource

    configs = _configs(6)

    def handler(seen) -> Reply:
        msgs = seen.body["messages"]
        if msgs[0]["content"] != SUGGEST_SYSTEM_PROMPT:
            return Reply(content="Recorded runs only: see the verdict table.")
        k = int(_ROUND.search(msgs[1]["content"]).group(1))
        items = [{"id": f"r{k}_v{i}", "c": c, "x": [1.1, 1.0, 1.2], "s": "another tile"}
                 for i, c in enumerate(configs[3 * (k - 1): 3 * k])]
        return Reply(content=json.dumps(items))

    spec_file = _spec_file(tmp_path)
    with FakeOpenAI() as srv:
        srv.handler = handler
        monkeypatch.setenv("TAOTOKEN_BASE_URL", srv.root)
        monkeypatch.setenv("TAOTOKEN_MODEL_ID", "kregress-test-model")
        monkeypatch.setenv("TAOTOKEN_KEY_SUGGEST", "sk" "-RETRYSCOPE-suggest-1111222233334444")
        monkeypatch.setenv("TAOTOKEN_KEY_REPORT", "sk" "-RETRYSCOPE-report-5555666677778888")
        monkeypatch.setenv("KREGRESS_SPEC_FILES", str(spec_file))
        monkeypatch.setenv("KREGRESS_EXECUTOR", "in_process")
        instance = dg.DagsterInstance.get()
        instance.add_dynamic_partitions("specs", [TASK])
        blocker = reports_dir(TASK)
        blocker.parent.mkdir(parents=True, exist_ok=True)
        blocker.write_text("in the way: verdict_report cannot create its folder")
        job = dg.reconstructable(sweep_job)

        first = dg.execute_job(job, instance, tags={"dagster/partition": TASK})
        assert not first.success
        failed = [e.step_key for e in first.all_events if e.event_type_value == "STEP_FAILURE"]
        assert failed == ["verdict_report"], failed
        blocker.unlink()
        retry = dg.execute_job(job, instance, tags={"dagster/partition": TASK},
                               reexecution_options=dg.ReexecutionOptions.from_failure(first.run_id, instance))
        assert retry.success and retry.dagster_run.root_run_id == first.run_id != retry.run_id
        ran = {e.step_key for e in retry.all_events if e.event_type_value == "STEP_SUCCESS"}
        assert "verdict_report" in ran and "baseline_metrics" not in ran  # a retry from failure, not a new sweep

    ledger = LedgerResource().get_ledger()
    rows = ledger.usage.rows(partition=TASK)
    roles = [r.role for r in rows]
    assert roles.count("suggest") >= 2 and roles.count("report") == 2, roles  # the report's call in each run
    scoped = ledger.usage.rows(partition=TASK, sweep=first.run_id)
    assert len(scoped) == len(rows)  # every row, the retry's report call included, counts against the root's sweep
    assert not ledger.usage.rows(sweep=retry.run_id)
    # the token assets of the retry judge that same sweep
    usage = [e for e in instance.get_records_for_run(retry.run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION).records
             if e.asset_key == dg.AssetKey("token_usage")]
    meta = usage[-1].event_log_entry.dagster_event.event_specific_data.materialization.metadata
    assert meta["sweep"].value.startswith(first.run_id)
