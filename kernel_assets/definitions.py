"""The one place the Definitions are built; resources are picked per environment.

- ``KREGRESS_ENV``: ``local`` (default) or ``gpu``: the benchmark backend (see ``build_resources``).
- ``KREGRESS_LEDGER_URL``: the token ledger (and its response cache) every run worker of a shared instance
  writes to, e.g. ``postgresql://kregress@db:5432/ledger``; unset = ``$DAGSTER_HOME/ledger.sqlite``. It is
  passed as an ``EnvVar``, so the URL (and any password in it) never shows in the UI or a run's config.
- ``KREGRESS_EXECUTOR``, ``KREGRESS_STEPS_PER_RUN``, ``KREGRESS_DEVICE``, ``KREGRESS_HOST``,
  ``KREGRESS_GPU_PRODUCT``: where steps run and which device pool the benchmark steps take
  (``kernel_assets.executors.placement``; the assets read the same placement for their ``pool=``).
  A device named ``sim-gpu-<k>`` is simulated (``resources.simgpu``): timing holds it for the recorded or
  modelled kernel time x ``KREGRESS_SIM_SCALE``.

The cap on concurrent runs lives in the instance (``dagster.yaml`` ``concurrency.runs.max_concurrent_runs``),
not here: it bounds every code location of the instance together.
"""

from __future__ import annotations

import os
import warnings

import dagster as dg

from kernel_assets.assets import build_sweep_assets
from kernel_assets.automation import build_automation
from kernel_assets.constants import GROUP_BASELINE, GROUP_REPORT, GROUP_ROUNDS, GROUP_TOKENS, SPECS_PARTITIONS, SWEEP_JOB
from kernel_assets.executors import executor_from_env, placement
from kernel_assets.review import build_review_assets
from kernel_assets.run_context import RunContextResource
from kernel_assets.specs_resource import SpecStore
from kernel_assets.tokens import build_token_assets
from kregress.core.names import ENV_VAR, resource_env
from resources.gpu import ReplayBackend, compiled_backend
from resources.ledger import LedgerResource
from resources.simgpu import ENV_SIM_SCALE, is_simulated, sim_scale, simulated_backends
from resources.taotoken import TaotokenResource


def build_resources(env: str | None = None) -> dict:
    """local (default): the cuda backend when torch sees a GPU, else the interpreter (AOT compile on the
    CPU, model-estimated latency); gpu: the cuda backend, one child process timing at a time. Both
    replay recorded families and use the local agent unless a spec asks for llm/hybrid."""
    env = resource_env(env)
    by_env = {"local": lambda: compiled_backend("auto"), "gpu": lambda: compiled_backend("cuda")}
    if env not in by_env:
        raise ValueError(f"{ENV_VAR}={env!r} is unknown; allowed: {', '.join(by_env)}")
    res = {"specs": SpecStore(), "taotoken": TaotokenResource(), "ledger": ledger_resource(),
           "bench": by_env[env](), "replay": ReplayBackend(), "run_context": RunContextResource()}
    where = placement()
    if is_simulated(where.device):  # KREGRESS_DEVICE=sim-gpu-<k>: benchmark steps hold a simulated device
        res.update(simulated_backends(where.host, where.device, sim_scale(os.environ.get(ENV_SIM_SCALE))))
    return res


LEDGER_URL_ENV = "KREGRESS_LEDGER_URL"


def ledger_resource(environ=None) -> LedgerResource:
    """The ledger of ``KREGRESS_LEDGER_URL`` (read by each process from its environment), else the default file."""
    env = os.environ if environ is None else environ
    if env.get(LEDGER_URL_ENV, "").strip():
        return LedgerResource(url=dg.EnvVar(LEDGER_URL_ENV))
    return LedgerResource()


SWEEP_ASSETS = build_sweep_assets()
REVIEW_ASSETS = build_review_assets()  # kernel_source_review: materialized on demand, not part of sweep_job
# token_budget is a partitioned asset check, a Dagster preview API: the warning says nothing a user can act on.
warnings.filterwarnings("ignore", message="Specifying a partitions_def on an AssetCheckSpec")
TOKEN_DEFS = build_token_assets(SPECS_PARTITIONS, report_key="verdict_report", group_name=GROUP_TOKENS)

sweep_job = dg.define_asset_job(
    SWEEP_JOB,
    selection=dg.AssetSelection.groups(GROUP_BASELINE, GROUP_ROUNDS, GROUP_REPORT, GROUP_TOKENS),
    partitions_def=SPECS_PARTITIONS,
    description="One spec's whole sweep: baseline, every round, the verdict report, the token ledger view.",
)

SCHEDULES, SENSORS = build_automation(sweep_job)


def build_definitions(resources: dict | None = None, loggers: dict | None = None) -> dg.Definitions:
    return dg.Definitions(
        assets=SWEEP_ASSETS + REVIEW_ASSETS + [d for d in TOKEN_DEFS if isinstance(d, dg.AssetsDefinition)],
        asset_checks=[d for d in TOKEN_DEFS if not isinstance(d, dg.AssetsDefinition)],
        jobs=[sweep_job],
        schedules=SCHEDULES,
        sensors=SENSORS,
        resources=resources or build_resources(),
        loggers=loggers,
        executor=executor_from_env(),  # KREGRESS_EXECUTOR: in_process (default: as the CLI), multiprocess, k8s
    )


# Where this code location's steps run and the pool its benchmark steps take (the deploy tests read it;
# the assets computed the same value when they were defined).
PLACEMENT = placement()


defs = build_definitions()
