"""Shared by the review tests: git in a throwaway repository, and the planted change to gemm's alignment hints."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Dropping the divisibility hints of gemm's AOT compile changes the real sm_90 statistics (no cp.async, more registers).
HINTS_OLD = 'divisible = ("a_ptr", "b_ptr", "c_ptr", "M", "N", "K", "stride_am", "stride_bk", "stride_cm")'
HINTS_NEW = 'divisible = ("a_ptr", "b_ptr", "c_ptr")'


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.email=t@example.org", "-c", "user.name=t", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


def commit_all(repo: Path, msg: str) -> str:
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", msg)
    return git(repo, "rev-parse", "HEAD")


def worktrees(repo: Path) -> int:
    """How many worktrees the repository has (1: only its own checkout)."""
    return git(repo, "worktree", "list", "--porcelain").count("worktree ")
