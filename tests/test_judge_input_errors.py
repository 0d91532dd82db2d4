"""Input errors are errors, never verdicts (issue 55): for every family kind, `kregress judge` refuses a file that
is not a diff, a truncated diff, a patch that does not apply, and a config with a value the space does not allow
or an unknown key, with exit 2 and one line naming the file, the field and the fix, before anything is judged
(no judgement folder, nothing on stdout). The CLI's own entry point (argparse, ``cmd_judge``) runs in this
process for each case; one case runs as a real subprocess for the exit status a shell sees."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kregress.core.cuda_source import find_nvcc
from kregress.core.family import FAMILIES
from kregress.core.patch import unified_diff

REPO = Path(__file__).resolve().parents[1]
PLUGIN = "kr_inputerr"


def _kinds():
    cuda = pytest.mark.skipif(find_nvcc() is None, reason="no nvcc on this host: a CUDA spec does not bind here")
    return [
        pytest.param("triton", id="triton"),
        pytest.param("cuda", id="cuda", marks=cuda),
        pytest.param("external", id="external"),
        pytest.param("plugin", id="plugin"),
    ]


@pytest.fixture
def kind_case(request, tmp_path, monkeypatch):
    """(spec path, package root, editable file, a line in its editable region, a tunable and a value it refuses)."""
    kind = request.param
    if kind == "triton":
        return REPO / "specs" / "gemm_smoke.yaml", REPO, "kernels/gemm.py", "def matmul(", ("BLOCK_M", 3)
    if kind == "cuda":
        return (REPO / "specs" / "gemm_fp8_cuda_h100.yaml", REPO, "kernels/cuda/gemm_fp8_cuda.cu", "constexpr int CHUNKS",
                ("BLOCK_M", 3))
    if kind == "external":
        return REPO / "specs" / "torch_sdpa_h100.yaml", REPO, "kernels/torch_sdpa.py", "def make_inputs(", ("backend", 7)
    from kernel_assets.cli_family import scaffold

    root = tmp_path / PLUGIN
    scaffold(PLUGIN, root)
    monkeypatch.syspath_prepend(str(root))
    spec = root / "specs" / f"{PLUGIN}.yaml"
    data = yaml.safe_load(spec.read_text())
    data["kernel_family"] = f"kregress_{PLUGIN}.family:FAMILY"
    spec.write_text(yaml.safe_dump(data, sort_keys=False))
    request.addfinalizer(lambda: FAMILIES.pop(data["kernel_family"], None))
    return spec, root, f"kregress_{PLUGIN}/family.py", "pid = tl.program_id(0)", ("BLOCK_M", 3)


def comment_patch(root: Path, rel: str, anchor: str) -> str:
    old = (root / rel).read_text()
    lines = old.splitlines(keepends=True)
    i = next(n for n, t in enumerate(lines) if anchor in t)
    lead = "//" if rel.endswith(".cu") else "#"
    new = "".join(lines[: i + 1] + [f"    {lead} a comment only\n"] + lines[i + 1:])
    return unified_diff(rel, old, new)


def judge_in_process(args: list[str], home: Path, monkeypatch, capsys) -> tuple[int, str, str]:
    from kernel_assets.cli import COMMAND_ENV, main

    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.setenv(COMMAND_ENV, "kregress")  # main() sets it; monkeypatch puts it back
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "1")
    rc = main(["judge", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


CASES = ["not_a_diff", "truncated", "does_not_apply", "bad_value", "unknown_key"]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("kind_case", _kinds(), indirect=True)
def test_input_error_exits_2_with_one_line_before_judging(kind_case, case, tmp_path, monkeypatch, capsys):
    spec, root, rel, anchor, (key, bad) = kind_case
    good = comment_patch(root, rel, anchor)
    patch = tmp_path / f"{case}.patch"
    args = [str(spec)]
    if case == "not_a_diff":
        patch.write_text("Please make the kernel faster.\n")
        want = ["not a patch"]
    elif case == "truncated":
        patch.write_text("".join(good.splitlines(keepends=True)[:-2]))
        want = ["malformed or truncated", "ends early", "Fix:"]
    elif case == "does_not_apply":
        lines = good.splitlines(keepends=True)
        ctx = next(n for n, t in enumerate(lines) if t.startswith(" ") and t.strip())
        lines[ctx] = " " + lines[ctx][1:].rstrip("\n") + " /* not in the source */\n"
        patch.write_text("".join(lines))
        want = ["does not apply to", rel, "Fix:"]
    patch.write_text(patch.read_text() if patch.exists() else good)
    if case == "bad_value":
        cfg = tmp_path / "cfg.json"
        cfg.write_text(json.dumps({key: bad}))
        args.append(f"{patch}:{cfg}")
        want = [str(cfg), f"{key}={bad}", "is not allowed", "Fix:"]
    elif case == "unknown_key":
        args += [str(patch), "--config", json.dumps({"NOT_A_TUNABLE": 1})]
        want = ["--config", "unknown NOT_A_TUNABLE", "Fix:"]
    else:
        args.append(str(patch))
        want.append(str(patch))
    home = tmp_path / "home"
    rc, out, err = judge_in_process(args, home, monkeypatch, capsys)
    assert rc == 2, err
    assert out == ""  # nothing judged
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for w in want:
        assert w in lines[0], (w, lines[0])
    assert not (home / "reports").exists() or not any((home / "reports").rglob("judgement.json"))


def test_a_truncated_diff_exits_2_in_a_real_subprocess(tmp_path):
    good = comment_patch(REPO, "kernels/gemm.py", "def matmul(")
    patch = tmp_path / "cut.patch"
    patch.write_text("".join(good.splitlines(keepends=True)[:-3]))
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path / "home")}
    p = subprocess.run([sys.executable, "-m", "kernel_assets.cli", "judge", "specs/gemm_smoke.yaml", str(patch)], cwd=REPO,
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and p.stdout == "", p.stderr
    assert p.stderr.strip().count("\n") == 0 and str(patch) in p.stderr and "truncated" in p.stderr


def test_what_a_patch_does_is_still_a_verdict_not_an_input_error(tmp_path, monkeypatch):
    """A patch that applies but edits outside the region, or a file that is not the family's, passes the input
    checks: the judgement says REGRESS rejected (``check_inputs`` leaves it alone)."""
    from kernel_assets.judge import PatchArg, check_inputs
    from kregress.core.bind import load_bound

    old = (REPO / "kernels" / "gemm.py").read_text()
    outside = unified_diff("kernels/gemm.py", old, old.replace("def matmul(", "X = 1\n\n\ndef matmul(", 1))
    other = "--- a/tests/conftest.py\n+++ b/tests/conftest.py\n@@ -1,1 +1,1 @@\n-nothing like this\n+here\n"
    patches = [PatchArg(path=tmp_path / "o.patch", text=outside, variant_id="o"),
               PatchArg(path=tmp_path / "t.patch", text=other, variant_id="t")]
    check_inputs(load_bound(REPO / "specs" / "gemm_smoke.yaml"), patches)  # no BadArgument


def test_a_recorded_family_has_nothing_to_patch_exit_2(tmp_path, monkeypatch, capsys):
    """A recorded family (its runs replayed from a file) has no source: a patch to it is an input error."""
    patch = tmp_path / "any.patch"
    patch.write_text(comment_patch(REPO, "kernels/gemm.py", "def matmul("))
    spec = REPO / "specs" / "replay_clblast_rtx3090.yaml"
    rc, out, err = judge_in_process([str(spec), str(patch)], tmp_path / "home", monkeypatch, capsys)
    assert rc == 2 and out == "", err
    assert err.strip().count("\n") == 0 and str(spec) in err and "kernel_family" in err and "(recorded)" in err
