"""nvcc for a CUDA family: one ``nvcc -cubin -arch=<spec arch> -Xptxas -v`` per kernel of a variant, and
the facts read off it.

Each ``CudaUnit`` (a ``__global__`` function, its template arguments and ``-D`` macros) is compiled from a
small translation unit that ``#include``s the family's ``.cu`` file and takes the kernel's address (which
instantiates a template). ptxas's own report (``-Xptxas -v``) gives registers, barriers, the stack frame,
spill stores and loads and static shared memory per entry; ``cuobjdump --dump-resource-usage`` (from
PATH, beside nvcc, or the Triton wheel) reads the same cubin back, and ``cross_check`` says where the two
disagree. The dynamic shared memory a launch requests is the family's (``CudaUnit.dynamic_smem_bytes``).

Errors are values: ptxas's over-limit errors (``uses too much shared data (0x3c000 bytes, 0xc000 max)``)
and a variant past the spec's per-block limits are ``out_of_resources`` with the tool's own words; any
other nvcc failure is ``compile_failed`` with its first error lines. The cubin and its facts are cached
on disk (``$KREGRESS_CUDA_CACHE``), keyed by the nvcc version, the flags, the arch, the unit and the hash
of the ``.cu`` files and every local header they include: the GPU path launches that very cubin.

Every nvcc and cuobjdump run is confined (``kernels.cuda.confine``: bubblewrap, read-only toolkit, host
compiler and family sources, a read-write work folder, no network, an allowlisted environment, rlimits and
a wall limit). A patched copy is never compiled without it; the family's own files compile unconfined only
where bwrap is missing. ``preprocess_unit`` is ``nvcc -E`` of a unit under the same confinement, for the
rules of ``kernels.cuda.rules``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernels.compile import CompileError, occupancy, parse_resource_usage
from kernels.cuda import confine
from kregress.core.cuda_source import NVCC_HINT, find_nvcc, local_headers, sources_hash
from kregress.core.family import CudaFamily, CudaUnit
from kregress.core.records import CompileStats

# This file decides how CUDA variants are compiled: a change to it invalidates the cache too.
_COMPILER_HASH = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:12]
NVCC_TIMEOUT_S = 300
# sm_80 and later reserve 1 KiB of shared memory per block for the system: cuobjdump's SHARED counts it.
RESERVED_SMEM = 1024


def cache_dir() -> Path:
    """Where cubins and their facts are kept: ``$KREGRESS_CUDA_CACHE`` (workers get ``<cache>/cuda``)."""
    env = os.environ.get("KREGRESS_CUDA_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "kregress" / "cuda"


def nvcc_path() -> str:
    path = find_nvcc()
    if path is None:
        raise CompileError("compile_failed", NVCC_HINT)
    return path


@functools.lru_cache(maxsize=8)
def nvcc_version(nvcc: str) -> str:
    """``release 13.0, V13.0.88`` (the last line of ``nvcc --version`` that names the release)."""
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise CompileError("compile_failed", f"{nvcc} --version failed: {exc}") from None
    lines = [ln.strip() for ln in out.splitlines() if "release" in ln]
    return lines[-1] if lines else out.strip()[-120:]


def cuobjdump_path(nvcc: str | None = None) -> str | None:
    """cuobjdump from PATH, beside nvcc, or the one in the Triton wheel; None when there is none."""
    found = shutil.which("cuobjdump")
    if found:
        return found
    if nvcc and (Path(nvcc).resolve().parent / "cuobjdump").is_file():
        return str(Path(nvcc).resolve().parent / "cuobjdump")
    try:
        import triton

        cand = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
        return str(cand) if cand.is_file() else None
    except ImportError:
        return None


# --- ptxas -v -------------------------------------------------------------------------------------------


@dataclass
class PtxasFacts:
    """What ``ptxas -v`` says about one entry function."""

    registers: int = 0
    barriers: int = 0
    stack_frame: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    smem_static: int = 0
    cmem: dict[str, int] = field(default_factory=dict)


def parse_ptxas(text: str) -> dict[str, PtxasFacts]:
    """``-Xptxas -v`` output -> {entry name: facts}. Lines: ``Compiling entry function 'NAME' for 'sm_90'``,
    ``N bytes stack frame, S bytes spill stores, L bytes spill loads`` and ``Used R registers, used B
    barriers, ... X bytes smem, Y bytes cmem[0]`` (items absent when zero on some versions)."""
    out: dict[str, PtxasFacts] = {}
    current: str | None = None
    props_for: str | None = None
    for line in text.splitlines():
        m = re.search(r"Compiling entry function '([^']+)'", line)
        if m:
            current = m.group(1)
            out.setdefault(current, PtxasFacts())
            continue
        m = re.search(r"Function properties for (\S+)", line)
        if m:
            props_for = m.group(1)
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and props_for in out:
            f = out[props_for]
            f.stack_frame, f.spill_stores, f.spill_loads = (int(x) for x in m.groups())
            continue
        if "Used" in line and "registers" in line and current in out:
            f = out[current]
            if (r := re.search(r"Used (\d+) registers", line)):
                f.registers = int(r.group(1))
            if (b := re.search(r"used (\d+) barriers", line)):
                f.barriers = int(b.group(1))
            if (s := re.search(r"(\d+) bytes smem", line)):
                f.smem_static = int(s.group(1))
            f.cmem = {f"cmem[{k}]": int(v) for v, k in re.findall(r"(\d+) bytes cmem\[(\d+)\]", line)}
    return out


# Over-limit errors: the kernel cannot run as written on this arch, whatever the input (infeasible).
_OVER_LIMIT = re.compile(r"too much (shared|local|parameter) data|too many resources|exceeds? (the )?(maximum|limit)|"
                         r"out of resources|Entry function .* uses too much", re.I)


def error_lines(text: str) -> list[str]:
    """The error lines of an nvcc/ptxas run (``ptxas error : ...``, ``file.cu(12): error: ...``), the
    temporary file names replaced by the ``.cu`` file's own."""
    keep = []
    for line in text.splitlines():
        t = line.strip()
        if re.search(r"\berror\b", t, re.I) and not t.startswith("#"):
            keep.append(t)
    return keep


def classify(text: str) -> CompileError:
    """nvcc's failure -> ``out_of_resources`` (ptxas's over-limit message) or ``compile_failed`` (the rest)."""
    errs = error_lines(text) or [ln.strip() for ln in text.splitlines() if ln.strip()][-3:] or ["nvcc failed with no message"]
    over = [e for e in errs if _OVER_LIMIT.search(e)]
    if over:
        return CompileError("out_of_resources", " | ".join(over)[:600])
    return CompileError("compile_failed", " | ".join(errs[:4])[:600])


# --- one unit ----------------------------------------------------------------------------------------


def _mangled_prefix(name: str, args: tuple[int, ...]) -> re.Pattern:
    """An Itanium-mangled template instance ``name<args...>`` (integral arguments): ``_Z<len>nameI L?<v>E... E``."""
    parts = "".join(rf"L[a-z]{'n' if a < 0 else ''}{abs(a)}E" for a in args)
    return re.compile(rf"^_Z{len(name)}{re.escape(name)}I{parts}E")


def entry_for(unit: CudaUnit, names: list[str]) -> str | None:
    """The entry of ``unit`` among a cubin's entry names: the template instance with its arguments, or the
    plain (``extern "C"`` or mangled) function."""
    if unit.template_args:
        pat = _mangled_prefix(unit.kernel, unit.template_args)
        hits = [n for n in names if pat.match(n)]
    else:
        hits = [n for n in names if n == unit.kernel] or \
               [n for n in names if re.match(rf"^_Z{len(unit.kernel)}{re.escape(unit.kernel)}(?!I)", n)]
    return hits[0] if len(hits) == 1 else None


def translation_unit(cu_file: Path, unit: CudaUnit) -> str:
    """The text nvcc compiles for ``unit``: the family's ``.cu`` file, and the kernel's address taken
    (which instantiates a template for the device)."""
    args = ", ".join(str(a) for a in unit.template_args)
    ref = f"{unit.kernel}<{args}>" if unit.template_args else unit.kernel
    return (f'#include "{cu_file.as_posix()}"\n'
            f"// kregress: instantiate {ref}\n"
            f"void* kregress_unit_entry = reinterpret_cast<void*>(&{ref});\n")


def nvcc_command(nvcc: str, family: CudaFamily, unit: CudaUnit, arch: str, tu: Path, out: Path,
                 include: Path) -> list[str]:
    defines = [f"-D{k}={v}" for k, v in unit.defines]
    return [nvcc, "-cubin", f"-arch={arch}", "-Xptxas", "-v", *family.nvcc_flags, *defines, f"-I{include}",
            "-o", str(out), str(tu)]


@dataclass
class UnitBuild:
    """A compiled unit: its cubin, entry name, ptxas facts, cuobjdump's reading and the log."""

    unit: CudaUnit
    entry: str
    cubin: bytes
    ptxas: PtxasFacts
    cuobjdump: dict[str, int] | None
    log: str
    seconds: float
    cache_hit: bool = False


def unit_key(family: CudaFamily, unit: CudaUnit, arch: str, source_dir: Path | None = None) -> str:
    """What decides a unit's cubin: nvcc's version, the flags, the arch, the unit, and the hash of the
    ``.cu`` files and their local headers (``source_dir``: a patched copy)."""
    nvcc = nvcc_path()
    files = _cu_files(family, source_dir)
    blob = json.dumps([nvcc_version(nvcc), list(family.nvcc_flags), arch, unit.kernel, unit.source,
                       list(unit.template_args), [list(d) for d in unit.defines], sources_hash(files), _COMPILER_HASH])
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def _cu_files(family: CudaFamily, source_dir: Path | None) -> list[Path]:
    if source_dir is None:
        return family.cu_files()
    return [(Path(source_dir) / s).resolve() for s in family.cuda_sources]


def compile_unit(family: CudaFamily, unit: CudaUnit, arch: str, source_dir: Path | None = None,
                 cache: Path | None = None) -> UnitBuild:
    """Compile one unit (or take it from the cache); raises ``CompileError`` with the tool's message."""
    if unit.source not in family.cuda_sources:
        raise CompileError("compile_failed", f"unit {unit.kernel}: source {unit.source!r} is not one of the family's "
                                             f"cuda_sources ({', '.join(family.cuda_sources)})")
    nvcc = nvcc_path()
    if source_dir is None and unit.source_dir:
        source_dir = Path(unit.source_dir)
    trusted = source_dir is None  # the family's own files; a patched copy only ever compiles confined
    key = unit_key(family, unit, arch, source_dir)
    root = Path(cache) if cache is not None else cache_dir()
    meta_f, cubin_f = root / f"{key}.json", root / f"{key}.cubin"
    try:
        meta = json.loads(meta_f.read_text())
        if "error" in meta:
            raise CompileError(meta["error"], meta["detail"])
        return UnitBuild(unit=unit, entry=meta["entry"], cubin=cubin_f.read_bytes(), ptxas=PtxasFacts(**meta["ptxas"]),
                         cuobjdump=meta.get("cuobjdump"), log=meta.get("log", ""), seconds=0.0, cache_hit=True)
    except (OSError, ValueError, KeyError, TypeError):
        pass
    cu = _cu_files(family, source_dir)[family.cuda_sources.index(unit.source)]
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kregress-nvcc-") as tmp:
        tu, out = Path(tmp) / f"{unit.kernel}_unit.cu", Path(tmp) / "unit.cubin"
        tu.write_text(translation_unit(cu, unit))
        cmd = nvcc_command(nvcc, family, unit, arch, tu, out, cu.parent)
        proc = _run_nvcc(cmd, nvcc, Path(tmp), sources_root(family, source_dir), trusted=trusted, what=unit.kernel)
        log = (proc.stdout + "\n" + proc.stderr).replace(str(tu), f"<{unit.kernel} instance>").replace(tmp + "/", "")
        if source_dir is not None:  # a patched copy: messages name the family's own file
            log = log.replace(str(Path(source_dir).resolve()), str(family.cu_files()[0].parent))
        if proc.returncode != 0 or not out.is_file():
            err = classify(log)
            _store(root, key, {"error": err.error, "detail": err.detail})
            raise err
        cubin = out.read_bytes()
        usage = None
        tool = cuobjdump_path(nvcc)
        if tool:
            try:
                dump = _run_nvcc([tool, "--dump-resource-usage", str(out)], nvcc, Path(tmp), Path(tool).resolve().parent,
                                 trusted=False, what="cuobjdump")
                usage = parse_resource_usage(dump.stdout) if dump.returncode == 0 else None
            except CompileError:
                usage = None
    facts = parse_ptxas(log)
    entry = entry_for(unit, list(facts) or list(usage or {}))
    if entry is None:
        raise CompileError("compile_failed", f"no entry for {unit.kernel}<{', '.join(map(str, unit.template_args))}> in "
                                             f"ptxas's report (entries: {', '.join(facts) or 'none'}): is it a __global__ "
                                             f"template with these {len(unit.template_args)} integral parameters?")
    build = UnitBuild(unit=unit, entry=entry, cubin=cubin, ptxas=facts.get(entry, PtxasFacts()),
                      cuobjdump=(usage or {}).get(entry), log=log[-4000:], seconds=time.perf_counter() - t0)
    _store(root, key, {"entry": entry, "ptxas": build.ptxas.__dict__, "cuobjdump": build.cuobjdump, "log": build.log},
           cubin)
    return build


def sources_root(family: CudaFamily, source_dir: Path | None = None) -> Path:
    """The one folder that holds the family's ``.cu`` files and their local headers (the family's own, or
    the same place in a patched copy whose module folder is ``source_dir``): nvcc's read-only bind. Always
    computed from the family's own files, never from what a patched file includes."""
    mod_dir = Path(family.module.__file__).resolve().parent if getattr(family.module, "__file__", None) else Path.cwd()
    files = family.cu_files() + local_headers(family.cu_files())
    top = Path(os.path.commonpath([str(mod_dir)] + [str(f.parent) for f in files]))
    if source_dir is None:
        return top
    root = Path(source_dir).resolve()
    for _ in mod_dir.relative_to(top).parts:
        root = root.parent
    return root


@dataclass
class Preprocessed:
    """``nvcc -E`` of one unit: the text (line markers kept), the wrapper file's name as the markers give it,
    the folder the family's files were read from, and the toolkit root."""

    text: str
    wrapper: str
    root: Path
    toolkit: Path


PREPROCESSED_MAX_BYTES = 64 << 20
_DIAG = re.compile(r"^(?P<file>[^\s:()][^:()]*?)(?::(?P<l1>\d+)(?::\d+)?:|\((?P<l2>\d+)\):) *(?P<msg>(?:fatal |catastrophic )?error.*)$")


def _safe_diagnostics(log: str, readable: list[Path]) -> str:
    """The error lines of a failed preprocessor run, each quoted only where its file is one of ``readable``
    (the family's sources, the toolkit, the system headers); any other file is named with its line, its
    text withheld. Context lines (gcc's source excerpts, "In file included from") are dropped."""
    roots = [os.path.normpath(str(r)).rstrip("/") + "/" for r in readable]
    keep = []
    for line in log.splitlines():
        m = _DIAG.match(line.strip())
        if not m:
            continue
        f = os.path.normpath(m.group("file"))
        n = m.group("l1") or m.group("l2")
        if any((f + "/").startswith(r) for r in roots) or not os.path.isabs(f):
            msg = m.group("msg")
            missing = re.search(r"(cannot open source file|No such file or directory)", msg)
            keep.append(f"{os.path.basename(f)}:{n}: {msg}" if not missing else f"{os.path.basename(f)}:{n}: {msg[:300]}")
        else:
            keep.append(f"{f}:{n}: an error (its text withheld: the file is outside the family's sources and the toolkit)")
    return " | ".join(keep[:4])[:600] or "the preprocessor failed with no error line"


def preprocess_unit(family: CudaFamily, unit: CudaUnit, arch: str, source_dir: Path | None = None) -> Preprocessed:
    """``nvcc -E`` of ``unit`` (the family's files, or the patched copy whose module folder is ``source_dir``),
    with the compile's arch, flags and macros (so ``__CUDA_ARCH__`` code is what is read), line markers
    kept, always confined. Raises ``CompileError``: the tool's error lines, any file outside the family's
    sources and the toolkit named but never quoted."""
    nvcc = nvcc_path()
    root = sources_root(family, source_dir)
    cu = _cu_files(family, source_dir)[family.cuda_sources.index(unit.source)]
    tk = confine.toolkit_root(nvcc)
    with tempfile.TemporaryDirectory(prefix="kregress-nvcc-E-") as tmp:
        tu, out = Path(tmp) / f"{unit.kernel}_unit.cu", Path(tmp) / "unit.ii"
        tu.write_text(translation_unit(cu, unit))
        defines = [f"-D{k}={v}" for k, v in unit.defines]
        cmd = [nvcc, "-E", f"-arch={arch}", *family.nvcc_flags, *defines, f"-I{cu.parent}", "-o", str(out), str(tu)]
        proc = _run_nvcc(cmd, nvcc, Path(tmp), root, trusted=False, what=f"{unit.kernel} (preprocessor)")
        if proc.returncode != 0 or not out.is_file():
            raise CompileError("compile_failed", "preprocessor: " + _safe_diagnostics(
                proc.stdout + "\n" + proc.stderr, [root, tk, Path(tmp), *confine.header_roots(nvcc)]))
        if out.stat().st_size > PREPROCESSED_MAX_BYTES:
            raise CompileError("compile_failed", f"the preprocessed unit of {unit.kernel} is {out.stat().st_size} bytes, "
                                                 f"over {PREPROCESSED_MAX_BYTES}")
        return Preprocessed(text=out.read_text(errors="replace"), wrapper=str(tu), root=root, toolkit=tk)


def _run_nvcc(cmd: list[str], nvcc: str, work: Path, sources: Path, *, trusted: bool, what: str,
              output_cap: int | None = None) -> subprocess.CompletedProcess:
    """``cmd`` (nvcc or a tool beside it) run in ``work``, confined (``kernels.cuda.confine``): it reads the
    toolkit, the host compiler, ``sources`` and ``work``, and nothing else. Without bwrap only a trusted
    run (the family's own files) goes ahead unconfined; a patched copy raises ``CompileError``."""
    why = confine.problem()
    try:
        if why is None:
            if cmd[0] == nvcc:  # a wrapper script (/usr/local/bin/nvcc) is outside: the toolkit's own binary
                cmd = [str(confine.real_nvcc(nvcc)), *cmd[1:]]
            return confine.run(cmd, ro=[confine.toolkit_root(nvcc), sources], rw=[work], env=confine.nvcc_env(nvcc, work),
                               cwd=work, limits=confine.Limits(wall_s=NVCC_TIMEOUT_S))
        if not trusted:
            raise CompileError("compile_failed", why)
        return subprocess.run(cmd, capture_output=True, text=True, timeout=NVCC_TIMEOUT_S, cwd=work)
    except subprocess.TimeoutExpired:
        raise CompileError("compile_failed", f"nvcc ran past {NVCC_TIMEOUT_S} s on {what}") from None
    except confine.ConfinementError as exc:
        raise CompileError("compile_failed", str(exc)) from None
    except OSError as exc:
        raise CompileError("compile_failed", f"{cmd[0]} could not run: {exc}. {NVCC_HINT}") from None


def _store(root: Path, key: str, meta: dict, cubin: bytes | None = None) -> None:
    """Atomic per entry (the cubin first, then its facts)."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        if cubin is not None:
            tmp = root / f"{key}.cubin.tmp{os.getpid()}"
            tmp.write_bytes(cubin)
            tmp.replace(root / f"{key}.cubin")
        tmp = root / f"{key}.json.tmp{os.getpid()}"
        tmp.write_text(json.dumps(meta))
        tmp.replace(root / f"{key}.json")
    except OSError:
        pass  # a read-only cache: the compile still counts, it is only not kept


def cross_check(build: UnitBuild) -> list[str]:
    """Where cuobjdump's reading of the cubin disagrees with ptxas's report ([] when they agree, or when
    there is no cuobjdump): registers, stack, and static shared memory (cuobjdump counts the 1 KiB the
    system reserves per block on sm_80 and later)."""
    u = build.cuobjdump
    if u is None:
        return []
    p = build.ptxas
    out = []
    if u.get("REG") != p.registers:
        out.append(f"registers: ptxas {p.registers}, cuobjdump {u.get('REG')}")
    if u.get("STACK", 0) != p.stack_frame:
        out.append(f"stack: ptxas {p.stack_frame} B, cuobjdump {u.get('STACK')} B")
    if u.get("SHARED", 0) not in (p.smem_static, p.smem_static + RESERVED_SMEM):
        out.append(f"static shared memory: ptxas {p.smem_static} B, cuobjdump {u.get('SHARED')} B")
    return out


# --- one variant ---------------------------------------------------------------------------------------


def compile_variant(family: CudaFamily, config: dict, dtype: str, params: dict, arch: str, limits: Any,
                    source_dir: Path | None = None, cache: Path | None = None) -> tuple[CompileStats, list[UnitBuild]]:
    """Compile every unit of a variant for ``arch``; the stats of its heaviest kernel (registers x threads,
    then shared memory). Raises ``CompileError``: nvcc's or ptxas's own message, or the limit a unit passes
    (static + dynamic shared memory per block, registers x threads per block)."""
    t0 = time.perf_counter()
    units = family.cuda_units(config, dtype, params)
    if not units:
        raise CompileError("compile_failed", f"family {family.name}: cuda_units returned no kernel for {config}")
    builds = [compile_unit(family, u, arch, source_dir, cache) for u in units]
    for b in builds:
        p, u = b.ptxas, b.unit
        total = p.smem_static + u.dynamic_smem_bytes
        if total > limits.max_shared_memory_per_block:
            raise CompileError("out_of_resources", f"ptxas: {b.entry} uses {p.smem_static} bytes smem (static) + "
                                                   f"{u.dynamic_smem_bytes} dynamic = {total} bytes per block; {arch} allows "
                                                   f"{limits.max_shared_memory_per_block}")
        if p.registers * u.threads > limits.registers_per_sm:
            raise CompileError("out_of_resources", f"ptxas: {b.entry} uses {p.registers} registers x {u.threads} threads "
                                                   f"= {p.registers * u.threads} per block; {arch} has {limits.registers_per_sm}")
    heavy = max(builds, key=lambda b: (b.ptxas.registers * b.unit.threads, b.ptxas.smem_static + b.unit.dynamic_smem_bytes))
    p, u = heavy.ptxas, heavy.unit
    smem = p.smem_static + u.dynamic_smem_bytes
    warps = max(1, -(-u.threads // 32))
    occ, blocks, limiter = occupancy(p.registers, smem, warps, limits)
    disagreements = [f"{b.entry}: {d}" for b in builds for d in cross_check(b)]
    facts_from = "ptxas -v" + ("; cuobjdump agrees" if all(b.cuobjdump for b in builds) and not disagreements else
                               (f"; cuobjdump disagrees: {'; '.join(disagreements)}" if disagreements else "; no cuobjdump"))
    stats = CompileStats(
        arch=arch, regs_per_thread=p.registers, spill_bytes=p.stack_frame if (p.spill_stores or p.spill_loads) else 0,
        smem_bytes=smem, num_warps=warps, num_stages=int(config.get("STAGES", config.get("num_stages", 1))),
        occupancy=occ, blocks_per_sm=blocks, occupancy_limiter=limiter, compile_seconds=time.perf_counter() - t0,
        cache_hit=all(b.cache_hit for b in builds), spill_stores=p.spill_stores, spill_loads=p.spill_loads,
        smem_static_bytes=p.smem_static, smem_dynamic_bytes=u.dynamic_smem_bytes, barriers=p.barriers,
        facts_from=facts_from, kernel=heavy.entry,
    )
    return stats, builds


def compile_key(family: CudaFamily, src_hash: str, config_hash: str, dtype: str, arch: str, params: dict) -> str:
    """The sweep's compile-cache key of one CUDA config (``resources.gpu.compile_key``): nvcc's version, the
    flags, the family's source hash (module, ``.cu`` files, local headers), the config, dtype, arch and params."""
    nvcc = find_nvcc()
    blob = json.dumps([family.name, nvcc_version(nvcc) if nvcc else "no-nvcc", list(family.nvcc_flags), src_hash,
                       sources_hash(family.cu_files()), config_hash, dtype, arch, params, _COMPILER_HASH],
                      sort_keys=True, default=str)
    return "cuda-" + hashlib.sha256(blob.encode()).hexdigest()[:24]
