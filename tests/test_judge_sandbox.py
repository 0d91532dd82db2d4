"""The layers behind the static gate, each shown on its own (the static policy switched off, as only a
test can): the sandboxed child (no network, no file writes outside its folder, no other process's
/proc, no subprocess, no credentials in its environment, a time limit that kills its process group),
the aten-op audit, the second call in the same buffers, the input check and the guarded timer.
Real processes, the real interpreter; nothing mocked."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kernels import sandbox
from kernels.candidate import JudgeOptions, judge_patches
from kregress.core.family import get_family
from kregress.core.patch import unified_diff
from kregress.core.records import Suggestion
from kregress.core.spec import load_spec

REPO = Path(__file__).resolve().parents[1]
REDTEAM = REPO / "tests" / "redteam"
GEMM = (REPO / "kernels" / "gemm.py").read_text()
RETURN_C = "    )\n    return c\n\n\nimport sys as _sys"
SECRET = "sk-test-0123456789abcdef-must-not-leak"


def wrapper_patch(code: str) -> str:
    """A patch that runs ``code`` in the launch wrapper just before it returns."""
    new = GEMM.replace(RETURN_C, RETURN_C.replace("    return c\n", code.rstrip("\n") + "\n    return c\n"), 1)
    return unified_diff("kernels/gemm.py", GEMM, new)


ESCAPES = {
    "socket": "    import socket\n    socket.create_connection(('1.1.1.1', 80), timeout=2)\n",
    "file_write": "    open('/tmp/kregress-sandbox-escape', 'w').write('x')\n",
    "parent_environ": "    import os\n    open(f'/proc/{os.getppid()}/environ').read()\n",
    "subprocess": "    import subprocess\n    subprocess.run(['true'])\n",
    "credentials": "    import os\n    if any(k.startswith(('TAOTOKEN', 'OPENAI', 'AWS')) for k in os.environ):\n        c.zero_()\n",
    "hang": "    while True:\n        pass\n",
}
RUNTIME = ["gemm_cheat_torch_matmul", "gemm_cheat_getattr_dispatch", "gemm_cheat_reference_call", "gemm_cheat_cache_by_pointer",
           "gemm_cheat_timer_patch", "gemm_cheat_thread", "gemm_cheat_mutate_inputs_host", "gemm_cheat_frame_peek"]
# from the independent set: what the static policy refuses by name, refused again by what the code does
INDEPENDENT_RUNTIME = ["gemm_cheat_builtins_exec", "gemm_cheat_tolist_alias", "gemm_cheat_inspect_bench_sniff",
                       "gemm_cheat_file_counter", "gemm_cheat_config_memo", "gemm_cheat_str_parse",
                       "gemm_cheat_stale_output_reuse", "gemm_cheat_return_none", "gemm_cheat_nan_poison_sniff"]


@pytest.fixture(scope="module")
def judged(tmp_path_factory):
    spec = load_spec(REPO / "specs" / "gemm_smoke.yaml")
    family = get_family("gemm")
    sugg = [Suggestion(variant_id=n, config=spec.baseline, patch_summary=n, round=1, source="test",
                       patch=(REDTEAM / f"{n}.patch").read_text()) for n in RUNTIME]
    sugg += [Suggestion(variant_id=n, config=spec.baseline, patch_summary=n, round=1, source="test",
                        patch=(REDTEAM / "independent" / f"{n}.patch").read_text()) for n in INDEPENDENT_RUNTIME]
    sugg += [Suggestion(variant_id=f"escape_{n}", config=spec.baseline, patch_summary=n, round=1, source="test",
                        patch=wrapper_patch(code)) for n, code in ESCAPES.items()]
    Path("/tmp/kregress-sandbox-escape").unlink(missing_ok=True)
    with pytest.MonkeyPatch.context() as mp:
        for k in ("TAOTOKEN_API_KEY", "OPENAI_API_KEY", "AWS_SECRET_ACCESS_KEY"):
            mp.setenv(k, SECRET)
        res = judge_patches(spec, family, sugg, backend="interpreter", cache_root=tmp_path_factory.mktemp("cache"),
                            timeout_s=45, log=lambda m: None, options=JudgeOptions(static=False))
    return {row.variant_id: (row, rep) for row, rep in res}


@pytest.mark.parametrize("name,why", [
    ("gemm_cheat_torch_matmul", "aten.mm"),
    ("gemm_cheat_getattr_dispatch", "aten.mm"),
    ("gemm_cheat_reference_call", "aten.mm"),
    ("gemm_cheat_timer_patch", "triton.testing.do_bench was replaced"),
    ("gemm_cheat_thread", "thread"),
])
def test_runtime_audit_rejects_what_the_static_gate_would(judged, name, why):
    row, rep = judged[name]
    assert row.error == "patch_rejected", (row.error, row.error_detail)
    assert why in row.error_detail


def test_second_call_in_the_same_buffers_defeats_a_pointer_cache(judged):
    row, _ = judged["gemm_cheat_cache_by_pointer"]
    assert row.error == "numeric_mismatch" and "2nd call, same buffers" in row.error_detail


def test_changed_inputs_are_wrong(judged):
    row, _ = judged["gemm_cheat_mutate_inputs_host"]
    assert row.error in ("numeric_mismatch", "nan_inf") and "the inputs changed" in row.error_detail


def test_frames_taken_by_the_candidate_are_refused(judged):
    """The frame-peeking cheat is refused at run time (sys._getframe from the candidate's own code). Had it
    looked, it would have found no expected output to copy: the reference lives in another process."""
    row, _ = judged["gemm_cheat_frame_peek"]
    assert row.error == "patch_rejected" and "sys._getframe by the candidate's code" in row.error_detail


@pytest.mark.parametrize("name,error,why", [
    ("gemm_cheat_builtins_exec", "patch_rejected", "compile by the candidate's code"),
    ("gemm_cheat_tolist_alias", "patch_rejected", "read tensor values into Python (tolist)"),
    ("gemm_cheat_inspect_bench_sniff", "patch_rejected", "sys._getframe by the candidate's code"),
    ("gemm_cheat_file_counter", "patch_rejected", "/home/calls by the candidate's code"),
    ("gemm_cheat_config_memo", "patch_rejected", "changed the config or params it was handed"),
    ("gemm_cheat_str_parse", "patch_rejected", "host-side work per element"),
    ("gemm_cheat_nan_poison_sniff", "patch_rejected", "aten._local_scalar_dense"),
    ("gemm_cheat_stale_output_reuse", "numeric_mismatch", "2nd call, same buffers"),
    ("gemm_cheat_return_none", "numeric_mismatch", "NoneType, not a tensor"),
])
def test_runtime_layers_catch_the_independent_cheats(judged, name, error, why):
    """Each caught by what it does, with the static policy off: files, frames, exec and imports from the
    candidate's code are refused; tensor values read into Python and per-element host work are seen; the
    config must come back unchanged; stale finite values (not NaN) in the second call's fresh memory show
    a kernel that reuses what it finds; an output that is no tensor is wrong."""
    row, _ = judged[name]
    assert row.error == error and why in row.error_detail, (row.error, row.error_detail)


@pytest.mark.parametrize("name,why", [("socket", "socket."), ("file_write", "write to /tmp/kregress-sandbox-escape"),
                                      ("parent_environ", "read of /proc/"), ("subprocess", "subprocess")])
def test_sandbox_refuses_escapes(judged, name, why):
    """Refused by the first layer that sees it: what the candidate's own frames do (the socket's import of
    its codec, the open() call), else the child's fixed rules (tests/test_sandbox_attribution.py runs
    those alone)."""
    row, rep = judged[f"escape_{name}"]
    assert row.error == "patch_rejected", (row.error, row.error_detail)
    assert why in row.error_detail or "by the candidate's code" in row.error_detail, row.error_detail
    assert not Path("/tmp/kregress-sandbox-escape").exists()


def test_the_child_holds_no_credentials(judged):
    row, rep = judged["escape_credentials"]
    assert row.error is None and row.correctness.ok, row.error_detail
    assert SECRET not in rep.model_dump_json() and SECRET not in row.model_dump_json()


def test_an_overrun_kills_the_process_group(judged):
    row, _ = judged["escape_hang"]
    assert row.error == "timeout" and "process group was killed" in row.error_detail


def test_environment_allowlist():
    env = sandbox.sandbox_env({"PATH": "/usr/bin", "TAOTOKEN_API_KEY": "k", "OPENAI_API_KEY": "k", "AWS_ACCESS_KEY_ID": "k",
                               "ANTHROPIC_API_KEY": "k", "HOME": "/root", "DAGSTER_HOME": "/x", "LANG": "C.UTF-8",
                               "CUDA_VISIBLE_DEVICES": "0"}, interpret=True, pythonpath=["/p"])
    assert set(env) == {"PATH", "LANG", "CUDA_VISIBLE_DEVICES", "PYTHONPATH", "PYTHONNOUSERSITE",
                        "PYTHONDONTWRITEBYTECODE", "PYTHONWARNINGS", "TRITON_DEFAULT_FP_FUSION", "OMP_NUM_THREADS"}
    assert env["CUDA_VISIBLE_DEVICES"] == "" and env["PYTHONPATH"] == "/p"


def test_frames_carry_tensors_without_pickle():
    import torch

    blobs: list[bytes] = []
    value = {"a": torch.arange(6, dtype=torch.bfloat16).reshape(2, 3), "t": (torch.zeros(0), 3, "x"),
             "f8": torch.ones(4).to(torch.float8_e4m3fn), "i": torch.tensor([1, 2], dtype=torch.int32)}
    back = sandbox.unpack(sandbox.pack(value, blobs), blobs)
    assert torch.equal(back["a"], value["a"]) and back["t"][1:] == (3, "x") and back["t"][0].shape == (0,)
    assert torch.equal(back["f8"].float(), value["f8"].float()) and back["i"].dtype == torch.int32
    with pytest.raises(sandbox.FrameError, match="unknown dtype"):
        sandbox.unpack({"__t": 0, "dtype": "Tensor.__reduce__", "shape": [1]}, [b"\0"])
    r, w = os.pipe()
    os.write(w, b"XXXX\0\0\0\0")
    os.close(w)
    with pytest.raises(sandbox.FrameError, match="magic"):
        sandbox.read_frame(r)
    os.close(r)
