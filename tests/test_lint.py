"""The tree is clean under the project's ruff configuration (pyproject.toml [tool.ruff])."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_ruff_is_clean():
    exe = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    assert exe, "ruff is part of the test extra: pip install -e '.[test]'"
    res = subprocess.run([exe, "check", "--no-cache", "kregress", "kernels", "resources", "kernel_assets", "bench",
                          "scripts", "tests"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]


# Commit subjects: at most 72 characters, the detail in the body (`git log --oneline` stays readable). Checked for
# the commits made after SUBJECTS_SINCE (older ones predate the rule). A fresh clone has the history; a shallow
# clone, or a tree that is no git checkout, skips with the reason.
SUBJECTS_SINCE = "f9f405a"
MAX_SUBJECT = 72


def test_commit_subjects_are_at_most_72_characters():
    git = shutil.which("git")
    if git is None or not (REPO / ".git").exists():
        import pytest

        pytest.skip("not a git checkout: no commits to check")
    res = subprocess.run([git, "log", "--format=%h %s", f"{SUBJECTS_SINCE}..HEAD"], cwd=REPO, capture_output=True,
                         text=True, timeout=60)
    if res.returncode != 0:
        import pytest

        pytest.skip(f"commit {SUBJECTS_SINCE} is not in this clone (shallow?): {res.stderr.strip()[:200]}")
    long = [line for line in res.stdout.splitlines() if len(line.split(" ", 1)[1]) > MAX_SUBJECT]
    assert not long, (f"commit subjects over {MAX_SUBJECT} characters (put the detail in the body: "
                      f"git commit -m SUBJECT -m DETAIL): {long}")
