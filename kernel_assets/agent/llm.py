"""The llm agent policy (role "suggest"), the hybrid policy and the report narrative (role "report").

The model's answer is untrusted data: it is size-limited, parsed with ``json.loads`` only (after
tolerant extraction from code fences or surrounding prose), validated against the strict
``Suggestion`` schema and the family's space, and never executed. Anything dropped is recorded with its
reason (``DroppedSuggestion``), so the report and the next prompt can show it.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

from pydantic import ValidationError

from kernel_assets.agent.base import AgentContext, Policy, Proposal, validate_and_dedupe
from kernel_assets.agent.prompt import build_suggest_messages
from kregress.core.records import DroppedSuggestion, Suggestion
from kregress.core.spec import TaskSpec
from resources.ledger import BudgetExceeded
from resources.taotoken import CallContext, ContentError, CredentialsError, Gateway, GatewayError, RetriesExhausted

MAX_RESPONSE_CHARS = 32_000  # a JSON array of 64 proposals is well under 20k characters
MAX_ITEMS = 64
SUGGESTION_KEYS = ("variant_id", "config", "patch_summary", "expected_effect", "risk", "parent", "patch")

_FENCE = re.compile(r"```[ \t]*(?:json|JSON)?[ \t]*\n?(.*?)```", re.DOTALL)


def _raw(obj: Any) -> str:
    try:
        s = obj if isinstance(obj, str) else json.dumps(obj, separators=(",", ":"), default=str)
    except (TypeError, ValueError):
        s = repr(obj)
    return s[:400]


def extract_json(text: str) -> tuple[Any, str | None]:
    """(value, None) for the JSON in a reply, or (None, why not).

    Tolerant about the wrapping (a ```json fence, or prose around a single array), strict about the
    content: it must parse as JSON.
    """
    s = (text or "").strip()
    if not s:
        return None, "empty response"
    m = _FENCE.search(s)
    if m:
        s = m.group(1).strip()
    try:
        return json.loads(s), None
    except json.JSONDecodeError as e:
        first_err = e
    # prose around the JSON: take the outermost [...] (or {...}) span
    for open_, close in (("[", "]"), ("{", "}")):
        i, j = s.find(open_), s.rfind(close)
        if 0 <= i < j:
            try:
                return json.loads(s[i : j + 1]), None
            except json.JSONDecodeError:
                continue
    if not any(c in s for c in "[{"):
        return None, "response is prose, not JSON"
    return None, f"response is not valid JSON ({first_err.msg} at line {first_err.lineno} column {first_err.colno})"


def parse_suggestions(
    text: str, ctx: AgentContext, *, source: str = "llm", max_chars: int = MAX_RESPONSE_CHARS, max_items: int = MAX_ITEMS
) -> tuple[list[Suggestion], list[DroppedSuggestion], list[str]]:
    """The model's text -> schema-valid Suggestions (source, round set), what was dropped and why, notes."""
    dropped: list[DroppedSuggestion] = []
    notes: list[str] = []

    def drop(raw: Any, reason: str) -> None:
        dropped.append(DroppedSuggestion(round=ctx.round, source=source, raw=_raw(raw), reason=reason))

    if len(text or "") > max_chars:
        drop(text[:400], f"response too large: {len(text)} characters > limit {max_chars}; nothing in it was used")
        return [], dropped, [f"{source}: response over the size limit ({len(text)} > {max_chars} characters)"]
    value, problem = extract_json(text)
    if problem:
        drop(text, problem)
        return [], dropped, [f"{source}: {problem}"]
    if isinstance(value, dict):
        drop(value, "expected a JSON array of proposals, got an object")
        return [], dropped, [f"{source}: expected a JSON array, got an object"]
    if not isinstance(value, list):
        drop(value, f"expected a JSON array of proposals, got {type(value).__name__}")
        return [], dropped, [f"{source}: expected a JSON array, got {type(value).__name__}"]
    if not value:
        notes.append(f"{source}: empty array (the model says the constraints cannot be met)")
    if len(value) > max_items:
        notes.append(f"{source}: {len(value)} proposals, only the first {max_items} read")
        for item in value[max_items:]:
            drop(item, f"beyond the first {max_items} proposals")
        value = value[:max_items]
    out: list[Suggestion] = []
    for item in value:
        if not isinstance(item, dict):
            drop(item, f"proposal is a {type(item).__name__}, not an object")
            continue
        vid = item.get("variant_id")
        if not isinstance(vid, str) or not vid.strip():
            drop(item, "no variant_id")
            continue
        extra = sorted(k for k in item if k not in SUGGESTION_KEYS)
        fields = {k: item[k] for k in SUGGESTION_KEYS if k in item}
        if "patch" in fields:  # SEARCH/REPLACE blocks or a diff -> the unified diff the gate judges
            from kernel_assets.judge import patch_from_reply

            fields["patch"], why = patch_from_reply(fields["patch"], ctx)
            if why:
                drop(item, why)
                continue
        if not isinstance(fields.get("config"), dict):
            drop(item, "no config object")
            continue
        try:
            s = Suggestion.model_validate({**fields, "source": source, "round": ctx.round})
        except ValidationError as e:
            errs = "; ".join(f"{'.'.join(map(str, er['loc']))}: {er['msg']}" for er in e.errors()[:3])
            drop(item, f"schema: {errs}")
            continue
        if extra:
            notes.append(f"{source}: {vid}: ignored unknown keys {', '.join(extra)[:120]}")
        out.append(s)
    return out, dropped, notes


class LLMPolicy:
    """Chat completions through the gateway (role "suggest"); one call per round.

    Credentials and request errors (a missing key, a wrong base URL or model id) raise: every round would
    fail the same way and the user has to fix the configuration. A gateway that stays down through the
    round (``RetriesExhausted``: the call's whole retry horizon spent) also raises, so the sweep fails
    instead of ending with "nothing new proposed". A budget refusal or unusable content end the round
    with no proposals and a note saying why.
    """

    name = "llm"

    def __init__(
        self, gateway: Gateway, *, max_response_chars: int = MAX_RESPONSE_CHARS, temperature: float | None = None, sweep: str = ""
    ) -> None:
        self.gateway = gateway
        self.max_response_chars = max_response_chars
        self.temperature = temperature
        self.sweep = sweep  # budget scope; empty: the run id of the context (one Dagster run = one sweep)

    def call_context(self, ctx: AgentContext) -> CallContext:
        return CallContext(run_id=ctx.run_id, partition=ctx.partition, round=ctx.round, task=f"round_{ctx.round}_suggestions", sweep=self.sweep)

    def propose(self, ctx: AgentContext) -> Proposal:
        top_k = ctx.spec.search.top_k
        try:
            res = self.gateway.chat(
                "suggest",
                lambda rows: build_suggest_messages(ctx, rows),
                ctx=self.call_context(ctx),
                budget=ctx.spec.budget,
                max_rows=top_k,
                temperature=self.temperature,
            )
        except BudgetExceeded as e:
            ctx.log.warning(f"llm round {ctx.round}: {e}")
            return Proposal([], notes=[f"BudgetExceeded: {e.reason}"])
        except RetriesExhausted as e:
            ctx.log.error(f"llm round {ctx.round}: the gateway stayed down through the round: {e}")
            raise RetriesExhausted(f"[transient] llm round {ctx.round}: no proposals, the gateway stayed down: {e.what}. Fix: {e.fix}",
                                   role=e.role, key_alias=e.key_alias, status=e.status, kind=e.kind) from None
        except ContentError as e:
            ctx.log.warning(f"llm round {ctx.round}: {e}")
            return Proposal([], notes=[f"llm: {e}"])
        tokens = {"prompt": res.prompt_tokens, "completion": res.completion_tokens, "total": res.total_tokens}
        parsed, dropped, notes = parse_suggestions(res.text, ctx, source="llm", max_chars=self.max_response_chars)
        if res.truncated:
            notes.append("llm: response truncated by the gateway's size limit")
        if res.finish_reason == "length":
            notes.append(f"llm: the model hit max_tokens ({res.max_tokens}); the answer may be cut short")
        if res.rows is not None and res.rows < top_k:
            notes.append(f"llm: prompt shrunk to {res.rows} of {top_k} history rows to fit the round budget")
        if res.cache_hit:
            notes.append("llm: response from the cache (no tokens spent)")
        kept, rejected = validate_and_dedupe(ctx, parsed, "llm")
        return Proposal(kept, dropped + rejected, notes, tokens)


class HybridPolicy:
    """llm first; topped up by the local policy when fewer valid proposals come back than asked for.

    When the llm cannot be used at all (no key, bad configuration, the gateway down through the round, the
    budget spent) the whole round is local, with a note saying so.
    """

    name = "hybrid"

    def __init__(self, llm: Policy, local: Policy) -> None:
        self.llm = llm
        self.local = local

    def propose(self, ctx: AgentContext) -> Proposal:
        try:
            first = self.llm.propose(ctx)
        except (GatewayError, BudgetExceeded) as e:
            ctx.log.warning(f"hybrid round {ctx.round}: llm unavailable, continuing with local proposals: {e}")
            first = Proposal([], notes=[f"llm unavailable ({getattr(e, 'category', 'budget')}): {str(e)[:300]}",
                                        f"round {ctx.round} continues with local proposals only"])
        kept = list(first.suggestions)[: ctx.n]
        dropped = list(first.dropped)
        notes = list(first.notes)
        missing = ctx.n - len(kept)
        if missing <= 0:
            return Proposal(kept, dropped, notes, dict(first.tokens))
        local = self.local.propose(dataclasses.replace(ctx, n=ctx.n))
        taken_hashes = {s.config_hash for s in kept}
        taken_ids = {s.variant_id for s in kept}
        added = 0
        for s in local.suggestions:
            if added >= missing:
                break
            if s.config_hash in taken_hashes:
                continue  # the llm already proposed this config
            if s.variant_id in taken_ids:
                s = s.model_copy(update={"variant_id": f"{s.variant_id}_l"[:64]})
                if s.variant_id in taken_ids:
                    continue
            kept.append(s)
            taken_hashes.add(s.config_hash)
            taken_ids.add(s.variant_id)
            added += 1
        dropped += list(local.dropped)
        notes += list(local.notes)
        notes.append(f"topped up with {added} local proposal(s): the llm gave {len(first.suggestions)} valid of {ctx.n} asked")
        return Proposal(kept, dropped, notes, dict(first.tokens))


# --- narrative (role "report") -----------------------------------------------------------------------

NARRATIVE_SYSTEM_PROMPT = """\
You write the summary paragraph of a GPU kernel performance-regression report for kernel engineers.
Use only the facts in the verdict table you are given; do not invent numbers. Plain markdown prose,
at most 200 words, no code, no tables. Say which variants passed, which regressed and why, which need
review and what evidence they rest on, and what to try next."""

_VERDICT = re.compile(r"\b(PASS|REGRESS|NEEDS_REVIEW)\b")


def fallback_narrative(spec: TaskSpec, verdict_markdown: str, why: str) -> str:
    """A plain written summary with no model: counts from the verdict table, and says it was not written by a model."""
    counts = {"PASS": 0, "REGRESS": 0, "NEEDS_REVIEW": 0}
    for line in (verdict_markdown or "").splitlines():
        if line.lstrip().startswith("|") and not set(line.replace("|", "").strip()) <= set("-: "):
            m = _VERDICT.search(line)
            if m:
                counts[m.group(1)] += 1
    n = sum(counts.values())
    parts = [
        f"Sweep {spec.task_id} ({spec.kernel_family}, {spec.dtype}, {spec.hardware.arch}): {n} variant(s) judged: "
        f"{counts['PASS']} PASS, {counts['REGRESS']} REGRESS, {counts['NEEDS_REVIEW']} NEEDS_REVIEW.",
    ]
    if counts["REGRESS"]:
        parts.append("Regressed variants failed correctness, a constraint or the latency guard; see their reasons in the table.")
    if counts["NEEDS_REVIEW"]:
        parts.append("NEEDS_REVIEW rows rest on evidence that cannot decide a latency verdict (e.g. the analytic model); re-run them on a GPU or replay.")
    parts.append(f"This summary was written without a model ({why}); the verdict table is the authoritative result.")
    return " ".join(parts)


def write_narrative(
    gateway: Gateway | None,
    spec: TaskSpec,
    verdict_markdown: str,
    *,
    ctx: CallContext | None = None,
    run_id: str = "",
    partition: str = "",
    max_input_chars: int = 12_000,
    max_output_chars: int = 4_000,
) -> tuple[str, str]:
    """(narrative, source), called once at the end of a sweep.

    source is ``"llm:<key alias>:<model>"`` (or ``"llm:(cache):<model>"``), or ``"fallback: <why>"``: with no key for
    role report it returns a plain written summary and says so. Any gateway failure also falls back, so
    the report is always written. Pass the sweep's ``run_id`` (or a full ``ctx``) so the call counts against
    the same sweep budget (``max_total_tokens``) as the rounds.
    """
    if gateway is None or not gateway.has_key("report"):
        why = "no TAOTOKEN key for role report"
        return fallback_narrative(spec, verdict_markdown, why), f"fallback: {why}"
    table = verdict_markdown if len(verdict_markdown) <= max_input_chars else verdict_markdown[:max_input_chars] + "\n(table truncated)"
    user = (
        f"Task {spec.task_id}: kernel family {spec.kernel_family}, dtype {spec.dtype}, target {spec.hardware.arch} ({spec.hardware.device}). "
        f"Objective: {spec.objective.direction} {spec.objective.metric} ({spec.objective.aggregate} over {len(spec.shape_matrix)} shape(s)); "
        f"regression guard: not worse than {spec.regression_guard.not_worse_than_baseline_ratio}x baseline.\n\nVerdicts:\n{table}"
    )
    call_ctx = ctx or CallContext(run_id=run_id, partition=partition or spec.task_id, round=0, task="verdict_report")
    try:
        res = gateway.chat(
            "report",
            [{"role": "system", "content": NARRATIVE_SYSTEM_PROMPT}, {"role": "user", "content": user}],
            ctx=call_ctx,
            budget=spec.budget,
        )
    except BudgetExceeded as e:
        why = f"BudgetExceeded: {e.reason}"
        return fallback_narrative(spec, verdict_markdown, why), f"fallback: {why}"
    except GatewayError as e:
        why = f"{e.category} error: {str(e)[:200]}"
        return fallback_narrative(spec, verdict_markdown, why), f"fallback: {why}"
    text = (res.text or "").strip()
    if not text:
        why = "the model returned an empty narrative"
        return fallback_narrative(spec, verdict_markdown, why), f"fallback: {why}"
    if len(text) > max_output_chars:
        text = text[:max_output_chars].rsplit(" ", 1)[0] + " ..."
    return text, f"llm:{res.key_alias}:{res.model}"


__all__ = [
    "LLMPolicy",
    "HybridPolicy",
    "parse_suggestions",
    "extract_json",
    "write_narrative",
    "fallback_narrative",
    "CredentialsError",
]
