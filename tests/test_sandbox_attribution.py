"""Who did it: the sandbox blames the candidate only for what its editable code does. The family's fixed
code in the same file (make_inputs reading its own values, the reference) acts for whoever called it: the
harness when the harness calls it, the candidate when the candidate's wrapper does."""

from __future__ import annotations

import sys

from kernels import sandbox

FAMILY_FILE = '''
import triton


def make_inputs():
    return probe()


def reference():
    return make_inputs()


@triton.jit
def kernel(x):
    pass


def launch():
    return make_inputs()


def launch_direct():
    return probe()


def launch_lambda():
    return (lambda: probe())()
'''


def _load(tmp_path, wrappers):
    path = tmp_path / "fam.py"
    path.write_text(FAMILY_FILE)
    watch = sandbox.watched_files([str(path)], wrappers if wrappers is None else {str(path): wrappers})
    ns = {"__name__": "fam", "probe": lambda: sandbox.initiated_by(watch, (), depth=2)}
    sys.modules.setdefault("triton", __import__("triton"))
    exec(compile(FAMILY_FILE, str(path), "exec"), ns)  # code objects carry the watched file name
    return ns, watch


def test_fixed_code_acts_for_its_caller(tmp_path):
    ns, watch = _load(tmp_path, ["launch", "launch_direct", "launch_lambda"])
    spans = watch[str(tmp_path / "fam.py")]
    assert spans is not None and len(spans) == 4  # the jit kernel and the three wrappers
    assert ns["make_inputs"]() is False  # the harness asked for inputs
    assert ns["reference"]() is False  # fixed code calling fixed code: still the harness
    assert ns["launch"]() is True  # the candidate's wrapper reached the reads through make_inputs
    assert ns["launch_direct"]() is True
    assert ns["launch_lambda"]() is True  # a lambda inside a wrapper is the wrapper's


def test_no_wrapper_list_blames_every_function(tmp_path):
    ns, watch = _load(tmp_path, None)
    assert watch[str(tmp_path / "fam.py")] is None
    assert ns["make_inputs"]() is True and ns["launch"]() is True


def test_fixed_rules_hold_without_attribution(tmp_path):
    """The child's own rules, with no candidate file watched (so nothing is refused for who did it): writes
    outside its roots, other processes' /proc entries and environ, sockets and programs are refused."""
    import subprocess

    code = f'''
import os, socket, subprocess, sys
from kernels import sandbox
sandbox.install_audit_hook([{str(tmp_path / "work")!r}], [], allow_ctypes=False)
def attempt(what, fn):
    try:
        fn()
        print(what, "ALLOWED")
    except PermissionError as exc:
        print(what, "refused:", exc)
attempt("write", lambda: open({str(tmp_path / "escape")!r}, "w"))
attempt("environ", lambda: open(f"/proc/{{os.getppid()}}/environ").read())
attempt("socket", lambda: socket.socket().connect(("127.0.0.1", 9)))
attempt("program", lambda: subprocess.run(["true"]))
'''
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=str(sandbox.Path(sandbox.__file__).resolve().parents[1]))
    lines = dict(line.split(" ", 1) for line in out.stdout.strip().splitlines())
    assert set(lines) == {"write", "environ", "socket", "program"}, out.stdout + out.stderr
    assert lines["write"].startswith("refused: sandbox: write to") and not (tmp_path / "escape").exists()
    assert lines["environ"].startswith("refused: sandbox: read of /proc/")
    assert lines["socket"].startswith("refused: sandbox: socket.")
    assert lines["program"].startswith("refused: sandbox: subprocess")
