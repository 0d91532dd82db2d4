"""kernel_source_review on a planted diff in a throwaway git repository (the real repository is never touched).

The repository in tmp_path holds a copy of kernels/ and tests/test_gemm.py, committed; then two planted bugs
in kernels/gemm.py: a mask off by one (``offs_m < M`` -> ``offs_m <= M``) and the alignment hints of the AOT
compile dropped (which changes the real sm_90 compile statistics). Offline, the review must give the
compile-stat deltas and say no model reviewed it; against the scripted server, findings with file and line,
the one outside the diff flagged, and no key anywhere.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import dagster as dg
import pytest
from review_helpers import HINTS_NEW, HINTS_OLD, REPO, git

from kernel_assets.constants import SPECS_PARTITIONS
from kernel_assets.review import (
    ASSET_NAME,
    CHECK_NAME,
    ReviewError,
    build_review_assets,
    load_state,
    parse_findings,
    parse_unified_diff,
    render_slices,
    run_review,
)
from kernel_assets.specs_resource import SpecStore
from kregress.core.spec import load_spec
from kregress.testing.fake_gateway import FakeOpenAI, Reply
from resources.ledger import Ledger, LedgerResource
from resources.taotoken import TaotokenResource

KEY = "sk" "-REVIEWCANARY-0123456789abcdef"
MASK_OLD = "mask_m = offs_m[:, None] < M"
MASK_NEW = "mask_m = offs_m[:, None] <= M"


def make_repo(root: Path) -> Path:
    repo = root / "repo"
    shutil.copytree(REPO / "kernels", repo / "kernels", ignore=shutil.ignore_patterns("__pycache__"))
    (repo / "tests").mkdir()
    shutil.copy(REPO / "tests" / "test_gemm.py", repo / "tests" / "test_gemm.py")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    gemm = repo / "kernels" / "gemm.py"
    src = gemm.read_text()
    assert MASK_OLD in src and HINTS_OLD in src, "kernels/gemm.py changed: update the planted diff"
    gemm.write_text(src.replace(MASK_OLD, MASK_NEW).replace(HINTS_OLD, HINTS_NEW))
    return repo


def line_of(path: Path, needle: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if needle in line)


@pytest.fixture(scope="session")
def compile_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("review-compile-cache")  # shared: the same sources compile once per session


@pytest.fixture
def env(tmp_path, monkeypatch, compile_cache):
    home = tmp_path / "dagster_home"
    home.mkdir()
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.setenv("KREGRESS_REVIEW_CACHE", str(compile_cache))
    for var in ("TAOTOKEN_KEY_REVIEW", "TAOTOKEN_API_KEY", "TAOTOKEN_KEY_SUGGEST", "TAOTOKEN_KEY_REPORT", "KREGRESS_REVIEW_REPO"):
        monkeypatch.delenv(var, raising=False)
    return home


@pytest.fixture
def spec():
    return load_spec(REPO / "specs" / "gemm_smoke.yaml")


# --- pure parts ------------------------------------------------------------------------------------------


def test_diff_lines_are_new_side_numbers_and_slices_stay_per_file(tmp_path):
    repo = make_repo(tmp_path)
    (fd,) = parse_unified_diff(git(repo, "diff", "HEAD", "--", "kernels/"))
    gemm = repo / "kernels" / "gemm.py"
    mask_line, hints_line = line_of(gemm, MASK_NEW), line_of(gemm, HINTS_NEW)
    assert fd.path == "kernels/gemm.py" and fd.status == "modified" and len(fd.hunks) == 2
    assert fd.changed_lines() == {mask_line, hints_line}
    assert {mask_line - 3, mask_line + 3} <= fd.lines_in_diff()  # context lines may be cited
    assert 5 not in fd.lines_in_diff()
    whole = render_slices(fd, 100_000)
    assert len(whole) == 1 and f"{mask_line:>5} +    {MASK_NEW}" in whole[0] and f"      -    {MASK_OLD}" in whole[0]
    parts = render_slices(fd, 600)  # one hunk per slice when they do not fit together
    assert len(parts) == 2 and MASK_NEW in parts[0] and HINTS_NEW in parts[1] and HINTS_NEW not in parts[0]


def test_model_findings_are_validated_and_lines_outside_the_diff_flagged(tmp_path):
    repo = make_repo(tmp_path)
    (fd,) = parse_unified_diff(git(repo, "diff", "HEAD", "--", "kernels/"))
    mask_line = line_of(repo / "kernels" / "gemm.py", MASK_NEW)
    text = "```json\n" + json.dumps([
        {"checklist_item": "masks_boundaries", "risk": "High", "file": "gemm.py", "line": mask_line,
         "evidence": f"<= lets row M load out of bounds; key {KEY}", "verify_command": "python -m pytest tests/test_gemm.py -q"},
        {"checklist_item": "numerics", "risk": "low", "file": "kernels/gemm.py", "line": 5, "evidence": "docstring", "verify_command": "rm -rf /tmp/x"},
        {"checklist_item": "style", "risk": "low", "file": "kernels/gemm.py", "line": mask_line, "evidence": "not a checklist item"},
        {"checklist_item": "interface", "risk": "medium", "file": "kernels/other.py", "line": 3, "evidence": "elsewhere"},
        "not an object",
    ]) + "\n```"
    found, notes = parse_findings(text, fd, lambda s: s.replace(KEY, "<review#abcd>"))
    assert [f.checklist_item for f in found] == ["masks_boundaries", "numerics", "interface"]
    first, second, third = found
    assert (first.file, first.line, first.risk, first.in_diff, first.flag) == ("kernels/gemm.py", mask_line, "high", True, "")
    assert KEY not in first.evidence and "<review#abcd>" in first.evidence
    assert second.in_diff is False and "line 5 is outside the diff" in second.flag and "not a read-only check" in second.flag
    assert third.in_diff is False and "outside this slice" in third.flag
    assert any("checklist_item" in n for n in notes) and any("str" in n for n in notes)
    assert parse_findings("I think it looks fine.", fd, str)[0] == []


def test_git_problems_say_what_to_do(tmp_path, env, spec, monkeypatch):
    with pytest.raises(ReviewError, match="not a git repository.*repo_dir"):
        run_review(spec, repo_dir=tmp_path, home=env)
    repo = make_repo(tmp_path)
    with pytest.raises(ReviewError, match="base_ref 'no-such-branch' is not a commit.*git fetch"):
        run_review(spec, repo_dir=repo, base_ref="no-such-branch", home=env)
    monkeypatch.setattr("kernel_assets.review.diff.shutil.which", lambda name: None)
    with pytest.raises(ReviewError, match="git is not installed"):
        run_review(spec, repo_dir=repo, home=env)


# --- offline: compile-stat deltas, test coverage, no model -----------------------------------------------


def test_offline_review_gives_compile_deltas_and_says_no_model_reviewed_it(tmp_path, env, spec):
    repo = make_repo(tmp_path)
    (repo / "kernels" / "mla_decode.py").write_text((repo / "kernels" / "mla_decode.py").read_text() + "\n# unrelated edit\n")
    r = run_review(spec, repo_dir=repo, no_model_reason="no TAOTOKEN key for role review", home=env)
    assert r.reviewed_by.startswith("no model reviewed this (no TAOTOKEN key for role review)") and not r.model_reviewed
    assert r.files_reviewed == ["kernels/gemm.py"] and r.files_changed_elsewhere == ["kernels/mla_decode.py"]
    cd = r.compile
    assert cd is not None and cd.base is not None and cd.base.ok and cd.new.ok
    rows = {row["metric"]: row for row in cd.rows}
    # the dropped alignment hints are visible in the real sm_90 compile: no cp.async, more registers
    assert rows["regs_per_thread"]["delta"] > 0 and rows["sass.async_copy"]["base"] > 0 and rows["sass.async_copy"]["new"] == 0
    offline = {(f.checklist_item, f.risk) for f in r.findings}
    assert ("interface", "medium") in offline and ("smem_registers", "medium") in offline
    assert all(f.source == "offline" and f.line is None and f.file == "kernels/gemm.py" for f in r.findings)
    assert any("test_interpreter_matches_float64_reference" in t for t in r.coverage["numerics"])
    assert r.coverage["splitk_reduction"] == []  # gemm has no split-K test: reported as uncovered
    report = Path(r.report_path)
    assert report == env / "reports" / "gemm_smoke" / "review.md"
    text = report.read_text()
    assert "no model reviewed this" in text and "| regs_per_thread |" in text and "| splitk_reduction | **none** |" in text
    assert load_state(env, "gemm_smoke", repo.resolve())["last_reviewed"] == git(repo, "rev-parse", "HEAD")


# --- the asset, against the scripted server ---------------------------------------------------------------


def materialize(repo: Path, srv: FakeOpenAI, ledger_path: Path, instance: dg.DagsterInstance) -> dg.ExecuteInProcessResult:
    resources = {
        "specs": SpecStore(specs_dir=str(REPO / "specs"), extra_files=[]),
        "taotoken": TaotokenResource(base_url=srv.root, model_id=srv.models[0], read_timeout_s=10.0, max_attempts=1),
        "ledger": LedgerResource(url=str(ledger_path)),
    }
    return dg.materialize(build_review_assets(), partition_key="gemm_smoke", instance=instance, resources=resources,
                          run_config={"ops": {ASSET_NAME: {"config": {"repo_dir": str(repo)}}}}, raise_on_error=True)


def test_asset_reviews_the_planted_diff_with_the_scripted_model(tmp_path, env, monkeypatch):
    monkeypatch.setenv("TAOTOKEN_KEY_REVIEW", KEY)
    repo = make_repo(tmp_path)
    gemm = repo / "kernels" / "gemm.py"
    mask_line, hints_line = line_of(gemm, MASK_NEW), line_of(gemm, HINTS_NEW)
    answer = json.dumps([
        {"checklist_item": "masks_boundaries", "risk": "high", "file": "kernels/gemm.py", "line": mask_line,
         "evidence": "offs_m <= M keeps row M: loads and stores one row past the end of A and C",
         "verify_command": "python -m pytest tests/test_gemm.py -q -k float64_reference"},
        {"checklist_item": "interface", "risk": "medium", "file": "kernels/gemm.py", "line": hints_line,
         "evidence": "M, N, K and strides no longer declared divisible by 16", "verify_command": "kregress sweep specs/gemm_smoke.yaml"},
        {"checklist_item": "numerics", "risk": "low", "file": "kernels/gemm.py", "line": 2, "evidence": "docstring claim", "verify_command": ""},
    ])
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(SPECS_PARTITIONS.name, ["gemm_smoke"])
    ledger_path = tmp_path / "ledger.sqlite"
    with FakeOpenAI() as srv:
        srv.handler = lambda seen: Reply(content=answer)
        res = materialize(repo, srv, ledger_path, instance)
        chats = srv.chat_requests()
        # one slice (one file) -> one call; the prompt holds the checklist and this file's diff only
        assert len(chats) == 1 and chats[0].token == KEY
        prompt = chats[0].body["messages"][1]["content"]
        assert MASK_NEW in prompt and MASK_OLD in prompt and f"{mask_line:>5} +" in prompt
        assert all(item in prompt for item in ("numerics", "masks_boundaries", "splitk_reduction", "fallback", "evidence"))
        assert "class Family" not in prompt and "def mla_decode" not in prompt  # never the whole repository
        assert "regs/thread" in prompt  # the offline compile facts ride along

        mats = res.asset_materializations_for_node(ASSET_NAME)
        md = mats[0].metadata
        assert md["model_reviewed"].value is True and md["reviewed_by"].value.startswith("model kregress-test-model (review#")
        records = [r.data for r in md["findings"].records]
        model_rows = {(r["checklist_item"], r["line"], r["in_diff"]) for r in records if r["source"] == "model"}
        assert model_rows == {("masks_boundaries", str(mask_line), "yes"), ("interface", str(hints_line), "yes"), ("numerics", "2", "NO")}
        assert any(r["source"] == "offline" for r in records)
        assert md["n_outside_diff"].value == 1
        assert "kregress sweep specs/gemm_smoke.yaml" in md["suggested_commands"].value
        check = res.get_asset_check_evaluations()[0]
        assert check.check_name == CHECK_NAME and not check.passed
        assert "1 finding(s) cite a line outside the diff" in check.description

        report = (env / "reports" / "gemm_smoke" / "review.md").read_text()
        assert f"kernels/gemm.py:{mask_line}" in report and "outside the diff" in report
        rows = Ledger(ledger_path).usage.rows()
        assert [(r.role, r.task, r.status) for r in rows] == [("review", ASSET_NAME, "ok")]
        first_head = git(repo, "rev-parse", "HEAD")

        # commit the change: the next review diffs against the remembered revision, then there is nothing left
        git(repo, "commit", "-qam", "planted")
        res2 = materialize(repo, srv, ledger_path, instance)
        md2 = res2.asset_materializations_for_node(ASSET_NAME)[0].metadata
        assert md2["diff"].value.startswith(f"last reviewed {first_head[:10]}")
        assert len(srv.chat_requests()) == 1  # same slice, same prompt: served from the response cache
        res3 = materialize(repo, srv, ledger_path, instance)
        md3 = res3.asset_materializations_for_node(ASSET_NAME)[0].metadata
        assert md3["reviewed_by"].value.startswith("nothing to review") and md3["n_findings"].value == 0
        assert res3.get_asset_check_evaluations()[0].passed

    for f in [*env.rglob("*"), ledger_path]:
        if f.is_file():
            assert KEY.encode() not in f.read_bytes(), f"key found in {f}"
    assert KEY not in json.dumps({k: str(v.value) for k, v in md.items()})


def test_cli_review_offline_and_bad_base(dagster_home, capsys):
    from kernel_assets.cli import main

    spec = str(Path(__file__).resolve().parent.parent / "specs" / "gemm_smoke.yaml")
    assert main(["review", spec, "--base", "HEAD", "--offline"]) == 0
    out = capsys.readouterr()
    report = dagster_home / "reports" / "gemm_smoke" / "review.md"
    assert str(report) in out.out and "nothing to review" in report.read_text()
    assert main(["review", spec, "--base", "no-such-ref-xyz", "--offline"]) == 1
    assert "no-such-ref-xyz" in capsys.readouterr().err
