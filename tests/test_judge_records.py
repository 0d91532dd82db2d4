"""A judgement keeps its own record and a sweep keeps its own (issue 32): sweep then judge and judge then
sweep on one spec leave both intact, byte for byte; three judges one at a time leave three records and an
index of them; the "unchanged" answer checks the report it names. A patch already applied to the working
tree exits 2 with one line, and `--base HEAD` judges it against the committed file, the tree untouched.
Everything runs as a user runs it: the CLI in a subprocess, real compiles and interpreter checks."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
REDTEAM = REPO / "tests" / "redteam"
SPEC = "specs/gemm_smoke.yaml"


def cli(args: list[str], home: Path, cwd: Path = REPO, extra_env: dict | None = None,
        timeout: float = 900) -> subprocess.CompletedProcess:
    env = {**os.environ, "DAGSTER_HOME": str(home), **(extra_env or {})}
    return subprocess.run([sys.executable, "-m", "kernel_assets.cli", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=timeout)


def shas(folder: Path) -> dict[str, str]:
    """sha256 of every file of one record (the judge/ folder of a task is not the sweep's record)."""
    return {str(f.relative_to(folder)): hashlib.sha256(f.read_bytes()).hexdigest()
            for f in sorted(folder.rglob("*")) if f.is_file() and "judge" not in f.relative_to(folder).parts}


def test_sweep_and_judges_keep_their_own_records(tmp_path, monkeypatch):
    home = tmp_path / "home"
    task = home / "reports" / "gemm_smoke"
    # judge, then sweep: the sweep leaves the judgement alone
    j1 = cli(["judge", SPEC, str(REDTEAM / "gemm_legit_even_k.patch")], home)
    assert j1.returncode == 0, j1.stderr[-3000:]
    (first,) = [d for d in (task / "judge").iterdir() if d.is_dir()]
    first_shas = shas(first)
    assert (first / "report.md").read_text().startswith("# kregress judge: gemm_smoke")
    assert not (task / "report.md").exists()  # a judge writes no sweep file
    s = cli(["sweep", SPEC], home)
    assert s.returncode == 0, s.stderr[-3000:]
    assert shas(first) == first_shas
    sweep_shas = shas(task)
    assert (task / "report.md").read_text().startswith("# kregress sweep: gemm_smoke")
    # sweep, then two more judges one at a time: three records, the sweep's files untouched
    for patch in ("gemm_cheat_loosen_tolerance.patch", "gemm_legit_acc_plus_dot.patch"):
        j = cli(["judge", SPEC, str(REDTEAM / patch)], home)
        assert j.returncode == 0, j.stderr[-3000:]
    assert shas(task) == sweep_shas and shas(first) == first_shas
    records = sorted(d for d in (task / "judge").iterdir() if d.is_dir())
    assert len(records) == 3
    judged = [json.loads((d / "judgement.json").read_text())["verdicts"][0]["variant_id"] for d in records]
    assert sorted(judged) == ["gemm_cheat_loosen_tolerance", "gemm_legit_acc_plus_dot", "gemm_legit_even_k"]
    index = (task / "judge" / "index.md").read_text()
    assert all(f"[{d.name}]({d.name}/report.md)" in index for d in records)
    assert "`gemm_cheat_loosen_tolerance`: REGRESS rejected" in index
    # the "unchanged" answer names the sweep's report, and that report is still the one it describes
    again = cli(["sweep", SPEC], home)
    assert again.returncode == 0 and "unchanged since run" in again.stderr, again.stderr[-2000:]
    assert f"report: {task / 'report.md'}" in again.stdout
    # a report that is no longer the one the record describes is not vouched for: the sweep would run again
    import argparse

    from kernel_assets import cli as kcli
    from kregress.core.spec import load_spec

    monkeypatch.setenv("DAGSTER_HOME", str(home))  # as the subprocesses had it (the fingerprint reads the environment)
    args = argparse.Namespace(force=False, backend=None, strategy=None, env=None)
    spec = load_spec(REPO / SPEC)
    assert kcli._unchanged(home, spec, args) is not None
    (task / "report.md").write_text((task / "report.md").read_text() + "\nedited by hand\n")
    assert kcli._unchanged(home, spec, args) is None
    assert len([d for d in (task / "judge").iterdir() if d.is_dir()]) == 3 and shas(first) == first_shas


def test_an_already_applied_patch_exits_2_and_base_head_judges_it(tmp_path):
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    patch = (REDTEAM / "gemm_legit_even_k.patch").read_text()
    mine = tmp_path / "mine.patch"
    mine.write_text(patch)
    subprocess.run(["git", "apply", str(mine)], cwd=clone, check=True)  # the user's edit, then `git diff > mine.patch`
    gemm = clone / "kernels" / "gemm.py"
    edited = hashlib.sha256(gemm.read_bytes()).hexdigest()
    status = subprocess.run(["git", "status", "--porcelain"], cwd=clone, capture_output=True, text=True).stdout
    env = {"PYTHONSAFEPATH": "1", "PYTHONPATH": str(clone)}  # the clone's code, as its own checkout would run it
    home = tmp_path / "home"
    p = cli(["judge", SPEC, str(mine)], home, cwd=clone, extra_env=env)
    assert p.returncode == 2, p.stderr[-3000:]
    assert p.stdout == ""
    (line,) = [x for x in p.stderr.splitlines() if x.startswith("error:")]
    assert "is already applied to kernels/gemm.py" in line and "--base HEAD" in line and "git stash" in line
    assert not (home / "reports").exists()  # nothing was judged
    b = cli(["judge", SPEC, str(mine), "--base", "HEAD"], home, cwd=clone, extra_env=env)
    assert b.returncode == 0, b.stderr[-3000:]
    (verdict,) = b.stdout.strip().splitlines()
    assert verdict.startswith("mine NEEDS_REVIEW -:"), verdict  # correct, on a model estimate: not "does not apply"
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=clone, capture_output=True, text=True).stdout.strip()
    (record,) = (home / "reports" / "gemm_smoke" / "judge").glob("*/judgement.json")
    assert json.loads(record.read_text())["base"] == f"HEAD ({head[:10]})"
    assert hashlib.sha256(gemm.read_bytes()).hexdigest() == edited  # the working tree is untouched
    assert subprocess.run(["git", "status", "--porcelain"], cwd=clone, capture_output=True, text=True).stdout == status
    bad = cli(["judge", SPEC, str(mine), "--base", "no-such-ref"], home, cwd=clone, extra_env=env)
    assert bad.returncode == 2 and "--base no-such-ref: no such commit" in bad.stderr
