"""The contract every agent policy meets: a context in, proposals (and what was dropped, and why) out."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Protocol

from kregress.core.bind import BoundSpec
from kregress.core.budget import Breach
from kregress.core.family import Family
from kregress.core.records import DroppedSuggestion, Suggestion, VariantResult
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
    scope: Any = None  # the run's kregress.core.budget.BudgetScope (None: derived from run_id and partition)
    feedback: list[str] = field(default_factory=list)  # why the previous round's proposals were dropped, one line each

    @property
    def measured_hashes(self) -> set[str]:
        return {r.config_hash for r in self.history}


# Why a round's answer gave nothing to measure: (what it was, what to do about it). The line a user reads.
UNUSABLE: dict[str, tuple[str, str]] = {
    "empty": ("the model's reply was empty",
              "retry; if it persists, set TAOTOKEN_MODEL_ID to another model"),
    "prose": ("the model's reply was prose, not JSON",
              "use a model that follows a JSON-only instruction (TAOTOKEN_MODEL_ID), or run strategy hybrid so local proposals fill the round"),
    "not_json": ("the model's reply was not valid JSON",
                 "use a model that writes strict JSON (TAOTOKEN_MODEL_ID), or run strategy hybrid"),
    "cut_short": ("the model's reply was cut off at max_tokens before the JSON closed",
                  "raise max_tokens_suggest (TaotokenResource) or the spec's budget.max_output_tokens_per_round, or lower search.variants_per_round"),
    "not_array": ("the model's reply was JSON but not an array of proposals",
                  "use a model that follows the reply schema (TAOTOKEN_MODEL_ID), or run strategy hybrid"),
    "too_large": ("the model's reply was over the size limit",
                  "lower search.variants_per_round, or use a model that follows the reply schema"),
    "schema": ("every proposal broke the reply schema (no id, no config values)",
               "use a model that follows the reply schema (TAOTOKEN_MODEL_ID), or run strategy hybrid"),
    "outside_space": ("every proposed config was outside the family's space or broke its rules",
                      "use a stronger model (TAOTOKEN_MODEL_ID) or run strategy hybrid; the dropped configs and why are in report.md"),
    "duplicate": ("every proposed config had already been measured in this sweep or repeated another",
                  "the search has converged for this model; run strategy hybrid or local to explore further"),
    "empty_array": ("the model answered [] (it says the constraints cannot be met)",
                    "check the spec's constraints and search space; run strategy local to search without the model"),
    "no_choices": ("the provider answered with an empty choices list (no message)",
                   "retry later, or set TAOTOKEN_MODEL_ID to another model served by the gateway"),
    "content": ("the gateway refused the prompt's content",
                "show fewer history rows (search.top_k) or use another model (TAOTOKEN_MODEL_ID)"),
}


@dataclass(frozen=True)
class Unusable:
    """A round whose answer gave nothing to measure, and why (a key of UNUSABLE)."""

    cause: str
    detail: str = ""  # e.g. "6 proposals; first: BLOCK_M=96 not in {16, 32, 64, 128, 256}"
    fix_text: str = ""  # the server's own fix, where it named one (a classified content error)

    @property
    def what(self) -> str:
        base = UNUSABLE[self.cause][0]
        return f"{base} ({self.detail})" if self.detail else base

    @property
    def fix(self) -> str:
        return self.fix_text or UNUSABLE[self.cause][1]

    def line(self, round: int, source: str = "llm") -> str:
        """``round 1: no usable proposal from llm: <what>. Fix: <fix>``: the one line the terminal shows."""
        return f"round {round}: no usable proposal from {source}: {self.what}. Fix: {self.fix}"


@dataclass
class Proposal:
    suggestions: list[Suggestion]
    dropped: list[DroppedSuggestion] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # e.g. "renamed r1_v1 to r2_v1", "fell back to local"
    tokens: dict[str, int] = field(default_factory=dict)  # prompt/completion/total spent this round
    bound: BoundSpec | None = None  # the run's bound spec, handed on to the round's variants step
    refused: list[Breach] = field(default_factory=list)  # the budget refused the prompt: which limit, by how much
    unusable: Unusable | None = None  # the model's answer gave nothing to measure, and why
    skipped: str | None = None  # the round did not run (an earlier stop, max_rounds), and why
    model: str = ""  # the model that answered (llm), for scoring its forecasts

    def stop_reason(self, round: int, policy: str) -> str | None:
        """Why the search stops after this round (None while it goes on): it proposed nothing, and the reason is true."""
        if self.suggestions or self.skipped:
            return None
        if self.refused:
            return (f"round {round}: the token budget refused the suggest prompt, nothing was sent (BudgetExceeded: "
                    f"{'; '.join(b.text for b in self.refused)}); raise the spec's budget (max_input_tokens_per_round, "
                    "max_output_tokens_per_round, max_total_tokens) or lower search.top_k")
        if self.unusable is not None:
            return f"round {round}: no usable proposal from {policy}: {self.unusable.what}"
        return f"round {round}: the {policy} policy found no config it had not measured"


class Policy(Protocol):
    name: str

    def propose(self, ctx: AgentContext) -> Proposal: ...


@dataclass
class Deduped:
    kept: list[Suggestion]
    dropped: list[DroppedSuggestion]
    notes: list[str]
    outside: int = 0  # dropped as outside the space
    repeated: int = 0  # dropped as already measured, or the same config as an earlier proposal


def _raw(s: Suggestion) -> str:
    return s.model_dump_json(exclude_none=True)[:400]


def _fresh_id(ctx: AgentContext, position: int, taken: set[str]) -> str:
    """A deterministic new id for the proposal at ``position`` (1-based): r<round>_v<position>, then -2, -3, ..."""
    base = f"r{ctx.round}_v{position}"
    vid, n = base, 1
    while vid in taken:
        n += 1
        vid = f"{base}-{n}"
    return vid


def dedupe(ctx: AgentContext, candidates: list[Suggestion], source: str) -> Deduped:
    """Keep proposals that are inside the space, new to this sweep and unique; record the rest with their reason.

    A config already measured in the sweep, or the same as an earlier proposal of this answer, is dropped (it
    would be measured twice). A variant_id already used, in the sweep or earlier in this answer, does not cost
    a valid config: the proposal is renamed deterministically (r<round>_v<position in the answer>) with a note.
    """
    out = Deduped([], [], [])
    seen = {r.config_hash: r.variant_id for r in ctx.history}
    ids = {r.variant_id for r in ctx.history}
    mine: dict[str, str] = {}  # config hash -> id, for this answer
    for pos, s in enumerate(candidates, start=1):
        if len(out.kept) >= ctx.n:
            out.dropped.append(DroppedSuggestion(round=ctx.round, source=source, raw=_raw(s),
                                                 reason=f"beyond the {ctx.n} variants asked for"))
            continue
        problem = ctx.family.space.check(s.config, ctx.spec.params, ctx.spec.hardware.limits)
        if problem:
            out.outside += 1
            out.dropped.append(DroppedSuggestion(round=ctx.round, source=source, raw=_raw(s), reason=f"outside the space: {problem}"))
            continue
        h = s.config_hash
        if h in seen:
            out.repeated += 1
            out.dropped.append(DroppedSuggestion(round=ctx.round, source=source, raw=_raw(s),
                                                 reason=f"config already measured in this sweep (as {seen[h]})"))
            continue
        if h in mine:
            out.repeated += 1
            out.dropped.append(DroppedSuggestion(round=ctx.round, source=source, raw=_raw(s),
                                                 reason=f"the same config as {mine[h]} in this answer: measured once"))
            continue
        if s.variant_id in ids:
            where = "earlier in this answer" if s.variant_id in mine.values() else "in an earlier round"
            new = _fresh_id(ctx, pos, ids)
            out.notes.append(f"{source}: variant_id {s.variant_id} was already used {where}: renamed {new}")
            s = s.model_copy(update={"variant_id": new})
        mine[h] = s.variant_id
        ids.add(s.variant_id)
        out.kept.append(s)
    return out


def validate_and_dedupe(
    ctx: AgentContext, candidates: list[Suggestion], source: str
) -> tuple[list[Suggestion], list[DroppedSuggestion]]:
    """``dedupe`` without its notes: (kept, dropped)."""
    d = dedupe(ctx, candidates, source)
    return d.kept, d.dropped
