"""Where a candidate patch runs: a freshly forked, sandboxed child of a clean zygote process.

Untrusted code (a patch from a model or a stranger) never runs in the process that judges it. The
judging process starts one *zygote* per judgement (``python -m kernels.sandbox``) with an allowlisted
environment (no gateway, model or cloud credentials: ``sandbox_env``); the zygote imports torch and
Triton once and never touches a candidate. For each candidate (and for the pristine reference) it
forks a child, which before loading anything:

- starts its own session (``setsid``): a timeout kills the whole process group;
- dies with the zygote (``PR_SET_PDEATHSIG``);
- sets resource limits (CPU seconds, address space on CPU hosts, file size, no core dumps);
- leaves the network: a new, empty network namespace (``unshare(CLONE_NEWNET)``, with a user namespace
  where plain unsharing is refused), so no socket can reach anything;
- installs an audit hook (``sys.addaudithook``, PEP 578) that refuses sockets, subprocesses (except
  the compiler tools of the Triton wheel where a compile needs them), ``os.system``/``exec``/``fork``,
  ctypes (on CPU hosts), file writes, renames and deletions outside the child's own folder, reading
  other processes' ``/proc`` entries, and signals to other processes; and, from the candidate's own
  files (the patched kernel files: ``watch``), any file opened, directory listed or frame taken
  (``sys._getframe``) by their code or by the standard library on their behalf, whatever the route
  (``pathlib`` through an object the module already holds, ``inspect`` reached through another module),
  while Triton's and torch's own file access (a compile cache) stays theirs. A refusal
  raises in the candidate *and* is recorded, so a candidate that swallows the error is still caught;
- then puts the temporary copy of the family package first on ``sys.path`` and drops any loaded
  copy of that package, so the family is imported from the copy.

Messages are frames (``KRG1``, a JSON header, raw tensor bytes): nothing crossing the boundary is
unpickled, so a hostile child cannot execute code in the judge by what it sends back.

Only the child module knows what the child does (its jobs): the zygote takes it by name (``Zygote(child=...)``,
default ``kernels.gate_child``, whose ``preload()`` and ``child_main()`` it calls), so this module, the
process machinery, imports no gate code.
"""

from __future__ import annotations

import json
import os
import queue
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

MAGIC = b"KRG1"
MAX_HEADER = 16 << 20

# Environment variables a sandboxed child may see (everything else is dropped: keys, tokens, cloud
# credentials, the gateway's settings). Values of these carry no secret.
ENV_ALLOW = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER",
             "NVIDIA_VISIBLE_DEVICES", "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH", "TRITON_PTXAS_PATH",
             "TRITON_CUOBJDUMP_PATH", "TRITON_NVDISASM_PATH", "TRITON_LIBCUDA_PATH", "TRITON_DEFAULT_FP_FUSION",
             "PYTHONHASHSEED", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
# Prefixes refused even if a name above matched one by accident (defence against a widened allowlist).
ENV_DENY_PREFIXES = ("TAOTOKEN", "OPENAI", "ANTHROPIC", "AWS", "AZURE", "GOOGLE", "GCP", "HF_", "HUGGING",
                     "GITHUB", "GH_", "DAGSTER", "KREGRESS", "SSH", "GPG", "NETRC", "PG", "DATABASE", "API_KEY")


def sandbox_env(base: dict[str, str] | None = None, *, interpret: bool, pythonpath: list[str]) -> dict[str, str]:
    """The zygote's (and so every child's) environment: the allowlist above, taken from ``base``
    (default ``os.environ``), plus what Python needs to import the project."""
    base = dict(os.environ if base is None else base)
    env = {k: v for k, v in base.items() if k in ENV_ALLOW and not k.upper().startswith(ENV_DENY_PREFIXES)}
    env.setdefault("PATH", "/usr/bin:/bin")
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(p for p in pythonpath if p))
    env["PYTHONNOUSERSITE"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PYTHONWARNINGS"] = "ignore"
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    env.setdefault("OMP_NUM_THREADS", "1")
    if interpret:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


# --- frames ---------------------------------------------------------------------------------------


def write_frame(fd: int, header: dict, blobs: list[bytes] = ()) -> None:
    header = dict(header, blobs=[len(b) for b in blobs])
    h = json.dumps(header, default=str).encode()
    data = MAGIC + struct.pack("<I", len(h)) + h
    _write_all(fd, data)
    for b in blobs:
        _write_all(fd, b)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _read_exact(fd: int, n: int) -> bytes | None:
    chunks, left = [], n
    while left:
        b = os.read(fd, min(left, 1 << 20))
        if not b:
            return None
        chunks.append(b)
        left -= len(b)
    return b"".join(chunks)


class FrameError(Exception):
    pass


def read_frame(fd: int, max_blob_bytes: int = 8 << 30) -> tuple[dict, list[bytes]] | None:
    """One frame from ``fd``; None at end of file; ``FrameError`` for anything malformed."""
    head = _read_exact(fd, 8)
    if head is None:
        return None
    if head[:4] != MAGIC:
        raise FrameError(f"bad frame magic {head[:4]!r}")
    (hlen,) = struct.unpack("<I", head[4:])
    if hlen > MAX_HEADER:
        raise FrameError(f"frame header of {hlen} bytes")
    raw = _read_exact(fd, hlen)
    if raw is None:
        return None
    try:
        header = json.loads(raw)
    except ValueError as exc:
        raise FrameError(f"frame header is not JSON: {exc}") from None
    sizes = header.get("blobs") or []
    if not isinstance(sizes, list) or not all(isinstance(s, int) and s >= 0 for s in sizes) or sum(sizes) > max_blob_bytes:
        raise FrameError("bad blob sizes")
    blobs = []
    for s in sizes:
        b = _read_exact(fd, s)
        if b is None:
            return None
        blobs.append(b)
    return header, blobs


# --- tensors across the boundary (no pickle) -------------------------------------------------------


def pack(value: Any, blobs: list[bytes]) -> Any:
    """A JSON-able description of ``value`` (tensors, numbers, strings, lists, tuples, dicts), with
    each tensor's bytes appended to ``blobs``."""
    import torch

    if torch.is_tensor(value):
        t = value.detach().to("cpu").contiguous()
        blobs.append(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        return {"__t": len(blobs) - 1, "dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape)}
    if isinstance(value, tuple):
        return {"__tuple": [pack(v, blobs) for v in value]}
    if isinstance(value, list):
        return [pack(v, blobs) for v in value]
    if isinstance(value, dict):
        return {"__dict": [[k, pack(v, blobs)] for k, v in value.items()]}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"cannot send a {type(value).__name__} across the sandbox boundary")


def unpack(desc: Any, blobs: list[bytes]) -> Any:
    """The inverse of ``pack``: only tensors of known dtypes and plain values come back."""
    import torch

    if isinstance(desc, dict):
        if "__t" in desc:
            dtype = getattr(torch, str(desc["dtype"]), None)
            if not isinstance(dtype, torch.dtype):
                raise FrameError(f"unknown dtype {desc['dtype']!r}")
            shape = [int(s) for s in desc["shape"]]
            raw = blobs[int(desc["__t"])]
            if not raw:
                return torch.empty(shape, dtype=dtype)
            flat = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype)
            return flat.reshape(shape)
        if "__tuple" in desc:
            return tuple(unpack(v, blobs) for v in desc["__tuple"])
        if "__dict" in desc:
            return {str(k): unpack(v, blobs) for k, v in desc["__dict"]}
        raise FrameError("unknown value description")
    if isinstance(desc, list):
        return [unpack(v, blobs) for v in desc]
    return desc


# --- the child's confinement --------------------------------------------------------------------------

_VIOLATIONS: list[str] = []


def violations() -> list[str]:
    """Refusals recorded by the audit hook since the last ``clear_violations``."""
    return list(_VIOLATIONS)


def clear_violations() -> None:
    _VIOLATIONS.clear()


def record_violation(why: str) -> None:
    """A refusal noticed by the harness itself (not the audit hook)."""
    _VIOLATIONS.append(why[:300])


def _libc():
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def isolate_network() -> str:
    """Leave the network: a new network namespace holds only a downed loopback. Returns how
    ('netns', 'userns+netns') or why not."""
    import ctypes

    libc = _libc()
    CLONE_NEWNET, CLONE_NEWUSER = 0x40000000, 0x10000000
    if libc.unshare(CLONE_NEWNET) == 0:
        return "netns"
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) == 0:
        try:
            Path("/proc/self/setgroups").write_text("deny")
            Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")
            Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")
        except OSError:
            pass
        return "userns+netns"
    return f"not isolated (unshare: {os.strerror(ctypes.get_errno())}); sockets are refused by the audit hook"


def set_limits(cpu_s: float, mem_bytes: int | None, fsize_bytes: int) -> None:
    import resource

    soft = max(1, int(cpu_s))
    resource.setrlimit(resource.RLIMIT_CPU, (soft, soft + 5))
    if mem_bytes:
        resource.setrlimit(resource.RLIMIT_AS, (mem_bytes, mem_bytes))
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize_bytes, fsize_bytes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


# Events refused when the candidate's own code causes them (see install_audit_hook): Triton's and torch's
# own file access, compiles and imports are theirs.
WATCHED_EVENTS = frozenset({"open", "sys._getframe", "sys._current_frames", "os.listdir", "os.scandir", "compile", "exec",
                            "import", "builtins.input", "code.__new__", "function.__new__", "object.__setattr__",
                            "object.__delattr__"})


def _stdlib_prefixes() -> tuple[str, ...]:
    """Where the standard library's code lives (not the installed packages beside it)."""
    return (os.path.dirname(os.__file__) + os.sep, os.path.realpath(os.path.dirname(os.__file__)) + os.sep,
            "<frozen", "<string>")


def watched_files(files: list[str], wrappers: dict[str, list[str]] | None = None) -> dict[str, tuple | None]:
    """The names a candidate file's code objects may carry (as given, and resolved), each with the line spans
    of its editable code: its ``@triton.jit`` functions and the launch wrappers ``wrappers`` names for it
    (decorators included; ``kregress.core.patch.regions_of`` on the file as patched). The rest of such a
    file (its module body, ``make_inputs``, the reference) is the family's fixed code, which a patch cannot
    change. None: every function of the file counts as the candidate's (no wrapper list given, or the file
    is unreadable). Read once per process, before any candidate code runs: a later call with the same
    arguments (the run-time guard after the audit hook) gets the same answer without reading again."""
    key = json.dumps([list(files), wrappers], sort_keys=True, default=str)
    if key not in _WATCHED:
        _WATCHED[key] = _read_watched(files, wrappers)
    return dict(_WATCHED[key])


_WATCHED: dict[str, dict[str, tuple | None]] = {}


def _read_watched(files: list[str], wrappers: dict[str, list[str]] | None) -> dict[str, tuple | None]:
    out: dict[str, tuple | None] = {}
    for f in files:
        spans = None
        if wrappers is not None:
            from kregress.core.patch import regions_of

            try:
                spans = tuple((r.start, r.end) for r in regions_of(Path(f).read_text(), f, tuple(wrappers.get(f, ()))))
            except (OSError, SyntaxError, UnicodeDecodeError):
                spans = None
        out[f] = out[os.path.realpath(f)] = spans
    return out


def initiated_by(watch: dict[str, tuple | None], skip: tuple[str, ...], depth: int = 2) -> bool:
    """Whether the code that caused this event is the candidate's: walking out from the caller, frames in
    ``skip`` (the standard library, and whatever else the caller names) act on behalf of the next frame
    out, and so does the fixed code in a candidate's file (outside its editable spans: the family's
    ``make_inputs`` reading its own values is the harness's doing, unless candidate code called it); the
    first other frame decides: editable code of a watched file is the candidate's, anything else is not."""
    if not watch:
        return False
    try:
        f = sys._getframe(depth)
    except ValueError:
        return False
    while f is not None:
        code = f.f_code
        name = code.co_filename
        if name in watch:
            spans = watch[name]
            if code.co_name != "<module>" and (spans is None or any(s <= code.co_firstlineno <= e for s, e in spans)):
                return True
            f = f.f_back  # fixed code of the family's file: on behalf of whoever called it
            continue
        if "-packages" + os.sep in name:
            return False  # an installed package (triton, torch, numpy) acts on its own account
        if not name.startswith(skip):
            return False
        f = f.f_back
    return False


def install_audit_hook(write_roots: list[str], exec_allowed: list[str], allow_ctypes: bool,
                       watch: dict[str, tuple | None] | None = None) -> None:
    """Refuse (raise, and record) what a kernel never needs; see the module docstring."""
    roots = tuple(os.path.realpath(r) + os.sep for r in write_roots) + ("/dev/null",)
    stdlib = _stdlib_prefixes()
    busy = threading.local()
    tools = {os.path.realpath(t) for t in exec_allowed}
    me = str(os.getpid())
    O_WRITE = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    recording = [False]

    def refuse(why: str) -> None:
        if not recording[0]:
            recording[0] = True
            try:
                _VIOLATIONS.append(why[:300])
            finally:
                recording[0] = False
        raise PermissionError(f"sandbox: {why}")

    def under_roots(p: Any) -> bool:
        if isinstance(p, int):
            return True  # an already-open descriptor: the harness's own pipes
        try:
            rp = os.path.realpath(os.fsdecode(p))
        except (TypeError, ValueError):
            return False
        return rp == "/dev/null" or rp.startswith(roots)

    def readable(p: Any) -> bool:
        if isinstance(p, int):
            return True
        try:
            rp = os.path.realpath(os.fsdecode(p))
        except (TypeError, ValueError):
            return False
        if rp.startswith("/proc/"):
            part = rp.split("/")[2]
            if part.isdigit() and part != me:
                return False
            if rp.endswith("/environ"):
                return False
        return True

    def by_candidate() -> bool:
        # sys._getframe raises its own audit event: the walk must not re-enter
        if getattr(busy, "on", False):
            return False
        busy.on = True
        try:
            return initiated_by(watch, stdlib, depth=3)
        finally:
            busy.on = False

    def hook(event: str, args: tuple) -> None:
        if watch and event in WATCHED_EVENTS and by_candidate():
            what = os.fsdecode(args[0]) if event in ("open", "import") and args and isinstance(args[0], (str, bytes)) else ""
            refuse(f"{event} {what}".strip() + " by the candidate's code (file access, directory listing, frame "
                   "introspection, dynamic code or imports)")
        if event == "open":
            path, mode, flags = (list(args) + [None, None, None])[:3]
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (isinstance(flags, int) and flags & O_WRITE)
            if writing and not under_roots(path):
                refuse(f"write to {os.fsdecode(path) if not isinstance(path, int) else path}")
            if not writing and not readable(path):
                refuse(f"read of {os.fsdecode(path)}")
        elif event.startswith("socket.") and event not in ("socket.gethostname", "socket.sethostname"):
            refuse(f"{event} (no network in the sandbox)")
        elif event == "subprocess.Popen":
            exe = args[0] if args else None
            argv = args[1] if len(args) > 1 else None
            prog = exe or (argv[0] if isinstance(argv, (list, tuple)) and argv else argv)
            try:
                real = os.path.realpath(os.fsdecode(prog)) if prog else ""
            except (TypeError, ValueError):
                real = ""
            if real not in tools:
                refuse(f"subprocess {prog!s:.80}")
        elif event in ("os.posix_spawn", "os.exec"):
            prog = args[0] if args else ""
            try:
                real = os.path.realpath(os.fsdecode(prog))
            except (TypeError, ValueError):
                real = ""
            if real not in tools:
                refuse(f"{event} {prog!s:.80}")
        elif event in ("os.system", "os.spawn", "os.fork", "os.forkpty", "pty.spawn", "os.startfile"):
            refuse(event)
        elif event.startswith("ctypes.") and not allow_ctypes:
            refuse(event)
        elif event in ("os.kill", "os.killpg", "signal.pthread_kill"):
            refuse(event)
        elif event in ("os.remove", "os.rmdir", "os.rename", "os.chmod", "os.chown", "os.link", "os.symlink",
                       "os.truncate", "os.utime", "os.mkdir", "shutil.rmtree", "shutil.move", "shutil.copyfile",
                       "shutil.copytree", "os.chflags", "os.lchflags", "os.setxattr", "os.removexattr"):
            paths = [a for a in args[:2] if isinstance(a, (str, bytes, os.PathLike))]
            if not all(under_roots(p) for p in paths):
                refuse(f"{event} {os.fsdecode(paths[0]) if paths else ''}")
        elif event in ("sys.setprofile", "sys.settrace", "sys.addaudithook"):
            refuse(event)

    sys.addaudithook(hook)


def _prctl_pdeathsig() -> None:
    try:
        _libc().prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - best effort: the parent also kills the group on exit
        pass


def enter_child(spec: dict, fds: tuple[int, int]) -> dict:
    """Confine this freshly forked child (see the module docstring); returns what was set up."""
    os.setsid()
    _prctl_pdeathsig()
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(2, 1)  # prints go to stderr; the protocol has its own pipes
    root = spec["root"]
    work = spec["work"]
    for sub in ("tmp", "triton", "home"):
        os.makedirs(os.path.join(work, sub), exist_ok=True)
    os.environ.update({"TMPDIR": os.path.join(work, "tmp"), "TRITON_CACHE_DIR": os.path.join(work, "triton"),
                       "HOME": os.path.join(work, "home")})
    if spec.get("interpret"):
        os.environ["TRITON_INTERPRET"] = "1"
    else:
        os.environ.pop("TRITON_INTERPRET", None)
    net = isolate_network() if spec.get("isolate_network", True) else "not requested"
    lim = spec.get("limits") or {}
    set_limits(lim.get("cpu_s", 600), lim.get("mem_bytes"), lim.get("fsize_bytes", 1 << 30))
    os.chdir(work)
    for name in list(sys.modules):
        if name.split(".")[0] in spec.get("purge", ()):
            del sys.modules[name]
    sys.path.insert(0, root)
    import importlib

    importlib.invalidate_caches()
    if spec.get("sandbox", True):
        install_audit_hook([work], spec.get("exec_allowed", []), allow_ctypes=bool(spec.get("allow_ctypes")),
                           watch=watched_files(spec.get("watch", []), spec.get("watch_wrappers")))
    return {"pid": os.getpid(), "network": net, "sandbox": bool(spec.get("sandbox", True))}


# --- the zygote ---------------------------------------------------------------------------------------


DEFAULT_CHILD = "kernels.gate_child"


def zygote_main(child: str = DEFAULT_CHILD) -> None:
    """Preload, then fork a child per request; relay frames between the parent and the children. ``child``
    names the module whose ``preload()`` runs once here and whose ``child_main()`` each child runs.

    Parent -> zygote frames: {"op": "fork", "id", "spec"} | {"op": "to", "id", ...job} | {"op": "end", "id"}
    | {"op": "quit"}; zygote -> parent: {"id", "event": "forked"|"reply"|"exit", ...}.
    """
    import importlib

    gate_child = importlib.import_module(child)
    gate_child.preload()
    out_fd = os.dup(1)
    os.dup2(2, 1)
    children: dict[str, dict] = {}  # id -> {"pid", "rfd", "wfd"}
    write_frame(out_fd, {"event": "ready", "pid": os.getpid()})

    def reap(cid: str) -> None:
        ch = children.pop(cid, None)
        if ch is None:
            return
        for fd in (ch["rfd"], ch["wfd"]):
            try:
                os.close(fd)
            except OSError:
                pass
        try:
            _, status = os.waitpid(ch["pid"], 0)
        except ChildProcessError:
            status = 0
        code = os.waitstatus_to_exitcode(status) if status else 0
        write_frame(out_fd, {"id": cid, "event": "exit", "code": code})

    while True:
        rlist = [0] + [ch["rfd"] for ch in children.values()]
        ready, _, _ = select.select(rlist, [], [])
        if 0 in ready:
            msg = read_frame(0)
            if msg is None:
                break
            header, blobs = msg
            op, cid = header.get("op"), str(header.get("id", ""))
            if op == "quit":
                break
            if op == "fork":
                p2c_r, p2c_w = os.pipe()
                c2p_r, c2p_w = os.pipe()
                pid = os.fork()
                if pid == 0:  # the child
                    try:
                        os.close(p2c_w)
                        os.close(c2p_r)
                        os.close(out_fd)
                        for ch in children.values():
                            for fd in (ch["rfd"], ch["wfd"]):
                                os.close(fd)
                        info = enter_child(header["spec"], (p2c_r, c2p_w))
                        gate_child.child_main(p2c_r, c2p_w, header["spec"], info)
                    except BaseException as exc:  # noqa: BLE001 - report and leave
                        try:
                            write_frame(c2p_w, {"error": "crashed", "detail": f"{type(exc).__name__}: {str(exc)[:300]}"})
                        except OSError:
                            pass
                    finally:
                        os._exit(0)
                os.close(p2c_r)
                os.close(c2p_w)
                children[cid] = {"pid": pid, "rfd": c2p_r, "wfd": p2c_w}
                write_frame(out_fd, {"id": cid, "event": "forked", "pid": pid})
            elif op == "to" and cid in children:
                try:
                    write_frame(children[cid]["wfd"], header, blobs)
                except OSError:
                    reap(cid)
            elif op == "end" and cid in children:
                try:
                    os.close(children[cid]["wfd"])
                    children[cid]["wfd"] = os.open(os.devnull, os.O_WRONLY)
                except OSError:
                    pass
        for cid, ch in list(children.items()):
            if ch["rfd"] in ready:
                try:
                    msg = read_frame(ch["rfd"])
                except (FrameError, OSError):
                    msg = None
                if msg is None:
                    reap(cid)
                    continue
                header, blobs = msg
                write_frame(out_fd, {**header, "id": cid, "event": "reply"}, blobs)
    for cid, ch in list(children.items()):
        try:
            os.killpg(ch["pid"], signal.SIGKILL)
        except OSError:
            pass
        reap(cid)


# --- the parent's side -----------------------------------------------------------------------------------


class ChildFailed(Exception):
    """The child died or ran past its time: ``error`` is 'crashed' or 'timeout'."""

    def __init__(self, error: str, detail: str):
        super().__init__(f"{error}: {detail}")
        self.error = error
        self.detail = detail


class Child:
    """One forked child, talked to through the zygote."""

    def __init__(self, zygote: "Zygote", cid: str, pid: int):
        self.zygote, self.id, self.pid = zygote, cid, pid
        self.replies: queue.Queue = queue.Queue()
        self.exit_code: int | None = None
        self.hello: dict = {}

    def call(self, header: dict, blobs: list[bytes] = (), timeout: float = 600.0) -> tuple[dict, list[bytes]]:
        """Send one job and wait for its answer; on overrun the child's process group is killed."""
        self.zygote.send({**header, "op": "to", "id": self.id}, list(blobs))
        try:
            item = self.replies.get(timeout=timeout)
        except queue.Empty:
            self.kill()
            raise ChildFailed("timeout", f"no answer within {timeout:.0f} s; the child's process group was killed") from None
        if item is None:
            raise ChildFailed("crashed", f"the child exited (code {self.exit_code}) before answering")
        return item

    def kill(self) -> None:
        for fn in (lambda: os.killpg(self.pid, signal.SIGKILL), lambda: os.kill(self.pid, signal.SIGKILL)):
            try:
                fn()
            except OSError:
                pass

    def end(self, timeout: float = 10.0) -> None:
        """Close the child's input; kill it if it has not left within ``timeout``."""
        self.zygote.send({"op": "end", "id": self.id})
        deadline = time.monotonic() + timeout
        while self.exit_code is None and time.monotonic() < deadline:
            time.sleep(0.02)
        if self.exit_code is None:
            self.kill()


class Zygote:
    """The clean, preloaded process that forks sandboxed children; one per judgement."""

    def __init__(self, env: dict[str, str], cwd: Path, startup_timeout: float = 300.0, stderr: Any = None,
                 child: str = DEFAULT_CHILD):
        if not all(p.isidentifier() for p in child.split(".")):
            raise ValueError(f"Zygote(child={child!r}): a dotted module name")
        self.proc = subprocess.Popen([sys.executable, "-m", "kernels.sandbox", child], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=stderr if stderr is not None else subprocess.DEVNULL,
                                     cwd=str(cwd), env=env, start_new_session=True)
        self._lock = threading.Lock()
        self._children: dict[str, Child] = {}
        self._forked: dict[str, queue.Queue] = {}
        self._ready: queue.Queue = queue.Queue()
        self._n = 0
        threading.Thread(target=self._pump, daemon=True).start()
        try:
            ok = self._ready.get(timeout=startup_timeout)
        except queue.Empty:
            ok = False
        if not ok:
            self.close()
            raise ChildFailed("crashed", "the sandbox zygote did not start (python -m kernels.sandbox)")

    def _pump(self) -> None:
        fd = self.proc.stdout.fileno()  # type: ignore[union-attr]
        first = True
        while True:
            try:
                msg = read_frame(fd)
            except (FrameError, OSError):
                msg = None
            if msg is None:
                break
            header, blobs = msg
            if first:
                first = False
                self._ready.put(header.get("event") == "ready")
                continue
            cid, event = str(header.get("id", "")), header.get("event")
            if event == "forked" and cid in self._forked:
                self._forked[cid].put(int(header["pid"]))
            elif event == "reply" and cid in self._children:
                self._children[cid].replies.put((header, blobs))
            elif event == "exit" and cid in self._children:
                ch = self._children[cid]
                ch.exit_code = int(header.get("code", 0))
                ch.replies.put(None)
        if first:
            self._ready.put(False)
        for ch in list(self._children.values()):
            if ch.exit_code is None:
                ch.exit_code = -1
            ch.replies.put(None)

    def send(self, header: dict, blobs: list[bytes] = ()) -> None:
        with self._lock:
            try:
                write_frame(self.proc.stdin.fileno(), header, blobs)  # type: ignore[union-attr]
            except OSError as exc:
                raise ChildFailed("crashed", f"the sandbox zygote is gone: {exc}") from None

    def fork(self, spec: dict, timeout: float = 120.0) -> Child:
        """A new child confined by ``spec`` (see ``enter_child`` and ``kernels.candidate.child_main``);
        its first message (``hello``: how it was confined, violations while importing) is on ``.hello``."""
        self._n += 1
        cid = f"c{self._n}"
        q: queue.Queue = queue.Queue()
        child = Child(self, cid, 0)
        self._forked[cid] = q
        self._children[cid] = child
        self.send({"op": "fork", "id": cid, "spec": spec})
        try:
            child.pid = q.get(timeout=timeout)
        except queue.Empty:
            raise ChildFailed("crashed", "the zygote did not fork a child") from None
        finally:
            self._forked.pop(cid, None)
        try:
            hello = child.replies.get(timeout=timeout)
        except queue.Empty:
            child.kill()
            raise ChildFailed("timeout", f"the child did not start within {timeout:.0f} s") from None
        if hello is None:
            raise ChildFailed("crashed", f"the child exited while starting (code {child.exit_code})")
        child.hello = hello[0]
        if hello[0].get("error"):
            child.end()
            raise ChildFailed(hello[0]["error"], str(hello[0].get("detail", "")))
        return child

    def close(self) -> None:
        for ch in list(self._children.values()):
            if ch.exit_code is None:
                ch.kill()
        try:
            self.send({"op": "quit"})
        except ChildFailed:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass
            self.proc.wait()

    def __enter__(self) -> "Zygote":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def compiler_tools() -> list[str]:
    """The executables a sandboxed child may run: the Triton wheel's ptxas, cuobjdump and nvdisasm (and
    whatever TRITON_*_PATH names), the C compiler and ldconfig Triton's driver build uses on a GPU host,
    and nvidia-smi (the device identity every timing records)."""
    import shutil

    import triton

    bin_dir = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    out = [str(p) for p in bin_dir.glob("*")] if bin_dir.is_dir() else []
    for var in ("TRITON_PTXAS_PATH", "TRITON_CUOBJDUMP_PATH", "TRITON_NVDISASM_PATH"):
        if os.environ.get(var):
            out.append(os.environ[var])
    for exe in ("cc", "gcc", "clang", "ldconfig", "/sbin/ldconfig", "nvidia-smi"):
        p = shutil.which(exe) or (exe if os.path.isabs(exe) and os.path.exists(exe) else None)
        if p:
            out.append(p)
    return out


if __name__ == "__main__":
    # run the importable module's zygote (not this __main__ copy), so the audit hook and the children's
    # harness share one record of refusals
    from kernels.sandbox import DEFAULT_CHILD as _DEFAULT
    from kernels.sandbox import zygote_main as _main

    _main(sys.argv[1] if len(sys.argv) > 1 else _DEFAULT)
