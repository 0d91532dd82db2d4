"""The gate's run-time checks as named units, and the error kinds a judged row can carry.

Pure decisions (no process, no torch): each check has a name, the stage it runs at, the error kind (and so
the verdict cause) it gives, and the families and backends it applies to. Checks whose inputs are plain
data (the aten ops a call ran, the threads it started) are decided here; checks that compare tensors are
implemented next to the comparison (``kernels/gate_compare.py``, ``@implements(name)``) and registered here
by name, so the registry is the one list a reviewer reads and the one place a new check is added (one entry
plus its function plus its test in tests/test_gate_checks.py).

Stages, in the gate's order: ``static`` (the AST policy, kregress/core/gate.py), ``load`` (the sandboxed
child imports the patched copy), ``run`` (what a call did besides its outputs), ``compare`` (its outputs
and buffers against the float64 reference and the baseline), ``measure`` (GPU timing and what follows).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Callable


class ErrorKind(str, Enum):
    """The ``error`` column of a row (``kregress.core.records.ERROR_CLASSES`` holds the same values)."""

    INVALID_CONFIG = "invalid_config"  # outside the space or fails a validity rule: never compiled
    COMPILE_FAILED = "compile_failed"  # Triton / ptxas rejected it (the detail carries the compiler's message)
    OUT_OF_RESOURCES = "out_of_resources"  # shared memory or registers beyond the hardware limit
    NUMERIC_MISMATCH = "numeric_mismatch"  # compared against the float64 reference and failed
    NAN_INF = "nan_inf"  # produced NaN or Inf where the reference has none
    RUNTIME_ERROR = "runtime_error"  # the harness could not run a job (not the candidate's own raise)
    TIMEOUT = "timeout"  # the child process ran past the per-variant limit and was killed
    CRASHED = "crashed"  # the child died, or the candidate's call raised where the baseline's did not
    PATCH_REJECTED = "patch_rejected"  # refused: outside the editable region, a banned construct, a sandbox refusal
    PATCH_FAILED = "patch_failed"  # does not apply to the kernel source it names


class ReviewCause(str, Enum):
    """The causes of a NEEDS_REVIEW the gate gives (``kregress.core.records.REVIEW_CAUSES`` holds these and the
    evidence rule's ``incomparable``)."""

    UNSETTLED = "unsettled"  # a difference from the baseline no settling check fitting this host settled
    PRECISION = "precision"  # error several times the baseline's own against the same reference
    IMPLAUSIBLE = "implausible"  # faster than the speed of light or the spec's factor over the baseline


class Stage(str, Enum):
    STATIC = "static"
    LOAD = "load"
    RUN = "run"
    COMPARE = "compare"
    MEASURE = "measure"


ALL = ("*",)
BACKENDS = ("interpreter", "cuda")


@dataclass(frozen=True)
class Check:
    name: str
    stage: Stage
    error: ErrorKind | ReviewCause  # an ErrorKind (REGRESS with its cause), or a ReviewCause (NEEDS_REVIEW)
    text: str  # what it refuses, in a sentence
    families: tuple[str, ...] = ALL
    backends: tuple[str, ...] = BACKENDS
    fn: Callable | None = field(default=None, compare=False)  # pure checks; None: implemented in kernels/gate_compare.py

    def applies(self, family: str, backend: str) -> bool:
        return ("*" in self.families or family in self.families) and backend in self.backends


CHECKS: dict[str, Check] = {}


def register(name: str, stage: Stage, error: ErrorKind | ReviewCause, text: str, families: tuple[str, ...] = ALL,
             backends: tuple[str, ...] = BACKENDS) -> Callable:
    """Register a check; as a decorator it also registers the pure function that decides it."""
    if name in CHECKS:
        raise ValueError(f"check {name!r} is registered twice")
    CHECKS[name] = Check(name, stage, error, text, families, backends)

    def deco(fn: Callable) -> Callable:
        CHECKS[name] = Check(name, stage, error, text, families, backends, fn)
        return fn

    return deco


def checks_for(stage: Stage, family: str, backend: str) -> list[Check]:
    return [c for c in CHECKS.values() if c.stage == stage and c.applies(family, backend)]


# --- run: what a call did besides its outputs (pure: sets and counts) ------------------------------------

# aten ops that allocate, view, copy or fill: a wrapper may add them without computing anything. Any
# other op the candidate runs that the baseline never ran means torch computed instead of the kernel.
# Not in it: reading a value into Python (_local_scalar_dense: float(t), int(t), bool(t), t.item()) and
# making a tensor from Python data (lift_fresh: torch.tensor, new_tensor), which host-side compute and
# value sniffing need and a launch wrapper does not (unless the baseline's own wrapper does them).
HARMLESS_OPS = frozenset({
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros", "zeros_like", "new_zeros",
    "zero_", "ones", "ones_like", "new_ones", "full", "full_like", "new_full", "fill_", "fill", "set_", "copy_",
    "_to_copy", "to", "clone", "contiguous", "view", "_unsafe_view", "reshape", "_reshape_alias", "as_strided",
    "as_strided_", "t", "transpose", "permute", "expand", "unsqueeze", "squeeze", "slice", "select", "narrow",
    "unbind", "split", "split_with_sizes", "chunk", "alias", "resize_",
    "cat", "stack", "constant_pad_nd", "arange", "view_as", "flatten", "unflatten",
    "is_same_size", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "record_stream",
})
HOST_DATA_OPS = frozenset({"_local_scalar_dense", "lift_fresh", "lift_fresh_copy", "detach", "item"})
# A call may run this many times the baseline's aten ops (plus a margin) before it counts as host-side work:
# a Python loop over elements (float(a[i, k]), c[i, j].fill_(...)) runs thousands where a wrapper runs a few.
OP_COUNT_FACTOR, OP_COUNT_MARGIN = 8, 64


@dataclass(frozen=True)
class RunSeen:
    """What the candidate's calls did and what the baseline's did, as the children recorded it."""

    ops: frozenset[str]
    op_count: int
    threads: int
    base_ops: frozenset[str]
    base_op_count: int
    base_threads: int


@register("threads", Stage.RUN, ErrorKind.PATCH_REJECTED, "starts Python threads where the baseline starts none")
def check_threads(seen: RunSeen) -> list[str]:
    if seen.threads and seen.base_threads == 0:
        return [f"the call started {seen.threads} Python thread(s); the baseline starts none"]
    return []


def _extra_ops(seen: RunSeen) -> list[str]:
    return sorted(set(seen.ops) - set(seen.base_ops) - HARMLESS_OPS)


@register("host_data_ops", Stage.RUN, ErrorKind.PATCH_REJECTED,
          "reads tensor values into Python or builds tensors from Python data where the baseline does not")
def check_host_data_ops(seen: RunSeen) -> list[str]:
    host = [op for op in _extra_ops(seen) if op in HOST_DATA_OPS]
    if not host:
        return []
    return [f"the call ran aten.{', aten.'.join(host)}, which the baseline never runs: it reads tensor values into "
            "Python (float(t), bool(t), .item()) or builds tensors from Python data (host-side compute or value sniffing)"]


@register("torch_compute_ops", Stage.RUN, ErrorKind.PATCH_REJECTED, "torch computes (aten ops the baseline never runs)")
def check_torch_compute_ops(seen: RunSeen) -> list[str]:
    extra = [op for op in _extra_ops(seen) if op not in HOST_DATA_OPS]
    if not extra:
        return []
    return [f"the call ran aten.{', aten.'.join(extra[:8])}, which the baseline never runs: torch computes instead of the kernel"]


@register("op_count", Stage.RUN, ErrorKind.PATCH_REJECTED, "many times the baseline's aten ops: host-side work per element")
def check_op_count(seen: RunSeen) -> list[str]:
    limit = OP_COUNT_FACTOR * seen.base_op_count + OP_COUNT_MARGIN
    if seen.op_count > limit:
        return [f"a call ran {seen.op_count} aten ops, the baseline's at most {seen.base_op_count} (limit {limit}): "
                "host-side work per element"]
    return []


# --- compare: implemented in kernels/gate_compare.py (tensors) ------------------------------------------

register("crashed", Stage.COMPARE, ErrorKind.CRASHED, "the call raised on a case the baseline runs")
register("outputs", Stage.COMPARE, ErrorKind.NUMERIC_MISMATCH,
         "outputs outside the tolerance of the float64 reference (NaN/Inf: nan_inf)")
register("output_structure", Stage.COMPARE, ErrorKind.NUMERIC_MISMATCH, "outputs not shaped like the baseline's")
register("read_only_inputs", Stage.COMPARE, ErrorKind.NUMERIC_MISMATCH, "a read-only input is not bit-identical after the call")
register("output_buffers", Stage.COMPARE, ErrorKind.NUMERIC_MISMATCH,
         "a caller's output buffer does not hold the result after the call")
register("untouched_regions", Stage.COMPARE, ErrorKind.NUMERIC_MISMATCH,
         "writes what a correct kernel leaves as handed in (padding, rows past masked_m)",
         families=("grouped_gemm_fp8",))
register("sampled_programs", Stage.COMPARE, ErrorKind.NUMERIC_MISMATCH,
         "a sampled program of the timed launch writes less than the baseline's program (settled by a full run)",
         backends=("interpreter",))
register("stream_sync", Stage.COMPARE, ErrorKind.NUMERIC_MISMATCH,
         "outputs change after the call returned (work left on another stream)", backends=("cuda",))
register("after_timing", Stage.MEASURE, ErrorKind.NUMERIC_MISMATCH,
         "wrong after the timing loop (new values in the same buffers)", backends=("cuda",))


# --- verdict-stage checks (NEEDS_REVIEW): decided in kregress/core/gate.py --------------------------------

register("precision", Stage.MEASURE, ReviewCause.PRECISION, "error several times the baseline's own against the same reference")
register("plausibility", Stage.MEASURE, ReviewCause.IMPLAUSIBLE, "faster than the speed of light or the spec's factor over the baseline")


def run_problems(seen: RunSeen, family: str, backend: str) -> list[str]:
    """Every run-stage check that applies, in registry order: the sandbox refusals of a call."""
    return [why for c in checks_for(Stage.RUN, family, backend) if c.fn is not None for why in c.fn(seen)]


# --- sampled runs: what differs from the baseline, and how it is settled (pure) -------------------------------


class Evidence(str, Enum):
    """What a sampled run of a timed shape showed differing from the baseline's run of the same programs
    (``kernels.gate_compare.sampled_suspicions``). The decision reads this kind, never a message."""

    VALUES = "values"  # written elements differ from the float64 reference: wrong on their own
    NO_LAUNCH = "no_launch"  # no launch wrote an output
    NOT_FLOAT = "not_float"  # an output is not a floating tensor of the reference's shape
    OUTPUT_COUNT = "output_count"  # another number of outputs
    SHORT_REACH = "short_reach"  # the launches cannot cover the output (largest write x grid < what it must hold)
    LAUNCH_COUNT = "launch_count"  # an output written by another number of launches than the baseline's
    GRID = "grid"  # a launch of another program count than the baseline's
    WROTE_LESS = "wrote_less"  # a program wrote fewer elements than the baseline's program of the same id (0: none)
    WROTE_ELSEWHERE = "wrote_elsewhere"  # a program wrote other elements than the baseline's program of the same id


# Evidence that is wrong whatever a full run would show: the written values themselves, or no usable output.
WRONG_ON_ITS_OWN = frozenset({Evidence.VALUES, Evidence.NO_LAUNCH, Evidence.NOT_FLOAT, Evidence.OUTPUT_COUNT})


@dataclass(frozen=True)
class Suspicion:
    """One difference a sampled run showed: its kind, the output, the program (``"x,y,z"``) where one is
    named, and the sentence a report shows."""

    kind: Evidence
    text: str
    output: int = 0
    program: str | None = None


class Settlement(str, Enum):
    """How a check that can settle a sampled run's suspicions came out."""

    MATCHED = "matched"  # the check ran and the candidate agrees with the reference there: settled in its favour
    DIFFERED = "differed"  # the check ran and the candidate is wrong there (or its programs act otherwise there)
    NONE = "none"  # no settling check fits this host's budget (or none could be derived)


@dataclass(frozen=True)
class SettlingCheck:
    """A check run to settle a sampled case's suspicions: ``full_run`` (the sampled case itself, every
    program), or ``reduced_run`` (a case with the same programs per axis and the least work per program,
    run whole, and the suspicious programs compared with the baseline's there)."""

    name: str
    outcome: Settlement
    detail: str = ""


@dataclass(frozen=True)
class Unsettled:
    """Evidence the gate saw and could not settle: the case, the programs it names, the evidence, and why
    no settling check ran. A NEEDS_REVIEW with cause ``unsettled`` carries these."""

    case: str
    kind: Evidence
    evidence: str
    program: str | None = None
    why_unsettled: str = ""

    def text(self) -> str:
        who = f"program ({self.program}) " if self.program else ""
        return (f"[{self.case} sampled] {who}{self.kind.value}: {self.evidence}"
                + (f" (not settled: {self.why_unsettled})" if self.why_unsettled else ""))


@dataclass
class SampledOutcome:
    """What one sampled case contributes to the verdict: problems (REGRESS wrong) or unsettled evidence
    (NEEDS_REVIEW ``unsettled``); both empty when nothing differed or a check settled it in the
    candidate's favour."""

    wrong: list[str] = field(default_factory=list)
    unsettled: list[Unsettled] = field(default_factory=list)


def decide_sampled(case: str, suspicions: list[Suspicion], check: SettlingCheck | None,
                   why_none: str = "") -> SampledOutcome:
    """The rule for a sampled case's suspicions. Nothing to settle: nothing. A settling check that matched:
    settled in the candidate's favour (an honest remap, a persistent or split design). One that differed:
    REGRESS (wrong), naming the evidence and the check. No check (``None`` or ``Settlement.NONE``, with
    ``why_none``): evidence wrong on its own (``WRONG_ON_ITS_OWN``) is wrong; every other difference is
    unsettled, never dropped. Cost never turns evidence into silence."""
    out = SampledOutcome()
    if not suspicions:
        return out
    if check is not None and check.outcome == Settlement.MATCHED:
        return out
    if check is not None and check.outcome == Settlement.DIFFERED:
        out.wrong.append(f"[{case} sampled] {'; '.join(s.text for s in suspicions)[:300]}; the {check.name} "
                         f"settling it differed: {check.detail[:300]}")
        return out
    why = (check.detail if check is not None and check.detail else why_none) or "no settling check fits this host"
    for s in suspicions:
        if s.kind in WRONG_ON_ITS_OWN:
            out.wrong.append(f"[{case} sampled] {s.text}")
        else:
            out.unsettled.append(Unsettled(case=case, kind=s.kind, evidence=s.text, program=s.program, why_unsettled=why))
    return out


def reduced_run_check(timed: dict[tuple, Evidence], timed_grids: list[tuple[int, ...]], reduced: dict[tuple, Evidence],
                      reduced_grids: list[tuple[int, ...]], reduced_ok: bool, reduced_label: str) -> SettlingCheck:
    """The settling check of a sampled case whose full run is past this host's budget: a reduced case with
    the timed launch's programs per axis and the least work per program (``kernels.gate_cases.wide_shape``),
    run whole (``reduced_ok``: it matched the reference), and the candidate's programs of the sampled run
    run there again beside the baseline's (``reduced``: ``kernels.gate_compare.program_differences``).

    MATCHED where the candidate launches the same grids on both shapes, the reduced case is right whole, and
    every difference from the baseline the timed shape showed (``timed``) shows on the reduced case too: the
    difference is a property of the grid (a swizzle, a remap, an idle program) and on that grid every output
    is written right. DIFFERED where the reduced case is wrong, or a program that differed on the timed shape
    acts as the baseline's on the reduced case (its work depends on a dimension the reduced case cuts: a
    skip keyed on the timed size). NONE where the grids differ (the reduced case does not run the same
    programs)."""
    name = f"reduced run ({reduced_label})"
    if not reduced_ok:
        return SettlingCheck(name, Settlement.DIFFERED, f"the reduced case {reduced_label} is wrong run whole")
    if list(timed_grids) != list(reduced_grids):
        return SettlingCheck(name, Settlement.NONE, f"the candidate launches {list(reduced_grids)} on the reduced case "
                             f"{reduced_label} and {list(timed_grids)} on the timed shape: not the same programs")
    gone = {k: v for k, v in timed.items() if reduced.get(k) != v}
    if gone:
        (i, j, p), kind = next(iter(gone.items()))
        who = f"program ({p}) of launch {j}" if p is not None else (f"launch {j}" if j is not None else "the launches")
        there = "acts as the baseline's" if (i, j, p) not in reduced else f"differs otherwise ({reduced[(i, j, p)].value})"
        return SettlingCheck(name, Settlement.DIFFERED,
                             f"output {i}: {who} differs from the baseline's on the timed shape ({kind.value}) and {there} "
                             f"on the reduced case {reduced_label}: its work depends on a dimension the reduced case cuts")
    return SettlingCheck(name, Settlement.MATCHED, f"the same differences on the reduced case {reduced_label}, which is "
                         "right run whole")
