"""The CPU interpreter computes, and returns to host code, what the kernel compiled for the spec's arch would
(kernels/interpreter.py's ``FIDELITY_NAMES``; docs/gpu-only.md lists what it still cannot).

- The compiled behaviour is read from the PTX Triton emits for sm_90 on this CPU host (AOT, no GPU): a default
  fp32 ``tl.dot`` is an ``mma``/``wgmma`` on ``.tf32`` operands fed straight from fp32 registers (no
  ``cvt.rna.tf32.f32``: the tensor core reads the top 10 mantissa bits), ``input_precision="tf32x3"`` splits
  with ``cvt.rna`` into three tf32 MMAs, ``"ieee"`` (and every fp32 dot for sm_75) is FMA; an fp8 dot adds
  its partial accumulator with ``add.f32`` every ``max_num_imprecise_acc`` elements of K and never by default.
- The interpreter's results are then checked against references computed here from those rules, in a child
  process with TRITON_INTERPRET=1 (set before Triton decorates anything), after ``import kernels``.
- The GPU-marked tests at the end run the same probes compiled on a GPU and compare them with the
  interpreter's answers (skipped here: no GPU).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from kernels import interpreter as ki

REPO = Path(__file__).resolve().parent.parent

# --- the probe kernels (one source: compiled here for sm_90, interpreted in the child, run on the GPU) -----

PROBES = r'''
import triton
import triton.language as tl


@triton.jit
def dot16(a_ptr, b_ptr, c_ptr, PREC: tl.constexpr):
    r = tl.arange(0, 16)
    a = tl.load(a_ptr + r[:, None] * 16 + r[None, :])
    b = tl.load(b_ptr + r[:, None] * 16 + r[None, :])
    if PREC == "default":
        c = tl.dot(a, b)
    elif PREC == "no_tf32":
        c = tl.dot(a, b, allow_tf32=False)
    else:
        c = tl.dot(a, b, input_precision=PREC)
    tl.store(c_ptr + r[:, None] * 16 + r[None, :], c)


@triton.jit
def fp8_gemm(a_ptr, b_ptr, c_ptr, K, MODE: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """One (BM, BN) tile of A (BM, K) @ B (K, BN); MODE: "promote" (acc += tl.dot(a, b): the partial sum of
    each K block is added on CUDA cores, as DeepGEMM does), "chain" (acc = tl.dot(a, b, acc): the tensor core
    accumulates the whole K), "mni32" (acc = tl.dot(a, b, acc, max_num_imprecise_acc=32): Triton promotes)."""
    rm = tl.arange(0, BM)
    rn = tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), tl.float32)
    for k in range(0, K, BK):
        a = tl.load(a_ptr + rm[:, None] * K + (k + rk)[None, :])
        b = tl.load(b_ptr + (k + rk)[:, None] * BN + rn[None, :])
        if MODE == "promote":
            acc += tl.dot(a, b)
        elif MODE == "chain":
            acc = tl.dot(a, b, acc)
        else:
            acc = tl.dot(a, b, acc, max_num_imprecise_acc=32)
    tl.store(c_ptr + rm[:, None] * BN + rn[None, :], acc)


@triton.jit
def copy_tile(x_ptr, y_ptr, BLOCK: tl.constexpr):
    r = tl.arange(0, BLOCK)
    tl.store(y_ptr + r, tl.load(x_ptr + r))
'''

PRECISIONS = ("default", "tf32", "tf32x3", "ieee", "no_tf32")
FP8_K = 2048


def _fp32_operands() -> tuple[np.ndarray, np.ndarray]:
    """A = 1 + 2**-20 everywhere (the issue's probe: tf32 reads 1.0) with a row of values whose dropped bits
    are above half a tf32 step (truncation and round-to-nearest differ there), and random values; B random."""
    rng = np.random.default_rng(3)
    a = np.full((16, 16), 1 + 2.0 ** -20, dtype=np.float32)
    a[1] = 1 + 0.75 * 2.0 ** -10  # tf32 truncation: 1.0; cvt.rna: 1 + 2**-10
    a[2:] = rng.standard_normal((14, 16)).astype(np.float32)
    b = rng.standard_normal((16, 16)).astype(np.float32)
    b[:, 0] = 0.0
    b[0, 0] = 1.0  # column 0 of A @ B is column 0 of A
    return a, b


def _fp8_operands() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    a = (torch.rand(16, FP8_K, generator=g) + 0.5).to(torch.float8_e4m3fn)
    b = (torch.rand(FP8_K, 16, generator=g) + 0.5).to(torch.float8_e4m3fn)
    return a, b


_CHILD = r"""
import json, sys
import numpy as np
import torch
sys.path.insert(0, sys.argv[1])
import kernels  # installs kernels/interpreter.py's fixes and emulations under TRITON_INTERPRET=1
from kernels import interpreter as ki
import probes
from test_interpreter_fidelity import _fp32_operands, _fp8_operands, PRECISIONS, FP8_K

out = {"fidelity": ki.fidelity()}
a, b = _fp32_operands()
for prec in PRECISIONS:
    c = torch.empty(16, 16)
    probes.dot16[(1,)](torch.from_numpy(a), torch.from_numpy(b), c, prec)
    out["dot_" + prec] = c.numpy().tolist()
ki.set_target_arch("sm_75")
c = torch.empty(16, 16)
probes.dot16[(1,)](torch.from_numpy(a), torch.from_numpy(b), c, "default")
out["dot_default_sm75"] = c.numpy().tolist()
ki.set_target_arch(None)
fa, fb = _fp8_operands()
for mode in ("promote", "chain", "mni32"):
    c = torch.empty(16, 16)
    probes.fp8_gemm[(1,)](fa, fb, c, FP8_K, mode, 16, 16, 128)
    out["fp8_" + mode] = c.numpy().tolist()
ki.set_target_arch("sm_80")
c = torch.empty(16, 16)
probes.fp8_gemm[(1,)](fa, fb, c, FP8_K, "chain", 16, 16, 128)
out["fp8_chain_sm80"] = c.numpy().tolist()
ki.set_target_arch(None)
reads = []
ki.watch_launch_reads(reads.append)
x, y = torch.arange(16.0), torch.empty(16)
h = probes.copy_tile[(1,)](x, y, 16)
out["handle_is_none"] = h is None
out["reads_after_launch"] = list(reads)
out["truth"] = bool(h)
out["eq_none"] = h == None  # noqa: E711
try:
    h.n_regs
except AttributeError:
    pass
str(h)
out["reads"] = reads
out["copied"] = bool((y == x).all())
print("@@" + json.dumps(out))
"""


def _run_child(tmp: Path, env_extra: dict | None = None) -> dict:
    (tmp / "probes.py").write_text(PROBES)
    path = [str(REPO), str(REPO / "tests")] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join(path), PYTHONWARNINGS="ignore")
    env.pop("TRITON_F32_DEFAULT", None)
    env.update(env_extra or {})
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(tmp)], capture_output=True, text=True, cwd=REPO,
                          env=env, timeout=600)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("@@")), None)
    assert line, proc.stderr[-3000:]
    return json.loads(line[2:])


@pytest.fixture(scope="module")
def child(tmp_path_factory):
    return _run_child(tmp_path_factory.mktemp("fidelity"))


# --- the compiled behaviour, from the PTX (AOT for sm_90 on this host) ---------------------------------------


def _ptx(tmp: Path, kernel: str, signature: dict, constexprs: dict, cap: int = 90) -> str:
    """The PTX of probes.<kernel> compiled for sm_<cap>, in a child (no interpreter)."""
    (tmp / "probes.py").write_text(PROBES)
    code = (
        "import sys, json, triton\n"
        f"sys.path.insert(0, {str(tmp)!r})\n"
        "import probes\n"
        "from triton.backends.compiler import GPUTarget\n"
        "from triton.compiler import ASTSource\n"
        f"src = ASTSource(probes.{kernel}, {signature!r}, {constexprs!r})\n"
        f"print('@@' + json.dumps(triton.compile(src, target=GPUTarget('cuda', {cap}, 32), options={{'num_warps': 4}}).asm['ptx']))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "TRITON_F32_DEFAULT")}
    env.update(TRITON_CACHE_DIR=str(tmp / "cache"), PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("@@")), None)
    assert line, proc.stderr[-3000:]
    return json.loads(line[2:])


def _ops(ptx: str) -> set[str]:
    return {re.split(r"\s", ln.strip())[0] for ln in ptx.splitlines() if ln.strip() and not ln.strip().startswith("//")}


@pytest.fixture(scope="module")
def ptx(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ptx")
    sig = {"a_ptr": "*fp32", "b_ptr": "*fp32", "c_ptr": "*fp32", "PREC": "constexpr"}
    out = {f"dot_{p}": _ptx(tmp, "dot16", sig, {"PREC": p}) for p in PRECISIONS}
    out["dot_default_sm75"] = _ptx(tmp, "dot16", sig, {"PREC": "default"}, cap=75)
    sig8 = {"a_ptr": "*fp8e4nv", "b_ptr": "*fp8e4nv", "c_ptr": "*fp32", "K": "i32", "MODE": "constexpr",
            "BM": "constexpr", "BN": "constexpr", "BK": "constexpr"}
    for mode in ("chain", "mni32"):
        out[f"fp8_{mode}"] = _ptx(tmp, "fp8_gemm", sig8, {"MODE": mode, "BM": 64, "BN": 64, "BK": 64})
    return out


@pytest.mark.slow  # a child process on the interpreter, or AOT compiles for sm_90
def test_compiled_fp32_dot_reads_tf32_by_default_and_honours_ieee_and_tf32x3(ptx):
    for prec in ("default", "tf32"):
        ops = _ops(ptx[f"dot_{prec}"])
        assert any(o.startswith(("mma.", "wgmma.")) and ".tf32" in o for o in ops), sorted(ops)
        assert not any(o.startswith("cvt.rna.tf32") for o in ops), "the default tf32 dot converts: round, not truncate"
    x3 = _ops(ptx["dot_tf32x3"])
    assert "cvt.rna.tf32.f32" in x3 and any(".tf32" in o and o.startswith(("mma.", "wgmma.")) for o in x3)
    for prec in ("ieee", "no_tf32"):
        ops = _ops(ptx[f"dot_{prec}"])
        assert not any(".tf32" in o for o in ops) and "fma.rn.f32" in ops, sorted(ops)
    sm75 = _ops(ptx["dot_default_sm75"])
    assert not any(".tf32" in o for o in sm75) and "fma.rn.f32" in sm75


@pytest.mark.slow  # a child process on the interpreter, or AOT compiles for sm_90
def test_compiled_fp8_dot_promotes_only_when_max_num_imprecise_acc_says(ptx):
    chain, mni = ptx["fp8_chain"], ptx["fp8_mni32"]
    assert any(o.startswith("wgmma.") and "e4m3" in o for o in _ops(chain))
    adds = lambda text: sum(1 for ln in text.splitlines() if ln.strip().startswith("add.f32"))  # noqa: E731
    # default (2**30 on sm_90): the wgmma accumulates into the loop's accumulator, no fp32 add; 32: a 64x64
    # tile's 32 accumulator registers per thread added twice per K block of 64
    assert adds(chain) == 0 and adds(mni) == 64, (adds(chain), adds(mni))


# --- the interpreter computes that ----------------------------------------------------------------------------


def test_tf32_helpers():
    x = np.array([1 + 2.0 ** -20, 1 + 0.75 * 2.0 ** -10, -(1 + 0.75 * 2.0 ** -10), 1 + 2.0 ** -11, np.inf, np.nan,
                  np.finfo(np.float32).max], dtype=np.float32)
    t, r = ki.tf32_truncate(x), ki.tf32_round(x)
    assert t[:4].tolist() == [1.0, 1.0, -1.0, 1.0] and np.isinf(t[4]) and np.isnan(t[5])
    assert r[:4].tolist() == [1.0, 1 + 2.0 ** -10, -(1 + 2.0 ** -10), 1 + 2.0 ** -10]  # ties away from zero
    assert (r.view(np.uint32) & 0x1FFF == 0)[[0, 1, 2, 3, 6]].all() and np.isinf(r[6])  # past max rounds to inf


@pytest.mark.slow  # a child process on the interpreter, or AOT compiles for sm_90
def test_fp32_dot_rounds_like_the_compiled_kernel(child):
    a, b = _fp32_operands()
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    trunc = ki.tf32_truncate(a).astype(np.float64) @ ki.tf32_truncate(b).astype(np.float64)
    exact = a64 @ b64
    for prec in ("default", "tf32"):
        got = np.array(child[f"dot_{prec}"])
        assert got[0, 0] == 1.0, "the issue's probe: 1 + 2**-20 times 1.0 is 1.0 on an H100 (tf32)"
        assert got[1, 0] == 1.0, "tf32 reads fp32 registers by truncation (1 + 0.75 * 2**-10 -> 1.0)"
        np.testing.assert_allclose(got, trunc, rtol=2e-6, atol=2e-6)
    for prec in ("ieee", "no_tf32"):
        got = np.array(child[f"dot_{prec}"])
        assert got[0, 0] == np.float32(1 + 2.0 ** -20)
        np.testing.assert_allclose(got, exact, rtol=2e-6, atol=2e-6)
    x3 = np.array(child["dot_tf32x3"])
    assert x3[0, 0] == np.float32(1 + 2.0 ** -20) and np.abs(x3 - exact).max() < 1e-5
    assert np.abs(trunc - exact).max() > 1e-3  # the two are far apart: the test can fail
    sm75 = np.array(child["dot_default_sm75"])
    assert sm75[0, 0] == np.float32(1 + 2.0 ** -20), "below sm_80 an fp32 dot is FMA: no tf32"


@pytest.mark.slow  # a child process on the interpreter, or AOT compiles for sm_90
def test_triton_f32_default_env_is_honoured(tmp_path):
    """TRITON_F32_DEFAULT=ieee makes the default dot ieee when compiled (triton.language.dot reads it); the
    interpreter runs the same language code, so it follows."""
    got = _run_child(tmp_path, {"TRITON_F32_DEFAULT": "ieee"})
    assert got["dot_default"][0][0] == np.float32(1 + 2.0 ** -20)


@pytest.mark.slow  # a child process on the interpreter, or AOT compiles for sm_90
def test_fp8_dot_accumulates_like_sm90(child):
    fa, fb = _fp8_operands()
    ref = fa.double() @ fb.double()
    err = {m: float(((torch.tensor(child[f"fp8_{m}"], dtype=torch.float64) - ref).abs() / ref.abs()).max())
           for m in ("promote", "chain", "mni32", "chain_sm80")}
    # dropping the promotion costs accuracy on a long K; keeping it (by hand or through Triton) does not
    assert err["promote"] < 1e-3 and err["mni32"] < 1e-3, err
    assert err["chain"] > 10 * max(err["promote"], err["mni32"]) and err["chain"] > 5e-3, err
    assert err["chain_sm80"] < 1e-5, err  # other arches accumulate in fp32


def test_fp32_dot_rules():
    a, b = _fp32_operands()
    d = np.zeros((16, 16), np.float32)
    trunc = np.matmul(ki.tf32_truncate(a), ki.tf32_truncate(b), dtype=np.float32)
    assert np.array_equal(ki.fp32_dot(a, b, d, "tf32", 90), trunc)
    assert np.array_equal(ki.fp32_dot(a, b, d, "tf32", 80), trunc)
    assert np.array_equal(ki.fp32_dot(a, b, d, "tf32", 75), np.matmul(a, b, dtype=np.float32))  # FMA below sm_80
    assert np.array_equal(ki.fp32_dot(a, b, d, "ieee", 90), np.matmul(a, b, dtype=np.float32))
    assert ki.fp32_dot(a, b, d, "tf32", 90)[0, 0] == 1.0 and ki.fp32_dot(a, b, d, "tf32x3", 90)[0, 0] == np.float32(1 + 2.0 ** -20)
    with pytest.raises(ValueError, match="bf16x3"):
        ki.fp32_dot(a, b, d, "bf16x3", 90)


def test_fp8_dot_emulation_rules():
    # 32 products of 2**-4 added to 2**14: below the 14 bits kept, all dropped; promoted every 32: kept
    a = np.ones((1, 64))
    b = np.full((64, 1), 2.0 ** -4)
    d = np.full((1, 1), 2.0 ** 14, dtype=np.float32)
    assert ki.fp8_dot(a, b, d, 2 ** 30)[0, 0] == 2.0 ** 14
    assert ki.fp8_dot(a, b, d, 32)[0, 0] == 2.0 ** 14 + 4
    assert ki.fp8_dot(a, b, d, 64)[0, 0] == 2.0 ** 14 + 4
    # small accumulators lose nothing
    assert ki.fp8_dot(a, b, np.zeros((1, 1), np.float32), 2 ** 30)[0, 0] == 4.0
    # signs: truncation is toward zero for every term
    assert ki.fp8_dot(-a, b, -d, 2 ** 30)[0, 0] == -(2.0 ** 14)


@pytest.mark.slow  # a child process on the interpreter, or AOT compiles for sm_90
def test_launch_returns_a_handle_whose_reads_are_reported(child):
    assert child["copied"] and child["handle_is_none"] is False
    assert child["reads_after_launch"] == []  # launching without reading reports nothing
    assert child["truth"] is True and child["eq_none"] is False  # as a CompiledKernel answers
    reads = " | ".join(child["reads"])
    for what in ("truth", "comparison", "n_regs", "text"):
        assert what in reads, reads
    assert "copy_tile[grid](...)" in reads


@pytest.mark.slow  # a child process on the interpreter, or AOT compiles for sm_90
def test_fidelity_is_recorded(child):
    fid = child["fidelity"]
    assert fid["arch"] == "sm_90"
    for name in ki.FIDELITY_NAMES:
        assert fid[name] == "applied", (name, fid[name])


def test_target_arch_is_validated():
    with pytest.raises(ValueError, match="sm_NN"):
        ki.arch_capability("hopper")
    assert ki.arch_capability("sm_90a") == 90 and ki.arch_capability("sm_100") == 100


# --- on a GPU: the compiled kernel gives what the interpreter gave ---------------------------------------------


def _gpu_probes(tmp: Path):
    import importlib.util

    (tmp / "probes.py").write_text(PROBES)
    spec = importlib.util.spec_from_file_location("probes_gpu", tmp / "probes.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.gpu
def test_gpu_fp32_dot_matches_the_interpreter(tmp_path, child):
    probes = _gpu_probes(tmp_path)
    a, b = (torch.from_numpy(x).cuda() for x in _fp32_operands())
    for prec in PRECISIONS:
        c = torch.empty(16, 16, device="cuda")
        probes.dot16[(1,)](a, b, c, prec)
        want = np.array(child[f"dot_{prec}"], dtype=np.float32)
        np.testing.assert_allclose(c.cpu().numpy(), want, rtol=2e-6, atol=2e-6, err_msg=prec)
        if prec in ("default", "tf32"):
            assert c[0, 0].item() == 1.0 and c[1, 0].item() == 1.0


@pytest.mark.gpu
def test_gpu_fp8_accumulation_matches_the_interpreter(tmp_path, child):
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the fp8 accumulation emulated is sm_90's")
    probes = _gpu_probes(tmp_path)
    fa, fb = _fp8_operands()
    ref = fa.double() @ fb.double()
    for mode in ("promote", "chain", "mni32"):
        c = torch.empty(16, 16, device="cuda")
        probes.fp8_gemm[(1,)](fa.cuda(), fb.cuda(), c, FP8_K, mode, 16, 16, 128)
        gpu_err = float(((c.cpu().double() - ref).abs() / ref.abs()).max())
        cpu_err = float(((torch.tensor(child[f"fp8_{mode}"], dtype=torch.float64) - ref).abs() / ref.abs()).max())
        # the emulation is a model: the GPU's error within a factor 4 of it (both tiny where promoted)
        assert gpu_err <= max(4 * cpu_err, 1e-4) and cpu_err <= max(4 * gpu_err, 1e-4), (mode, gpu_err, cpu_err)


@pytest.mark.gpu
def test_gpu_launch_returns_a_compiled_kernel(tmp_path):
    probes = _gpu_probes(tmp_path)
    x = torch.arange(16.0, device="cuda")
    y = torch.empty_like(x)
    h = probes.copy_tile[(1,)](x, y, 16)
    assert h is not None and bool(h) and hasattr(h, "n_regs")


# --- what the interpreter still cannot reproduce (docs/gpu-only.md): each exercised on a GPU ---------------------

GPU_ONLY = r'''
import triton
import triton.language as tl


@triton.jit
def chain(x_ptr):
    """Program i writes x[i - 1] + 1: the interpreter runs programs one after another (x[i] == i); a GPU runs
    them at once, so most programs read their neighbour's slot before it is written."""
    pid = tl.program_id(0)
    prev = tl.load(x_ptr + pid - 1, mask=pid > 0, other=0.0)
    tl.store(x_ptr + pid, prev + 1.0)


@triton.jit
def reversed_readback(x_ptr, y_ptr, BLOCK: tl.constexpr):
    """Writes a block, then reads it back reversed with no barrier: other threads' stores may not be visible."""
    r = tl.arange(0, BLOCK)
    tl.store(y_ptr + r, tl.load(x_ptr + r))
    tl.store(x_ptr + BLOCK + r, tl.load(y_ptr + BLOCK - 1 - r))


@triton.jit
def same_address(x_ptr, y_ptr, BLOCK: tl.constexpr):
    """Every lane stores to y[0]: which one wins is unspecified on a GPU (the interpreter: the last lane)."""
    r = tl.arange(0, BLOCK)
    tl.store(y_ptr + r * 0, tl.load(x_ptr + r))


@triton.jit
def atomic_sum(x_ptr, out_ptr):
    pid = tl.program_id(0)
    tl.atomic_add(out_ptr, tl.load(x_ptr + pid))


@triton.jit
def masked_no_other(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    r = tl.arange(0, BLOCK)
    tl.store(y_ptr + r, tl.load(x_ptr + r, mask=r < n))


@triton.jit
def unary(x_ptr, y_ptr, OP: tl.constexpr, BLOCK: tl.constexpr):
    r = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + r)
    if OP == "exp":
        y = tl.exp(x)
    elif OP == "div":
        y = 1.0 / x
    else:
        y = x * x + x  # a multiply-add: fused (one rounding) when compiled with FP fusion
    tl.store(y_ptr + r, y)


@triton.jit
def bf16x3_dot(a_ptr, b_ptr, c_ptr):
    r = tl.arange(0, 16)
    a = tl.load(a_ptr + r[:, None] * 16 + r[None, :])
    b = tl.load(b_ptr + r[:, None] * 16 + r[None, :])
    tl.store(c_ptr + r[:, None] * 16 + r[None, :], tl.dot(a, b, input_precision="bf16x3"))
'''


def _gpu_only(tmp: Path):
    import importlib.util

    (tmp / "gpu_only.py").write_text(GPU_ONLY)
    spec = importlib.util.spec_from_file_location("gpu_only_probes", tmp / "gpu_only.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.gpu
def test_gpu_programs_run_concurrently_not_in_grid_order(tmp_path):
    k = _gpu_only(tmp_path)
    n = 1 << 16
    x = torch.zeros(n, device="cuda")
    k.chain[(n,)](x)
    torch.cuda.synchronize()
    sequential = torch.arange(1, n + 1, dtype=torch.float32, device="cuda")  # the interpreter's answer
    assert not torch.equal(x, sequential), "the GPU ran 65536 programs in grid order: the table's row is wrong"


@pytest.mark.gpu
def test_gpu_store_then_load_without_barrier_is_a_race(tmp_path):
    k = _gpu_only(tmp_path)
    block = 1024
    seen_stale = False
    for _ in range(20):
        x = torch.arange(2 * block, dtype=torch.float32, device="cuda")
        x[block:] = -1.0
        y = torch.full((block,), -7.0, device="cuda")
        k.reversed_readback[(1,)](x, y, block, num_warps=8)
        got = x[block:]
        want = torch.arange(block - 1, -1, -1, dtype=torch.float32, device="cuda")  # the interpreter's answer
        assert bool(((got == want) | (got == -7.0)).all()), "a lane read something neither written nor initial"
        seen_stale |= not torch.equal(got, want)
    # no assertion on seen_stale: the race may or may not show on a given run; the row says the outcome is
    # unspecified on a GPU and fixed (program order) on the interpreter
    print("stale reads seen:", seen_stale)


@pytest.mark.gpu
def test_gpu_same_address_store_winner_is_unspecified(tmp_path):
    k = _gpu_only(tmp_path)
    x = torch.arange(128, dtype=torch.float32, device="cuda")
    y = torch.full((1,), -1.0, device="cuda")
    k.same_address[(1,)](x, y, 128)
    assert 0 <= y.item() < 128 and y.item() == int(y.item())  # one lane's value; the interpreter: 127
    print("winning lane:", int(y.item()))


@pytest.mark.gpu
def test_gpu_float_atomics_sum_in_an_unspecified_order(tmp_path):
    k = _gpu_only(tmp_path)
    g = torch.Generator().manual_seed(0)
    vals = (torch.randn(1 << 16, generator=g) * torch.exp2(torch.randint(-20, 20, (1 << 16,), generator=g))).cuda()
    sums = set()
    for _ in range(10):
        out = torch.zeros(1, device="cuda")
        k.atomic_sum[(vals.numel(),)](vals, out)
        sums.add(out.item())
    exact = float(vals.double().sum())
    bound = float(vals.double().abs().sum()) * vals.numel() * 2.0 ** -24
    assert all(abs(s - exact) <= bound for s in sums), (sums, exact)
    print("distinct fp32 sums over 10 runs:", len(sums))  # the interpreter: one, in program order


@pytest.mark.gpu
def test_gpu_masked_load_without_other_is_undefined(tmp_path):
    k = _gpu_only(tmp_path)
    x = torch.arange(1, 129, dtype=torch.float32, device="cuda")
    y = torch.full((128,), -3.0, device="cuda")
    k.masked_no_other[(1,)](x, y, 100, 128)
    assert torch.equal(y[:100], x[:100])  # the interpreter fills the masked lanes with 0; a GPU leaves them undefined
    print("masked lanes:", sorted(set(y[100:].tolist()))[:8])


@pytest.mark.gpu
def test_gpu_fast_math_differs_from_numpy_by_a_few_ulp(tmp_path):
    k = _gpu_only(tmp_path)
    g = torch.Generator().manual_seed(1)
    x = (torch.rand(1 << 16, generator=g) * 20 - 10).cuda()
    for op in ("exp", "div", "fma"):
        y = torch.empty_like(x)
        k.unary[(x.numel() // 1024,)](x, y, op, 1024)
        xd = x.double()
        exact = torch.exp(xd) if op == "exp" else 1.0 / xd if op == "div" else xd * xd + xd
        ulp = (torch.nextafter(exact.float(), torch.tensor(float("inf"), device="cuda")) - exact.float()).double().abs()
        err_ulp = float(((y.double() - exact).abs() / ulp).max())
        assert err_ulp <= 4.0, (op, err_ulp)  # within a few ulp; the interpreter (NumPy) is within one
        print(op, "max error in ulp:", err_ulp)


@pytest.mark.gpu
def test_gpu_accepts_bf16x3_which_the_interpreter_refuses(tmp_path):
    k = _gpu_only(tmp_path)
    a = torch.randn(16, 16, device="cuda")
    c = torch.empty(16, 16, device="cuda")
    k.bf16x3_dot[(1,)](a, a, c)
    assert torch.allclose(c, a @ a, rtol=1e-4, atol=1e-4)


def test_interpreter_refuses_bf16x3(tmp_path):
    """The interpreter's options allow tf32, tf32x3 and ieee only: a bf16x3 dot fails there (a candidate that uses
    it is judged wrong on a CPU host although it compiles for sm_90): docs/gpu-only.md's row."""
    (tmp_path / "gpu_only.py").write_text(GPU_ONLY)
    code = ("import sys, torch\nsys.path.insert(0, sys.argv[1])\nimport kernels\nimport gpu_only\n"
            "a = torch.randn(16, 16)\nc = torch.empty(16, 16)\n"
            "try:\n    gpu_only.bf16x3_dot[(1,)](a, a, c)\n    print('@@ran')\nexcept Exception as exc:\n"
            "    print('@@refused', type(exc).__name__, str(exc)[:200])\n")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(REPO), PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, cwd=REPO,
                          env=env, timeout=300)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("@@")), "")
    assert line.startswith("@@refused") and "input_precision" in line, (line, proc.stderr[-2000:])
