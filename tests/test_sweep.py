"""The whole graph on the embedded default: a real Dagster instance in a temp DAGSTER_HOME, real
Triton compiles and interpreter runs, the local agent, the report files. Nothing is mocked."""

from __future__ import annotations

import os
from pathlib import Path

import dagster as dg
import pandas as pd
import pytest

from kregress.core.spec import load_spec

REPO = Path(__file__).resolve().parent.parent
SMOKE = REPO / "specs" / "gemm_smoke.yaml"
REQUIRED = ["variant_id", "round", "source", "BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_stages", "num_warps",
            "error", "latency_p50_ms", "latency_p20_ms", "latency_p80_ms", "tflops", "regs_per_thread", "spill_bytes",
            "smem_bytes", "occupancy", "max_abs_err", "max_rel_err", "verdict", "cause", "worst_shape", "ref_rounding_abs",
            "atol", "rtol", "evidence", "reasons"]


def test_definitions_load_and_resolve():
    from kernel_assets.definitions import defs

    graph = defs.resolve_asset_graph()
    keys = {k.to_user_string() for k in graph.get_all_asset_keys()}
    expected = {"baseline_metrics", "verdict_report"} | {f"round_{k}_{s}" for k in range(1, 5)
                                                         for s in ("suggestions", "variants", "profiles")}
    assert expected <= keys
    checks = {c.name for c in graph.asset_check_keys}
    assert {"baseline_correct", "baseline_constraints", "regression_guard", "round_1_constraints"} <= checks
    job = defs.resolve_job_def("sweep_job")
    assert job.partitions_def is not None and job.partitions_def.name == "specs"
    # lineage: each round feeds the next, the last profiles feed the report
    assert dg.AssetKey("round_1_profiles") in graph.get(dg.AssetKey("round_2_suggestions")).parent_keys
    assert dg.AssetKey("round_4_profiles") in graph.get(dg.AssetKey("verdict_report")).parent_keys
    # benchmark steps take the pool of the device they time on (gpu/<host>/<device>); planning steps do not
    from kernel_assets.assets import BENCH_POOL
    from kregress.core.names import is_benchmark_pool

    pools = {n: job.graph.node_named(n).definition.pool for n in ("baseline_metrics", "round_1_variants", "round_1_suggestions")}
    assert pools == {"baseline_metrics": BENCH_POOL, "round_1_variants": BENCH_POOL, "round_1_suggestions": None}
    assert is_benchmark_pool(BENCH_POOL)


def _materialize(home: Path):
    from kernel_assets.constants import SPECS_PARTITIONS
    from kernel_assets.definitions import build_definitions, build_resources

    instance = dg.DagsterInstance.get()
    spec = load_spec(SMOKE)
    if not instance.has_dynamic_partition(SPECS_PARTITIONS.name, spec.task_id):
        instance.add_dynamic_partitions(SPECS_PARTITIONS.name, [spec.task_id])
    defs = build_definitions(build_resources("local"))
    result = defs.resolve_job_def("sweep_job").execute_in_process(partition_key=spec.task_id, instance=instance)
    assert result.success
    return instance, result


def _metadata(result, key: str) -> dict:
    mats = [e.event_specific_data.materialization for e in result.all_events if e.event_type_value == "ASSET_MATERIALIZATION"]
    (m,) = [m for m in mats if m.asset_key.to_user_string() == key]
    return {k: getattr(v, "value", v) for k, v in m.metadata.items()}


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    (home / "dagster.yaml").write_text((REPO / "dagster_home" / "dagster.yaml").read_text())
    old = os.environ.get("DAGSTER_HOME")
    os.environ["DAGSTER_HOME"] = str(home)
    try:
        instance, first = _materialize(home)
        _, second = _materialize(home)
        yield home, instance, first, second
    finally:
        if old is None:
            os.environ.pop("DAGSTER_HOME")
        else:
            os.environ["DAGSTER_HOME"] = old


def test_sweep_produces_report_files(swept):
    home, _, first, _ = swept
    out = home / "reports" / "gemm_smoke"
    assert {"report.md", "variants.parquet", "verdicts.parquet", "measurements.parquet", "latency.png"} <= {p.name for p in out.iterdir()}
    variants = pd.read_parquet(out / "variants.parquet")
    verdicts = pd.read_parquet(out / "verdicts.parquet")
    for df in (variants, verdicts):
        assert set(REQUIRED) <= set(df.columns), set(REQUIRED) - set(df.columns)
    assert variants.iloc[0]["variant_id"] == "baseline" and variants.iloc[0]["verdict"] == "BASELINE"
    assert len(verdicts) == 6 and set(verdicts["round"]) == {1, 2}  # 3 variants x max_rounds 2
    assert set(verdicts["verdict"]) <= {"PASS", "REGRESS", "NEEDS_REVIEW"}
    # evidence rule on a CPU host: no latency PASS/REGRESS from a model estimate
    ok = verdicts[verdicts["error"].isna() & (verdicts["spill_bytes"] == 0)]
    assert len(ok) and (ok["verdict"] == "NEEDS_REVIEW").all() and (ok["evidence"] == "model").all()
    assert ok["reasons"].str.contains("evidence=model").all()
    assert (verdicts["regs_per_thread"].dropna() > 0).all() and (verdicts["occupancy"].dropna() > 0).all()
    report = (out / "report.md").read_text()
    for section in ("## Verdicts", "## Spec", "## Baseline", "## Rounds", "### Round 1", "## Failures", "latency.png"):
        assert section in report
    md = _metadata(first, "verdict_report")
    assert md["n_PASS"] + md["n_REGRESS"] + md["n_NEEDS_REVIEW"] == 6
    # on model evidence the guard says what it could not check, not a bare "passed"
    evaluated = {e.event_specific_data.check_name for e in first.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"}
    assert "regression_guard" not in evaluated  # not checked: Skipped, never a result
    assert "nothing was timed" in md["regression_guard: not checked"]
    # the UI's results tables call an estimate an estimate
    assert "est_ms (model)" in _metadata(first, "baseline_metrics")["results"]


def test_default_sweep_causes_and_per_shape_verdicts(swept):
    """Issue 12: every REGRESS has a cause, counted apart; a verdict per variant per shape; model
    evidence holds one estimate (no percentiles) and the best is an 'estimated best'."""
    home, _, first, _ = swept
    out = home / "reports" / "gemm_smoke"
    spec = load_spec(SMOKE)
    verdicts = pd.read_parquet(out / "verdicts.parquet")
    regress = verdicts[verdicts["verdict"] == "REGRESS"]
    assert regress["cause"].isin(["slower", "wrong", "infeasible"]).all()
    assert verdicts.loc[verdicts["verdict"] != "REGRESS", "cause"].isna().all()
    # on the interpreter no latency is measured: no REGRESS can be "slower"
    assert not (regress["cause"] == "slower").any()
    failed = verdicts[verdicts["error"].notna() | (verdicts["spill_bytes"] > 0)]
    assert (failed["verdict"] == "REGRESS").all()
    by_shape = pd.read_parquet(out / "verdicts_by_shape.parquet")
    shapes = {f"{s['M']}x{s['N']}x{s['K']}" for s in spec.shape_matrix}
    assert set(by_shape["shape"]) == shapes
    assert len(by_shape) == len(verdicts) * len(shapes)
    assert {"variant_id", "shape", "verdict", "cause", "ratio", "ratio_ci_low", "ratio_ci_high"} <= set(by_shape.columns)
    merged = by_shape.merge(verdicts[["variant_id", "verdict", "cause"]], on="variant_id", suffixes=("", "_variant"))
    assert (merged["verdict"] == merged["verdict_variant"]).all()  # model evidence: no shape differs
    meas = pd.read_parquet(out / "measurements.parquet")
    model = meas[meas["evidence"] == "model"]
    assert len(model) and model["p20_ms"].isna().all() and model["p80_ms"].isna().all()
    assert {"gpu_name", "gpu_uuid", "host", "driver", "batch", "clocks_locked"} <= set(meas.columns)
    report = (out / "report.md").read_text()
    md = _metadata(first, "verdict_report")
    causes = {c: int((regress["cause"] == c).sum()) for c in ("slower", "wrong", "infeasible")}
    line = (f"REGRESS {len(regress)} (slower {causes['slower']}, wrong {causes['wrong']}, "
            f"infeasible {causes['infeasible']})")  # `rejected` is named once a patch was judged
    assert line in report and line in md["summary"]
    assert {f"n_REGRESS_{c}": n for c, n in causes.items()}.items() <= md.items()
    assert "Estimated best (model evidence, not a measurement)" in report and md["best_kind"] == "estimated best"
    for section in ("## Per shape", "## Tolerance", "ref rounding abs", "## Measurement conditions",
                    "## How the estimates are made", "Ignores:", "est_ms (model)", "**Evidence: `model`.**",
                    "specs/replay_clblast_rtx3090.yaml"):
        assert section in report, section
    assert "latency_p50_ms" not in report.split("## Files")[0]  # an estimate is never labelled a p50
    assert "clock locking: not applicable" in report and "batches: none" in report
    assert "| 0 | 0 |" not in report  # no rows of empty sample counts


def test_rounds_past_max_rounds_are_marked_skipped_not_shown_as_run(swept):
    _, _, first, _ = swept
    mats = {e.event_specific_data.materialization.asset_key.to_user_string(): e.event_specific_data.materialization
            for e in first.all_events if e.event_type_value == "ASSET_MATERIALIZATION"}
    for step in ("suggestions", "variants", "profiles"):
        md = _metadata(first, f"round_3_{step}")
        assert md["skipped"] == "round 3 did not run: max_rounds reached (2)", md
        assert not {"proposals", "variants", "failed", "measured_so_far"} & set(md)  # no counts that read like a run
        assert mats[f"round_3_{step}"].tags.get("kregress/round") == "skipped"
        ran = _metadata(first, f"round_2_{step}")
        assert "skipped" not in ran and mats[f"round_2_{step}"].tags.get("kregress/round") != "skipped"
    evaluated = {e.event_specific_data.check_name for e in first.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"}
    # a check that could not run yields no result (Dagster resolves it Skipped); its reason is in the metadata
    assert "round_3_constraints" not in evaluated
    assert _metadata(first, "round_3_variants")["round_3_constraints: not checked"].startswith("round 3 did not run")
    report = (swept[0] / "reports" / "gemm_smoke" / "report.md").read_text()
    assert "rounds 3-4 did not run (their assets are materialized marked skipped)" in report


def test_verdicts_are_a_table_and_the_plot_shows_inline(swept):
    _, _, first, _ = swept
    mats = [e.event_specific_data.materialization for e in first.all_events if e.event_type_value == "ASSET_MATERIALIZATION"]
    (m,) = [m for m in mats if m.asset_key.to_user_string() == "verdict_report"]
    table = m.metadata["verdicts"]
    assert isinstance(table, dg.TableMetadataValue)
    cols = {c.name: c.type for c in table.schema.columns}
    assert {"variant_id": "string", "round": "int", "verdict": "string", "vs_baseline": "string"}.items() <= cols.items()
    assert len(table.records) == 6 and all(r.data["verdict"] in ("PASS", "REGRESS", "NEEDS_REVIEW") for r in table.records)
    overview = m.metadata["latency_overview"].value
    assert overview.startswith("![time vs baseline](data:image/png;base64,") and len(overview) < 1000  # shown inline
    assert "estimated time (model)" in overview
    assert m.metadata["latency_png"].value.endswith("latency.png")
    assert "replay_clblast_rtx3090.yaml" in m.metadata["next_step"].value  # measured verdicts without a GPU
    assert m.metadata["evidence"].value.startswith("model")


def test_checks_ran(swept):
    _, _, first, _ = swept
    evals = {e.event_specific_data.check_name: e.event_specific_data for e in first.all_events
             if e.event_type_value == "ASSET_CHECK_EVALUATION"}
    assert evals["baseline_correct"].passed
    assert {"round_1_constraints", "round_2_constraints"} <= set(evals) and "regression_guard" not in evals  # not checked


def test_rematerializing_unchanged_spec_recompiles_nothing(swept):
    _, _, first, second = swept
    cold = sum(_metadata(first, k).get("compiles", 0) for k in ("baseline_metrics", "round_1_variants", "round_2_variants"))
    warm = sum(_metadata(second, k).get("compiles", 0) for k in ("baseline_metrics", "round_1_variants", "round_2_variants"))
    hits = sum(_metadata(second, k).get("compile_cache_hits", 0) for k in ("baseline_metrics", "round_1_variants", "round_2_variants"))
    assert cold >= 5 and warm == 0 and hits == cold
    # same seed, same history: the agent proposes the same variants again
    assert _metadata(first, "round_2_suggestions")["table"] == _metadata(second, "round_2_suggestions")["table"]
