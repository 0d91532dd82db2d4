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
