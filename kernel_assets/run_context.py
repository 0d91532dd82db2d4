"""The run's context, made once per run: its bound spec, its budget scope and its evidence backend.

A sweep's steps need three things that belong to the run, not to a step: the spec bound to its family
(``BoundSpec``), the token-budget scope every model call counts against
(``kregress.core.budget.budget_scope(root run id, task_id)``) and the benchmark backend whose evidence its
latencies carry (cuda / interpreter / replay). They are made once, by the ``run_context`` resource, when the
run's first step opens it, and the first step hands the binding (which carries the scope) on with its output,
so that no later step reads or validates the spec file again and an edit to it mid-run never changes the run.

Two implementations of one interface (``open(context, specs, bench, replay) -> RunContext``):

- ``RunContextResource`` (the Definitions' default, e.g. ``dagster dev``): binds the partition's spec through
  the ``specs`` resource;
- ``HandedRunContext`` (``kregress sweep``): the CLI has already bound the spec it was given before the run
  started; it passes that binding in as the run's resource (no process-global handover), and the first step
  takes it as long as the file is unchanged.

The scope is made from the run's ROOT run id: a run re-executed from failure keeps the scope of the run it
continues (``tests/test_run_context.py`` retries a run and reads the ledger).
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import PrivateAttr

from kregress.core.bind import BoundSpec
from kregress.core.budget import BudgetScope, budget_scope


@dataclass(frozen=True)
class RunContext:
    """What a sweep's steps share: made once per run (``open``)."""

    bound: BoundSpec  # carries ``scope`` as its ``budget_scope``
    scope: BudgetScope
    backend: str  # the kind of the backend that times this run's variants: cuda, interpreter or replay


def root_run_id(run: Any) -> str:
    """The id of a Dagster run's root (its own id for a run that is not a re-execution)."""
    return getattr(run, "root_run_id", None) or run.run_id


def _file_sha(path: Path | None) -> str:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest() if path else ""
    except OSError:
        return ""


def _make(context: dg.AssetExecutionContext, bound: BoundSpec, bench: Any, replay: Any) -> RunContext:
    from resources.gpu import backend_for

    scope = budget_scope(root_run_id(context.run), context.partition_key)
    return RunContext(bound=bound.with_scope(scope), scope=scope,
                      backend=backend_for(bound.family, bench, replay).kind)


class RunContextResource(dg.ConfigurableResource):
    """The run's bound spec, budget scope and evidence backend, made once per run (binds through ``specs``)."""

    _made: dict = PrivateAttr(default_factory=dict)  # run id -> RunContext (once per run in this process)
    _lock: Any = PrivateAttr(default_factory=threading.Lock)

    def open(self, context: dg.AssetExecutionContext, specs: Any, bench: Any, replay: Any) -> RunContext:
        with self._lock:
            made = self._made.get(context.run_id)
            if made is None:
                made = self._made[context.run_id] = _make(context, specs.bind(context.partition_key), bench, replay)
        return made


class HandedRunContext:
    """``kregress sweep``'s run context: the binding the CLI made before the run (a plain resource value)."""

    def __init__(self, bound: BoundSpec):
        self.bound = bound
        self.sha = _file_sha(bound.source)
        self._fallback = RunContextResource()

    def open(self, context: dg.AssetExecutionContext, specs: Any, bench: Any, replay: Any) -> RunContext:
        path = specs.path_for(context.partition_key)
        if (context.partition_key == self.bound.task_id and self.bound.source is not None
                and Path(self.bound.source) == path.resolve() and self.sha == _file_sha(path)):
            return _make(context, self.bound, bench, replay)
        return self._fallback.open(context, specs, bench, replay)  # another spec, or the file changed since
