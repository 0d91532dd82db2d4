"""One pool per GPU, the pods of benchmark steps, and verdicts and history that never cross devices or toolchains.

- the pool a benchmark step declares: ``gpu/<host>/<device>`` from KREGRESS_DEVICE / KREGRESS_HOST, the UUID of
  the first visible GPU, or ``cpu``; ``gpu/k8s/<GPU model>`` under the k8s executor;
- the definitions really carry it (loaded in a fresh process with those variables);
- per-op ``dagster-k8s/config`` tags, run through dagster-k8s's own schema and its own Job builder: a step pod
  with one ``nvidia.com/gpu``, a node selector by GPU model and the GPU taint's toleration, and no such tag on
  the job (job-level tags do not reach step pods);
- a baseline timed on another GPU, driver, torch or Triton version never judges a variant: NEEDS_REVIEW,
  cause ``incomparable``, both identities named; history compares a spec within one identity only.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kernel_assets import executors
from kernel_assets.executors import (
    ENV_DEVICE,
    ENV_GPU_PRODUCT,
    ENV_HOST,
    ENV_STEPS_PER_RUN,
    GPU_PRODUCT_LABEL,
    benchmark_op_tags,
    executor_from_env,
    k8s_executor_config,
    pg_connection_bound,
    placement,
    visible_gpu_uuid,
)
from kregress.core.names import GPU_POOL, device_pool, is_benchmark_pool
from kregress.core.records import Measurement, VariantResult
from kregress.core.spec import load_spec

REPO = Path(__file__).resolve().parent.parent


# --- pool names and the placement ----------------------------------------------------------------------


def test_device_pool_names():
    assert device_pool("node-7", "GPU-8f3a2c") == "gpu/node-7/GPU-8f3a2c"
    assert device_pool("my host", " rtx 3090 ") == "gpu/my_host/rtx_3090"  # Dagster pool names have no whitespace
    assert device_pool("a/b", "MIG-1/2") == "gpu/a_b/MIG-1_2"  # splits back into (host, device)
    assert device_pool("", "") == "gpu/unknown/unknown"
    assert is_benchmark_pool("gpu/h/d") and is_benchmark_pool(GPU_POOL)
    assert not is_benchmark_pool(None) and not is_benchmark_pool("gpux") and not is_benchmark_pool("database")


def test_placement_from_the_environment():
    env = {ENV_DEVICE: "bench-3090", ENV_HOST: "node-7"}
    p = placement(env)
    assert (p.executor, p.host, p.device, p.pool, p.source) == ("in_process", "node-7", "bench-3090",
                                                               "gpu/node-7/bench-3090", ENV_DEVICE)
    # a UUID in CUDA_VISIBLE_DEVICES is the device, without asking anything
    p = placement({ENV_HOST: "node-7", "CUDA_VISIBLE_DEVICES": "GPU-0f1e2d3c-aaaa,GPU-bbbb"})
    assert p.pool == "gpu/node-7/GPU-0f1e2d3c-aaaa" and p.source == "GPU UUID"
    # no GPU visible (empty CUDA_VISIBLE_DEVICES): the host's CPU is the device
    p = placement({ENV_HOST: "laptop", "CUDA_VISIBLE_DEVICES": ""})
    assert p.pool == "gpu/laptop/cpu" and p.source == "no GPU visible"
    # Kubernetes: the GPU model, from the step tags' node selector or KREGRESS_GPU_PRODUCT
    p = placement({"KREGRESS_EXECUTOR": "k8s"})
    assert p.pool == "gpu/k8s/NVIDIA-H100-80GB-HBM3" and p.gpu_product == "NVIDIA-H100-80GB-HBM3"
    p = placement({"KREGRESS_EXECUTOR": "k8s", ENV_GPU_PRODUCT: "NVIDIA-A100-SXM4-80GB"})
    assert p.pool == "gpu/k8s/NVIDIA-A100-SXM4-80GB"
    with pytest.raises(ValueError, match="KREGRESS_STEPS_PER_RUN='0' must be a positive integer"):
        placement({ENV_STEPS_PER_RUN: "0"})
    with pytest.raises(ValueError, match="allowed: multiprocess, in_process, k8s"):
        placement({"KREGRESS_EXECUTOR": "celery"})


def test_gpu_index_is_resolved_to_its_uuid_by_nvidia_smi(tmp_path):
    """The GPU itself cannot exist here; nvidia-smi's answer for index 1 is scripted."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\ncase \"$1\" in --id=1) echo GPU-11111111-2222;; *) echo GPU-00000000-0000;; esac\n")
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    code = ("import os; from kernel_assets.executors import visible_gpu_uuid as v; "
            "print(v({'CUDA_VISIBLE_DEVICES': '1'}), v({}), v({'CUDA_VISIBLE_DEVICES': '-1'}) or '-')")
    env = {**os.environ, "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["GPU-11111111-2222", "GPU-00000000-0000", "-"]


def test_no_nvidia_smi_no_uuid(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    executors._nvidia_smi_uuid.cache_clear()
    try:
        assert visible_gpu_uuid({}) == ""
    finally:
        executors._nvidia_smi_uuid.cache_clear()


def test_the_definitions_carry_the_device_pool_of_their_host():
    """Loaded fresh (the pool is fixed when the assets are defined), as a code server on that host would."""
    code = ("from kernel_assets.definitions import defs, PLACEMENT; import json; "
            "job = defs.resolve_job_def('sweep_job'); "
            "print(json.dumps({'placement': PLACEMENT.pool, 'job_tags': sorted(job.tags), "
            "'ops': {n.name: [n.definition.pool, sorted(n.definition.tags)] for n in job.graph.nodes}}))")
    env = {k: v for k, v in os.environ.items() if not k.startswith("KREGRESS_")}
    env.update({ENV_DEVICE: "gpu-x", ENV_HOST: "node-9", "KREGRESS_STEPS_PER_RUN": "3"})
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=REPO, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["placement"] == "gpu/node-9/gpu-x"
    bench = {name for name, (pool, _) in got["ops"].items() if pool}
    assert bench == {"baseline_metrics", *(f"round_{k}_variants" for k in range(1, 5))}
    for name, (pool, tags) in got["ops"].items():
        assert pool in (None, "gpu/node-9/gpu-x")
        assert ("dagster-k8s/config" in tags) == (name in bench), name  # per op, benchmark steps only
    assert "dagster-k8s/config" not in got["job_tags"]  # nothing relies on job-level tags


def test_steps_per_run_caps_the_executor():
    ex = executor_from_env({ENV_STEPS_PER_RUN: "3", "KREGRESS_EXECUTOR": "multiprocess"})
    assert ex.name == "multiprocess"
    assert k8s_executor_config({ENV_STEPS_PER_RUN: "5"})["max_concurrent"] == 5
    assert k8s_executor_config({})["max_concurrent"] == 16


def test_connection_arithmetic():
    # 8 runs x (4 step processes + the worker) x (Dagster + pool lock + ledger) + 8 daemon threads + the
    # daemon's pool lock + 2 code servers
    assert pg_connection_bound(8, 4, code_servers=2) == 8 * 5 * 3 + 8 + 1 + 2
    assert pg_connection_bound(3, None, executor="in_process", code_servers=2) == 3 * 1 * 3 + 8 + 1 + 2
    # the webserver's three storage pools: 3 x (1 + --db-pool-max-overflow)
    assert pg_connection_bound(1, 1, code_servers=0, webserver_max_overflow=4) == 2 * 3 + 8 + 1 + 15


# --- Kubernetes: the step pods dagster-k8s would create ---------------------------------------------------


def _step_pod(step_tags: dict[str, str]):
    """The pod spec dagster-k8s's k8s_job_executor builds for a step with these tags (its own merge of the
    executor's step_k8s_config and the step's tags, then its own Job builder)."""
    from dagster_k8s.container_context import K8sContainerContext
    from dagster_k8s.job import (
        DagsterK8sJobConfig,
        UserDefinedDagsterK8sConfig,
        construct_dagster_k8s_job,
        get_user_defined_k8s_config,
    )

    cfg = k8s_executor_config()
    ctx = K8sContainerContext(run_k8s_config=UserDefinedDagsterK8sConfig.from_dict(cfg["step_k8s_config"]))
    ctx = ctx.merge(K8sContainerContext(run_k8s_config=get_user_defined_k8s_config(step_tags)))
    job = construct_dagster_k8s_job(DagsterK8sJobConfig(job_image="registry.example/kregress:1", dagster_home="/opt/dagster"),
                                    args=["dagster", "api", "execute_step"], job_name="dagster-step-abc",
                                    user_defined_k8s_config=ctx.run_k8s_config, pod_name="dagster-step-abc",
                                    component="step_worker")
    return job.spec.template.spec


def _node_tags(name: str) -> dict[str, str]:
    from kernel_assets.definitions import defs

    node = next(n for n in defs.resolve_job_def("sweep_job").graph.nodes if n.name == name)
    return dict(node.definition.tags)


def test_benchmark_step_pod_gets_one_gpu_a_node_selector_and_tolerations():
    pod = _step_pod(_node_tags("round_1_variants"))
    (container,) = pod.containers
    assert str(container.resources.limits["nvidia.com/gpu"]) == "1"  # a Kubernetes quantity
    assert container.resources.requests["cpu"] == "4"  # the step's tags over the executor's step_k8s_config
    assert pod.node_selector == {GPU_PRODUCT_LABEL: "NVIDIA-H100-80GB-HBM3"}
    assert {(t.key, t.operator, t.effect) for t in pod.tolerations} == {("nvidia.com/gpu", "Exists", "NoSchedule")}
    # every other step: the executor's CPU pod, no GPU, no GPU node
    pod = _step_pod(_node_tags("round_1_suggestions"))
    assert "nvidia.com/gpu" not in (pod.containers[0].resources.limits or {})
    assert not pod.node_selector and not pod.tolerations


def test_gpu_model_override_reaches_the_pod():
    tags = {k: json.dumps(v) for k, v in benchmark_op_tags({ENV_GPU_PRODUCT: "NVIDIA-A100-SXM4-80GB"}).items()}
    assert _step_pod(tags).node_selector == {GPU_PRODUCT_LABEL: "NVIDIA-A100-SXM4-80GB"}


def test_dagster_k8s_schema_rejects_a_broken_tag():
    from dagster._core.errors import DagsterInvalidConfigError
    from dagster_k8s.job import get_user_defined_k8s_config

    bad = benchmark_op_tags()
    bad["dagster-k8s/config"]["pod_spec_confg"] = bad["dagster-k8s/config"].pop("pod_spec_config")
    with pytest.raises(DagsterInvalidConfigError, match="pod_spec_confg"):
        get_user_defined_k8s_config({k: json.dumps(v) for k, v in bad.items()})


# --- verdicts and history: one device, one toolchain -----------------------------------------------------


def _meas(samples, *, uuid="GPU-aaa", host="h1", driver="550.54", torch="2.13.0", triton="3.9.0", batch="b1",
          name="NVIDIA H100 80GB HBM3"):
    s = [float(x) for x in samples]
    return Measurement(shape="1024x1024x1024", samples_ms=s, p20_ms=min(s), p50_ms=float(np.median(s)), p80_ms=max(s),
                       tflops=1.0, gbps=1.0, evidence="cuda", device=name, gpu_name=name, torch_version=torch,
                       triton_version=triton, gpu_uuid=uuid, host=host, driver=driver, batch=batch)


def _row(vid, meas, batch_baseline=(), round_=1):
    return VariantResult(variant_id=vid, round=round_, source="local", config={"BLOCK_M": 64}, config_hash=vid,
                         measurements=list(meas), evidence="cuda", batch_baseline=list(batch_baseline))


@pytest.mark.parametrize("field, value, what", [
    ("uuid", "GPU-bbb", "GPUs"), ("host", "h2", "GPUs"), ("driver", "560.28", "drivers"),
    ("torch", "2.12.1", "torch versions"), ("triton", "3.8.0", "Triton versions"),
])
def test_a_baseline_from_another_device_or_toolchain_never_judges(field, value, what):
    from kernel_assets.sweep import verdict_for

    spec = load_spec(REPO / "specs" / "gemm_smoke.yaml")
    rng = np.random.default_rng(0)
    base = rng.normal(1.0, 0.01, 40)
    slow = rng.normal(1.5, 0.01, 40)  # 50 % slower: REGRESS when the two sides are comparable
    baseline = _row("baseline", [_meas(base)], round_=0)
    same = _row("v", [_meas(slow)])
    assert verdict_for(same, baseline, spec).verdict == "REGRESS"
    other = _row("v", [_meas(slow, **{field: value})])
    v = verdict_for(other, baseline, spec)
    assert (v.verdict, v.cause) == ("NEEDS_REVIEW", "incomparable"), v
    reason = v.reasons[0]
    assert f"different {what}" in reason
    assert "variant on " in reason and "baseline on " in reason and value in reason  # both identities named
    assert "GPU-aaa on h1 (driver 550.54, torch 2.13.0, triton 3.9.0)" in reason or field in ("uuid", "host")
    # the same holds against a same-batch baseline timed on another device
    batched = _row("v", [_meas(slow, **{field: value})], batch_baseline=[_meas(base)])
    assert verdict_for(batched, baseline, spec).cause == "incomparable"


def test_history_compares_only_within_one_hardware_and_toolchain_identity(tmp_path):
    from kernel_assets import history

    spec = load_spec(REPO / "specs" / "gemm_smoke.yaml")
    rng = np.random.default_rng(1)
    fast = rng.normal(1.0, 0.01, 40)
    slow = rng.normal(1.3, 0.01, 40)
    history.append_sweep(spec, "run-h100", [_row("baseline", [_meas(fast)], round_=0)], {}, "NO_HISTORY", home=tmp_path)
    # another driver: no history to compare with, and the reason names the identity
    other = _row("baseline", [_meas(slow, driver="560.28")], round_=0)
    got = history.compare_baseline(spec, other, home=tmp_path)
    assert got.verdict == "NO_HISTORY" and "driver 560.28" in got.reason
    # another GPU of the same model on another host: the same identity, compared (and slower)
    moved = _row("baseline", [_meas(slow, uuid="GPU-zzz", host="h9")], round_=0)
    got = history.compare_baseline(spec, moved, home=tmp_path)
    assert got.verdict == "REGRESS" and got.reference_run == "run-h100"
    # another Triton: not compared
    got = history.compare_baseline(spec, _row("baseline", [_meas(slow, triton="3.8.0")], round_=0), home=tmp_path)
    assert got.verdict == "NO_HISTORY"
    df = history.load(spec.task_id, home=tmp_path)
    assert list(df[["host", "gpu_uuid", "driver"]].iloc[0]) == ["h1", "GPU-aaa", "550.54"]


def test_history_written_before_the_identity_columns_still_reads(tmp_path):
    """A file without driver/host/gpu_uuid (written by an older kregress) and a new one read together."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from kernel_assets import history

    spec = load_spec(REPO / "specs" / "gemm_smoke.yaml")
    old_dir = tmp_path / "kregress_history" / f"task={spec.task_id}" / "dev=NVIDIA_H100_80GB_HBM3" / "date=2025-01-01"
    old_dir.mkdir(parents=True)
    samples = list(np.random.default_rng(2).normal(1.0, 0.01, 40))
    pq.write_table(pa.Table.from_pylist([{
        "run_id": "old", "ts": 1.0, "task_id": spec.task_id, "spec_hash": "x", "variant_id": "baseline", "round": 0,
        "config_hash": "c", "config": "{}", "is_baseline": True, "error": "", "evidence": "cuda", "verdict": "NO_HISTORY",
        "ratio": None, "p50_ms": [1.0], "shapes": ["1024x1024x1024"], "samples_ms": [samples],
        "device": "NVIDIA H100 80GB HBM3", "torch_version": "2.13.0", "triton_version": "3.9.0"}]), old_dir / "old.parquet")
    history.append_sweep(spec, "new", [_row("baseline", [_meas(samples)], round_=0)], {}, "PASS", home=tmp_path)
    df = history.load(spec.task_id, home=tmp_path)
    assert list(df["run_id"]) == ["old", "new"]
    assert list(df["driver"]) == ["", "550.54"]  # unknown in the old file: never equal to a known driver
