"""What a sandboxed child of the gate runs (the reference child and each candidate's): its job loop, the
guards installed before any candidate code is imported (timers, threads, host reads of tensor values, the
aten audit), one call of the entry point on a fresh copy of a case, and the sampled run of a timed launch.
The zygote (``kernels.sandbox``) takes it by name (``DEFAULT_CHILD``); ``kernels.candidate`` is the judging parent
that never imports a candidate."""

from __future__ import annotations

import copy
import math
import os
import random
import threading
import time
from typing import Any, Callable

from kernels import sandbox as _sandbox  # bound before a child drops its copy of the package
from kernels.gate_cases import (
    GATE_PARAM_PREFIX,
    _clone_cpu,
    _fresh,
    _outputs,
    _tensor_bytes,
    _write_inplace,
    UNIFORM_BUDGET_S,
    UNIFORM_MAX,
    UNIFORM_POOL,
    _launch_grids,
    choose_programs,
    fed_slots,
    poison_buffers,
    program_slots,
    several_axes,
    transform_inputs,
    uniform_programs,
    upper_slots,
    wide_shape,
    WIDER_REACH_MAX_FLOPS,
    wider_shapes,
)
from kernels.gate_compare import _error_fractions, base_writes, reach_problems, sampled_problems
from kernels.gate_compile import _job_compile
from kernels.gate_sampler import _deadline, _handed_programs, _merged_stats, _OverBudget, _ProgramSampler, _ran
# Fresh allocations a candidate may read before writing: what they hold in the second call (see _OpRecorder).
# The tolerance's calibration (see _job_prepare): the baseline may use at most this fraction of it ...
CALIBRATION_HEADROOM = 0.5
# ... else it grows, at most this many times (a baseline further off fails the case). An FP8-KV MLA baseline
# on x8 queries, against exact dequantization, needs ~10x: its bf16 rounding of K moves the sharp softmax.
CALIBRATION_MAX = 32.0
EMPTY_OPS = frozenset({"empty", "empty_like", "new_empty", "empty_strided", "new_empty_strided"})


# --- in the children -------------------------------------------------------------------------------------


def preload() -> None:
    """What the zygote imports once so every fork starts warm: torch (the heavy part), never Triton
    (its standard library is decorated when imported, for the interpreter or the compiler: each child
    imports it in its own mode), never a family, never a candidate."""
    import sys

    import numpy  # noqa: F401
    import torch  # noqa: F401
    import torch.utils._python_dispatch  # noqa: F401

    import kregress.core.family  # noqa: F401
    import kregress.core.records  # noqa: F401
    import kregress.core.spec  # noqa: F401

    if any(m == "triton" or m.startswith("triton.") for m in sys.modules):
        raise RuntimeError("the zygote imported Triton while preloading; children could not choose the interpreter")


_GUARDED = (
    ("triton.testing", "do_bench"), ("triton.testing", "do_bench_cudagraph"), ("time", "perf_counter"),
    ("time", "time"), ("torch.cuda", "Event"), ("torch.cuda", "synchronize"), ("torch.cuda", "Stream"),
    ("torch", "empty"), ("torch", "empty_like"), ("torch.Tensor", "copy_"), ("torch.Tensor", "clone"),
    ("torch.Tensor", "to"), ("triton.runtime.jit.JITFunction", "run"), ("builtins", "open"),
)


def _resolve(path: str):
    import importlib

    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for p in parts[i:]:
            obj = getattr(obj, p)
        return obj
    raise ImportError(path)


def _snapshot_guarded() -> dict[str, Any]:
    out = {}
    for mod, attr in _GUARDED + tuple(_GUARDED_EXTRA):
        try:
            out[f"{mod}.{attr}"] = getattr(_resolve(mod), attr)
        except (ImportError, AttributeError):
            continue
    return out


def _changed_guarded(before: dict[str, Any]) -> list[str]:
    out = []
    for key, obj in before.items():
        mod, _, attr = key.rpartition(".")
        try:
            now = getattr(_resolve(mod), attr)
        except (ImportError, AttributeError):
            now = None
        if now is not obj:
            out.append(f"{key} was replaced (monkeypatched timer or harness)")
    return out


class _OpRecorder:
    """A TorchDispatchMode that counts the aten ops a call runs (name without overload) and, with
    ``decoys``, fills what the call allocates uninitialised (``torch.empty`` and kin) with plausible finite
    values instead of NaN: the previous call's outputs where the size matches (the memory a caching
    allocator hands back in a timing loop), else random numbers. A kernel that reads its output before
    writing it (reusing what the memory already holds, or testing whether the checker NaN-filled it)
    then returns stale values, which the comparison sees."""

    def __new__(cls, decoys: list | None = None, seed: int = 0):
        import collections

        import torch
        from torch.utils._python_dispatch import TorchDispatchMode

        class Recorder(TorchDispatchMode):
            def __init__(self):
                super().__init__()
                self.ops: collections.Counter = collections.Counter()
                self.decoys = decoys
                self.gen = torch.Generator(device="cpu").manual_seed(seed & 0x7FFF_FFFF)

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                name = str(func)
                short = name.split(".")[1] if name.startswith("aten.") else name
                self.ops[short] += 1
                out = func(*args, **(kwargs or {}))
                if self.decoys is not None and short in EMPTY_OPS and torch.is_tensor(out) and out.numel():
                    self._fill(out)
                return out

            def _fill(self, out):
                for d in self.decoys:
                    if torch.is_tensor(d) and d.dtype == out.dtype and d.numel() == out.numel():
                        out.copy_(d.reshape(out.shape).to(out.device))
                        return
                if out.is_floating_point():
                    out.copy_(torch.randn(out.shape, generator=self.gen).to(out.dtype).to(out.device))
                elif out.dtype != torch.bool:
                    out.copy_(torch.randint(-64, 64, out.shape, generator=self.gen).to(out.dtype).to(out.device))

        return Recorder()


def _poison(nbytes: int, device: str) -> None:
    """Allocate, fill with NaN, free: the memory a candidate's ``torch.empty`` can be handed holds NaN.
    (``fill_uninitialized_memory`` fills fresh allocations too; this covers recycled blocks.)"""
    import torch

    chunk = 1 << 16  # below malloc's mmap threshold, so freed chunks are reused on the CPU
    n = max(1, min(nbytes, 1 << 30) // (chunk * 4))
    bufs = [torch.full((chunk,), float("nan"), dtype=torch.float32, device=device) for _ in range(n)]
    del bufs
SAMPLED_MAX_FLOPS = 2e10  # the float64 reference of a sampled shape must stay cheap on a CPU
# ... except the least-work timed shape, checked whenever its reference stays within this (a 4096^3 GEMM, 1.4e11
# flops, is ~1 s of float64 BLAS on 2 cores): a judgement then always checks at least one timed shape (issue 32)
SAMPLED_ONE_MAX_FLOPS = 2e11
SAMPLED_MAX_BYTES = 256e6
SAMPLED_FULL_BUDGET_S = 120.0  # a full interpreter run (what a suspicion escalates to) must be affordable


def _sampled_call(family: Any, inputs: dict, config: dict, params: dict,
                  chooser: Callable[[int, tuple[int, int, int]], set]) -> tuple[Any, dict]:
    """One call of the entry point on the CPU interpreter with only the programs ``chooser`` names running
    (see ``_ProgramSampler``): (outputs, with NaN where no sampled program wrote; the sampling stats)."""
    _poison(2 * _tensor_bytes(inputs) + (1 << 20), "cpu")
    cfg, prm = copy.deepcopy(config), copy.deepcopy(params)
    _THREADS["in_call"] = True
    try:
        with _ProgramSampler(chooser) as sampler:
            out = family.run(inputs, cfg, prm)
    finally:
        _THREADS["in_call"] = False
    if cfg != config or prm != params:
        _sandbox.record_violation("the call changed the config or params it was handed (state kept across calls)")
    return _clone_cpu(out), sampler.stats(out)


def child_main(rfd: int, wfd: int, spec: dict, info: dict) -> None:
    """The job loop of a sandboxed child (reference or candidate); see ``judge_patches``."""
    import torch

    sandbox = _sandbox

    guarded = _snapshot_guarded()
    if spec.get("interpret"):
        from kernels import interpreter as _interpreter

        _interpreter.install()  # the same fixes every interpreter process gets (bf16 dot and rounding, ...)
        # (the module is the judged tree's: `kregress judge --base REF` of an older commit has neither hook)
        set_arch = getattr(_interpreter, "set_target_arch", None)
        if set_arch is not None:
            # the arch the compiled kernel would run on (tf32 dots from sm_80, fp8 accumulation on sm_90); sm_90
            # where the judge does not say
            set_arch(spec.get("arch"))
        watch = getattr(_interpreter, "watch_launch_reads", None)
        if watch is not None:
            # a launch's value is the compiled kernel on the GPU and a stand-in here: reading it is a violation
            watch(_launch_read_recorder(sandbox))
        guarded = _snapshot_guarded()
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    _guard_threads()
    _guard_host_reads(sandbox.watched_files(spec.get("watch", []), spec.get("watch_wrappers")))
    guarded = _snapshot_guarded()
    from kregress.core.family import get_family

    state: dict[str, Any] = {"guarded": guarded, "kept": {}}
    try:
        family = get_family(spec["family"]).for_params(spec.get("params") or {})
        mod_file = os.path.realpath(getattr(family.module, "__file__", "") or "")
        if not mod_file.startswith(os.path.realpath(spec["root"]) + os.sep):
            raise RuntimeError(f"the family module was imported from {mod_file}, not from the copy {spec['root']}")
        state["family"] = family
        load_violations = sandbox.violations() + _changed_guarded(guarded)
    except Exception as exc:  # noqa: BLE001 - a candidate that does not import is a value
        sandbox.write_frame(wfd, {"hello": info, "error": "compile_failed",
                                  "detail": f"importing the family failed: {type(exc).__name__}: {str(exc)[:400]}",
                                  "violations": sandbox.violations()})
        return
    sandbox.write_frame(wfd, {"hello": info, "violations": load_violations})
    jobs = {"prepare": _job_prepare, "run": _job_run, "compile": _job_compile, "bench": _job_bench,
            "recheck": _job_recheck, "full": _job_full, "identity": _job_identity}
    while True:
        msg = sandbox.read_frame(rfd)
        if msg is None:
            return
        header, blobs = msg
        op = header.get("job")
        if op == "exit":
            return
        try:
            reply, out_blobs = jobs[op](state, header, blobs)
        except Exception as exc:  # noqa: BLE001 - a failure is a value in the reply
            import traceback

            reply, out_blobs = {"error": "runtime_error", "detail": f"{type(exc).__name__}: {str(exc)[:400]}",
                                "traceback": traceback.format_exc(limit=4)[-1500:]}, []
        reply["violations"] = sandbox.violations() + _changed_guarded(state["guarded"])
        sandbox.write_frame(wfd, reply, out_blobs)


def _launch_read_recorder(sandbox: Any) -> Callable[[str], None]:
    """A ``watch_launch_reads`` callback: each distinct read of a launch's value is one violation."""
    seen: set[str] = set()

    def record(what: str) -> None:
        if what not in seen:
            seen.add(what)
            sandbox.record_violation(f"the candidate read {what}: a launch's return value tells the CPU interpreter "
                                     f"from the GPU")

    return record


_THREADS = {"in_call": False, "started": 0}

# Calls candidate code never needs and the aten audit cannot see: tensor values handed to Python without
# an aten op, and the switches that hide ops from the audit's dispatch mode.
_HOST_READS = (("torch.Tensor", "tolist"), ("torch.Tensor", "numpy"), ("torch.Tensor", "__array__"),
               ("torch.Tensor", "__dlpack__"), ("torch._tensor_str", "_str"))
_AUDIT_SWITCHES = (("torch.utils._python_dispatch", "_disable_current_modes"),
                   ("torch.utils._python_dispatch", "_pop_mode_temporarily"), ("torch.utils._python_dispatch", "_pop_mode"),
                   ("torch._C", "_pop_torch_dispatch_stack"), ("torch._C", "_unset_dispatch_mode"))


def _guard_host_reads(watch: dict) -> None:
    """Record a violation when candidate code (a watched file, directly or through torch or the standard
    library: ``str(t)``, ``print(t)``, ``np.asarray(t)``) reads tensor values into Python (host-side
    compute or value sniffing), or switches off the dispatch mode the aten audit records with. The
    harness's and Triton's own calls are not the candidate's."""
    import torch

    skip = _sandbox._stdlib_prefixes() + (os.path.dirname(torch.__file__) + os.sep,)
    for owner_path, attr in _HOST_READS + _AUDIT_SWITCHES:
        try:
            owner = _resolve(owner_path)
        except ImportError:
            continue
        original = getattr(owner, attr, None)
        if original is None:
            continue
        why = ("read tensor values into Python ({}): host-side compute or value sniffing" if (owner_path, attr) in _HOST_READS
               else "switched off the aten audit ({})").format(attr)

        def guarded(*args: Any, _original: Any = original, _why: str = why, **kwargs: Any) -> Any:
            if _sandbox.initiated_by(watch, skip):
                _sandbox.record_violation(f"the candidate {_why}")
            return _original(*args, **kwargs)

        setattr(owner, attr, guarded)
        _GUARDED_EXTRA.append((owner_path, attr))


_GUARDED_EXTRA: list[tuple[str, str]] = []


def _guard_threads() -> None:
    """Count the Python threads started while the entry point runs (3.11 has no audit event for it)."""
    import _thread

    original = threading._start_new_thread  # type: ignore[attr-defined]

    def start(function, args, kwargs=None):
        if _THREADS["in_call"]:
            _THREADS["started"] += 1
        return original(function, args, kwargs or {})

    threading._start_new_thread = start  # type: ignore[attr-defined]
    _thread.start_new_thread = start


def _call(family: Any, inputs: dict, config: dict, params: dict, device: str, record: bool = True,
          decoys: list | None = None, seed: int = 0) -> tuple[Any, dict]:
    """One call of the family's entry point: (outputs on the CPU, what was seen: the aten ops run and
    how many, the Python threads started, problems with the outputs). ``decoys``: fill fresh
    allocations with finite stale values (see ``_OpRecorder``) instead of NaN."""
    import torch

    _poison(2 * _tensor_bytes(inputs) + (1 << 20), device)
    rec = _OpRecorder(decoys, seed) if record else None
    problems: list[str] = []
    started = _THREADS["started"]
    cfg, prm = copy.deepcopy(config), copy.deepcopy(params)
    _THREADS["in_call"] = True
    try:
        if rec is not None:
            with rec:
                out = family.run(inputs, cfg, prm)
        else:
            out = family.run(inputs, cfg, prm)
        # read the results on the current stream first (work left on a side stream is not waited for),
        # then synchronise and read again: the two must agree
        first = _clone_cpu(out)
    finally:
        _THREADS["in_call"] = False
    if device == "cuda":
        torch.cuda.synchronize()
        second = _clone_cpu(out)
        for a, b in zip(_outputs(first), _outputs(second)):
            if torch.is_tensor(a) and not torch.equal(a.nan_to_num(0.123), b.nan_to_num(0.123)):
                problems.append("outputs changed after the call returned (work left running on another stream)")
                break
    if cfg != config or prm != params:
        # state kept in the dicts it is handed survives a timing loop that passes the same dict every call
        _sandbox.record_violation("the call changed the config or params it was handed (state kept across calls)")
    ops = rec.ops if rec is not None else {}
    seen = {"ops": set(ops), "op_count": sum(ops.values()), "threads": _THREADS["started"] - started, "problems": problems}
    return first, seen


def _job_prepare(state: dict, job: dict, blobs: list[bytes]) -> tuple[dict, list[bytes]]:
    """Reference child: pick each group's first valid shape, make the inputs of every case (secret
    seeds, distributions), the float64 reference and the baseline's outputs; record the baseline's ops."""
    import torch

    from kernels.dtypes import TORCH_DTYPES
    from kernels.measure import compare

    family = state["family"]
    dtype = TORCH_DTYPES[job["dtype"]]
    params, config, device = job["params"], job["config"], job["device"]
    base_tol = job["tolerance"]
    out_blobs: list[bytes] = []
    cases_out, dropped, ops = [], [], set()
    keep = job.get("keep", False)

    # the current group's gate-only params (GATE_PARAM_PREFIX): how its inputs are made, never handed to a call
    gate_inputs: dict = {}

    def make(shape: dict, seed: int, dist: str, prm: dict | None = None, poison: str = "nan") -> dict:
        """A case's inputs as shipped to every call: output buffers poisoned (``nan`` for the first call,
        ``random`` finite for the second), never written by any call (each call gets a fresh copy)."""
        prm = params if prm is None else prm
        inputs = family.make_inputs(shape, dtype, "cpu", seed, {**prm, **gate_inputs})
        inputs = transform_inputs(inputs, dist, dtype, seed + 7919)
        return poison_buffers(inputs, family.output_buffers(prm), poison, seed + 104729)

    def reference(inputs: dict, prm: dict | None = None) -> Any:
        prm = params if prm is None else prm
        ref_dev = job.get("reference_device", "cpu")
        try:
            return _clone_cpu(family.reference(_fresh(inputs, ref_dev), prm))
        except Exception:  # noqa: BLE001 - a reference that only runs on the CPU
            if ref_dev == "cpu":
                raise
            return family.reference(_fresh(inputs, "cpu"), prm)

    threads = 0

    op_count = 0

    calib = {"scale": 1.0}

    def one(shape: dict, seed: int, dist: str, prm: dict) -> tuple[dict, Any, Any, set[str], str | None, list[float]]:
        """The baseline on one case. The tolerance is the family's, calibrated against the baseline's own
        error on this exact (float64, exactly dequantized) reference: where the baseline uses more than
        ``CALIBRATION_HEADROOM`` of it, both atol and rtol grow until it uses that much (at most
        ``CALIBRATION_MAX`` times; beyond that the baseline fails the case)."""
        nonlocal threads, op_count
        inputs = make(shape, seed, dist, prm)
        ref = reference(inputs, prm)
        out, seen = _call(family, _fresh(inputs, device), config, prm, device)
        run_ops = seen["ops"]
        op_count = max(op_count, seen["op_count"])
        threads += seen["threads"]
        atol, rtol = family.tolerance(shape, job["dtype"], base_tol, prm)
        outs, refs = _outputs(out), _outputs(ref)
        if len(outs) != len(refs):
            return inputs, ref, out, run_ops, f"{len(outs)} outputs, reference has {len(refs)}", [atol, rtol]
        worst = max([_error_fractions(o, r, atol, rtol)[0] for o, r in zip(outs, refs)
                     if torch.is_tensor(o) and torch.is_tensor(r)] + [0.0])
        scale = max(1.0, worst / CALIBRATION_HEADROOM) if math.isfinite(worst) else math.inf
        if scale <= CALIBRATION_MAX:
            atol, rtol = atol * scale, rtol * scale
            calib["scale"] = max(calib["scale"], scale)
        for o, r in zip(outs, refs):
            if torch.is_tensor(o) and torch.is_tensor(r):
                res = compare(o, r, atol, rtol)
                if not res["ok"] or res["nan_inf"]:
                    return inputs, ref, out, run_ops, res["sample"][:200] or "NaN/Inf", [atol, rtol]
        return inputs, ref, out, run_ops, None, [atol, rtol]

    sampled = [g for g in job["groups"] if g.get("sample") and g["shapes"]]
    least = min(sampled, key=lambda g: family.flops(g["shapes"][0], params))["id"] if sampled else None
    wider_by_draw: dict[int, list[dict]] = {}  # the wider parts of one draw share one derivation
    for group in job["groups"]:
        if group.get("wide_of"):
            try:
                wide = wide_shape(family, group["wide_of"], job["correctness"], config, dtype, params)
            except Exception as exc:  # noqa: BLE001 - a wrapper that needs real inputs to launch: not derived
                wide = None
                dropped.append(f"wide: no shape derived ({type(exc).__name__}: {str(exc)[:120]})")
            if wide is None:
                continue
            group = dict(group, shapes=[wide])
        if group.get("wider_of"):
            if group["draw"] not in wider_by_draw:
                try:
                    wider_by_draw[group["draw"]] = wider_shapes(family, group["wider_of"], job["correctness"], config, dtype,
                                                                params, int(group["factor"]), random.Random(group["draw"]))
                except Exception as exc:  # noqa: BLE001 - as for wide
                    wider_by_draw[group["draw"]] = []
                    dropped.append(f"wider: no shape derived ({type(exc).__name__}: {str(exc)[:120]})")
            wider = wider_by_draw[group["draw"]]
            if group["part"] >= len(wider):
                continue
            group = dict(group, shapes=[wider[group["part"]]])
        if group.get("sample"):
            # a wider shape is within its own caps already (wider_shapes: the reach cap where an axis needs it)
            cap = WIDER_REACH_MAX_FLOPS if group.get("wider_of") else SAMPLED_ONE_MAX_FLOPS if group["id"] == least else SAMPLED_MAX_FLOPS
            case = _prepare_sampled(family, group, job, make, reference, dropped, calib["scale"], cap)
            if case is not None:
                case["payload"] = _sandbox.pack(case.pop("data"), out_blobs)
                cases_out.append(case)
            continue
        chosen = None
        tried = []
        visible = {k: v for k, v in group.get("params", {}).items() if not k.startswith(GATE_PARAM_PREFIX)}
        gate_inputs.clear()
        gate_inputs.update({k: v for k, v in group.get("params", {}).items() if k.startswith(GATE_PARAM_PREFIX)})
        prm = {**params, **visible}
        budget = None if group.get("ascending") else group.get("budget_s")  # ascending groups time their runs after
        over = math.inf  # the work of the smallest shape found past the budget: no larger one is tried
        for shape in group["shapes"]:
            seed, dist = group["seed"], group["dist"]
            if budget and family.flops(shape, prm) >= over:
                tried.append(f"{family.shape_label(shape)}: no less work than a shape past the budget")
                continue
            t0 = time.perf_counter()
            try:
                with _deadline(budget):
                    inputs, ref, out, run_ops, bad, tol = one(shape, seed, dist, prm)
            except _OverBudget:
                tried.append(f"{family.shape_label(shape)}: the baseline's run took over {budget}s on the interpreter")
                over = min(over, family.flops(shape, prm))
                continue
            except MemoryError as exc:
                tried.append(f"{shape}: the baseline cannot run it here (out of memory: {str(exc)[:80]})")
                continue
            except Exception as exc:  # noqa: BLE001 - a shape the family refuses: try the next one
                tried.append(f"{shape}: {type(exc).__name__}: {str(exc)[:120]}")
                continue
            if bad:
                tried.append(f"{shape}: the baseline fails it ({bad})")
                continue
            chosen = (shape, inputs, ref, out, run_ops, tol)
            # ascending groups keep growing while the run stays within half the budget (the next is ~2x)
            if not group.get("ascending") or time.perf_counter() - t0 > group.get("budget_s", 1.0) / 2:
                break
        if chosen is None:
            dropped.append(f"{group['kind']}: no usable shape ({'; '.join(tried)[:400]})")
            continue
        if over < math.inf:
            dropped.append(f"{group['kind']} {family.shape_label(chosen[0])}: used instead of larger shapes past the "
                           f"interpreter budget ({'; '.join(tried)[:300]})")
        shape, inputs, ref, out, run_ops, tol = chosen
        ops |= run_ops
        case = {"id": group["id"], "kind": group["kind"], "shape": shape, "seed_index": group["seed_index"],
                "dist": group["dist"], "tol": tol,
                "label": family.shape_label(shape) + (f" {group['kind']}" if group.get("params") else ""),
                "params": visible, "buffers": family.output_buffers(prm)}
        payload = {"inputs": inputs, "ref": ref, "base": out}
        if group.get("second"):
            s2 = group["second"]
            inputs2 = make(shape, s2["seed"], s2["dist"], prm, poison="random")
            ref2 = reference(inputs2, prm)
            out2, seen2 = _call(family, _fresh(inputs2, device), config, prm, device, decoys=_outputs(out), seed=s2["seed"])
            ops |= seen2["ops"]
            op_count = max(op_count, seen2["op_count"])
            threads += seen2["threads"]
            # the second call's values calibrate the tolerance too (the baseline on "large" values, say)
            pairs = [(o, r) for o, r in zip(_outputs(out2), _outputs(ref2)) if torch.is_tensor(o) and torch.is_tensor(r)]
            worst2 = max([_error_fractions(o, r, *case["tol"])[0] for o, r in pairs] + [0.0])
            family_tol = family.tolerance(shape, job["dtype"], base_tol, prm)
            grow = max(1.0, worst2 / CALIBRATION_HEADROOM) if math.isfinite(worst2) else math.inf
            if case["tol"][0] * grow <= CALIBRATION_MAX * family_tol[0]:
                case["tol"] = [t * grow for t in case["tol"]]
                calib["scale"] = max(calib["scale"], case["tol"][0] / family_tol[0])
                payload.update({"inputs2": inputs2, "ref2": ref2, "base2": out2})
                case["dist2"] = s2["dist"]
            else:
                dropped.append(f"{group['kind']} {family.shape_label(shape)}: the baseline fails the second call "
                               f"({s2['dist']} values; {worst2:.3g} of the tolerance): one call only")
        if keep and group["kind"] == "timed":
            state["kept"][group["id"]] = _fresh(inputs, device)
        case["payload"] = _sandbox.pack(payload, out_blobs)
        cases_out.append(case)
    return {"cases": cases_out, "dropped": dropped, "ops": sorted(ops), "op_count": op_count, "threads": threads}, out_blobs


def _prepare_sampled(family: Any, group: dict, job: dict, make: Callable, reference: Callable, dropped: list,
                     scale: float = 1.0, max_flops: float = SAMPLED_MAX_FLOPS) -> dict | None:
    """Reference child: a timed shape for the sampled check, used only where it is cheap to make and the
    baseline passes it (a family whose programs share their outputs, a split-K reduction, say, cannot be
    checked by sampling) and a full run, what a suspicion escalates to, is affordable."""
    from kernels.dtypes import DTYPE_BYTES, TORCH_DTYPES

    params, config = job["params"], job["config"]
    shape = group["shapes"][0]
    label = f"{group['kind']} {family.shape_label(shape)}"
    if family.flops(shape, params) > max_flops or family.bytes_moved(shape, DTYPE_BYTES[job["dtype"]], params) > SAMPLED_MAX_BYTES:
        dropped.append(f"{label}: too large for a float64 reference on the CPU (not sampled)")
        return None
    try:
        inputs = make(shape, group["seed"], group["dist"])
        ref = reference(inputs)
        try:  # the launches' grids (cached per process): a launch feeds the later ones (fed_slots)
            grids = _launch_grids(family, shape, config, TORCH_DTYPES[job["dtype"]], params)
        except Exception:  # noqa: BLE001 - a wrapper that needs real inputs to launch: no feeding
            grids = None
        runs, programs = _sampled_baseline(family, inputs, config, params, int(group["sample_seed"]),
                                           [int(x) for x in group["candidate_seeds"]], uniform=not group.get("wider_of"),
                                           grids=grids)
    except Exception as exc:  # noqa: BLE001 - a family the sampler cannot run: the check is not used
        dropped.append(f"{label}: the sampled run failed ({type(exc).__name__}: {str(exc)[:120]})")
        return None
    atol, rtol = (scale * t for t in family.tolerance(shape, job["dtype"], job["tolerance"], params))
    # values run by run; the reach over both runs together (the second runs only alternatives: MLA's combine
    # programs there read partials of decode programs run in the first)
    stats = _merged_stats([st for _o, st in runs])
    cover = not group.get("wider_of")
    why = [w for o, st in runs for w in sampled_problems(o, ref, st, atol, rtol, cover=cover, reach=False)]
    why += reach_problems(ref, stats, cover)
    if why:
        dropped.append(f"{label}: the baseline itself does not pass a sampled run ({'; '.join(why)[:200]})")
        return None
    settle = stats["full_seconds"] <= SAMPLED_FULL_BUDGET_S
    if not settle:
        dropped.append(f"{label}: a full run would take ~{stats['full_seconds']:.0f}s on the interpreter: sampled "
                       "without escalation (written values are compared; a program that writes less is not settled)")
    return {"id": group["id"], "kind": group["kind"], "shape": shape, "seed_index": group["seed_index"], "dist": group["dist"],
            "tol": [atol, rtol], "label": family.shape_label(shape), "sampled": True, "params": {}, "settle": settle,
            "buffers": family.output_buffers(params),
            "full_seconds": stats["full_seconds"], "base_writes": base_writes(stats), "programs": programs,
            "data": {"inputs": inputs, "ref": ref}}


def _sampled_baseline(family: Any, inputs: dict, config: dict, params: dict, seed: int,
                      candidate_seeds: list[int], uniform: bool = True,
                      grids: list[tuple[int, ...]] | None = None) -> tuple[list[tuple[Any, dict]], dict[str, list[dict]]]:
    """The baseline's sampled runs of a timed shape and the programs every candidate will run.

    First run: the first choice of every slot of ``program_slots`` (``upper_slots`` without ``uniform``; drawn
    from ``seed``, per launch). Second
    run, on fresh inputs: the other alternatives of the slots whose first choice wrote nothing, and a pool of
    ``UNIFORM_POOL`` times the uniform programs a candidate runs (``UNIFORM_MAX``, as far as ``UNIFORM_BUDGET_S``
    of the first run's seconds per working program allows; none without ``uniform``, as for a wider shape, whose
    slots are what it is for). With the call's launch ``grids`` known, a launch adds ``fed_slots`` for the later
    ones (its first program over the axes they collapse: MLA's splits). Then per candidate seed and launch
    ``choose_programs``. Returns the runs' (outputs, stats) and per candidate seed, per launch {dims, pids}:
    what that candidate's sampled run executes (every program of it ran in the baseline, so the writes
    compare program by program)."""
    import random

    plan: dict[int, dict] = {}
    grids3 = [(tuple(g) + (1, 1, 1))[:3] for g in grids or []]  # as the interpreter reports them: (nx, ny, nz)

    def first(j: int, dims: tuple[int, int, int]) -> set:
        slots = (program_slots(dims, random.Random(f"{seed}:{j}")) if uniform
                 else upper_slots(dims, seed, [plan[i]["dims"] for i in sorted(plan)]))
        if j < len(grids3) and grids3[j] == tuple(dims):
            have = {slot[0] for slot in slots}
            slots += [slot for slot in fed_slots(dims, grids3[j + 1:]) if slot[0] not in have]
        plan[j] = {"dims": dims, "slots": slots, "pool": [], "k": 0}
        return {slot[0] for slot in slots}

    runs = [_sampled_call(family, _fresh(inputs, "cpu"), config, params, first)]
    ran1 = _ran(runs[0][1])
    extra: dict[int, set] = {}
    for j, p in plan.items():
        done = ran1[j] if j < len(ran1) else {}
        busy = [t for w, t in done.values() if w > 0]
        frac = len(busy) / max(1, len(done))
        if uniform and busy and several_axes(p["dims"]):  # on one axis the slots already hold every class
            per = max(sum(busy) / len(busy), 1e-4)
            p["k"] = int(min(UNIFORM_MAX, UNIFORM_BUDGET_S // per))
        if p["k"]:
            n = min(4 * UNIFORM_POOL * p["k"], math.ceil(UNIFORM_POOL * p["k"] / max(frac, 0.25)) + 4)
            p["pool"] = uniform_programs(p["dims"], random.Random(f"{seed}:{j}:uniform"), n)
        idle = [slot for slot in p["slots"] if done.get(slot[0], (0, 0.0))[0] == 0]
        extra[j] = ({q for slot in idle for q in slot[1:]} | set(p["pool"])) - set(done)
    if any(extra.values()):
        runs.append(_sampled_call(family, _fresh(inputs, "cpu"), config, params,
                                  lambda j, dims: extra.get(j, set()) if plan.get(j, {}).get("dims") == dims else set()))
    wrote: dict[int, dict[tuple, int]] = {}
    for _o, st in runs:
        for j, progs in enumerate(_ran(st)):
            wrote.setdefault(j, {}).update({pid: w for pid, (w, _t) in progs.items()})
    programs = {}
    for cs in candidate_seeds:
        rng = random.Random(f"{cs}:choose")
        programs[str(cs)] = [{"dims": list(p["dims"]),
                              "pids": [list(q) for q in choose_programs(p["slots"], p["pool"], wrote.get(j, {}), p["k"], rng)]}
                             for j, p in sorted(plan.items())]
    return runs, programs


def _job_full(state: dict, job: dict, blobs: list[bytes]) -> tuple[dict, list[bytes]]:
    """Candidate child: a full (unsampled) call on a sampled case's inputs, where the sampled run left
    something to settle."""
    sandbox = _sandbox
    out_blobs: list[bytes] = []
    results = []
    for case in job["cases"]:
        data = sandbox.unpack(case["payload"], blobs)
        try:
            prm = {**job["params"], **case.get("params", {})}
            out, seen = _call(state["family"], _fresh(data["inputs"], job["device"]), job["config"], prm, job["device"])
            results.append({"id": case["id"], "problems": seen["problems"], "payload": sandbox.pack({"out": out}, out_blobs)})
        except Exception as exc:  # noqa: BLE001 - a crashing candidate is a value
            results.append({"id": case["id"], "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
    return {"results": results}, out_blobs


def _job_run(state: dict, job: dict, blobs: list[bytes]) -> tuple[dict, list[bytes]]:
    """Candidate child: run every case (and its second call in the same buffers); send back the outputs,
    the inputs as they are after each call, the ops run and what was seen."""
    sandbox = _sandbox
    family = state["family"]
    params, config, device = job["params"], job["config"], job["device"]
    out_blobs: list[bytes] = []
    results = []
    ops: set[str] = set()
    op_count = 0
    threads = 0
    for case in job["cases"]:
        data = sandbox.unpack(case["payload"], blobs)
        res: dict[str, Any] = {"id": case["id"]}
        prm = {**params, **case.get("params", {})}
        t0 = time.perf_counter()
        try:
            inputs = _fresh(data["inputs"], device)  # the shipped inputs are never handed to a call
            if case.get("sample"):
                out, stats = _sampled_call(family, inputs, config, prm, _handed_programs(case))
                res.update({"sampled": stats, "problems": [], "seconds": time.perf_counter() - t0,
                            "payload": sandbox.pack({"out": out, "after": _clone_cpu(inputs)}, out_blobs)})
                results.append(res)
                continue
            out, seen = _call(family, inputs, config, prm, device)
            ops |= seen["ops"]
            op_count = max(op_count, seen["op_count"])
            threads += seen["threads"]
            problems = list(seen["problems"])
            payload = {"out": out, "after": _clone_cpu(inputs)}
            if "inputs2" in data:
                _write_inplace(inputs, data["inputs2"])
                # the second call finds the first call's outputs (or random numbers) in what it allocates,
                # not NaN: reading the output before writing it shows
                out2, seen2 = _call(family, inputs, config, prm, device, decoys=_outputs(out),
                                    seed=int(case.get("decoy_seed", 0)))
                ops |= seen2["ops"]
                op_count = max(op_count, seen2["op_count"])
                threads += seen2["threads"]
                problems += seen2["problems"]
                payload.update({"out2": out2, "after2": _clone_cpu(inputs)})
            if case.get("keep"):
                state["kept"][case["id"]] = inputs
            res["problems"] = problems
            res["payload"] = sandbox.pack(payload, out_blobs)
            res["seconds"] = time.perf_counter() - t0
        except Exception as exc:  # noqa: BLE001 - a crashing candidate is a value
            import traceback

            res["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            res["traceback"] = traceback.format_exc(limit=-3)[-800:]
        results.append(res)
    return {"results": results, "ops": sorted(ops), "op_count": op_count, "threads": threads}, out_blobs


def _job_bench(state: dict, job: dict, blobs: list[bytes]) -> tuple[dict, list[bytes]]:
    """GPU: time the entry point on a kept case's inputs for one slot of the interleaved batch."""
    from kernels.measure import device_identity

    # the timer as it was before the candidate was imported (a replaced one is also reported)
    do_bench = state["guarded"]["triton.testing.do_bench"]
    do_bench_cudagraph = state["guarded"]["triton.testing.do_bench_cudagraph"]
    family = state["family"]
    inputs = state["kept"][job["case"]]
    config, params = job["config"], job["params"]
    # fresh (shallow) copies each call, on both sides: state kept in the dicts does not survive the loop
    fn = lambda: family.run(inputs, dict(config), dict(params))  # noqa: E731
    ident = device_identity()
    import torch

    # no NaN fill of fresh allocations while timing (both sides alike): it would add a kernel per call
    torch.utils.deterministic.fill_uninitialized_memory = False
    torch.use_deterministic_algorithms(False)
    _THREADS["in_call"] = True
    started = _THREADS["started"]
    try:
        if family.use_cudagraph():
            samples = do_bench_cudagraph(fn, rep=job["rep_ms"], return_mode="all")
        else:
            samples = do_bench(fn, warmup=job["warmup_ms"], rep=job["rep_ms"], return_mode="all")
    finally:
        _THREADS["in_call"] = False
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.utils.deterministic.fill_uninitialized_memory = True
    return {"samples": [float(s) for s in samples], "identity": ident, "threads": _THREADS["started"] - started}, []


def _job_identity(state: dict, job: dict, blobs: list[bytes]) -> tuple[dict, list[bytes]]:
    """GPU: which GPU this child times on (read at a timing batch's start and end)."""
    from kernels.measure import device_identity

    return {"identity": device_identity()}, []


def _job_recheck(state: dict, job: dict, blobs: list[bytes]) -> tuple[dict, list[bytes]]:
    """GPU, after the timing loop: new values into the kept buffers, one more call, outputs back."""
    sandbox = _sandbox
    family = state["family"]
    out_blobs: list[bytes] = []
    results = []
    for case in job["cases"]:
        data = sandbox.unpack(case["payload"], blobs)
        inputs = state["kept"][case["id"]]
        _write_inplace(inputs, data["inputs"])
        out, seen = _call(family, inputs, job["config"], job["params"], job["device"], record=False)
        results.append({"id": case["id"], "problems": seen["problems"], "payload": sandbox.pack({"out": out}, out_blobs)})
    return {"results": results}, out_blobs
