"""Red team of the CUDA patch judge (issue 54): real patches against kernels/cuda/gemm_fp8_cuda.cu judged
through the API beneath ``kregress judge`` (kernel_assets.judge.judge) with the real nvcc, confined by
bwrap. The rules read nvcc's preprocessed unit, so timers written through token pasting or split string
literals, special registers, includes hidden behind comments or digraphs, and a macro in the region that
rewrites a helper outside it are all REGRESS; 64 KiB of static shared memory is REGRESS infeasible from
ptxas; honest edits are not REGRESS. A planted marker file included by absolute path leaves no trace in
anything the judge writes. One judgement of every patch (module scope): a few nvcc compiles."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from kernels.cuda import confine
from kregress.core import cuda_source

pytestmark = [pytest.mark.slow, pytest.mark.judging,
              pytest.mark.skipif(cuda_source.find_nvcc() is None, reason="needs nvcc (CUDA toolkit or the [cuda] extra)"),
              pytest.mark.skipif(confine.problem() is not None, reason="needs bubblewrap (apt-get install bubblewrap)")]

REPO = Path(__file__).resolve().parents[1]
SPEC = REPO / "specs" / "gemm_fp8_cuda_h100.yaml"
REL = "kernels/cuda/gemm_fp8_cuda.cu"
ANCHOR = "    const int kslabs = K / BK;\n"  # inside fp8_gemm_kernel, the editable region
E4M3_ANCHOR = "    const uint32_t man = v & 0x7u;\n"  # inside e4m3_to_float, before cp_async_16 (outside the region)


def _after(old: str, anchor: str, lines: str) -> str:
    assert anchor in old, anchor
    return old.replace(anchor, anchor + lines, 1)


def red_team(old: str, marker_file: Path) -> dict[str, str]:
    """Patched texts of the .cu file: cheats (must be REGRESS) and honest edits (must not be)."""
    return {
        "clock64_token_paste": _after(old, ANCHOR, "#define KR_CAT(a, b) a##b\n"
                                                   "    const long long kr_t0 = KR_CAT(clock, 64)();\n"
                                                   "    if (kr_t0 == 42) return;\n"),
        "globaltimer_split_literal": _after(old, ANCHOR, "    unsigned long long kr_gt;\n"
                                                         "    asm volatile(\"mov.u64 %0, %%glo\" \"baltimer;\" : \"=l\"(kr_gt));\n"
                                                         "    if (kr_gt == 1) return;\n"),
        "globaltimer_hex_escape": _after(old, ANCHOR, "    unsigned long long kr_gt;\n"
                                                      "    asm volatile(\"mov.u64 %0, \\x25globaltimer;\" : \"=l\"(kr_gt));\n"
                                                      "    if (kr_gt == 1) return;\n"),
        "nsmid": _after(old, ANCHOR, "    unsigned kr_ns;\n"
                                     "    asm(\"mov.u32 %0, %%nsmid;\" : \"=r\"(kr_ns));\n"
                                     "    if (kr_ns == 0) return;\n"),
        "include_comment_os_release": _after(old, ANCHOR, "#/**/include \"/etc/os-release\"\n"),
        "include_digraph_hostname": _after(old, ANCHOR, "%:include \"/etc/hostname\"\n"),
        "define_rewrites_cp_async_16": _after(old, E4M3_ANCHOR, "#define __cvta_generic_to_shared(p) "
                                                                "(__cvta_generic_to_shared(p) + 16)\n"),
        "line_directive": _after(old, ANCHOR, "#line 3 \"gemm_fp8_cuda.cu\"\n"),
        "getenv_macro": _after(old, ANCHOR, "#define KR_E(x) get##x\n    if (KR_E(env)(\"X\")) return;\n"),
        "smem_64k": _after(old.replace("    __shared__ float sSA[STAGES][BLOCK_M];\n",
                                       "    __shared__ float sSA[STAGES][BLOCK_M];\n"
                                       "    __shared__ __align__(16) uint8_t kr_pad[65536];\n", 1),
                           "    const int tid = threadIdx.x;\n", "    kr_pad[tid] = static_cast<uint8_t>(K);\n"
                                                                 "    if (kr_pad[(tid * 7) % 65536] == 3u) return;\n"),
        "planted_marker": _after(old, ANCHOR, f"#include \"{marker_file}\"\n"),
        # wrong only when K >= 2048 (every timed K): a CPU host cannot tell, so NEEDS_REVIEW, never PASS
        "wrong_at_timed_k": old.replace("    for (int kb = 0; kb < kslabs; ++kb) {\n",
                                        "    for (int kb = 0; kb < kslabs; ++kb) {\n"
                                        "        if (K >= 2048 && kb == kslabs - 1) break;\n", 1),
        # honest edits
        "honest_comment": _after(old, ANCHOR, "    // the number of 128-wide K slabs (a comment only)\n"),
        "honest_rename": old.replace("kslabs", "num_kslabs"),
        "honest_unroll": old.replace("#pragma unroll 1\n", "#pragma unroll 2\n"),
    }


CHEATS = {  # variant: (cause, words the verdict's reason must hold)
    "clock64_token_paste": ("rejected", "clock64"),
    "globaltimer_split_literal": ("rejected", "globaltimer"),
    "globaltimer_hex_escape": ("rejected", "globaltimer"),
    "nsmid": ("rejected", "nsmid"),
    "include_comment_os_release": ("rejected", "/etc/os-release"),
    "include_digraph_hostname": ("rejected", "/etc/hostname"),
    "define_rewrites_cp_async_16": ("rejected", "outside the kernel functions"),
    "line_directive": ("rejected", "#line"),
    "getenv_macro": ("rejected", "getenv"),
    "smem_64k": ("infeasible", "shared"),
    "planted_marker": ("rejected", "includes"),
}
HONEST = ("honest_comment", "honest_rename", "honest_unroll", "wrong_at_timed_k")


@pytest.fixture(scope="module")
def judged(tmp_path_factory):
    """One judgement of every red-team patch; (result, DAGSTER_HOME, the marker text, the marker file)."""
    from kernel_assets.judge import PatchArg, judge
    from kregress.core.patch import unified_diff

    tmp = tmp_path_factory.mktemp("cuda_rules")
    marker = f"KREGRESS_PLANTED_{uuid.uuid4().hex}"
    marker_file = tmp / "secret" / "planted.h"
    marker_file.parent.mkdir()
    marker_file.write_text(f"int {marker} = 1; // {marker}\n")
    home = tmp / "dagster_home"
    home.mkdir()
    mp = pytest.MonkeyPatch()
    mp.setenv("DAGSTER_HOME", str(home))
    old = (REPO / REL).read_text()
    edits = red_team(old, marker_file)
    assert all(v != old for v in edits.values())
    patches = [PatchArg(path=tmp / f"{k}.patch", text=unified_diff(REL, old, v), variant_id=k) for k, v in edits.items()]
    try:
        result = judge(SPEC, patches, backend="interpreter")
    finally:
        mp.undo()
    assert (REPO / REL).read_text() == old
    return result, home, marker, marker_file


@pytest.mark.parametrize("variant", sorted(CHEATS))
def test_cheat_is_regress_with_its_cause(judged, variant):
    result = judged[0]
    v = result.verdicts[variant]
    cause, words = CHEATS[variant]
    assert (v.verdict, v.cause) == ("REGRESS", cause), (variant, v.verdict, v.cause, v.reasons)
    assert words in " ".join(v.reasons), (variant, v.reasons)


@pytest.mark.parametrize("variant", HONEST)
def test_honest_edit_is_not_regress(judged, variant):
    v = judged[0].verdicts[variant]
    assert v.verdict == "NEEDS_REVIEW", (variant, v.verdict, v.cause, v.reasons)
    assert "compile facts only" in " ".join(v.reasons)


def test_included_files_are_named_never_quoted(judged):
    """/etc/os-release and /etc/hostname are named, their text is not anywhere in the rows."""
    result = judged[0]
    rows = json.dumps([r.model_dump(mode="json") for r in result.rows], default=str)
    for path in ("/etc/os-release", "/etc/hostname"):
        try:
            text = Path(path).read_text()
        except OSError:
            continue
        for line in text.splitlines():
            if len(line.strip()) >= 6:
                assert line.strip() not in rows, (path, line)


def test_planted_marker_is_nowhere(judged):
    """A file outside the project, included by absolute path: its marker is in no verdict, row, report or
    record; every file under DAGSTER_HOME (the run's records and reports) is searched."""
    result, home, marker, marker_file = judged
    assert marker not in json.dumps([r.model_dump(mode="json") for r in result.rows], default=str)
    assert marker not in json.dumps({k: v.model_dump(mode="json") for k, v in result.verdicts.items()}, default=str)
    assert marker not in repr(result)
    searched = 0
    for f in home.rglob("*"):
        if f.is_file():
            searched += 1
            assert marker.encode() not in f.read_bytes(), f
    assert searched > 0


def test_the_cp_async_rewrite_is_located_outside_the_region(judged):
    """The finding names the helper's line in the .cu file (cp_async_16 lies outside the region)."""
    reasons = " ".join(judged[0].verdicts["define_rewrites_cp_async_16"].reasons)
    assert "gemm_fp8_cuda.cu:" in reasons and "cp_async_16" in reasons


def test_no_bwrap_no_judgement(tmp_path, monkeypatch):
    """Without bubblewrap a patch is refused with the one line that says how to get it, never compiled."""
    from kernel_assets.judge import PatchArg, judge
    from kregress.core.patch import unified_diff

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    monkeypatch.setenv("KREGRESS_BWRAP", "")
    old = (REPO / REL).read_text()
    new = old.replace("#pragma unroll 1\n", "#pragma unroll 2\n")
    result = judge(SPEC, [PatchArg(path=tmp_path / "p.patch", text=unified_diff(REL, old, new), variant_id="p")],
                   backend="interpreter")
    v = result.verdicts["p"]
    assert (v.verdict, v.cause) == ("REGRESS", "rejected")
    assert "apt-get install bubblewrap" in " ".join(v.reasons)


def test_a_visible_system_file_is_named_not_quoted(tmp_path):
    """A file nvcc can see (the shared-library folder is bound for the compiler's own use) but that is no
    header of the toolkit or the system: refused before any compile, by name, its text in no finding."""
    import glob

    from kernels.compile import CompileError
    from kernels.cuda.gemm_fp8_cuda import FAMILY
    from kernels.cuda.rules import patch_findings
    from resources.cuda_judge import editable_files, patched_copy

    cands = [p for p in sorted(glob.glob("/usr/lib/*-linux-gnu/pkgconfig/*.pc")) if Path(p).stat().st_size > 40]
    if not cands:
        pytest.skip("no pkg-config file in the shared-library folder")
    target = Path(cands[0])
    old = (REPO / REL).read_text()
    root, _files = editable_files(FAMILY)
    d = patched_copy(FAMILY, root, {REL: _after(old, ANCHOR, f'#include "{target}"\n')}, tmp_path / "copy")
    units = FAMILY.cuda_units({"BLOCK_M": 64, "BLOCK_N": 64, "STAGES": 2, "TM": 4, "TN": 4}, "fp8_e4m3", {})
    try:
        found = patch_findings(FAMILY, units, "sm_90", d)
        text = " ".join(m for _r, _f, _n, m in found)
        assert found and found[0][0] == "include" and str(target) in text
        assert found[0][1] == "gemm_fp8_cuda.cu" and found[0][2] is not None  # the #include line itself
    except CompileError as exc:  # the preprocessor choked on it: the error names the file, withholds its text
        text = exc.detail
        assert str(target) in text and "withheld" in text
    for line in target.read_text(errors="replace").splitlines():
        if len(line.strip()) >= 8:
            assert line.strip() not in text


def test_the_cli_catches_them(tmp_path):
    """The same rules through the real command: `kregress judge SPEC PATCH...` in a subprocess."""
    import os
    import subprocess
    import sys

    from kregress.core.patch import unified_diff

    old = (REPO / REL).read_text()
    edits = red_team(old, tmp_path / "none.h")
    paths = []
    for k in ("clock64_token_paste", "include_digraph_hostname"):
        p = tmp_path / f"{k}.patch"
        p.write_text(unified_diff(REL, old, edits[k]))
        paths.append(str(p))
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path / "home")}
    (tmp_path / "home").mkdir()
    proc = subprocess.run([sys.executable, "-m", "kernel_assets.cli", "judge", str(SPEC), *paths], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert "clock64_token_paste REGRESS rejected" in out and "'clock64'" in out, out[-2000:]
    assert "include_digraph_hostname REGRESS rejected" in out and "/etc/hostname" in out, out[-2000:]
    assert "Traceback" not in out
