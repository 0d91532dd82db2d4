"""Ahead-of-time compile for a target arch with no GPU, and the facts read off the cubin.

``triton.compile(ASTSource(...), target=GPUTarget("cuda", 90, 32))`` runs the whole pipeline down to
a cubin with the ptxas that ships in the Triton wheel; the bundled ``cuobjdump`` then reports
registers, stack (spills), local and shared memory, and ``nvdisasm`` the SASS instruction mix. These are real
facts on any machine, so register, spill and shared-memory constraints are never estimates.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import subprocess
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import triton

from kregress.core.names import arch_capability
from kregress.core.records import CompileStats

_TRITON_BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"

# SASS opcode -> class shown in the mix. The first matching prefix wins.
_SASS_CLASSES = (
    ("HGMMA", "tensor_wgmma"), ("QGMMA", "tensor_wgmma"), ("HMMA", "tensor_mma"), ("IMMA", "tensor_mma"),
    ("UTMALDG", "tma_load"), ("UTMASTG", "tma_store"), ("UBLKCP", "tma_load"),
    ("LDGSTS", "async_copy"), ("LDGDEPBAR", "async_copy"),
    ("LDG", "global_load"), ("STG", "global_store"), ("LDSM", "shared_load"), ("LDS", "shared_load"),
    ("STS", "shared_store"), ("LDL", "local_load"), ("STL", "local_store"),
    ("BAR", "barrier"), ("SYNCS", "barrier"), ("WARPSYNC", "barrier"),
    ("FFMA", "fp32"), ("FADD", "fp32"), ("FMUL", "fp32"), ("FMNMX", "fp32"), ("MUFU", "special"),
    ("F2F", "convert"), ("F2FP", "convert"), ("I2F", "convert"), ("F2I", "convert"),
    ("IMAD", "integer"), ("IADD", "integer"), ("LOP", "integer"), ("SHF", "integer"), ("LEA", "integer"),
    ("ISETP", "integer"), ("SEL", "integer"), ("PRMT", "integer"),
    ("BRA", "control"), ("EXIT", "control"), ("BSSY", "control"), ("BSYNC", "control"),
)


class _OverSharedLimit(Exception):
    def __init__(self, shared: int):
        super().__init__(shared)
        self.shared = shared


# The shared-memory limit of the compile running in this thread (None: no early stop). Triton knows a
# kernel's shared memory once it has lowered it to LLVM IR, before PTX and ptxas, which on a config that
# cannot launch anyway (a deep pipeline of big tiles) spend seconds allocating registers it will never use.
_SHARED_LIMIT = threading.local()
_HOOK_KEY = "kregress-shared-limit-stop"


def _stages_hook(*args: Any) -> Any:
    """Triton's stages-inspection hook (``knobs.runtime.add_stages_inspection_hook``): called with no
    arguments for a cache key, else with the backend's stage table, whose PTX stage it wraps: past the
    limit, the compile ends there with ``_OverSharedLimit`` instead of going on to PTX and a cubin."""
    if not args:
        return _HOOK_KEY, _HOOK_KEY
    stages = next((a for a in args if isinstance(a, dict) and "ptx" in a), None)
    if stages is None:
        return None
    make_ptx = stages["ptx"]

    def ptx_within_limit(src: Any, metadata: dict) -> Any:
        limit, shared = getattr(_SHARED_LIMIT, "value", None), metadata.get("shared")
        if limit is not None and isinstance(shared, int) and shared > limit:
            raise _OverSharedLimit(shared)
        return make_ptx(src, metadata)

    stages["ptx"] = ptx_within_limit
    return None


def _install_stages_hook() -> bool:
    """Install the hook once per process, where this Triton has the knob and no other hook is set."""
    runtime = getattr(getattr(triton, "knobs", None), "runtime", None)
    if runtime is None or not hasattr(type(runtime), "add_stages_inspection_hook"):
        return False
    current = runtime.add_stages_inspection_hook
    if current is _stages_hook:
        return True
    if current is not None:
        return False  # someone else's hook (a profiler, a plugin): leave the pipeline as it is
    runtime.add_stages_inspection_hook = _stages_hook
    return True


def _shared_over_limit(smem: int, arch: str, limits: Any) -> CompileError:
    return CompileError(
        "out_of_resources", f"needs {smem} bytes of shared memory per block; {arch} allows {limits.max_shared_memory_per_block}"
    )


class CompileError(Exception):
    """Carries the error class ('compile_failed' or 'out_of_resources') and a short detail."""

    def __init__(self, error: str, detail: str):
        super().__init__(f"{error}: {detail}")
        self.error = error
        self.detail = detail


# This file decides how variants are compiled and measured: a change to it invalidates the cache too.
_COMPILER_HASH = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:12]


def cache_key(family: str, source_hash: str, config_hash: str, dtype: str, arch: str, params: dict) -> str:
    blob = json.dumps(
        [family, source_hash, config_hash, dtype, arch, triton.__version__, _COMPILER_HASH, params],
        sort_keys=True, default=str,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def parse_resource_usage(text: str) -> dict[str, dict[str, int]]:
    """``cuobjdump --dump-resource-usage`` -> {function: {REG, STACK, SHARED, LOCAL, ...}}."""
    out: dict[str, dict[str, int]] = {}
    current = None
    for line in text.splitlines():
        m = re.match(r"\s*Function\s+(\S+):", line)
        if m:
            current = m.group(1)
            continue
        if current and "REG:" in line:
            out[current] = {k: int(v) for k, v in re.findall(r"([A-Z_]+(?:\[\d+\])?):(\d+)", line)}
            current = None
    return out


def sass_mix(sass: str) -> tuple[int, dict[str, int]]:
    counts: Counter[str] = Counter()
    total = 0
    for line in sass.splitlines():
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", line)
        if not m:
            continue
        op = m.group(1)
        if op == "NOP":
            continue
        total += 1
        cls = next((c for prefix, c in _SASS_CLASSES if op.startswith(prefix)), "other")
        counts[cls] += 1
    return total, dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def occupancy(regs: int, smem: int, num_warps: int, limits: Any) -> tuple[float, int, str]:
    """Theoretical occupancy on one SM: (active warps / max warps, blocks per SM, limiter).

    Registers are allocated per warp in units of 256; shared memory per block plus 1 KiB the
    driver reserves; threads and the block-slot count cap the rest.
    """
    max_warps = limits.max_threads_per_sm // 32
    regs_per_warp = math.ceil(max(regs, 1) * 32 / 256) * 256
    by_regs = (limits.registers_per_sm // regs_per_warp) // num_warps
    by_threads = max_warps // num_warps
    by_smem = limits.shared_memory_per_sm // (smem + 1024) if smem > 0 else limits.max_blocks_per_sm
    candidates = {
        "registers": by_regs,
        "shared_memory": by_smem,
        "threads": by_threads,
        "block_slots": limits.max_blocks_per_sm,
    }
    limiter = min(candidates, key=lambda k: candidates[k])
    blocks = max(0, candidates[limiter])
    return min(1.0, blocks * num_warps / max_warps), blocks, limiter


def _tool(name: str) -> str:
    path = _TRITON_BIN / name
    if not path.exists():
        raise CompileError("compile_failed", f"{name} not found in the Triton wheel ({_TRITON_BIN})")
    return str(path)


def compile_units(units: list, arch: str, limits: Any, sass: bool = True) -> CompileStats:
    """Compile every unit of a variant for ``arch`` and return the stats of the heaviest one. ``sass``:
    also disassemble the cubin for its instruction mix (``nvdisasm``, about 0.4 s a kernel: a review
    compares the mix of two revisions; a sweep reads registers, spills and shared memory only, and skips it)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    cap = arch_capability(arch)
    t0 = time.perf_counter()
    per_unit = []
    early_stop = _install_stages_hook()
    for unit in units:
        attrs = {(unit.fn.arg_names.index(name),): [["tt.divisibility", 16]] for name in unit.divisible}
        src = ASTSource(fn=unit.fn, signature=unit.signature, constexprs=unit.constexprs, attrs=attrs)
        _SHARED_LIMIT.value = limits.max_shared_memory_per_block if early_stop else None
        try:
            compiled = triton.compile(
                src, target=GPUTarget("cuda", cap, 32), options={"num_warps": unit.num_warps, "num_stages": unit.num_stages}
            )
        except _OverSharedLimit as exc:  # known from the LLVM IR: no PTX, no ptxas (the same verdict, sooner)
            raise _shared_over_limit(exc.shared, arch, limits) from None
        except Exception as exc:  # Triton raises many types; all of them mean "did not compile"
            text = str(exc)
            kind = "out_of_resources" if re.search(r"out of resource|shared memory|too many resources", text, re.I) else "compile_failed"
            raise CompileError(kind, compiler_message(text) or type(exc).__name__) from None
        finally:
            _SHARED_LIMIT.value = None
        smem = int(compiled.metadata.shared)
        if smem > limits.max_shared_memory_per_block:  # a variant is as constrained as its heaviest kernel
            raise _shared_over_limit(smem, arch, limits)
        with tempfile.TemporaryDirectory() as tmp:
            cubin = Path(tmp) / "k.cubin"
            cubin.write_bytes(compiled.asm["cubin"])
            usage = subprocess.run([_tool("cuobjdump"), "--dump-resource-usage", str(cubin)], capture_output=True, text=True, check=True).stdout
            # nvdisasm straight on the cubin (what `cuobjdump -sass` runs), code sections only, without the
            # dataflow pass (-ndf: it only annotates branch targets): the same instructions in under half the time
            text = subprocess.run([_tool("nvdisasm"), "-c", "-ndf", str(cubin)], capture_output=True, text=True,
                                  check=True).stdout if sass else None
        res = parse_resource_usage(usage).get(compiled.metadata.name)
        if res is None:
            raise CompileError("compile_failed", f"cuobjdump printed no resource usage for {compiled.metadata.name}")
        total, mix = sass_mix(text) if text is not None else (None, {})
        per_unit.append((unit, res, max(smem, res.get("SHARED", 0)), total, mix))
    # A variant is as constrained as its heaviest kernel (e.g. the split-K main kernel, not the combine).
    unit, res, smem, total, mix = max(per_unit, key=lambda u: (u[1]["REG"] * u[0].num_warps, u[2]))
    if smem > limits.max_shared_memory_per_block:  # the cubin's static shared memory on top
        raise _shared_over_limit(smem, arch, limits)
    occ, blocks, limiter = occupancy(res["REG"], smem, unit.num_warps, limits)
    return CompileStats(
        arch=arch,
        regs_per_thread=res["REG"],
        spill_bytes=res.get("STACK", 0) + res.get("LOCAL", 0),
        smem_bytes=smem,
        num_warps=unit.num_warps,
        num_stages=unit.num_stages,
        occupancy=occ,
        blocks_per_sm=blocks,
        occupancy_limiter=limiter,
        sass_instructions=total,
        sass_mix=mix,
        compile_seconds=time.perf_counter() - t0,
    )


def compiler_message(text: str) -> str:
    """The compiler's own error in one line: Triton's ``at L:C:`` location, the offending source line
    and the message (its last line, e.g. ``NameError('x is not defined')``), not the location alone."""
    lines = [ln.rstrip() for ln in text.strip().splitlines() if ln.strip()]
    if len(lines) <= 1:
        return _first_line(text)
    msg = [ln.strip() for ln in lines[1:] if set(ln.strip()) - {"^", "~"}]
    caret = next((i for i, ln in enumerate(lines) if ln.strip() and not set(ln.strip()) - {"^", "~"}), None)
    src = lines[caret - 1].strip() if caret and caret >= 1 else ""
    tail = msg[-1] if msg else ""
    parts = [lines[0].strip()] + ([f"`{src}`"] if src and src != tail else []) + ([tail] if tail else [])
    return " ".join(parts)[:600]


def _first_line(text: str) -> str:
    for line in text.strip().splitlines():
        line = line.strip()
        if line:
            return line[:300]
    return ""
