"""Every suggestion pastes; Ctrl-C is clean (issue 55).

- The sweep's `next:` suggestion is an explanation line and then the bare command on a line of its own: no
  back quotes (bash ran what they enclosed and exited 127), shell-quoted, and bash runs the line as it stands.
- Ctrl-C (SIGINT to the process group, as a terminal sends it) in `kregress sweep` and in `bench/scale.py`
  leaves one line, no traceback, exit 130, and no process behind.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kernel_assets.cli import next_lines
from kernel_assets.report import next_step
from kregress.core.spec import load_spec

REPO = Path(__file__).resolve().parent.parent
SMOKE = REPO / "specs" / "gemm_smoke.yaml"


@pytest.mark.parametrize("command", ["kregress", ".venv/bin/kregress", f"{sys.executable} -m kernel_assets.cli"])
def test_next_lines_are_an_explanation_then_a_bare_command(monkeypatch, command):
    monkeypatch.setenv("KREGRESS_COMMAND", command)
    spec = load_spec(REPO / "specs" / "gemm_h100_bf16.yaml")
    text = next_step("model", spec, "specs/gemm_h100_bf16.yaml")
    assert "`" in text  # the report's own text quotes its commands
    lines = next_lines(text)
    cmds = [ln for ln in lines if not ln.startswith("next: ")]
    assert cmds == [shlex.join([*shlex.split(command), "sweep", "specs/gemm_h100_bf16.yaml", "--backend", "cuda"]),
                    shlex.join([*shlex.split(command), "sweep", "specs/replay_clblast_rtx3090.yaml"])]
    for i, line in enumerate(lines):
        assert "`" not in line and "$(" not in line, line
        if line in cmds:  # each command comes right after the line that says what it does
            assert lines[i - 1].startswith("next: ") and "the command below" in lines[i - 1]
            assert shlex.split(line)[: len(shlex.split(command))] == shlex.split(command)
    assert "'replay'" in lines[2]  # a quoted word that is no command keeps plain quotes
    assert next_lines("") == []


def test_the_printed_command_runs_in_bash(monkeypatch):
    """Pasted into bash as printed (plus --help, so nothing is swept): it runs kregress and exits 0."""
    monkeypatch.setenv("KREGRESS_COMMAND", ".venv/bin/kregress")
    spec = load_spec(REPO / "specs" / "gemm_h100_bf16.yaml")
    cmds = [ln for ln in next_lines(next_step("model", spec, "specs/gemm_h100_bf16.yaml")) if not ln.startswith("next: ")]
    for line in cmds:
        p = subprocess.run(["bash", "-c", line + " --help"], cwd=REPO, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, (line, p.stderr)
        assert "usage: kregress sweep" in p.stdout


# --- Ctrl-C ------------------------------------------------------------------------------------------------


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    out, todo = set(), [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


def _alive(pid: int) -> bool:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _in_group(pgid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if os.getpgid(int(d.name)) == pgid and _alive(int(d.name)):
                    out.append(int(d.name))
            except OSError:
                continue
    return out


def _interrupt_when(argv: list[str], env: dict, ready: str, timeout_s: float) -> tuple[int, list[str], list[str], set[int], int]:
    """Start ``argv`` in a session of its own, send SIGINT to its group once ``ready`` is printed; (exit code,
    lines before, lines after, every process it had started, its pgid)."""
    p = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    lines: list[tuple[float, str]] = []
    pump = threading.Thread(target=lambda: [lines.append((time.time(), ln.rstrip("\n"))) for ln in p.stdout], daemon=True)
    pump.start()
    deadline = time.monotonic() + timeout_s
    try:
        while not any(ready in ln for _, ln in lines):
            assert p.poll() is None, "\n".join(ln for _, ln in lines)[-3000:]
            assert time.monotonic() < deadline, f"{ready!r} not printed within {timeout_s} s"
            time.sleep(0.2)
        started = _descendants(p.pid)
        sent = time.time()
        os.killpg(p.pid, signal.SIGINT)
        rc = p.wait(timeout=240)
        pump.join(timeout=30)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    return (rc, [ln for t, ln in lines if t <= sent], [ln for t, ln in lines if t > sent], started, p.pid)


def _gone(pids: set[int], pgid: int, grace_s: float = 15.0) -> tuple[list[int], list[int]]:
    deadline = time.monotonic() + grace_s
    while True:
        left, group = [q for q in pids if _alive(q)], _in_group(pgid)
        if (not left and not group) or time.monotonic() > deadline:
            return left, group
        time.sleep(0.5)


@pytest.mark.slow
def test_ctrl_c_in_a_sweep_is_one_line_and_leaves_nothing(tmp_path):
    if not Path("/proc").is_dir():
        pytest.skip("needs /proc")
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("KREGRESS_")}
    rc, before, after, started, pgid = _interrupt_when(
        [sys.executable, "-m", "kernel_assets.cli", "sweep", str(SMOKE), "--dagster-home", str(home)], env,
        "round_1_variants ...", timeout_s=600)
    assert rc == 130, after
    assert len(after) == 1 and "interrupted (Ctrl-C)" in after[0] and "marked canceled" in after[0], after
    assert not any("Traceback" in ln for ln in before + after)
    left, group = _gone(started, pgid)
    assert not left and not group, (left, group)
    # the run is canceled, not failed: no partition reads Failed for it
    probe = subprocess.run([sys.executable, "-c", "import dagster as dg; i = dg.DagsterInstance.get(); "
                            "print(i.get_runs(limit=1)[0].status.value)"], cwd=REPO, capture_output=True, text=True,
                           env={**env, "DAGSTER_HOME": str(home)}, timeout=120)
    assert probe.stdout.strip() == "CANCELED", probe.stderr[-2000:]


@pytest.mark.slow
def test_ctrl_c_in_bench_scale_is_one_line_and_stops_what_it_started(tmp_path):
    import importlib.util

    from kregress.testing.postgres import pg_bin_dir

    if not Path("/proc").is_dir() or importlib.util.find_spec("dagster_postgres") is None or pg_bin_dir() is None:
        pytest.skip("needs /proc, dagster-postgres and PostgreSQL server binaries")
    env = {k: v for k, v in os.environ.items() if not k.startswith("KREGRESS_")}
    rc, before, after, started, pgid = _interrupt_when(
        [sys.executable, "bench/scale.py", "--devices", "1", "--per-device", "1", "--backfill", "0", "--skip-kill",
         "--step-device-s", "1", "--json", str(tmp_path / "out.json")], env, "  up in ", timeout_s=900)
    assert rc == 130, after
    assert len(after) == 1 and after[0].startswith("bench/scale.py: interrupted (Ctrl-C)"), after
    assert not any("Traceback" in ln for ln in before + after)
    left, group = _gone(started, pgid, grace_s=30)
    assert not left and not group, (left, group)
