"""Choose the executor from the environment, so one set of definitions runs everywhere.

``KREGRESS_EXECUTOR``:

* ``multiprocess`` (default): steps in child processes on this host (a laptop, or a GPU host where the
  instance-wide ``gpu`` pool serializes benchmarks);
* ``in_process``: every step in the run worker (debugging);
* ``k8s``: dagster-k8s's ``k8s_job_executor``, one Kubernetes Job (pod) per step, configured by
  ``deploy/k8s/executor.yaml``; benchmark steps get their GPU from ``benchmark_op_tags()``.

Wiring (kernel_assets/definitions.py)::

    from kregress.core.names import GPU_POOL
    from kernel_assets.executors import benchmark_op_tags, executor_from_env

    @asset(pool=GPU_POOL, op_tags=benchmark_op_tags(), ...)     # every benchmark step
    def round_1_variants(...): ...

    defs = Definitions(assets=[...], executor=executor_from_env())

dagster-k8s is imported only when ``KREGRESS_EXECUTOR=k8s``; it comes with the ``deploy`` extra.
"""

from __future__ import annotations

import copy
import os
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

import yaml
from dagster import ExecutorDefinition, in_process_executor, multiprocess_executor

from kregress.core.paths import REPO_ROOT

DEPLOY_DIR = REPO_ROOT / "deploy"  # deployment data (YAML) only; no code lives there
K8S_EXECUTOR_YAML = DEPLOY_DIR / "k8s" / "executor.yaml"
GPU_STEP_TAGS_YAML = DEPLOY_DIR / "k8s" / "gpu_step_tags.yaml"
INSTANCE_YAML = DEPLOY_DIR / "dagster.yaml"

ENV_EXECUTOR = "KREGRESS_EXECUTOR"
EXECUTORS = ("multiprocess", "in_process", "k8s")
K8S_CONFIG_TAG = "dagster-k8s/config"


def _load_yaml(path: Path) -> dict[str, Any]:
    with open(path) as fh:
        data = yaml.safe_load(fh)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


@lru_cache(maxsize=None)
def _cached(path: str) -> dict[str, Any]:
    return _load_yaml(Path(path))


def k8s_executor_config() -> dict[str, Any]:
    """The k8s_job_executor config from deploy/k8s/executor.yaml (a fresh copy)."""
    return copy.deepcopy(_cached(str(K8S_EXECUTOR_YAML)))


def benchmark_op_tags() -> dict[str, Any]:
    """Op tags for benchmark steps: the ``dagster-k8s/config`` of a one-GPU pod (a fresh copy)."""
    tags = copy.deepcopy(_cached(str(GPU_STEP_TAGS_YAML)))
    if set(tags) != {K8S_CONFIG_TAG}:
        raise ValueError(f"{GPU_STEP_TAGS_YAML}: expected only the {K8S_CONFIG_TAG!r} tag, got {sorted(tags)}")
    return tags


def executor_from_env(environ: Mapping[str, str] | None = None) -> ExecutorDefinition:
    """The executor named by ``KREGRESS_EXECUTOR`` (default ``multiprocess``)."""
    env = os.environ if environ is None else environ
    kind = env.get(ENV_EXECUTOR, "").strip() or "multiprocess"
    if kind == "multiprocess":
        return multiprocess_executor
    if kind == "in_process":
        return in_process_executor
    if kind == "k8s":
        try:
            from dagster_k8s import k8s_job_executor
        except ImportError as exc:
            raise ImportError(
                f"{ENV_EXECUTOR}=k8s needs dagster-k8s (the `deploy` extra: pip install 'kregress[deploy]'): {exc}"
            ) from exc
        return k8s_job_executor.configured(k8s_executor_config(), name="k8s")
    raise ValueError(f"{ENV_EXECUTOR}={kind!r} is not an executor; allowed: {', '.join(EXECUTORS)}")
