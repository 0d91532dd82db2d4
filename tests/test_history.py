"""History: append-only Parquet; today's baseline vs the last accepted one; acknowledged steps."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kernel_assets import history
from kregress.core.records import Measurement, VariantResult, config_hash
from kregress.core.spec import load_spec

# A shipped spec that needs no recorded data folder (tests pass without ../shared).
SPEC = load_spec(Path(__file__).resolve().parent.parent / "specs" / "gemm_smoke.yaml")
RNG = np.random.default_rng(0)
BASE = RNG.normal(14.5, 0.05, 32).tolist()


def baseline(samples, device="NVIDIA GeForce RTX 3090", evidence="replay") -> VariantResult:
    s = sorted(samples)
    m = Measurement(shape="4096x4096x4096", samples_ms=samples, p20_ms=s[6], p50_ms=s[16], p80_ms=s[25], tflops=1, gbps=1,
                    evidence=evidence, device=device, torch_version="n/a", triton_version="n/a")
    return VariantResult(variant_id="baseline", round=0, source="baseline", config=SPEC.baseline,
                         config_hash=config_hash(SPEC.baseline), measurements=[m], evidence=evidence)


def sweep(home, run_id, samples, **kw):
    row = baseline(samples, **kw)
    cmp = history.compare_baseline(SPEC, row, home)
    history.append_sweep(SPEC, run_id, [row], {}, cmp.verdict, home)
    return cmp


def test_first_then_same_then_slower(tmp_path):
    assert sweep(tmp_path, "run-1", BASE).verdict == "NO_HISTORY"
    same = sweep(tmp_path, "run-2", [x * 1.001 for x in BASE])
    assert same.verdict == "PASS" and same.reference_run == "run-1"
    slow = sweep(tmp_path, "run-3", [x * 1.08 for x in BASE])
    assert slow.verdict == "REGRESS" and "above the guard" in slow.reason
    # the regressed sweep is not accepted: the next comparison still uses run-2
    again = sweep(tmp_path, "run-4", [x * 1.08 for x in BASE])
    assert again.verdict == "REGRESS" and again.reference_run == "run-2"
    df = history.load(SPEC.task_id, tmp_path)
    assert list(df[df["is_baseline"]]["run_id"]) == ["run-1", "run-2", "run-3", "run-4"]  # append-only
    assert set(df["device"]) == {"NVIDIA GeForce RTX 3090"} and list(df["verdict"]) == ["NO_HISTORY", "PASS", "REGRESS", "REGRESS"]


def test_acknowledged_step_is_the_new_reference(tmp_path):
    sweep(tmp_path, "run-1", BASE)
    sweep(tmp_path, "run-2", [x * 1.08 for x in BASE])
    with pytest.raises(ValueError, match="who"):
        history.acknowledge(SPEC.task_id, "", "", home=tmp_path)
    ack = history.acknowledge(SPEC.task_id, "alice", "new driver: +8% expected", home=tmp_path)
    assert ack["run_id"] == "run-2"
    after = sweep(tmp_path, "run-3", [x * 1.081 for x in BASE])
    assert after.verdict == "PASS" and after.reference_run == "run-2"  # old distribution no longer mixed in
    assert history.acks(SPEC.task_id, tmp_path)[0]["by"] == "alice"


def test_other_device_or_model_evidence(tmp_path):
    sweep(tmp_path, "run-1", BASE)
    other = sweep(tmp_path, "run-2", BASE, device="NVIDIA H100 80GB HBM3")
    assert other.verdict == "NO_HISTORY" and "H100" in other.reason
    est = history.compare_baseline(SPEC, baseline(BASE, evidence="model"), tmp_path)
    assert est.verdict in ("NO_HISTORY", "NEEDS_REVIEW")


def _row(samples, shape, p50):
    s = sorted(samples)
    return Measurement(shape=shape, samples_ms=samples, p20_ms=s[6], p50_ms=p50, p80_ms=s[25], tflops=1, gbps=1,
                       evidence="replay", device="NVIDIA GeForce RTX 3090", torch_version="n/a", triton_version="n/a")


def test_show_labels_every_p50_with_its_shape(tmp_path):
    one = VariantResult(variant_id="baseline", round=0, source="baseline", config=SPEC.baseline,
                        config_hash=config_hash(SPEC.baseline), evidence="replay",
                        measurements=[_row(BASE, "4096x4096x4096", 14.5), _row(BASE, "64x96x256", 0.0123)])
    history.append_sweep(SPEC, "run-aaaaaaaa", [one], {}, "NO_HISTORY", tmp_path)
    two = one.model_copy(update={"measurements": [_row(BASE, "4096x4096x4096", 14.7)]})
    history.append_sweep(SPEC, "run-bbbbbbbb", [two], {}, "PASS", tmp_path)
    lines = history.show(SPEC.task_id, tmp_path).splitlines()
    header = lines[0]
    assert "p50 ms 4096x4096x4096" in header and "p50 ms 64x96x256" in header, header
    assert len(lines) == 3
    first, second = lines[1], lines[2]
    assert "run-aaaa" in first and "14.5" in first and "0.0123" in first
    assert "run-bbbb" in second and "14.7" in second and second.rstrip().endswith("-")  # shape not timed that sweep
    with pytest.raises(LookupError, match="no history for nothing_here .*tasks with history: gemm_smoke"):
        history.show("nothing_here", tmp_path)


def test_show_never_calls_an_estimate_a_p50(tmp_path):
    est = baseline(BASE, evidence="model")
    history.append_sweep(SPEC, "run-model001", [est], {}, "NO_HISTORY", tmp_path)
    text = history.show(SPEC.task_id, tmp_path)
    assert "est ms 4096x4096x4096" in text.splitlines()[0] and "p50" not in text.splitlines()[0]
    assert "not a measured p50" in text
    history.append_sweep(SPEC, "run-replay01", [baseline(BASE)], {}, "NO_HISTORY", tmp_path)
    mixed = history.show(SPEC.task_id, tmp_path).splitlines()
    assert "ms 4096x4096x4096" in mixed[0] and "p50 ms" not in mixed[0] and "est ms" not in mixed[0]
    assert "(est)" in mixed[1] and "(est)" not in mixed[2]


def test_cli_history_show_unknown_task_exits_1(tmp_path, capsys, monkeypatch):
    from kernel_assets.cli import main

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))  # the CLI sets it for its process; restored after the test
    assert main(["history", "show", "nosuchtask", "--dagster-home", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: no history for nosuchtask") and "kregress sweep" in err
    sweep(tmp_path, "run-1", BASE)
    assert main(["history", "show", SPEC.task_id, "--dagster-home", str(tmp_path)]) == 0
    assert "p50 ms 4096x4096x4096" in capsys.readouterr().out
