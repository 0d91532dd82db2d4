"""The confinement nvcc and the GPU child run under (bubblewrap, kernels/cuda/confine.py), tested by running
real commands in it: files outside the binds do not exist, the environment is only what was allowed, the
network namespace is empty, the wall limit kills; without bwrap nothing of a patch runs. And the GPU
stage's parts a CPU host can check: the case list holds every timed shape, shapes past them and the
structure case; the child's command line is confined; the child itself starts confined and sees no
network (the check a GPU then runs is in tests/test_cuda_gpu_stage.py)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from kernels.cuda import confine

REPO = Path(__file__).resolve().parents[1]
SPEC = REPO / "specs" / "gemm_fp8_cuda_h100.yaml"
needs_bwrap = pytest.mark.skipif(confine.problem() is not None, reason="needs bubblewrap (apt-get install bubblewrap)")


def _run(tmp_path: Path, argv: list[str], **kw) -> subprocess.CompletedProcess:
    return confine.run(argv, ro=[], rw=[tmp_path], env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}, cwd=tmp_path, **kw)


@needs_bwrap
def test_outside_files_do_not_exist(tmp_path):
    secret = Path.home() / ".kregress-confine-test"
    for path in ("/etc/hostname", "/etc/os-release", str(REPO / "README.md"), str(secret)):
        proc = _run(tmp_path, ["/usr/bin/cat", path])
        assert proc.returncode != 0 and "No such file" in proc.stderr, (path, proc.stdout[:80])
    (tmp_path / "mine.txt").write_text("visible")
    assert _run(tmp_path, ["/usr/bin/cat", str(tmp_path / "mine.txt")]).stdout == "visible"


@needs_bwrap
def test_environment_network_and_binds(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-must-not-leak")
    env = _run(tmp_path, ["/usr/bin/env"]).stdout
    assert "sk-must-not-leak" not in env and set(ln.split("=")[0] for ln in env.splitlines()) <= {"PATH", "HOME", "PWD"}
    net = _run(tmp_path, ["/usr/bin/cat", "/proc/net/dev"]).stdout
    assert [ln.split(":")[0].strip() for ln in net.splitlines()[2:]] == ["lo"]
    ro = _run(tmp_path, ["/usr/bin/touch", "/usr/bin/kregress-x"])
    assert ro.returncode != 0  # the system folders are read-only


@needs_bwrap
def test_wall_limit_kills_the_group(tmp_path):
    t0 = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        _run(tmp_path, ["/bin/sh", "-c", "sleep 30 & sleep 30"], limits=confine.Limits(wall_s=1.0))
    assert time.monotonic() - t0 < 15


def test_command_line_is_confined(tmp_path):
    if confine.bwrap_path() is None:
        pytest.skip("needs bubblewrap")
    cmd = confine.command(["/usr/bin/true"], ro=[tmp_path / "src"], rw=[tmp_path], env={"PATH": "/usr/bin"}, cwd=tmp_path)
    assert cmd[0].endswith("prlimit") and any(a.startswith("--cpu=") for a in cmd) and any(a.startswith("--as=") for a in cmd)
    assert any(a.startswith("--fsize=") for a in cmd)
    for flag in ("--unshare-all", "--die-with-parent", "--clearenv", "--new-session"):
        assert flag in cmd
    binds = [cmd[i + 1] for i, a in enumerate(cmd) if a in ("--ro-bind", "--bind")]
    assert "/etc" not in binds and "/" not in binds and str(Path.home()) not in binds and str(REPO) not in binds


def test_no_bwrap_is_one_line_and_refuses(tmp_path, monkeypatch):
    monkeypatch.setenv("KREGRESS_BWRAP", "")
    assert confine.problem() == confine.BWRAP_HINT and "apt-get install bubblewrap" in confine.BWRAP_HINT
    with pytest.raises(confine.ConfinementError, match="apt-get install bubblewrap"):
        _run(tmp_path, ["/usr/bin/true"])


def test_no_bwrap_no_patched_compile(tmp_path, monkeypatch):
    """A patched copy never compiles unconfined: CompileError with the install line, nvcc never run on it."""
    from kernels.compile import CompileError
    from kernels.cuda.gemm_fp8_cuda import FAMILY
    from kernels.cuda.nvcc import compile_unit
    from kregress.core import cuda_source

    if cuda_source.find_nvcc() is None:
        pytest.skip("needs nvcc")
    monkeypatch.setenv("KREGRESS_BWRAP", "")
    (tmp_path / "gemm_fp8_cuda.cu").write_text((REPO / "kernels/cuda/gemm_fp8_cuda.cu").read_text())
    (unit,) = FAMILY.cuda_units({"BLOCK_M": 64, "BLOCK_N": 64, "STAGES": 2, "TM": 4, "TN": 4}, "fp8_e4m3", {})
    with pytest.raises(CompileError, match="apt-get install bubblewrap"):
        compile_unit(FAMILY, unit, "sm_90", source_dir=tmp_path, cache=tmp_path / "cache")


def test_real_nvcc_follows_a_wrapper_script(tmp_path):
    tk = tmp_path / "cuda-13.0" / "bin"
    tk.mkdir(parents=True)
    (tk / "nvcc").write_text("#!/bin/sh\n")
    (tk / "nvcc.profile").write_text("TOP = $(_HERE_)/..\n")
    wrapper = tmp_path / "nvcc"
    wrapper.write_text(f'#!/bin/sh\nexec {tk / "nvcc"} "$@"\n')
    assert confine.real_nvcc(str(wrapper)) == (tk / "nvcc").resolve()
    assert confine.toolkit_root(str(wrapper)) == (tmp_path / "cuda-13.0").resolve()


# --- the GPU stage, as far as a CPU host can check it ------------------------------------------------


def test_gpu_cases_hold_every_timed_shape_and_shapes_past_them():
    from kernels.cuda.gpu_child import gpu_cases
    from kregress.core.bind import load_bound

    bound = load_bound(SPEC)
    spec, family = bound.spec, bound.family
    cases = gpu_cases(family, spec)
    shapes = [c.shape for c in cases]
    for s in spec.shape_matrix:
        assert dict(s) in shapes  # every timed shape is checked on the GPU
    assert all(family.check_shape(s) is None for s in shapes)
    kinds = {c.kind for c in cases}
    assert {"timed", "correctness", "hidden_odd", "past_timed", "large", "structure"} <= kinds
    past_k = {c.shape["K"] for c in cases if c.kind == "past_timed"}
    for k in {s["K"] for s in spec.shape_matrix}:
        assert k + 128 in past_k  # one past every timed K (the family takes K in steps of 128)
    assert any(c.shape["K"] >= 2 * max(s["K"] for s in spec.shape_matrix) for c in cases if c.kind == "large")
    assert {"M": 1, "N": 1, "K": 128} in [c.shape for c in cases if c.kind == "structure"]
    odd = [c.shape for c in cases if c.kind == "hidden_odd"][0]
    assert odd["M"] % 2 == 1 and odd["N"] % 2 == 1
    assert len(shapes) == len({tuple(sorted(s.items())) for s in shapes})


def test_gpu_child_command_is_confined(tmp_path, monkeypatch):
    from kernels.cuda import gpu_child

    if confine.bwrap_path() is None:
        pytest.skip("needs bubblewrap")
    monkeypatch.setattr(gpu_child, "gpu_devices", lambda: ["/dev/nvidia0", "/dev/nvidiactl"])
    cmd, env = gpu_child.child_command(tmp_path, [tmp_path / "copy"], {"PATH": "/usr/bin"})
    for flag in ("--unshare-all", "--die-with-parent", "--clearenv"):
        assert flag in cmd
    assert cmd[cmd.index("--dev-bind") + 1] == "/dev/nvidia0"
    assert not any(a.startswith("--as=") for a in cmd)  # the CUDA driver reserves terabytes of addresses
    binds = [cmd[i + 1] for i, a in enumerate(cmd) if a in ("--ro-bind", "--bind")]
    assert str(REPO / "kernels") in binds and str(REPO) not in binds and "/tmp" not in binds and "/etc" not in binds
    assert cmd[-3:] == [cmd[-3], "-m", "kernels.cuda.gpu_child"]


def test_judge_child_env_has_no_keys(monkeypatch):
    from resources.cuda_judge import child_env

    class Backend:
        def env(self, interpret):
            return {"PATH": "/usr/bin", "OPENAI_API_KEY": "sk-x", "AWS_SECRET_ACCESS_KEY": "y", "HOME": "/root"}

    env = child_env(Backend())
    assert "OPENAI_API_KEY" not in env and "AWS_SECRET_ACCESS_KEY" not in env


@pytest.mark.slow
@needs_bwrap
def test_gpu_child_starts_confined_and_sees_no_network(tmp_path):
    """The real child, started by the command the GPU stage uses (a probe job: no GPU here): its network
    namespace holds only lo, /etc/hostname and the project's README do not exist for it, its environment
    is the allowlist, and it imports the family."""
    from kernels.cuda.gpu_child import PREFIX, child_command

    cmd, _ = child_command(tmp_path, [], {"PATH": "/usr/bin:/bin", "LANG": "C"})
    job = {"op": "probe", "family": "gemm_fp8_cuda", "paths": ["/etc/hostname", str(REPO / "README.md"),
                                                               str(REPO / "kernels" / "__init__.py")]}
    proc = confine.run_prepared(cmd, json.dumps(job), 240)
    (line,) = [ln for ln in proc.stdout.splitlines() if ln.startswith(PREFIX)]
    out = json.loads(line[len(PREFIX):])
    assert out["interfaces"] == ["lo"] and out["family"] == "gemm_fp8_cuda"
    assert out["paths"]["/etc/hostname"] == "FileNotFoundError" and out["paths"][str(REPO / "README.md")] == "FileNotFoundError"
    assert out["paths"][str(REPO / "kernels" / "__init__.py")] == "readable"
    assert not any(k.startswith(("OPENAI", "AWS", "DAGSTER")) for k in out["env"]) and os.environ.get("PATH") is not None


def test_gpu_child_with_a_network_judges_nothing(monkeypatch):
    """A child that sees an interface besides lo (no network namespace) answers 'not judged' before it
    imports torch or touches the GPU."""
    from kernels.cuda import gpu_child

    monkeypatch.setattr(gpu_child, "network_interfaces", lambda: ["lo", "eth0"])
    out = gpu_child.run_job({"op": "check", "family": "gemm_fp8_cuda", "cases": []})
    assert out["error"] == "patch_rejected" and "eth0" in out["detail"] and "not judged" in out["detail"]


def test_run_on_gpu_sends_every_case_and_maps_the_answers(tmp_path, monkeypatch):
    """The GPU stage's plumbing with the one thing a CPU host lacks, the GPU child, answered in its place:
    the job holds every timed shape and the hidden cases, the child gets the patched copy and the cubin cache
    read-only; a failed case is the row's error naming it; a passed one gets the batch's timings."""
    from kernels.cuda.gpu_child import GpuCase
    from kregress.core.bind import load_bound
    from kregress.core.gate import GateReport
    from kregress.core.records import Correctness, Measurement, Suggestion, base_row
    from resources import cuda_judge

    if confine.problem() is not None:
        pytest.skip("needs bubblewrap")
    bound = load_bound(SPEC)
    calls = []

    def fake_child(job, work, ro, env, family_root, timeout):
        calls.append((job, ro, env))
        if job["config"]["BLOCK_M"] == 64:
            bad = Correctness(ok=False, max_abs_err=9.0, max_rel_err=1.0, nan_inf=False, mismatches=1, tolerance=0.01,
                              shapes_checked=["128x7168x2048"], mismatch_sample="[128x7168x2048] 1 of 917504 off")
            return {"correctness": bad.model_dump(), "failed": {"kind": "timed", "shape": {"M": 128, "N": 7168, "K": 2048}}}
        good = Correctness(ok=True, max_abs_err=0.0, max_rel_err=0.0, nan_inf=False, mismatches=0, tolerance=0.01,
                           shapes_checked=["128x7168x2048"])
        m = Measurement(shape="128x7168x2048", samples_ms=[1.0], p50_ms=1.0, tflops=1.0, gbps=1.0, evidence="cuda",
                        device="H100", torch_version="t", triton_version="t").model_dump()
        return {"correctness": good.model_dump(), "batch": {"baseline": [m], "v": [m]}}

    monkeypatch.setattr(cuda_judge, "run_child", fake_child)
    monkeypatch.setattr(cuda_judge, "compile_variant", lambda *a, **k: None)  # the baseline's prebuilt cubin

    class Backend:
        patch_seed, timeout_s, kind = 7, 10, "cuda"

        def cache_root(self):
            return tmp_path / "cache"

        def env(self, interpret):
            return {"PATH": "/usr/bin", "OPENAI_API_KEY": "sk-x"}

    rows = []
    for i, cfg in enumerate((bound.spec.baseline, {**bound.spec.baseline, "BLOCK_M": 128, "TM": 8})):
        r = base_row(Suggestion(variant_id=f"p{i}", config=cfg, patch_summary="t", source="t", round=1, risk="low"), "cuda")
        r.gate = GateReport()
        rows.append(r)
    dirs = [tmp_path / "p0" / "kernels" / "cuda", tmp_path / "p1" / "kernels" / "cuda"]
    for d in dirs:
        d.mkdir(parents=True)
    cuda_judge.run_on_gpu(Backend(), bound, rows, dirs, log=lambda _m: None)
    job, ro, env = calls[0]
    shapes = [c["shape"] for c in job["cases"]]
    assert all(dict(s) in shapes for s in bound.spec.shape_matrix) and job["seed"] == 7
    assert {"past_timed", "large", "structure", "hidden_odd"} <= {c["kind"] for c in job["cases"]}
    assert job["config"][cuda_judge.CUDA_SOURCE_KEY] == str(dirs[0]) and tmp_path / "cache" / "cuda" in ro
    assert "OPENAI_API_KEY" not in env
    assert (rows[0].error, rows[0].error_detail.split(":")[0]) == ("numeric_mismatch", "timed shape 128x7168x2048")
    assert rows[1].error is None and rows[1].evidence == "cuda" and rows[1].measurements
    assert rows[1].gate.cases == len(job["cases"]) and isinstance(GpuCase("timed", {}), GpuCase)
