"""report.py and the verdict rule on hand-built sweep histories (no Dagster, no compile): causes,
per-shape verdicts, the honest best line, model evidence without percentiles, and the plot showing
failed and infeasible variants. The full sweep is in tests/test_sweep.py."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from kernel_assets import report
from kernel_assets.sweep import RoundState, verdict_for
from kernels.measure import measurement_from_samples
from kregress.core.bind import bind
from kregress.core.family import get_family
from kregress.core.records import CompileStats, Correctness, VariantResult
from kregress.core.spec import load_spec

SPEC = load_spec("specs/gemm_smoke.yaml")
FAM = get_family("gemm")
SHAPES = [{"M": 256, "N": 256, "K": 256}, {"M": 256, "N": 512, "K": 256}]


def _compile(spill=0, smem=16384):
    return CompileStats(arch="sm_90a", regs_per_thread=96, spill_bytes=spill, smem_bytes=smem, num_warps=4, num_stages=3,
                        occupancy=0.5, blocks_per_sm=2, occupancy_limiter="registers", sass_instructions=100,
                        sass_mix={}, compile_seconds=0.1)


def _correct():
    return Correctness(ok=True, max_abs_err=0.249054, max_rel_err=0.01, nan_inf=False, mismatches=0, tolerance=0.3,
                       shapes_checked=["256x256x256"], atol=0.3, rtol=0.2, dtype="bf16", ref_rounding_abs=0.249054,
                       ref_rounding_rel=0.0039)


def _row(vid, rnd, ms, evidence, error=None, spill=0, detail=""):
    return VariantResult(variant_id=vid, round=rnd, source="local", config={"BLOCK_M": 64 + rnd, "BLOCK_N": len(vid)},
                         config_hash=vid, measurements=ms, evidence=evidence if ms else None, error=error,
                         error_detail=detail, compile=None if error else _compile(spill=spill),
                         correctness=None if error else _correct())


def _model(latencies):
    return [measurement_from_samples(FAM, s, [lat], "bf16", {}, "model", "model of H100") for s, lat in zip(SHAPES, latencies)]


def _measured(rng, centers, batch="b1", n=32, sigma=0.005):
    out = []
    for s, c in zip(SHAPES, centers):
        m = measurement_from_samples(FAM, s, list(c * np.exp(rng.normal(0, sigma, n))), "bf16", {}, "replay", "Fake GPU",
                                     identity={"host": "h", "gpu_uuid": "GPU-1", "gpu_name": "Fake GPU"}, batch=batch)
        out.append(m)
    return out


def _state(history):
    return RoundState(round=1, history=history, objective={}, best_id=history[0].variant_id, best_value=None,
                      stopped="max_rounds reached (1)", bound=bind(SPEC))


@pytest.fixture()
def model_history():
    return [
        _row("baseline", 0, _model([0.60, 0.90]), "model"),
        _row("r1-a", 1, _model([0.50, 0.80]), "model"),
        _row("r1-b", 1, _model([0.50, 0.80]), "model"),  # ties with r1-a exactly
        _row("r1-oor", 1, [], None, error="out_of_resources", detail="shared memory 262144 B > 232448 B"),
        _row("r1-spill", 1, _model([0.40, 0.70]), "model", spill=512),  # fastest estimate, but spills
        _row("r1-nan", 1, [], None, error="nan_inf", detail="NaN at (0, 0)"),
    ]


def test_model_evidence_has_one_estimate_and_no_percentiles(model_history):
    for r in model_history:
        for m in r.measurements:
            assert m.p20_ms is None and m.p80_ms is None and m.p50_ms > 0
    variants, _, meas = report.tables(model_history, {}, [])
    assert variants["latency_p20_ms"].isna().all() and variants["latency_p80_ms"].isna().all()
    assert meas["p20_ms"].isna().all() and meas["p80_ms"].isna().all()


def test_causes_summary_and_estimated_best_with_ties(model_history, tmp_path):
    verdicts = {r.variant_id: verdict_for(r, model_history[0], SPEC) for r in model_history[1:]}
    assert verdicts["r1-oor"].cause == "infeasible" and verdicts["r1-spill"].cause == "infeasible"
    assert verdicts["r1-nan"].cause == "wrong"
    assert verdicts["r1-a"].verdict == "NEEDS_REVIEW" and verdicts["r1-a"].cause is None
    res = report.write_report(tmp_path, SPEC, "specs/gemm_smoke.yaml", _state(model_history), verdicts, [])
    assert res["causes"] == {"slower": 0, "wrong": 1, "crashed": 0, "infeasible": 2, "rejected": 0}
    assert res["summary_line"] == "PASS 0 / REGRESS 3 (slower 0, wrong 1, infeasible 2) / NEEDS_REVIEW 2"
    assert res["best"]["kind"] == "estimated best" and res["best"]["ties"] == ["r1-a", "r1-b"]
    md = (tmp_path / "report.md").read_text()
    assert "REGRESS 3 (slower 0, wrong 1, infeasible 2)" in md
    assert "Estimated best (model evidence, not a measurement): `r1-a`" in md
    assert "2 variants tie at this estimate: `r1-a`, `r1-b`; tie-break:" in md
    assert "## Per shape" in md and "## Tolerance" in md and "ref rounding abs" in md
    vt = pd.read_parquet(tmp_path / "verdicts.parquet")
    assert list(vt.set_index("variant_id").loc[["r1-oor", "r1-nan"], "cause"]) == ["infeasible", "wrong"]
    by_shape = pd.read_parquet(tmp_path / "verdicts_by_shape.parquet")
    assert set(by_shape["shape"]) == {FAM.shape_label(s) for s in SHAPES}
    assert len(by_shape[by_shape["variant_id"] == "r1-oor"]) == 2  # a failed variant stands for every shape
    assert by_shape.loc[by_shape["variant_id"] == "r1-a", "ratio"].round(4).tolist() == [round(0.5 / 0.6, 4),
                                                                                       round(0.8 / 0.9, 4)]


def test_measured_per_shape_regress_names_the_shape(tmp_path):
    rng = np.random.default_rng(0)
    base = _row("baseline", 0, _measured(rng, [1.0, 2.0]), "replay")
    faster_one_slower_other = _row("r1-mixed", 1, _measured(rng, [0.90, 2.2]), "replay")
    faster_one_slower_other.batch_baseline = base.measurements
    same = _row("r1-same", 1, _measured(rng, [1.0, 2.0]), "replay")
    same.batch_baseline = base.measurements
    slower_within_guard = _row("r1-2pct", 1, _measured(rng, [1.02, 2.04]), "replay")
    slower_within_guard.batch_baseline = base.measurements
    v = verdict_for(faster_one_slower_other, base, SPEC)
    assert v.verdict == "REGRESS" and v.cause == "slower" and v.worst_shape == "256x512x256"
    assert [s.verdict for s in v.shapes] == ["PASS", "REGRESS"]
    assert v.reasons[0].startswith("slower on 256x512x256")
    assert verdict_for(same, base, SPEC).verdict == "PASS"
    rows = (faster_one_slower_other, same, slower_within_guard)
    verdicts = {r.variant_id: verdict_for(r, base, SPEC) for r in rows}
    assert verdicts["r1-2pct"].verdict == "PASS" and verdicts["r1-2pct"].ratio > 1.01  # PASS: not worse than the guard
    res = report.write_report(tmp_path, SPEC, "x.yaml", _state([base, *rows]), verdicts, [])
    assert res["best"]["kind"] == "best" and res["best"]["variant_id"] in ("baseline", "r1-same")
    assert res["causes"]["slower"] == 1 and res["evidence"] == "measured" and res["next_step"] == ""
    # the report says how much slower a PASS is, beside the verdict
    md = (tmp_path / "report.md").read_text()
    row = next(line for line in md.splitlines() if line.startswith("| r1-2pct |"))
    assert "| PASS |" in row and "% slower [" in row
    assert "PASS means *not worse than the guard*" in md
    # per-shape panels are coloured by that shape's verdict: r1-mixed is green where it is measured faster;
    # a PASS that is slower (inside the guard band) is neutral, never green
    fig = report.latency_figure(res["variants"], "t", res["measurements"], 1.03, res["verdicts_by_shape"])
    try:
        def hexes(vid):
            out = []
            for ax in fig.axes:
                patch = [p for p in ax.patches if p.get_gid() == f"variant:{vid}"][0]
                out.append("#%02x%02x%02x" % tuple(round(c * 255) for c in patch.get_facecolor()[:3]))
            return out

        assert hexes("r1-mixed") == [report.CATEGORY_COLORS["PASS/faster"], report.CATEGORY_COLORS["REGRESS/slower"]]
        assert hexes("r1-2pct") == [report.CATEGORY_COLORS["PASS"]] * 2
        assert report.CATEGORY_COLORS["PASS"] != report.CATEGORY_COLORS["PASS/faster"]
        assert "measured" in fig.texts[0].get_text()  # the suptitle says what the bars are
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)
    meas = pd.read_parquet(tmp_path / "measurements.parquet")
    assert {"gpu_uuid", "host", "batch", "sm_clock_mhz_start", "clocks_locked"} <= set(meas.columns)
    assert (meas["p20_ms"] <= meas["p80_ms"]).all()


def test_plot_contains_failed_and_infeasible_variants(model_history):
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    verdicts = {r.variant_id: verdict_for(r, model_history[0], SPEC) for r in model_history[1:]}
    variants, _, meas = report.tables(model_history, verdicts, [])
    fig = report.latency_figure(variants, "t", meas, guard=1.03)
    try:
        assert len(fig.axes) == 2  # one panel per shape
        assert "model, not measured" in fig.texts[0].get_text()
        for ax in fig.axes:
            gids = {a.get_gid(): a for a in ax.get_children() if a.get_gid()}
            assert {f"variant:{r.variant_id}" for r in model_history} <= set(gids)
            texts = [t.get_text() for t in ax.texts]
            assert "out_of_resources" in texts and "nan_inf" in texts
            assert "spills over limit" in texts  # has an estimate, still marked with its reason
            # no latency: a marker under the axis (axes coordinates), not a bar that would read as the slowest
            # nor a point low on the ratio axis that would read as the fastest
            oor = gids["variant:r1-oor"]
            assert isinstance(oor, Line2D) and oor.get_ydata()[0] < 0 and not oor.get_clip_on()
            bars = [p for p in ax.patches if (p.get_gid() or "").startswith("variant:")]
            assert "variant:r1-oor" not in {p.get_gid() for p in bars}
            # the guard is a band from the baseline (1x) to the guard ratio, on a log axis of ratios
            band = [p for p in ax.patches if not (p.get_gid() or "").startswith("variant:")]
            assert len(band) == 1 and ax.get_yscale() == "log"
            assert [ln.get_ydata()[0] for ln in ax.lines if ln.get_label().startswith("guard x1.03")] == [1.03]
            ys = band[0].get_path().transformed(band[0].get_patch_transform()).vertices[:, 1] if hasattr(
                band[0], "get_patch_transform") else band[0].get_xy()[:, 1]
            assert min(ys) == pytest.approx(1.0) and max(ys) == pytest.approx(1.03)
            assert not any(len(c.get_segments()) for c in ax.collections if hasattr(c, "get_segments"))  # no error bars
            # every text sits inside the axes (nothing cut off)
            for t in ax.texts:
                x, y = t.get_position()
                assert -0.7 <= x <= len(model_history) and 0 <= y <= 1
        assert [t.get_text() for t in fig.axes[-1].get_xticklabels()] == [r.variant_id for r in model_history]
        legend_labels = {t.get_text() for t in fig.legends[0].get_texts()}
        assert {"REGRESS/infeasible", "REGRESS/infeasible (no time: x under the axis)", "REGRESS/wrong (no time: x under the axis)",
                "NEEDS_REVIEW", "baseline (its estimate)", "guard x1.03 (shaded: within it)"} <= legend_labels
        # the legend sits below the axes, not to their right (where a narrow view cuts it off)
        fig.canvas.draw()
        leg = fig.legends[0].get_window_extent()
        axes_box = fig.axes[-1].get_window_extent()
        assert leg.y1 <= axes_box.y0 and leg.x1 <= fig.bbox.x1 + 1
        # the spilling variant is hollow with a grey (infeasible) edge, not a filled red (slower) bar
        spill = [a for a in fig.axes[0].patches if a.get_gid() == "variant:r1-spill"][0]
        grey = tuple(int(report.CATEGORY_COLORS["REGRESS/infeasible"][i:i + 2], 16) / 255 for i in (1, 3, 5))
        assert spill.get_edgecolor()[:3] == pytest.approx(grey) and spill.get_facecolor()[:3] == pytest.approx((1, 1, 1))
    finally:
        plt.close(fig)
    assert report.latency_plot(variants, "t", meas, 1.03)[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_of_a_sweep_with_no_variant(model_history, tmp_path):
    """A budget that refused every prompt leaves only the baseline: the report still writes, and says so."""
    res = report.write_report(tmp_path, SPEC, "specs/gemm_smoke.yaml", _state(model_history[:1]), {}, [])
    md = (tmp_path / "report.md").read_text()
    assert res["summary_line"].startswith("PASS 0 / REGRESS 0") and "(of 0 variants)" in md
    view, cols, _ = res["verdict_view"]
    assert report.verdict_records(view, cols)[1] == []
    assert report.overview_markdown(res["variants"], 1.03) is None or len(report.overview_markdown(res["variants"], 1.03)) < 1000


def test_first_report_reads_true_for_a_new_user(tmp_path, model_history):
    """What a first look at a model-evidence report and the UI showed: each NEEDS_REVIEW row says why, a
    variant over a constraint is listed with the failures, byte counts print whole, and the evidence field
    names recorded runs as recorded."""
    verdicts = {r.variant_id: verdict_for(r, model_history[0], SPEC) for r in model_history[1:]}
    report.write_report(tmp_path, SPEC, "specs/gemm_smoke.yaml", _state(model_history), verdicts, [])
    md = (tmp_path / "report.md").read_text()
    table = md[md.index("| variant_id"):].split("\n\n")[0]
    row = next(line for line in table.splitlines() if line.startswith("| r1-a |"))
    assert report.MODEL_ONLY in row
    failures = md[md.index("## Failures"):md.index("## Dropped proposals")]
    assert "r1-spill" in failures and "over a constraint" in failures and "spill" in failures
    assert report._fmt(49152.0) == "49152" and report._fmt(0.5981) == "0.5981" and report._fmt(3.0) == "3"
    assert report.evidence_text(model_history) == "model: analytic estimates, nothing was timed"
    replayed = [_row("baseline", 0, _measured(np.random.default_rng(0), [0.6, 0.9]), "replay")]
    assert report.evidence_text(replayed).startswith("replay: recorded GPU runs")


def test_readings_of_narrow_intervals_and_who_wrote_the_narrative():
    """An interval narrower than the one-decimal display (recorded runs often vary by under 0.5%) is printed
    with more decimals, never as a point; the narrative's source reads as words."""
    from kregress.core.records import Verdict

    v = lambda lo, r, hi: Verdict(variant_id="v", verdict="PASS", reasons=[], ratio=r, ratio_ci_low=lo,  # noqa: E731
                                  ratio_ci_high=hi, evidence="replay", method="hodges-lehmann/shift")
    assert report.reading(v(0.95, 0.96, 0.97)) == "4.0% faster [-5.0%, -3.0%]"
    assert report.reading(v(0.5977, 0.5981, 0.5984)) == "40.2% faster [-40.23%, -40.16%]"
    assert report.reading(v(0.59810, 0.59810, 0.59810)) == "40.2% faster [-40.19%, interval < 0.01% wide]"
    assert report.narrative_origin("fallback: no TAOTOKEN key for role report") == (
        "written by kregress without a model (no TAOTOKEN key for role report; export TAOTOKEN_API_KEY for a model's)")
    assert report.narrative_origin("fallback: BudgetExceeded: sweep total") == \
        "written by kregress without a model (BudgetExceeded: sweep total)"
    assert report.narrative_origin("llm:report#ab12:deepseek-v3") == "written by deepseek-v3 (key report#ab12)"


def test_the_ui_results_table_labels_estimates_and_leaves_out_empty_columns(model_history):
    """The assets' results tables (the UI) say what the report says: an estimate is est_ms (model), never a
    p50; columns with nothing in them (compile facts of recorded runs) are left out."""
    from kernel_assets.assets import _rows_md

    head = _rows_md(model_history).splitlines()[0]
    assert "est_ms (model)" in head and "est_tflops" in head and "latency_p50_ms" not in head
    assert "regs_per_thread" in head and "error" in head
    rng = np.random.default_rng(0)
    recorded = [r.model_copy(update={"compile": None, "correctness": None, "error": None}) for r in
                [_row("baseline", 0, _measured(rng, [0.6, 0.9]), "replay"), _row("r1-a", 1, _measured(rng, [0.5, 0.8]), "replay")]]
    head = _rows_md(recorded).splitlines()[0]
    assert "latency_p50_ms" in head and "est_ms" not in head
    assert not any(c in head for c in ("regs_per_thread", "smem_bytes", "occupancy", "max_abs_err", "| error |"))


def test_a_crashed_variant_is_regress_crashed_in_the_verdict_summary_and_plot(model_history, tmp_path):
    # issue 30, item 5: a candidate whose child died is REGRESS `crashed`, not `wrong`; the summary counts it
    # and the plot draws it (its own colour) without a KeyError
    hist = model_history[:2] + [_row("r1-crash", 1, [], None, error="crashed",
                                     detail="the child exited (code -11) before answering")]
    verdicts = {r.variant_id: verdict_for(r, hist[0], SPEC) for r in hist[1:]}
    assert (verdicts["r1-crash"].verdict, verdicts["r1-crash"].cause) == ("REGRESS", "crashed")
    assert "code -11" in verdicts["r1-crash"].reasons[0]
    res = report.write_report(tmp_path, SPEC, "specs/gemm_smoke.yaml", _state(hist), verdicts, [])
    assert res["causes"]["crashed"] == 1 and "crashed 1" in res["summary_line"]
    assert (tmp_path / "latency.png").stat().st_size > 0
