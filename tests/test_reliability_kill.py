"""`kill -9` of a running `kregress sweep`, then the same command again.

The first sweep SIGKILLs itself (test hook KREGRESS_TEST_KILL_AT) right after round 1's first variant is
compiled, while its benchmark step holds the only slot of the `gpu` pool. The resume must: say it found the
dead run, mark it failed and free its slots; finish within a bounded time; recompile nothing that had
finished (the baseline and that variant come from the compile cache). Afterwards the spec sensor launches
nothing for the spec (the CLI sweep counts as swept) and an unchanged re-run is answered without running.
Real processes, a real instance, real Triton AOT compiles on the CPU (no GPU: the interpreter backend).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
RESUME_LIMIT_S = 600  # the old behaviour waits forever on the dead run's slot

SPEC = {
    "task_id": "kill_resume", "kernel_family": "gemm", "dtype": "fp16",
    "shape_matrix": [{"M": 256, "N": 256, "K": 256}], "correctness_shapes": [{"M": 33, "N": 17, "K": 19}],
    "search": {"strategy": "local", "variants_per_round": 2, "max_rounds": 1, "no_improve_rounds": 1, "seed": 1},
    "benchmark": {"timeout_s": 120},
    "baseline": {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 4, "num_stages": 2, "num_warps": 4},
}


def _sweep(spec_file: Path, home: Path, kill_at: str = "", timeout: float = RESUME_LIMIT_S) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TAOTOKEN_", "KREGRESS_"))}
    env.update(DAGSTER_HOME=str(home), TRITON_DEFAULT_FP_FUSION="1")
    if kill_at:
        env["KREGRESS_TEST_KILL_AT"] = kill_at
    return subprocess.run([sys.executable, "-m", "kernel_assets.cli", "sweep", str(spec_file), "--dagster-home", str(home)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def _bench_pool() -> str:
    """The device pool the sweep's benchmark steps took (its environment has no KREGRESS_* variables)."""
    from kernel_assets.executors import placement

    return placement({k: v for k, v in os.environ.items() if not k.startswith("KREGRESS_")}).pool


def _instance(home: Path):
    os.environ["DAGSTER_HOME"] = str(home)
    return dg.DagsterInstance.get()


@pytest.fixture(scope="module")
def killed_then_resumed(tmp_path_factory):
    root = tmp_path_factory.mktemp("kill")
    home = root / "home"
    spec_file = root / "kill_resume.yaml"
    spec_file.write_text(yaml.safe_dump(SPEC))
    killed = _sweep(spec_file, home, kill_at="log:compiled r1-local-01")
    old = os.environ.get("DAGSTER_HOME")
    instance = _instance(home)
    runs = instance.get_runs()
    held = instance.event_log_storage.get_concurrency_info(_bench_pool())
    before = {"runs": runs, "held": [s.run_id for s in held.claimed_slots]}
    resumed = _sweep(spec_file, home)
    yield {"home": home, "spec_file": spec_file, "killed": killed, "resumed": resumed, "before": before}
    if old is None:
        os.environ.pop("DAGSTER_HOME", None)
    else:
        os.environ["DAGSTER_HOME"] = old


def test_the_kill_left_a_started_run_holding_the_gpu_slot(killed_then_resumed):
    k = killed_then_resumed
    assert k["killed"].returncode == -9, k["killed"].stderr[-2000:]
    assert "compiled r1-local-01" in k["killed"].stderr and "compiled baseline" in k["killed"].stderr
    (run,) = k["before"]["runs"]
    assert run.status == dg.DagsterRunStatus.STARTED
    assert run.tags["kregress/host"] and int(run.tags["kregress/pid"]) > 0
    assert k["before"]["held"] == [run.run_id]  # what blocked every later sweep


def test_resume_frees_the_dead_run_and_finishes(killed_then_resumed):
    k = killed_then_resumed
    res = k["resumed"]
    assert res.returncode == 0, res.stderr[-3000:]
    dead = k["before"]["runs"][0].run_id
    assert f"run {dead} (pid {k['before']['runs'][0].tags['kregress/pid']}" in res.stderr
    assert "marked it failed and freed its concurrency slots" in res.stderr
    assert "report:" in res.stdout
    instance = _instance(k["home"])
    assert instance.get_run_by_id(dead).status == dg.DagsterRunStatus.FAILURE
    assert instance.event_log_storage.get_concurrency_info(_bench_pool()).claimed_slots == []


def test_resume_recompiles_nothing_that_finished(killed_then_resumed):
    err = killed_then_resumed["resumed"].stderr
    killed = killed_then_resumed["killed"].stderr
    assert "compiled baseline" not in err and "compiled r1-local-01" not in err, err[-3000:]
    assert "compile cache: 1 of 1 variant(s) already compiled" in err  # the baseline
    # round 1 compiles on two workers: r1-local-02 may have finished before r1-local-01 (the kill point)
    import re

    (done,) = [int(n) for n in re.findall(r"compile cache: (\d) of 2 variant\(s\) already compiled", err)]
    assert done in (1, 2) and (done == 2 or "compiled r1-local-02" not in killed)  # what finished is reused
    assert ("compiled r1-local-02" in err) == (done == 1)  # only what had not finished is compiled again


def test_spec_sensor_launches_nothing_for_the_spec_swept_from_the_cli(killed_then_resumed, monkeypatch):
    from kernel_assets.definitions import defs

    k = killed_then_resumed
    monkeypatch.setenv("KREGRESS_SPECS_DIR", str(k["spec_file"].parent))
    instance = _instance(k["home"])
    result = defs.get_sensor_def("spec_sensor")(dg.build_sensor_context(instance=instance, cursor=None))
    assert [r.partition_key for r in result.run_requests] == []


def test_unchanged_rerun_is_answered_without_running(killed_then_resumed):
    import json

    from kernel_assets.cli import _code_hash

    k = killed_then_resumed
    recorded = json.loads((k["home"] / "kregress_cli" / "last_sweep" / "kill_resume.json").read_text())
    if recorded["fingerprint"]["code_hash"] != _code_hash():
        pytest.skip("the project's sources were edited while the test ran (a shared working tree): not unchanged")
    again = _sweep(k["spec_file"], k["home"], timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "unchanged since run" in again.stderr and "--force" in again.stderr
    assert "report:" in again.stdout and "verdicts:" in again.stdout
    assert "baseline_metrics" not in again.stderr  # nothing ran
