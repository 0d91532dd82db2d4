"""Names used across every layer, defined once (no Dagster, no Triton).

The strategies a sweep can search with, where a number can come from (evidence), the verdicts and
their causes, and the Dagster pool that serializes GPU work. Anything in two modules comes from here.
"""

from __future__ import annotations

import re
from typing import Literal

# Search policies (spec ``search.strategy``, the launchpad override, ``kregress sweep --strategy``).
STRATEGIES = ("local", "llm", "hybrid")
Strategy = Literal["local", "llm", "hybrid"]

# Where a number came from. Latency verdicts of PASS or REGRESS need MEASURED evidence.
EVIDENCE = ("cuda", "replay", "interpreter", "model")
Evidence = Literal["cuda", "replay", "interpreter", "model"]
MEASURED_EVIDENCE = frozenset({"cuda", "replay"})

PASS, REGRESS, NEEDS_REVIEW = "PASS", "REGRESS", "NEEDS_REVIEW"
VERDICTS = (PASS, REGRESS, NEEDS_REVIEW)
VerdictKind = Literal["PASS", "REGRESS", "NEEDS_REVIEW"]

# The command as the user invoked it (``kernel_assets.cli.invoked_as``), set by the CLI for the report's
# `next:` line (``kernel_assets.report.next_step``).
COMMAND_ENV = "KREGRESS_COMMAND"

# Model-call roles; each has its own keys and its own budget lines in the ledger.
ROLES = ("suggest", "report", "review")
Role = Literal["suggest", "report", "review"]

# Benchmark steps take one slot of the pool of the device they time on: ``gpu/<host>/<device>``, the
# device being the GPU's UUID (or a configured name on a host without one). Every such pool gets one slot
# (dagster.yaml ``concurrency.pools.default_limit: 1``), so two benchmarks never time on one GPU at once,
# while benchmarks on two GPUs run side by side. ``GPU_POOL`` is the prefix every benchmark pool shares.
GPU_POOL = "gpu"
DEVICE_POOL_SEP = "/"


def _pool_part(text: str) -> str:
    """A pool name is any run of non-whitespace (Dagster's rule): whitespace becomes ``_``, ``/`` is kept
    out of a part so the name splits back into (host, device)."""
    out = re.sub(r"\s+", "_", str(text).strip()).replace(DEVICE_POOL_SEP, "_")
    return out or "unknown"


def device_pool(host: str, device: str) -> str:
    """The pool of benchmark steps timing on ``device`` of ``host``: ``gpu/<host>/<device>``."""
    return DEVICE_POOL_SEP.join((GPU_POOL, _pool_part(host), _pool_part(device)))


def is_benchmark_pool(pool: str | None) -> bool:
    """True for a pool made by ``device_pool`` (and for the old instance-wide ``gpu`` pool)."""
    return bool(pool) and (pool == GPU_POOL or pool.startswith(GPU_POOL + DEVICE_POOL_SEP))

def arch_capability(arch: str) -> int:
    """``sm_90`` / ``sm_90a`` -> 90: the compute capability Triton's GPUTarget takes."""
    return int(arch.removeprefix("sm_").rstrip("a"))


# The resource set (kernel_assets/definitions.py): KREGRESS_ENV, or `kregress sweep --env`.
ENV_VAR = "KREGRESS_ENV"
RESOURCE_ENVS = ("local", "gpu")


def resource_env(override: str | None = None) -> str:
    """The resource set a process runs with: ``override`` (a CLI flag), else $KREGRESS_ENV, else local."""
    import os

    return override or os.environ.get(ENV_VAR) or "local"


# Rounds the asset graph is built with (round_1 .. round_MAX). A spec may use fewer.
MAX_GRAPH_ROUNDS = 4
