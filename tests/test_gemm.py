"""GEMM family: interpreter correctness, real sm_90 compile stats, failures as values, caching."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernels.compile import CompileError, compile_units
from kregress.core.bind import bind
from kregress.core.family import get_family
from kregress.core.records import Suggestion
from kregress.core.spec import HardwareLimits, parse_spec
from resources.gpu import InterpreterBackend
from resources.workers import WorkerPool, worker_env

GEMM = get_family("gemm")
RAGGED = [{"M": 257, "N": 193, "K": 131}, {"M": 1, "N": 17, "K": 9}, {"M": 33, "N": 64, "K": 200}]
CONFIGS = [
    dict(BLOCK_M=64, BLOCK_N=32, BLOCK_K=32, GROUP_M=4, num_stages=2, num_warps=4),
    dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=16, GROUP_M=1, num_stages=1, num_warps=2),
    dict(BLOCK_M=128, BLOCK_N=16, BLOCK_K=64, GROUP_M=16, num_stages=3, num_warps=4),
]


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"BM{c['BLOCK_M']}BN{c['BLOCK_N']}BK{c['BLOCK_K']}G{c['GROUP_M']}")
def test_interpreter_matches_float64_reference(interpreter, config, dtype):
    res = interpreter.correctness("gemm", config, RAGGED, dtype=dtype, tolerance=1e-2)
    c = res["correctness"]
    assert c["ok"], c["mismatch_sample"]
    assert c["shapes_checked"] == ["257x193x131", "1x17x9", "33x64x200"]
    assert not c["nan_inf"] and c["max_rel_err"] < 0.05


def test_compare_reports_mismatches_readably():
    import torch

    from kernels.measure import compare

    ref = torch.arange(12, dtype=torch.float64).reshape(3, 4)
    out = ref.clone()
    out[1, 2] += 1.0
    out[2, 3] = float("nan")
    res = compare(out, ref, atol=1e-3, rtol=1e-3)
    assert not res["ok"] and res["mismatches"] == 2 and res["nan_inf"]
    assert "2 of 12 elements" in res["sample"] and "(1, 2): got 7, want 6" in res["sample"]


def _stats(config):
    return compile_units(GEMM.compile_units(config, "bf16", {}), "sm_90", HardwareLimits())


def test_sm90_compile_stats_behave():
    small = _stats(dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, GROUP_M=8, num_stages=3, num_warps=4))
    large = _stats(dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_stages=3, num_warps=8))
    assert large.smem_bytes > small.smem_bytes > 0
    assert 0 < small.regs_per_thread <= 255 and 0 < large.regs_per_thread <= 255
    assert large.sass_mix.get("tensor_wgmma", 0) > 0  # Hopper warpgroup MMA in the SASS
    assert 0 < large.occupancy <= small.occupancy <= 1
    deeper = _stats(dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_stages=4, num_warps=8))
    assert deeper.smem_bytes > large.smem_bytes  # each pipeline stage holds another A+B slab


def test_over_shared_memory_is_out_of_resources_not_a_crash(monkeypatch, tmp_path):
    """Past the limit the compile ends once Triton knows the kernel's shared memory (its LLVM IR): no PTX,
    no ptxas, no disassembly, the same verdict. A config within the limit still goes the whole way."""
    from triton import knobs
    from triton.backends.nvidia.compiler import CUDABackend

    monkeypatch.setattr(knobs.cache, "dir", str(tmp_path))  # compile for real: nothing from Triton's cache

    ptx_calls = []
    make_ptx = CUDABackend.make_ptx
    monkeypatch.setattr(CUDABackend, "make_ptx", lambda self, *a, **k: ptx_calls.append(1) or make_ptx(self, *a, **k))
    cfg = dict(BLOCK_M=256, BLOCK_N=128, BLOCK_K=128, GROUP_M=8, num_stages=4, num_warps=8)
    assert GEMM.space.check(cfg) is None  # inside the space: only the compile can tell
    with pytest.raises(CompileError) as exc:
        _stats(cfg)
    assert exc.value.error == "out_of_resources" and "232448" in exc.value.detail
    assert ptx_calls == []  # stopped before PTX
    ok = _stats(dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, GROUP_M=4, num_stages=2, num_warps=4))
    assert ptx_calls == [1] and ok.smem_bytes > 0 and ok.regs_per_thread > 0


def test_occupancy_limits():
    from kernels.compile import occupancy

    lim = HardwareLimits()
    assert occupancy(32, 0, 4, lim)[0] == 1.0
    occ, blocks, limiter = occupancy(255, 1024, 8, lim)
    assert (blocks, limiter) == (1, "registers") and occ == 8 / 64
    occ, blocks, limiter = occupancy(64, 100_000, 4, lim)
    assert (blocks, limiter) == (2, "shared_memory")


SMOKE = {
    "task_id": "gemm_unit", "kernel_family": "gemm", "dtype": "fp16",
    "shape_matrix": [{"M": 512, "N": 512, "K": 512}], "correctness_shapes": [{"M": 40, "N": 24, "K": 40}],
    "baseline": dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, GROUP_M=4, num_stages=2, num_warps=4),
    "benchmark": {"timeout_s": 240},
}


def test_failures_are_rows_and_the_round_goes_on(tmp_path):
    spec = parse_spec(SMOKE)
    bench = InterpreterBackend(cache_dir=str(tmp_path), workers=2)
    sugg = [
        Suggestion(variant_id="ok", config=CONFIGS[0], patch_summary="x", round=1),
        Suggestion(variant_id="oom", config=dict(BLOCK_M=256, BLOCK_N=128, BLOCK_K=128, GROUP_M=8, num_stages=4, num_warps=8),
                   patch_summary="x", round=1),
        Suggestion(variant_id="bad", config=dict(BLOCK_M=48, BLOCK_N=64, BLOCK_K=32, GROUP_M=4, num_stages=2, num_warps=4),
                   patch_summary="x", round=1),
    ]
    bound = bind(spec)
    rows, stats = bench.evaluate(bound, sugg, log=lambda m: None)
    by_id = {r.variant_id: r for r in rows}
    assert by_id["ok"].error is None and by_id["ok"].correctness.ok and by_id["ok"].evidence == "model"
    assert by_id["ok"].measurements[0].p50_ms > 0 and by_id["ok"].compile.regs_per_thread > 0
    assert by_id["oom"].error == "out_of_resources" and by_id["oom"].compile is None
    assert by_id["bad"].error == "invalid_config" and "BLOCK_M=48" in by_id["bad"].error_detail
    assert stats.compiles == 2 and stats.compile_cache_hits == 0

    rows2, stats2 = bench.evaluate(bound, sugg, log=lambda m: None)
    assert stats2.compiles == 0 and stats2.compile_cache_hits == 2 and stats2.correctness_runs == 0
    assert [r.error for r in rows2] == [r.error for r in rows]
    assert rows2[0].compile.regs_per_thread == rows[0].compile.regs_per_thread and rows2[0].compile.cache_hit


def test_worker_pool_timeout_and_crash_are_values(tmp_path):
    env = worker_env(tmp_path, interpret=False)
    pool = WorkerPool(1, env)
    compile_job = {"op": "compile", "family": "gemm", "config": CONFIGS[2], "dtype": "bf16", "arch": "sm_90",
                   "limits": HardwareLimits().model_dump()}
    # A cold compile cannot finish in 0.2 s: the worker is killed and the row says so.
    res = pool.run([compile_job], timeout=0.2)
    assert res[0]["error"] == "timeout" and "killed" in res[0]["detail"]
    # the pool goes on with a fresh worker
    res = pool.run([{"op": "ping", "family": "gemm"}, compile_job], timeout=120)
    assert "pong" in res[0] and res[1]["stats"]["regs_per_thread"] > 0
    assert pool.spawned == 2  # one killed at the timeout, one fresh that served both later jobs
    pool.close()

    import os
    import signal

    from resources.workers import Worker, WorkerDied

    w = Worker(env)
    w.wait_ready(120)
    pid = w.call({"op": "ping", "family": "gemm"}, 60)["pong"]
    os.kill(pid, signal.SIGKILL)  # what an illegal memory access does to a CUDA process
    with pytest.raises(WorkerDied):
        w.call({"op": "ping", "family": "gemm"}, 60)


def test_checks_differing_only_in_launch_options_share_one_interpreter_run(tmp_path):
    """num_warps and num_stages reach the GEMM only as launch options, which Triton's interpreter drops:
    variants that differ in nothing else get one interpreter run, the same result, and say whose; a
    variant that differs in a tile size runs its own check. Each still compiles on its own (the compile
    facts differ)."""
    assert GEMM.interpreter_ignores == ("num_warps", "num_stages")
    spec = parse_spec(SMOKE)
    bench = InterpreterBackend(cache_dir=str(tmp_path), workers=2)
    base = CONFIGS[0]
    sugg = [Suggestion(variant_id="a", config=base, patch_summary="x", round=1),
            Suggestion(variant_id="a-s3", config=dict(base, num_stages=3), patch_summary="x", round=1),
            Suggestion(variant_id="a-w2", config=dict(base, num_warps=2), patch_summary="x", round=1),
            Suggestion(variant_id="b", config=dict(base, BLOCK_K=16), patch_summary="x", round=1)]
    lines: list[str] = []
    rows, stats = bench.evaluate(bind(spec), sugg, log=lines.append)
    assert stats.compiles == 4 and stats.correctness_runs == 2 and stats.correctness_shared == 2
    by_id = {r.variant_id: r for r in rows}
    assert all(r.error is None and r.correctness.ok for r in rows), [r.error_detail for r in rows]
    for vid in ("a-s3", "a-w2"):
        assert by_id[vid].correctness == by_id["a"].correctness
    shared = [ln for ln in lines if "the interpreter run of" in ln]  # whichever compiled first runs the check
    assert len(shared) == 2 and all("(they differ only in num_" in ln for ln in shared), shared
    assert not any(" b:" in ln or " of b " in ln for ln in shared)
    assert by_id["a-s3"].compile.smem_bytes != by_id["a"].compile.smem_bytes  # compiled apart: different facts
    # the shared result is cached under the same key: a later round answers all three from the cache
    rows2, stats2 = bench.evaluate(bind(spec), sugg[:3], log=lambda m: None)
    assert stats2.correctness_runs == 0 and stats2.correctness_cache_hits == 3


def test_worker_pools_keep_their_size_and_start_workers_ahead(tmp_path):
    """The first step (the baseline: one job) must not size the pool every later round shares; a step
    starts its checking workers with its compiling ones, and a later step starts only what it lacks."""
    import dagster as dg

    spec = parse_spec(SMOKE)
    bench = InterpreterBackend(cache_dir=str(tmp_path), workers=2)
    bench.setup_for_execution(dg.build_init_resource_context())  # as a Dagster run does: workers live for the run
    try:
        one = [Suggestion(variant_id="baseline", config=CONFIGS[0], patch_summary="x", round=0)]
        _, stats = bench.evaluate(bind(spec), one, log=lambda m: None)
        assert bench._pools["compile"].size == 2 and bench._pools["correctness"].size == 2
        assert stats.workers_spawned == 2  # one per pool for one job, the checker started with the compiler
        two = [Suggestion(variant_id=f"r1-{i}", config=c, patch_summary="x", round=1) for i, c in enumerate(CONFIGS[1:])]
        _, stats = bench.evaluate(bind(spec), two, log=lambda m: None)
        assert stats.workers_spawned == 4 and stats.compiles == 2  # two jobs: the second worker of each pool
    finally:
        bench.teardown_after_execution(dg.build_init_resource_context())
    assert bench._pools == {}


def test_the_baseline_run_ahead_answers_the_first_step(tmp_path):
    """The CLI compiles and checks the baseline on reserved workers while it imports Dagster; the first
    step's pools take those answers (no worker of theirs runs the jobs again) and the cache gets them as
    from any compile. A job that differs from the one run ahead runs as usual."""
    import dagster as dg

    from resources.gpu import run_baseline_ahead
    from resources.workers import reserve

    spec = parse_spec(SMOKE)
    bound = bind(spec)
    for interpret in (False, True):
        reserve(worker_env(tmp_path, interpret), 2)  # as the CLI does: one runs ahead, the pool adopts the other
    assert run_baseline_ahead(bound, tmp_path) == ["compile", "correctness"]
    bench = InterpreterBackend(cache_dir=str(tmp_path), workers=2)
    bench.setup_for_execution(dg.build_init_resource_context())
    try:
        base = [Suggestion(variant_id="baseline", config=spec.baseline, patch_summary="x", round=0)]
        lines: list[str] = []
        (row,), stats = bench.evaluate(bound, base, log=lines.append)
        assert row.error is None and row.correctness.ok and row.compile.regs_per_thread > 0
        assert row.compile.cache_hit is False and stats.compiles == 1 and stats.correctness_runs == 1
        # both answers came from the runs ahead: no worker of the pools ran the baseline again
        assert {k: p.answered_ahead for k, p in bench._pools.items()} == {"compile": 1, "correctness": 1}
        assert list((tmp_path / "compile").glob("*.json")) and list((tmp_path / "correctness").glob("*.json"))
        other = [Suggestion(variant_id="other", config=CONFIGS[1], patch_summary="x", round=1)]
        (row2,), stats2 = bench.evaluate(bound, other, log=lines.append)
        assert row2.error is None and stats2.compiles == 1 and row2.compile.regs_per_thread > 0
    finally:
        bench.teardown_after_execution(dg.build_init_resource_context())
    assert run_baseline_ahead(bound, tmp_path) == []  # both in the cache now: nothing to run ahead


def test_pool_prestart_and_submit(tmp_path):
    env = worker_env(tmp_path, interpret=False)
    with WorkerPool(2, env) as pool:
        pool.prestart(5)  # never more than the pool's size
        assert pool.spawned == 2
        results = [pool.submit({"op": "ping", "family": "gemm"}, 120) for _ in range(4)]
        pids = {f.result()["pong"] for f in results}
        assert pool.spawned == 2 and 1 <= len(pids) <= 2  # the prestarted workers served every job


def test_sass_mix_from_nvdisasm_is_cuobjdump_s():
    """The compile reads the SASS with `nvdisasm -c -ndf` (no dataflow pass: faster); the instruction mix
    is exactly what `cuobjdump -sass` gives."""
    import subprocess
    import tempfile
    from pathlib import Path

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from kernels.compile import _tool, sass_mix

    cfg = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_stages=3, num_warps=8)
    (unit,) = GEMM.compile_units(cfg, "bf16", {})
    attrs = {(unit.fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in unit.divisible}
    compiled = triton.compile(ASTSource(fn=unit.fn, signature=unit.signature, constexprs=unit.constexprs, attrs=attrs),
                              target=GPUTarget("cuda", 90, 32), options={"num_warps": 8, "num_stages": 3})
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        fast = subprocess.run([_tool("nvdisasm"), "-c", "-ndf", str(cubin)], capture_output=True, text=True, check=True).stdout
        full = subprocess.run([_tool("cuobjdump"), "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
    assert sass_mix(fast) == sass_mix(full) and sass_mix(fast)[0] > 100
    assert sass_mix(fast)[1].get("tensor_wgmma", 0) > 0
    assert _stats(cfg).sass_instructions == sass_mix(full)[0]


def test_workers_run_one_blas_thread_unless_told_otherwise(tmp_path, monkeypatch):
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(var, raising=False)
    env = worker_env(tmp_path, interpret=True)
    assert env["OMP_NUM_THREADS"] == env["OPENBLAS_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "1"
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert worker_env(tmp_path, interpret=True)["OMP_NUM_THREADS"] == "3"


def test_a_worker_ends_with_its_parent(tmp_path):
    """A killed sweep (SIGKILL, no atexit) leaves no worker behind, not even one in the middle of a job
    (an idle one sees its stdin close; a busy one would run to the end of its job without the watch)."""
    import signal
    import subprocess
    import sys
    import time

    code = ("import sys, time; from pathlib import Path; from resources.workers import Worker, worker_env; "
            f"w = Worker(worker_env(Path({str(tmp_path)!r}), True)); w.wait_ready(120); "
            # a check that runs for minutes in the interpreter: the worker is mid-job when its parent dies
            "import json; w.proc.stdin.write(json.dumps({'op': 'correctness', 'family': 'gemm', 'config': "
            "{'BLOCK_M': 16, 'BLOCK_N': 16, 'BLOCK_K': 16, 'GROUP_M': 1, 'num_stages': 2, 'num_warps': 4}, "
            "'dtype': 'bf16', 'shapes': [{'M': 2048, 'N': 2048, 'K': 2048}], 'tolerance': 0.01, 'params': {}, "
            "'device': 'cpu', 'interpret': True}) + '\\n'); w.proc.stdin.flush(); "
            "print(w.proc.pid, flush=True); time.sleep(600)")
    repo = Path(__file__).resolve().parent.parent
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=str(repo))
    try:
        child = int(parent.stdout.readline())
        assert Path(f"/proc/{child}").exists()
        time.sleep(3)  # the job is under way
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        def alive() -> bool:  # a process that exists and is not a zombie (its state follows the ")" in stat)
            try:
                return not Path(f"/proc/{child}/stat").read_text().rpartition(")")[2].strip().startswith("Z")
            except OSError:
                return False

        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and alive():
            time.sleep(0.2)
        assert not alive(), "the worker outlived its parent"
    finally:
        parent.kill()
