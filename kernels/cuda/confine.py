"""Confinement for everything a CUDA family runs on a patch: nvcc (preprocessor, front end, ptxas) and
the GPU stage's child, each under bubblewrap (``bwrap``, Debian package ``bubblewrap``).

A confined command sees only what is bound into an empty root:

- read-only: the CUDA toolkit's real root (``/usr/local/cuda`` resolved, or the nvcc wheel's folder), the
  host compiler and its libraries (``/usr/bin``, ``/usr/lib/gcc``, ``/usr/lib/<multiarch>``, ``/usr/lib64``,
  ``/usr/include``, ``/usr/libexec/gcc`` where it exists; ``/bin``, ``/lib``, ``/lib64``, ``/sbin`` as the
  host has them: symlinks into ``/usr`` on a merged-usr system), and the folders the caller names (the
  family's own sources, a patched copy);
- read-write: the caller's work folder (a fresh temporary folder);
- a fresh ``/proc`` (its own PID namespace) and a minimal ``/dev`` (plus the NVIDIA device nodes for
  the GPU child);
- namespaces: ``--unshare-all`` (user, IPC, PID, network, UTS, cgroup): no network at all;
  ``--die-with-parent``; ``--new-session``;
- environment: ``--clearenv`` and only what the caller allows (``PATH`` of the toolkit and ``/usr/bin``,
  ``HOME`` and ``TMPDIR`` in the work folder, ``LANG=C``);
- limits (``prlimit``): CPU seconds, address space (not for the GPU child: the CUDA driver reserves
  terabytes of virtual addresses), file size, no core dumps; and a wall-clock limit that kills the
  whole process group.

So ``/etc/hostname``, ``/etc/os-release``, ``$HOME``, the project's other files and every other
candidate's folder do not exist for nvcc: an ``#include`` of them fails with "No such file", and no
record can hold their text. There is no fallback: without ``bwrap`` (or where it cannot create its
namespaces) ``problem()`` says so in one line and the CUDA judge refuses to judge a patch.
"""

from __future__ import annotations

import functools
import glob
import os
import re
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

BWRAP_HINT = ("bubblewrap is not installed (no `bwrap` on PATH): `apt-get install bubblewrap`. The CUDA judge runs nvcc "
              "and the GPU child of a patch only inside bwrap and judges no patch without it")


@dataclass(frozen=True)
class Limits:
    """What one confined command may use: CPU seconds, address space (None: unlimited), file size, wall time."""

    cpu_s: int = 600
    as_bytes: int | None = 16 << 30
    fsize_bytes: int = 1 << 30
    wall_s: float = 300.0


NVCC_LIMITS = Limits()
GPU_LIMITS = Limits(cpu_s=1800, as_bytes=None, fsize_bytes=1 << 30, wall_s=900.0)


class ConfinementError(RuntimeError):
    """Confinement is missing or failed to start: nothing of the patch ran."""


def bwrap_path() -> str | None:
    """``bwrap`` from ``$KREGRESS_BWRAP`` (a path; empty: none) or PATH."""
    explicit = os.environ.get("KREGRESS_BWRAP")
    if explicit is not None:
        return explicit if explicit and Path(explicit).is_file() and os.access(explicit, os.X_OK) else None
    return shutil.which("bwrap")


@functools.lru_cache(maxsize=4)
def _probe(bwrap: str) -> str | None:
    try:
        proc = subprocess.run([bwrap, "--unshare-all", "--die-with-parent", "--ro-bind", "/usr", "/usr",
                               *_root_links(), "--", "/usr/bin/true"],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"bwrap could not run: {exc}"
    if proc.returncode != 0:
        return (f"bwrap cannot create its namespaces here ({proc.stderr.strip()[:200]}): allow unprivileged user "
                f"namespaces (sysctl kernel.unprivileged_userns_clone=1) or run where they are allowed")
    return None


def problem() -> str | None:
    """None when confined commands can run; else the one line the CUDA judge refuses a patch with."""
    bw = bwrap_path()
    if bw is None:
        return BWRAP_HINT
    return _probe(bw)


def real_nvcc(nvcc: str) -> Path:
    """The nvcc binary behind ``nvcc``: symlinks resolved, and a wrapper script (``exec /usr/local/cuda-13.0/bin/nvcc
    "$@"``) followed to the toolkit's own binary (the one with ``nvcc.profile`` beside it)."""
    p = Path(nvcc).resolve()
    if (p.parent / "nvcc.profile").is_file():
        return p
    try:
        head = p.read_bytes()[:4096]
    except OSError:
        return p
    if head.startswith(b"#!"):
        for m in re.finditer(rb"(/[^\s\"']+/nvcc)\b", head):
            cand = Path(m.group(1).decode(errors="replace")).resolve()
            if cand.is_file() and (cand.parent / "nvcc.profile").is_file():
                return cand
    return p


def toolkit_root(nvcc: str) -> Path:
    """The toolkit folder nvcc belongs to (``/usr/local/cuda-13.0``; the wheel's ``nvidia/cu13``)."""
    return real_nvcc(nvcc).parent.parent


def _root_links() -> list[str]:
    """``/bin``, ``/lib``, ``/lib64``, ``/sbin`` as the host has them: a symlink (merged /usr) or a read-only bind."""
    out: list[str] = []
    for top in ("/bin", "/sbin", "/lib", "/lib64"):
        p = Path(top)
        if p.is_symlink():
            out += ["--symlink", os.readlink(top), top]
        elif p.is_dir():
            out += ["--ro-bind", top, top]
    return out


def system_dirs() -> list[Path]:
    """The host compiler's folders and the shared libraries nvcc's tools load (read-only binds)."""
    cands = [Path("/usr/bin"), Path("/usr/include"), Path("/usr/lib/gcc"), Path("/usr/libexec/gcc"), Path("/usr/lib64")]
    cands += [Path(p) for p in sorted(glob.glob("/usr/lib/*-linux-gnu"))]
    for tool in ("gcc", "g++", "cpp"):  # a compiler reached through /etc/alternatives or installed elsewhere
        found = shutil.which(tool)
        if found:
            cands.append(Path(found).resolve().parent)
    out: list[Path] = []
    for c in cands:
        if c.is_dir() and not any(c == o or o in c.parents for o in out):
            out.append(c)
    return out


def header_roots(nvcc: str) -> list[Path]:
    """Where an included file may live besides the family's own sources: the toolkit and the host
    compiler's system headers (``/usr/include``, gcc's own ``include`` folders)."""
    roots = [toolkit_root(nvcc), Path("/usr/include")]
    roots += [Path(p) for p in sorted(glob.glob("/usr/lib/gcc/*/*/include*"))]
    return roots


def command(argv: list[str], *, ro: list[Path], rw: list[Path], env: dict[str, str], cwd: Path,
            limits: Limits = NVCC_LIMITS, devices: list[str] | None = None, sys_ro: bool = False) -> list[str]:
    """The full command line: ``prlimit ... -- bwrap <binds> -- argv``. ``ro``/``rw``: extra folders bound
    read-only / read-write at the same path; ``devices``: device nodes bound (the GPU's); ``sys_ro``: /sys
    read-only (the CUDA driver reads the PCI topology there)."""
    bw = bwrap_path()
    if bw is None:
        raise ConfinementError(BWRAP_HINT)
    args = [bw, "--unshare-all", "--die-with-parent", "--new-session", "--clearenv"]
    for k, v in env.items():
        args += ["--setenv", k, v]
    args += _root_links()
    seen: set[str] = set()
    for d in system_dirs():
        args += ["--ro-bind", str(d), str(d)]
        seen.add(str(d))
    for d in ro:
        d = Path(d).resolve()
        if str(d) not in seen:
            args += ["--ro-bind", str(d), str(d)]
            seen.add(str(d))
    for d in rw:
        d = Path(d).resolve()
        args += ["--bind", str(d), str(d)]
    args += ["--proc", "/proc", "--dev", "/dev"]
    for dev in devices or []:
        args += ["--dev-bind", dev, dev]
    if sys_ro and Path("/sys").is_dir():
        args += ["--ro-bind", "/sys", "/sys"]
    args += ["--chdir", str(Path(cwd).resolve()), "--", *argv]
    pl = shutil.which("prlimit")
    if pl is None:
        raise ConfinementError("prlimit (util-linux) is missing: it sets the confined command's CPU, memory and file "
                               "size limits; install util-linux")
    lim = [pl, f"--cpu={limits.cpu_s}", f"--fsize={limits.fsize_bytes}", "--core=0"]
    if limits.as_bytes:
        lim.append(f"--as={limits.as_bytes}")
    return [*lim, "--", *args]


def nvcc_env(nvcc: str, work: Path) -> dict[str, str]:
    """nvcc's whole environment inside the confinement (nothing of this process's: no keys, no proxies)."""
    return {"PATH": f"{toolkit_root(nvcc) / 'bin'}:/usr/bin:/bin", "HOME": str(work), "TMPDIR": str(work),
            "LANG": "C", "LC_ALL": "C"}


def run(argv: list[str], *, ro: list[Path], rw: list[Path], env: dict[str, str], cwd: Path,
        limits: Limits = NVCC_LIMITS, input_text: str | None = None, devices: list[str] | None = None,
        sys_ro: bool = False) -> subprocess.CompletedProcess:
    """Run ``argv`` confined; past ``limits.wall_s`` the whole process group is killed and
    ``subprocess.TimeoutExpired`` raised. ``ConfinementError`` when bwrap is missing or cannot start."""
    why = problem()
    if why:
        raise ConfinementError(why)
    cmd = command(argv, ro=ro, rw=rw, env=env, cwd=cwd, limits=limits, devices=devices, sys_ro=sys_ro)
    return run_prepared(cmd, input_text, limits.wall_s)


def run_prepared(cmd: list[str], input_text: str | None, wall_s: float) -> subprocess.CompletedProcess:
    """A command ``command`` built, run in its own session: past ``wall_s`` its whole process group is
    killed and ``subprocess.TimeoutExpired`` raised; bwrap's own failure to start is ``ConfinementError``."""
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE if input_text is not None else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(input_text, timeout=wall_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        proc.communicate()
        raise
    if proc.returncode != 0 and err.startswith("bwrap:"):
        raise ConfinementError(f"bwrap failed to start the confined command: {err.strip()[:300]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
