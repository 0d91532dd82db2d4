"""Every command in README.md's fenced bash blocks is run by a test: run here (the cheap ones), run by CI's own
scripts exactly as written (the set-up and test commands, the GPU check's dry run), or mapped to the named tests
that run it. A README command with none of the three fails this module, and so does a mapping whose command has
left the README or whose test no longer exists."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
BIN = Path(sys.executable).parent  # where this environment's kregress lives (.venv/bin in the README)

# run here, in a fresh DAGSTER_HOME (see test_cheap_command_runs)
RUN = {
    ".venv/bin/kregress specs validate specs/*.yaml",
    ".venv/bin/kregress usage",
    ".venv/bin/kregress usage --spec specs/gemm_smoke.yaml",
    "export DAGSTER_HOME=$PWD/dagster_home",
}

# run verbatim by CI's scripts (the README's set-up and test commands, the GPU check's CPU half)
CI = {
    "python3 -m venv .venv && .venv/bin/pip install torch==2.13.0 -e '.[test]' && .venv/bin/python -m pytest -q -n 2 -m \"not long\"": ".ci/run",
    ".venv/bin/python -m pytest -q -n 2 -m long": ".ci/run",
    "bash scripts/fetch_gpu_wheels.sh": "scripts/ci_triton36.sh",
    "bash scripts/gpu_check.sh --dry-run": "scripts/ci_triton36.sh",
}

FIRST_SWEEP = ("python3 -m venv .venv && .venv/bin/pip install torch==2.13.0 -e . && "
               "DAGSTER_HOME=$PWD/dagster_home .venv/bin/kregress sweep specs/gemm_h100_bf16.yaml")

# run by the named tests
TESTS = {
    FIRST_SWEEP: ["tests/test_readme_commands.py::test_the_first_sweep_runs_as_the_readme_shows"],
    ".venv/bin/kregress sweep specs/replay_clblast_rtx3090.yaml": [
        "tests/test_replay_sweep.py::test_replay_sweep_gives_measured_verdicts"],
    ".venv/bin/python -m kregress.core.spec_reference > docs/spec-reference.md": [
        "tests/test_docs_spec_reference.py::test_the_spec_reference_is_current"],
    "kregress judge specs/gemm_smoke.yaml fix.patch other.patch": [
        "tests/test_judge_cli.py::test_judge_lines_tables_diffs_and_clean_tree"],
    "kregress judge specs/gemm_smoke.yaml tiles.patch:config.json": [
        "tests/test_judge_cli.py::test_judge_lines_tables_diffs_and_clean_tree"],
    "git diff > mine.patch && kregress judge specs/gemm_smoke.yaml mine.patch --base HEAD": [
        "tests/test_judge_records.py::test_an_already_applied_patch_exits_2_and_base_head_judges_it"],
    "kregress review specs/gemm_smoke.yaml --patch fix --offline": [
        "tests/test_judge_review.py::test_review_takes_a_judged_patch_by_variant_id"],
    ".venv/bin/kregress sweep specs/gemm_smoke.yaml --strategy hybrid": [
        "tests/test_sweep_llm.py::test_llm_sweep_end_to_end_and_no_key_leaks",
        "tests/test_llm_agent.py::test_hybrid_tops_up_with_local"],
    ".venv/bin/kregress doctor": [
        "tests/test_config_tools.py::test_doctor_without_ping_catches_the_configuration",
        "tests/test_clients_doctor.py::test_keyless_local_workflow_is_fine_for_sweeps"],
    ".venv/bin/dagster dev": ["tests/test_dagster_dev_stop.py::test_dagster_dev_stops_on_sigterm"],
    ".venv/bin/kregress history show gemm_h100_bf16": ["tests/test_history.py::test_show_labels_every_p50_with_its_shape"],
    '.venv/bin/kregress history ack gemm_h100_bf16 --by alice --why "CUDA 13.1 driver, +4% expected"': [
        "tests/test_history.py::test_acknowledged_step_is_the_new_reference"],
    "kregress family new my_rowsum --dir ../my_rowsum": [
        "tests/test_plugins.py::test_plugin_checks_sweeps_and_follows_its_own_source"],
    "pip install -e ../my_rowsum": ["tests/test_plugins.py::test_plugin_checks_sweeps_and_follows_its_own_source"],
    "kregress family check my_rowsum": ["tests/test_plugins.py::test_plugin_checks_sweeps_and_follows_its_own_source"],
    "kregress sweep ../my_rowsum/specs/my_rowsum.yaml": [
        "tests/test_plugins.py::test_plugin_checks_sweeps_and_follows_its_own_source"],
    "kregress family list": ["tests/test_plugins.py::test_family_list_shows_builtins_and_where_they_come_from"],
    "kregress replay import path/to/cache.json.gz --out specs/my_kernel.yaml": [
        "tests/test_replay_import.py::test_import_the_shipped_file"],
    "kregress family new my_cusum --kind cuda --dir ../my_cusum": [
        "tests/test_cuda_family.py::test_scaffolded_cuda_plugin_conforms"],
    "bash scripts/gpu_check.sh": ["tests/test_gpu_check.py::test_the_shell_wrapper_runs_a_part_with_this_python"],
    "bash scripts/gpu_check.sh --rerun-failed PREV/summary.json": [
        "tests/test_gpu_check.py::test_a_part_past_its_limit_is_cut_and_the_rerun_runs_only_what_failed"],
}

COMMENT = re.compile(r"\s{2,}#.*$")


def readme_commands(text: str | None = None) -> list[str]:
    """The commands of README.md's ```bash blocks: one a line, a trailing `  # comment` cut off."""
    text = README.read_text() if text is None else text
    out: list[str] = []
    for block in re.findall(r"^```bash\n(.*?)^```", text, re.S | re.M):
        for line in block.splitlines():
            line = COMMENT.sub("", line).strip()
            if line and not line.startswith("#"):
                out.append(line)
    return out


def test_the_extractor_reads_blocks_and_cuts_comments():
    text = "x\n```bash\nkregress a   # why\n# only a comment\n\nkregress b --c \"d # e\"\n```\n```\nnot bash\n```\n"
    assert readme_commands(text) == ["kregress a", 'kregress b --c "d # e"']


def test_every_readme_command_is_run_or_mapped():
    cmds = readme_commands()
    assert len(cmds) >= 10, cmds
    missing = [c for c in cmds if c not in RUN and c not in CI and c not in TESTS]
    assert not missing, ("README commands that no test runs (add each to RUN, CI or TESTS in "
                         f"tests/test_readme_commands.py, with the test that runs it): {missing}")


def test_every_mapping_is_still_in_the_readme():
    cmds = set(readme_commands())
    stale = [c for c in [*RUN, *CI, *TESTS] if c not in cmds]
    assert not stale, f"tests/test_readme_commands.py maps commands the README no longer shows: {stale}"


def test_the_named_tests_exist():
    gone = []
    for cmd, tests in TESTS.items():
        for t in tests:
            path, name = t.split("::")
            f = REPO / path
            if not f.is_file() or not re.search(rf"^def {re.escape(name)}\(", f.read_text(), re.M):
                gone.append(f"{t} (for `{cmd}`)")
    assert not gone, f"tests named for README commands are gone: {gone}"


def test_ci_runs_the_readme_commands_verbatim():
    for cmd, script in CI.items():
        assert cmd in (REPO / script).read_text(), f"{script} no longer runs the README's `{cmd}` as written"
    ci = (REPO / ".ci" / "run").read_text()
    assert ci.index('-m "not long"') < ci.index("-m long") < ci.index("\nbash scripts/ci_triton36.sh"), \
        ".ci/run runs the default tier, then the long tier, then the Triton 3.6 job"


def _run(cmd: str, home: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "DAGSTER_HOME": str(home), "PWD": str(REPO)}
    for k in [k for k in env if k.startswith(("TAOTOKEN_", "KREGRESS_SPEC"))]:
        env.pop(k)
    cmd = cmd.replace(".venv/bin/", f"{BIN}/")
    return subprocess.run(["bash", "-c", cmd], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("cmd", sorted(RUN))
def test_cheap_command_runs(cmd, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    p = _run(cmd, home)
    assert p.returncode == 0, (cmd, p.stdout[-2000:], p.stderr[-2000:])
    if "specs validate" in cmd:
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith("specs/")]
        assert len(lines) == len(list((REPO / "specs").glob("*.yaml"))), p.stdout
        assert all(": ok (" in ln for ln in lines), p.stdout
    if cmd.startswith(".venv/bin/kregress usage"):
        assert "no model calls recorded yet" in p.stdout + p.stderr


@pytest.mark.slow
def test_the_first_sweep_runs_as_the_readme_shows(tmp_path):
    """The first set-up command's sweep (the install is CI's own first step), in a fresh DAGSTER_HOME."""
    assert FIRST_SWEEP in README.read_text()
    sweep = FIRST_SWEEP.rsplit("&& ", 1)[1].replace("$PWD/dagster_home", str(tmp_path / "home"))
    if shutil.which("kregress", path=str(BIN)) is None:
        pytest.skip(f"no kregress beside {sys.executable}: pip install -e .")
    p = _run(sweep, tmp_path / "home", timeout=900)
    assert p.returncode == 0, (p.stdout[-3000:], p.stderr[-3000:])
    report = tmp_path / "home" / "reports" / "gemm_h100_bf16" / "report.md"
    assert report.is_file(), p.stderr[-3000:]
    assert "NEEDS_REVIEW" in p.stdout + p.stderr  # no GPU here: model evidence
    assert "next:" in p.stdout + p.stderr
