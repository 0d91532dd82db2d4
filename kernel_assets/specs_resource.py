"""Where specs come from: a directory of YAML files (plus files named on the command line).

A run binds its spec once (``SpecStore.bind``: read, schema-checked, bound to its family) when its first
step opens the run's context (``kernel_assets.run_context``), which carries the ``BoundSpec`` through the
graph. ``kregress sweep`` has already bound the spec it was given before the run starts: it passes that
binding in as the run's ``run_context`` resource, not through this module.
"""

from __future__ import annotations

import os
from pathlib import Path

import dagster as dg
import yaml
from pydantic import Field

from kregress.core.bind import BoundSpec, load_bound
from kregress.core.paths import REPO_ROOT
from kregress.core.spec import SpecError, TaskSpec, discover_specs, load_spec


def default_specs_dir() -> str:
    return os.environ.get("KREGRESS_SPECS_DIR") or str(REPO_ROOT / "specs")


def default_extra_files() -> list[str]:
    return [f for f in os.environ.get("KREGRESS_SPEC_FILES", "").split(os.pathsep) if f]


def _task_id_of(path: Path) -> str | None:
    """The task_id a spec file declares, read without validating it."""
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except (yaml.YAMLError, OSError, UnicodeDecodeError):
        return None
    tid = data.get("task_id") if isinstance(data, dict) else None
    return tid if isinstance(tid, str) and tid else None


class SpecStore(dg.ConfigurableResource):
    """Finds task specs and binds them; the partition key of every asset is a spec's task_id."""

    specs_dir: str = Field(default_factory=default_specs_dir, description="Directory of *.yaml task specs (env KREGRESS_SPECS_DIR).")
    extra_files: list[str] = Field(default_factory=default_extra_files,
                                   description="Spec files outside specs_dir (env KREGRESS_SPEC_FILES; set by `kregress sweep FILE`).")

    def paths(self) -> dict[str, Path]:
        found = discover_specs(self.specs_dir) if Path(self.specs_dir).is_dir() else {}
        for f in self.extra_files:
            tid = _task_id_of(Path(f))
            if tid:
                found[tid] = Path(f)
        return found

    def path_for(self, task_id: str) -> Path:
        paths = self.paths()
        if task_id not in paths:
            raise SpecError(
                f"no spec with task_id {task_id!r} in {self.specs_dir} or {self.extra_files or '[]'}; "
                f"known: {', '.join(sorted(paths)) or 'none'}"
            )
        return paths[task_id]

    def load(self, task_id: str) -> TaskSpec:
        """The spec of ``task_id``, schema-checked only (no family bound): for a review, which looks at a
        kernel change that may break the spec. A sweep binds (``bind``)."""
        return load_spec(self.path_for(task_id))

    def bind(self, task_id: str) -> BoundSpec:
        """The spec of ``task_id`` read and bound to its family (no budget scope: the run context adds it)."""
        return load_bound(self.path_for(task_id))
