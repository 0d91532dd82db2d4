"""Usage and budgets: one row per model-call attempt, and the reservation each call made against its sweep's budget.

Tables (``engine.METADATA``):

- ``usage``: one row per attempt, the fields of ``kregress.core.records.UsageRecord`` plus the sweep and the
  reservation it belonged to. An attempt is written *before* it is sent (status ``sent``) and completed when
  the answer comes (``ok`` / ``error`` with the usage the server reported), so a process killed mid-call still
  leaves its row. Cache hits are rows with ``cache_hit`` set and no tokens.
- ``reservations``: one row per logical call. ``reserved`` rows count their estimate (prompt estimate +
  max_tokens); ``settled`` rows count the usage the server reported; ``released`` rows count nothing;
  ``refused`` rows are calls that were never sent, with the typed breach that refused them. Each in-flight
  reservation names the process that made it (``owner``), so ``recover`` can settle what a killed process left.

The budget rule itself is ``kregress.core.budget`` (``admit`` for a reservation, ``breaches`` for a sweep);
this store only sums what it needs, inside the same transaction as the reservation it guards.
"""

from __future__ import annotations

import csv
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import sqlalchemy as sa

from kregress.core.budget import Admission, Breach, BudgetScope, Overshoot, Request, Spend, admit
from kregress.core.process import owner_gone, owner_tag
from kregress.core.records import USAGE_GROUPABLE, UsageRecord
from kregress.core.spec import Budget
from resources.ledger.engine import Engine, reservations_t, usage_t

USAGE_FIELDS = tuple(UsageRecord.model_fields)
GROUPABLE = USAGE_GROUPABLE
# The reconciliation table's numeric columns, in order: every table of usage (CLI, assets, reports) uses these.
RECONCILE_COLUMNS = ("calls", "ok", "errors", "cache_hits", "input", "output", "total")
SENT = "sent"  # an attempt on its way: written before the request, completed when the answer comes
INTERRUPTED = "interrupted"  # the error class of an attempt whose process died before the answer came

_r = reservations_t.c
_u = usage_t.c
# Tokens a reservation counts, by state: the estimate while in flight, the reported usage once settled.
_CHARGED_IN = sa.case((_r.state == "reserved", _r.est_input), (_r.state == "settled", _r.input_tokens), else_=0)
_CHARGED_OUT = sa.case((_r.state == "reserved", _r.est_output), (_r.state == "settled", _r.output_tokens), else_=0)
_OVER_IN = sa.case((sa.and_(_r.state == "settled", _r.input_tokens > _r.est_input), _r.input_tokens - _r.est_input), else_=0)
_OVER_OUT = sa.case((sa.and_(_r.state == "settled", _r.output_tokens > _r.est_output), _r.output_tokens - _r.est_output), else_=0)
_OVERSHOT = sa.and_(_r.state == "settled", sa.or_(_r.input_tokens > _r.est_input, _r.output_tokens > _r.est_output))
_SENT_STATES = ("settled", "released", "reserved")
_BY_ROUND = sa.select(
    _r.round,
    sa.func.coalesce(sa.func.sum(_CHARGED_IN), 0).label("input"),
    sa.func.coalesce(sa.func.sum(_CHARGED_OUT), 0).label("output"),
    sa.func.sum(sa.case((_r.state == "reserved", 1), else_=0)).label("in_flight"),
    sa.func.sum(sa.case((_r.state == "refused", 1), else_=0)).label("refused"),
    sa.func.sum(sa.case((_r.state.in_(_SENT_STATES), 1), else_=0)).label("calls"),
    sa.func.count(sa.case((_OVERSHOT, 1))).label("over_calls"),
    sa.func.coalesce(sa.func.sum(_OVER_IN), 0).label("over_in"),
    sa.func.coalesce(sa.func.sum(_OVER_OUT), 0).label("over_out"),
).where(_r.sweep == sa.bindparam("sweep")).group_by(_r.round).order_by(_r.round)
_REFUSALS = sa.select(_r.round, _r.role, _r.task, _r.est_input, _r.est_output, _r.reason, _r.breach).where(
    _r.sweep == sa.bindparam("sweep"), _r.state == "refused").order_by(_r.id)
_INSERT_RESERVATION = sa.insert(reservations_t).returning(_r.id)
_INSERT_USAGE = sa.insert(usage_t).returning(_u.id)
_SETTLE = sa.update(reservations_t).where(_r.id == sa.bindparam("b_id"), _r.state == "reserved").values(
    state=sa.bindparam("b_state"), input_tokens=sa.bindparam("b_in"), output_tokens=sa.bindparam("b_out"),
    settled_ts=sa.bindparam("b_ts"), reason=sa.bindparam("b_reason"))


def refusal_text(breaches: Sequence[Breach]) -> str:
    """Why a call was refused, one line (what the reservation row, the exception and the notes say)."""
    return "; ".join(f"sweep blocked: {b.text}; no further calls in this sweep" if b.kind == "overshoot" else b.text
                     for b in breaches)


class BudgetExceeded(RuntimeError):
    """A call was not sent because its reservation would exceed a budget: ``breaches`` says which limit and by how much."""

    def __init__(self, breaches: Sequence[Breach], *, scope: str = "", round: int = 0, note: str = "") -> None:
        self.breaches = tuple(breaches)
        self.reason = refusal_text(self.breaches) + note
        super().__init__(f"BudgetExceeded: {self.reason}")
        self.scope = scope
        self.round = round

    @property
    def blocked(self) -> bool:
        """The sweep overshot earlier: no call of it will be admitted again."""
        return any(b.kind == "overshoot" for b in self.breaches)


@dataclass(frozen=True)
class Reservation:
    id: int
    sweep: str
    round: int
    est_input: int
    est_output: int  # the max_tokens the call may use (possibly lowered to what the budget has left)


@dataclass(frozen=True)
class RoundRow:
    """One round of a sweep's spend, for tables: charged input/output, calls in flight, refused, sent."""

    round: int
    input: int
    output: int
    in_flight: int
    refused: int
    calls: int


@dataclass(frozen=True)
class Recovered:
    """What ``recover`` did to one reservation a dead process left in flight."""

    reservation_id: int
    sweep: str
    state: str  # settled (an attempt may have been billed: charged) or released (nothing was sent)
    input: int
    output: int
    interrupted_attempts: int


def _spend_from(rows: Sequence[Any], refusals: Sequence[Any] = ()) -> Spend:
    over_calls = sum(int(r.over_calls) for r in rows)
    over_first = min((int(r.round) for r in rows if int(r.over_calls)), default=None)
    over = Overshoot(over_calls, sum(int(r.over_in) for r in rows), sum(int(r.over_out) for r in rows), over_first)
    typed = tuple(
        Breach.from_json(json.loads(r.breach)) for r in refusals if r.breach
    )
    return Spend(rounds={int(r.round): (int(r.input), int(r.output)) for r in rows}, overshoot=over,
                 calls=sum(int(r.calls or 0) for r in rows), refusals=typed,
                 round_calls=sum(int(r.calls or 0) for r in rows if int(r.round) >= 1))


class UsageStore:
    """Attempts, reservations and what a sweep has spent (see the module docstring)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    # -- attempts ----------------------------------------------------------------------------
    def record(self, rec: UsageRecord, *, sweep: str = "", reservation_id: int | None = None) -> int:
        """Append one finished attempt (or a cache hit); returns its row id."""
        data = rec.model_dump()
        data["cache_hit"] = int(bool(data["cache_hit"]))
        with self.engine.write() as con:
            return int(con.execute(_INSERT_USAGE, {**data, "sweep": sweep, "reservation_id": reservation_id}).scalar_one())

    def begin_attempt(self, rec: UsageRecord, *, sweep: str, reservation_id: int | None) -> int:
        """Write an attempt before its request goes out (status ``sent``, no tokens); returns its row id."""
        return self.record(rec.model_copy(update={"status": SENT, "prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}),
                           sweep=sweep, reservation_id=reservation_id)

    def finish_attempt(self, attempt_id: int, *, status: str, prompt_tokens: int = 0, completion_tokens: int = 0,
                       latency_ms: float = 0.0, request_id: str = "", error_class: str = "") -> None:
        """Complete an attempt written by ``begin_attempt`` with what the server answered."""
        with self.engine.write() as con:
            con.execute(sa.update(usage_t).where(_u.id == attempt_id).values(
                status=status, prompt_tokens=int(prompt_tokens), completion_tokens=int(completion_tokens),
                total_tokens=int(prompt_tokens) + int(completion_tokens), latency_ms=float(latency_ms), request_id=request_id,
                error_class=error_class))

    @staticmethod
    def _where(table: sa.Table, filters: dict[str, Any], allowed: Sequence[str]) -> list[Any]:
        out = []
        for k, v in filters.items():
            if v is None:
                continue
            if k not in allowed:
                raise ValueError(f"cannot filter on {k!r}; allowed: {', '.join(sorted(allowed))}")
            out.append(table.c[k] == (int(v) if isinstance(v, bool) else v))
        return out

    def rows(self, **filters: Any) -> list[UsageRecord]:
        """Usage rows in insertion order, filtered by equality on run_id, partition, round, role, task, sweep, ..."""
        cond = self._where(usage_t, filters, [*USAGE_FIELDS, "sweep", "reservation_id"])
        q = sa.select(*(usage_t.c[f] for f in USAGE_FIELDS)).where(*cond).order_by(_u.id)
        with self.engine.read() as con:
            return [UsageRecord(**{**r._asdict(), "cache_hit": bool(r.cache_hit)}) for r in con.execute(q)]

    def reconcile(self, group_by: Sequence[str] = ("role", "key_alias"), **filters: Any) -> list[dict[str, Any]]:
        """The reconciliation table: calls (attempts), ok, errors, cache hits, input, output, total per group."""
        group_by = list(group_by)
        bad = [g for g in group_by if g not in GROUPABLE]
        if bad or not group_by:
            raise ValueError(f"cannot group by {', '.join(bad) or '(nothing)'}; allowed: {', '.join(GROUPABLE)}")
        c = usage_t.c
        cond = self._where(usage_t, filters, [*USAGE_FIELDS, "sweep"])
        sums = dict(zip(RECONCILE_COLUMNS, (
            sa.func.count(), sa.func.sum(sa.case((c.status == "ok", 1), else_=0)), sa.func.sum(sa.case((c.status != "ok", 1), else_=0)),
            sa.func.sum(c.cache_hit), sa.func.sum(c.prompt_tokens), sa.func.sum(c.completion_tokens), sa.func.sum(c.total_tokens),
        )))
        keys = [c[g] for g in group_by]
        q = sa.select(*keys, *(v.label(k) for k, v in sums.items())).where(*cond).group_by(*keys).order_by(*keys)
        with self.engine.read() as con:
            return [{**{g: r._mapping[g] for g in group_by}, **{k: int(r._mapping[k] or 0) for k in RECONCILE_COLUMNS}} for r in con.execute(q)]

    def export_jsonl(self, path: str | os.PathLike, **filters: Any) -> int:
        """usage.jsonl: one UsageRecord per line. Returns the number of rows written."""
        rows = self.rows(**filters)
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        with p.open("w") as f:
            for r in rows:
                f.write(r.model_dump_json() + "\n")
        return len(rows)

    def export_usage_csv(self, path: str | os.PathLike, **filters: Any) -> int:
        """Every attempt as CSV (the same columns as usage.jsonl)."""
        rows = self.rows(**filters)
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        with p.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(USAGE_FIELDS))
            w.writeheader()
            w.writerows(r.model_dump() for r in rows)
        return len(rows)

    # -- budgets -----------------------------------------------------------------------------
    def reserve(
        self,
        scope: BudgetScope,
        *,
        round: int,
        est_input: int,
        est_output: int,
        budget: Budget | None,
        role: str = "",
        task: str = "",
        record_refusal: bool = True,
        min_output: int | None = None,
    ) -> Reservation:
        """Atomically check the budget (``kregress.core.budget.admit``) and reserve ``est_input + est_output``;
        raise BudgetExceeded (with the typed breaches) if it does not fit.

        ``min_output`` (<= est_output) lets the reservation lower ``est_output`` (the call's max_tokens) to what
        the round and the sweep have left, down to ``min_output``; the returned reservation says what was
        granted. After any call of the sweep was billed more than it reserved (an overshoot) nothing more is
        reserved for it. ``budget=None`` reserves without limits. A refusal is recorded with its breach unless
        ``record_refusal`` is False (a blocked sweep's refusal is always recorded).
        """
        req = Request(round=round, input=int(est_input), output=int(est_output), min_output=min_output)
        with self.engine.write(lock=scope.sweep) as con:  # every check below reads this sweep's reservations only
            decision = admit(budget, _spend_from(list(con.execute(_BY_ROUND, {"sweep": scope.sweep}))), req) \
                if budget is not None else Admission(req.output)
            blocked = any(b.kind == "overshoot" for b in decision.refused)
            rid = 0
            if decision.ok or record_refusal or blocked:
                rid = int(con.execute(_INSERT_RESERVATION, dict(
                    ts=time.time(), sweep=scope.sweep, run_id=scope.run_id, partition=scope.partition, round=round, role=role,
                    task=task, est_input=req.input, est_output=decision.output if decision.ok else req.output,
                    state="reserved" if decision.ok else "refused",
                    reason="" if decision.ok else refusal_text(decision.refused),
                    owner=owner_tag() if decision.ok else "",
                    breach="" if decision.ok else json.dumps(decision.refused[0].to_json()),
                )).scalar_one())
        if not decision.ok:
            raise BudgetExceeded(decision.refused, scope=scope.sweep, round=round)
        return Reservation(rid, scope.sweep, round, req.input, decision.output)

    def settle(self, reservation: Reservation | int, input_tokens: int, output_tokens: int) -> None:
        """Replace the estimate with the usage the server reported (zero for both releases it).

        Usage above the reservation is recorded as reported: that is what was billed, and it blocks the sweep.
        """
        rid = reservation.id if isinstance(reservation, Reservation) else int(reservation)
        state = "settled" if (input_tokens or output_tokens) else "released"
        with self.engine.write() as con:
            con.execute(_SETTLE, {"b_id": rid, "b_state": state, "b_in": int(input_tokens), "b_out": int(output_tokens),
                                  "b_ts": time.time(), "b_reason": ""})

    def recover(self, gone: Callable[[str], bool] = owner_gone) -> list[Recovered]:
        """Settle what processes that died mid-call left in flight, so no reservation stays ``reserved``.

        For each reservation still ``reserved`` whose owner ``gone(owner)`` says is dead: attempts still ``sent``
        become errors of class ``interrupted`` (nobody knows what the server billed for them); the reservation is
        settled at its estimate when such an attempt exists (it may have been billed), at what its finished
        attempts reported otherwise, and released when that is nothing. Live owners and other hosts' are untouched.
        """
        done: list[Recovered] = []
        with self.engine.read() as con:
            open_ = [(int(r.id), r.owner, r.sweep) for r in con.execute(
                sa.select(_r.id, _r.owner, _r.sweep).where(_r.state == "reserved", _r.owner != ""))]
        for rid, owner, sweep in open_:
            if not gone(owner):
                continue
            with self.engine.write(lock=sweep) as con:
                res = con.execute(sa.select(_r.est_input, _r.est_output, _r.state).where(_r.id == rid)).one()
                if res.state != "reserved":
                    continue  # another process recovered it first
                attempts = list(con.execute(sa.select(_u.id, _u.status, _u.prompt_tokens, _u.completion_tokens).where(
                    _u.reservation_id == rid)))
                pending = [a.id for a in attempts if a.status == SENT]
                used_in = sum(int(a.prompt_tokens) for a in attempts if a.status != SENT)
                used_out = sum(int(a.completion_tokens) for a in attempts if a.status != SENT)
                if pending:
                    con.execute(sa.update(usage_t).where(_u.id.in_(pending)).values(status="error", error_class=INTERRUPTED))
                    used_in, used_out = max(used_in, int(res.est_input)), max(used_out, int(res.est_output))
                    why = (f"the process ({owner}) died with {len(pending)} attempt(s) in flight: charged at its estimate, the "
                           "server may have billed them")
                else:
                    why = f"the process ({owner}) died before settling: charged what its attempts reported"
                state = "settled" if (used_in or used_out) else "released"
                con.execute(_SETTLE, {"b_id": rid, "b_state": state, "b_in": used_in, "b_out": used_out, "b_ts": time.time(),
                                      "b_reason": why})
                done.append(Recovered(rid, sweep, state, used_in, used_out, len(pending)))
        return done

    def spend(self, sweep: str) -> Spend:
        """A sweep's spend as the budget rule reads it (settled usage + in-flight estimates, overshoot, refusals)."""
        with self.engine.read() as con:
            return _spend_from(list(con.execute(_BY_ROUND, {"sweep": sweep})), list(con.execute(_REFUSALS, {"sweep": sweep})))

    def spend_by_round(self, sweep: str) -> list[RoundRow]:
        """One row per round of a sweep: charged input and output, calls in flight, refused and sent."""
        with self.engine.read() as con:
            return [RoundRow(int(r.round), int(r.input), int(r.output), int(r.in_flight or 0), int(r.refused or 0), int(r.calls or 0))
                    for r in con.execute(_BY_ROUND, {"sweep": sweep})]

    def overshoot(self, sweep: str) -> Overshoot:
        """How much the server billed beyond the reservations of ``sweep`` (falsy when it never did)."""
        return self.spend(sweep).overshoot

    def refusals(self, sweep: str) -> list[dict[str, Any]]:
        """The calls of a sweep that were refused before sending: round, role, task, estimates, reason and breach."""
        with self.engine.read() as con:
            rows = list(con.execute(_REFUSALS, {"sweep": sweep}))
        return [{**{k: v for k, v in r._mapping.items() if k != "breach"},
                 "breach": Breach.from_json(json.loads(r.breach)) if r.breach else None} for r in rows]

    def in_flight(self, sweep: str | None = None) -> list[dict[str, Any]]:
        """Reservations still ``reserved`` (a call on its way, or one a dead process left): id, sweep, round, role, owner."""
        q = sa.select(_r.id, _r.sweep, _r.round, _r.role, _r.task, _r.owner).where(_r.state == "reserved").order_by(_r.id)
        if sweep is not None:
            q = q.where(_r.sweep == sweep)
        with self.engine.read() as con:
            return [dict(r._mapping) for r in con.execute(q)]

    def latest_sweep(self, partition: str) -> str | None:
        """The sweep of the most recent call for a partition (a reservation or a cache hit): what a view of the
        partition shows when it is not itself part of a sweep's run."""
        calls = sa.union_all(
            sa.select(_r.sweep, _r.ts).where(_r.partition == partition),
            sa.select(_u.sweep, _u.ts).where(_u.partition == partition, _u.sweep != ""),
        ).subquery("calls")
        with self.engine.read() as con:
            r = con.execute(sa.select(calls.c.sweep).order_by(calls.c.ts.desc()).limit(1)).first()
            return r[0] if r else None

    def has_sweep(self, sweep: str) -> bool:
        """Whether any call (reservation or cache hit) was made in ``sweep``."""
        with self.engine.read() as con:
            return con.execute(sa.select(_r.id).where(_r.sweep == sweep).limit(1)).first() is not None or \
                con.execute(sa.select(_u.id).where(_u.sweep == sweep).limit(1)).first() is not None
