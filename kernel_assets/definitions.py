"""The one place the Definitions are built; resources are picked per environment (KREGRESS_ENV)."""

from __future__ import annotations

import os

import dagster as dg

from kernel_assets.assets import build_sweep_assets
from kernel_assets.constants import GROUP_BASELINE, GROUP_REPORT, GROUP_ROUNDS, SPECS_PARTITIONS, SWEEP_JOB
from kernel_assets.specs_resource import SpecStore
from resources.gpu import BenchmarkResource


def build_resources(env: str | None = None) -> dict:
    """local (default): interpreter + AOT compile on the CPU, model-estimated latency, local agent.
    gpu: the cuda backend, one child process timing at a time."""
    env = env or os.environ.get("KREGRESS_ENV", "local")
    by_env = {
        "local": {"specs": SpecStore(), "bench": BenchmarkResource(backend="auto")},
        "gpu": {"specs": SpecStore(), "bench": BenchmarkResource(backend="cuda")},
    }
    if env not in by_env:
        raise ValueError(f"KREGRESS_ENV={env!r} is unknown; allowed: {', '.join(by_env)}")
    return by_env[env]


SWEEP_ASSETS = build_sweep_assets()

sweep_job = dg.define_asset_job(
    SWEEP_JOB,
    selection=dg.AssetSelection.groups(GROUP_BASELINE, GROUP_ROUNDS, GROUP_REPORT),
    partitions_def=SPECS_PARTITIONS,
    description="One spec's whole sweep: baseline, every round, the verdict report.",
)


def build_definitions(resources: dict | None = None, loggers: dict | None = None) -> dg.Definitions:
    return dg.Definitions(
        assets=SWEEP_ASSETS,
        jobs=[sweep_job],
        resources=resources or build_resources(),
        loggers=loggers,
    )


defs = build_definitions()
