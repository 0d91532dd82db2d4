"""The one token-budget rule: a sweep's spend in, typed breaches out (no Dagster, no database).

Every question about a budget goes through these functions and reads their records, never a message:

- ``admit(budget, spend, request)``: may this call be sent? The ``max_tokens`` it is granted (lowered to what
  the round and the sweep have left), or the breaches it would cause. The ledger's reservation calls it
  inside its transaction.
- ``breaches(budget, spend)``: what is over budget in a sweep's spend: a round's input or output, the sweep
  total, an overshoot (the server billed more than was reserved), or a budget that refused every suggest
  prompt so that no round's call was ever sent. The CLI's exit code, the ``token_budget`` asset check and ``kregress usage``
  all read it.

Spend counts settled usage at what the server reported and in-flight reservations at their estimate. The
per-round limits apply to rounds >= 1 (the suggest calls); the sweep total to every call of the sweep
(report and review included). ``BudgetScope`` names the sweep a call counts against: one per run, made
where the run starts and carried with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Mapping

from kregress.core.spec import Budget

BreachKind = Literal["round", "sweep", "overshoot", "refused"]
# the spec fields a breach can name (budget.<limit>); an overshoot is measured against the reservation
LIMIT_FIELDS = ("max_input_tokens_per_round", "max_output_tokens_per_round", "max_total_tokens")
RESERVATION = "reservation"


@dataclass(frozen=True)
class BudgetScope:
    """The budget a sweep's model calls count against: one per run, made once where the run starts.

    ``sweep`` is the key the ledger groups reservations by (the run id: a resumed sweep is a new run and a
    new scope), ``partition`` the spec's task_id. A bound spec carries it; every call of the run, the
    budget check and the CLI's exit code use this one value.
    """

    sweep: str
    partition: str = ""
    run_id: str = ""


def budget_scope(root_run_id: str, task: str = "") -> BudgetScope:
    """THE budget scope of a run: the one place a run's scope is made (grep finds no other).

    ``root_run_id`` is the id of the run's root: a run re-executed from failure (Dagster's retry) has its
    own run id but the root's, so the retry's calls count against the sweep they continue. ``task`` is the
    spec's task_id (the partition). Each call's round and role travel beside the scope in the gateway's
    ``CallContext`` and land in the ledger row; the scope says which sweep's budget they count against.
    """
    return BudgetScope(sweep=root_run_id or task or "default", partition=task, run_id=root_run_id)


@dataclass(frozen=True)
class Overshoot:
    """Usage the server reported beyond what was reserved, over one sweep."""

    calls: int = 0
    input: int = 0
    output: int = 0
    first_round: int | None = None

    @property
    def tokens(self) -> int:
        return self.input + self.output

    def __bool__(self) -> bool:
        return self.calls > 0


@dataclass(frozen=True)
class Breach:
    """One budget limit that is (or a request would be) exceeded: which, where and by how much.

    ``used`` is what was already charged against the limit, ``requested`` what a call would add (0 for a
    standing breach), ``allowed`` the limit's value; ``by`` = used + requested - allowed. An overshoot is
    measured against what its calls reserved (``by`` is the tokens billed beyond it). ``refused``: no call of
    the search rounds was ever sent because the budget refused every suggest prompt (the first breach that
    refused one is ``refusal``).
    """

    kind: BreachKind
    limit: str  # which limit: the spec's budget.<limit>, or "reservation" for an overshoot
    used: int
    allowed: int  # the limit's value
    requested: int = 0
    round: int | None = None
    calls: int = 0  # overshoot: calls billed beyond their reservation; refused: prompts refused
    overshoot: Overshoot | None = None
    refusal: Breach | None = None

    @property
    def by(self) -> int:
        return self.used + self.requested - self.allowed

    @property
    def text(self) -> str:
        """One line, e.g. ``round 2 input 4,310 > max_input_tokens_per_round 4,000 (by 310)``."""
        if self.kind == "overshoot" and self.overshoot is not None:
            o = self.overshoot
            return (f"overshoot: {o.calls} call(s) from round {o.first_round} on were billed {o.tokens} tokens beyond their "
                    f"reservation (input +{o.input}, output +{o.output})")
        if self.kind == "refused" and self.refusal is not None:
            return (f"the budget refused every suggest prompt ({self.calls} refused, none sent): {self.refusal.text}; raise the "
                    f"spec's budget.{self.refusal.limit} or show fewer history rows (search.top_k)")
        where = f"round {self.round} {'input' if 'input' in self.limit else 'output'}" if self.kind == "round" else "sweep total"
        if self.requested:
            return f"{where}: {self.used} used + {self.requested} requested > {self.limit} {self.allowed} (by {self.by})"
        return f"{where} {self.used} > {self.limit} {self.allowed} (by {self.by})"

    def to_json(self) -> dict[str, Any]:
        """The record as stored with a refused reservation (the ledger keeps the breach, not its text)."""
        out: dict[str, Any] = {"kind": self.kind, "limit": self.limit, "used": self.used, "allowed": self.allowed,
                               "requested": self.requested, "round": self.round, "calls": self.calls}
        if self.overshoot is not None:
            o = self.overshoot
            out["overshoot"] = {"calls": o.calls, "input": o.input, "output": o.output, "first_round": o.first_round}
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Breach:
        o = d.get("overshoot")
        return cls(kind=d["kind"], limit=d["limit"], used=int(d["used"]), allowed=int(d["allowed"]),
                   requested=int(d.get("requested") or 0), round=d.get("round"), calls=int(d.get("calls") or 0),
                   overshoot=Overshoot(**o) if o else None)


@dataclass(frozen=True)
class Spend:
    """A sweep's spend: per round (input, output) charged, the overshoot, how many calls went out and the
    breaches that refused calls (each with its round)."""

    rounds: Mapping[int, tuple[int, int]] = field(default_factory=dict)
    overshoot: Overshoot = field(default_factory=Overshoot)
    calls: int = 0  # reservations that went out (reserved, settled or released)
    refusals: tuple[Breach, ...] = ()
    round_calls: int = 0  # of the calls, those of the search rounds (round >= 1: the suggest calls)

    @property
    def total(self) -> int:
        return sum(i + o for i, o in self.rounds.values())

    def round_use(self, rnd: int) -> tuple[int, int]:
        return self.rounds.get(rnd, (0, 0))


@dataclass(frozen=True)
class Request:
    """A call about to be reserved: its round, the prompt estimate, the max_tokens wanted and the least worth sending."""

    round: int
    input: int
    output: int
    min_output: int | None = None

    @property
    def floor(self) -> int:
        return self.output if self.min_output is None else min(max(1, int(self.min_output)), self.output)


@dataclass(frozen=True)
class Admission:
    """``admit``'s answer: the granted max_tokens when ``ok``, else the breaches the call would cause."""

    output: int
    refused: tuple[Breach, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.refused


def overshoot_breach(o: Overshoot) -> Breach:
    return Breach(kind="overshoot", limit=RESERVATION, used=o.tokens, allowed=0, round=o.first_round, calls=o.calls, overshoot=o)


def admit(budget: Budget | None, spend: Spend, req: Request) -> Admission:
    """Whether a call fits: the max_tokens granted (lowered to what the round and the sweep have left, down to
    ``req.floor``) or why not. After an overshoot nothing more is admitted for the sweep."""
    out = req.output
    if budget is None:
        return Admission(out)
    if spend.overshoot:
        return Admission(0, (overshoot_breach(spend.overshoot),))
    floor = req.floor
    if req.round >= 1:
        used_in, used_out = spend.round_use(req.round)
        if used_in + req.input > budget.max_input_tokens_per_round:
            return Admission(0, (Breach("round", "max_input_tokens_per_round", used_in, budget.max_input_tokens_per_round,
                                        requested=req.input, round=req.round),))
        left_out = budget.max_output_tokens_per_round - used_out
        if left_out < floor:
            return Admission(0, (Breach("round", "max_output_tokens_per_round", used_out, budget.max_output_tokens_per_round,
                                        requested=floor, round=req.round),))
        out = min(out, left_out)
    left = budget.max_total_tokens - spend.total - req.input
    if left < floor:
        return Admission(0, (Breach("sweep", "max_total_tokens", spend.total, budget.max_total_tokens,
                                    requested=req.input + floor, round=req.round),))
    return Admission(min(out, left))


def breaches(budget: Budget, spend: Spend) -> list[Breach]:
    """Everything over budget in a sweep: each round's input and output (rounds >= 1), the sweep total, an
    overshoot, and a budget that refused every suggest prompt (no round's call was sent). [] when within budget."""
    out: list[Breach] = []
    for rnd, (used_in, used_out) in sorted(spend.rounds.items()):
        if rnd < 1:
            continue
        if used_in > budget.max_input_tokens_per_round:
            out.append(Breach("round", "max_input_tokens_per_round", used_in, budget.max_input_tokens_per_round, round=rnd))
        if used_out > budget.max_output_tokens_per_round:
            out.append(Breach("round", "max_output_tokens_per_round", used_out, budget.max_output_tokens_per_round, round=rnd))
    if spend.total > budget.max_total_tokens:
        out.append(Breach("sweep", "max_total_tokens", spend.total, budget.max_total_tokens))
    if spend.overshoot:
        out.append(overshoot_breach(spend.overshoot))
    refused = [b for b in spend.refusals if (b.round or 0) >= 1]
    if refused and not spend.round_calls:
        first = refused[0]
        out.append(Breach("refused", first.limit, 0, 0, round=first.round, calls=len(refused), refusal=first))
    return out


def round_breaches(found: list[Breach], rnd: int) -> list[Breach]:
    """The standing breaches of one round (for a per-round table)."""
    return [b for b in found if b.kind == "round" and b.round == rnd]
