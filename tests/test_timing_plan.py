"""One timing plan, from the spec alone, driven through the CUDA backend's timing code with a fake device timer.

No GPU here. The only stand-in is the device timer (what ``do_bench`` would return for one slot); everything
else is the real code: ``TimingPlan.from_spec``, ``CudaBackend._time`` (forecast order, the per-round GPU
cap, one ``measure_batch`` job per look, adaptive looks judged by ``kregress.core.stats.judge_look``),
``kernels.measure.time_slots`` (the worker's batch protocol: ``run_batch`` per shape, Measurements) and the
sweep's verdict rule. The cuda worker process is replaced by a pool that runs the worker's own batch function
in this process, with the fake device timer in place of ``do_bench``; a patch's sandboxed children (its own and
the baseline's) by ``FakeChild``, which answers the gate's ``bench`` jobs with the same fake device timer, so
the patch goes through the gate's real timer (``kernels.candidate.PatchTimer``) in the same ``CudaBackend._time``.
"""

from __future__ import annotations

import numpy as np
import pytest

from kregress.core import batching, stats
from kregress.core.batching import BASELINE, TimingPlan
from kregress.core.records import VariantResult
from kregress.core.spec import load_spec


def _needs_dagster():
    pytest.importorskip("dagster", reason="CudaBackend is a Dagster resource; Dagster is not importable here")


def _spec(**bench):
    spec = load_spec("specs/gemm_smoke.yaml")
    return spec.model_copy(update={"benchmark": spec.benchmark.model_copy(update=bench)})


class FakeDevice:
    """Slot timings of kernels whose true times are ``true_ms`` (1% lognormal noise, 6 samples a slot, or a
    noisy two-regime device for the keys in ``noisy``); records every slot it was asked to time."""

    def __init__(self, true_ms: dict[str, float], noisy: set[str] = frozenset(), seed: int = 0):
        self.true_ms, self.noisy = true_ms, noisy
        self.rng = np.random.default_rng(seed)
        self.slots: list[tuple[int, str, int, int]] = []  # (job, key, round, position)
        self.job = 0

    def __call__(self, si: int, key: str, slot: batching.Slot) -> list[float]:
        self.slots.append((self.job, key, slot.round, slot.position))
        return self.sample(key)

    def sample(self, key: str) -> list[float]:
        t = self.true_ms[key]
        sigma = 0.15 if key in self.noisy else 0.01
        return list(t * np.exp(self.rng.normal(0.0, sigma, 6)))


class WorkerInProcess:
    """The cuda pool, answering each measure_batch job with the worker's own batch protocol
    (``kernels.measure.time_slots``) on the fake device."""

    def __init__(self, device: FakeDevice, config_ms):
        self.device, self.jobs, self.config_ms = device, [], config_ms

    def run(self, jobs, timeout):
        from kernels.measure import clock_lock, time_slots
        from kregress.core.family import get_family

        out = []
        for job in jobs:
            self.jobs.append(job)
            self.device.true_ms = {BASELINE: self.config_ms(job["baseline"]),
                                   **{k: self.config_ms(c) for k, c in job["configs"].items()}}
            with clock_lock(job["lock_clocks"]) as locked:  # as kernels.measure.batch_measurements does
                res = time_slots(get_family("gemm"), list(job["configs"]), job["shapes"], self.device, job["dtype"],
                                 job["params"], rounds=job["rounds"], order=job["order"], seed=job["seed"],
                                 batch_id=job["batch_id"], identity=lambda: {"host": "h", "gpu_uuid": "GPU-fake"},
                                 device_name="Fake GPU", clocks_locked=locked)
            out.append({"batch": {k: [m.model_dump() for m in ms] for k, ms in res.items()}, "wall_s": 0.01})
            self.device.job += 1
        return out


def _rows(spec, configs):
    return [VariantResult(variant_id=f"v{i}", round=1, source="local", config=c, config_hash=str(i))
            for i, c in enumerate(configs)]


def _time(spec, configs, config_ms, noisy=frozenset()):
    _needs_dagster()
    from kregress.core.family import get_family
    from resources.gpu import CudaBackend, EvaluationStats

    device = FakeDevice({}, noisy=noisy)
    backend = CudaBackend()
    pool = WorkerInProcess(device, config_ms)
    backend._pools["cuda"] = pool
    rows = _rows(spec, configs)
    backend._time(spec, get_family("gemm"), rows, {}, list(range(len(rows))), 10.0, EvaluationStats(), lambda m: None)
    return rows, pool, device


def test_plan_comes_from_the_spec_alone():
    spec = _spec(batch_rounds=7, batch_order="random-blocks", lock_clocks="1755,2619", max_gpu_seconds_per_round=30.0,
                 rep_ms=140, warmup_ms=28)
    plan = TimingPlan.from_spec(spec)
    assert plan == TimingPlan(order="random-blocks", rounds=7, max_rounds=7, warmup_ms=28, rep_ms=140,
                              lock_clocks=(1755, 2619), gpu_seconds_cap=30.0, interleaved_baseline=True, confidence=0.90)
    assert plan.looks() == (7,) and not plan.adaptive and plan.slot_ms == 20 and plan.slot_warmup_ms == 4
    assert plan.job_fields() == {"warmup_ms": 28, "rep_ms": 140, "rounds": 7, "order": "random-blocks",
                                 "lock_clocks": [1755, 2619]}
    adaptive = TimingPlan.from_spec(_spec(batch_rounds=4, max_batch_rounds=16))
    assert adaptive.adaptive and adaptive.looks() == (4, 7, 12, 16)
    assert sum(1 - adaptive.look_confidence(k) for k in range(4)) == pytest.approx(0.10)  # the error budget, spent


def test_batch_rounds_7_gives_7_interleaved_rounds_through_the_cuda_backend(clocks):
    spec = _spec(batch_rounds=7, lock_clocks="1755,2619")
    base = dict(spec.baseline)
    configs = [base, {**base, "BLOCK_N": 128}, {**base, "BLOCK_K": 64}]
    rows, pool, device = _time(spec, configs, lambda c: 1.0)
    (job,) = pool.jobs  # fixed plan: one look, one job
    assert job["rounds"] == 7 and job["order"] == "interleaved" and job["lock_clocks"] == [1755, 2619]
    assert clocks == [(1755, 2619)]
    assert set(job["configs"]) == {"v1", "v2"}  # the baseline config is timed once, as the baseline
    per_shape = len(spec.shape_matrix)
    keys = [k for _, k, _, _ in device.slots]
    assert len(keys) == per_shape * 7 * 5  # B v1 B v2 B, 7 times, per shape
    assert keys[:5] == [BASELINE, "v1", BASELINE, "v2", BASELINE]
    assert {r for _, _, r, _ in device.slots} == set(range(7))
    assert all(r.timing_rounds == 7 and r.timing_looks == 1 and r.evidence == "cuda" for r in rows)
    assert all(r.batch_baseline and r.batch_baseline[0].batch == job["batch_id"] for r in rows)


class FakeChild:
    """A judged patch's sandboxed child (or the baseline's), answering the gate's ``identity`` and ``bench``
    jobs (``kernels/gate_child.py``) with the fake device timer in place of ``do_bench`` on the case's inputs."""

    IDENTITY = {"host": "h", "gpu_uuid": "GPU-fake", "gpu_name": "Fake GPU"}

    def __init__(self, device: FakeDevice, key: str, ms: float, noisy: bool = False):
        self.device, self.key, self.ms = device, key, ms
        if noisy:
            device.noisy = set(device.noisy) | {key}
        self.benches: list[dict] = []

    def call(self, job, blobs=None, timeout=None):
        if job["job"] == "identity":
            return {"identity": dict(self.IDENTITY)}, []
        assert job["job"] == "bench", job
        self.benches.append(job)
        self.device.slots.append((-1, self.key, -1, -1))
        self.device.true_ms[self.key] = self.ms
        return {"samples": self.device.sample(self.key), "identity": dict(self.IDENTITY)}, []


@pytest.fixture(autouse=True)
def clocks(monkeypatch):
    """The GPU's clock control, faked with the device: every ``set_gpu_clock`` a timing batch asks for."""
    import contextlib

    import triton.testing

    calls: list[tuple[int, int]] = []

    @contextlib.contextmanager
    def set_gpu_clock(sm, mem):
        calls.append((sm, mem))
        yield

    monkeypatch.setattr(triton.testing, "set_gpu_clock", set_gpu_clock)
    return calls


def _mixed(spec, patch_ms=1.0, noisy_patch=False, speedups=(None, None)):
    """A config variant and a patch variant of ``spec`` (the patch's config is the baseline's: only the
    patch differs) through ``CudaBackend._time``: the config by a measure_batch job in the (in-process) cuda
    worker, the patch by the gate's ``PatchTimer`` in its (fake-device) sandboxed child beside the baseline's."""
    _needs_dagster()
    from kernels.candidate import PatchTimer
    from kregress.core.family import get_family
    from kregress.core.gate import GateReport
    from resources.gpu import CudaBackend, EvaluationStats

    fam = get_family("gemm")
    device = FakeDevice({})
    backend = CudaBackend()
    pool = WorkerInProcess(device, lambda c: 1.0)
    backend._pools["cuda"] = pool
    config = {**spec.baseline, "BLOCK_N": 128}
    rows = _rows(spec, [config, dict(spec.baseline)])
    rows[1].patch = "--- a/kernels/gemm.py\n+++ b/kernels/gemm.py\n"
    rows[0].expected_speedup, rows[1].expected_speedup = speedups
    cases = [{"id": f"t{k}", "kind": "timed", "shape": shape, "label": fam.shape_label(shape)}
             for k, shape in enumerate(spec.shape_matrix)]
    ref, cand = FakeChild(device, BASELINE, 1.0), FakeChild(device, "cand", patch_ms, noisy=noisy_patch)
    timer = PatchTimer(cand, ref, rows[1], GateReport(), spec, fam, cases, 10.0)
    backend._time(spec, fam, rows, {}, [0, 1], 10.0, EvaluationStats(), lambda m: None, patch_timers={1: timer})
    config_slots = [k for j, k, _, _ in device.slots if j >= 0]
    patch_slots = [k for j, k, _, _ in device.slots if j < 0]
    return rows, pool, cand, ref, config_slots, patch_slots


def test_a_config_and_a_patch_of_one_spec_get_the_same_plan(clocks):
    """batch_rounds: 7 -> 7 rounds for both kinds: the same interleaving (B x B, 7 times, per shape), the same
    slot time, the same clock lock, the baseline re-timed in each one's own batch."""
    spec = _spec(batch_rounds=7, lock_clocks="1755,2619", rep_ms=140, warmup_ms=28)
    plan = TimingPlan.from_spec(spec)
    rows, pool, cand, ref, config_slots, patch_slots = _mixed(spec)
    (job,) = pool.jobs
    per_shape = [BASELINE, "x", BASELINE] * 7
    assert [k if k == BASELINE else "x" for k in config_slots] == per_shape * len(spec.shape_matrix)
    assert [k if k == BASELINE else "x" for k in patch_slots] == per_shape * len(spec.shape_matrix)
    assert job["rounds"] == 7 and job["order"] == plan.order == "interleaved"
    # each slot's do_bench time: the worker spreads the job's rep_ms over its rounds; the child gets it per slot
    assert job["rep_ms"] // job["rounds"] == plan.slot_ms == 20 and job["warmup_ms"] // job["rounds"] == plan.slot_warmup_ms
    assert {(b["rep_ms"], b["warmup_ms"]) for b in cand.benches + ref.benches} == {(plan.slot_ms, plan.slot_warmup_ms)}
    assert clocks == [(1755, 2619), (1755, 2619)]  # the config's batch, then the patch's: locked alike
    for row in rows:
        assert row.timing_rounds == 7 and row.timing_looks == 1 and row.evidence == "cuda"
        assert {m.batch for m in row.measurements} == {m.batch for m in row.batch_baseline}
        assert all(len(m.samples_ms) == 6 * 7 for m in row.measurements)
        assert all(len(m.samples_ms) == 6 * 2 * 7 for m in row.batch_baseline)  # B x B: two baseline slots a round
        assert {m.clocks_locked for m in row.measurements} == {"sm 1755 MHz, mem 2619 MHz (triton.testing.set_gpu_clock)"}
    assert rows[0].measurements[0].batch != rows[1].measurements[0].batch  # each its own batch
    assert rows[1].measurements[0].gpu_uuid == "GPU-fake" and rows[1].measurements[0].device == "Fake GPU"


def test_batch_order_and_the_cap_and_forecast_apply_to_patches_too(clocks):
    spec = _spec(batch_rounds=3, batch_order="random-blocks", max_gpu_seconds_per_round=1e-9)
    # the patch forecast better: timed first; the cap is then spent, the config is not timed and says why
    rows, pool, cand, ref, config_slots, patch_slots = _mixed(spec, speedups=(1.1, 1.4))
    assert not pool.jobs and not config_slots
    assert rows[1].timing_rounds == 3 and len(patch_slots) == 3 * 3 * len(spec.shape_matrix)
    assert not rows[0].measurements and "max_gpu_seconds_per_round" in rows[0].error_detail
    # the config forecast better: the patch waits, and is the one left untimed
    rows, pool, cand, ref, config_slots, patch_slots = _mixed(spec, speedups=(1.4, 1.1))
    assert [j["order"] for j in pool.jobs] == ["random-blocks"] and not patch_slots
    assert not rows[1].measurements and "max_gpu_seconds_per_round" in rows[1].error_detail


def test_a_patch_gets_adaptive_looks_like_a_config():
    """batch_rounds 4, max_batch_rounds 16: the noisy patch's verdict stays open, so it gets more looks (the
    baseline re-timed beside it each time), judged by the same rule as a config's."""
    spec = _spec(batch_rounds=4, max_batch_rounds=16)
    plan = TimingPlan.from_spec(spec)
    rows, pool, cand, ref, config_slots, patch_slots = _mixed(spec, noisy_patch=True)
    assert rows[0].timing_rounds == 4 and rows[0].timing_looks == 1
    assert rows[1].timing_looks > 1 and rows[1].timing_rounds == plan.looks()[rows[1].timing_looks - 1]
    assert patch_slots.count("cand") == rows[1].timing_rounds * len(spec.shape_matrix)
    assert sum(len(m.samples_ms) for m in rows[1].batch_baseline) == 6 * 2 * rows[1].timing_rounds * len(spec.shape_matrix)


def test_adaptive_sampling_adds_rounds_only_where_the_verdict_is_open():
    """v1 is clean (settled at the first look), v2 is the same kernel on a 15%-noise device (its interval reaches past the guard: open): only v2 gets more rounds,
    with the baseline re-timed beside it; the sweep's verdict uses the look's confidence and says the draws."""
    from kernel_assets.sweep import verdict_for

    spec = _spec(batch_rounds=4, max_batch_rounds=16)
    base = dict(spec.baseline)
    v1, v2 = {**base, "BLOCK_N": 128}, {**base, "BLOCK_K": 64}
    ms = {str(sorted(base.items())): 1.0, str(sorted(v1.items())): 1.0, str(sorted(v2.items())): 1.0}
    rows, pool, device = _time(spec, [base, v1, v2], lambda c: ms[str(sorted(c.items()))], noisy={"v2"})
    rounds = [j["rounds"] for j in pool.jobs]
    assert rounds[0] == 4 and len(pool.jobs) > 1 and sum(rounds) == rows[2].timing_rounds
    assert all(set(j["configs"]) == {"v2"} for j in pool.jobs[1:])  # only the open one
    assert rows[1].timing_rounds == 4 and rows[1].timing_looks == 1
    assert rows[2].timing_looks == len(pool.jobs) and rows[2].timing_rounds in TimingPlan.from_spec(spec).looks()
    # each look re-timed the baseline beside v2, and v2 compares with exactly those baseline samples
    v2_base = sum(len(m.samples_ms) for m in rows[2].batch_baseline)
    assert v2_base == sum(6 * (len(j["configs"]) + 1) * j["rounds"] for j in pool.jobs)  # 6 samples a baseline slot
    assert sum(len(m.samples_ms) for m in rows[1].batch_baseline) == 6 * 3 * 4  # v1: the first look's baseline only
    baseline_row = rows[0]
    verdict = verdict_for(rows[1], baseline_row, spec)
    assert verdict.draws == 4 and verdict.looks == 1 and verdict.verdict == "PASS"
    late = verdict_for(rows[2], baseline_row, spec)
    assert late.draws == rows[2].timing_rounds and late.looks == rows[2].timing_looks
    conf = TimingPlan.from_spec(spec).look_confidence(late.looks - 1)
    assert f"at {conf * 100:g}%" in late.reasons[0]


def test_the_gpu_seconds_cap_stops_the_round_in_forecast_order():
    spec = _spec(max_gpu_seconds_per_round=0.015)  # each job answers wall_s 0.01: the cap is spent after two
    base = dict(spec.baseline)
    configs = [{**base, "BLOCK_N": 128}, {**base, "BLOCK_K": 64}, {**base, "num_warps": 8}]
    _needs_dagster()
    from kregress.core.family import get_family
    from resources.gpu import CudaBackend, EvaluationStats

    backend = CudaBackend()
    pool = WorkerInProcess(FakeDevice({}), lambda c: 1.0)
    backend._pools["cuda"] = pool
    rows = _rows(spec, configs)
    rows[2].expected_speedup, rows[0].expected_speedup = 1.5, 1.2  # forecast order: v2, v0, v1
    backend._time(spec, get_family("gemm"), rows, {}, [0, 1, 2], 10.0, EvaluationStats(), lambda m: None)
    assert [list(j["configs"].values())[0] for j in pool.jobs] == [configs[2], configs[0]]
    assert not rows[1].measurements and "max_gpu_seconds_per_round" in rows[1].error_detail


def test_sequential_verdict_stops_early_on_clean_samples_and_spends_the_budget():
    rng = np.random.default_rng(3)
    design = stats.SequentialDesign(start=6, cap=32)
    clean = stats.sequential_verdict(rng.lognormal(0, 0.002, 32), rng.lognormal(0, 0.002, 32), design)
    assert clean.verdict == "PASS" and clean.draws == 6 and clean.looks == 1
    slow = stats.sequential_verdict(1.10 * rng.lognormal(0, 0.002, 32), rng.lognormal(0, 0.002, 32), design)
    assert slow.verdict == "REGRESS" and slow.draws == 6
    # exactly at the guard on noisy samples (the variant is the baseline's runs x 1.03, in another order): no look
    # decides, sampling runs to the cap
    noisy = rng.lognormal(0, 0.05, 32)
    edge = stats.sequential_verdict(1.03 * rng.permutation(noisy), noisy, design)
    assert edge.verdict == "NEEDS_REVIEW" and edge.draws == 32 and edge.looks == len(design.looks())
    assert sum(design.alphas()) == pytest.approx(0.10) and design.look_confidence(len(design.looks()) - 1) == pytest.approx(0.95)
    # fewer draws than the cap: the design is capped there, its last look at the draws there are
    short = stats.sequential_verdict(rng.lognormal(0, 0.05, 10), rng.lognormal(0, 0.05, 10), design)
    assert short.draws <= 10 and design.capped(10).looks()[-1] == 10
    assert stats.SequentialDesign(start=8, cap=8).looks() == (8,) and stats.SequentialDesign(start=8, cap=8).look_confidence(0) == pytest.approx(0.90)


@pytest.mark.parametrize("kwargs, match", [({"start": 1}, "start"), ({"start": 9, "cap": 8}, "exceed"),
                                           ({"growth": 1.0}, "growth"), ({"spending": "x"}, "spending")])
def test_sequential_design_rejects_bad_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        stats.SequentialDesign(**kwargs)


def test_bench_adaptive_equals_sequential_verdict():
    """bench/stats.py --adaptive moves one A/A interval per look by the slowdown; that is what
    sequential_verdict returns on the slowed samples (same looks, same stop)."""
    from dataclasses import replace

    rng = np.random.default_rng(5)
    design = stats.SequentialDesign()
    for trial in range(6):
        base, var = rng.lognormal(0, 0.02, 32), rng.lognormal(0, 0.02, 32)
        for f in (1.0, 1.06):
            want = stats.sequential_verdict(var * f, base, design, seed=trial)
            for k, n in enumerate(design.looks()):
                ci = stats.ratio_ci([var[:n]], [base[:n]], confidence=design.look_confidence(k), seed=trial)
                moved = replace(ci, ratio=ci.ratio * f, low=ci.low * f, high=ci.high * f)
                got = stats.classify(moved, min_samples=design.start)[0]
                if got != "NEEDS_REVIEW" or k == len(design.looks()) - 1:
                    break
            assert (got, n) == (want.verdict, want.draws)

