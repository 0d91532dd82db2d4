"""The llm agent policy (role "suggest"), the hybrid policy and the report narrative (role "report").

The model's answer is untrusted data: it is size-limited, parsed with ``json.loads`` only (after
tolerant extraction from code fences or surrounding prose), validated against the strict ``Suggestion``
schema and the family's space, and never executed. The reply schema is compact (prompt.py): each proposal
is ``{"id", "c": [values in the space's key order], "x": [speedup, low, high], "b", "s"}``; the long form
(``variant_id``, ``config``, ``patch_summary``, ...) is read too. ``x`` is the proposal's forecast (baseline
p50 / variant p50 with an 80% interval): it is stored on the Suggestion before the variant is measured and
never changed.

Anything dropped is recorded with its reason (``DroppedSuggestion``). A round whose answer gives nothing to
measure says why in one line (``Unusable``: prose, not JSON, not an array, outside the space, duplicates,
an empty choices list, ...) with the fix; a variant_id the model reuses costs no valid config (it is renamed).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from kernel_assets.agent.base import AgentContext, Policy, Proposal, Unusable, dedupe
from kernel_assets.agent.prompt import build_suggest_messages
from kregress.core.budget import BudgetScope
from kregress.core.records import DroppedSuggestion, Suggestion
from kregress.core.spec import TaskSpec
from resources.ledger import BudgetExceeded
from resources.taotoken import CallContext, ContentError, CredentialsError, Gateway, GatewayError, RetriesExhausted
from resources.taotoken.gateway import NO_CHOICES

MAX_RESPONSE_CHARS = 32_000  # a JSON array of 64 proposals is well under 20k characters
MAX_ITEMS = 64
LONG_KEYS = ("variant_id", "config", "patch_summary", "expected_effect", "risk", "parent", "expected_speedup",
             "expected_speedup_low", "expected_speedup_high", "bottleneck", "patch")
COMPACT_KEYS = ("id", "c", "x", "b", "s", "r", "p", "patch")  # p / patch: SEARCH/REPLACE blocks or a unified diff
BOTTLENECKS = ("compute", "memory", "latency")

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
    value, cause, why = _extract(text)
    return value, why


def _extract(text: str) -> tuple[Any, str | None, str | None]:
    """(value, cause, why): cause is None, "empty", "prose" or "not_json"."""
    s = (text or "").strip()
    if not s:
        return None, "empty", "empty response"
    m = _FENCE.search(s)
    if m:
        s = m.group(1).strip()
    try:
        return json.loads(s), None, None
    except json.JSONDecodeError as e:
        first_err = e
    # prose around the JSON: take the outermost [...] (or {...}) span
    for open_, close in (("[", "]"), ("{", "}")):
        i, j = s.find(open_), s.rfind(close)
        if 0 <= i < j:
            try:
                return json.loads(s[i : j + 1]), None, None
            except json.JSONDecodeError:
                continue
    if not any(c in s for c in "[{"):
        return None, "prose", "response is prose, not JSON"
    return None, "not_json", f"response is not valid JSON ({first_err.msg} at line {first_err.lineno} column {first_err.colno})"


@dataclass
class Parsed:
    suggestions: list[Suggestion]
    dropped: list[DroppedSuggestion] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    unusable: Unusable | None = None  # the reply as a whole could not be read
    items: int = 0  # proposals the reply held


def _forecast(x: Any) -> tuple[dict[str, float] | None, str]:
    """The forecast fields from ``x`` ([speedup, low, high]), or (None, why it was not kept)."""
    if x is None:
        return None, "no forecast (x)"
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return None, f"forecast {x} has no 80% interval (x must be [speedup, low, high])"
    if not (isinstance(x, list) and len(x) == 3 and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in x)):
        return None, f"forecast {_raw(x)[:60]} is not [speedup, low, high]"
    e, lo, hi = (float(v) for v in x)
    if not all(math.isfinite(v) and v > 0 for v in (e, lo, hi)):
        return None, f"forecast {x} must be positive numbers"
    if not lo <= e <= hi:
        return None, f"forecast {x}: the interval must hold the estimate (low <= speedup <= high)"
    return {"expected_speedup": e, "expected_speedup_low": lo, "expected_speedup_high": hi}, ""


def _from_compact(item: dict[str, Any], keys: list[str]) -> tuple[dict[str, Any] | None, str, list[str]]:
    """A compact proposal -> Suggestion fields, or (None, why, notes)."""
    notes: list[str] = []
    c = item.get("c")
    if isinstance(c, list):
        if len(c) != len(keys):
            return None, f"c has {len(c)} values, the space has {len(keys)} tunables ({', '.join(keys)})", notes
        config = dict(zip(keys, c))
    elif isinstance(c, dict):
        config = c
    else:
        return None, "no config values (c)", notes
    fields: dict[str, Any] = {"variant_id": item.get("id"), "config": config, "patch_summary": item.get("s", "") or ""}
    patch = item.get("p", item.get("patch"))  # the prompt names the key "patch"; "p" is its compact spelling
    if patch is not None:
        fields["patch"] = patch
    if item.get("r") is not None:
        fields["risk"] = item["r"]
    if item.get("b") in BOTTLENECKS:
        fields["bottleneck"] = item["b"]
    elif item.get("b") is not None:
        notes.append(f"bottleneck {_raw(item['b'])[:30]} ignored (compute, memory or latency)")
    fc, why = _forecast(item.get("x"))
    if fc:
        fields.update(fc)
    else:
        notes.append(why)
    return fields, "", notes


def _from_long(item: dict[str, Any]) -> tuple[dict[str, Any] | None, str, list[str]]:
    notes: list[str] = []
    if not isinstance(item.get("config"), dict):
        return None, "no config object", notes
    fields = {k: item[k] for k in LONG_KEYS if k in item}
    if "expected_speedup" in fields:
        fc, why = _forecast([fields.get("expected_speedup"), fields.get("expected_speedup_low"), fields.get("expected_speedup_high")])
        for k in ("expected_speedup", "expected_speedup_low", "expected_speedup_high"):
            fields.pop(k, None)
        if fc:
            fields.update(fc)
        else:
            notes.append(why)
    else:
        notes.append("no forecast (expected_speedup)")
    if fields.get("bottleneck") not in (None, *BOTTLENECKS):
        notes.append(f"bottleneck {_raw(fields.pop('bottleneck'))[:30]} ignored (compute, memory or latency)")
    return fields, "", notes


# What describes a proposal, as opposed to what defines it (variant_id's config, the config, the patch): a
# descriptive field the schema cannot take is kept as text or left out with a note, never a reason to drop
# a valid config. Models write free text there ("risk": "more shared memory").
RISKS = ("low", "medium", "high")
TEXT_LIMITS = {name: next((m.max_length for m in Suggestion.model_fields[name].metadata if hasattr(m, "max_length")), None)
               for name in ("patch_summary", "expected_effect")}


def _text(value: Any) -> str:
    return value if isinstance(value, str) else _raw(value)


def descriptive_fields(fields: dict[str, Any]) -> list[str]:
    """Make the descriptive fields of one proposal fit the schema, in place; returns notes saying what was
    changed. ``risk`` not one of low/medium/high: its text leads ``expected_effect`` ("risk: ...") and the
    risk is left unset; a summary or effect that is too long is cut (with "..."), one that is not text is
    written as JSON; a ``parent`` that is not a name is left out."""
    notes: list[str] = []
    risk = fields.get("risk")
    if risk is None:
        fields.pop("risk", None)  # not given (or null): the schema's default
    else:
        word = risk.strip().lower() if isinstance(risk, str) else None
        if word in RISKS:
            fields["risk"] = word
        else:
            fields.pop("risk")
            said = " ".join(_text(risk).split())
            # first, so that cutting a long effect to its limit keeps it
            fields["expected_effect"] = "; ".join(x for x in (f"risk: {said}", _text(fields.get("expected_effect") or "")) if x)
            notes.append(f"risk {said[:40]!r} is not low/medium/high: kept as text in expected_effect")
    for name, limit in TEXT_LIMITS.items():
        value = fields.get(name)
        if value is None:  # missing or null: empty text (a summary describes a variant, it does not define one)
            fields[name] = ""
            continue
        text = " ".join(_text(value).split()) if not isinstance(value, str) else value
        if limit and len(text) > limit:
            text = text[: limit - 3].rstrip() + "..."
            notes.append(f"{name} cut to {limit} characters")
        elif not isinstance(value, str):
            notes.append(f"{name} was not text: kept as JSON")
        fields[name] = text
    parent = fields.get("parent")
    if parent is not None and not isinstance(parent, str):
        fields.pop("parent")
        notes.append(f"parent {_raw(parent)[:30]} ignored (a variant id)")
    return notes


def parse_suggestions(
    text: str, ctx: AgentContext, *, source: str = "llm", max_chars: int = MAX_RESPONSE_CHARS, max_items: int = MAX_ITEMS,
    finish_reason: str = "",
) -> Parsed:
    """The model's text -> schema-valid Suggestions (source, round set), what was dropped and why, notes, and why
    the reply as a whole was unusable when it was."""
    out = Parsed([])

    def drop(raw: Any, reason: str) -> None:
        out.dropped.append(DroppedSuggestion(round=ctx.round, source=source, raw=_raw(raw), reason=reason))

    if len(text or "") > max_chars:
        drop(text[:400], f"response too large: {len(text)} characters > limit {max_chars}; nothing in it was used")
        out.unusable = Unusable("too_large", f"{len(text)} characters > {max_chars}")
        return out
    value, cause, why = _extract(text)
    if cause:
        drop(text, why or cause)
        if cause == "not_json" and finish_reason == "length":
            cause = "cut_short"
        out.unusable = Unusable(cause, "" if cause in ("empty", "prose", "cut_short") else (why or ""))
        return out
    if not isinstance(value, list):
        kind = "an object" if isinstance(value, dict) else type(value).__name__
        drop(value, f"expected a JSON array of proposals, got {kind}")
        out.unusable = Unusable("not_array", f"got {kind}")
        return out
    if not value:
        out.unusable = Unusable("empty_array")
        return out
    if len(value) > max_items:
        out.notes.append(f"{source}: {len(value)} proposals, only the first {max_items} read")
        for item in value[max_items:]:
            drop(item, f"beyond the first {max_items} proposals")
        value = value[:max_items]
    out.items = len(value)
    keys = list(ctx.family.space.params)
    for item in value:
        if not isinstance(item, dict):
            drop(item, f"proposal is a {type(item).__name__}, not an object")
            continue
        compact = "variant_id" not in item and "config" not in item
        fields, problem, notes = _from_compact(item, keys) if compact else _from_long(item)
        vid = (fields or {}).get("variant_id") or item.get("id") or item.get("variant_id")
        if not isinstance(vid, str) or not vid.strip():
            drop(item, "no variant id")
            continue
        if fields is None:
            drop(item, problem)
            continue
        if not re.fullmatch(r"[A-Za-z0-9_.:-]{1,64}", vid.strip()):  # a name, not what defines the variant: made valid
            fields["variant_id"] = re.sub(r"[^A-Za-z0-9_.:-]+", "_", vid.strip()).strip("_")[:64] or f"r{ctx.round}_v{out.items}"
            notes.append(f"variant id {vid[:40]!r} renamed {fields['variant_id']!r} (letters, digits and _.:- only)")
        else:
            fields["variant_id"] = vid.strip()
        if fields.get("patch") is not None:  # SEARCH/REPLACE blocks or a diff -> the unified diff the gate judges
            from kernel_assets.judge import patch_from_reply

            fields["patch"], why = patch_from_reply(fields["patch"], ctx)
            if why:
                drop(item, why)
                continue
        extra = sorted(k for k in item if k not in (COMPACT_KEYS if compact else LONG_KEYS))
        notes += descriptive_fields(fields)  # only what defines the variant may refuse it
        try:
            s = Suggestion.model_validate({**fields, "source": source, "round": ctx.round})
        except ValidationError as e:
            errs = "; ".join(f"{'.'.join(map(str, er['loc']))}: {er['msg']}" for er in e.errors()[:3])
            drop(item, f"schema: {errs}")
            continue
        if extra:
            notes.append(f"ignored unknown keys {', '.join(extra)[:120]}")
        out.notes += [f"{source}: {vid}: {n}" for n in notes]
        out.suggestions.append(s)
    return out


def _nothing_left(parsed: Parsed, outside: int, repeated: int, first_reason: str) -> Unusable:
    """Why a reply that parsed gave nothing to measure."""
    if not parsed.suggestions:
        return Unusable("schema", f"{parsed.items} proposal(s); first: {first_reason}"[:200])
    if outside >= repeated:
        return Unusable("outside_space", f"{outside} of {parsed.items} proposal(s); first: {first_reason}"[:240])
    return Unusable("duplicate", f"{repeated} of {parsed.items} proposal(s)")


class LLMPolicy:
    """Chat completions through the gateway (role "suggest"); one call per round.

    Credentials and request errors (a missing key, a wrong base URL or model id) raise: every round would
    fail the same way and the user has to fix the configuration. A gateway that stays down through the
    round (``RetriesExhausted``: the call's whole retry horizon spent) also raises, so the sweep fails
    instead of ending with "nothing new proposed". A budget refusal ends the round with the typed breaches;
    an answer with nothing to measure ends it with ``Proposal.unusable`` (the cause and its fix). None of
    these is logged here: the caller prints each once.
    """

    name = "llm"

    def __init__(
        self, gateway: Gateway, *, max_response_chars: int = MAX_RESPONSE_CHARS, temperature: float | None = None,
        scope: BudgetScope | None = None,
    ) -> None:
        self.gateway = gateway
        self.max_response_chars = max_response_chars
        self.temperature = temperature
        self.scope = scope  # the run's budget scope; None: the context's (one Dagster run = one sweep)

    def call_context(self, ctx: AgentContext) -> CallContext:
        return CallContext(scope=self.scope or ctx.scope, run_id=ctx.run_id, partition=ctx.partition, round=ctx.round,
                           task=f"round_{ctx.round}_suggestions")

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
            return Proposal([], notes=[f"BudgetExceeded: {e.reason}"], refused=list(e.breaches))
        except RetriesExhausted as e:
            raise RetriesExhausted(f"[transient] llm round {ctx.round}: no proposals, the gateway stayed down: {e.what}. Fix: {e.fix}",
                                   role=e.role, key_alias=e.key_alias, status=e.status, kind=e.kind) from None
        except ContentError as e:
            if e.kind == NO_CHOICES:
                pt, ct = getattr(e, "billed", (0, 0))
                unusable = Unusable("no_choices", f"{pt}+{ct} tokens billed, recorded in the ledger")
            else:
                unusable = Unusable("content", e.what[:300], e.fix)
            return Proposal([], notes=[f"llm: {e}"], unusable=unusable, model=self.gateway.model)
        tokens = {"prompt": res.prompt_tokens, "completion": res.completion_tokens, "total": res.total_tokens}
        parsed = parse_suggestions(res.text, ctx, source="llm", max_chars=self.max_response_chars, finish_reason=res.finish_reason)
        notes = list(parsed.notes)
        if res.truncated:
            notes.append("llm: response truncated by the gateway's size limit")
        if res.finish_reason == "length":
            notes.append(f"llm: the model hit max_tokens ({res.max_tokens}); the answer may be cut short")
        if res.rows is not None and res.rows < top_k:
            notes.append(f"llm: prompt shrunk to {res.rows} of {top_k} history rows to fit the round budget")
        if res.cache_hit:
            notes.append("llm: response from the cache (no tokens spent)")
        d = dedupe(ctx, parsed.suggestions, "llm")
        unusable = parsed.unusable
        if unusable is None and not d.kept:
            first = (parsed.dropped + d.dropped)[0].reason if (parsed.dropped or d.dropped) else ""
            unusable = _nothing_left(parsed, d.outside, d.repeated, first)
        return Proposal(d.kept, parsed.dropped + d.dropped, notes + d.notes, tokens, unusable=unusable, model=res.model)


class HybridPolicy:
    """llm first; topped up by the local policy when fewer valid proposals come back than asked for.

    When the llm cannot be used at all (no key, bad configuration, the gateway down through the round, the
    budget spent) or its answer gave nothing to measure, the whole round is local, and one line says why and
    that the round goes on with local proposals.
    """

    name = "hybrid"

    def __init__(self, llm: Policy, local: Policy) -> None:
        self.llm = llm
        self.local = local

    def propose(self, ctx: AgentContext) -> Proposal:
        try:
            first = self.llm.propose(ctx)
        except (GatewayError, BudgetExceeded) as e:
            why = str(e)[:300]
            ctx.log.warning(f"round {ctx.round}: the llm is unavailable ({why}); continuing with local proposals")
            first = Proposal([], notes=[f"llm unavailable ({getattr(e, 'category', 'budget')}): {why}",
                                        f"round {ctx.round} continues with local proposals only"])
        else:
            if first.refused:
                ctx.log.warning(f"round {ctx.round}: the token budget refused the llm prompt "
                                f"({'; '.join(b.text for b in first.refused)}); continuing with local proposals")
            elif first.unusable is not None:
                u = first.unusable
                ctx.log.warning(f"round {ctx.round}: no usable proposal from llm: {u.what}; continuing with local proposals. "
                                f"Fix: {u.fix}")
        kept = list(first.suggestions)[: ctx.n]
        dropped = list(first.dropped)
        notes = list(first.notes)
        if first.unusable is not None:
            notes.append(f"llm: {first.unusable.what}; the round continues with local proposals")
        missing = ctx.n - len(kept)
        if missing <= 0:
            return dataclasses.replace(first, suggestions=kept, dropped=dropped, notes=notes, tokens=dict(first.tokens))
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
        # the round's answer is usable when local filled it; a budget refusal is kept for the report
        return Proposal(kept, dropped, notes, dict(first.tokens), refused=list(first.refused) if not kept else [],
                        unusable=None if kept else first.unusable, model=first.model)


# --- narrative (role "report") -----------------------------------------------------------------------

NARRATIVE_SYSTEM_PROMPT = """\
You write the summary paragraph of a GPU kernel performance-regression report for kernel engineers.
Use only the facts in the verdict table you are given; do not invent numbers. Plain markdown prose,
at most 150 words, no code, no tables. Say which variants passed, which regressed and why, which need
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
        parts.append("NEEDS_REVIEW rows rest on evidence that cannot decide a latency verdict (e.g. the analytic model); "
                     "re-run them on a GPU or replay.")
    parts.append(f"This summary was written without a model ({why}); the verdict table is the authoritative result.")
    return " ".join(parts)


def write_narrative(
    gateway: Gateway | None,
    spec: TaskSpec,
    verdict_markdown: str,
    *,
    ctx: CallContext | None = None,
    scope: BudgetScope | None = None,
    run_id: str = "",
    partition: str = "",
    max_input_chars: int = 12_000,
    max_output_chars: int = 4_000,
) -> tuple[str, str]:
    """(narrative, source), called once at the end of a sweep.

    source is ``"llm:<key alias>:<model>"`` (or ``"llm:(cache):<model>"``), or ``"fallback: <why>"``: with no key for
    role report it returns a plain written summary and says so. Any gateway failure also falls back, so
    the report is always written. Pass the run's budget ``scope`` (or its ``run_id``, or a full ``ctx``) so the
    call counts against the same sweep budget (``max_total_tokens``) as the rounds.
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
    call_ctx = ctx or CallContext(scope=scope, run_id=run_id, partition=partition or spec.task_id, round=0, task="verdict_report")
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
