"""bench/scale.py without the deploy extra says so in one line naming `pip install -e '.[deploy]'` (issue 32),
instead of dying inside Dagster with a CheckError."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_scale_without_the_deploy_extra_names_it(monkeypatch, capsys):
    sys.path.insert(0, str(REPO / "bench"))
    try:
        import scale
    finally:
        sys.path.remove(str(REPO / "bench"))
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("dagster_postgres", "dagster_k8s") else real(name, *a))
    assert scale.main(["--devices", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "install -e '.[deploy]'" in err[0] and "dagster_postgres" in err[0]
