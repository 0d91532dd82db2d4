"""The GPU stage of a patched CUDA family: which cases it runs (``gpu_cases``, pure) and the child that runs
them (``python -m kernels.cuda.gpu_child``, started confined by ``child_command``: bwrap with no network,
an allowlisted environment, read-only binds of Python, the project's ``kernels``/``kregress`` packages, the
patched copy and the cubin cache, and the GPU's device nodes).

The cases, for one variant: every timed shape of the spec (``shape_matrix``), the correctness shapes, a
hidden odd shape (every dimension moved to a nearby odd value with a secret offset, where the family
allows it), for every shape key and every value the timed shapes give it one shape just past it (the
next value the family accepts: K 2048 -> 2176), a large one (the next accepted value at or past twice the
largest timed value and 2048), and the structure case of the least accepted values (M = N = 1, K = 128).

The child, per case: output memory is poisoned (``torch.empty`` fills NaN through
``torch.utils.deterministic.fill_uninitialized_memory``, and freed blocks are NaN-filled before each
call), the patched cubin is launched, and the result is compared with the float64 reference; the first
case that fails ends the check with its label. Then, if every case passed, the variant is timed beside the
baseline in one interleaved batch. Before anything the child checks it has no network (only ``lo`` in
``/proc/net/dev``): a child that sees another interface judges nothing.

Protocol: one JSON job on stdin; one line ``@@kregress-cuda <json>`` on stdout (anything else a library
prints is ignored). No Dagster.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PREFIX = "@@kregress-cuda "
LARGE_MIN = 2048


@dataclass(frozen=True)
class GpuCase:
    """One shape the GPU stage checks, and why it is there."""

    kind: str  # timed, correctness, hidden_odd, past_timed, large, structure
    shape: dict


def _next_valid(family: Any, shape: dict, key: str, above: int, span: int = 4096) -> dict | None:
    """``shape`` with ``key`` at the least value past ``above`` that the family accepts (None: none within ``span``)."""
    for v in range(above + 1, above + span + 1):
        cand = {**shape, key: v}
        if family.check_shape(cand) is None:
            return cand
    return None


def _oddish(family: Any, base: dict, rng: Any) -> dict:
    """``base`` with each dimension moved to a nearby odd value (a secret offset), or doubled where the
    family refuses odd ones, or kept."""
    cand = dict(base)
    for k, v in base.items():
        for value in (v + 2 * rng.randrange(1, 32) + 1, 2 * v):
            if family.check_shape({**cand, k: value}) is None:
                cand[k] = value
                break
    return cand


def gpu_cases(family: Any, spec: Any, rng: Any = None) -> list[GpuCase]:
    """Every case the GPU stage runs for one variant (see the module's docstring); duplicates dropped,
    the timed shapes first."""
    rng = rng or secrets.SystemRandom()
    out: list[GpuCase] = []
    seen: set[tuple] = set()

    def add(kind: str, shape: dict | None) -> None:
        if shape is None or family.check_shape(shape) is not None:
            return
        key = tuple(sorted(shape.items()))
        if key not in seen:
            seen.add(key)
            out.append(GpuCase(kind, dict(shape)))

    timed = [dict(s) for s in spec.shape_matrix]
    for s in timed:
        add("timed", s)
    for s in spec.correctness_shapes:
        add("correctness", dict(s))
    base = dict(spec.correctness_shapes[0]) if spec.correctness_shapes else dict(timed[0])
    odd = _oddish(family, base, rng)
    add("hidden_odd", odd)
    small = odd if family.check_shape(odd) is None else base
    for key in family.shape_keys:
        values = sorted({s[key] for s in timed if key in s})
        for v in values:
            add("past_timed", _next_valid(family, small, key, v))
        if values:
            add("large", _next_valid(family, small, key, max(2 * values[-1], LARGE_MIN) - 1))
    ones = dict(base)
    for key in family.shape_keys:
        for v in range(1, ones[key] + 1):
            if family.check_shape({**ones, key: v}) is None:
                ones[key] = v
                break
    add("structure", ones)
    return out


# --- the child's command line -----------------------------------------------------------------------


def _python_dirs() -> list[Path]:
    """What the child's Python needs: the interpreter's stdlib and every site folder (venv included),
    never the project's root (its packages are bound one by one)."""
    from kregress.core.paths import REPO_ROOT

    prefixes = {Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve(), Path(sys.exec_prefix).resolve()}
    out: list[Path] = [Path(sys.base_prefix) / "lib", Path(sys.prefix)]
    for p in sys.path:  # site and stdlib folders only: never '' or a script's folder (a /tmp full of other copies)
        q = Path(p).resolve() if p else None
        if q is None or not q.is_dir() or q == REPO_ROOT.resolve():
            continue
        if any(x == q or x in q.parents for x in prefixes) or {"site-packages", "dist-packages"} & set(q.parts):
            out.append(q)
    out.append(Path(sys.executable).resolve().parent)
    return [p for p in dict.fromkeys(out) if p.exists()]


def project_packages(family_root: Path | None = None) -> list[Path]:
    """The project's packages the child imports (``kernels``, ``kregress``) and a plugin family's root."""
    from kregress.core.paths import REPO_ROOT

    out = [REPO_ROOT / "kernels", REPO_ROOT / "kregress"]
    if family_root is not None and Path(family_root).resolve() != REPO_ROOT.resolve():
        out.append(Path(family_root))
    return out


def gpu_devices() -> list[str]:
    """The NVIDIA device nodes (``/dev/nvidia0``, ``/dev/nvidiactl``, ``/dev/nvidia-uvm``, ...)."""
    import glob

    return sorted(p for p in glob.glob("/dev/nvidia*") if not os.path.isdir(p)) + \
        sorted(p for p in glob.glob("/dev/nvidia-caps/*"))


def child_command(work: Path, ro: list[Path], env: dict[str, str], family_root: Path | None = None) -> tuple[list[str], dict]:
    """(the confined command line of the GPU child, its environment): ``ro`` (the patched copies, the
    cubin cache) and the project's packages read-only, ``work`` read-write, the GPU's device nodes, /sys
    read-only, no network, limits ``confine.GPU_LIMITS``."""
    from kernels.cuda import confine
    from kregress.core.paths import REPO_ROOT

    child_env = dict(env)
    child_env.update({"HOME": str(work), "TMPDIR": str(work), "PYTHONNOUSERSITE": "1", "PYTHONDONTWRITEBYTECODE": "1",
                      "TRITON_CACHE_DIR": str(work / "triton"),
                      "PYTHONPATH": os.pathsep.join([str(REPO_ROOT)] + ([str(family_root)] if family_root else []))})
    binds = _python_dirs() + project_packages(family_root) + list(ro)
    if Path("/etc/ld.so.cache").is_file():
        binds.append(Path("/etc/ld.so.cache"))
    nvcc = env.get("KREGRESS_NVCC")
    if nvcc:
        binds.append(confine.toolkit_root(nvcc))
    cmd = confine.command([sys.executable, "-m", "kernels.cuda.gpu_child"], ro=binds, rw=[work], env=child_env,
                          cwd=work, limits=confine.GPU_LIMITS, devices=gpu_devices(), sys_ro=True)
    return cmd, child_env


# --- in the child -------------------------------------------------------------------------------------


def network_interfaces() -> list[str]:
    """The interfaces this process's network namespace holds (``/proc/net/dev``)."""
    try:
        lines = Path("/proc/net/dev").read_text().splitlines()[2:]
    except OSError:
        return []
    return [ln.split(":", 1)[0].strip() for ln in lines if ":" in ln]


def _poison(nbytes: int) -> None:
    """Allocate, fill with NaN, free: a recycled block a kernel is handed holds NaN."""
    import torch

    n = max(1, min(nbytes, 1 << 30) // (1 << 22))
    bufs = [torch.full((1 << 20,), float("nan"), dtype=torch.float32, device="cuda") for _ in range(n)]
    del bufs


def run_job(job: dict) -> dict:
    """Check every case (output memory NaN-poisoned), then time beside the baseline: the answer."""
    extra = [i for i in network_interfaces() if i != "lo"]
    if job.get("require_no_network", True) and extra:
        return {"error": "patch_rejected", "detail": f"not judged: the GPU child sees network interfaces "
                                                     f"({', '.join(extra)}): it must run in an empty network namespace"}
    if job.get("op") == "probe":  # what the confinement lets the child see (a CPU host's test of the binds)
        seen = {}
        for p in job.get("paths", []):
            try:
                Path(p).read_bytes()
                seen[p] = "readable"
            except OSError as exc:
                seen[p] = type(exc).__name__
        from kregress.core.bind import family_for

        fam = family_for(job["family"], job.get("params", {}))
        return {"interfaces": network_interfaces(), "env": sorted(os.environ), "paths": seen, "family": fam.name}
    import torch

    from kernels.measure import batch_measurements, check_correctness
    from kregress.core.bind import family_for

    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True  # torch.empty -> NaN (ints: their max)
    family = family_for(job["family"], job.get("params", {}))
    done, worst = [], None
    for case in job["cases"]:
        _poison(64 << 20)
        corr = check_correctness(family, job["config"], [case["shape"]], job["dtype"], job["tolerance"],
                                 job.get("params", {}), "cuda", False, job.get("seed", 0))
        done.append({"kind": case["kind"], "shape": case["shape"], "ok": corr.ok})
        if not corr.ok:
            return {"correctness": corr.model_dump(), "cases": done, "failed": case}
        if worst is None or corr.max_rel_err > worst.max_rel_err:
            worst = corr
    checked = [f"{c['kind']} {family.shape_label(c['shape'])}" for c in job["cases"]]
    out: dict = {"correctness": worst.model_copy(update={"shapes_checked": checked}).model_dump() if worst else None,
                 "cases": done}
    m = job.get("measure")
    if m:
        torch.use_deterministic_algorithms(False)  # no NaN fill inside the timed calls (it would time a memset)
        batch = batch_measurements(family, m["baseline"], {"v": job["config"]}, m["shapes"], job["dtype"],
                                   job.get("params", {}), m["warmup_ms"], m["rep_ms"], job.get("seed", 0),
                                   m.get("batch_id", ""), m.get("rounds", 4), "interleaved")
        out["batch"] = {k: [x.model_dump() for x in v] for k, v in batch.items()}
    return out


def main() -> None:
    out = sys.stdout
    sys.stdout = sys.stderr  # library prints must not corrupt the answer
    try:
        result = run_job(json.loads(sys.stdin.read()))
    except Exception as exc:  # a failure is a value: the parent turns it into the row's error
        result = {"error": "runtime_error", "detail": f"{type(exc).__name__}: {str(exc)[:400]}"}
    out.write(PREFIX + json.dumps(result, default=str) + "\n")
    out.flush()


if __name__ == "__main__":
    main()
