"""Which process this is, and whether another one is still alive (Linux /proc; stdlib only).

A process is named by host, PID and its start time in clock ticks since boot, so that a reused PID is
never taken for the process that died. The CLI tags its runs with it (kernel_assets/run_guard.py) and the
ledger tags each in-flight reservation with it, so the next run on the host can settle what a killed one
left open.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path


def pid_start(pid: int) -> str:
    """The process's start time in clock ticks since boot (Linux /proc), '' where unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def process_alive(pid: int, start: str = "") -> bool:
    """Whether process ``pid`` (started at ``start``, when given) still runs; a zombie counts as gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, another user's
    if start:
        now = pid_start(pid)
        if now and now != start:
            return False  # the PID was reused by another process
    try:  # a zombie (killed, not yet reaped by its parent) is gone for our purposes
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    except (OSError, IndexError):
        return True


def owner_tag(pid: int | None = None) -> str:
    """``host:pid:start`` of this process (or of ``pid`` on this host)."""
    pid = os.getpid() if pid is None else pid
    return f"{socket.gethostname()}:{pid}:{pid_start(pid)}"


def owner_gone(tag: str) -> bool:
    """True when ``tag`` (from ``owner_tag``) names a process on this host that is no longer running; False for
    a live process, another host's (which cannot be checked from here) or an empty tag."""
    host, _, rest = (tag or "").partition(":")
    pid_text, _, start = rest.partition(":")
    if not host or host != socket.gethostname() or not pid_text.isdigit():
        return False
    return not process_alive(int(pid_text), start)
