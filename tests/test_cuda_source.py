"""The pure side of CUDA families: ptxas's report read, errors classified, kernel regions found, patches to
.cu files held to the region, C++ advice, and a host with no nvcc (PATH manipulation, no mock)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernels.cuda.nvcc import classify, entry_for, parse_ptxas
from kregress.core import cuda_source
from kregress.core.cuda_source import NVCC_HINT, advice, kernel_regions, region_findings
from kregress.core.family import CudaUnit
from kregress.core.patch import parse_patch, unified_diff

REPO = Path(__file__).resolve().parents[1]
CU = REPO / "kernels" / "cuda" / "gemm_fp8_cuda.cu"
REL = "kernels/cuda/gemm_fp8_cuda.cu"
NAMES = ("fp8_gemm_kernel", "e4m3_to_float")

# nvcc 13.0's -Xptxas -v on sm_90, as printed (two entries: one spills, one does not)
PTXAS = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z15fp8_gemm_kernelILi64ELi128ELi1ELi8ELi16EEvPKhS1_PKfS3_P13__nv_bfloat16iii' for 'sm_90'
ptxas info    : Function properties for _Z15fp8_gemm_kernelILi64ELi128ELi1ELi8ELi16EEvPKhS1_PKfS3_P13__nv_bfloat16iii
    608 bytes stack frame, 1756 bytes spill stores, 1276 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 608 bytes cumulative stack size, 27904 bytes smem
ptxas info    : Compile time = 7075.409 ms
ptxas info    : Compiling entry function 'plain_kernel' for 'sm_90'
ptxas info    : Function properties for plain_kernel
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 21 registers, 4096 bytes smem, 384 bytes cmem[0]
"""


def test_parse_ptxas_reads_every_fact():
    facts = parse_ptxas(PTXAS)
    spill = facts["_Z15fp8_gemm_kernelILi64ELi128ELi1ELi8ELi16EEvPKhS1_PKfS3_P13__nv_bfloat16iii"]
    assert (spill.registers, spill.barriers, spill.stack_frame, spill.spill_stores, spill.spill_loads, spill.smem_static) == \
        (255, 1, 608, 1756, 1276, 27904)
    plain = facts["plain_kernel"]
    assert (plain.registers, plain.barriers, plain.smem_static, plain.cmem) == (21, 0, 4096, {"cmem[0]": 384})


def test_entry_for_matches_the_template_instance_only():
    names = list(parse_ptxas(PTXAS))
    unit = CudaUnit(kernel="fp8_gemm_kernel", source="x.cu", template_args=(64, 128, 1, 8, 16))
    assert entry_for(unit, names) == names[0]
    assert entry_for(CudaUnit(kernel="fp8_gemm_kernel", source="x.cu", template_args=(64, 128, 2, 8, 16)), names) is None
    assert entry_for(CudaUnit(kernel="plain_kernel", source="x.cu"), names) == "plain_kernel"


def test_classify_over_limit_vs_other_errors():
    over = classify("ptxas error   : Entry function '_Z1kILi512EEvPf' uses too much shared data (0x3c000 bytes, 0xc000 max)\n")
    assert over.error == "out_of_resources" and "uses too much shared data (0x3c000 bytes, 0xc000 max)" in over.detail
    other = classify('k.cu(12): error: identifier "smem_x" is undefined\n1 error detected in the compilation of "k.cu".\n')
    assert other.error == "compile_failed" and 'identifier "smem_x" is undefined' in other.detail


def test_kernel_regions_of_the_builtin_cu():
    src = CU.read_text()
    regions = {r.name: r for r in kernel_regions(src, REL, NAMES)}
    lines = src.splitlines()
    assert set(regions) == set(NAMES)
    k = regions["fp8_gemm_kernel"]
    assert lines[k.start - 1].startswith("template <int BLOCK_M")  # the template head is inside
    assert lines[k.end - 1] == "}"
    assert "__launch_bounds__" in "\n".join(lines[k.start - 1:k.start + 2])
    # calls of e4m3_to_float inside the kernel are not regions of their own
    assert len([r for r in kernel_regions(src, REL, NAMES) if r.name == "e4m3_to_float"]) == 1


def test_kernel_regions_ignore_comments_strings_and_declarations():
    src = ('// __global__ void k() { not code }\n'
           'const char* s = "__global__ void k() {";\n'
           '__global__ void k(float* y);\n'
           '__global__ void k(float* y) {\n'
           '    y[0] = 1.0f;  /* } */\n'
           '}\n')
    (r,) = kernel_regions(src, "a.cu", ("k",))
    assert (r.start, r.end) == (4, 6)


def _diff(new: str) -> tuple:
    old = CU.read_text()
    patch = parse_patch(unified_diff(REL, old, new))
    from kregress.core.patch import apply_and_check

    applied = apply_and_check(patch, {REL: old})
    return region_findings({REL: NAMES}, patch.files, {REL: old}, applied.new_texts, 60, patch.changed_lines)


def test_region_allows_kernel_edits_and_comments_outside():
    old = CU.read_text()
    assert _diff(old.replace("#pragma unroll 1\n", "#pragma unroll 2\n")) == []
    assert _diff(old.replace("// DeepGEMM-like FP8", "// A DeepGEMM-like FP8")) == []


def test_region_refuses_edits_outside_the_kernel_functions():
    old = CU.read_text()
    found = _diff(old.replace("#define KREGRESS_PAD 16", "#define KREGRESS_PAD 32"))
    assert found and all(rule == "outside_region" for rule, *_ in found)
    assert any("#define KREGRESS_PAD" in msg for *_, msg in found)
    found = _diff(old.replace("template <int N>\n__device__ __forceinline__ void cp_async_wait()",
                              "template <int N>\n__device__ __forceinline__ void cp_async_wait_x()"))
    assert found


def test_region_refuses_other_files():
    patch = parse_patch(unified_diff("kernels/cuda/gemm_fp8_cuda.py", "a = 1\n", "a = 2\n"))
    found = region_findings({REL: NAMES}, patch.files, {}, {}, 60, patch.changed_lines)
    assert found and found[0][0] == "outside_region" and "not a kernel file" in found[0][3]


@pytest.mark.parametrize("line,rule", [
    ('    if (getenv("HOME")) return;', "environment"),
    ('    FILE* f = fopen("/etc/passwd", "r");', "host_io"),
    ('    system("id");', "process"),
    ("    int s = socket(2, 1, 0);", "socket"),
    ("    long long t = clock64();", "timer"),
    ('    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));', "inline_asm"),
    ("#include <unistd.h>", "host_io"),
    ('#include "/etc/passwd"', "include"),
])
def test_advice_names_what_the_line_reaches_for(line, rule):
    (found,) = advice([(7, line)])
    assert found[0] == rule and found[1] == 7


def test_advice_leaves_kernel_code_and_comments_alone():
    assert advice([(1, "    acc += a * b;  // no getenv here"), (2, '    const char* s = "fopen(";'),
                   (3, "    part[i][j] = fmaf(a[i], b[j], part[i][j]);")]) == []


def test_no_nvcc_refuses_cuda_specs_only(tmp_path, monkeypatch):
    """PATH without nvcc (and no CUDA_HOME, no KREGRESS_NVCC): a CUDA spec is refused with the one line that
    says how to get it; a Triton spec binds as before."""
    from kregress.core.bind import load_bound
    from kregress.core.spec import SpecError

    if cuda_source._wheel_nvcc():
        pytest.skip("this environment has the nvidia-cuda-nvcc wheel installed: nvcc cannot be taken away by PATH")
    monkeypatch.setenv("PATH", str(tmp_path))
    for var in ("CUDA_HOME", "CUDA_PATH", "KREGRESS_NVCC"):
        monkeypatch.delenv(var, raising=False)
    assert cuda_source.find_nvcc() is None and cuda_source.nvcc_problem() == NVCC_HINT
    with pytest.raises(SpecError) as exc:
        load_bound(REPO / "specs" / "gemm_fp8_cuda_h100.yaml")
    text = str(exc.value)
    assert text.count("no nvcc found") == 1 and "pip install -e '.[cuda]'" in text and "field 'kernel_family'" in text
    assert load_bound(REPO / "specs" / "gemm_smoke.yaml").family.kind == "triton"



@pytest.mark.skipif(cuda_source.find_nvcc() is None, reason="binding a CUDA spec needs nvcc")
def test_llm_patch_prompt_and_reply_use_the_cu_file():
    """search.patches on a CUDA family: the prompt shows the .cu kernel functions, and SEARCH/REPLACE blocks
    become a diff of the .cu file (judged by resources/cuda_judge.py)."""
    from types import SimpleNamespace

    from kernel_assets.judge import patch_from_reply, patch_prompt
    from kregress.core.bind import load_bound

    b = load_bound(REPO / "specs" / "gemm_fp8_cuda_h100.yaml")
    spec = b.spec.model_copy(update={"search": b.spec.search.model_copy(update={"patches": True})})
    ctx = SimpleNamespace(family=b.family, spec=spec)
    system, user = patch_prompt(ctx, "SYSTEM")
    assert "CUDA C++ kernel" in system and f"// {REL} lines" in user and "(fp8_gemm_kernel)" in user
    assert "def fp8_gemm_cuda" not in user  # the Python host wrapper is not editable
    diff, why = patch_from_reply(f"{REL}\n<<<<<<< SEARCH\n#pragma unroll 1\n=======\n#pragma unroll 2\n>>>>>>> REPLACE", ctx)
    assert why is None and diff.startswith(f"diff --git a/{REL} b/{REL}") and "+#pragma unroll 2" in diff
