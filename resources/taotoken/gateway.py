"""Chat completions with budgets, key failover, time-bounded retries, shared cooldowns and a response cache.

``Gateway.chat`` owns the retries (the SDK's ``max_retries`` is 0). Before anything is sent, the call's
estimate (a conservative prompt estimate + max_tokens) is reserved in the ledger, atomically across
processes; ``max_tokens`` is lowered to what the round and the sweep have left, a prompt that does not fit
is rebuilt with fewer history rows, and if even that does not fit no call is made (``BudgetExceeded``). Once
any call of a sweep was billed more than it reserved, the sweep makes no further call.

Failures: 429 / 408 / 5xx, timeouts and dropped connections cool the key (Retry-After honoured, else
exponential backoff with jitter) and fail over to another key of the role; the call gives up when its
waits would pass ``retry_horizon_s`` (``RetriesExhausted``). A key the server rejects (401, 402, 403, a quota
code) is taken out and the call fails over; ``CredentialsError`` comes only when every key of the role was
rejected. Cooldowns are written to the ledger, so parallel runs skip a key another run just saw limited.
Other 4xx raise ``RequestError`` / ``ContentError`` at once; so does a 200 whose ``choices`` list is empty (a
provider or content failure), with the usage it reported recorded and charged. Every attempt is one ledger row,
written before the request goes out and completed when the answer comes, so a process killed mid-call leaves
its row; the first call of a gateway settles what dead processes on this host left in flight
(``UsageStore.recover``). Responses are cached by request hash, so a re-run does not pay twice.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import openai

from kregress.core import endpoints
from kregress.core.budget import BudgetScope, budget_scope
from kregress.core.endpoints import (
    ContentError,
    CredentialsError,
    GatewayError,
    RequestError,
    RetriesExhausted,
    resolve_base_url,
)
from kregress.core.names import ROLES
from kregress.core.records import UsageRecord
from kregress.core.spec import Budget
from resources.ledger import CACHE_ALIAS, INTERRUPTED, BudgetExceeded, Ledger, Reservation, new_owner
from resources.taotoken.errors import Where, classify, parse_error_body, retry_after
from resources.taotoken.estimate import estimate_messages_tokens, estimate_tokens, request_hash
from resources.taotoken.keys import CREDENTIALS, ApiKey, KeyPool
from resources.taotoken.settings import GatewaySettings

log_default = logging.getLogger("kregress.gateway")
NO_CHOICES = "no_choices"  # ContentError.kind of a 200 answer whose choices list is empty
MIN_DELAY_S = 0.1  # the shortest wait between attempts (a server answering "Retry-After: 0" forever still ends)


@dataclass(frozen=True)
class CallContext:
    """Who is calling: the budget scope the call counts against (its sweep, run and partition), the round and task.

    Pass the run's ``scope`` (made once where the run starts); without one, ``budget_scope(run_id,
    partition)`` is the scope, the same rule the run itself uses.
    """

    scope: BudgetScope | None = None
    round: int = 0  # 1..N for suggest rounds; 0 for the report / review calls (sweep budget only)
    task: str = ""  # e.g. "round_2_suggestions", "verdict_report"
    run_id: str = ""
    partition: str = ""

    def __post_init__(self) -> None:
        if self.scope is None:
            object.__setattr__(self, "scope", budget_scope(self.run_id, self.partition))
        else:
            object.__setattr__(self, "run_id", self.run_id or self.scope.run_id)
            object.__setattr__(self, "partition", self.partition or self.scope.partition)

    @property
    def sweep(self) -> str:
        assert self.scope is not None
        return self.scope.sweep


@dataclass
class ChatResult:
    text: str
    role: str
    model: str
    key_alias: str
    request_id: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    finish_reason: str = ""
    cache_hit: bool = False
    attempts: int = 0
    rows: int | None = None  # history rows the prompt was built with (when a builder was given)
    estimated_prompt_tokens: int = 0
    max_tokens: int = 0  # as sent (possibly lowered to what the budget had left)
    latency_ms: float = 0.0
    truncated: bool = False
    usage_estimated: bool = False


# Alike in shape only to kregress/core/records.py's measurement fields (typed defaults): nothing to merge.
@dataclass
class _Outcome:
    ok: bool
    kind: str = ""  # ok, rate_limited, server_error, timeout, connection, credentials, request, content
    status: int | None = None
    retry_after: float | None = None
    body_text: str = ""
    request_id: str = ""
    text: str = ""
    finish_reason: str = ""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    truncated: bool = False
    error: GatewayError | None = None
    usage_reported: bool = False  # an error answer that still reported usage (e.g. an empty choices list)


class Gateway:
    """Chat completions with key failover, retries, budgets, a response cache and one ledger row per attempt."""

    def __init__(
        self,
        settings: GatewaySettings,
        *,
        keys: KeyPool,
        ledger: Ledger,
        log: Any = None,
        sleep: Callable[[float], None] | None = None,
        clock: Callable[[], float] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.settings = settings
        self.root, self.sdk_base = resolve_base_url(settings.base_url)
        self.model = (settings.model_id or "").strip()
        self.keys = keys
        self.ledger = ledger
        self.timeout = openai.Timeout(settings.read_timeout_s, connect=settings.connect_timeout_s)
        self.log = log or log_default
        self.sleep = sleep or time.sleep
        self.clock = clock or time.monotonic
        self.rng = rng or random.Random()
        self.owner = new_owner()  # tags the cooldowns this gateway shares through the ledger
        self._clients: dict[str, openai.OpenAI] = {}
        self._model_checked = False
        self._recovered = False

    def __repr__(self) -> str:
        return f"Gateway(root={self.root!r}, model={self.model!r}, keys={self.keys!r}, ledger={self.ledger!r})"

    # -- small helpers -----------------------------------------------------------------------
    def has_key(self, role: str) -> bool:
        return self.keys.has(role)

    def aliases(self, role: str | None = None) -> list[str]:
        return self.keys.aliases(role)

    def close(self) -> None:
        for c in self._clients.values():
            c.close()
        self._clients.clear()

    def _say(self, level: str, msg: str) -> None:
        getattr(self.log, level)(self.keys.scrub(msg))

    def _client(self, key: ApiKey) -> openai.OpenAI:
        c = self._clients.get(key.alias)
        if c is None:
            c = openai.OpenAI(api_key=key.reveal(), base_url=self.sdk_base, timeout=self.timeout, max_retries=0)
            self._clients[key.alias] = c
        return c

    def backoff(self, n: int) -> float:
        """Delay before retry n (0-based): exponential, capped, with 'equal jitter' (half fixed, half random)."""
        d = min(self.settings.backoff_max_s, self.settings.backoff_base_s * (2**n))
        return d * (0.5 + 0.5 * self.rng.random())

    def _where(self, role: str, key: ApiKey | None, *, path: str = "/chat/completions", est_prompt: int = 0, max_tokens: int = 0) -> Where:
        return Where(self.sdk_base, self.root, self.model, role, key.alias if key else "", path, est_prompt, max_tokens,
                     self.keys.credentials_hint(role), self.keys.scrub)

    # -- cooldowns shared through the ledger ---------------------------------------------------
    def _sync_cooldowns(self, role: str) -> None:
        """Take in the cooldowns other gateways (other runs, other processes) wrote for this role's keys."""
        rows = self.ledger.cooldowns.active(self.keys.aliases(role))
        now, now_wall = self.clock(), time.time()
        for alias, (until, reason, owner) in rows.items():
            if owner != self.owner:
                self.keys.cool(alias, now + (until - now_wall), reason)

    def _cool(self, key: ApiKey, delay: float, reason: str) -> None:
        self.keys.cool(key, self.clock() + delay, reason)
        self.ledger.cooldowns.cool(key.alias, time.time() + delay, reason=reason, owner=self.owner)

    # -- the model id ------------------------------------------------------------------------
    def _check_model(self, role: str) -> None:
        if not self.model:
            raise RequestError(
                f"[request] no model id configured. Fix: set {endpoints.MODEL_ENV} (or TaotokenResource(model_id=...)) to a model served at "
                f"{self.sdk_base}/models; the gateway never guesses a model.",
                role=role,
            )
        if self._model_checked or not self.settings.verify_model:
            return
        served: list[str] | None = None
        while served is None:
            self._sync_cooldowns(role)
            key, _ = self.keys.pick(role, self.clock())  # raises CredentialsError once every key was rejected
            try:
                served = [m.id for m in self._client(key).models.list().data]
            except openai.APIStatusError as e:
                err = classify(e.status_code, parse_error_body(e.body), self._where(role, key, path="/models"))
                if isinstance(err, CredentialsError):
                    left = self.keys.reject(key, err)
                    self._cool(key, self.settings.credential_cooldown_s, CREDENTIALS)
                    self._say("warning", f"{role}: {key.alias} rejected by GET /models (HTTP {e.status_code})"
                                         f"{'; trying ' + left[0].alias if left else ''}")
                    if not left:
                        raise self.keys.all_rejected(role) from None
                    continue
                self._say("debug", f"model list unavailable (HTTP {e.status_code}); the model id is checked by the first call")
                break
            except (openai.APIConnectionError, openai.APIResponseValidationError, ValueError, TypeError, AttributeError) as e:
                self._say("debug", f"model list unavailable ({type(e).__name__}); the model id is checked by the first call")
                break
        self._model_checked = True
        if served is not None and self.model not in served:
            sample = ", ".join(sorted(served)[:12]) + (" ..." if len(served) > 12 else "")
            raise RequestError(
                f"[request] model id {self.model!r} is not served at {self.sdk_base} ({len(served)} models are: {sample or 'none'}). "
                f"Fix: set {endpoints.MODEL_ENV} to one of them; the gateway never guesses a model.",
                role=role,
            )

    # -- one attempt -------------------------------------------------------------------------
    def _attempt(self, key: ApiKey, body: dict[str, Any], role: str, est_prompt: int) -> _Outcome:
        client = self._client(key)
        now_wall = time.time()
        try:
            raw = client.chat.completions.with_raw_response.create(**body)
            request_id = raw.headers.get("x-request-id", "")
            completion = raw.parse()
        except openai.APITimeoutError:
            return _Outcome(False, "timeout")
        except openai.APIConnectionError:
            return _Outcome(False, "connection")
        except openai.APIStatusError as e:
            status = e.status_code
            parsed = parse_error_body(e.body)
            msg = self.keys.scrub(parsed.message)[:300]
            rid = e.response.headers.get("x-request-id", "")
            err = classify(status, parsed, self._where(role, key, est_prompt=est_prompt, max_tokens=int(body.get("max_tokens", 0))))
            if err is None:
                kind = "rate_limited" if status == 429 else ("timeout" if status == 408 else "server_error")
                return _Outcome(False, kind, status, retry_after(e.response.headers, now_wall), msg, rid)
            return _Outcome(False, err.category, status, None, msg, rid, error=err)
        except openai.APIResponseValidationError as e:
            err = RequestError(
                self.keys.scrub(f"[request] the server at {self.sdk_base} answered with data that is not a chat completion "
                                f"(HTTP {e.status_code}). Fix: check {endpoints.BASE_URL_ENV}; it must be the OpenAI-compatible API root, e.g. {endpoints.DEFAULT_ROOT}."),
                role=role, key_alias=key.alias, status=e.status_code,
            )
            return _Outcome(False, "request", e.status_code, error=err)
        return self._read_completion(completion, request_id, role, key)

    def _read_completion(self, completion: Any, request_id: str, role: str, key: ApiKey) -> _Outcome:
        choices = getattr(completion, "choices", None)
        usage = getattr(completion, "usage", None) if not isinstance(completion, (str, bytes)) else None
        if isinstance(choices, list) and not choices:
            # A chat completion with nothing in it: the URL was right (the server answered in the API's shape), the
            # provider produced no message (moderation, an upstream failure). What it billed is recorded.
            pt = getattr(usage, "prompt_tokens", None) if usage else None
            ct = getattr(usage, "completion_tokens", None) if usage else None
            billed = f"; it reported {pt or 0}+{ct or 0} tokens, recorded in the ledger" if usage else ""
            err = ContentError(
                f"[content] POST {self.sdk_base}/chat/completions answered 200 with an empty choices list: model {self.model!r} "
                f"returned no message (role {role}, key {key.alias}){billed}. Fix: the provider refused or failed this prompt; "
                f"retry later, or set {endpoints.MODEL_ENV} to another model served at {self.sdk_base}/models.",
                role=role, key_alias=key.alias, status=200, kind=NO_CHOICES,
            )
            err.billed = (int(pt or 0), int(ct or 0))  # type: ignore[attr-defined]  # what the server reported for it
            return _Outcome(False, "content", 200, request_id=request_id or str(getattr(completion, "id", "") or ""),
                            prompt_tokens=pt, completion_tokens=ct, error=err, usage_reported=usage is not None)
        if isinstance(completion, (str, bytes)) or not choices:
            what = "an HTML/text page" if isinstance(completion, (str, bytes)) else "a JSON object with no choices"
            err = RequestError(
                f"[request] POST {self.sdk_base}/chat/completions answered with {what}, not a chat completion. "
                f"Fix: {endpoints.BASE_URL_ENV} must be the OpenAI-compatible API root, e.g. {endpoints.DEFAULT_ROOT} (root now: {self.root}).",
                role=role, key_alias=key.alias, status=200,
            )
            return _Outcome(False, "request", 200, error=err)
        choice = choices[0]
        msg = getattr(choice, "message", None)
        text = (getattr(msg, "content", None) or "") if msg is not None else ""
        limit = self.settings.max_response_chars
        return _Outcome(
            True, "ok", 200,
            request_id=request_id or str(getattr(completion, "id", "") or ""),
            text=self.keys.scrub_exact(text[:limit]),
            finish_reason=str(getattr(choice, "finish_reason", "") or ""),
            prompt_tokens=getattr(usage, "prompt_tokens", None) if usage else None,
            completion_tokens=getattr(usage, "completion_tokens", None) if usage else None,
            truncated=len(text) > limit,
        )

    # -- the call ----------------------------------------------------------------------------
    def chat(
        self,
        role: str,
        messages: Sequence[Mapping[str, Any]] | Callable[[int], Sequence[Mapping[str, Any]]],
        *,
        ctx: CallContext | None = None,
        budget: Budget | None = None,
        max_tokens: int | None = None,
        max_rows: int | None = None,
        temperature: float | None = None,
        use_cache: bool | None = None,
    ) -> ChatResult:
        """One chat completion for ``role``.

        ``messages`` is a list of {"role", "content"} dicts, or a builder ``rows -> messages``; with a builder
        the prompt is first built with ``max_rows`` history rows and rebuilt with fewer while it does not
        fit the round's budget. Raises BudgetExceeded (nothing sent), CredentialsError / RequestError /
        ContentError (not retried) or RetriesExhausted.
        """
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}; allowed: {', '.join(ROLES)}")
        ctx = ctx or CallContext()
        if not self.keys.has(role):
            raise CredentialsError(self.keys.no_key_message(role), role=role)
        self._check_model(role)
        s = self.settings
        mt = int(max_tokens or s.max_tokens_for(role))
        cache_on = s.use_cache if use_cache is None else use_cache
        params: dict[str, Any] = {"max_tokens": mt, "temperature": s.temperature if temperature is None else temperature}

        if callable(messages):
            top = max(0, int(max_rows if max_rows is not None else 8))
            candidates = list(range(top, -1, -1)) if top <= 32 else sorted({top, *(top >> i for i in range(1, 12)), 0}, reverse=True)
        else:
            candidates = [None]

        self._recover()
        reservation: Reservation | None = None
        for i, rows in enumerate(candidates):
            msgs = [dict(m) for m in (messages(rows) if callable(messages) else messages)]  # type: ignore[operator]
            for m in msgs:
                if not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                    raise ValueError("each message needs a 'role' and a string 'content'")
            est = estimate_messages_tokens(msgs)
            h = request_hash(self.model, msgs, params)
            if cache_on:
                hit = self.ledger.cache.get(h)
                if hit is not None:
                    return self._cache_hit(hit, role, ctx, rows, est, mt)
            try:
                reservation = self.ledger.usage.reserve(
                    ctx.scope, round=ctx.round, est_input=est, est_output=mt, budget=budget, role=role, task=ctx.task,
                    record_refusal=(i == len(candidates) - 1), min_output=min(mt, s.min_output_tokens),
                )
                break
            except BudgetExceeded as e:
                if i == len(candidates) - 1 or e.blocked:
                    tried = f" (tried {candidates[0]}..{rows} history rows)" if callable(messages) and i else ""
                    self._say("debug", f"{role}: no call made: {e.reason}{tried}")
                    raise BudgetExceeded(e.breaches, scope=e.scope, round=e.round, note=tried) from None
        assert reservation is not None
        if callable(messages) and rows != candidates[0]:
            self._say("info", f"{role}: prompt shrunk to {rows} history rows to fit the round budget")
        if reservation.est_output < mt:
            self._say("info", f"{role}: max_tokens lowered from {mt} to {reservation.est_output}: what the budget has left")
            params = {**params, "max_tokens": reservation.est_output}
            h = request_hash(self.model, msgs, params)
            hit = self.ledger.cache.get(h) if cache_on else None
            if hit is not None:
                self.ledger.usage.settle(reservation, 0, 0)
                return self._cache_hit(hit, role, ctx, rows, est, reservation.est_output)

        body = {"model": self.model, "messages": msgs, **params}
        billed = [0, 0]  # what the server reported over every attempt of this call, errors with usage included
        try:
            result = self._send(role, body, ctx, reservation, est, billed)
        finally:
            self.ledger.usage.settle(reservation, billed[0], billed[1])
        used_in, used_out = billed
        if used_in > reservation.est_input or used_out > reservation.est_output:
            self._say("warning", f"{role}: the server billed {used_in}+{used_out} tokens against a reservation of "
                                 f"{reservation.est_input}+{reservation.est_output}: budget overshoot; sweep {ctx.sweep} makes no further calls")
        result.rows = rows
        if cache_on and result.text and not result.truncated:
            self.ledger.cache.put(h, model=self.model, role=role, content=result.text, finish_reason=result.finish_reason,
                                  request_id=result.request_id, prompt_tokens=result.prompt_tokens, completion_tokens=result.completion_tokens)
        return result

    def _recover(self) -> None:
        """Once per gateway: settle the reservations and attempts that dead processes on this host left in flight."""
        if self._recovered:
            return
        self._recovered = True
        for r in self.ledger.usage.recover():
            self._say("warning", f"ledger: reservation {r.reservation_id} of sweep {r.sweep} was left in flight by a process that "
                                 f"died; {r.state} ({r.input}+{r.output} tokens; {r.interrupted_attempts} attempt(s) interrupted)")

    def _cache_hit(self, hit: dict[str, Any], role: str, ctx: CallContext, rows: int | None, est: int, mt: int) -> ChatResult:
        self.ledger.usage.record(
            UsageRecord(ts=time.time(), run_id=ctx.run_id, partition=ctx.partition, round=ctx.round, role=role, task=ctx.task,  # type: ignore[arg-type]
                        key_alias=CACHE_ALIAS, model=self.model, request_id=hit["request_id"], attempt=1, status="ok", cache_hit=True),
            sweep=ctx.sweep,
        )
        self._say("info", f"{role}: response served from the cache (request {hit['request_id'] or '-'}); no tokens spent")
        return ChatResult(text=hit["content"], role=role, model=self.model, key_alias=CACHE_ALIAS, request_id=hit["request_id"],
                          finish_reason=hit["finish_reason"], cache_hit=True, attempts=0, rows=rows, estimated_prompt_tokens=est, max_tokens=mt)

    def _give_up(self, role: str, attempt: int, waited: float, last: str, alias: str, status: int | None, kind: str, why: str) -> RetriesExhausted:
        return RetriesExhausted(
            f"[transient] {role}: gave up after {attempt} attempt(s) and {waited:.1f}s of waiting ({why}; last: {last} on {alias}). "
            f"Fix: the service is overloaded or unreachable from here; try later, add keys to TAOTOKEN_KEY_{role.upper()}, "
            f"or raise retry_horizon_s (now {self.settings.retry_horizon_s:.0f}s).",
            role=role, key_alias=alias, status=status, kind=kind,
        )

    def _send(self, role: str, body: dict[str, Any], ctx: CallContext, reservation: Reservation, est: int,
              billed: list[int]) -> ChatResult:
        s = self.settings
        failures = attempt = 0
        waited = 0.0
        last: tuple[str, str, int | None, str] | None = None  # (what, alias, status, kind) of the last transient failure
        while True:
            self._sync_cooldowns(role)
            key, wait = self.keys.pick(role, self.clock())  # CredentialsError once every key of the role was rejected
            if wait > 0:
                if waited + wait > s.retry_horizon_s + 1e-9:
                    what, alias, status, kind = last or ("cooling down", key.alias, None, "rate_limited")
                    raise self._give_up(role, attempt, waited, what, alias, status, kind,
                                        f"the next wait, {wait:.1f}s for {key.alias}, passes the retry horizon of {s.retry_horizon_s:.0f}s")
                self._say("info", f"{role}: every key is cooling down; waiting {wait:.2f}s for {key.alias}")
                self.sleep(wait)
                waited += wait
            attempt += 1
            # On record before it goes out: a process killed while waiting for the answer still leaves this row.
            aid = self.ledger.usage.begin_attempt(
                UsageRecord(ts=time.time(), run_id=ctx.run_id, partition=ctx.partition, round=ctx.round, role=role, task=ctx.task,  # type: ignore[arg-type]
                            key_alias=key.alias, model=self.model, attempt=attempt),
                sweep=ctx.sweep, reservation_id=reservation.id,
            )
            t0 = time.perf_counter()
            try:
                out = self._attempt(key, body, role, est)
            except BaseException:
                self.ledger.usage.finish_attempt(aid, status="error", error_class=INTERRUPTED,
                                                 latency_ms=round((time.perf_counter() - t0) * 1000.0, 2))
                raise
            latency = (time.perf_counter() - t0) * 1000.0
            usage_estimated = out.ok and (out.prompt_tokens is None or out.completion_tokens is None)
            pt = out.prompt_tokens if out.prompt_tokens is not None else (est if out.ok else 0)
            ct = out.completion_tokens if out.completion_tokens is not None else (estimate_tokens(out.text) if out.ok else 0)
            billed[0] += int(pt)
            billed[1] += int(ct)
            self.ledger.usage.finish_attempt(
                aid, status="ok" if out.ok else "error", prompt_tokens=int(pt), completion_tokens=int(ct),
                latency_ms=round(latency, 2), request_id=out.request_id,
                error_class=("usage_estimated" if usage_estimated else "") if out.ok else (out.kind + (f":{out.status}" if out.status else "")),
            )
            if out.ok:
                self._say("info", f"{role}: {key.alias} ok in {latency:.0f} ms (attempt {attempt}, {pt}+{ct} tokens, "
                                  f"request {out.request_id or '-'})")
                return ChatResult(
                    text=out.text, role=role, model=self.model, key_alias=key.alias, request_id=out.request_id, prompt_tokens=int(pt),
                    completion_tokens=int(ct), total_tokens=int(pt) + int(ct), finish_reason=out.finish_reason, attempts=attempt,
                    estimated_prompt_tokens=est, max_tokens=int(body["max_tokens"]), latency_ms=latency, truncated=out.truncated,
                    usage_estimated=usage_estimated,
                )
            if isinstance(out.error, CredentialsError):
                left = self.keys.reject(key, out.error)
                self._cool(key, s.credential_cooldown_s, CREDENTIALS)
                if not left:
                    raise self.keys.all_rejected(role)  # the caller prints it once; logging it here would repeat it
                self._say("warning", f"{role}: {key.alias} rejected (HTTP {out.status}); failing over to {left[0].alias}")
                continue
            if out.error is not None:
                raise out.error
            what = out.kind + (f" (HTTP {out.status})" if out.status else "") + (f": {out.body_text}" if out.body_text else "")
            last = (what, key.alias, out.status, out.kind)
            if s.max_attempts and attempt >= s.max_attempts:
                raise self._give_up(role, attempt, waited, what, key.alias, out.status, out.kind, f"max_attempts {s.max_attempts} reached")
            delay = max(MIN_DELAY_S, out.retry_after if out.retry_after is not None else self.backoff(failures))
            failures += 1
            self._cool(key, delay, out.kind)
            others = [k.alias for k in self.keys.keys(role) if k.alias != key.alias and self.keys.cooldown_remaining(k.alias, self.clock()) <= 0
                      and k.alias not in self.keys.rejected(role)]
            nxt = f"failing over to {others[0]}" if others else "retrying"
            self._say("warning", f"{role}: {key.alias} {out.kind}{f' (HTTP {out.status})' if out.status else ''} on attempt {attempt}; "
                                 f"cooling it down {delay:.2f}s{' (Retry-After)' if out.retry_after is not None else ''}, {nxt}")
