"""Agent policies: local (embedded default), llm and hybrid (through the model gateway)."""

from __future__ import annotations

from typing import Any

STRATEGIES = ("local", "llm", "hybrid")


def policy_for(strategy: str, spec: Any, resources: Any):
    """The policy object for a strategy name; resources is the Dagster resources of the step."""
    from kernel_assets.agent.local import LocalPolicy

    if strategy == "local":
        return LocalPolicy()
    raise ValueError(f"search strategy {strategy!r} is not available here; allowed: local")
