"""The review's base side compiles with the base revision's own code, in a temporary git worktree.

A throwaway repository (tmp_path; the real one is never touched) holds copies of ``kernels/`` and ``kregress/``
with this history:

  c0  kernels without kernels/worker.py              (predates the worker protocol)
  cB  worker added; kernels/gemm.py imports a name nobody defines      (cannot compile)
  c1  kregress/core/family.py defines ``legacy_tile_rule``, kernels/gemm.py imports it   (the old API)
  c2  the API moved: ``legacy_tile_rule`` gone from both; gemm's alignment hints dropped (real compile deltas)
  c3  an unrelated edit to kernels/mla_decode.py

The new side (the working tree at c3) cannot import c1's gemm.py, and c1's gemm.py cannot be compiled against
the new kregress: only a worker running in c1's own tree gets both right. Real AOT compiles for sm_90 (no GPU):
two in the module (c1 and c2), the rest are cache hits on the module's compile cache.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from review_helpers import HINTS_NEW, HINTS_OLD, REPO, commit_all, git, worktrees

from kernel_assets.review import run_review
from kregress.core.spec import load_spec

API_IMPORT = "from kregress.core.family import CompileUnit, Rule, Space, TritonFamily, register\n"
LEGACY = "\n\ndef legacy_tile_rule(config, params, limits):\n    \"\"\"The old API: gone in c2.\"\"\"\n    return True\n"


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    root = tmp_path_factory.mktemp("review-worktree")
    repo = root / "repo"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO / "kernels", repo / "kernels", ignore=ignore)
    shutil.copytree(REPO / "kregress", repo / "kregress", ignore=ignore)
    gemm, family, worker = repo / "kernels" / "gemm.py", repo / "kregress" / "core" / "family.py", repo / "kernels" / "worker.py"
    src, fam_src, worker_src = gemm.read_text(), family.read_text(), worker.read_text()
    assert API_IMPORT in src and HINTS_OLD in src, "kernels/gemm.py changed: update the planted history"
    git(repo, "init", "-q")
    worker.unlink()
    shas = {"c0": commit_all(repo, "c0: kernels before the worker protocol")}
    worker.write_text(worker_src)
    gemm.write_text(src.replace(API_IMPORT, API_IMPORT + "from kregress.core.family import no_such_helper  # noqa: F401\n"))
    shas["cB"] = commit_all(repo, "cB: gemm imports a name nobody defines")
    family.write_text(fam_src + LEGACY)
    gemm.write_text(src.replace(API_IMPORT, API_IMPORT + "from kregress.core.family import legacy_tile_rule  # noqa: F401\n"))
    shas["c1"] = commit_all(repo, "c1: gemm on the old API")
    family.write_text(fam_src)
    gemm.write_text(src.replace(HINTS_OLD, HINTS_NEW))
    shas["c2"] = commit_all(repo, "c2: API moved, alignment hints dropped")
    mla = repo / "kernels" / "mla_decode.py"
    mla.write_text(mla.read_text() + "\n# unrelated edit\n")
    shas["c3"] = commit_all(repo, "c3: unrelated mla edit")
    return repo, shas


@pytest.fixture(scope="module")
def compile_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("review-worktree-compile-cache")


@pytest.fixture
def env(tmp_path, monkeypatch, compile_cache):
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text((REPO / "dagster_home" / "dagster.yaml").read_text())
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.setenv("KREGRESS_REVIEW_CACHE", str(compile_cache))
    for var in ("TAOTOKEN_KEY_REVIEW", "TAOTOKEN_API_KEY", "KREGRESS_REVIEW_REPO"):
        monkeypatch.delenv(var, raising=False)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))  # where the base worktree goes: checked empty after
    return home, scratch


@pytest.fixture
def spec():
    return load_spec(REPO / "specs" / "gemm_smoke.yaml")


def assert_worktree_removed(repo: Path, scratch: Path) -> None:
    assert worktrees(repo) == 1
    assert list(scratch.iterdir()) == []


def test_cli_offline_review_against_an_older_api_compiles_both_sides(history, env, monkeypatch, capsys):
    from kernel_assets.cli import main

    repo, shas = history
    home, scratch = env
    monkeypatch.setenv("KREGRESS_REVIEW_REPO", str(repo))
    spec_file = str(REPO / "specs" / "gemm_smoke.yaml")
    # a clean checkout, first review: the CLI says which commit it compares with
    assert main(["review", spec_file, "--offline"]) == 0
    out = capsys.readouterr().out
    assert f"diff: before {shas['c2'][:10]} (last commit touching the kernel: c2: API moved" in out and f"({shas['c1'][:10]})" in out
    assert main(["review", spec_file, "--offline", "--base", shas["c1"]]) == 0
    assert f"diff: {shas['c1']} ({shas['c1'][:10]}) -> working tree; no model reviewed this" in capsys.readouterr().out
    report = (home / "reports" / "gemm_smoke" / "review.md").read_text()
    assert f"- base {shas['c1'][:10]}: compiles" in report and "- new (working tree): compiles" in report
    assert "| regs_per_thread |" in report and "| sass.async_copy |" in report
    assert "Traceback" not in report and "legacy_tile_rule" not in report
    assert_worktree_removed(repo, scratch)


def test_base_side_uses_its_own_modules_and_gives_real_deltas(history, env, spec):
    repo, shas = history
    home, scratch = env
    r = run_review(spec, repo_dir=repo, base_ref=shas["c1"], home=home, no_model_reason="offline test")
    cd = r.compile
    assert cd is not None and cd.base is not None and cd.base.ok and cd.new.ok, (cd.base, cd.new)
    assert cd.base.note == "" and cd.base.space_check is None  # c1's worker answered describe from c1's files
    rows = {row["metric"]: row for row in cd.rows}
    # the dropped alignment hints are visible in the real sm_90 compile: no cp.async, more registers
    assert rows["regs_per_thread"]["delta"] > 0 and rows["sass.async_copy"]["base"] > 0 and rows["sass.async_copy"]["new"] == 0
    assert r.files_reviewed == ["kernels/gemm.py"] and "kernels/mla_decode.py" in r.files_changed_elsewhere
    assert_worktree_removed(repo, scratch)


def test_clean_checkout_compares_with_the_last_commit_touching_the_kernel(history, env, spec):
    repo, shas = history
    home, scratch = env
    assert git(repo, "status", "--porcelain") == ""
    r = run_review(spec, repo_dir=repo, home=home, no_model_reason="offline test")
    # c3 touched only mla_decode.py: the last commit touching gemm.py is c2, compared with its parent c1
    assert r.base_sha == shas["c1"] and r.base_ref.startswith(f"before {shas['c2'][:10]}")
    assert any(shas["c2"][:10] in n and "c2: API moved" in n for n in r.notes), r.notes
    assert r.files_reviewed == ["kernels/gemm.py"] and r.compile is not None and r.compile.rows
    text = Path(r.report_path).read_text()
    assert f"before {shas['c2'][:10]}" in text and "the last commit that touched them" in text
    assert_worktree_removed(repo, scratch)


@pytest.mark.parametrize("base, why", [("c0", "predates the worker protocol"), ("cB", "cannot import name 'no_such_helper'")])
def test_a_base_that_cannot_compile_is_one_line_and_the_new_side_still_comes(history, env, spec, base, why):
    repo, shas = history
    home, scratch = env
    r = run_review(spec, repo_dir=repo, base_ref=shas[base], home=home, no_model_reason="offline test")
    cd = r.compile
    assert cd is not None and cd.base is not None and not cd.base.ok and why in cd.base.detail
    assert "\n" not in cd.base.detail and "Traceback" not in cd.base.detail
    assert cd.new.ok and cd.new.stats and cd.rows == []
    assert any(n.startswith(f"the base revision {shas[base][:10]} could not be compiled") for n in r.notes)
    text = Path(r.report_path).read_text()
    assert "**does not compile**" in text and "- new (working tree): compiles" in text and "Traceback" not in text
    assert_worktree_removed(repo, scratch)
