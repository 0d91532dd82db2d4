"""kernel_source_review: an agent review (role "review") of the kernel changes that matter to one spec.

What is reviewed: the family's own files (``Family.source_files()``, plus the modules of its package that the
family module imports), in the git checkout that holds them (found with ``git rev-parse --show-toplevel`` from
the file, so a plugin's kernel is reviewed in the plugin's repository), diffed from <base> to the working tree
(untracked files included). <base> is the asset config's ``base_ref``, else the revision this spec last
reviewed in that repository (``$DAGSTER_HOME/review/<task_id>.json``), else HEAD when the family's files have
uncommitted changes, else (a clean checkout) the parent of the last commit that touched them, named in the
notes. Other changed files in the family's folders are listed, not reviewed.

How (``run``): the diff is sliced per file (``diff``); each slice goes to the model on its own with the spec's
acceptance checklist and the offline facts (``prompt``). The answer is untrusted data: validated into
``ReviewFinding`` rows; a finding citing a line outside the diff is kept but flagged; suggested commands are
listed, never executed.

Offline (``offline``): the spec's baseline config AOT-compiled for its arch (no GPU) on both sides through the
worker protocol (``python -m kernels.worker``), the base side in a temporary ``git worktree`` of the base
revision so it compiles against that revision's own code; register / spill / shared memory / occupancy / SASS
deltas, the space-rule check, and which checklist items the tests under ``tests/`` mention (keyword match).

Findings appear in the asset's metadata (``asset``) and in ``$DAGSTER_HOME/reports/<task_id>/review.md``
(``report``). Keys never appear in either: model text is scrubbed of every key in the environment.
"""

from kernel_assets.review.asset import CHECK_NAME, GROUP_REVIEW, ReviewConfig, build_review_assets
from kernel_assets.review.diff import FamilySources, FileDiff, family_sources, parse_unified_diff, render_slices
from kernel_assets.review.offline import base_worktree, compile_deltas, compile_findings, coverage_by_item
from kernel_assets.review.prompt import build_messages, parse_findings
from kernel_assets.review.records import CHECKLIST, CompileDelta, CompileSide, ReviewError, ReviewFinding, ReviewResult
from kernel_assets.review.report import render_report
from kernel_assets.review.run import ASSET_NAME, load_state, run_review

__all__ = [
    "ASSET_NAME", "CHECK_NAME", "CHECKLIST", "GROUP_REVIEW", "CompileDelta", "CompileSide", "FamilySources", "FileDiff",
    "ReviewConfig", "ReviewError", "ReviewFinding", "ReviewResult", "base_worktree", "build_messages", "build_review_assets",
    "compile_deltas", "compile_findings", "coverage_by_item", "family_sources", "load_state", "parse_findings",
    "parse_unified_diff", "render_report", "render_slices", "run_review",
]
