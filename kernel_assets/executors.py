"""Where steps run and which device a benchmark step times on, read from the environment once, so one set of
definitions runs on a laptop, on several GPU hosts sharing one instance, and on Kubernetes.

``KREGRESS_EXECUTOR``:

* ``in_process`` (default): every step of a run in its run worker, one after the other, as ``kregress sweep``
  runs them: one process imports Dagster, torch, Triton and the definitions once, keeps its in-memory caches
  (compiled kernels, bound specs, the resources) across the run's steps, and holds one storage connection. A
  sweep is a chain (baseline, then each round's three steps, then the report): steps in parallel would gain
  nothing, while a process per step cost more than the work (issue 55: 401-456 s a launched run against
  17-35 s from the CLI, 16 processes each importing the same modules). The device pool holds as under any
  executor: Dagster's in-process executor claims a step's pool slot before the step runs;
* ``multiprocess``: every step in its own child process on this host (a step crashing the interpreter then
  fails that step alone); each child imports the definitions again;
* ``k8s``: dagster-k8s's ``k8s_job_executor``, one Kubernetes Job (pod) per step, configured by
  ``deploy/k8s/executor.yaml``; benchmark steps get their GPU from ``benchmark_op_tags()``.

The benchmark pool: every benchmark step (``baseline_metrics``, ``round_k_variants``) takes one slot of the
pool of the device it times on, ``gpu/<host>/<device>`` (``kregress.core.names.device_pool``):

* ``KREGRESS_DEVICE``: the device part; default the UUID of the first GPU this process sees
  (``CUDA_VISIBLE_DEVICES``, then nvidia-smi), else ``cpu``. Name it on a host whose GPU has no UUID to
  read, or to run one code server per GPU of a host (each with its own ``CUDA_VISIBLE_DEVICES``);
* ``KREGRESS_HOST``: the host part; default the host name (in a pod, set it to the node name from the
  downward API, ``spec.nodeName``, so the key names the machine, not the pod);
* under ``k8s`` the run worker does not know which node a step pod will land on: the pool is
  ``gpu/k8s/<product>`` for ``KREGRESS_GPU_PRODUCT`` (also the pods' node selector), its limit is the
  number of such GPUs, and the NVIDIA device plugin gives each pod a GPU of its own.

``KREGRESS_STEPS_PER_RUN``: steps of one run at once under ``multiprocess`` and ``k8s`` (the executor's
``max_concurrent``), the knob that bounds a run worker's PostgreSQL connections (deploy/README.md has the
arithmetic); an in-process run is one step at a time.

The pool is computed where the definitions are loaded: the code server and the run workers it starts on
that host, which is where the benchmark steps of the multiprocess and in-process executors run.
dagster-k8s is imported only when ``KREGRESS_EXECUTOR=k8s``; it comes with the ``deploy`` extra.
"""

from __future__ import annotations

import copy
import os
import shutil
import socket
import subprocess
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

import yaml
from dagster import ExecutorDefinition, in_process_executor, multiprocess_executor

from kregress.core.names import device_pool
from kregress.core.paths import REPO_ROOT

DEPLOY_DIR = REPO_ROOT / "deploy"  # deployment data (YAML) only; no code lives there
K8S_EXECUTOR_YAML = DEPLOY_DIR / "k8s" / "executor.yaml"
GPU_STEP_TAGS_YAML = DEPLOY_DIR / "k8s" / "gpu_step_tags.yaml"
INSTANCE_YAML = DEPLOY_DIR / "dagster.yaml"

ENV_EXECUTOR = "KREGRESS_EXECUTOR"
ENV_DEVICE = "KREGRESS_DEVICE"
ENV_HOST = "KREGRESS_HOST"
ENV_GPU_PRODUCT = "KREGRESS_GPU_PRODUCT"
ENV_STEPS_PER_RUN = "KREGRESS_STEPS_PER_RUN"
EXECUTORS = ("multiprocess", "in_process", "k8s")
K8S_CONFIG_TAG = "dagster-k8s/config"
# The label NVIDIA's GPU feature discovery puts on every GPU node, e.g. NVIDIA-H100-80GB-HBM3.
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"


def _load_yaml(path: Path) -> dict[str, Any]:
    with open(path) as fh:
        data = yaml.safe_load(fh)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


@lru_cache(maxsize=None)
def _cached(path: str) -> dict[str, Any]:
    return _load_yaml(Path(path))


def _env(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if environ is None else environ


DEFAULT_EXECUTOR = "in_process"


def executor_kind(environ: Mapping[str, str] | None = None) -> str:
    kind = _env(environ).get(ENV_EXECUTOR, "").strip() or DEFAULT_EXECUTOR
    if kind not in EXECUTORS:
        raise ValueError(f"{ENV_EXECUTOR}={kind!r} is not an executor; allowed: {', '.join(EXECUTORS)}")
    return kind


def steps_per_run(environ: Mapping[str, str] | None = None) -> int | None:
    """``KREGRESS_STEPS_PER_RUN`` as a positive int, None when unset."""
    raw = _env(environ).get(ENV_STEPS_PER_RUN, "").strip()
    if not raw:
        return None
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"{ENV_STEPS_PER_RUN}={raw!r} must be a positive integer (steps of one run at once)")
    return n


# --- which device this host's benchmark steps time on ----------------------------------------------------


@lru_cache(maxsize=8)
def _nvidia_smi_uuid(gpu: str) -> str:
    """The UUID nvidia-smi reports for ``gpu`` (an index), '' when nvidia-smi is absent or fails."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return ""
    try:
        out = subprocess.run([exe, f"--id={gpu}", "--query-gpu=uuid", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10, check=True).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return ""
    return out[0] if out else ""


def visible_gpu_uuid(environ: Mapping[str, str] | None = None) -> str:
    """The UUID of the first GPU this process would time on, without initialising CUDA ('' for none).

    ``CUDA_VISIBLE_DEVICES`` naming a UUID (``GPU-...`` or ``MIG-...``) is taken as it is; an index is asked of
    nvidia-smi (which numbers GPUs in PCI order: set ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` so CUDA agrees); set but
    empty (or ``-1``) means no GPU."""
    env = _env(environ)
    visible = env.get("CUDA_VISIBLE_DEVICES")
    first = "0"
    if visible is not None:
        first = visible.split(",")[0].strip()
        if first in ("", "-1"):
            return ""
        if first.startswith(("GPU-", "MIG-")):
            return first
    return _nvidia_smi_uuid(first)


@dataclass(frozen=True)
class Placement:
    """Where this code location's steps run and which pool its benchmark steps take."""

    executor: str
    host: str
    device: str
    pool: str
    steps_per_run: int | None
    gpu_product: str = ""
    source: str = ""  # where the device name came from (the variable, the GPU UUID, or "no GPU visible")


def placement(environ: Mapping[str, str] | None = None) -> Placement:
    """The placement named by the environment (see the module docstring)."""
    env = _env(environ)
    kind = executor_kind(env)
    steps = steps_per_run(env)
    if kind == "k8s":
        product = env.get(ENV_GPU_PRODUCT, "").strip() or _default_gpu_product()
        return Placement(kind, "k8s", product, device_pool("k8s", product), steps, product,
                         f"{ENV_GPU_PRODUCT}" if env.get(ENV_GPU_PRODUCT, "").strip() else str(GPU_STEP_TAGS_YAML))
    host = env.get(ENV_HOST, "").strip() or socket.gethostname()
    device, source = env.get(ENV_DEVICE, "").strip(), ENV_DEVICE
    if not device:
        device, source = visible_gpu_uuid(env), "GPU UUID"
    if not device:
        device, source = "cpu", "no GPU visible"
    return Placement(kind, host, device, device_pool(host, device), steps, source=source)


def benchmark_pool(environ: Mapping[str, str] | None = None) -> str:
    """The pool every benchmark step of this code location declares."""
    return placement(environ).pool


# --- Kubernetes ----------------------------------------------------------------------------------------


def k8s_executor_config(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The k8s_job_executor config from deploy/k8s/executor.yaml (a fresh copy); ``KREGRESS_STEPS_PER_RUN``
    replaces its ``max_concurrent``."""
    cfg = copy.deepcopy(_cached(str(K8S_EXECUTOR_YAML)))
    steps = steps_per_run(environ)
    if steps:
        cfg["max_concurrent"] = steps
    return cfg


def _raw_gpu_step_tags() -> dict[str, Any]:
    tags = copy.deepcopy(_cached(str(GPU_STEP_TAGS_YAML)))
    if set(tags) != {K8S_CONFIG_TAG}:
        raise ValueError(f"{GPU_STEP_TAGS_YAML}: expected only the {K8S_CONFIG_TAG!r} tag, got {sorted(tags)}")
    return tags


def _default_gpu_product() -> str:
    selector = _raw_gpu_step_tags()[K8S_CONFIG_TAG].get("pod_spec_config", {}).get("node_selector", {})
    product = str(selector.get(GPU_PRODUCT_LABEL, "")).strip()
    if not product:
        raise ValueError(f"{GPU_STEP_TAGS_YAML}: pod_spec_config.node_selector needs a {GPU_PRODUCT_LABEL!r} "
                         f"entry (the GPU model benchmark pods run on), or set {ENV_GPU_PRODUCT}")
    return product


def benchmark_op_tags(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Op tags of benchmark steps: the ``dagster-k8s/config`` of a one-GPU pod on a node with the chosen GPU
    model (a fresh copy). Per op, because dagster-k8s builds each step pod from the step's own tags and the
    executor config; a job-level or run-level tag does not reach the step pods."""
    tags = _raw_gpu_step_tags()
    product = _env(environ).get(ENV_GPU_PRODUCT, "").strip()
    if product:
        tags[K8S_CONFIG_TAG].setdefault("pod_spec_config", {}).setdefault("node_selector", {})[GPU_PRODUCT_LABEL] = product
    return tags


# --- what a benchmark step needs of its host ----------------------------------------------------------

NEEDS_TAG = "kregress/needs"  # op tag of the benchmark steps: "cuda" when the code location times on a GPU


def needs_tags(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Op tags saying what the benchmark steps need of the host they run on: ``{"kregress/needs": "cuda"}``
    when the code location's resource set is ``gpu`` (``KREGRESS_ENV``: the cuda backend, nothing else), else
    none (``local`` takes the cuda backend only where torch sees a GPU). The run launcher reads them from the
    run's plan (``kernel_assets.run_guard.host_refusal``) and refuses a run this host cannot serve."""
    from kregress.core.names import ENV_VAR

    return {NEEDS_TAG: "cuda"} if (_env(environ).get(ENV_VAR) or "").strip() == "gpu" else {}


# --- the executor --------------------------------------------------------------------------------------


def executor_from_env(environ: Mapping[str, str] | None = None) -> ExecutorDefinition:
    """The executor named by ``KREGRESS_EXECUTOR`` (default ``in_process``), with ``KREGRESS_STEPS_PER_RUN``
    as the ``max_concurrent`` of ``multiprocess`` and ``k8s`` where set."""
    env = _env(environ)
    kind = executor_kind(env)
    steps = steps_per_run(env)
    if kind == "multiprocess":
        if steps is None:
            return multiprocess_executor
        return multiprocess_executor.configured({"max_concurrent": steps}, name="multiprocess")
    if kind == "in_process":
        return in_process_executor
    try:
        from dagster_k8s import k8s_job_executor
    except ImportError as exc:
        raise ImportError(
            f"{ENV_EXECUTOR}=k8s needs dagster-k8s (the `deploy` extra: pip install 'kregress[deploy]'): {exc}"
        ) from exc
    return k8s_job_executor.configured(k8s_executor_config(env), name="k8s")


# --- PostgreSQL connections: the arithmetic of deploy/README.md ----------------------------------------

DAEMON_THREADS = 8  # dagster-daemon's daemons (scheduler, sensor, backfill, queue, monitoring, event log, asset, freshness)


def pg_connection_bound(max_concurrent_runs: int, steps: int | None, *, executor: str = "multiprocess",
                        code_servers: int = 1, webserver_max_overflow: int | None = None,
                        ledger_per_process: int = 1) -> int:
    """The most PostgreSQL connections a deployment opens at once (Dagster's storage and the ledger together).

    dagster-postgres holds no idle connection (a NullPool): a process has one open per thread doing storage
    work, and a run worker's work is one thread per process; while it claims or frees a pool slot it holds
    one more, the advisory lock's (``kernel_assets.pool_storage_postgres``). So:

    - each run worker: its own process, plus one process per step running at once under the multiprocess
      executor (``steps``, the executor's max_concurrent); in-process runs are one process; under the k8s
      executor each step pod is such a process; each of them two connections (storage work, the pool lock);
    - each of those processes may also hold ``ledger_per_process`` connections of the token ledger
      (SQLAlchemy keeps the ones it opened);
    - the daemon: one per daemon thread, and one for the pool lock (run monitoring frees slots); each code
      server: one (it marks its dead workers' runs failed);
    - the webserver: three storages, each with a pool of 1 + ``--db-pool-max-overflow`` (default 20).

    ``max_concurrent_runs`` x (``steps`` + 1) x (2 + ``ledger_per_process``) + daemon + 1 + code servers + webserver.
    """
    if steps is None:  # the multiprocess executor's own default: one step per CPU of the run worker's host
        steps = os.cpu_count() or 1
    per_run = 1 if executor == "in_process" else 1 + max(1, steps)
    webserver = 0 if webserver_max_overflow is None else 3 * (1 + max(0, webserver_max_overflow))
    return max_concurrent_runs * per_run * (2 + ledger_per_process) + DAEMON_THREADS + 1 + code_servers + webserver
