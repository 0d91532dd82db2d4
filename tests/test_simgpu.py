"""The simulated GPU (resources/simgpu.py): it holds its device for the batch's simulated time without using CPU,
one holder at a time, records a device identity that is also its pool key, and leaves the rest of the step real."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from kernel_assets.sweep import verdict_for
from kregress.core.bind import load_bound
from kregress.core.records import Suggestion
from resources.gpu import ReplayBackend
from resources.simgpu import (
    ENV_SIM_SCALE,
    SIM_GPU_NAME,
    SimInterpreterBackend,
    SimReplayBackend,
    SimulatedDevice,
    all_holds,
    batch_device_ms,
    is_simulated,
    sim_scale,
)

REPO = Path(__file__).resolve().parent.parent
REPLAY_SPEC = REPO / "specs" / "replay_clblast_rtx3090.yaml"


def test_a_hold_sleeps_for_its_time_without_cpu_and_is_recorded(tmp_path):
    dev = SimulatedDevice("node-1", "sim-gpu-3", tmp_path)
    assert dev.pool == "gpu/node-1/sim-gpu-3"
    wall0, cpu0 = time.perf_counter(), time.process_time()
    hold = dev.hold(0.4, label="b1")
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    assert 0.4 <= wall < 1.5 and abs(hold.seconds - 0.4) < 0.2
    assert cpu < 0.1, f"a simulated hold burned {cpu:.3f} s of CPU"
    assert not hold.contended and hold.waited_s < 0.1
    (logged,) = dev.holds()
    assert (logged.label, logged.device) == ("b1", "sim-gpu-3")
    assert all_holds(tmp_path) == {"gpu/node-1/sim-gpu-3": [logged]}


def test_one_holder_at_a_time_on_a_device_and_devices_are_independent(tmp_path):
    a, a2 = SimulatedDevice("h", "sim-gpu-0", tmp_path), SimulatedDevice("h", "sim-gpu-0", tmp_path)
    b = SimulatedDevice("h", "sim-gpu-1", tmp_path)
    t0 = time.perf_counter()
    threads = [threading.Thread(target=d.hold, args=(0.3, f"t{i}")) for i, d in enumerate((a, a2, b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    holds = all_holds(tmp_path)
    h0 = sorted(holds["gpu/h/sim-gpu-0"], key=lambda h: h.start)
    assert len(h0) == 2 and h0[0].end <= h0[1].start + 1e-3  # the second waited for the first
    assert [h.contended for h in h0] == [False, True] and h0[1].waited_s >= 0.2
    assert len(holds["gpu/h/sim-gpu-1"]) == 1  # another device: in parallel
    assert 0.6 <= wall < 1.5


def _sugg(vid: str, config: dict, rnd: int = 1) -> Suggestion:
    return Suggestion(variant_id=vid, config=config, patch_summary="t", round=rnd)


def test_a_replay_batch_holds_recorded_time_x_runs_x_scale_with_the_device_identity(tmp_path):
    bound = load_bound(REPLAY_SPEC)
    spec = bound.spec
    other = {**spec.baseline, "MWG": 128}
    assert bound.family.space.check(other, spec.params, spec.hardware.limits) is None
    sugg = [_sugg("base", spec.baseline), _sugg("v1", other)]
    plain, _ = ReplayBackend().evaluate(bound, sugg, log=lambda m: None)
    sim = SimReplayBackend(sim_device="sim-gpu-5", sim_host="node-2", sim_scale=0.05, sim_log_dir=str(tmp_path))
    seen: list[str] = []
    cpu0 = time.process_time()
    rows, stats = sim.evaluate(bound, sugg, log=seen.append)
    # the device time: every recorded run of both variants (the baseline is one of them: timed once)
    recorded_s = sum(sum(m.samples_ms) for r in plain for m in r.measurements) / 1e3
    assert batch_device_ms(plain, spec.baseline) / 1e3 == pytest.approx(recorded_s)
    (hold,) = all_holds(tmp_path)["gpu/node-2/sim-gpu-5"]
    assert hold.seconds == pytest.approx(recorded_s * 0.05, abs=0.05)
    assert stats.measure_seconds == [pytest.approx(hold.seconds)]
    assert time.process_time() - cpu0 < hold.seconds  # it slept: far less CPU than device time
    assert any("held simulated device gpu/node-2/sim-gpu-5" in line for line in seen)
    for r, p in zip(rows, plain):
        assert r.evidence == "replay" and r.error is None
        assert [m.samples_ms for m in r.measurements] == [m.samples_ms for m in p.measurements]  # the recorded runs
        for m in r.measurements + r.batch_baseline:
            assert (m.gpu_name, m.gpu_uuid, m.host) == (SIM_GPU_NAME, "sim-gpu-5", "node-2")
            assert m.device_key() == ("node-2", "sim-gpu-5")  # verdicts and history keep devices apart by it
    # the verdict is the ordinary one, on the recorded evidence
    v = verdict_for(rows[1], rows[0], spec)
    assert v.verdict in ("PASS", "REGRESS") and v.evidence == "replay" and v.cause != "incomparable", v


def test_the_model_evidence_is_modelled_time_x_runs():
    from kregress.core.records import Measurement, VariantResult

    def row(cfg, p50, batch):
        m = Measurement(shape="s", samples_ms=[p50], p50_ms=p50, tflops=0, gbps=0, evidence="model", device="d",
                        torch_version="", triton_version="", batch=batch)
        return VariantResult(variant_id="v", round=1, source="local", config=cfg, config_hash="h", measurements=[m],
                             batch_baseline=[m.model_copy(update={"p50_ms": 1.0, "samples_ms": [1.0]})])

    rows = [row({"a": 1}, 2.0, "b"), row({"a": 2}, 3.0, "b")]
    assert batch_device_ms(rows, baseline={"a": 0}, runs=10) == pytest.approx((2.0 + 3.0 + 1.0) * 10)
    assert batch_device_ms(rows, baseline={"a": 1}, runs=10) == pytest.approx((2.0 + 3.0) * 10)


def test_sim_gpu_device_selects_the_simulated_backends_keyed_by_the_pool(monkeypatch, tmp_path):
    from kernel_assets.definitions import build_resources
    from kernel_assets.executors import placement

    for k in [k for k in os.environ if k.startswith("KREGRESS_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("KREGRESS_DEVICE", "sim-gpu-7")
    monkeypatch.setenv("KREGRESS_HOST", "node-9")
    monkeypatch.setenv(ENV_SIM_SCALE, "40")
    res = build_resources()
    assert isinstance(res["replay"], SimReplayBackend) and isinstance(res["bench"], SimInterpreterBackend)
    assert res["replay"].kind == "replay" and res["bench"].kind == "interpreter"
    assert res["bench"].sim_scale == 40.0
    assert res["replay"].device().pool == placement().pool == "gpu/node-9/sim-gpu-7"
    monkeypatch.setenv("KREGRESS_DEVICE", "gpu-a")
    assert type(build_resources()["replay"]) is ReplayBackend  # a named real device is not simulated
    assert is_simulated("sim-gpu-0") and not is_simulated("sim-gpu-") and not is_simulated("gpu-0")
    with pytest.raises(ValueError, match="KREGRESS_SIM_SCALE='-2' must be a positive number"):
        sim_scale("-2")
    assert sim_scale("") == 1.0
