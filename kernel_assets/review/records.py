"""What a review produces: the checklist it judges against, its findings and compile comparison, its result."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field


class ReviewError(RuntimeError):
    """The review cannot run (no git, not a repository, an unknown base ref); the message says what to do."""


RISKS = ("low", "medium", "high")
RISK_ORDER = {"high": 0, "medium": 1, "low": 2}

CHECKLIST: dict[str, str] = {
    "numerics": "Numerics against the float64 reference in fp16 / bf16 / fp8: accumulator dtype, casts on load and store, scaling, tolerance",
    "masks_boundaries": "Masks and boundaries: causal, sliding window, variable length, padding, block edges (off-by-one, < vs <=, partial tiles)",
    "smem_registers": "Shared memory and registers: stages x tile sizes, spills, within the spec's limits on the target arch",
    "tile_scheduling": "Tile scheduling and K splitting: grid size, program-id mapping, grouped order, divisibility rules of the space",
    "splitk_reduction": "Split-K reduction order and write-back: partial results, combine step, atomics, determinism, what is stored where",
    "interface": "Interface: layouts, strides, head dims, dtypes, contiguity, argument order between launcher and kernel",
    "fallback": "Fallback path: unsupported shapes or dtypes, the interpreter path, errors instead of silently wrong results",
    "evidence": "Evidence: tests and measurements that prove the change (correctness shapes, compile stats, benchmark evidence kind)",
}
ChecklistId = Literal["numerics", "masks_boundaries", "smem_registers", "tile_scheduling", "splitk_reduction", "interface", "fallback", "evidence"]


def spec_checklist(spec: Any, family: Any) -> dict[str, str]:
    """The checklist with this spec's specifics: dtype, params, limits, the space's rules."""
    c = spec.constraints
    params = ", ".join(f"{k}={v}" for k, v in sorted((spec.params or {}).items())) or "none"
    space = family.space
    split = "num_splits" in space.params
    return {
        "numerics": f"{CHECKLIST['numerics']}. Spec dtype {spec.dtype}; tolerance {c.numeric_tolerance} against float64.",
        "masks_boundaries": f"{CHECKLIST['masks_boundaries']}. Spec params: {params}; correctness shapes are ragged on purpose: "
                            f"{'; '.join(family.shape_label(s) for s in spec.correctness_shapes)}.",
        "smem_registers": f"{CHECKLIST['smem_registers']}. Limits: <= {c.max_registers_per_thread} registers/thread, <= {c.max_shared_memory_bytes} "
                          f"bytes shared memory, <= {c.max_spill_bytes} spill bytes, arch {spec.hardware.arch}.",
        "tile_scheduling": f"{CHECKLIST['tile_scheduling']}. Space: {space.describe()}.",
        "splitk_reduction": CHECKLIST["splitk_reduction"] + (f". Splits in this family: num_splits in {space.params['num_splits']}."
                                                             if split else ". This family has no split-K knob; flag any split the diff adds."),
        "interface": f"{CHECKLIST['interface']}. Shape keys: {', '.join(family.shape_keys)}.",
        "fallback": CHECKLIST["fallback"] + ".",
        "evidence": CHECKLIST["evidence"] + ".",
    }


class ReviewFinding(BaseModel):
    checklist_item: ChecklistId
    risk: Literal["low", "medium", "high"]
    file: str = Field(max_length=300)
    line: int | None = Field(default=None, ge=1)
    evidence: str = Field(max_length=800)
    verify_command: str = Field(default="", max_length=400)
    source: Literal["model", "offline"] = "model"
    in_diff: bool | None = None  # None: the finding cites no line
    flag: str = ""  # why this finding needs a second look (a line outside the diff, a destructive command ...)


class CompileSide(BaseModel):
    label: str  # "base <sha>" or "new (working tree)"
    ok: bool
    error: str = ""
    detail: str = ""
    space_check: str | None = None  # None: the baseline config is inside the family's space (or not checked: see note)
    stats: dict[str, Any] | None = None
    note: str = ""  # e.g. "the base revision's worker has no describe op: space not checked"


class CompileDelta(BaseModel):
    config: dict[str, int]
    base: CompileSide | None
    new: CompileSide
    rows: list[dict[str, Any]] = []  # metric, base, new, delta


class ReviewResult(BaseModel):
    task_id: str
    repo: str
    base_ref: str
    base_sha: str
    head_sha: str
    worktree_dirty: bool
    files_reviewed: list[str] = []
    files_changed_elsewhere: list[str] = []
    slices: int = 0
    slices_model_reviewed: int = 0
    findings: list[ReviewFinding] = []
    compile: CompileDelta | None = None
    coverage: dict[str, list[str]] = {}
    reviewed_by: str = ""
    model_reviewed: bool = False
    notes: list[str] = []
    tokens: dict[str, int] = {}
    report_path: str = ""

    @property
    def suggested_commands(self) -> list[str]:
        seen: list[str] = []
        for f in self.findings:
            if f.verify_command and f.verify_command not in seen:
                seen.append(f.verify_command)
        return seen
