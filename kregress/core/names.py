"""Names used across every layer, defined once (no Dagster, no Triton).

The strategies a sweep can search with, where a number can come from (evidence), the verdicts and
their causes, and the Dagster pool that serializes GPU work. Anything in two modules comes from here.
"""

from __future__ import annotations

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

# Model-call roles; each has its own keys and its own budget lines in the ledger.
ROLES = ("suggest", "report", "review")
Role = Literal["suggest", "report", "review"]

# The instance-wide Dagster concurrency pool of benchmark steps (one GPU, one benchmark at a time).
GPU_POOL = "gpu"

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
