"""Refuse what cannot run, before it runs (issue 55): on a host without CUDA, `kregress sweep --backend cuda`
exits 2 with one line before any run exists, and a launched run of a code location that times on a GPU
(KREGRESS_ENV=gpu) is refused by the instance's run launcher, marked canceled, its partition not Failed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # subprocesses that import torch and Dagster

REPO = Path(__file__).resolve().parent.parent


def _cuda_problem() -> str:
    from resources.gpu import cuda_unavailable

    return cuda_unavailable()


needs_no_cuda = pytest.mark.skipif(not _cuda_problem(), reason="this host has CUDA: nothing to refuse")


@needs_no_cuda
def test_sweep_backend_cuda_exits_2_before_any_run(tmp_path):
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("KREGRESS_")}
    p = subprocess.run([sys.executable, "-m", "kernel_assets.cli", "sweep", "specs/gemm_smoke.yaml", "--backend", "cuda",
                        "--dagster-home", str(home)], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    assert "--backend cuda cannot run on this host" in lines[0] and _cuda_problem() in lines[0]
    assert "nothing was started" in lines[0]
    assert not (home / "storage").exists() and not (home / "history").exists()  # no instance, no run, no partition


@needs_no_cuda
def test_sweep_env_gpu_is_refused_too_and_a_replay_is_not(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("KREGRESS_")}
    p = subprocess.run([sys.executable, "-m", "kernel_assets.cli", "sweep", "specs/gemm_smoke.yaml", "--env", "gpu",
                        "--dagster-home", str(tmp_path / "h")], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and "--env gpu" in p.stderr, p.stderr
    # a recorded family replays: --backend cuda asks nothing of this host
    from argparse import Namespace

    from kernel_assets.cli import cuda_refusal
    from kregress.core.bind import load_bound

    bound = load_bound(REPO / "specs" / "replay_clblast_rtx3090.yaml")
    assert cuda_refusal(Namespace(backend="cuda", env=None), bound) == ""
    assert cuda_refusal(Namespace(backend="interpreter", env="gpu"), load_bound(REPO / "specs" / "gemm_smoke.yaml")) == ""


SCRIPT = textwrap.dedent("""
    import json, sys
    import dagster as dg
    from dagster._core.launcher import LaunchRunContext
    from dagster._core.storage.partition_status_cache import get_and_update_asset_status_cache_value
    from kernel_assets.constants import SPECS_PARTITIONS, SWEEP_JOB
    from kernel_assets.definitions import defs

    instance = dg.DagsterInstance.get()
    instance.add_dynamic_partitions(SPECS_PARTITIONS.name, ["gemm_smoke"])
    job = defs.resolve_job_def(SWEEP_JOB)
    tags = {"dagster/partition": "gemm_smoke"}
    out = {"launcher": type(instance.run_launcher).__name__}

    def failed(key):
        value = get_and_update_asset_status_cache_value(instance, dg.AssetKey(key), SPECS_PARTITIONS)
        subset = value.deserialize_failed_partition_subsets(SPECS_PARTITIONS) if value else None
        return sorted(subset.get_partition_keys()) if subset else []

    refused = instance.create_run_for_job(job_def=job, tags=tags)
    instance.run_launcher.launch_run(LaunchRunContext(dagster_run=refused, workspace=None))
    run = instance.get_run_by_id(refused.run_id)
    out["refused_status"] = run.status.value
    out["refused_message"] = [r.message for r in instance.all_logs(run.run_id, of_type=dg.DagsterEventType.RUN_CANCELED)]
    out["failed_after_refusal"] = failed("baseline_metrics")
    # the probe can tell: a run of the same partition that really failed leaves it Failed
    other = instance.create_run_for_job(job_def=job, tags=tags)
    instance.report_run_failed(other, message="a real failure")
    out["failed_after_failure"] = failed("baseline_metrics")
    print(json.dumps(out))
""")


@needs_no_cuda
def test_launcher_refuses_a_gpu_run_on_a_host_without_cuda(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text((REPO / "dagster_home" / "dagster.yaml").read_text())
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("KREGRESS_")}, "DAGSTER_HOME": str(home),
           "KREGRESS_ENV": "gpu", "KREGRESS_DEVICE": "test-dev"}
    p = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["launcher"] == "WorkerCheckingRunLauncher"
    assert got["refused_status"] == "CANCELED"
    (msg,) = got["refused_message"]
    assert "run refused before it started" in msg and "baseline_metrics" in msg and _cuda_problem() in msg
    assert got["failed_after_refusal"] == []
    assert got["failed_after_failure"] == ["gemm_smoke"]


def test_a_local_code_location_asks_nothing_of_its_host():
    from kernel_assets.executors import NEEDS_TAG, needs_tags

    assert needs_tags({}) == {} and needs_tags({"KREGRESS_ENV": "local"}) == {}
    assert needs_tags({"KREGRESS_ENV": "gpu"}) == {NEEDS_TAG: "cuda"}
