"""Bind a spec once: the spec, its family, the kernel hash and the budget scope, as one value.

Loading a spec (``kregress.core.spec.load_spec``) checks its schema only and imports no family, no
torch and no Triton. ``bind(spec)`` is where the spec meets its family: the family is looked up
(built-in, plugin or import path), the spec's params are resolved against the spec's folder, the
family's own checks run (dtype, params, shapes, baseline inside the space, shape bounds), and the
kernel hash is read from disk once. The resulting ``BoundSpec`` is made once per run, carried
through the asset graph (pickled by the IO manager as a reference, never re-validated), and rebuilt
the same way in worker processes (``family_for``).

``load_bound(path)`` does both in one pass for commands that report every problem of a file at once
(``kregress specs validate``, the spec store): schema errors and the family's problems together.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kregress.core.budget import BudgetScope, budget_scope
from kregress.core.family import Family, RecordedFamily, UnknownFamily, family_names, get_family
from kregress.core.spec import (
    HardwareLimits,
    SpecError,
    TaskSpec,
    did_you_mean,
    parse_spec_data,
    read_spec_file,
    shape_bound_problems,
)

Problem = tuple[str, Any, str]  # (field, value, message)


def family_for(name: str, params: dict[str, Any]) -> Family:
    """The family a spec names, configured by its params: the one lookup, shared by ``bind`` and by
    every worker process that rebuilds a bound spec from its reference."""
    return get_family(name).for_params(params)


@dataclass(frozen=True, eq=False)
class BoundSpec:
    """A validated spec bound to its family. ``spec.params`` are resolved (paths made absolute)."""

    spec: TaskSpec
    family: Family
    kernel_hash: str  # the family's source hash when the spec was bound: what the caches are keyed by
    source: Path | None = None  # the spec file, when it came from one
    # The token-budget scope of the run that bound it (``budget_scope(root run id, task_id)``): every model
    # call of the sweep reserves against it; the CLI's exit code and the token_budget check judge it.
    budget_scope: BudgetScope | None = None
    spec_hash: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if not self.spec_hash:
            object.__setattr__(self, "spec_hash", self.spec.content_hash())

    @property
    def task_id(self) -> str:
        return self.spec.task_id

    def for_run(self, root_run_id: str) -> "BoundSpec":
        """The same binding under the budget scope of the run whose root is ``root_run_id`` (no lookup, no
        validation)."""
        return self.with_scope(budget_scope(root_run_id, self.task_id))

    def with_scope(self, scope: BudgetScope) -> "BoundSpec":
        """The same binding under ``scope`` (the run context's, made once per run)."""
        return self if scope == self.budget_scope else replace(self, budget_scope=scope)

    def ref(self) -> dict[str, Any]:
        """What a child process needs to rebuild the family: ``family_for(ref["family"], ref["params"])``."""
        return {"family": self.family.lookup or self.family.name, "params": self.spec.params}

    def __reduce__(self):
        # Pickled (Dagster's IO manager, a worker) as data plus the family's lookup name: unpickling
        # looks the family up again (the same way a worker does) and validates nothing.
        return (_rebuild, (self.spec, self.family.lookup or self.family.name, self.kernel_hash,
                           str(self.source) if self.source else None, self.budget_scope, self.spec_hash))


def _rebuild(spec: TaskSpec, lookup: str, kernel_hash: str, source: str | None, scope: BudgetScope | None,
             spec_hash: str) -> BoundSpec:
    return BoundSpec(spec=spec, family=family_for(lookup, spec.params), kernel_hash=kernel_hash,
                     source=Path(source) if source else None, budget_scope=scope, spec_hash=spec_hash)


# --- the family's checks -------------------------------------------------------------------------


def _limits(raw: dict) -> HardwareLimits:
    from pydantic import ValidationError

    hw = raw.get("hardware")
    lim = hw.get("limits") if isinstance(hw, dict) else None
    if isinstance(lim, HardwareLimits):
        return lim
    try:
        return HardwareLimits.model_validate(lim or {})
    except ValidationError:
        return HardwareLimits()


def _baseline_hint(fam: Family, baseline: dict) -> str:
    import difflib

    tunables = list(fam.space.params)
    hints = [f"{k!r} -> did you mean {m[0]!r}?" for k in baseline if k not in tunables
             for m in [difflib.get_close_matches(k, tunables, n=1, cutoff=0.6)] if m]
    return f" ({'; '.join(hints)})" if hints else ""


def _short(exc: BaseException) -> str:
    return f"could not be checked: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}"


def family_problems(raw: dict, skip: frozenset[str] = frozenset(),
                    spec_dir: Path | None = None) -> tuple[Family | None, dict, list[Problem]]:
    """(family bound to the params, resolved params, problems) for a spec given as a mapping.

    ``raw`` is the spec as data (a ``TaskSpec.model_dump()`` or the file's mapping when the schema
    failed); fields in ``skip`` already failed the schema and are not checked again. A family check
    that raises (a recorded data folder that is missing, say) is reported as a problem of that field,
    never a traceback. The family is None when it cannot be found or its params are wrong."""
    out: list[Problem] = []
    name = raw.get("kernel_family")
    params = raw.get("params", {})
    params = params if isinstance(params, dict) else {}
    if "kernel_family" in skip or not isinstance(name, str):
        return None, params, out
    try:
        fam = get_family(name)
    except UnknownFamily as exc:
        out.append(("kernel_family", name, str(exc) + did_you_mean(name, family_names())))
        return None, params, out

    def guarded(field_: str, value: Any, check) -> None:
        try:
            problem = check()
        except Exception as exc:  # noqa: BLE001 - a family check must never end in a traceback
            problem = _short(exc)
        if problem:
            out.append((field_, value, problem))

    if spec_dir is not None and "params" not in skip:
        try:  # paths in params are relative to the spec's folder (a recorded file: cache_file)
            params = fam.resolve_params(params, spec_dir)
        except Exception as exc:  # noqa: BLE001 - never a traceback
            out.append(("params", params, _short(exc)))
            return None, params, out
    recorded = isinstance(fam, RecordedFamily)  # allocates nothing: its one shape is the recording's
    for field_ in ("shape_matrix", "correctness_shapes"):  # family-independent bounds
        shapes = raw.get(field_)
        if field_ not in skip and isinstance(shapes, list) and not recorded:
            for i, shape in enumerate(shapes):
                for dim, value, problem in shape_bound_problems(shape):
                    out.append((f"{field_}.{i}" + (f".{dim}" if dim else ""), value, problem))
    toolchain = fam.toolchain_problem()  # a CUDA family on a host with no nvcc: the one line saying how to get it
    if toolchain:
        out.append(("kernel_family", name, toolchain))
        return None, params, out
    dtype = raw.get("dtype", "bf16")
    if "dtype" not in skip and isinstance(dtype, str) and dtype not in fam.dtypes:
        out.append(("dtype", dtype, f"family {fam.name} takes {', '.join(fam.dtypes)}"))
    bound: Family | None = fam
    if "params" not in skip:
        n = len(out)
        guarded("params", params, lambda: fam.check_params(params))
        if len(out) > n:  # space and shapes may follow the params (a recorded file): said once
            return None, params, out
        try:
            bound = fam.for_params(params)
        except Exception as exc:  # noqa: BLE001 - never a traceback
            out.append(("params", params, _short(exc)))
            return None, params, out
    bad_shape_fields = {".".join(f.split(".")[:2]) for f, _, _ in out}
    for field_ in ("shape_matrix", "correctness_shapes"):
        shapes = raw.get(field_)
        if field_ in skip or not isinstance(shapes, list):
            continue
        for i, shape in enumerate(shapes):
            if f"{field_}.{i}" not in bad_shape_fields:
                guarded(f"{field_}.{i}", shape, lambda s=shape: bound.check_shape(s))
    baseline = raw.get("baseline")
    if "baseline" not in skip and isinstance(baseline, dict):
        limits = _limits(raw)
        guarded("baseline", baseline,
                lambda: (lambda p: p and p + _baseline_hint(bound, baseline))(bound.space.check(baseline, params, limits)))
    return bound, params, out


def _problem_lines(path: str | Path, problems: list[Problem]) -> list[str]:
    return [f"{path}: field '{f}': value {json.dumps(v, default=str)[:160]}: {msg}" for f, v, msg in problems]


def bind(spec: TaskSpec, *, budget_scope: BudgetScope | None = None) -> BoundSpec:
    """The spec bound to its family, after the family's checks; raises ``SpecError`` (one line per
    problem, naming the file and field) when the family refuses the spec."""
    source = spec.source
    where = str(source) if source else "<spec>"
    fam, params, problems = family_problems(spec.model_dump(), spec_dir=source.parent if source else None)
    if problems or fam is None:
        raise SpecError("\n".join(_problem_lines(where, problems)) or f"{where}: the family could not be bound")
    if params != spec.params:
        spec = spec.with_params(params)
    return BoundSpec(spec=spec, family=fam, kernel_hash=fam.source_hash(), source=source, budget_scope=budget_scope)


def load_bound(path: str | Path, *, budget_scope: BudgetScope | None = None) -> BoundSpec:
    """Read, schema-check and bind a spec file in one pass: a bad file raises ``SpecError`` listing
    every problem (duplicated keys, schema errors and the family's own) at once."""
    path = Path(path)
    data, lines = read_spec_file(path)
    spec, schema_lines, skip = parse_spec_data(data, path)
    lines = lines + schema_lines
    if spec is not None and not lines:
        spec._source = path.resolve()
        return bind(spec, budget_scope=budget_scope)
    if isinstance(data, dict):  # the family's checks beside the schema errors, on the fields that passed
        _, _, problems = family_problems(data, frozenset(skip), spec_dir=path.parent)
        lines += _problem_lines(path, problems)
    raise SpecError("\n".join(lines) or f"{path}: the spec could not be checked")
