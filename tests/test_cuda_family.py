"""CUDA C++ families with the real nvcc (no GPU): compile facts cross-checked with cuobjdump and a plain
`nvcc -Xptxas -v` run, the cache, errors as rows, a sweep's rows and verdicts, .cu patches judged, the
scaffold's plugin conforming, and the no-nvcc CLI exit. Slow tier (nvcc takes seconds per variant)."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from kernels.compile import CompileError
from kernels.cuda.nvcc import compile_unit, compile_variant, cross_check, nvcc_path, parse_ptxas, translation_unit
from kregress.core import cuda_source
from kregress.core.family import CudaFamily, Space
from kregress.core.spec import HardwareLimits

pytestmark = pytest.mark.skipif(cuda_source.find_nvcc() is None, reason="needs nvcc (CUDA toolkit or the [cuda] extra)")

REPO = Path(__file__).resolve().parents[1]
SPEC = REPO / "specs" / "gemm_fp8_cuda_h100.yaml"
LIMITS = HardwareLimits()
BASELINE = {"BLOCK_M": 64, "BLOCK_N": 64, "STAGES": 2, "TM": 4, "TN": 4}

TEST_CU = r"""
template <int N>
__global__ void __launch_bounds__(1024) spill_kernel(const float* __restrict__ x, float* __restrict__ y, int n) {
    __shared__ float stage[SMEM_FLOATS];
    float a[N];
#pragma unroll
    for (int i = 0; i < N; ++i) a[i] = x[(threadIdx.x * N + i) % n];
    stage[threadIdx.x % SMEM_FLOATS] = a[0];
    __syncthreads();
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < N; ++i) s += a[(i * 7) % N] * a[(i * 3 + 1) % N] + stage[(i + threadIdx.x) % SMEM_FLOATS];
    y[threadIdx.x] = s;
}
"""


class _TestFamily(CudaFamily):
    cuda_sources = ("k.cu",)
    kernel_functions = ("spill_kernel",)
    template_params = ("N",)
    define_params = ("SMEM_FLOATS",)

    def cuda_units(self, config, dtype, params):
        return [self.unit("spill_kernel", config, threads=config.get("THREADS", 1024),
                          dynamic_smem_bytes=config.get("DYN", 0))]

    def make_inputs(self, shape, dtype, device, seed, params):
        raise NotImplementedError

    def run(self, inputs, config, params):
        raise NotImplementedError

    def reference(self, inputs, params):
        raise NotImplementedError

    def flops(self, shape, params):
        return 1.0

    def bytes_moved(self, shape, dtype_bytes, params):
        return 1.0


def _family(tmp_path: Path, source: str = TEST_CU) -> _TestFamily:
    (tmp_path / "k.cu").write_text(source)
    mod = types.SimpleNamespace(__file__=str(tmp_path / "fam.py"), __name__="fam")
    return _TestFamily(name="cu_test", space=Space(params={"N": (4, 128), "SMEM_FLOATS": (256, 16384)}),
                       shape_keys=("n",), headline_metric="gbps", module=mod)


def test_builtin_facts_agree_with_cuobjdump_and_a_plain_nvcc_run(tmp_path):
    """The cross-check, once: ptxas's report through compile_variant, cuobjdump's reading of the same cubin,
    and a plain `nvcc -cubin -arch=sm_90 -Xptxas -v` of the kernel give the same registers, stack and
    shared memory; the second compile is a cache hit."""
    from kernels.cuda.gemm_fp8_cuda import FAMILY, static_smem_bytes

    stats, (build,) = compile_variant(FAMILY, BASELINE, "fp8_e4m3", {}, "sm_90", LIMITS, cache=tmp_path / "c")
    assert build.cuobjdump is not None, "cuobjdump (PATH, beside nvcc or the Triton wheel) was not found"
    assert cross_check(build) == [] and stats.facts_from == "ptxas -v; cuobjdump agrees"
    assert stats.smem_static_bytes == static_smem_bytes(BASELINE) == stats.smem_bytes
    assert stats.regs_per_thread > 32 and stats.barriers >= 1 and stats.spill_stores == 0 and not stats.cache_hit
    tu = tmp_path / "plain.cu"
    tu.write_text(translation_unit(FAMILY.cu_files()[0], build.unit))
    out = subprocess.run([nvcc_path(), "-cubin", "-arch=sm_90", "-Xptxas", "-v", "-O3", "-std=c++17", "-o",
                          str(tmp_path / "plain.cubin"), str(tu)], capture_output=True, text=True, timeout=600)
    plain = parse_ptxas(out.stdout + out.stderr)[build.entry]
    assert (plain.registers, plain.smem_static, plain.spill_stores, plain.barriers) == \
        (stats.regs_per_thread, stats.smem_static_bytes, stats.spill_stores, stats.barriers)
    again, _ = compile_variant(FAMILY, BASELINE, "fp8_e4m3", {}, "sm_90", LIMITS, cache=tmp_path / "c")
    assert again.cache_hit and again.regs_per_thread == stats.regs_per_thread


def test_builtin_over_the_static_limit_cites_ptxas(tmp_path):
    from kernels.cuda.gemm_fp8_cuda import FAMILY

    with pytest.raises(CompileError) as exc:
        compile_variant(FAMILY, {**BASELINE, "STAGES": 3}, "fp8_e4m3", {}, "sm_90", LIMITS, cache=tmp_path)
    assert exc.value.error == "out_of_resources"
    assert "uses too much shared data (0xdb00 bytes, 0xc000 max)" in exc.value.detail


def test_spills_errors_and_limits_are_facts(tmp_path):
    fam = _family(tmp_path)
    small, _ = compile_variant(fam, {"N": 4, "SMEM_FLOATS": 256}, "fp32", {}, "sm_90", LIMITS, cache=tmp_path / "c")
    assert small.spill_stores == 0 and small.smem_static_bytes == 1024 and small.num_warps == 32
    big, (b,) = compile_variant(fam, {"N": 128, "SMEM_FLOATS": 256}, "fp32", {}, "sm_90", LIMITS, cache=tmp_path / "c")
    assert big.regs_per_thread <= 64 and big.spill_stores > 0 and big.spill_loads > 0 and big.spill_bytes > 0
    assert cross_check(b) == []
    # dynamic shared memory is the launch's: static + dynamic past the per-block limit is out of resources
    with pytest.raises(CompileError) as exc:
        compile_variant(fam, {"N": 4, "SMEM_FLOATS": 256, "DYN": 232448}, "fp32", {}, "sm_90", LIMITS, cache=tmp_path / "c")
    assert exc.value.error == "out_of_resources" and "1024 bytes smem (static) + 232448 dynamic" in exc.value.detail
    (tmp_path / "b").mkdir()
    broken = _family(tmp_path / "b", TEST_CU.replace("s += a", "s += undefined_name + a"))
    with pytest.raises(CompileError) as exc:
        compile_variant(broken, {"N": 4, "SMEM_FLOATS": 256}, "fp32", {}, "sm_90", LIMITS, cache=tmp_path / "c")
    assert exc.value.error == "compile_failed" and 'identifier "undefined_name" is undefined' in exc.value.detail
    assert "b/k.cu(12): error" in exc.value.detail and "<spill_kernel instance>" in exc.value.detail  # the file, not a temp TU


def test_cache_key_follows_headers(tmp_path):
    fam = _family(tmp_path, '#include "tile.cuh"\n' + TEST_CU)
    (tmp_path / "tile.cuh").write_text("#define TILE 1\n")
    unit = fam.cuda_units({"N": 4, "SMEM_FLOATS": 256}, "fp32", {})[0]
    first = compile_unit(fam, unit, "sm_90", cache=tmp_path / "c")
    assert compile_unit(fam, unit, "sm_90", cache=tmp_path / "c").cache_hit
    (tmp_path / "tile.cuh").write_text("#define TILE 2\n")
    assert not compile_unit(fam, unit, "sm_90", cache=tmp_path / "c").cache_hit and first.entry
    assert tmp_path / "tile.cuh" in [Path(p) for p in fam.source_files()]


def test_sweep_rows_have_facts_and_no_pass(tmp_path):
    """What a sweep on this CPU host does with the built-in family: registers and shared memory from nvcc,
    configs over the static shared-memory limit REGRESS before nvcc with the declared formula's figure, the rest NEEDS_REVIEW with compile facts only."""
    from kernel_assets.sweep import verdict_for
    from kregress.core.bind import load_bound
    from kregress.core.records import Suggestion
    from resources.gpu import InterpreterBackend

    bound = load_bound(SPEC)
    configs = [BASELINE, {**BASELINE, "STAGES": 3}]
    sugg = [Suggestion(variant_id=f"v{i}", config=c, patch_summary="t", source="t", round=1, risk="low")
            for i, c in enumerate(configs)]
    rows, stats = InterpreterBackend(cache_dir=str(tmp_path), workers=2).evaluate(bound, sugg, log=lambda _m: None)
    assert stats.compiles == 1 and stats.correctness_runs == 0  # the 3-stage config is refused before nvcc
    ok, over = rows
    assert ok.compile.regs_per_thread > 0 and ok.compile.smem_bytes == 37376 and ok.error is None
    verdicts = [verdict_for(r, rows[0], bound.spec) for r in rows]
    assert [v.verdict for v in verdicts] == ["NEEDS_REVIEW", "REGRESS"]
    assert verdicts[0].reasons == ["compile facts only: correctness and timing need a GPU"]
    assert verdicts[1].cause == "infeasible" and "56064 B > 49152 B" in verdicts[1].reasons[0]  # the declared formula
    again, stats2 = InterpreterBackend(cache_dir=str(tmp_path), workers=1).evaluate(bound, sugg, log=lambda _m: None)
    assert stats2.compile_cache_hits == 1 and again[1].error == "invalid_config"


def test_judge_cu_patches(tmp_path, monkeypatch):
    """kregress judge's path for .cu patches on a CPU host: shared memory past the limit is REGRESS
    infeasible citing ptxas, an honest edit NEEDS_REVIEW (compile facts only), an edit outside the kernel
    functions and an environment read are rejected."""
    from kernel_assets.judge import PatchArg, judge
    from kregress.core.patch import unified_diff

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    rel = "kernels/cuda/gemm_fp8_cuda.cu"
    old = (REPO / rel).read_text()
    edits = {
        "smem": old.replace("__shared__ float sSA[STAGES][BLOCK_M];", "__shared__ float sSA[STAGES][BLOCK_M * 64];"),
        "honest": old.replace("#pragma unroll 1\n", "#pragma unroll 2\n"),
        "outside": old.replace("#define KREGRESS_PAD 16", "#define KREGRESS_PAD 32"),
        "env": old.replace("    const int kslabs = K / BK;\n", "    const int kslabs = K / BK;\n    if (getenv(\"X\")) return;\n"),
    }
    patches = [PatchArg(path=tmp_path / f"{k}.patch", text=unified_diff(rel, old, v), variant_id=k) for k, v in edits.items()]
    result = judge(SPEC, patches, backend="interpreter")
    v = result.verdicts
    assert (v["smem"].verdict, v["smem"].cause) == ("REGRESS", "infeasible")
    assert "ptxas error" in v["smem"].reasons[0] and "uses too much shared data" in v["smem"].reasons[0]
    assert v["honest"].verdict == "NEEDS_REVIEW" and "compile facts only: correctness and timing need a GPU" in v["honest"].reasons[0]
    assert (v["outside"].verdict, v["outside"].cause) == ("REGRESS", "rejected") and "outside the kernel functions" in v["outside"].reasons[0]
    assert (v["env"].verdict, v["env"].cause) == ("REGRESS", "rejected") and "[environment]" in v["env"].reasons[0]
    assert (REPO / rel).read_text() == old  # the working tree is never modified


def test_scaffolded_cuda_plugin_conforms(tmp_path, monkeypatch):
    """`kregress family new NAME --kind cuda` writes a plugin whose family passes the cuda kind's checks
    (loaded by import path here: no pip install in a test)."""
    import yaml

    from kernel_assets.cli_family import scaffold
    from kernel_assets.conformance import run_checks

    scaffold("cu_rowsum", tmp_path / "plug", kind="cuda")
    root = tmp_path / "plug"
    assert (root / "kregress_cu_rowsum" / "cu_rowsum.cu").is_file()
    monkeypatch.syspath_prepend(str(root))
    spec = root / "specs" / "cu_rowsum.yaml"
    data = yaml.safe_load(spec.read_text())
    data["kernel_family"] = "kregress_cu_rowsum.family:FAMILY"
    spec.write_text(yaml.safe_dump(data))
    checks = {c.name: c for c in run_checks("kregress_cu_rowsum.family:FAMILY", spec)}
    assert all(c.ok for c in checks.values()), [c.line() for c in checks.values() if not c.ok]
    assert checks["tunables"].status == "PASS" and "define VEC" in checks["tunables"].detail
    assert checks["sweep_path"].status == "PASS" and "cuobjdump agrees" in checks["sweep_path"].detail
    assert checks["kernel_vs_reference"].status in ("SKIP", "PASS")


def test_no_nvcc_cli_exits_2(tmp_path):
    """`kregress specs validate` on a CUDA spec with no nvcc on PATH: exit 2 and the one line that says how to get it."""
    if cuda_source._wheel_nvcc():
        pytest.skip("this environment has the nvidia-cuda-nvcc wheel installed")
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_HOME", "CUDA_PATH", "KREGRESS_NVCC")}
    env["PATH"] = str(tmp_path)
    res = subprocess.run([str(Path(sys.executable).parent / "kregress"), "specs", "validate", str(SPEC)],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 2, res.stderr
    assert res.stderr.count(cuda_source.NVCC_HINT) == 1


def test_review_compares_ptxas_facts_for_a_cu_diff(tmp_path, monkeypatch):
    """`kregress review --offline` on a .cu change of a plugin (in its own git repository): both sides compiled
    by nvcc (no GPU, no key), ptxas's facts base vs new: the static shared memory a patch adds shows."""
    import tempfile

    sys.path.insert(0, str(REPO / "tests"))
    from review_helpers import commit_all, worktrees

    from kernel_assets.cli_family import scaffold
    from kernel_assets.review import run_review
    from kregress.core import family as registry
    from kregress.core.spec import load_spec

    repo = tmp_path / "plug"
    scaffold("cu_review", repo, kind="cuda")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    commit_all(repo, "plugin: cuda row sum")
    cu = repo / "kregress_cu_review" / "cu_review.cu"
    cu.write_text(cu.read_text().replace("__shared__ float partial[BLOCK];", "__shared__ float partial[BLOCK * 8];"))
    target = "kregress_cu_review.family:FAMILY"
    monkeypatch.syspath_prepend(str(repo))
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.setenv("KREGRESS_REVIEW_CACHE", str(tmp_path / "review-cache"))
    monkeypatch.delenv("KREGRESS_REVIEW_REPO", raising=False)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    try:
        spec = load_spec(repo / "specs" / "cu_review.yaml").model_copy(update={"kernel_family": target})
        r = run_review(spec, home=home, no_model_reason="offline test")
        assert r.base_ref == "HEAD" and r.worktree_dirty and "kregress_cu_review/cu_review.cu" in r.files_reviewed
        cd = r.compile
        assert cd is not None and cd.base is not None and cd.base.ok and cd.new.ok, (cd.base, cd.new)
        rows = {row["metric"]: row for row in cd.rows}
        assert rows["smem_static_bytes"]["base"] == 1024 and rows["smem_static_bytes"]["new"] == 8192
        assert {"regs_per_thread", "spill_stores", "barriers"} <= set(rows)
        assert worktrees(repo) == 1
    finally:
        registry.FAMILIES.pop(target, None)
        for name in [m for m in sys.modules if m.startswith("kregress_cu_review")]:
            del sys.modules[name]
