"""Agent policies: local (embedded default), llm and hybrid (through the model gateway)."""

from __future__ import annotations

from typing import Any

from kregress.core.names import STRATEGIES  # noqa: E402


def policy_for(strategy: str, spec: Any, resources: Any):
    """The policy object for a strategy name; resources is the Dagster resources of the step."""
    from kernel_assets.agent.local import LocalPolicy

    if strategy == "local":
        return LocalPolicy()
    if strategy not in STRATEGIES:
        raise ValueError(f"search strategy {strategy!r} is unknown; allowed: {', '.join(STRATEGIES)}")
    from kernel_assets.agent.llm import HybridPolicy, LLMPolicy

    gateway = resources.taotoken.get_gateway(resources.ledger.get_ledger())
    llm = LLMPolicy(gateway)
    return llm if strategy == "llm" else HybridPolicy(llm, LocalPolicy())
