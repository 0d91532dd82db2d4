"""The sweep's outputs: report.md for people, Parquet tables for tools, plots for both."""

from __future__ import annotations

import base64
import io
import math
from pathlib import Path

import pandas as pd

from kregress.core.records import Verdict, VariantResult, config_label
from kregress.core.stats import DEFAULT_MIN_SHIFT as MIN_SHIFT
from kregress.core.spec import TaskSpec

COLUMNS = [
    "variant_id", "round", "source", "config_label", "error", "error_detail", "latency_p50_ms", "latency_p20_ms",
    "latency_p80_ms", "tflops", "gbps", "regs_per_thread", "spill_bytes", "smem_bytes", "occupancy",
    "occupancy_limiter", "max_abs_err", "max_rel_err", "ref_rounding_abs", "atol", "rtol", "verdict", "cause",
    "ratio", "ratio_ci_low", "ratio_ci_high", "p50_ratio", "worst_shape", "evidence", "reasons", "patch_summary",
    "expected_effect", "risk", "parent", "config_hash", "patch_sha256",
    # the forecast as proposed (before measurement), and the measured speedup it is scored against (cuda/replay only)
    "expected_speedup", "expected_speedup_low", "expected_speedup_high", "bottleneck", "measured_speedup",
]
SHAPE_COLUMNS = ["variant_id", "round", "config_label", "shape", "verdict", "cause", "ratio", "ratio_ci_low",
                 "ratio_ci_high", "p50_ratio", "n_variant", "n_baseline", "batch", "evidence", "reason"]
MEAS_COLUMNS = ["variant_id", "round", "shape", "p20_ms", "p50_ms", "p80_ms", "tflops", "gbps", "samples", "evidence",
                "device", "gpu_name", "gpu_uuid", "host", "driver", "sm_clock_mhz_start", "sm_clock_mhz_end",
                "mem_clock_mhz_start", "mem_clock_mhz_end", "clocks_locked", "batch", "torch_version", "triton_version"]


def _geomean(xs: list) -> float | None:
    """Geometric mean; None when any value is missing (model evidence has no p20/p80)."""
    if not xs or any(x is None for x in xs):
        return None
    xs = [x for x in xs if x > 0]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def row_record(row: VariantResult, verdict: Verdict | None, param_names: list[str]) -> dict:
    ms = row.measurements
    rec = {
        "variant_id": row.variant_id, "round": row.round, "source": row.source, "config_label": config_label(row.config),
        "error": row.error, "error_detail": row.error_detail,
        "latency_p50_ms": _geomean([m.p50_ms for m in ms]), "latency_p20_ms": _geomean([m.p20_ms for m in ms]),
        "latency_p80_ms": _geomean([m.p80_ms for m in ms]), "tflops": _geomean([m.tflops for m in ms]),
        "gbps": _geomean([m.gbps for m in ms]),
        "regs_per_thread": row.compile.regs_per_thread if row.compile else None,
        "spill_bytes": row.compile.spill_bytes if row.compile else None,
        "smem_bytes": row.compile.smem_bytes if row.compile else None,
        "occupancy": row.compile.occupancy if row.compile else None,
        "occupancy_limiter": row.compile.occupancy_limiter if row.compile else None,
        "max_abs_err": row.correctness.max_abs_err if row.correctness else None,
        "max_rel_err": row.correctness.max_rel_err if row.correctness else None,
        "ref_rounding_abs": row.correctness.ref_rounding_abs if row.correctness else None,
        "atol": row.correctness.atol if row.correctness else None,
        "rtol": row.correctness.rtol if row.correctness else None,
        "verdict": verdict.verdict if verdict else ("BASELINE" if row.round == 0 else None),
        "cause": verdict.cause if verdict else None,
        "p50_ratio": verdict.p50_ratio if verdict else None,
        "worst_shape": verdict.worst_shape if verdict else None,
        "ratio": verdict.ratio if verdict else None,
        "ratio_ci_low": verdict.ratio_ci_low if verdict else None,
        "ratio_ci_high": verdict.ratio_ci_high if verdict else None,
        "evidence": row.evidence,
        "reasons": "; ".join(verdict.reasons) if verdict else "",
        "patch_summary": row.patch_summary, "expected_effect": row.expected_effect, "risk": row.risk,
        "parent": row.parent, "config_hash": row.config_hash, "patch_sha256": row.patch_sha256,
        "expected_speedup": row.expected_speedup, "expected_speedup_low": row.expected_speedup_low,
        "expected_speedup_high": row.expected_speedup_high, "bottleneck": row.bottleneck,
    }
    for p in param_names:
        rec[p] = row.config.get(p)
    return rec


def tables(history: list[VariantResult], verdicts: dict[str, Verdict], param_names: list[str]) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(variants, verdicts, measurements) frames; config parameters are columns of their own."""
    from kregress.core.forecast import measured_speedup
    from kregress.core.names import MEASURED_EVIDENCE

    recs = [row_record(r, verdicts.get(r.variant_id), param_names) for r in history]
    for r, rec in zip(history, recs):
        rec["measured_speedup"] = (measured_speedup(r, history[0]) if r.round > 0 and r.evidence in MEASURED_EVIDENCE
                                   else None)
    cols = COLUMNS[:4] + param_names + COLUMNS[4:]
    variants = pd.DataFrame.from_records(recs, columns=cols)
    verdict_df = variants[variants["round"] > 0].reset_index(drop=True)
    meas = pd.DataFrame.from_records(
        [{"variant_id": r.variant_id, "round": r.round, "samples": len(m.samples_ms),
          **{c: getattr(m, c) for c in MEAS_COLUMNS if c not in ("variant_id", "round", "samples")}}
         for r in history for m in r.measurements],
        columns=MEAS_COLUMNS,
    )
    return variants, verdict_df, meas


def shape_table(history: list[VariantResult], verdicts: dict[str, Verdict]) -> pd.DataFrame:
    """One row per variant per shape (verdicts_by_shape.parquet). A failed variant has no latency per
    shape: it gets one row per shape of the matrix it was meant to run, with its verdict and cause."""
    rows = []
    shapes = [m.shape for m in history[0].measurements] if history else []
    for r in history[1:]:
        v = verdicts.get(r.variant_id)
        if v is None:
            continue
        if v.shapes:
            for sv in v.shapes:
                rows.append({"round": r.round, "config_label": config_label(r.config), **sv.model_dump()})
        else:  # failed / infeasible before timing: the variant's verdict stands for every shape
            for shp in shapes or ["-"]:
                rows.append({"variant_id": r.variant_id, "round": r.round, "config_label": config_label(r.config),
                             "shape": shp, "verdict": v.verdict, "cause": v.cause, "reason": "; ".join(v.reasons),
                             "evidence": v.evidence, "n_variant": 0, "n_baseline": 0, "batch": ""})
    return pd.DataFrame.from_records(rows, columns=SHAPE_COLUMNS)


VERDICT_COLORS = {"PASS": "#2e7d32", "REGRESS": "#c62828", "NEEDS_REVIEW": "#f9a825", "BASELINE": "#1565c0"}
# colour by verdict and cause (a REGRESS is red only when slower)
CATEGORY_COLORS = {
    "BASELINE": "#1565c0", "PASS": "#2e7d32", "NEEDS_REVIEW": "#f9a825",
    "REGRESS/slower": "#c62828", "REGRESS/wrong": "#6a1b9a", "REGRESS/infeasible": "#616161",
    "REGRESS/rejected": "#263238",
}


def _category(verdict, cause) -> str:
    if verdict == "REGRESS":
        return f"REGRESS/{cause or 'slower'}"
    return verdict if isinstance(verdict, str) and verdict in CATEGORY_COLORS else "NEEDS_REVIEW"


def _short_reason(rec) -> str:
    err = rec.get("error")
    if isinstance(err, str) and err:
        return err
    reasons = str(rec.get("reasons") or "")
    for key, label in (("spills", "spills"), ("registers", "registers"), ("shared memory", "smem")):
        if key in reasons:
            return f"{label} over limit"
    return rec.get("cause") or "no latency"


def latency_plot(variants: pd.DataFrame, title: str, measurements: pd.DataFrame | None = None,
                 guard: float | None = None, by_shape: pd.DataFrame | None = None):
    """PNG bytes of ``latency_figure`` (see there)."""
    import matplotlib.pyplot as plt

    fig = latency_figure(variants, title, measurements, guard, by_shape)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def latency_figure(variants: pd.DataFrame, title: str, measurements: pd.DataFrame | None = None,
                   guard: float | None = None, by_shape: pd.DataFrame | None = None):
    """p50 per variant, coloured by verdict and cause, one panel per shape when there are several.

    Every variant is on the x axis: one without a latency (failed, infeasible) gets a hatched grey
    slot with its reason written in it, never a made-up bar height. Measured evidence has p20-p80
    error bars; model evidence is one estimate and has none. The dashed line is the baseline, the
    dotted red one the guard (baseline x guard ratio). The legend sits outside the axes. With
    ``by_shape`` (the verdicts_by_shape table) each shape's panel is coloured by that shape's verdict.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    order = list(variants["variant_id"])
    info = {r["variant_id"]: r for r in variants.to_dict("records")}
    per_shape = {}
    if by_shape is not None and len(by_shape):
        per_shape = {(r["variant_id"], r["shape"]): (r["verdict"], r["cause"]) for r in by_shape.to_dict("records")}
    shapes = []
    if measurements is not None and len(measurements):
        shapes = list(dict.fromkeys(measurements["shape"]))
    panels = shapes if len(shapes) > 1 else [None]
    width = max(6.0, 0.32 * len(order) + 3.0)
    fig, axes = plt.subplots(len(panels), 1, figsize=(width, 2.8 * len(panels) + 0.8), dpi=110, squeeze=False,
                             sharex=True)
    for ax, shape in zip(axes[:, 0], panels):
        vals, lo, hi = {}, {}, {}
        if shape is None:
            for vid, rec in info.items():
                if rec.get("latency_p50_ms") is not None and not _isnan(rec["latency_p50_ms"]):
                    vals[vid] = rec["latency_p50_ms"]
                    lo[vid], hi[vid] = rec.get("latency_p20_ms"), rec.get("latency_p80_ms")
        else:
            sub = measurements[measurements["shape"] == shape]
            for m in sub.to_dict("records"):
                vals[m["variant_id"]] = m["p50_ms"]
                lo[m["variant_id"]], hi[m["variant_id"]] = m.get("p20_ms"), m.get("p80_ms")
        top = max(vals.values()) if vals else 1.0
        for x, vid in enumerate(order):
            rec = info[vid]
            verdict, cause = per_shape.get((vid, shape), (rec.get("verdict"), rec.get("cause")))
            cat = _category(verdict, cause)
            color = CATEGORY_COLORS[cat]
            if vid in vals:
                failed = cat in ("REGRESS/infeasible", "REGRESS/wrong", "REGRESS/rejected")
                bar = ax.bar(x, vals[vid], color=color, label=cat, hatch="///" if failed else None,
                             edgecolor="white" if failed else None)[0]
                bar.set_gid(f"variant:{vid}")
                if failed:  # an estimate exists, but the variant is out: say why on the bar
                    ax.text(x, 0.02, _short_reason(rec), rotation=90, fontsize=6, ha="center", va="bottom",
                            transform=ax.get_xaxis_transform(), color="white")
                l, h = lo.get(vid), hi.get(vid)
                if rec.get("evidence") in ("cuda", "replay") and l is not None and h is not None \
                        and not _isnan(l) and not _isnan(h):
                    ax.errorbar(x, vals[vid], yerr=[[vals[vid] - l], [h - vals[vid]]], color="black", lw=0.8, capsize=2)
            else:  # no latency: a hatched slot with the reason, no value
                span = ax.axvspan(x - 0.4, x + 0.4, facecolor="none", edgecolor=color, hatch="///", lw=0.8, label=cat)
                span.set_gid(f"variant:{vid}")
                ax.text(x, 0.02, _short_reason(rec), rotation=90, fontsize=6, ha="center", va="bottom",
                        transform=ax.get_xaxis_transform(), color="#333")
        base = vals.get(order[0]) if order else None
        if base is not None:
            ax.axhline(base, ls="--", color=CATEGORY_COLORS["BASELINE"], lw=1, label="baseline p50")
            if guard:
                ax.axhline(base * guard, ls=":", color="#c62828", lw=1.2, label=f"guard x{guard:g}")
                ax.text(1.0, base * guard, f" guard x{guard:g}", transform=ax.get_yaxis_transform(), fontsize=6,
                        va="bottom", ha="left", color="#c62828")
                top = max(top, base * guard)
        ax.set_ylim(0, top * 1.12 if top > 0 else 1.0)
        ax.set_ylabel("p50 ms" + ("" if shape else " (geomean)"), fontsize=8)
        if shape is not None:
            ax.set_title(f"shape {shape}", fontsize=8, loc="left")
    ax = axes[-1, 0]
    ax.set_xticks(range(len(order)))
    ax.set_xticklabels(order, rotation=70, fontsize=7)
    ev = ",".join(sorted(set(variants["evidence"].dropna()))) or "none"
    fig.suptitle(f"{title} (evidence: {ev})", fontsize=9)
    handles = {}
    for a in axes[:, 0]:
        for h, lab in zip(*a.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    fig.legend(list(handles.values()), list(handles.keys()), fontsize=7, loc="center left",
               bbox_to_anchor=(1.0, 0.5), frameon=False)
    fig.tight_layout()
    return fig


def _isnan(x) -> bool:
    return isinstance(x, float) and math.isnan(x)


def md_image(png: bytes, alt: str) -> str:
    return f"![{alt}](data:image/png;base64,{base64.b64encode(png).decode()})"


def _md_table(df: pd.DataFrame, cols: list[str], max_rows: int = 200) -> str:
    if df.empty:
        return "_none_\n"
    view = df[cols].head(max_rows).copy()

    def fmt(v):
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return ""
        if isinstance(v, float):
            return f"{v:.4g}"
        return str(v).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(v) for v in rec) + " |" for rec in view.itertuples(index=False)]
    return "\n".join(lines) + "\n"


def tolerance_section(spec: TaskSpec, history: list[VariantResult]) -> str:
    """How numerics are judged: absolute and relative parts per dtype, and the reference's own rounding
    (the float64 reference rounded to the output dtype) next to each variant's error."""
    lines = [
        f"An element passes when |out - ref| <= atol + rtol * |ref|, against the float64 reference, for dtype "
        f"**{spec.dtype}**. `numeric_tolerance` ({spec.constraints.numeric_tolerance:g}) is the base of both parts; "
        "the family scales them with the shape (e.g. with sqrt(K) for a GEMM) and the dtype.",
        "",
        "`ref rounding` is the error of the float64 reference itself rounded to the output dtype: the part of "
        "a variant's error the output format alone makes. A variant whose max_abs_err equals it is exact to "
        "the format.", "",
    ]
    recs = []
    for r in history:
        c = r.correctness
        if c is None:
            continue
        recs.append({"variant_id": r.variant_id, "dtype": c.dtype or spec.dtype, "atol": c.atol, "rtol": c.rtol,
                     "max_abs_err": c.max_abs_err, "ref rounding abs": c.ref_rounding_abs,
                     "max_rel_err": c.max_rel_err, "ref rounding rel": c.ref_rounding_rel,
                     "within rounding": (None if c.ref_rounding_abs is None
                                         else "yes" if c.max_abs_err <= c.ref_rounding_abs * (1 + 1e-9) else "no"),
                     "ok": c.ok})
    if not recs:
        return "\n".join(lines + ["_no correctness checks on this backend (recorded runs are not re-checked)_"]) + "\n"
    df = pd.DataFrame.from_records(recs)
    return "\n".join(lines) + "\n" + _md_table(df, list(df.columns))


def patch_section(history: list[VariantResult], verdicts: dict[str, Verdict]) -> list[str]:
    """report.md lines for the patch variants: verdict and cause, hashes, what the gate found, the diff."""
    rows = [r for r in history if r.patch]
    if not rows:
        return []
    out = ["## Patches", "",
           "Each patch went through the gate: static policy (REGRESS rejected), sandboxed compile and correctness on "
           "secret inputs (REGRESS wrong), precision against the baseline's own error (NEEDS_REVIEW precision), "
           "plausibility of its timing (NEEDS_REVIEW implausible), then the usual verdict.", ""]
    for r in rows:
        v = verdicts.get(r.variant_id)
        g = r.gate
        out += [f"### {r.variant_id}: {v.verdict if v else '-'} {(v.cause or '') if v else ''}".rstrip(), ""]
        if v and v.reasons:
            out += [f"- reason: {' '.join(v.reasons[0].split())[:600]}"]
        out += [f"- patch sha256 `{r.patch_sha256}`; applies to kernel hash `{r.patch_base_hash}`"
                + (f" -> `{g.patched_hash}`" if g and g.patched_hash else "")]
        if g is not None:
            out += [f"- {g.changed_lines} changed lines; apply/revert round trip: {'checked' if g.round_trip_ok else 'not reached'}"]
            if g.cases:
                out += [f"- correctness: {g.cases} calls on {g.seeds} secret seeds, distributions {', '.join(g.distributions)}; "
                        f"hidden shapes {', '.join(g.hidden_shapes) or 'none'}"]
            if g.cases_dropped:
                out += [f"- cases the baseline itself fails (not used): {'; '.join(g.cases_dropped)[:400]}"]
            if g.precision is not None:
                pm = g.precision
                out += [f"- error as a fraction of the tolerance: max {pm.candidate_max:.3g} (baseline {pm.baseline_max:.3g}), "
                        f"RMS {pm.candidate_rms:.3g} (baseline {pm.baseline_rms:.3g}); NEEDS_REVIEW above {g.precision_factor:g}x"]
            out += [f"- static / region: {f.text()}" for f in g.findings[:20]]
            out += [f"- sandbox: {x}" for x in g.runtime_violations[:10]]
            out += [f"- note: {n}" for n in g.notes[:10]]
        fence = "````" if "```" in (r.patch or "") else "```"
        out += ["", f"{fence}diff", (r.patch or "").rstrip("\n"), fence, ""]
    return out


def best_line(best: dict, spec: TaskSpec) -> str:
    if best["variant_id"] is None:
        return "Best: none (no variant is correct, feasible and timed)"
    val = f" at {best['value']:.4g} ms ({spec.objective.aggregate} p50, evidence {best.get('evidence')})"
    if best["kind"] == "best":
        return f"Best (measured): `{best['variant_id']}`{val}"
    ties = best["ties"]
    tie = (f"; {len(ties)} variants tie at this estimate: {', '.join(f'`{t}`' for t in ties)}; tie-break: "
           f"{best['tie_break']}") if len(ties) > 1 else ""
    return (f"Estimated best (model evidence, not a measurement): `{best['variant_id']}`{val}{tie}. "
            "A measured best needs cuda or replay evidence.")


def write_report(out_dir: Path, spec: TaskSpec, spec_path: str, state, verdicts: dict[str, Verdict],
                 param_names: list[str], narrative: str = "", narrative_source: str = "",
                 token_table: pd.DataFrame | None = None, extra_sections: list[tuple[str, str]] = ()) -> dict:
    """Write report.md, variants.parquet, verdicts.parquet, verdicts_by_shape.parquet, measurements.parquet
    and latency.png. Returns counts, causes, the summary line, the best-variant record and the frames."""
    from kernel_assets.sweep import best_measured, cause_counts, summary_line

    out_dir.mkdir(parents=True, exist_ok=True)
    variants, verdict_df, meas = tables(state.history, verdicts, param_names)
    by_shape = shape_table(state.history, verdicts)
    variants.to_parquet(out_dir / "variants.parquet", index=False)
    verdict_df.to_parquet(out_dir / "verdicts.parquet", index=False)
    by_shape.to_parquet(out_dir / "verdicts_by_shape.parquet", index=False)
    meas.to_parquet(out_dir / "measurements.parquet", index=False)
    guard = spec.regression_guard.not_worse_than_baseline_ratio
    png = latency_plot(variants, spec.task_id, meas, guard, by_shape)
    (out_dir / "latency.png").write_bytes(png)
    counts = verdict_df["verdict"].value_counts().to_dict() if len(verdict_df) else {}
    counts = {k: int(counts.get(k, 0)) for k in ("PASS", "REGRESS", "NEEDS_REVIEW")}
    causes = cause_counts([verdicts[r.variant_id] for r in state.history[1:] if r.variant_id in verdicts])
    line = summary_line(counts, causes)
    best = best_measured(state, verdicts, spec)
    baseline = state.history[0]
    b = variants.iloc[0]
    locked = sorted({m.clocks_locked for r in state.history for m in r.measurements if m.clocks_locked})
    devices = sorted({f"{m.gpu_name or m.device} {m.gpu_uuid}".strip() + (f" on {m.host}" if m.host else "")
                      for r in state.history for m in r.measurements if m.evidence in ("cuda", "replay")})
    batches = sorted({m.batch for r in state.history for m in r.measurements if m.batch})
    rg = spec.regression_guard

    lines = [f"# kregress sweep: {spec.task_id}", ""]
    if spec.description:
        lines += [spec.description, ""]
    lines += [
        "## Verdicts", "",
        f"**{line}** (of {len(verdict_df)} variants)", "",
        best_line(best, spec),
        f"Stopped: {state.stopped or 'not stopped'}", "",
        "Evidence rule: PASS/REGRESS on latency needs `cuda` or `replay` evidence; `model` latencies are analytic "
        "estimates from real compile stats (one number, no spread) and give NEEDS_REVIEW. Correctness, NaN/Inf and "
        "constraint failures are real on every backend and give REGRESS with a cause: `infeasible` (did not "
        "compile, out of resources, spills or registers over the limit), `wrong` (numerics, NaN/Inf) or `slower`.", "",
        f"Latency rule: per shape, the shift of the log times (variant vs the baseline samples of the same batch) "
        f"with its {rg.confidence:g} interval: the cluster-aligned likelihood shift and interval where the timings "
        "sit in tight clusters ('aligned shift ratio' in the reasons), else the Hodges-Lehmann shift with its "
        "distribution-free interval; REGRESS/slower when the shift is "
        f"above the guard {guard:g} and the interval lies above {1 + MIN_SHIFT:g}, PASS when the interval lies "
        "below the guard, "
        f"NEEDS_REVIEW otherwise or below {rg.min_samples} samples a side. A variant is REGRESS/slower if any "
        "shape is; `worst_shape` names it.", "",
        _md_table(verdict_df, ["variant_id", "round", "source", "config_label", "verdict", "cause", "worst_shape",
                               "ratio", "ratio_ci_low", "ratio_ci_high", "evidence", "reasons"]),
        "![p50 latency per variant](latency.png)", "",
        "## Per shape", "",
        _md_table(by_shape, ["variant_id", "shape", "verdict", "cause", "ratio", "ratio_ci_low", "ratio_ci_high",
                             "p50_ratio", "n_variant", "n_baseline", "evidence"], max_rows=400),
        "## Measurement conditions", "",
        f"- devices: {', '.join(devices) or 'none measured (model evidence)'}",
        f"- batches: {len(batches)} ({'baseline re-timed in each batch' if batches else 'no same-batch timing'})",
        f"- clock locking: {'; '.join(locked) if locked else 'off'}", "",
        "## Tolerance", "",
        tolerance_section(spec, state.history),
        "## Spec", "",
        f"- file: `{spec_path}`; content hash `{spec.content_hash()}`",
        f"- family `{spec.kernel_family}`, dtype {spec.dtype}, target {spec.hardware.device} ({spec.hardware.arch})",
        f"- shape_matrix: {', '.join(map(str, spec.shape_matrix))}",
        f"- correctness_shapes: {', '.join(map(str, spec.correctness_shapes))}",
        f"- constraints: {spec.constraints.model_dump()}",
        f"- regression guard: {rg.model_dump()}",
        f"- search: {spec.search.model_dump()}", "",
        "## Baseline", "",
        f"- config `{config_label(baseline.config)}`; backend {baseline.backend}; evidence {baseline.evidence}",
        f"- error: {baseline.error or 'none'} {baseline.error_detail}",
        f"- compile: {b['regs_per_thread']} regs/thread, {b['spill_bytes']} B spills, {b['smem_bytes']} B smem, "
        f"occupancy {b['occupancy']} (limited by {b['occupancy_limiter']})",
        f"- correctness: max_abs_err {b['max_abs_err']}, max_rel_err {b['max_rel_err']} on "
        f"{', '.join(baseline.correctness.shapes_checked) if baseline.correctness else '-'}", "",
        _md_table(meas[meas["variant_id"] == baseline.variant_id],
                  (["shape", "p20_ms", "p50_ms", "p80_ms"] if baseline.evidence in ("cuda", "replay")
                   else ["shape", "p50_ms"]) + ["tflops", "gbps", "evidence", "device"]),
        "## Rounds", "",
    ]
    for rnd in sorted(set(variants["round"]) - {0}):
        sub = variants[variants["round"] == rnd]
        lines += [f"### Round {rnd}", "",
                  _md_table(sub, ["variant_id", "source", "config_label", "patch_summary", "expected_effect", "risk",
                                  "latency_p50_ms", "regs_per_thread", "smem_bytes", "occupancy", "error", "verdict",
                                  "cause"])]
    lines += patch_section(state.history, verdicts)
    failed = [r for r in state.history if r.error]
    lines += ["## Failures", ""]
    lines += [f"- {r.variant_id} [{config_label(r.config)}]: **{r.error}**: {' '.join(r.error_detail.split())[:300]}" for r in failed] or ["_none_"]
    lines += ["", "## Dropped proposals", ""]
    lines += [f"- round {d.round} ({d.source}): {d.reason}: `{d.raw[:160]}`" for d in state.dropped] or ["_none_"]
    if state.notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in state.notes]
    for title, text in extra_sections:
        lines += ["", f"## {title}", "", text]
    if narrative:
        lines += ["", "## Narrative", "", f"_{narrative_source}_", "", narrative]
    if token_table is not None and len(token_table):
        lines += ["", "## Tokens", "", _md_table(token_table, list(token_table.columns))]
    lines += ["", "## Files", "", "- `variants.parquet` (every row, baseline first), `verdicts.parquet` (variants with "
              "verdicts and causes), `verdicts_by_shape.parquet` (a verdict per variant per shape), "
              "`measurements.parquet` (per shape, with device identity and batch), `latency.png`"]
    (out_dir / "report.md").write_text("\n".join(lines) + "\n")
    return {"counts": counts, "causes": causes, "summary_line": line, "best": best, "variants": variants,
            "verdicts": verdict_df, "verdicts_by_shape": by_shape, "measurements": meas, "png": png}
