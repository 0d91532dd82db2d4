"""Candidate patches: unified diffs against a family's editable region (no torch, no Triton).

A candidate patch is a unified diff as ``git diff`` writes it, with paths relative to the root of the
family's package (the project for built-in families, the plugin's root for plugins). This module:

- parses it (``parse_patch``): ``NotAPatch`` when the text is not a diff at all, ``PatchFormatError``
  when it is one but a hunk is malformed;
- applies it strictly to text (``apply_file``): every context and removed line must match, at the
  stated line or shifted by the same offset for the rest of the file (as ``git apply``: offsets, no
  fuzz), and checks the revert (the reversed patch applied to the result gives the original back,
  byte for byte: ``apply_and_check``);
- counts its size (``Patch.changed_lines``: added + removed lines, as ``git diff --shortstat``);
- checks the editable region (``check_region``): a family may be changed only inside its
  ``@triton.jit`` functions (module and ``helper_files``) and its launch wrapper(s); every other line,
  file, mode or rename is refused with the file and line it touches;
- writes the patched (or pristine) package into a temporary copy (``materialize``) so the working
  tree is never modified;
- turns SEARCH/REPLACE blocks (what a model finds easier to write) into the same unified diff
  (``search_replace_to_diff``).

Regions are found by reading the files' AST (``ast``), never by importing them: the candidate's code
is never imported in the process that judges it.
"""

from __future__ import annotations

import ast
import difflib
import hashlib
import re
import shutil
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel

from kregress.core.family import is_jit_def
from kregress.core.source_tree import parse_source

if TYPE_CHECKING:
    from kregress.core.family import Family

DEFAULT_MAX_CHANGED_LINES = 60


class NotAPatch(ValueError):
    """The text is not a unified diff at all (the CLI exits 2 on it)."""


class PatchFormatError(ValueError):
    """A diff whose hunks are malformed (counts that do not add up, a line outside any hunk)."""


class PatchApplyError(ValueError):
    """The patch does not apply to the source it names: ``file``, 1-based ``line`` of the original."""

    def __init__(self, file: str, line: int | None, reason: str):
        super().__init__(f"{file}:{line or '-'}: {reason}")
        self.file = file
        self.line = line
        self.reason = reason


class Finding(BaseModel):
    """One refusal of the patch checks or the static gate: which rule, where, why."""

    rule: str
    file: str
    line: int | None = None
    message: str

    def text(self) -> str:
        return f"{self.file}:{self.line if self.line is not None else '-'}: [{self.rule}] {self.message}"


# --- parsing ---------------------------------------------------------------------------------------


@dataclass
class Hunk:
    old_start: int
    old_len: int
    new_start: int
    new_len: int
    header: str
    # (kind, text): kind " " context, "+" added, "-" removed; text without the newline
    lines: list[tuple[str, str]] = field(default_factory=list)
    old_no_newline: bool = False  # "\ No newline at end of file" after the old side's last line
    new_no_newline: bool = False
    # Where the hunk really applied (1-based first line on each side), once ``apply_file`` placed it: a hunk
    # may sit a few lines off its stated position, and every finding must name the line it really touches.
    applied_old_start: int | None = None
    applied_new_start: int | None = None

    def added_new_lines(self) -> list[tuple[int, str]]:
        """(new-side line number, text) of every added line (where the hunk applied, once it has)."""
        out, n = [], self.applied_new_start or self.new_start
        for kind, text in self.lines:
            if kind == "+":
                out.append((n, text))
            if kind in " +":
                n += 1
        return out

    def removed_old_lines(self) -> list[tuple[int, str]]:
        """(old-side line number, text) of every removed line (where the hunk applied, once it has)."""
        out, n = [], self.applied_old_start or self.old_start
        for kind, text in self.lines:
            if kind == "-":
                out.append((n, text))
            if kind in " -":
                n += 1
        return out

    def reversed(self) -> "Hunk":
        flip = {"+": "-", "-": "+", " ": " "}
        return Hunk(self.new_start, self.new_len, self.old_start, self.old_len,
                    f"@@ -{self.new_start},{self.new_len} +{self.old_start},{self.old_len} @@",
                    [(flip[k], t) for k, t in self.lines], self.new_no_newline, self.old_no_newline)


@dataclass
class FilePatch:
    old_path: str | None  # None: /dev/null (a new file)
    new_path: str | None  # None: /dev/null (a deleted file)
    hunks: list[Hunk] = field(default_factory=list)
    header_line: int = 0  # line of the patch text where this file's section starts (1-based)
    binary: bool = False
    mode_change: bool = False
    renamed: bool = False

    @property
    def path(self) -> str:
        return self.new_path or self.old_path or "?"

    @property
    def status(self) -> Literal["modified", "added", "deleted", "renamed", "binary", "mode"]:
        if self.binary:
            return "binary"
        if self.old_path is None:
            return "added"
        if self.new_path is None:
            return "deleted"
        if self.renamed or self.old_path != self.new_path:
            return "renamed"
        if self.mode_change and not self.hunks:
            return "mode"
        return "modified"

    def reversed(self) -> "FilePatch":
        return FilePatch(self.new_path, self.old_path, [h.reversed() for h in self.hunks], self.header_line,
                         self.binary, self.mode_change, self.renamed)


@dataclass
class Patch:
    text: str
    files: list[FilePatch]

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()

    @property
    def added_lines(self) -> int:
        return sum(1 for f in self.files for h in f.hunks for k, _ in h.lines if k == "+")

    @property
    def removed_lines(self) -> int:
        return sum(1 for f in self.files for h in f.hunks for k, _ in h.lines if k == "-")

    @property
    def changed_lines(self) -> int:
        """Added plus removed lines (``git diff --shortstat``'s insertions + deletions)."""
        return self.added_lines + self.removed_lines


_HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_GIT_RE = re.compile(r"^diff --git (\S+) (\S+)\s*$")


def _strip_prefix(p: str) -> str | None:
    p = p.split("\t", 1)[0].strip()  # `diff -u` appends a tab and a timestamp
    if p == "/dev/null":
        return None
    if p.startswith('"') and p.endswith('"'):
        p = p[1:-1]
    return p[2:] if p.startswith(("a/", "b/")) else p


@lru_cache(maxsize=64)
def parse_patch(text: str) -> Patch:
    """A unified diff -> its files and hunks, parsed once per distinct text (every reader of a judged patch
    shares the one ``Patch``; none changes it).

    ``NotAPatch`` when there is no diff in ``text`` (no ``---``/``+++`` file header with a hunk, no
    ``diff --git`` section); ``PatchFormatError`` when a hunk's line counts do not match its header or
    a line sits outside any hunk."""
    if not isinstance(text, str) or not text.strip():
        raise NotAPatch("the file is empty")
    if "\x00" in text:
        raise NotAPatch("the file is binary, not a unified diff")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    files: list[FilePatch] = []
    cur: FilePatch | None = None
    hunk: Hunk | None = None
    old_left = new_left = 0
    i = 0
    while i < len(lines):
        line = lines[i].rstrip("\r")
        lineno = i + 1
        if hunk is not None and (old_left > 0 or new_left > 0):
            kind = line[:1] if line else " "  # an empty line inside a hunk is an empty context line
            if kind in " +-":
                body = line[1:]
                if kind in " -":
                    old_left -= 1
                if kind in " +":
                    new_left -= 1
                if old_left < 0 or new_left < 0:
                    raise PatchFormatError(f"line {lineno}: hunk {hunk.header!r} has more lines than its header counts")
                hunk.lines.append((kind, body))
                i += 1
                continue
            if kind == "\\":
                _mark_no_newline(hunk)
                i += 1
                continue
            raise PatchFormatError(f"line {lineno}: hunk {hunk.header!r} ends after {len(hunk.lines)} line(s), "
                                   f"fewer than its header counts")
        if line.startswith("\\") and hunk is not None:
            _mark_no_newline(hunk)
            i += 1
            continue
        m = _GIT_RE.match(line)
        if m:
            cur = FilePatch(_strip_prefix(m.group(1)), _strip_prefix(m.group(2)), header_line=lineno)
            files.append(cur)
            hunk = None
            i += 1
            continue
        if line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            old_p, new_p = _strip_prefix(line[4:]), _strip_prefix(lines[i + 1][4:])
            if cur is None or cur.hunks:
                cur = FilePatch(old_p, new_p, header_line=lineno)
                files.append(cur)
            else:  # the ---/+++ pair of a `diff --git` section names the same file (or /dev/null)
                cur.old_path, cur.new_path = old_p, new_p
            hunk = None
            i += 2
            continue
        m = _HUNK_RE.match(line)
        if m:
            if cur is None:
                raise PatchFormatError(f"line {lineno}: a hunk header with no file header (--- a/FILE, +++ b/FILE) before it")
            hunk = Hunk(int(m.group(1)), int(m.group(2)) if m.group(2) is not None else 1,
                        int(m.group(3)), int(m.group(4)) if m.group(4) is not None else 1, line)
            cur.hunks.append(hunk)
            old_left, new_left = hunk.old_len, hunk.new_len
            i += 1
            continue
        if cur is not None:
            if line.startswith(("new file mode", "deleted file mode")):
                if line.startswith("new file mode"):
                    cur.old_path = None
                else:
                    cur.new_path = None
            elif line.startswith(("old mode", "new mode")):
                cur.mode_change = True
            elif line.startswith("rename from ") or line.startswith("copy from "):
                cur.renamed = True
                cur.old_path = line.split(" from ", 1)[1].strip()
            elif line.startswith("rename to ") or line.startswith("copy to "):
                cur.renamed = True
                cur.new_path = line.split(" to ", 1)[1].strip()
            elif line.startswith(("Binary files", "GIT binary patch")):
                cur.binary = True
        i += 1
    if hunk is not None and (old_left > 0 or new_left > 0):
        raise PatchFormatError(f"the last hunk {hunk.header!r} ends early: {old_left} old and {new_left} new line(s) missing")
    if not files or not any(f.hunks or f.binary or f.mode_change or f.renamed or f.old_path is None or f.new_path is None
                            for f in files):
        raise NotAPatch("no unified diff found (expected `diff --git a/FILE b/FILE` or `--- a/FILE` / `+++ b/FILE` "
                        "followed by `@@ -l,n +l,n @@` hunks, as `git diff` writes them)")
    return Patch(text=text, files=files)


def _mark_no_newline(h: Hunk) -> None:
    last = h.lines[-1][0] if h.lines else " "
    if last == "-":
        h.old_no_newline = True
    elif last == "+":
        h.new_no_newline = True
    else:
        h.old_no_newline = h.new_no_newline = True


# --- applying ---------------------------------------------------------------------------------------


def _split_keep(text: str) -> tuple[list[str], bool]:
    """Lines without their newline, and whether the text ends with one."""
    if text == "":
        return [], True
    ends = text.endswith("\n")
    body = text[:-1] if ends else text
    return body.split("\n"), ends


def apply_file(old_text: str, fp: FilePatch) -> str:
    """``old_text`` with ``fp``'s hunks applied. Every context and removed line must match exactly;
    a hunk may sit at a shifted position (the shift is searched outwards from the stated line, as
    ``git apply`` does), never with fuzz. Raises ``PatchApplyError`` naming the line."""
    old, ends = _split_keep(old_text)
    out: list[str] = []
    pos = 0  # next unconsumed index of ``old``
    offset = 0
    for h in fp.hunks:
        want = [t for k, t in h.lines if k in " -"]
        start = (h.old_start - 1 if h.old_len else h.old_start) + offset
        found = _find_block(old, want, start, pos)
        if found is None:
            first = next((t for k, t in h.lines if k in " -"), "")
            raise PatchApplyError(fp.path, h.old_start, f"hunk {h.header.split('@@')[1].strip()} does not match the "
                                  f"source (expected {first.strip()[:60]!r} near line {h.old_start})")
        offset = found - (h.old_start - 1 if h.old_len else h.old_start)
        out.extend(old[pos:found])
        h.applied_old_start, h.applied_new_start = found + 1, len(out) + 1
        out.extend(t for k, t in h.lines if k in " +")
        pos = found + len(want)
    out.extend(old[pos:])
    new_ends = ends
    if fp.hunks:
        last = fp.hunks[-1]
        touches_end = (last.old_start - 1 if last.old_len else last.old_start) + offset + last.old_len >= len(old)
        if touches_end:
            if last.old_no_newline and ends:
                raise PatchApplyError(fp.path, len(old), "the patch says the file has no newline at its end, but it has one")
            new_ends = not last.new_no_newline
    if not out:
        return ""
    return "\n".join(out) + ("\n" if new_ends else "")


def _find_block(old: list[str], want: list[str], start: int, lo: int) -> int | None:
    n = len(want)
    if n == 0:
        return max(lo, min(start, len(old)))
    limit = len(old) - n
    for delta in range(0, len(old) + 1):
        for cand in ((start + delta, start - delta) if delta else (start,)):
            if lo <= cand <= limit and old[cand:cand + n] == want:
                return cand
        if start - delta < lo and start + delta > limit:
            break
    return None


class Applied(BaseModel):
    """A patch applied to text: the patched files, the checked revert, and the hashes stored with the variant."""

    new_texts: dict[str, str]  # path (relative to the family root) -> patched text
    old_texts: dict[str, str]
    round_trip_ok: bool
    patch_sha256: str
    changed_lines: int


def apply_and_check(patch: Patch, old_texts: dict[str, str]) -> Applied:
    """Apply every file of ``patch`` to ``old_texts`` (path -> text; a missing path is an error), then
    apply the reversed patch to the result and require the original back, byte for byte.
    Raises ``PatchApplyError``."""
    new: dict[str, str] = {}
    for fp in patch.files:
        if fp.old_path is None or fp.new_path is None or fp.binary:
            raise PatchApplyError(fp.path, None, f"a {fp.status} file cannot be applied as a kernel edit")
        if fp.old_path not in old_texts:
            raise PatchApplyError(fp.path, None, "no such file in the family's package")
        base = new.get(fp.old_path, old_texts[fp.old_path])
        new[fp.new_path] = apply_file(base, fp)
    back: dict[str, str] = dict(new)
    for fp in reversed(patch.files):
        back[fp.old_path] = apply_file(back[fp.new_path], fp.reversed())  # type: ignore[index]
    for path in new:
        if back[path] != old_texts[path]:
            raise PatchApplyError(path, None, "the revert does not give the original text back")
    return Applied(new_texts=new, old_texts={p: old_texts[p] for p in new}, round_trip_ok=True,
                   patch_sha256=patch.sha256, changed_lines=patch.changed_lines)


def unified_diff(path: str, old: str, new: str) -> str:
    """``git diff``-style text of one file's change (a/ and b/ prefixes, 3 lines of context)."""
    body = difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                fromfile=f"a/{path}", tofile=f"b/{path}", n=3)
    out = []
    for line in body:
        if not line.endswith("\n"):
            line += "\n\\ No newline at end of file\n"
        out.append(line)
    return (f"diff --git a/{path} b/{path}\n" + "".join(out)) if out else ""


# --- the family's editable region ------------------------------------------------------------------


class Region(BaseModel):
    """One editable span of a file: a top-level jit function or launch wrapper, decorators included."""

    file: str
    name: str
    kind: Literal["jit", "wrapper"]
    start: int
    end: int


def regions_of(source: str, file: str, wrappers: tuple[str, ...]) -> list[Region]:
    """The editable spans of ``source``: its top-level ``@triton.jit`` functions and the functions named
    in ``wrappers`` (an empty tuple for a helper file). Raises SyntaxError for unparsable text."""
    tree = parse_source(source)
    out = []
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        start = min([d.lineno for d in node.decorator_list] + [node.lineno])
        if is_jit_def(node):
            out.append(Region(file=file, name=node.name, kind="jit", start=start, end=node.end_lineno or node.lineno))
        elif node.name in wrappers:
            out.append(Region(file=file, name=node.name, kind="wrapper", start=start, end=node.end_lineno or node.lineno))
    return out


@dataclass(frozen=True)
class EditableSet:
    """Where a family's editable code lives: the package root, and per editable file (path relative to
    the root, as a patch names it) the file on disk and the functions a patch may change there (a Python
    file's launch wrappers, a .cu file's kernel_functions)."""

    family: str
    root: Path
    files: dict[str, Path]
    wrappers: dict[str, tuple[str, ...]]
    module_file: str  # the family module, relative to the root

    def packages(self) -> list[str]:
        """Top-level folders (packages) under the root that hold editable files: what a temporary copy needs."""
        return sorted({Path(rel).parts[0] for rel in self.files if len(Path(rel).parts) > 1})


def editable_set(family: "Family") -> EditableSet:
    """The editable files of ``family`` (its kind says which: ``Family.editable_region``), relative to the root
    of its package (the folder that holds the top-level package: the project for built-ins, the plugin's root
    for plugins), each with the functions a patch may change there. Raises ValueError when the family has
    nothing a patch could edit."""
    module = family.module
    mod_file = Path(getattr(module, "__file__", "") or "").resolve()
    mod_name = getattr(module, "__name__", "") or ""
    if not mod_file.name or not mod_name:
        raise ValueError(f"family {family.name!r} has no module file: nothing a patch could edit")
    depth = len(mod_name.split(".")) - (0 if mod_file.name == "__init__.py" else 1)
    root = mod_file.parents[depth] if depth < len(mod_file.parents) else mod_file.parent
    files: dict[str, Path] = {}
    wrappers: dict[str, tuple[str, ...]] = {}
    for f, names in family.editable_region().items():
        f = Path(f).resolve()
        try:
            rel = f.relative_to(root).as_posix()
        except ValueError:
            continue  # a helper outside the package root cannot be named by a patch
        files[rel] = f
        wrappers[rel] = tuple(names)
    if not files:
        raise ValueError(f"family {family.name!r} ({family.kind}) has no source a patch could edit: a {family.kind} family "
                         "is judged by its configs only")
    return EditableSet(family=family.name, root=root, files=files, wrappers=wrappers,
                       module_file=mod_file.relative_to(root).as_posix())


def read_sources(es: EditableSet) -> dict[str, str]:
    """The editable files' text, read once (the snapshot a judgement applies to)."""
    return {rel: p.read_text(encoding="utf-8") for rel, p in es.files.items()}


def _fixed_skeleton(source: str, wrappers: tuple[str, ...]) -> str:
    """The module with every editable function removed: what must not change."""
    tree = parse_source(source)  # shared: the skeleton is a new module, the tree is not changed
    fixed = ast.Module(body=[n for n in tree.body if not (isinstance(n, ast.FunctionDef) and (is_jit_def(n) or n.name in wrappers))],
                       type_ignores=tree.type_ignores)
    return ast.dump(fixed, include_attributes=False)


def _code(line: str) -> bool:
    """A line that is neither blank nor a comment (a comment inside a string literal changes the tree,
    which ``check_region`` compares separately)."""
    t = line.strip()
    return bool(t) and not t.startswith("#")


def check_region(es: EditableSet, patch: Patch, old_texts: dict[str, str], new_texts: dict[str, str],
                 max_changed_lines: int = DEFAULT_MAX_CHANGED_LINES) -> list[Finding]:
    """Every way ``patch`` reaches outside the family's editable region, one finding each (file, line):
    a file that is not one of the family's kernel files, a new / deleted / renamed / binary / mode
    change, a removed line outside a jit function or launch wrapper of the original, an added line
    outside one of the patched file, any change to the fixed code's syntax tree, or more changed lines
    than ``max_changed_lines``. Blank and comment lines outside the region are free: the fixed code's
    syntax tree must stay the same, which any change that matters breaks."""
    out: list[Finding] = []
    if patch.changed_lines > max_changed_lines:
        out.append(Finding(rule="size", file=patch.files[0].path if patch.files else "-", line=None,
                           message=f"{patch.changed_lines} changed lines (added + removed) > patches.max_changed_lines "
                                   f"{max_changed_lines}: split the change or raise the limit in the spec"))
    for fp in patch.files:
        if fp.status != "modified":
            out.append(Finding(rule="outside_region", file=fp.path, line=None,
                               message=f"a {fp.status} file: only the editable files may be modified in place "
                                       f"({', '.join(sorted(es.files))})"))
            continue
        if fp.path not in es.files:
            first = next((n for h in fp.hunks for n, _ in h.removed_old_lines()), fp.hunks[0].old_start if fp.hunks else None)
            out.append(Finding(rule="outside_region", file=fp.path, line=first,
                               message=f"not a kernel file of family {es.family}: a patch may edit only "
                                       f"{', '.join(sorted(es.files))} (jit functions and launch wrappers)"))
            continue
        if fp.path not in new_texts:
            continue
        wrappers = es.wrappers.get(fp.path, ())
        try:
            old_regions = regions_of(old_texts[fp.path], fp.path, wrappers)
        except SyntaxError:
            old_regions = []
        try:
            new_regions = regions_of(new_texts[fp.path], fp.path, wrappers)
        except SyntaxError as exc:
            out.append(Finding(rule="syntax", file=fp.path, line=exc.lineno,
                               message=f"the patched file does not parse: {exc.msg}"))
            continue

        def inside(regs: list[Region], n: int) -> bool:
            return any(r.start <= n <= r.end for r in regs)

        for h in fp.hunks:
            for n, t in h.removed_old_lines():
                if _code(t) and not inside(old_regions, n):
                    out.append(Finding(rule="outside_region", file=fp.path, line=n,
                                       message=f"removes a line outside the jit functions and launch wrappers: {t.strip()[:80]!r}"))
            for n, t in h.added_new_lines():
                if _code(t) and not inside(new_regions, n):
                    out.append(Finding(rule="outside_region", file=fp.path, line=n,
                                       message=f"adds a line outside the jit functions and launch wrappers: {t.strip()[:80]!r}"))
        try:
            same = _fixed_skeleton(old_texts[fp.path], wrappers) == _fixed_skeleton(new_texts[fp.path], wrappers)
        except SyntaxError:
            same = False
        if not same and not any(f.file == fp.path and f.rule == "outside_region" for f in out):
            out.append(Finding(rule="outside_region", file=fp.path, line=None,
                               message="the code outside the jit functions and launch wrappers changed (its syntax tree differs)"))
    return out


# --- temporary copies -------------------------------------------------------------------------------


_SKIP = shutil.ignore_patterns("__pycache__", "*.pyc", ".git", ".venv", "*.egg-info", ".pytest_cache")


def materialize(es: EditableSet, texts: dict[str, str], dest: Path) -> Path:
    """Copy the family's package(s) into ``dest`` and write ``texts`` (path relative to the root ->
    content) over the copies; returns ``dest``, the import root of the copy. The working tree is only read."""
    dest.mkdir(parents=True, exist_ok=True)
    for pkg in es.packages():
        src = es.root / pkg
        if src.is_dir():
            shutil.copytree(src, dest / pkg, ignore=_SKIP, dirs_exist_ok=True)
    for rel in es.files:
        if len(Path(rel).parts) == 1:  # a top-level module beside the packages
            shutil.copy2(es.root / rel, dest / rel)
    for rel, text in texts.items():
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    return dest


# --- SEARCH/REPLACE blocks --------------------------------------------------------------------------

# How a prompt shows a model the block format (the Triton and the CUDA patch prompts alike).
SEARCH_REPLACE_FORMAT = """\
  PATH
  <<<<<<< SEARCH
  exact lines copied from the source
  =======
  the lines to put instead
  >>>>>>> REPLACE
"""

_SR_RE = re.compile(
    r"(?:^|\n)(?P<path>[^\n<>=]*?)\s*\n?<<<<<<< SEARCH\n(?P<search>.*?)(?:\n)?=======\n(?P<replace>.*?)(?:\n)?>>>>>>> REPLACE",
    re.DOTALL,
)


def search_replace_to_diff(blocks: str, sources: dict[str, str], default_path: str | None = None) -> str:
    """SEARCH/REPLACE blocks -> one unified diff (``git diff`` style), as the judge and the gate read.

    Each block is ``PATH`` on its own line (optional when ``default_path`` is given), then
    ``<<<<<<< SEARCH``, the exact lines to find, ``=======``, the lines to put instead,
    ``>>>>>>> REPLACE``. The search text must occur exactly once in the file. Raises ValueError
    naming the block that does not fit."""
    matches = list(_SR_RE.finditer(blocks or ""))
    if not matches:
        raise ValueError("no SEARCH/REPLACE block found (PATH, <<<<<<< SEARCH, lines, =======, lines, >>>>>>> REPLACE)")
    new = dict(sources)
    touched: list[str] = []
    for i, m in enumerate(matches, 1):
        path = (m.group("path") or "").strip().strip("`").strip() or default_path
        if not path:
            raise ValueError(f"block {i}: no file path before <<<<<<< SEARCH")
        path = path[2:] if path.startswith(("a/", "b/")) else path
        if path not in new:
            raise ValueError(f"block {i}: {path} is not an editable file ({', '.join(sorted(sources))})")
        search, replace = m.group("search"), m.group("replace")
        text = new[path]
        count = text.count(search) if search else 0
        if count != 1:
            raise ValueError(f"block {i}: the SEARCH text occurs {count} times in {path}; it must occur exactly once")
        new[path] = text.replace(search, replace, 1)
        if path not in touched:
            touched.append(path)
    return "".join(unified_diff(p, sources[p], new[p]) for p in touched)


def editable_source_text(es: EditableSet, texts: dict[str, str], max_chars: int) -> str:
    """The editable functions, file by file with line numbers, cut at ``max_chars``: what a model sees
    of the kernel when it may propose patches."""
    parts: list[str] = []
    for rel in sorted(texts, key=lambda r: (r != es.module_file, r)):
        lines = texts[rel].splitlines()
        for r in regions_of(texts[rel], rel, es.wrappers.get(rel, ())):
            body = "\n".join(f"{n:>4} {lines[n - 1]}" for n in range(r.start, r.end + 1))
            parts.append(f"# {rel} lines {r.start}-{r.end} ({r.kind} {r.name})\n{body}")
    text = "\n\n".join(parts)
    if len(text) > max_chars:
        text = text[: max(0, max_chars - 60)].rsplit("\n", 1)[0] + "\n# (editable source cut here to fit the prompt)"
    return text


def describe(patch: Patch) -> dict[str, Any]:
    """Files and sizes of a patch, for rows and reports."""
    return {"files": [f.path for f in patch.files], "added": patch.added_lines, "removed": patch.removed_lines,
            "sha256": patch.sha256}
