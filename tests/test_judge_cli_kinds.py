"""`kregress judge` on every family kind, as a user runs it: the real command in a subprocess, a temporary
DAGSTER_HOME, a comment-only patch. Each exits 0 with a verdict that is not REGRESS: a Triton family's is
checked in the interpreter (NEEDS_REVIEW on a model estimate), a CUDA family's has nvcc's compile facts only,
an external kernel's has static checks only (neither runs on a CPU host); a scaffolded plugin of each
compiling kind too. ``--base HEAD`` and ``kregress review --patch`` on the judged patch as well.

Tiny shapes throughout (a spec written into the test's folder) keep the Triton judgements short."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kregress.core.cuda_source import find_nvcc
from kregress.core.patch import unified_diff

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
KREGRESS = [sys.executable, "-m", "kernel_assets.cli"]
LINE = re.compile(r"^(\S+) (PASS|REGRESS|NEEDS_REVIEW) (\S+): (.*)$")
needs_nvcc = pytest.mark.skipif(find_nvcc() is None, reason="no nvcc on this host: a CUDA family cannot compile here")


def kregress(args: list[str], home: Path, cwd: Path = REPO, pythonpath: list[Path] = (), timeout: float = 900):
    env = {**os.environ, "DAGSTER_HOME": str(home)}
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join([str(p) for p in pythonpath] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    return subprocess.run(KREGRESS + args, capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout)


def comment_patch(root: Path, rel: str, anchor: str, comment: str, out: Path) -> Path:
    """A patch adding ``comment`` on its own line after the first line of ``root/rel`` that contains ``anchor``."""
    old = (root / rel).read_text()
    lines = old.splitlines(keepends=True)
    i = next(n for n, t in enumerate(lines) if anchor in t)
    indent = re.match(r"\s*", lines[i + 1]).group(0)
    new = "".join(lines[: i + 1] + [f"{indent}{comment}\n"] + lines[i + 1:])
    out.write_text(unified_diff(rel, old, new))
    return out


def verdict_of(p: subprocess.CompletedProcess, vid: str) -> tuple[str, str, str]:
    assert p.returncode == 0, p.stderr[-3000:]
    got = {m.group(1): m.groups()[1:] for m in map(LINE.match, p.stdout.strip().splitlines()) if m}
    assert vid in got, p.stdout
    return got[vid]


def tiny(spec: Path, dest: Path, **over) -> Path:
    """``spec`` with tiny shapes (``over``: its keys replaced), written to ``dest``."""
    data = yaml.safe_load(spec.read_text())
    data.update(over)
    dest.write_text(yaml.safe_dump(data, sort_keys=False))
    return dest


def test_triton_builtin_comment_patch_with_and_without_base(tmp_path):
    spec = tiny(REPO / "specs" / "gemm_smoke.yaml", tmp_path / "gemm_tiny.yaml", task_id="gemm_tiny",
                shape_matrix=[{"M": 64, "N": 64, "K": 64}], correctness_shapes=[{"M": 33, "N": 17, "K": 40}])
    patch = comment_patch(REPO, "kernels/gemm.py", "def matmul(", "# a comment only", tmp_path / "gemm_comment.patch")
    home = tmp_path / "home"
    verdict, _cause, reason = verdict_of(kregress(["judge", str(spec), str(patch)], home), "gemm_comment")
    assert verdict == "NEEDS_REVIEW" and "evidence=model" in reason
    verdict, _cause, _ = verdict_of(kregress(["judge", str(spec), str(patch), "--base", "HEAD"], home), "gemm_comment")
    assert verdict == "NEEDS_REVIEW"
    r = kregress(["review", str(spec), "--patch", "gemm_comment", "--offline"], home)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "judged patch gemm_comment" in (home / "reports" / "gemm_tiny" / "review.md").read_text()


@needs_nvcc
def test_cuda_builtin_comment_patch_is_compile_facts_only(tmp_path):
    spec = REPO / "specs" / "gemm_fp8_cuda_h100.yaml"
    patch = comment_patch(REPO, "kernels/cuda/gemm_fp8_cuda.cu", "constexpr int CHUNKS", "// a comment only",
                          tmp_path / "cu_comment.patch")
    home = tmp_path / "home"
    verdict, cause, reason = verdict_of(kregress(["judge", str(spec), str(patch)], home), "cu_comment")
    assert (verdict, cause) == ("NEEDS_REVIEW", "-") and "compile facts only" in reason
    assert "unpatched: 104 regs" in reason and "37376 B static" in reason  # ptxas's own figures, both sides
    verdict, _, reason = verdict_of(kregress(["judge", str(spec), str(patch), "--base", "HEAD"], home), "cu_comment")
    assert verdict == "NEEDS_REVIEW" and "compile facts only" in reason
    r = kregress(["review", str(spec), "--patch", "cu_comment", "--offline"], home)
    assert r.returncode == 0, r.stderr[-3000:]
    review = (home / "reports" / "gemm_fp8_cuda_h100" / "review.md").read_text()
    assert "kernels/cuda/gemm_fp8_cuda.cu" in review and "| smem_bytes | 37376 | 37376 | +0 |" in review


def test_external_family_static_checks_only_on_a_cpu_host(tmp_path):
    """torch_sdpa cannot run here: a comment is NEEDS_REVIEW (static checks only, what needs a GPU named); a code
    change outside the editable region (an external family's is its launch wrappers: none here) is REGRESS."""
    spec = REPO / "specs" / "torch_sdpa_h100.yaml"
    comment = comment_patch(REPO, "kernels/torch_sdpa.py", "def make_inputs(", "# a comment only", tmp_path / "sdpa_comment.patch")
    old = (REPO / "kernels" / "torch_sdpa.py").read_text()
    code = tmp_path / "sdpa_code.patch"
    code.write_text(unified_diff("kernels/torch_sdpa.py", old, old.replace("is_causal=causal)", "is_causal=False)")))
    home = tmp_path / "home"
    p = kregress(["judge", str(spec), str(comment), str(code)], home)
    verdict, _, reason = verdict_of(p, "sdpa_comment")
    assert verdict == "NEEDS_REVIEW" and "static checks only" in reason and "needs the cuda backend" in reason
    verdict, cause, reason = verdict_of(p, "sdpa_code")
    assert (verdict, cause) == ("REGRESS", "rejected") and "outside_region" in reason
    r = kregress(["review", str(spec), "--patch", "sdpa_comment", "--offline"], home)
    assert r.returncode == 0, r.stderr[-3000:]


def _scaffold(kind: str, name: str, where: Path, home: Path) -> Path:
    r = kregress(["family", "new", name, "--dir", str(where / name), "--kind", kind], home)
    assert r.returncode == 0, r.stderr
    return where / name


@needs_nvcc
def test_scaffolded_cuda_plugin_installed_by_pip(tmp_path):
    """The scaffold's own flow: `kregress family new --kind cuda`, pip install (into a temporary target, never
    the test's environment: its entry point is found through PYTHONPATH), then judge a patch to its .cu file."""
    home = tmp_path / "home"
    root = _scaffold("cuda", "kr_cujudge", tmp_path, home)
    site = tmp_path / "site"
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps", "--target",
                          str(site), "-e", str(root)], capture_output=True, text=True, timeout=300)
    assert pip.returncode == 0, pip.stderr[-2000:]
    patch = comment_patch(root, "kregress_kr_cujudge/kr_cujudge.cu", "__shared__", "// a comment only", tmp_path / "plug_cu.patch")
    p = kregress(["judge", str(root / "specs" / "kr_cujudge.yaml"), str(patch)], home, cwd=tmp_path, pythonpath=[site, root])
    verdict, _, reason = verdict_of(p, "plug_cu")
    assert verdict == "NEEDS_REVIEW" and "compile facts only" in reason


def test_scaffolded_triton_plugin_by_import_path(tmp_path):
    """`kregress family new` (Triton), the family named by its import path (no install), its spec's shapes made
    tiny: a comment in its jit kernel is checked in the interpreter and comes back NEEDS_REVIEW."""
    home = tmp_path / "home"
    root = _scaffold("triton", "kr_trjudge", tmp_path, home)
    spec = tiny(root / "specs" / "kr_trjudge.yaml", root / "specs" / "kr_trjudge.yaml",
                kernel_family="kregress_kr_trjudge.family:FAMILY", shape_matrix=[{"M": 64, "N": 256}])
    patch = comment_patch(root, "kregress_kr_trjudge/family.py", "pid = tl.program_id(0)", "# a comment only",
                          tmp_path / "plug_tr.patch")
    p = kregress(["judge", str(spec), str(patch)], home, cwd=tmp_path, pythonpath=[root])
    verdict, _, _ = verdict_of(p, "plug_tr")
    assert verdict == "NEEDS_REVIEW"
