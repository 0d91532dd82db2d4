"""Where specs come from: a directory of YAML files (plus files named on the command line)."""

from __future__ import annotations

import os
from pathlib import Path

import dagster as dg
from pydantic import Field

from kregress.core.spec import SpecError, TaskSpec, discover_specs, load_spec

REPO_ROOT = Path(__file__).resolve().parent.parent


def default_specs_dir() -> str:
    return os.environ.get("KREGRESS_SPECS_DIR") or str(REPO_ROOT / "specs")


def default_extra_files() -> list[str]:
    return [f for f in os.environ.get("KREGRESS_SPEC_FILES", "").split(os.pathsep) if f]


class SpecStore(dg.ConfigurableResource):
    """Loads and validates task specs; the partition key of every asset is a spec's task_id."""

    specs_dir: str = Field(default_factory=default_specs_dir, description="Directory of *.yaml task specs (env KREGRESS_SPECS_DIR).")
    extra_files: list[str] = Field(default_factory=default_extra_files,
                                   description="Spec files outside specs_dir (env KREGRESS_SPEC_FILES; set by `kregress sweep FILE`).")

    def paths(self) -> dict[str, Path]:
        found = discover_specs(self.specs_dir) if Path(self.specs_dir).is_dir() else {}
        for f in self.extra_files:
            spec = load_spec(f)
            found[spec.task_id] = Path(f)
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
        return load_spec(self.path_for(task_id))
