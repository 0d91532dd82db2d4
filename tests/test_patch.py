"""Unified diffs (kregress.core.patch): parsing as git writes them, strict apply with a checked revert,
the editable region of real families, temporary copies, SEARCH/REPLACE blocks. No Triton, no process."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from kregress.core.family import get_family
from kregress.core.patch import (
    NotAPatch,
    PatchApplyError,
    PatchFormatError,
    apply_and_check,
    apply_file,
    check_region,
    editable_set,
    editable_source_text,
    materialize,
    parse_patch,
    read_sources,
    search_replace_to_diff,
    unified_diff,
)

REPO = Path(__file__).resolve().parents[1]
REDTEAM = REPO / "tests" / "redteam"


def git_diff(tmp_path: Path, path: str, old: str, new: str) -> str:
    """What `git diff` writes for one edited file (a real git, in a scratch repository)."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    repo = tmp_path / "repo"
    f = repo / path
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text(old)
    run = lambda *a: subprocess.run(["git", "-C", str(repo), *a], check=True, capture_output=True, text=True).stdout  # noqa: E731
    run("init", "-q")
    run("-c", "user.email=t@t", "-c", "user.name=t", "add", ".")
    run("-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "base")
    f.write_text(new)
    return run("diff")


def test_git_diff_round_trip(tmp_path):
    old = "".join(f"line {i}\n" for i in range(1, 40))
    new = old.replace("line 3\n", "line three\n").replace("line 30\n", "line 30\nline 30b\n").replace("line 39\n", "")
    text = git_diff(tmp_path, "pkg/mod.py", old, new)
    p = parse_patch(text)
    assert [f.path for f in p.files] == ["pkg/mod.py"]
    assert (p.added_lines, p.removed_lines, p.changed_lines) == (2, 2, 4)
    applied = apply_and_check(p, {"pkg/mod.py": old})
    assert applied.new_texts["pkg/mod.py"] == new
    assert applied.round_trip_ok and applied.patch_sha256 == p.sha256


def test_no_newline_at_end_and_offsets(tmp_path):
    old = "a\nb\nc\n"
    new = "a\nb\nc"  # drops the final newline
    text = git_diff(tmp_path, "m.py", old, new)
    assert "No newline at end of file" in text
    assert apply_and_check(parse_patch(text), {"m.py": old}).new_texts["m.py"] == new
    # a hunk still applies when lines were inserted above it (an offset, as git apply allows) ...
    base = "".join(f"x{i}\n" for i in range(20))
    d = unified_diff("m.py", base, base.replace("x15\n", "y15\n"))
    assert apply_file("top\n" * 4 + base, parse_patch(d).files[0]) == "top\n" * 4 + base.replace("x15\n", "y15\n")
    # ... but never with fuzz: a changed context line is an error naming the line
    with pytest.raises(PatchApplyError) as err:
        apply_file(base.replace("x14\n", "z14\n"), parse_patch(d).files[0])
    assert err.value.file == "m.py" and err.value.line == 13


@pytest.mark.parametrize("text,why", [
    ("", "empty"), ("hello world\nno diff here\n", "no unified diff"), ("\x00\x01binary", "binary"),
    ("--- a/x\n+++ b/x\n", "no unified diff"),
])
def test_not_a_patch(text, why):
    with pytest.raises(NotAPatch, match=why):
        parse_patch(text)


def test_malformed_hunk_is_a_format_error():
    with pytest.raises(PatchFormatError, match="fewer than its header counts"):
        parse_patch("--- a/m.py\n+++ b/m.py\n@@ -1,3 +1,3 @@\n a\n-b\n+B\nnot a hunk line\n")
    with pytest.raises(PatchFormatError, match="ends early"):
        parse_patch("--- a/m.py\n+++ b/m.py\n@@ -1,3 +1,3 @@\n a\n-b\n")


def test_plain_diff_u_format_and_statuses():
    p = parse_patch("--- m.py\t2024-01-01 00:00:00\n+++ m.py\t2024-01-02 00:00:00\n@@ -1 +1 @@\n-a\n+b\n")
    assert p.files[0].path == "m.py" and p.files[0].status == "modified"
    new = parse_patch("diff --git a/n.py b/n.py\nnew file mode 100644\n--- /dev/null\n+++ b/n.py\n@@ -0,0 +1 @@\n+x\n")
    assert new.files[0].status == "added"
    ren = parse_patch("diff --git a/a.py b/b.py\nsimilarity index 100%\nrename from a.py\nrename to b.py\n")
    assert ren.files[0].status == "renamed"


def test_the_revert_must_give_the_original_back():
    old = "a\nb\n"
    p = parse_patch(unified_diff("m.py", old, "a\nB\n"))
    assert apply_and_check(p, {"m.py": old}).round_trip_ok
    with pytest.raises(PatchApplyError, match="no such file"):
        apply_and_check(p, {"other.py": old})


def gemm_set():
    fam = get_family("gemm")
    es = editable_set(fam)
    return fam, es, read_sources(es)


def test_editable_set_of_a_builtin_family():
    fam, es, texts = gemm_set()
    assert es.root == REPO
    assert set(es.files) == {"kernels/gemm.py", "kernels/tiles.py"}
    assert es.wrappers == {"kernels/gemm.py": ("matmul",), "kernels/tiles.py": ()}
    assert es.packages() == ["kernels"]
    # the gate's kernel hash is the family's (one implementation), over the texts a patch applies to:
    # the texts as on disk give the family's hash; a comment changes nothing, a changed kernel line does
    over = lambda t: fam.source_hash({es.files[rel]: v for rel, v in t.items()})  # noqa: E731
    assert over(texts) == fam.source_hash()
    gemm = texts["kernels/gemm.py"]
    assert over({**texts, "kernels/gemm.py": gemm.replace("def gemm_kernel(", "# a comment\ndef gemm_kernel(", 1)}) == fam.source_hash()
    assert over({**texts, "kernels/gemm.py": gemm.replace("acc = tl.dot(a, b, acc)", "acc = tl.dot(b, a, acc)", 1)}) != fam.source_hash()
    shown = editable_source_text(es, texts, max_chars=100_000)
    assert "def gemm_kernel(" in shown and "def matmul(" in shown and "def grouped_pid(" in shown
    assert "def reference(" not in shown and "def tolerance(" not in shown
    assert len(editable_source_text(es, texts, max_chars=2000)) <= 2000


def first_changed_line(p) -> tuple[str, int]:
    """(file, line) of a patch's first removed (old side) or else added (new side) line."""
    fp = p.files[0]
    removed = [n for h in fp.hunks for n, _ in h.removed_old_lines()]
    return fp.path, (removed[0] if removed else [n for h in fp.hunks for n, _ in h.added_new_lines()][0])


@pytest.mark.parametrize("name", ["gemm_cheat_loosen_tolerance", "gemm_cheat_edit_harness", "gemm_cheat_cache_module_dict"])
def test_outside_the_region_names_file_and_line(name):
    _, es, texts = gemm_set()
    p = parse_patch((REDTEAM / f"{name}.patch").read_text())
    pre = check_region(es, p, texts, {})
    if p.files[0].path in es.files:
        assert pre == []
        found = check_region(es, p, texts, {**texts, **apply_and_check(p, texts).new_texts})
    else:
        found = pre
    assert found and found[0].rule == "outside_region"
    assert (found[0].file, found[0].line) == first_changed_line(p)


def test_region_blank_and_comment_lines_outside_are_free_but_code_is_not():
    _, es, texts = gemm_set()
    g = texts["kernels/gemm.py"]
    for new, ok in ((g.replace("@triton.jit\ndef gemm_kernel(", "# the kernel\n\n@triton.jit\ndef gemm_kernel("), True),
                    (g.replace("@triton.jit\ndef gemm_kernel(", "X = 1\n@triton.jit\ndef gemm_kernel("), False),
                    (g.replace('"""DeepGEMM-like', '"""Fast DeepGEMM-like'), False)):
        p = parse_patch(unified_diff("kernels/gemm.py", g, new))
        found = check_region(es, p, texts, {**texts, "kernels/gemm.py": new})
        assert (found == []) is ok, [f.text() for f in found]


def test_size_cap():
    _, es, texts = gemm_set()
    g = texts["kernels/gemm.py"]
    new = g.replace("    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)\n",
                    "    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)\n" + "    acc = acc * 1\n" * 61)
    p = parse_patch(unified_diff("kernels/gemm.py", g, new))
    assert [f.rule for f in check_region(es, p, texts, {}, max_changed_lines=60)] == ["size"]
    assert check_region(es, p, texts, {}, max_changed_lines=61) == []


def test_corpus_patches_apply_to_the_current_kernels():
    """Every red-team patch, of both sets, applies cleanly (its verdict must come from the gate, not from a
    stale diff): an edit to a kernel file's lines that patches carry as context breaks this first."""
    for fam_name in ("gemm", "attention"):
        es = editable_set(get_family(fam_name))
        texts = read_sources(es)
        for f in sorted(REDTEAM.glob(f"{fam_name}_*.patch")) + sorted((REDTEAM / "independent").glob(f"{fam_name}_*.patch")):
            p = parse_patch(f.read_text())
            if all(fp.path in es.files for fp in p.files):
                apply_and_check(p, texts)


def test_materialize_copies_and_never_writes_the_tree(tmp_path):
    _, es, texts = gemm_set()
    before = (REPO / "kernels" / "gemm.py").read_text()
    p = parse_patch((REDTEAM / "gemm_legit_even_k.patch").read_text())
    new = {**texts, **apply_and_check(p, texts).new_texts}
    root = materialize(es, new, tmp_path / "copy")
    assert (root / "kernels" / "gemm.py").read_text() == new["kernels/gemm.py"] != before
    assert (root / "kernels" / "tiles.py").read_text() == texts["kernels/tiles.py"]
    assert (root / "kernels" / "measure.py").is_file()
    assert (REPO / "kernels" / "gemm.py").read_text() == before


def test_search_replace_blocks_become_the_same_diff():
    _, es, texts = gemm_set()
    blocks = ("kernels/gemm.py\n<<<<<<< SEARCH\n        acc = tl.dot(a, b, acc)\n=======\n"
              "        acc += tl.dot(a, b)\n>>>>>>> REPLACE\n")
    diff = search_replace_to_diff(blocks, texts)
    mine, gits = parse_patch(diff), parse_patch((REDTEAM / "gemm_legit_acc_plus_dot.patch").read_text())
    assert [(f.path, [(h.old_start, h.new_start, h.lines) for h in f.hunks]) for f in mine.files] == \
        [(f.path, [(h.old_start, h.new_start, h.lines) for h in f.hunks]) for f in gits.files]
    applied = apply_and_check(parse_patch(diff), texts)
    assert "acc += tl.dot(a, b)" in applied.new_texts["kernels/gemm.py"]
    with pytest.raises(ValueError, match="occurs 0 times"):
        search_replace_to_diff("kernels/gemm.py\n<<<<<<< SEARCH\nnot there\n=======\nx\n>>>>>>> REPLACE", texts)
    with pytest.raises(ValueError, match="not an editable file"):
        search_replace_to_diff("kernels/measure.py\n<<<<<<< SEARCH\nx\n=======\ny\n>>>>>>> REPLACE", texts)


@pytest.mark.parametrize("shift", [-7, 9])
def test_a_hunk_that_applies_off_its_stated_line_is_judged_where_it_applies(shift):
    """A diff made against an older copy of the kernel (its hunks a few lines off, as git apply allows):
    the region check looks at the lines the hunks really touch, not at the stated numbers."""
    import re

    _, es, texts = gemm_set()
    text = (REDTEAM / "gemm_legit_even_k.patch").read_text()
    shifted = re.sub(r"^@@ -(\d+),(\d+) \+(\d+),(\d+) @@",
                     lambda m: f"@@ -{int(m[1]) + shift},{m[2]} +{int(m[3]) + shift},{m[4]} @@", text, flags=re.M)
    assert shifted != text
    p = parse_patch(shifted)
    new_texts = {**texts, **apply_and_check(p, texts).new_texts}
    assert check_region(es, p, texts, new_texts) == []
    cheat = parse_patch(re.sub(r"^@@ -(\d+),(\d+) \+(\d+),(\d+) @@",
                               lambda m: f"@@ -{int(m[1]) + shift},{m[2]} +{int(m[3]) + shift},{m[4]} @@",
                               (REDTEAM / "gemm_cheat_loosen_tolerance.patch").read_text(), flags=re.M))
    found = check_region(es, cheat, texts, {**texts, **apply_and_check(cheat, texts).new_texts})
    where = texts["kernels/gemm.py"].splitlines().index(next(t for h in cheat.files[0].hunks for k, t in h.lines if k == "-")) + 1
    assert found and found[0].rule == "outside_region" and found[0].line == where
