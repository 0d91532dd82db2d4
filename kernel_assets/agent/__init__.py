"""Agent policies: local (embedded default: the portfolio of kernel_assets/agent/portfolio.py, over the local
model search, a genetic algorithm and TPE), llm and hybrid (through the model gateway, topped up by the portfolio)."""

from __future__ import annotations

from typing import Any

from kregress.core.names import STRATEGIES  # noqa: E402


def policy_for(strategy: str, spec: Any, resources: Any):
    """The policy object for a strategy name; ``resources`` holds the step's ``taotoken`` and ``ledger`` resources,
    and optionally ``log`` (where the gateway's retries and failovers are said) and ``scope`` (the run's BudgetScope)."""
    from kernel_assets.agent.portfolio import PortfolioPolicy

    if strategy == "local":
        return PortfolioPolicy()
    if strategy not in STRATEGIES:
        raise ValueError(f"search strategy {strategy!r} is unknown; allowed: {', '.join(STRATEGIES)}")
    from kernel_assets.agent.llm import HybridPolicy, LLMPolicy

    gateway = resources.taotoken.get_gateway(resources.ledger.get_ledger(), log=getattr(resources, "log", None))
    llm = LLMPolicy(gateway, scope=getattr(resources, "scope", None))
    return llm if strategy == "llm" else HybridPolicy(llm, PortfolioPolicy())
