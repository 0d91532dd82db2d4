"""Child process that compiles, checks and times variants, one JSON job per line.

The parent (resources/gpu.py) keeps a few of these alive and kills one that runs past its variant's
time limit, so a hanging or crashing variant (illegal address, ptxas blow-up) becomes a row with
``error=timeout`` or ``error=crashed`` and the round goes on. Protocol: the parent writes one JSON
object per line on stdin; the worker answers one line on stdout that starts with ``@@kregress ``;
anything else a library prints is ignored.

Run with TRITON_INTERPRET=1 for the interpreter backend (Triton reads it when kernels are decorated,
so it must be set before ``kernels.*`` is imported, hence a process of its own); importing the
``kernels`` package installs the interpreter's fixes (kernels/interpreter.py) in that process.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback

PREFIX = "@@kregress "


def _limits(d: dict):
    from kregress.core.spec import HardwareLimits

    return HardwareLimits(**d)


def handle(job: dict) -> dict:
    from kregress.core.bind import family_for

    # the family rebuilt the way bind() built it in the parent: lookup name, then the spec's params
    family = family_for(job["family"], job.get("params", {}))
    op = job["op"]
    if op == "compile":
        from kernels.compile import CompileError, compile_units

        from kregress.core.family import CudaFamily

        try:
            if isinstance(family, CudaFamily):  # nvcc -cubin, facts from ptxas -v (kernels/cuda/nvcc.py)
                from kernels.cuda.nvcc import compile_variant

                stats, _builds = compile_variant(family, job["config"], job["dtype"], job.get("params", {}), job["arch"],
                                                 _limits(job["limits"]))
            else:
                units = family.compile_units(job["config"], job["dtype"], job.get("params", {}))
                stats = compile_units(units, job["arch"], _limits(job["limits"]), sass=job.get("sass", True))
        except CompileError as exc:
            return {"error": exc.error, "detail": exc.detail}
        return {"stats": stats.model_dump()}
    if op == "correctness":
        from kernels.measure import check_correctness

        corr = check_correctness(
            family, job["config"], job["shapes"], job["dtype"], job["tolerance"], job.get("params", {}),
            job["device"], job["interpret"], job.get("seed", 0),
        )
        return {"correctness": corr.model_dump()}
    if op == "measure_cuda":
        from kernels.measure import cuda_measurements

        ms = cuda_measurements(family, job["config"], job["shapes"], job["dtype"], job.get("params", {}),
                               job["warmup_ms"], job["rep_ms"], job.get("seed", 0))
        return {"measurements": [m.model_dump() for m in ms]}
    if op == "measure_batch":  # the baseline re-timed in this process, interleaved with the variants
        from kernels.measure import batch_measurements

        lock = job.get("lock_clocks")
        out = batch_measurements(
            family, job["baseline"], job["configs"], job["shapes"], job["dtype"], job.get("params", {}),
            job["warmup_ms"], job["rep_ms"], job.get("seed", 0), job.get("batch_id", ""), job.get("rounds", 4),
            job.get("order", "interleaved"), tuple(lock) if lock else None,
        )
        return {"batch": {k: [m.model_dump() for m in ms] for k, ms in out.items()}}
    if op == "describe":  # which files the family was imported from, and the config's space check
        return {"source_files": [str(f) for f in family.source_files()],
                "space_check": family.space.check(job["config"], job.get("params", {}), _limits(job["limits"]))}
    if op == "ping":
        return {"pong": os.getpid()}
    if op == "versions":  # what this process runs on, and which interpreter fixes it installed
        import numpy
        import torch
        import triton

        from kernels.interpreter import installed

        return {"python": sys.version.split()[0], "torch": torch.__version__, "triton": triton.__version__,
                "numpy": numpy.__version__, "interpret": os.environ.get("TRITON_INTERPRET") == "1",
                "interpreter_fixes": installed()}
    return {"error": "runtime_error", "detail": f"unknown op {op!r}"}


def _exit_with_parent(poll_s: float = 1.0) -> None:
    """End this worker within ``poll_s`` of its parent's death (a killed sweep), even mid-job: nobody is
    left to read the answer. (PR_SET_PDEATHSIG would fire when the parent *thread* that started the worker
    ends, and pools start workers from short-lived threads.)"""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(poll_s)
            if os.getppid() != parent:
                os._exit(0)

    threading.Thread(target=watch, daemon=True, name="kregress-parent-watch").start()


def main() -> None:
    _exit_with_parent()
    out = sys.stdout
    sys.stdout = sys.stderr  # library prints must not corrupt the protocol
    out.write(PREFIX + json.dumps({"ready": os.getpid()}) + "\n")
    out.flush()
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            job = json.loads(line)
            result = handle(job)
        except Exception as exc:  # a failure is a value: the parent turns it into a row
            tb = traceback.format_exc(limit=3)
            result = {"error": "runtime_error", "detail": f"{type(exc).__name__}: {str(exc)[:400]}", "traceback": tb[-1500:]}
        out.write(PREFIX + json.dumps(result, default=str) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
