"""`dagster dev` as the README starts it stops when told to (issue 32): SIGTERM ends it,
its webserver, daemon and code server with it, and free the port. A real `dagster dev` on this project's
workspace.yaml, in a temp DAGSTER_HOME."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (from /proc)."""
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
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_dagster_dev_stops_on_sigterm(tmp_path):
    """SIGTERM (what `kill PID` sends; Ctrl-C's SIGINT takes the same handler: dagster dev maps one onto the other)."""
    sig = signal.SIGTERM
    if not Path("/proc").is_dir():
        pytest.skip("needs /proc")
    home = tmp_path / "home"
    home.mkdir()
    port = _free_port()
    env = {**os.environ, "DAGSTER_HOME": str(home)}
    # SIGINT at its default, as in a terminal (a shell's background job would start with it ignored, and
    # dagster dev maps SIGTERM onto SIGINT's handler: see the README)
    dev = subprocess.Popen([str(Path(sys.executable).parent / "dagster"), "dev", "-w", "workspace.yaml", "-p", str(port)],
                           cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert dev.poll() is None, "dagster dev exited before serving"
            assert time.monotonic() < deadline, "dagster dev did not serve within 300 s"
            time.sleep(2)
        below = _descendants(dev.pid)
        assert below  # the webserver and the daemon at least
        t0 = time.monotonic()
        dev.send_signal(sig)
        dev.wait(timeout=90)
        took = time.monotonic() - t0
        deadline = time.monotonic() + 30
        while any(_alive(p) for p in below) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not [p for p in below if _alive(p)], "processes left behind"
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0, "the port is still served"
        assert took < 90
    finally:
        if dev.poll() is None:
            dev.kill()
            dev.wait()
