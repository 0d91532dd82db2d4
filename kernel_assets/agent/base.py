"""The contract every agent policy meets: a context in, proposals (and what was dropped) out."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Protocol

from kregress.core.records import DroppedSuggestion, Suggestion, VariantResult
from kregress.core.bind import BoundSpec
from kregress.core.family import Family
from kregress.core.spec import TaskSpec


@dataclass
class AgentContext:
    spec: TaskSpec
    family: Family
    round: int  # 1-based round being proposed
    n: int  # how many proposals are wanted
    history: list[VariantResult]  # everything measured in this sweep so far; the baseline is round 0
    objective: dict[str, float]  # config_hash -> objective value (lower is better) for measured rows
    profile_summary: str  # the trimmed top-k text the previous round produced
    failures: list[str]  # one line per failure so far
    run_id: str = ""
    partition: str = ""
    log: Any = field(default_factory=lambda: logging.getLogger("kregress.agent"))

    @property
    def measured_hashes(self) -> set[str]:
        return {r.config_hash for r in self.history}


@dataclass
class Proposal:
    suggestions: list[Suggestion]
    dropped: list[DroppedSuggestion] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # e.g. "BudgetExceeded: ...", "fell back to local"
    tokens: dict[str, int] = field(default_factory=dict)  # prompt/completion/total spent this round
    bound: BoundSpec | None = None  # the run's bound spec, handed on to the round's variants step


class Policy(Protocol):
    name: str

    def propose(self, ctx: AgentContext) -> Proposal: ...


def validate_and_dedupe(
    ctx: AgentContext, candidates: list[Suggestion], source: str
) -> tuple[list[Suggestion], list[DroppedSuggestion]]:
    """Keep proposals that are inside the space, new to this sweep and unique; record the rest."""
    kept: list[Suggestion] = []
    dropped: list[DroppedSuggestion] = []
    seen = set(ctx.measured_hashes)
    ids = {r.variant_id for r in ctx.history}
    for s in candidates:
        problem = ctx.family.space.check(s.config, ctx.spec.params, ctx.spec.hardware.limits)
        if problem:
            dropped.append(DroppedSuggestion(round=ctx.round, source=source, raw=s.model_dump_json()[:400], reason=f"outside the space: {problem}"))
            continue
        if s.config_hash in seen:
            dropped.append(DroppedSuggestion(round=ctx.round, source=source, raw=s.model_dump_json()[:400], reason="config already measured in this sweep"))
            continue
        if s.variant_id in ids:
            dropped.append(DroppedSuggestion(round=ctx.round, source=source, raw=s.model_dump_json()[:400], reason=f"variant_id {s.variant_id} already used"))
            continue
        seen.add(s.config_hash)
        ids.add(s.variant_id)
        kept.append(s)
        if len(kept) >= ctx.n:
            break
    return kept, dropped
