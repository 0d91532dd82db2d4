"""The suite on a fresh clone: with no benchmark replay files, collection is clean and says so in one
line, the tests on the shipped file still run; an unreadable recorded file stops collection with one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from kregress.core.recorded import BENCHMARK_FILES, ENV_DIR, SHIPPED_FILE

REPO = Path(__file__).resolve().parent.parent


def pytest_run(args: list[str], replay_dir: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, ENV_DIR: str(replay_dir), "PYTHONPATH": str(REPO)}
    env.pop("PYTEST_ADDOPTS", None)
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_collection_with_an_empty_replay_dir_is_clean_and_says_so(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    res = pytest_run(["--collect-only", "-q", "tests"], empty)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    assert "Traceback" not in out and "error" not in out.lower().split("tests collected")[-1]
    lines = [ln for ln in out.splitlines() if ln.startswith("recorded data:")]
    assert len(lines) == 1, out[-3000:]
    assert str(empty) in lines[0] and ENV_DIR in lines[0] and SHIPPED_FILE in lines[0]
    assert all(name in lines[0] for name in BENCHMARK_FILES)
    assert "tests/test_replay_sweep.py::test_replay_sweep_gives_measured_verdicts" in out


def test_shipped_file_tests_run_and_benchmark_ones_skip_with_the_reason(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    res = pytest_run(["-q", "-rs", "tests/test_replay.py", "tests/test_replay_import.py", "-k",
                      "shipped or header or best_and_median or full_file or each_benchmark"], empty)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    assert "6 skipped" in out and "passed" in out and "failed" not in out  # 2 full-file + 4 benchmark-file tests
    skips = [ln for ln in out.splitlines() if ln.startswith("SKIPPED")]
    assert len(skips) == 6 and all(ENV_DIR in ln and str(empty) in ln for ln in skips)
    passed = int(out.split(" passed")[0].split()[-1])
    assert passed >= 4  # shipped-file tests: never skipped


def test_unreadable_recorded_file_stops_collection_with_one_line(tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / SHIPPED_FILE).write_bytes(b"\x1f\x8b\x08\x00garbage")  # shadows the shipped file
    res = pytest_run(["--collect-only", "-q", "tests/test_replay.py"], bad, timeout=120)
    out = (res.stdout + res.stderr).strip()
    assert res.returncode == 4 and "Traceback" not in out
    assert out.count("\n") == 0, out
    assert out.startswith("ERROR: the tests' recorded data:") and str(bad / SHIPPED_FILE) in out and ENV_DIR in out


def test_the_suite_collects_without_xdist_and_schedules_by_module_with_it(tmp_path):
    """The GPU check's minimal environments have pytest but no pytest-xdist: tests/conftest.py's scheduler hook
    must not stop collection there. With xdist (`-n 2`, the README's command) a module runs on one worker."""
    res = pytest_run(["-p", "no:xdist", "--collect-only", "-q", "tests/test_stats.py"], tmp_path)
    assert res.returncode == 0, (res.stdout + res.stderr)[-2000:]
    res = pytest_run(["-n", "2", "-v", "tests/test_stats.py", "tests/test_spec.py"], tmp_path)
    assert res.returncode == 0, (res.stdout + res.stderr)[-2000:]
    workers: dict[str, set] = {}
    for line in res.stdout.splitlines():
        if line.startswith("[gw") and " PASSED " in line:
            workers.setdefault(line.split("::")[0].split()[-1], set()).add(line.split("]")[0])
    assert set(workers) == {"tests/test_stats.py", "tests/test_spec.py"} and all(len(w) == 1 for w in workers.values()), workers
