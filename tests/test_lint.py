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
