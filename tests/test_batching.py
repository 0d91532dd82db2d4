"""Same-batch scheduling and pairing (kregress.core.batching) with a fake timer that drifts.

No GPU here: the timer is a fake whose clock gets slower from one batch to the next (a GPU warming up,
a neighbour starting) and also drifts within a batch. Baseline and variant are THE SAME kernel (A/A),
so any REGRESS is a false verdict. The old scheme (baseline timed once, in its own batch, variants in
later ones) must show one; the new scheme (baseline re-timed in every batch, interleaved) none.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from kregress.core import batching, stats
from kregress.core.bind import load_bound
from kregress.core.records import Measurement, VariantResult
from kregress.core.spec import load_spec


class DriftingTimer:
    """Samples of a kernel whose true time is ``true_ms[key]``, on a device that slows by ``per_batch``
    (relative) each batch and by ``per_slot`` each slot within a batch, with 1% lognormal noise."""

    def __init__(self, true_ms: dict[str, float], per_batch: float = 0.06, per_slot: float = 0.002,
                 samples: int = 8, seed: int = 0):
        self.true_ms, self.per_batch, self.per_slot, self.samples = true_ms, per_batch, per_slot, samples
        self.rng = np.random.default_rng(seed)
        self.batch = 0
        self.calls: list[str] = []

    def for_batch(self, index: int):
        self.batch = index
        return self

    def __call__(self, key: str, slot: batching.Slot) -> list[float]:
        self.calls.append(key)
        drift = (1 + self.per_batch) ** self.batch * (1 + self.per_slot * slot.position)
        t = self.true_ms["baseline" if key == batching.BASELINE else key]
        return list(t * drift * np.exp(self.rng.normal(0.0, 0.01, self.samples)))

    def identity(self) -> dict:
        return {"host": "fake-host", "gpu_uuid": "GPU-fake-0", "gpu_name": "Fake GPU"}


def test_schedule_interleaves_the_baseline_between_every_two_variants():
    slots = batching.schedule(["v1", "v2", "v3"], rounds=2)
    keys = [s.key for s in slots]
    assert keys == ["baseline", "v1", "baseline", "v2", "baseline", "v3", "baseline"] * 2
    assert [s.position for s in slots] == list(range(len(slots)))
    assert {s.round for s in slots} == {0, 1}


def test_random_blocks_shuffle_within_rounds_and_keep_the_baseline_between():
    a = batching.schedule([f"v{i}" for i in range(6)], rounds=3, order="random-blocks", seed=1)
    b = batching.schedule([f"v{i}" for i in range(6)], rounds=3, order="random-blocks", seed=1)
    assert a == b  # seeded
    for r in range(3):
        keys = [s.key for s in a if s.round == r]
        assert keys[0::2] == ["baseline"] * 7  # B v B v ... B in every round
    rounds = [[s.key for s in a if s.round == r and s.key != "baseline"] for r in range(3)]
    assert all(sorted(r) == [f"v{i}" for i in range(6)] for r in rounds)
    assert len({tuple(r) for r in rounds}) > 1  # the order differs between rounds


@pytest.mark.parametrize("kwargs, match", [({"order": "zigzag"}, "unknown batch order"), ({"rounds": 0}, "rounds"),
                                           ({"variants": ["baseline"]}, "may not be named"),
                                           ({"variants": ["a", "a"]}, "distinct")])
def test_schedule_rejects_bad_arguments(kwargs, match):
    args = {"variants": ["v1"], **kwargs}
    with pytest.raises(ValueError, match=match):
        batching.schedule(args.pop("variants"), **args)


def test_drifting_timer_old_scheme_false_regress_new_scheme_none():
    """A/A with drift between batches: old scheme REGRESS (false), same-batch pairing PASS."""
    variants = {"v1": 1.0, "v2": 1.0, "v3": 1.0}
    timer = DriftingTimer({"baseline": 1.0, **variants})
    # old scheme: baseline alone in batch 0, the variants in batches 1, 2, 3 (one per round)
    old_base = batching.run_batch("b0", [], timer.for_batch(0), rounds=4, identity=timer.identity).baseline()
    old, new = {}, {}
    for k, name in enumerate(variants, start=1):
        batch = batching.run_batch(f"b{k}", [name], timer.for_batch(k), rounds=4, identity=timer.identity)
        old[name] = stats.verdict(batch.samples[name], old_base)[0]
        pair = batching.baseline_for(batch.batch_id, batch.device, batch.samples[name], batch.batch_id, batch.device,
                                     batch.baseline())
        assert pair.ok, pair.reason
        new[name] = stats.verdict(pair.variant, pair.baseline)[0]
    assert "REGRESS" in old.values(), old  # the drift reads as a slowdown
    assert "REGRESS" not in new.values() and set(new.values()) == {"PASS"}, new


def test_drifting_timer_real_slowdown_is_still_found_in_the_same_batch():
    timer = DriftingTimer({"baseline": 1.0, "slow": 1.10, "same": 1.0}, per_batch=0.05, seed=3)
    batch = batching.run_batch("b2", ["slow", "same"], timer.for_batch(2), rounds=4, identity=timer.identity)
    assert stats.verdict(batch.samples["slow"], batch.baseline())[0] == "REGRESS"
    assert stats.verdict(batch.samples["same"], batch.baseline())[0] == "PASS"
    assert len(batch.samples["slow"]) == len(batch.samples["same"]) == 32 and len(batch.baseline()) == 3 * 4 * 8
    assert batch.device == batch.device_end == timer.identity()


def test_pairing_refuses_other_gpus_and_other_batches():
    a = {"host": "h1", "gpu_uuid": "GPU-aaa"}
    b = {"host": "h1", "gpu_uuid": "GPU-bbb"}
    p = batching.baseline_for("x", a, [1.0], "x", b, [1.0])
    assert not p.ok and "different GPUs" in p.reason and "GPU-aaa" in p.reason and "GPU-bbb" in p.reason
    p = batching.baseline_for("x", a, [1.0], "y", a, [1.0])
    assert not p.ok and "not the same batch" in p.reason
    assert batching.baseline_for("x", a, [1.0], "x", a, [1.0]).ok


def _meas(samples, batch, uuid="GPU-aaa", host="h1"):
    return Measurement(shape="256x256x256", samples_ms=list(samples), p20_ms=min(samples), p50_ms=float(np.median(samples)),
                       p80_ms=max(samples), tflops=1.0, gbps=1.0, evidence="replay", device="Fake GPU",
                       torch_version="n/a", triton_version="n/a", gpu_uuid=uuid, host=host, batch=batch)


def _row(vid, meas, batch_baseline=()):
    return VariantResult(variant_id=vid, round=1, source="local", config={"BLOCK_M": 64}, config_hash=vid,
                         measurements=meas, evidence="replay", batch_baseline=list(batch_baseline))


def test_verdict_for_uses_the_same_batch_baseline_and_refuses_other_gpus():
    """The sweep's verdict rule on rows: drifted baseline row, same-batch baseline, foreign GPU."""
    from kernel_assets.sweep import verdict_for

    spec = load_spec("specs/gemm_smoke.yaml")
    timer = DriftingTimer({"baseline": 1.0, "v": 1.0}, samples=8)
    b0 = batching.run_batch("b0", [], timer.for_batch(0), identity=timer.identity)
    b3 = batching.run_batch("b3", ["v"], timer.for_batch(3), identity=timer.identity)
    baseline_row = _row("baseline", [_meas(b0.baseline(), "b0")])
    old_style = _row("v-old", [_meas(b3.samples["v"], "")])  # no batch baseline: compared across steps
    baseline_row_nobatch = _row("baseline", [_meas(b0.baseline(), "")])
    assert verdict_for(old_style, baseline_row_nobatch, spec).verdict == "REGRESS"  # the false verdict
    new_style = _row("v-new", [_meas(b3.samples["v"], "b3")], [_meas(b3.baseline(), "b3")])
    v = verdict_for(new_style, baseline_row, spec)
    assert v.verdict == "PASS", v.reasons
    assert "same-batch baseline" in v.reasons[0] and v.shapes[0].batch == "b3"
    foreign = _row("v-gpu", [_meas(b3.samples["v"], "b3", uuid="GPU-other")], [_meas(b3.baseline(), "b3")])
    v = verdict_for(foreign, baseline_row, spec)
    assert v.verdict == "NEEDS_REVIEW" and "different GPUs" in v.reasons[0]


@pytest.mark.gpu
def test_cuda_batch_measurements_interleave_on_the_gpu():
    """Needs a CUDA GPU (skipped here): the real batch path times baseline and variants in one process."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: the cuda batch path cannot run on this host")
    from kernels.measure import batch_measurements
    from kregress.core.family import get_family

    fam = get_family("gemm")
    base = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8, "num_stages": 3, "num_warps": 4}
    var = {**base, "BLOCK_N": 128}
    out = batch_measurements(fam, base, {"v1": var}, [{"M": 1024, "N": 1024, "K": 1024}], "fp16", {}, 5, 40,
                             batch_id="gpu-test", rounds=2)
    (b,), (v,) = out["baseline"], out["v1"]
    assert b.batch == v.batch == "gpu-test" and b.gpu_name and b.host
    assert len(b.samples_ms) >= 10 and len(v.samples_ms) >= 10 and b.p20_ms <= b.p50_ms <= b.p80_ms


def test_nvidia_smi_identity_is_parsed(tmp_path, monkeypatch):
    """nvidia-smi cannot exist on this host: a stand-in script on PATH prints what the real one prints
    for --query-gpu=uuid,driver_version,clocks.sm,clocks.mem --format=csv,noheader,nounits."""
    from kernels import measure

    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho \"$@\" > \"$(dirname \"$0\")/args\"\n"
                    "echo 'GPU-3f2a9c1e-0000-1111-2222-333344445555, 550.54.15, 1980, 2619'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{__import__('os').environ['PATH']}")
    got = measure._nvidia_smi("GPU-3f2a9c1e-0000-1111-2222-333344445555")
    assert got == {"gpu_uuid": "GPU-3f2a9c1e-0000-1111-2222-333344445555", "driver": "550.54.15",
                   "sm_clock_mhz": 1980.0, "mem_clock_mhz": 2619.0}
    assert "--id=GPU-3f2a9c1e-0000-1111-2222-333344445555" in (tmp_path / "args").read_text()
    ident = measure.measurement_identity({**got, "host": "h", "gpu_name": "H200"}, {**got, "sm_clock_mhz": 1755.0},
                                         clocks_locked="")
    m = Measurement(shape="1", samples_ms=[1.0], p50_ms=1.0, tflops=0, gbps=0, evidence="cuda", device="H200",
                    torch_version="x", triton_version="y", **ident)
    assert (m.sm_clock_mhz_start, m.sm_clock_mhz_end, m.mem_clock_mhz_end) == (1980.0, 1755.0, 2619.0)
    assert m.device_key() == ("h", "GPU-3f2a9c1e-0000-1111-2222-333344445555")
    assert m.p20_ms is None and m.p80_ms is None


def test_no_nvidia_smi_means_no_fields(monkeypatch, tmp_path):
    from kernels import measure

    monkeypatch.setenv("PATH", str(tmp_path))
    assert measure._nvidia_smi("0") == {}


def test_replay_backend_emulates_a_same_batch_baseline():
    """The replay backend draws the baseline's runs again from the same recording for each evaluate
    (one batch) and every variant of that batch carries them; two evaluates are two batches."""
    from kregress.core.records import Suggestion
    from resources.gpu import ReplayBackend

    bound = load_bound("specs/replay_clblast_rtx3090.yaml")
    spec, fam = bound.spec, bound.family
    configs = list(itertools.islice(fam.space.enumerate(spec.params, spec.hardware.limits), 3))
    sugg = [Suggestion(variant_id=f"v{i}", config=c, patch_summary="", round=1) for i, c in enumerate(configs)]
    backend = ReplayBackend()
    (rows, _), (again, _) = backend.evaluate(bound, sugg, log=lambda m: None), \
        backend.evaluate(bound, sugg[:1], log=lambda m: None)
    batches = {r.measurements[0].batch for r in rows}
    assert len(batches) == 1 and all(r.batch_baseline and r.batch_baseline[0].batch in batches for r in rows)
    assert again[0].measurements[0].batch not in batches  # a new evaluate is a new batch
    base_row = backend.evaluate(bound, [Suggestion(variant_id="baseline", config=spec.baseline,
                                                       patch_summary="", round=0)], log=lambda m: None)[0][0]
    assert rows[0].batch_baseline[0].samples_ms == base_row.measurements[0].samples_ms  # the same recording


def test_cuda_backend_sends_one_batch_and_hands_each_row_its_batch_baseline():
    """No GPU here: the cuda worker (which runs kernels.measure.batch_measurements) is replaced by a
    stand-in pool that answers the one measure_batch job the backend sends; what is tested is the
    backend's side: one job with the baseline and every variant, rows with the batch's baseline."""
    from kregress.core.family import get_family
    from resources.gpu import CudaBackend, EvaluationStats

    spec = load_spec("specs/gemm_smoke.yaml")
    sent = []

    class StandInPool:
        def run(self, jobs, timeout):
            sent.extend(jobs)
            job = jobs[0]

            def ms(center, batch):
                return [_meas([center] * 12, batch).model_dump()]

            out = {"baseline": ms(1.0, job["batch_id"]), **{k: ms(1.1, job["batch_id"]) for k in job["configs"]}}
            return [{"batch": out, "wall_s": 0.1}]

    spec = spec.model_copy(update={"benchmark": spec.benchmark.model_copy(update={"lock_clocks": "1755,2619"})})
    backend = CudaBackend()
    backend._pools["cuda"] = StandInPool()
    rows = [_row("baseline", [], []), _row("v1", [], []), _row("v2", [], [])]
    rows[0].config = dict(spec.baseline)
    rows[1].config, rows[2].config = {**spec.baseline, "BLOCK_N": 128}, {**spec.baseline, "BLOCK_K": 64}
    backend._time(spec, get_family("gemm"), rows, {}, [0, 1, 2], 10.0, EvaluationStats(), lambda m: None)
    (job,) = sent
    assert job["op"] == "measure_batch" and job["baseline"] == spec.baseline and job["lock_clocks"] == [1755, 2619]
    assert set(job["configs"]) == {"v1", "v2"}  # the baseline row is not timed twice
    assert rows[0].measurements == rows[0].batch_baseline and rows[0].measurements[0].p50_ms == 1.0
    assert all(r.batch_baseline[0].batch == job["batch_id"] == r.measurements[0].batch for r in rows)
    assert rows[1].measurements[0].p50_ms == pytest.approx(1.1) and rows[1].evidence == "cuda"
    assert rows[1].timing_rounds == 4 and rows[1].timing_looks == 1  # the spec's default plan: 4 rounds, fixed
