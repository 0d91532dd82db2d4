"""Forecasts: scored against measurements by hand-checked numbers (kregress.core.forecast), never on model evidence,
and the order they give the GPU (resources.gpu: best forecast first, a round's GPU-seconds cap)."""

from __future__ import annotations

import math

import pytest

from kregress.core import forecast
from kregress.core.records import Measurement, Suggestion, VariantResult


def meas(p50: float, evidence: str = "replay", shape: str = "s") -> Measurement:
    return Measurement(shape=shape, samples_ms=[p50] * 10, p20_ms=p50, p50_ms=p50, p80_ms=p50, tflops=1.0, gbps=1.0,
                       evidence=evidence, device="d", torch_version="t", triton_version="t")


def vr(vid: str, rnd: int, p50: float | None, fc: tuple | None, evidence: str = "replay", source: str = "llm",
       error: str | None = None) -> VariantResult:
    return VariantResult(
        variant_id=vid, round=rnd, source=source, config={"a": rnd}, config_hash=vid, error=error,
        measurements=[meas(p50, evidence)] if p50 is not None else [], evidence=evidence if p50 is not None else None,
        expected_speedup=fc[0] if fc else None, expected_speedup_low=fc[1] if fc else None,
        expected_speedup_high=fc[2] if fc else None)


BASE = vr("baseline", 0, 1.0, None, source="baseline")
HISTORY = [
    BASE,
    vr("A", 1, 0.8, (1.25, 1.1, 1.4)),  # measured 1.25: exact, inside
    vr("B", 1, 1.25, (0.9, 0.8, 1.0)),  # measured 0.8: inside (the interval is closed)
    vr("C", 1, 0.5, (1.1, 1.0, 1.2)),  # measured 2.0: outside
    vr("D", 2, 1.0, (1.05, 1.0, 1.1)),  # round 2 has two scored rows: too few to rank
    vr("E", 2, 2.0, (0.7, 0.6, 0.8)),
    vr("F", 2, None, (1.3, 1.1, 1.5), error="compile_failed"),  # not timed: not scored
    vr("L1", 1, 0.9, (1.2, 1.0, 1.3), source="local"),
    vr("M1", 1, 0.7, (1.4, 1.2, 1.6), evidence="model"),  # an analytic estimate: cannot be scored
]


def test_measured_speedup_is_baseline_over_variant_with_the_batch_baseline_first():
    assert forecast.measured_speedup(HISTORY[1], BASE) == pytest.approx(1.25)
    batched = HISTORY[1].model_copy(update={"batch_baseline": [meas(1.2)]})
    assert forecast.measured_speedup(batched, BASE) == pytest.approx(1.5)  # the variant's own batch, as the verdict
    two = vr("two", 1, None, None).model_copy(update={"measurements": [meas(0.5, shape="x"), meas(2.0, shape="y")]})
    base2 = BASE.model_copy(update={"measurements": [meas(1.0, shape="x"), meas(1.0, shape="y")]})
    assert forecast.measured_speedup(two, base2) == pytest.approx(1.0)  # geomean of 2.0 and 0.5
    assert forecast.measured_speedup(HISTORY[6], BASE) is None


def test_calibration_by_hand():
    rows = forecast.score(HISTORY, {1: "model-x", 2: "model-y"})
    by_id = {r.variant_id: r for r in rows}
    assert by_id["A"].model == "model-x" and by_id["D"].model == "model-y" and by_id["L1"].model == "-"
    assert by_id["M1"].measured is not None and not by_id["M1"].scorable  # model evidence
    assert by_id["F"].measured is None and not by_id["F"].scorable
    cals = {(c.policy, c.model): c for c in forecast.calibration(rows)}
    x = cals[("llm", "model-x")]
    # |log(1.25/1.25)| = 0, |log(0.9/0.8)| = 0.1178, |log(1.1/2.0)| = 0.5978: the median is 0.1178
    assert (x.forecasts, x.scored, x.not_scorable) == (4, 3, 1)
    assert x.median_abs_log_error == pytest.approx(math.log(0.9 / 0.8))
    assert x.coverage == pytest.approx(2 / 3) and x.with_interval == 3
    # ranks: forecast (3, 1, 2), measured (2, 1, 3): rho = 1 - 6 * 2 / (3 * 8) = 0.5
    assert x.spearman == pytest.approx(0.5) and x.rounds_ranked == 1
    y = cals[("llm", "model-y")]
    assert (y.scored, y.spearman, y.rounds_ranked) == (2, None, 0)  # two variants do not make a ranking
    assert y.coverage == pytest.approx(0.5)  # D inside [1.0, 1.1], E (0.5) outside
    assert cals[("local", "-")].scored == 1


def test_the_report_section_shows_forecast_beside_measurement_and_says_what_cannot_be_scored():
    text = forecast.section(HISTORY, {1: "model-x", 2: "model-y"})
    assert "| A | 1 | llm | model-x | 1.250 | 20.0% faster | [1.10, 1.40] | 1.250 | 20.0% faster | yes | replay |" in text
    assert "| C | 1 | llm | model-x | 1.100 | 9.1% faster | [1.00, 1.20] | 2.000 | 2.00x faster | no | replay |" in text
    assert "| M1 | 1 | llm | model-x | 1.400 | 28.6% faster | [1.20, 1.60] | not scorable | - | - | model |" in text
    assert "| F | 2 | llm | model-y | 1.300 | 23.1% faster | [1.10, 1.50] | not timed | - | - | - |" in text
    assert "| llm | model-x | 4 | 3 | 0.118 | 0.67 (3) | 0.50 | 1 |" in text
    assert "1 forecast(s) rest on model evidence" in text and "cannot be scored" in text
    model_only = [BASE.model_copy(update={"measurements": [meas(1.0, "model")], "evidence": "model"}),
                  vr("M", 1, 0.5, (2.0, 1.5, 2.5), evidence="model")]
    only = forecast.section(model_only)
    assert "| llm | - | 1 | 0 | - | - | - | 0 |" in only and "rest on model evidence" in only
    assert forecast.section([BASE]) == "_no variants were proposed_"
    assert "none of the 1 proposed variants carried a forecast" in forecast.section([BASE, vr("n", 1, 0.9, None)])


# --- the order forecasts give the GPU (the GPU itself cannot exist here: its worker is replaced) ---------


def test_cuda_rounds_are_timed_best_forecast_first_and_stop_at_the_gpu_seconds_cap():
    from kregress.core.family import get_family
    from kregress.core.spec import load_spec
    from resources.gpu import CudaBackend, EvaluationStats, base_row, forecast_order

    spec = load_spec("specs/gemm_smoke.yaml")
    spec = spec.model_copy(update={"benchmark": spec.benchmark.model_copy(update={"max_gpu_seconds_per_round": 5.0})})
    fam = get_family(spec.kernel_family)
    cfgs = [c for c in fam.space.enumerate(spec.params, spec.hardware.limits) if c != spec.baseline][:4]
    sugg = [Suggestion(variant_id=f"v{i}", config=c, patch_summary="t", round=1, source="llm", expected_speedup=fc)
            for i, (c, fc) in enumerate(zip(cfgs, (1.1, None, 1.4, 1.2)))]
    rows = [base_row(s, "cuda") for s in sugg]
    assert forecast_order(rows, [0, 1, 2, 3]) == [2, 3, 0, 1]  # 1.4, 1.2, 1.1, then no forecast

    jobs: list[dict] = []

    class TimedOnThisHost(CudaBackend):
        """The GPU worker replaced: each batch 'takes' 3 s and answers with a measurement per shape."""

        def _run_cuda(self, batch, timeout):
            jobs.extend(batch)
            m = meas(1.0, "cuda").model_dump()
            return [{"wall_s": 3.0, "batch": {"baseline": [m], **{k: [m] for k in job["configs"]}}} for job in batch]

    said: list[str] = []
    stats = EvaluationStats()
    TimedOnThisHost()._time(spec, fam, rows, {}, [0, 1, 2, 3], 60.0, stats, said.append)
    assert [list(j["configs"].values()) for j in jobs] == [[cfgs[2]], [cfgs[3]]]  # best forecast first, one batch each
    assert [r.evidence for r in rows] == [None, None, "cuda", "cuda"] and stats.measure_seconds == [3.0, 3.0]
    assert rows[0].error is None and rows[0].error_detail.startswith("not timed: the round's GPU time cap")
    assert any(s.startswith("round stopped early: 6.0 s of GPU timing reached benchmark.max_gpu_seconds_per_round=5")
               and "v0, v1" in s for s in said)

    jobs.clear()
    uncapped = spec.model_copy(update={"benchmark": spec.benchmark.model_copy(update={"max_gpu_seconds_per_round": None})})
    rows = [base_row(s, "cuda") for s in sugg]
    TimedOnThisHost()._time(uncapped, fam, rows, {}, [0, 1, 2, 3], 60.0, EvaluationStats(), said.append)
    (job,) = jobs  # no cap: one batch, in forecast order
    assert list(job["configs"].values()) == [cfgs[2], cfgs[3], cfgs[0], cfgs[1]]
    assert all(r.evidence == "cuda" for r in rows)
