"""Compile seconds of the built-in CUDA family's variants (cold and cached), and its facts beside a plain
`nvcc -cubin -arch=sm_90 -Xptxas -v` run of the same kernel instance.

    .venv/bin/python bench/cuda_compile.py                 # 3 configs
    .venv/bin/python bench/cuda_compile.py --configs 6

Prints one line per config: cold seconds (a fresh cache), cached seconds, then kregress's facts
(ptxas via compile_variant, cuobjdump's reading) and the plain nvcc run's ptxas report, side by side.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CONFIGS = [
    {"BLOCK_M": 64, "BLOCK_N": 64, "STAGES": 2, "TM": 4, "TN": 4},     # the spec's baseline
    {"BLOCK_M": 128, "BLOCK_N": 64, "STAGES": 1, "TM": 8, "TN": 4},
    {"BLOCK_M": 64, "BLOCK_N": 128, "STAGES": 1, "TM": 8, "TN": 16},   # spills
    {"BLOCK_M": 64, "BLOCK_N": 64, "STAGES": 3, "TM": 4, "TN": 4},     # over 48 KiB of static shared memory
    {"BLOCK_M": 32, "BLOCK_N": 128, "STAGES": 2, "TM": 2, "TN": 8},
    {"BLOCK_M": 128, "BLOCK_N": 128, "STAGES": 1, "TM": 8, "TN": 8},
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", type=int, default=3)
    ap.add_argument("--arch", default="sm_90")
    args = ap.parse_args()
    from kernels.compile import CompileError
    from kernels.cuda.gemm_fp8_cuda import FAMILY
    from kernels.cuda.nvcc import compile_variant, nvcc_path, nvcc_version, parse_ptxas, translation_unit
    from kregress.core.spec import HardwareLimits

    limits = HardwareLimits()
    print(f"nvcc: {nvcc_path()} ({nvcc_version(nvcc_path())}); arch {args.arch}")
    with tempfile.TemporaryDirectory() as tmp:
        for cfg in CONFIGS[:args.configs]:
            cache = Path(tmp) / "cache"

            def child_cpu() -> float:
                r = resource.getrusage(resource.RUSAGE_CHILDREN)
                return r.ru_utime + r.ru_stime

            cpu0 = child_cpu()
            t0 = time.perf_counter()
            try:
                stats, builds = compile_variant(FAMILY, cfg, "fp8_e4m3", {}, args.arch, limits, cache=cache)
                cold, cpu = time.perf_counter() - t0, child_cpu() - cpu0
                t0 = time.perf_counter()
                compile_variant(FAMILY, cfg, "fp8_e4m3", {}, args.arch, limits, cache=cache)
                cached = time.perf_counter() - t0
                mine = (f"regs {stats.regs_per_thread}, spill stores/loads {stats.spill_stores}/{stats.spill_loads} B, "
                        f"static smem {stats.smem_static_bytes} B, barriers {stats.barriers}; {stats.facts_from}; "
                        f"cuobjdump {builds[0].cuobjdump}")
                unit = builds[0].unit
                entry = builds[0].entry
            except CompileError as exc:
                cold, cpu = time.perf_counter() - t0, child_cpu() - cpu0
                t0 = time.perf_counter()
                try:
                    compile_variant(FAMILY, cfg, "fp8_e4m3", {}, args.arch, limits, cache=cache)
                except CompileError:
                    pass  # the error is cached too
                cached = time.perf_counter() - t0
                mine = f"{exc.error}: {exc.detail[:160]}"
                unit, entry = FAMILY.cuda_units(cfg, "fp8_e4m3", {})[0], None
            tu = Path(tmp) / "plain.cu"
            tu.write_text(translation_unit(FAMILY.cu_files()[0], unit))
            proc = subprocess.run([nvcc_path(), "-cubin", f"-arch={args.arch}", "-Xptxas", "-v", "-O3", "-std=c++17", "-o",
                                   str(Path(tmp) / "plain.cubin"), str(tu)], capture_output=True, text=True)
            text = proc.stdout + proc.stderr
            facts = parse_ptxas(text)
            f = facts.get(entry) if entry else None
            plain = (f"regs {f.registers}, spill stores/loads {f.spill_stores}/{f.spill_loads} B, static smem "
                     f"{f.smem_static} B, barriers {f.barriers}") if f else \
                " | ".join(ln.strip() for ln in text.splitlines() if "error" in ln)[:200]
            label = "-".join(f"{k}{v}" for k, v in cfg.items())
            print(f"{label}: cold {cold:.2f} s wall ({cpu:.2f} s CPU in nvcc/ptxas/cuobjdump), cached {cached:.4f} s\n  kregress: {mine}\n  plain nvcc -Xptxas -v: {plain}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
