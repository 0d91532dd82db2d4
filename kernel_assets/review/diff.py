"""Git and the diff: the repository, the base revision, the family's files, the unified diff parsed into hunks
with new-side line numbers, and the slices a model reads one at a time."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from kernel_assets.review.records import ReviewError


def git(repo: Path, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    if shutil.which("git") is None:
        raise ReviewError("git is not installed on this host; the review reads the kernel diff with git. "
                          "Fix: install git, or materialize the review where the repository is checked out.")
    p = subprocess.run(["git", "-C", str(repo), "-c", "core.quotepath=off", *args], capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise ReviewError(f"git {' '.join(args[:3])} failed in {repo}: {p.stderr.strip()[:300] or 'exit ' + str(p.returncode)}")
    return p


def toplevel_of(path: Path) -> Path | None:
    """The git checkout holding ``path`` (a file or folder), or None."""
    folder = path if path.is_dir() else path.parent
    if not folder.is_dir():
        return None
    p = git(folder, "rev-parse", "--show-toplevel", check=False)
    return Path(p.stdout.strip()).resolve() if p.returncode == 0 and p.stdout.strip() else None


def repo_toplevel(repo: Path) -> Path:
    if not repo.is_dir():
        raise ReviewError(f"{repo} does not exist. Fix: set the review's repo_dir to the checkout that holds the family's kernel files.")
    p = git(repo, "rev-parse", "--show-toplevel", check=False)
    if p.returncode != 0:
        raise ReviewError(f"{repo} is not a git repository ({p.stderr.strip()[:200]}). "
                          "Fix: set the review's repo_dir to a git checkout that holds the family's kernel files.")
    return Path(p.stdout.strip()).resolve()


def resolve_ref(repo: Path, ref: str, what: str) -> str:
    p = git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", check=False)
    if p.returncode != 0 or not p.stdout.strip():
        if ref == "HEAD":
            raise ReviewError(f"{repo} has no commits yet, so there is no base to diff against. Fix: commit the kernels once, "
                              "then change them and review.")
        raise ReviewError(f"{what} {ref!r} is not a commit in {repo}. Fix: `git fetch` it, or set base_ref to an existing "
                          "branch, tag or sha (e.g. origin/main or HEAD~1).")
    return p.stdout.strip()


def last_commit_touching(repo: Path, files: list[str]) -> tuple[str, str] | None:
    """(sha, subject) of the newest commit that changed any of ``files``, or None."""
    p = git(repo, "log", "-1", "--format=%H%x00%s", "HEAD", "--", *files, check=False)
    if p.returncode != 0 or not p.stdout.strip():
        return None
    sha, _, subject = p.stdout.strip().partition("\x00")
    return sha, subject


# --- the family's files ------------------------------------------------------------------------------------


@dataclass
class FamilySources:
    """Where a family's kernel lives: its checkout and the files in it (paths relative to that checkout)."""

    repo: Path  # the checkout reviewed (repo_dir when given, else the one holding the family's files)
    module_path: str  # the family module, e.g. kernels/gemm.py
    files: list[str]  # source_files() plus the modules of the same package the family module imports
    dirs: list[str]  # folders whose other changes are listed (not reviewed), e.g. kernels
    import_root: str  # the folder that goes on sys.path to import the family module ("." for kregress itself)
    package: str  # top-level package of the family module, e.g. kernels


def _rel(path: Path, top: Path | None, fallback: str) -> str:
    if top is not None:
        try:
            return path.resolve().relative_to(top).as_posix()
        except ValueError:
            pass
    return fallback


def family_sources(family: Any, repo_dir: str | Path = "") -> FamilySources:
    """The family's own files (``Family.source_files()``), found in the checkout that holds them
    (``git rev-parse --show-toplevel`` of the file) or, with ``repo_dir``, at the same relative paths there."""
    module = family.module
    mod_name = getattr(module, "__name__", "") or ""
    mod_file = Path(getattr(module, "__file__", "") or "")
    files = [Path(f) for f in family.source_files()]
    if not mod_name or not files:
        raise ReviewError(f"family {family.name!r} declares no source files (Family.source_files() is empty), so there is no "
                          "kernel to review. Fix: return the kernel's files from source_files().")
    home_top = toplevel_of(files[0])
    if repo_dir:
        repo = repo_toplevel(Path(repo_dir).resolve())
    elif home_top is not None:
        repo = home_top
    else:
        raise ReviewError(f"{files[0]} (family {family.name!r}) is not inside a git checkout, so there is no diff to review. "
                          "Fix: set the review's repo_dir (or KREGRESS_REVIEW_REPO) to the checkout that holds the family's sources.")
    parts = mod_name.split(".")
    module_fallback = "/".join(parts) + (("/__init__.py") if mod_file.name == "__init__.py" else ".py")
    module_path = _rel(mod_file, home_top, module_fallback) if mod_file.name else module_fallback
    depth = len(parts) if mod_file.name == "__init__.py" else len(parts) - 1
    import_root = Path(module_path).parents[depth].as_posix() if depth < len(Path(module_path).parents) else "."
    rels = [module_path] + [_rel(f, home_top, f.name) for f in files]
    package = parts[0]
    # the modules of the same package that the family module imports (its ops, shared helpers)
    src_file = repo / module_path
    src = src_file.read_text(encoding="utf-8", errors="replace") if src_file.is_file() else ""
    pkg_dir = (Path(import_root) / package).as_posix() if import_root != "." else package
    for dep in re.findall(rf"^\s*(?:from|import)\s+{re.escape(package)}\.(\w+)", src, re.MULTILINE):
        rels.append(f"{pkg_dir}/{dep}.py")
    for dep in re.findall(r"^\s*from\s+\.(\w+)\s+import", src, re.MULTILINE):
        rels.append(f"{Path(module_path).parent.as_posix()}/{dep}.py")
    rels = list(dict.fromkeys(rels))
    dirs = list(dict.fromkeys(Path(r).parent.as_posix() for r in rels))
    return FamilySources(repo=repo, module_path=module_path, files=rels, dirs=dirs, import_root=import_root, package=package)


# --- the diff ------------------------------------------------------------------------------------------------


class Hunk(BaseModel):
    header: str
    # (kind, old line, new line, text): kind ' ' context, '+' added, '-' removed
    lines: list[tuple[str, int | None, int | None, str]] = []


class FileDiff(BaseModel):
    path: str  # new path (old path for a deletion)
    old_path: str = ""
    status: Literal["modified", "added", "deleted", "renamed"] = "modified"
    hunks: list[Hunk] = []
    binary: bool = False

    def lines_in_diff(self) -> set[int]:
        """New-side line numbers the diff shows (added and context lines): what a finding may cite."""
        return {n for h in self.hunks for k, _, n, _ in h.lines if n is not None}

    def changed_lines(self) -> set[int]:
        return {n for h in self.hunks for k, _, n, _ in h.lines if k == "+" and n is not None}

    def spans(self) -> str:
        out = []
        for h in self.hunks:
            ns = [n for _, _, n, _ in h.lines if n is not None]
            if ns:
                out.append(f"{min(ns)}-{max(ns)}")
        return ", ".join(out) or "none"


_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@(.*)$")


def parse_unified_diff(text: str) -> list[FileDiff]:
    """``git diff`` output -> files with their hunks (line numbers counted from the hunk headers)."""
    files: list[FileDiff] = []
    cur: FileDiff | None = None
    hunk: Hunk | None = None
    old_n = new_n = old_left = new_left = 0
    for line in text.splitlines():
        if hunk is not None and (old_left > 0 or new_left > 0):
            kind, body = line[:1], line[1:]
            if kind == " " or line == "":
                hunk.lines.append((" ", old_n, new_n, body))
                old_n, new_n, old_left, new_left = old_n + 1, new_n + 1, old_left - 1, new_left - 1
                continue
            if kind == "+":
                hunk.lines.append(("+", None, new_n, body))
                new_n, new_left = new_n + 1, new_left - 1
                continue
            if kind == "-":
                hunk.lines.append(("-", old_n, None, body))
                old_n, old_left = old_n + 1, old_left - 1
                continue
            if kind == "\\":  # "\ No newline at end of file"
                continue
            hunk = None  # malformed counts: fall through to header parsing
        if line.startswith("\\"):
            continue
        if line.startswith("diff --git "):
            m = re.match(r"^diff --git a/(.+?) b/(.+)$", line)
            cur = FileDiff(path=m.group(2) if m else line.split()[-1], old_path=m.group(1) if m else "")
            files.append(cur)
            hunk = None
            continue
        if cur is None:
            continue
        m = _HUNK.match(line)
        if m:
            hunk = Hunk(header=line)
            cur.hunks.append(hunk)
            old_n, new_n = int(m.group(1)), int(m.group(3))
            old_left = int(m.group(2)) if m.group(2) is not None else 1
            new_left = int(m.group(4)) if m.group(4) is not None else 1
            continue
        if line.startswith("new file mode"):
            cur.status = "added"
        elif line.startswith("deleted file mode"):
            cur.status = "deleted"
        elif line.startswith("rename from "):
            cur.old_path, cur.status = line[len("rename from "):], "renamed"
        elif line.startswith("rename to "):
            cur.path = line[len("rename to "):]
        elif line.startswith("Binary files"):
            cur.binary = True
        elif line.startswith("--- ") and line[4:] == "/dev/null":
            cur.status = "added"
        elif line.startswith("+++ ") and line[4:] == "/dev/null":
            cur.status = "deleted"
            cur.path = cur.old_path or cur.path
    return files


def _added_file(path: str, text: str) -> FileDiff:
    lines = text.splitlines()
    h = Hunk(header=f"@@ -0,0 +1,{len(lines)} @@ (untracked file)", lines=[("+", None, i + 1, t) for i, t in enumerate(lines)])
    return FileDiff(path=path, status="added", hunks=[h] if lines else [])


def kernel_diff(repo: Path, base_sha: str, dirs: list[str]) -> list[FileDiff]:
    """Base commit -> working tree for the family's folders, plus untracked files there."""
    pathspec = [f"{d}/" if d != "." else "." for d in dirs]
    out = git(repo, "diff", "--no-color", "--no-ext-diff", "--find-renames", "-U3", base_sha, "--", *pathspec).stdout
    files = parse_unified_diff(out)
    untracked = git(repo, "ls-files", "--others", "--exclude-standard", "--", *pathspec).stdout.split("\n")
    for rel in [u for u in untracked if u.strip()]:
        try:
            files.append(_added_file(rel, (repo / rel).read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError):
            files.append(FileDiff(path=rel, status="added", binary=True))
    return files


def worktree_dirty(repo: Path, dirs: list[str]) -> bool:
    # a file's path stays as it is (choose_base passes the family's files: "kernels/gemm.py/" matches nothing)
    return bool(git(repo, "status", "--porcelain", "--",
                    *[f"{d}/" if d != "." and not (repo / d).is_file() else d for d in dirs]).stdout.strip())


def render_slices(fd: FileDiff, max_chars: int) -> list[str]:
    """The file's hunks with new-side line numbers, cut into slices of at most ~max_chars (whole hunks where possible)."""
    blocks = []
    for h in fd.hunks:
        rows = [h.header]
        for kind, _old, new, body in h.lines:
            num = f"{new:>5}" if new is not None else "     "
            rows.append(f"{num} {kind}{body}")
        block = "\n".join(rows)
        if len(block) > max_chars:
            block = block[: max_chars - 40].rsplit("\n", 1)[0] + "\n      (hunk truncated here)"
        blocks.append(block)
    slices: list[str] = []
    cur: list[str] = []
    size = 0
    for b in blocks:
        if cur and size + len(b) > max_chars:
            slices.append("\n".join(cur))
            cur, size = [], 0
        cur.append(b)
        size += len(b) + 1
    if cur:
        slices.append("\n".join(cur))
    return slices
