"""The sweep's outputs: report.md for people, Parquet tables for tools, plots for both."""

from __future__ import annotations

import base64
import inspect
import io
import math
from pathlib import Path

import pandas as pd

from kregress.core.names import COMMAND_ENV, MAX_GRAPH_ROUNDS, MEASURED_EVIDENCE
from kregress.core.paths import REPO_ROOT
from kregress.core.records import VariantResult, Verdict, config_label
from kregress.core.spec import TaskSpec
from kregress.core.stats import DEFAULT_MIN_SHIFT as MIN_SHIFT

COLUMNS = [
    "variant_id", "round", "source", "config_label", "error", "error_detail", "latency_p50_ms", "latency_p20_ms",
    "latency_p80_ms", "tflops", "gbps", "regs_per_thread", "spill_bytes", "smem_bytes", "occupancy",
    "occupancy_limiter", "max_abs_err", "max_rel_err", "ref_rounding_abs", "atol", "rtol", "verdict", "cause",
    "ratio", "ratio_ci_low", "ratio_ci_high", "p50_ratio", "worst_shape", "draws", "evidence", "reasons", "patch_summary",
    "expected_effect", "risk", "parent", "config_hash", "patch_sha256",
    # the forecast as proposed (before measurement), and the measured speedup it is scored against (cuda/replay only)
    "expected_speedup", "expected_speedup_low", "expected_speedup_high", "bottleneck", "measured_speedup",
    # what latency_p50_ms (and p20/p80, tflops, gbps) is across the shapes: a geometric mean, named as one
    "latency_aggregate",
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


def latency_aggregate(row: VariantResult) -> str | None:
    """What a row's latency_p50_ms is: one shape's value, or the geometric mean over its shapes, of model
    estimates or of measured p50s. None when it has no latency."""
    ms = row.measurements
    if not ms:
        return None
    what = "measured p50" if row.evidence in MEASURED_EVIDENCE else f"{row.evidence} estimate"
    return f"{what} of one shape" if len(ms) == 1 else f"geometric mean over {len(ms)} shapes of the {what}s"


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
        "draws": verdict.draws if verdict else None,  # draws a side the verdict took (cuda: rounds; replay: runs)
        "ratio": verdict.ratio if verdict else None,
        "ratio_ci_low": verdict.ratio_ci_low if verdict else None,
        "ratio_ci_high": verdict.ratio_ci_high if verdict else None,
        "evidence": row.evidence,
        "reasons": "; ".join(verdict.reasons) if verdict else "",
        "patch_summary": row.patch_summary, "expected_effect": row.expected_effect, "risk": row.risk,
        "parent": row.parent, "config_hash": row.config_hash, "patch_sha256": row.patch_sha256,
        "expected_speedup": row.expected_speedup, "expected_speedup_low": row.expected_speedup_low,
        "expected_speedup_high": row.expected_speedup_high, "bottleneck": row.bottleneck,
        "latency_aggregate": latency_aggregate(row),
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
        [{"variant_id": r.variant_id, "round": r.round,
          # an estimate was never sampled: 0, whatever the row carries
          "samples": len(m.samples_ms) if m.evidence in MEASURED_EVIDENCE else 0,
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


# Colours by verdict and cause. A PASS is "not worse than the guard", not a win: it is neutral, and only
# a PASS whose whole interval lies below 1 (measured faster) is green. A REGRESS is red only when slower.
CATEGORY_COLORS = {
    "BASELINE": "#1565c0", "PASS": "#78909c", "PASS/faster": "#2e7d32", "NEEDS_REVIEW": "#f9a825",
    "REGRESS/slower": "#c62828", "REGRESS/wrong": "#6a1b9a", "REGRESS/crashed": "#4a148c",
    "REGRESS/infeasible": "#616161", "REGRESS/rejected": "#263238",
}
CATEGORY_LABELS = {
    "BASELINE": "baseline", "PASS": "PASS (not worse than the guard)", "PASS/faster": "PASS, measured faster",
    "NEEDS_REVIEW": "NEEDS_REVIEW", "REGRESS/slower": "REGRESS/slower", "REGRESS/wrong": "REGRESS/wrong",
    "REGRESS/crashed": "REGRESS/crashed", "REGRESS/infeasible": "REGRESS/infeasible", "REGRESS/rejected": "REGRESS/rejected",
}
# The shipped replay spec: measured verdicts (recorded RTX 3090 runs) on a host with no GPU.
REPLAY_DEMO_SPEC = REPO_ROOT / "specs" / "replay_clblast_rtx3090.yaml"
NEAR_TIE = 0.01  # estimates closer than this (relative) are not ranked apart


def _category(verdict, cause, ci_high=None) -> str:
    if verdict == "REGRESS":
        return f"REGRESS/{cause or 'slower'}"
    if verdict == "PASS":
        return "PASS/faster" if ci_high is not None and not _isnan(ci_high) and ci_high < 1.0 else "PASS"
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


def evidence_of(history: list[VariantResult]) -> str:
    """``measured`` when any row was timed on a GPU or replayed, ``model`` when the only latencies are
    analytic estimates, ``compile`` when nothing has a latency but variants have compile facts (a CUDA family
    on a host with no GPU: nvcc and ptxas ran, nothing else), ``none`` when there is neither."""
    kinds = {r.evidence for r in history if r.measurements}
    if kinds & MEASURED_EVIDENCE:
        return "measured"
    if kinds:
        return "model"
    return "compile" if any(r.compile is not None for r in history) else "none"


def compile_only_text(history: list[VariantResult], arch: str) -> str:
    """What a compile-only sweep rests on, in words (its report's evidence paragraph)."""
    n = sum(1 for r in history if r.compile is not None)
    return (f"**Evidence: compile facts only.** This host ran nothing: {n} of {len(history)} rows (the baseline "
            f"included) were compiled by nvcc for {arch}, and their registers, spills, shared memory and barriers "
            "(ptxas's own figures) are real. No variant was checked against the reference or timed, and no latency "
            "was estimated either (a CUDA family has no latency model: there is no estimated time to show): so no "
            "variant can PASS; those that compiled within the constraints are NEEDS_REVIEW, and a REGRESS (did not "
            "compile, over a limit, refused before nvcc) is real.")


def latency_label(kind: str) -> str:
    """The latency column's name in report.md: an estimate is never called a p50."""
    return "est_ms (model)" if kind == "model" else "p50_ms"


def latency_plot(variants: pd.DataFrame, title: str, measurements: pd.DataFrame | None = None,
                 guard: float | None = None, by_shape: pd.DataFrame | None = None):
    """PNG bytes of ``latency_figure`` (see there)."""
    import matplotlib.pyplot as plt

    fig = latency_figure(variants, title, measurements, guard, by_shape)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight", dpi=150)  # its 6-7 pt labels stay readable
    plt.close(fig)
    return buf.getvalue()


def latency_figure(variants: pd.DataFrame, title: str, measurements: pd.DataFrame | None = None,
                   guard: float | None = None, by_shape: pd.DataFrame | None = None):
    """Each variant's time relative to the baseline's (log scale), one panel per shape when there are several.

    The y axis says what the numbers are: a measured p50 ratio, or a model estimate's ratio (evidence
    ``model``: not a measurement). The baseline is the line at 1; the guard is a shaded band from 1 to
    the guard ratio, so a bar inside it is "not worse beyond the guard". A variant with no latency
    (failed, out of resources) is a grey x on the axis with its reason, never a bar; an infeasible
    variant that has an estimate is a hollow dashed bar with its reason. Measured evidence has p20-p80
    error bars. Colours: PASS is neutral (not a win), green only when the whole interval is below 1;
    NEEDS_REVIEW amber; REGRESS red (slower), purple (wrong), grey (infeasible). The legend sits below
    the axes. With ``by_shape`` (the verdicts_by_shape table) each panel is coloured by that shape's verdict.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    order = list(variants["variant_id"])
    info = {r["variant_id"]: r for r in variants.to_dict("records")}
    per_shape = {}
    if by_shape is not None and len(by_shape):
        per_shape = {(r["variant_id"], r["shape"]): (r["verdict"], r["cause"], r.get("ratio_ci_high"))
                     for r in by_shape.to_dict("records")}
    shapes = []
    if measurements is not None and len(measurements):
        shapes = list(dict.fromkeys(measurements["shape"]))
    kinds = set(variants["evidence"].dropna())
    kind = "measured" if kinds & MEASURED_EVIDENCE else "model" if kinds else "none"
    what = ("estimated time / baseline's estimate (model, not measured)" if kind == "model"
            else "p50 / baseline p50 (measured)")
    panels = shapes if len(shapes) > 1 else [None]
    width = max(7.0, 0.34 * len(order) + 2.5)
    fig, axes = plt.subplots(len(panels), 1, figsize=(width, 2.6 * len(panels) + 1.0), dpi=100, squeeze=False,
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
        base = vals.get(order[0]) if order else None
        scale = base if base else 1.0
        ratios = [v / scale for v in vals.values() if v > 0]
        top = max(ratios + [guard or 1.0, 1.0]) * 1.5
        bottom = min(ratios + [1.0]) / 1.6
        for x, vid in enumerate(order):
            rec = info[vid]
            verdict, cause, ci_high = per_shape.get((vid, shape), (rec.get("verdict"), rec.get("cause"),
                                                                   rec.get("ratio_ci_high")))
            cat = _category(verdict, cause, ci_high)
            color = CATEGORY_COLORS[cat]
            label = CATEGORY_LABELS[cat]
            if vid in vals and vals[vid] > 0:
                r = vals[vid] / scale
                failed = cat in ("REGRESS/infeasible", "REGRESS/wrong", "REGRESS/crashed", "REGRESS/rejected")
                if failed:  # an estimate exists, but the variant is out: hollow and dashed, with its reason
                    bar = ax.bar(x, r - bottom, bottom=bottom, facecolor="white", edgecolor=color, ls="--",
                                 lw=0.9, label=label)[0]
                    ax.text(x, 0.04, _short_reason(rec), rotation=90, fontsize=6.5, ha="center", va="bottom",
                            transform=ax.get_xaxis_transform(), color="#212121",
                            bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.5})
                else:
                    bar = ax.bar(x, r - bottom, bottom=bottom, color=color, label=label)[0]
                bar.set_gid(f"variant:{vid}")
                low, h = lo.get(vid), hi.get(vid)
                if rec.get("evidence") in MEASURED_EVIDENCE and low is not None and h is not None \
                        and not _isnan(low) and not _isnan(h):
                    ax.errorbar(x, r, yerr=[[r - low / scale], [h / scale - r]], color="black", lw=0.8, capsize=2)
            else:  # no latency: no bar and no height (neither fast nor slow), a marker under the axis and the reason
                mark = ax.plot([x], [-0.035], marker="x", color=color, ms=6, mew=1.5, ls="none", clip_on=False,
                               transform=ax.get_xaxis_transform(), label=f"{label} (no time: x under the axis)")[0]
                mark.set_gid(f"variant:{vid}")
                ax.text(x, 0.12, _short_reason(rec), rotation=90, fontsize=6.5, ha="center", va="bottom",
                        transform=ax.get_xaxis_transform(), color="#212121")
        if base:
            base_label = "baseline (its estimate)" if kind == "model" else "baseline p50"
            ax.axhline(1.0, ls="--", color=CATEGORY_COLORS["BASELINE"], lw=1, label=base_label)
            if guard:
                ax.axhspan(1.0, guard, color="#c62828", alpha=0.18, lw=0)
                ax.axhline(guard, ls=":", color="#c62828", lw=1.2, label=f"guard x{guard:g} (shaded: within it)")
        ax.set_yscale("log", base=2)
        ax.set_ylim(bottom, top)
        span = math.log2(top / bottom)
        ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(base=2, subs=(1.0, 1.5) if span < 3 else (1.0,)))
        ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:.3g}x"))
        ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.grid(axis="y", color="#e0e0e0", lw=0.5)
        ax.set_axisbelow(True)
        ax.set_ylabel("vs baseline", fontsize=8)
        ax.tick_params(axis="y", labelsize=7)
        name = f"shape {shape}: " if shape is not None else ""
        base_txt = f"{base:.4g} ms" if base else "no baseline value"
        ax.set_title(f"{name}baseline {'estimate' if kind == 'model' else 'p50'} {base_txt}", fontsize=8, loc="left")
    ax = axes[-1, 0]
    ax.set_xticks(range(len(order)))
    ax.set_xticklabels(order, rotation=70, fontsize=7)
    ax.set_xlim(-0.7, len(order) - 0.3)
    fig.suptitle(f"{title}: {what}", fontsize=9)
    handles = {}
    for a in axes[:, 0]:
        for h, lab in zip(*a.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    fig.tight_layout()
    fig.legend(list(handles.values()), list(handles.keys()), fontsize=7, loc="upper center",
               bbox_to_anchor=(0.5, 0.0), ncol=min(3, max(1, len(handles))), frameon=False)
    return fig


OVERVIEW_MAX_CHARS = 1000  # Dagster's asset page shows a markdown value inline only below this many characters


def overview_markdown(variants: pd.DataFrame, guard: float | None = None) -> str | None:
    """A small chart that the Dagster asset page shows inline (markdown under OVERVIEW_MAX_CHARS): one bar per
    variant in table order, its time relative to the baseline on a log scale (up: slower), coloured like the
    full plot; an x where a variant has no latency. None when it cannot be made that small."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from PIL import Image

    recs = variants.to_dict("records")
    if not recs or recs[0].get("latency_p50_ms") is None or _isnan(recs[0]["latency_p50_ms"]):
        return None
    base = recs[0]["latency_p50_ms"]
    fig, ax = plt.subplots(figsize=(max(2.0, 0.16 * len(recs)), 1.0), dpi=80)
    if guard:
        ax.axhspan(0, math.log2(guard), color="#f4b6b6", lw=0)
    for x, rec in enumerate(recs):
        cat = _category(rec.get("verdict"), rec.get("cause"), rec.get("ratio_ci_high"))
        val = rec.get("latency_p50_ms")
        if val is None or _isnan(val) or val <= 0:
            ax.plot([x], [0], marker="x", color=CATEGORY_COLORS["REGRESS/infeasible"], ms=3, mew=1)
        elif cat in ("REGRESS/infeasible", "REGRESS/wrong", "REGRESS/crashed"):
            ax.bar(x, math.log2(val / base), facecolor="white", edgecolor=CATEGORY_COLORS[cat], lw=0.6, width=0.8)
        else:
            ax.bar(x, math.log2(val / base), color=CATEGORY_COLORS[cat], width=0.8)
    ax.axhline(0, color=CATEGORY_COLORS["BASELINE"], lw=0.8)
    ax.set_xlim(-0.7, len(recs) - 0.3)
    ax.axis("off")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight", pad_inches=0.02)
    plt.close(fig)
    small = io.BytesIO()
    Image.open(io.BytesIO(buf.getvalue())).convert("RGB").quantize(colors=8).save(small, format="PNG", optimize=True)
    kinds = set(variants["evidence"].dropna())
    what = "estimated time (model)" if kinds and not kinds & MEASURED_EVIDENCE else "measured p50"
    text = (md_image(small.getvalue(), "time vs baseline") + f"\n\nEach variant's {what} vs the baseline, in table order "
            "(log scale, up = slower; shaded: the guard band; x: no latency). The labelled plot: `latency_plot`.")
    return text if len(text) < OVERVIEW_MAX_CHARS else None


def verdict_records(view: pd.DataFrame, cols: list[str]) -> tuple[list[tuple[str, str]], list[dict]]:
    """The verdict table as typed columns and JSON-safe records (for a table in the Dagster UI): the
    verdict and what it rests on first, the long config label and reasons last (a narrow column of a
    long label would make every row tall)."""
    last = [c for c in ("why", "config_label") if c in cols]
    if "config_label" in view and view["config_label"].astype(str).str.len().max() > 40:
        last.remove("config_label")  # e.g. a recorded file's 15 tunables: in the rounds' tables and report.md
    cols = [c for c in cols if c not in ("why", "config_label", "source")] + last
    view = view.assign(why=view["why_short"]) if "why_short" in view else view
    kinds = []
    for c in cols:
        dtype = view[c].dtype.kind if c in view else "O"
        kinds.append((c, "int" if dtype in "iu" else "float" if dtype == "f" else "string"))
    records = []
    for rec in view[cols].to_dict("records"):
        row = {}
        for (c, kind), v in zip(kinds, rec.values()):
            if v is None or (isinstance(v, float) and math.isnan(v)):
                row[c] = None
            elif kind == "int":
                row[c] = int(v)
            elif kind == "float":
                row[c] = round(float(v), 4)
            else:
                row[c] = str(v)
        records.append(row)
    return kinds, records


def _isnan(x) -> bool:
    return isinstance(x, float) and math.isnan(x)


def md_image(png: bytes, alt: str) -> str:
    return f"![{alt}](data:image/png;base64,{base64.b64encode(png).decode()})"


def _fmt(v) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, float):
        if v.is_integer() and abs(v) >= 1e4:
            return str(int(v))  # byte counts (smem_bytes 49152), never 4.915e+04
        return f"{v:.4g}"
    return str(v).replace("|", "\\|").replace("\n", " ")


def _md_table(df: pd.DataFrame, cols: list[str], max_rows: int = 200, headers: dict[str, str] | None = None) -> str:
    """A markdown table of ``cols``; ``headers`` renames columns for display only."""
    if df.empty:
        return "_none_\n"
    view = df[cols].head(max_rows).copy()
    names = [(headers or {}).get(c, c) for c in cols]
    lines = ["| " + " | ".join(names) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_fmt(v) for v in rec) + " |" for rec in view.itertuples(index=False)]
    more = f"\n_{len(df) - max_rows} more row(s) in the Parquet files_\n" if len(df) > max_rows else ""
    return "\n".join(lines) + "\n" + more


def reading(v: Verdict | None) -> str:
    """What a verdict's ratio says, in words (``kregress.core.forecast.ratio_words``): ``2.3% slower [+0.9%,
    +3.1%]`` (takes 2.3% longer, with the interval of the time difference), ``2.39x slower (model estimate)``."""
    from kregress.core.forecast import ratio_words

    if v is None or v.ratio is None or _isnan(v.ratio):
        return ""
    if v.method == "model" or v.evidence == "model":
        return ratio_words(v.ratio, estimate=True)

    def pct(r: float) -> str:
        return ratio_words(r)

    ci = ""
    if v.ratio_ci_low is not None and v.ratio_ci_high is not None and (v.ratio >= 2 or v.ratio <= 0.5):
        # beyond a factor of two the words are factors, and so is the interval
        lo, hi = (v.ratio_ci_low, v.ratio_ci_high) if v.ratio >= 2 else (1 / v.ratio_ci_high, 1 / v.ratio_ci_low)
        return f"{pct(v.ratio)} [{lo:.2f}x, {hi:.2f}x]" if f"{lo:.2f}" != f"{hi:.2f}" else f"{pct(v.ratio)} [{lo:.2f}x]"
    if v.ratio_ci_low is not None and v.ratio_ci_high is not None:
        lo, hi = (v.ratio_ci_low - 1) * 100, (v.ratio_ci_high - 1) * 100
        # runs that barely vary (recorded runs often spread by under 0.5%) give an interval narrower than
        # 0.1%: more decimals, so it does not print as a point, and "< 0.01% wide" when even those agree
        digits = 1 if hi - lo >= 0.1 else 2
        ci = f" [{lo:+.{digits}f}%, {hi:+.{digits}f}%]" if f"{lo:.{digits}f}" != f"{hi:.{digits}f}" else \
            f" [{lo:+.{digits}f}%, interval < 0.01% wide]"
    return f"{pct(v.ratio)}{ci}"


def verdict_view(verdict_df: pd.DataFrame, verdicts: dict[str, Verdict], kind: str) -> tuple[pd.DataFrame, list[str], dict]:
    """The verdict table as shown (report.md, the UI): (frame, columns, display headers)."""
    view = verdict_df.copy()
    if "cause" in view.columns:  # unsettled evidence first (stable: otherwise the table's own order)
        view = view.sort_values("cause", key=lambda c: c != "unsettled", kind="stable")
    view["vs_baseline"] = [reading(verdicts.get(v)) for v in view["variant_id"]]
    generic = "analytic estimate (evidence=model)"
    # a model-evidence NEEDS_REVIEW has one reason, said in full once above the table: its row says it short
    view["why"] = [("" if verdicts.get(v) is None else
                    MODEL_ONLY if verdicts[v].method == "model" and verdicts[v].verdict == "NEEDS_REVIEW"
                    else "; ".join(verdicts[v].reasons)) for v in view["variant_id"]]
    view["why"] = view["why"].astype("object").map(lambda t: str(t).replace(generic, "model estimate"))
    view["why_short"] = [_short_why(verdicts.get(v), w) for v, w in zip(view["variant_id"], view["why"])]
    cols = ["variant_id", "round", "source", "config_label", "verdict", "cause"]
    if kind == "measured":
        cols += ["worst_shape", "vs_baseline", "ratio", "draws"]  # the interval is in words beside it (and in the Parquet files)
    else:
        cols += ["vs_baseline"]
    cols += ["why"]
    headers = {"vs_baseline": "measured time vs baseline [interval]" if kind == "measured" else "time vs baseline",
               "config_label": "config", "draws": "draws a side"}
    return view, cols, headers


MODEL_ONLY = "model estimate only: PASS or REGRESS needs cuda or replay evidence"
# How every ratio in a report reads (one convention: the variant's time relative to the baseline's, in words).
RATIO_NOTE = ("Every ratio here is the variant's time relative to the baseline's, in words: \"12.5% slower\" takes 12.5% "
              "longer, \"47.4% faster\" takes 47.4% less time, \"2.39x slower\" takes 2.39 times as long.")


def evidence_text(history: list[VariantResult]) -> str:
    """The evidence behind a sweep's latencies, in words (the UI's ``evidence`` field)."""
    kinds = {r.evidence for r in history if r.measurements}
    if kinds & MEASURED_EVIDENCE:
        said = {"cuda": "cuda: timed on this host's GPU", "replay": "replay: recorded GPU runs, nothing timed on this host"}
        return "; ".join(said.get(k, k) for k in sorted(kinds & MEASURED_EVIDENCE))
    return "model: analytic estimates, nothing was timed" if kinds else "none: no variant has a latency"


def _short_why(v: Verdict | None, why: str) -> str:
    """A verdict's reason in a few words (the Dagster table); the full text stays in report.md and the
    Parquet files. A measured PASS or REGRESS/slower is said by its ratio already: only the rule's side."""
    if v is None or not why:
        return why
    if v.evidence in MEASURED_EVIDENCE and v.verdict == "PASS":
        return "interval below the guard"
    if v.evidence in MEASURED_EVIDENCE and v.verdict == "REGRESS" and v.cause == "slower":
        return f"above the guard{f' on {v.worst_shape}' if v.worst_shape else ''}"
    return why if len(why) <= 80 else why[:77] + "..."


def per_shape_section(by_shape: pd.DataFrame, kind: str, shapes: list[str]) -> str:
    """Per shape, as a new user reads it: model evidence is one table of estimated ratios (variant x
    shape); measured evidence is one row per variant and shape with its interval and sample counts. A
    variant that failed before timing is one row saying so, not a row of zeros per shape."""
    if by_shape.empty:
        return "_none_\n"
    failed = by_shape[by_shape["n_variant"].eq(0) & by_shape["ratio"].isna()]
    failed_ids = list(dict.fromkeys(failed["variant_id"]))
    timed = by_shape[~by_shape["variant_id"].isin(failed_ids)]
    out = []
    if kind == "model":
        if len(timed):
            from kregress.core.forecast import ratio_words

            piv = timed.pivot_table(index="variant_id", columns="shape", values="ratio", sort=False)
            piv = piv[[s for s in shapes if s in piv.columns]]
            piv = piv.apply(lambda col: col.map(lambda r: ratio_words(r) if r == r else "")).reset_index()
            out.append("Each variant's estimated time on each shape relative to the baseline's estimate, in words "
                       "(evidence `model`: analytic estimates, no samples, no interval).\n")
            out.append(_md_table(piv, list(piv.columns), max_rows=400))
    elif len(shapes) == 1 and len(timed):  # the verdict table above is already the per-shape table
        nv, nb = timed["n_variant"], timed["n_baseline"]
        out.append(f"One shape ({shapes[0]}): the verdicts above are its verdicts, each from {nv.min()}"
                   f"{'' if nv.min() == nv.max() else f'-{nv.max()}'} variant and {nb.min()}"
                   f"{'' if nb.min() == nb.max() else f'-{nb.max()}'} baseline samples "
                   "(`verdicts_by_shape.parquet` has every interval and count).\n")
    else:
        out.append(_md_table(timed, ["variant_id", "shape", "verdict", "cause", "ratio", "ratio_ci_low", "ratio_ci_high",
                                     "p50_ratio", "n_variant", "n_baseline", "evidence"], max_rows=400))
    if failed_ids:
        first = failed.drop_duplicates("variant_id")
        out.append("\nDecided before any latency was compared (the verdict holds for every shape):\n")
        out.append(_md_table(first, ["variant_id", "verdict", "cause", "reason"], headers={"reason": "why"}))
    return "\n".join(out)


def _near_ties(variants: pd.DataFrame, param_names: list[str]) -> list[tuple[list[str], list[str]]]:
    """Groups of feasible timed variants (the baseline included) whose estimates lie within NEAR_TIE of
    each other, with the tunables in which they differ."""
    ok = variants[variants["latency_p50_ms"].notna() & (variants["verdict"].isin(["BASELINE", "NEEDS_REVIEW", "PASS"]))]
    ok = ok.sort_values("latency_p50_ms", kind="stable")
    groups, cur = [], []
    for rec in ok.to_dict("records"):
        if cur and rec["latency_p50_ms"] > cur[0]["latency_p50_ms"] * (1 + NEAR_TIE):
            groups.append(cur)
            cur = []
        cur.append(rec)
    if cur:
        groups.append(cur)
    out = []
    for g in groups:
        if len(g) < 2:
            continue
        differ = [p for p in param_names if len({str(r.get(p)) for r in g}) > 1]
        out.append(([r["variant_id"] for r in g], differ))
    return out


def model_section(family, variants: pd.DataFrame, param_names: list[str]) -> str:
    """How the estimates are made (the family's own account: its ``model_latency_ms`` docstring), and the
    variants the model cannot rank apart, with what they differ in."""
    doc = inspect.getdoc(type(family).model_latency_ms) if family is not None else None
    lines = ["Every latency in this report is the family's analytic estimate from the variant's real compile "
             "facts (registers, spills, shared memory, occupancy), not a timing. What it takes into account and "
             "what it leaves out, in the family's words:", ""]
    lines += [f"> {ln}" if ln else ">" for ln in (doc or "(the family does not describe its model)").splitlines()]
    ties = _near_ties(variants, param_names)
    if ties:
        lines += ["", f"Estimates within {NEAR_TIE:.0%} of each other are not ranked apart; the model cannot tell "
                      "these variants apart, so only a measurement can:", ""]
        for ids, differ in ties[:12]:
            what = ", ".join(f"{p} ({', '.join(dict.fromkeys(str(variants.set_index('variant_id').loc[i, p]) for i in ids))})"
                             for p in differ) or "nothing the model sees"
            lines.append(f"- {', '.join(f'`{i}`' for i in ids)}: differ in {what}")
    return "\n".join(lines) + "\n"


def _steps(max_err: float | None, ref_round: float | None) -> float | None:
    """A variant's largest error in units of the output format's rounding (the reference's own largest
    rounding error is half a step): 1.0 = half a step (correctly rounded), 2.0 = one whole step."""
    if max_err is None or not ref_round:
        return None
    return max_err / ref_round


def _rounding_class(ratio: float | None) -> str:
    if ratio is None:
        return ""
    if ratio <= 1.05:  # fp32 accumulation can tip a value that sits on a rounding midpoint
        return "yes"
    if ratio <= 2.05:
        return "one step"
    return "no"


def tolerance_section(spec: TaskSpec, history: list[VariantResult]) -> str:
    """How numerics are judged: absolute and relative parts per dtype, and the reference's own rounding
    (the float64 reference rounded to the output dtype) next to each variant's error; variants with the
    same error share a row, and a run of identical errors is explained."""
    lines = [
        f"An element passes when |out - ref| <= atol + rtol * |ref|, against the float64 reference, for dtype "
        f"**{spec.dtype}**. `numeric_tolerance` ({spec.constraints.numeric_tolerance:g}) is the base of both parts; "
        "the family scales them with the shape (e.g. with sqrt(K) for a GEMM) and the dtype.",
        "",
        "`ref rounding` is the error of the float64 reference itself rounded to the output dtype: half a step of "
        "the output format at the largest values. `err / ref rounding` near 1 means the variant is correctly "
        "rounded to the format (`within rounding`: yes); near 2 means one whole step off; above that, arithmetic "
        "error beyond the format's.", "",
    ]
    recs = []
    # A patch's error comes from the gate's own inputs (secret seeds, large-magnitude and outlier values, hidden
    # shapes), the baseline's row from the correctness shapes: not the same inputs, so not one table. Each patch
    # is compared with the baseline on the gate's inputs instead (the gate's precision figures).
    patched = [r for r in history if r.gate is not None and r.correctness is not None]
    for r in history:
        c = r.correctness
        if c is None or any(r is x for x in patched):
            continue
        ratio = _steps(c.max_abs_err, c.ref_rounding_abs)
        recs.append({"variant_id": r.variant_id, "dtype": c.dtype or spec.dtype, "atol": c.atol, "rtol": c.rtol,
                     "max_abs_err": c.max_abs_err, "ref rounding abs": c.ref_rounding_abs,
                     "err / ref rounding": ratio,
                     "max_rel_err": c.max_rel_err, "ref rounding rel": c.ref_rounding_rel,
                     "within rounding": _rounding_class(ratio), "ok": c.ok, "backend": r.backend})
    if not recs and not patched:  # nothing checked: recorded runs, or compile facts only
        if any(r.compile is not None for r in history):
            return ("_no correctness check in this sweep: nothing ran on this host (compile facts only); on a GPU every "
                    "variant is checked against the float64 reference on the correctness shapes_\n")
        return "_no correctness check in this sweep: recorded runs are not re-checked (they were validated when recorded)_\n"
    gate_part = _patch_tolerance(patched)
    if not recs:
        return "\n".join(lines) + "\n" + gate_part
    df = pd.DataFrame.from_records(recs)
    key = ["dtype", "atol", "rtol", "max_abs_err", "ref rounding abs", "err / ref rounding", "max_rel_err",
           "ref rounding rel", "within rounding", "ok"]
    grouped = []
    for _, g in df.groupby(key, sort=False, dropna=False):
        ids = list(g["variant_id"])
        name = ", ".join(ids) if len(ids) <= 4 else f"{', '.join(ids[:3])} and {len(ids) - 3} more"
        grouped.append({"variants": name, "n": len(ids), **g.iloc[0][key].to_dict()})
    gdf = pd.DataFrame.from_records(grouped)
    if len(gdf) == 1 and len(df) > 1:
        row = gdf.iloc[0]
        ratio = row["err / ref rounding"]
        lines += [f"All {len(df)} checked rows (the baseline and every variant that compiled) have the same error. "
                  f"That error is the output format's, not the tiling's: every variant accumulates in fp32 and "
                  f"rounds once to {spec.dtype}, and a different tiling changes the fp32 sums by far less than one "
                  f"{spec.dtype} step, so the rounded outputs agree."]
        if ratio is not None and not _isnan(ratio):
            lines[-1] += f" Its largest error is {ratio:.2f} x the reference's own rounding."
            if 1.5 < ratio <= 2.05 and spec.dtype == "bf16" and set(df["backend"]) == {"interpreter"}:
                lines[-1] += (" One whole bf16 step rather than half: in this run the kernels executed in Triton's "
                              "CPU interpreter, whose fp32-to-bf16 conversion truncates where a GPU rounds to "
                              "nearest, so a GPU run would be expected within rounding.")
        lines.append("")
    head = ("On the correctness shapes (the same inputs for every row):\n\n" if patched else "")
    return "\n".join(lines) + "\n" + head + _md_table(gdf, ["variants", "n"] + key) + gate_part


def _patch_tolerance(patched: list[VariantResult]) -> str:
    """The patches' errors, each beside the baseline's on the same inputs (the gate's secret cases), as
    fractions of the tolerance; a patch the gate has no baseline figure for says so."""
    if not patched:
        return ""
    recs = []
    for r in patched:
        g, c = r.gate, r.correctness
        pm = g.precision if g is not None else None
        recs.append({"patch": r.variant_id, "inputs": f"{g.cases} cases on {g.seeds} secret seeds" if g and g.cases else "the gate's cases",
                     "patch max err / tol": pm.candidate_max if pm else None,
                     "baseline max err / tol": pm.baseline_max if pm else None,
                     "patch RMS / tol": pm.candidate_rms if pm else None, "baseline RMS / tol": pm.baseline_rms if pm else None,
                     "patch max_abs_err": c.max_abs_err, "ok": c.ok})
    df = pd.DataFrame.from_records(recs)
    return ("\nPatches, on the gate's inputs (secret seeds: normal, uniform, large-magnitude and outlier values; hidden "
            "shapes), not the correctness shapes above: each patch's error beside the baseline's on the same inputs, as a "
            "fraction of the tolerance (1.0 = at the tolerance). `patch max_abs_err` is on those inputs too; compare it "
            "with no row above.\n\n" + _md_table(df, list(df.columns)))


def patch_section(history: list[VariantResult], verdicts: dict[str, Verdict]) -> list[str]:
    """report.md lines for the patch variants: verdict and cause, hashes, what the gate found, the diff."""
    rows = [r for r in history if r.patch]
    if not rows:
        return []
    out = ["## Patches", "",
           "Each patch went through the gate: static policy (REGRESS rejected), sandboxed compile and correctness on "
           "secret inputs (REGRESS wrong), precision against the baseline's own error (NEEDS_REVIEW precision), "
           "plausibility of its timing (NEEDS_REVIEW implausible), then the usual verdict.", ""]
    def unsettled_first(r: VariantResult) -> bool:  # what the gate saw and could not settle leads the section
        v = verdicts.get(r.variant_id)
        return not (v is not None and v.cause == "unsettled")

    for r in sorted(rows, key=unsettled_first):
        v = verdicts.get(r.variant_id)
        g = r.gate
        out += [f"### {r.variant_id}: {v.verdict if v else '-'} {(v.cause or '') if v else ''}".rstrip(), ""]
        if v and v.reasons:
            out += [f"- reason: {' '.join(v.reasons[0].split())}"]  # whole: the terminal may shorten it, the record never
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
            out += [f"- unsettled: {u.text()}" for u in g.unsettled]
            out += [f"- note: {n}" for n in g.notes[:10]]
        fence = "````" if "```" in (r.patch or "") else "```"
        out += ["", f"{fence}diff", (r.patch or "").rstrip("\n"), fence, ""]
    return out


def best_line(best: dict, spec: TaskSpec) -> str:
    if best["variant_id"] is None:
        return "Best: none (no variant is correct, feasible and timed)"
    if best["kind"] == "best":
        val = f" at {best['value']:.4g} ms ({spec.objective.aggregate} of the measured p50s, evidence {best.get('evidence')})"
        return f"Best (measured): `{best['variant_id']}`{val}"
    val = f" at {best['value']:.4g} ms ({spec.objective.aggregate} of the model's estimates, evidence {best.get('evidence')})"
    ties = best["ties"]
    tie = (f"; {len(ties)} variants tie at this estimate: {', '.join(f'`{t}`' for t in ties)}; tie-break: "
           f"{best['tie_break']}") if len(ties) > 1 else ""
    return (f"Estimated best (model evidence, not a measurement): `{best['variant_id']}`{val}{tie}. "
            "A measured best needs cuda or replay evidence.")


def _display_path(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def next_step(kind: str, spec: TaskSpec, spec_path: str, judgement: bool = False) -> str:
    """What to run to see measured verdicts, when this sweep had none ('' when it had): commands a user
    can paste, with the kregress they invoked (``$KREGRESS_COMMAND``, set by the CLI; else ``kregress``)."""
    import os

    if kind == "measured":
        return ""
    cmd = os.environ.get(COMMAND_ENV) or "kregress"
    if judgement:
        return (f"To measure the patches: on a GPU host, `{cmd} judge {_display_path(Path(spec_path))} PATCH... --backend "
                "cuda` times each beside the baseline.")
    demo = (f" Without a GPU, `{cmd} sweep {_display_path(REPLAY_DEMO_SPEC)}` shows what measured PASS / REGRESS "
            "verdicts look like on a different kernel: recorded runs of CLBlast's fp32 SGEMM on an RTX 3090 (evidence "
            f"`replay`); it says nothing about {spec.task_id}'s kernel."
            if REPLAY_DEMO_SPEC.is_file() and spec_path and Path(spec_path).resolve() != REPLAY_DEMO_SPEC.resolve() else "")
    return (f"To measure this kernel: on a GPU host, `{cmd} sweep {_display_path(Path(spec_path))} --backend cuda` "
            f"times every variant.{demo}")


def _baseline_lines(baseline: VariantResult, recorded: bool) -> list[str]:
    evidence = baseline.evidence or ("compile facts only (nothing run or timed)" if baseline.compile is not None
                                     else "none (nothing run or timed)")
    lines = [f"- config `{config_label(baseline.config)}`; backend {baseline.backend}; evidence {evidence}"]
    if baseline.error:
        lines.append(f"- error: {baseline.error} {baseline.error_detail}".rstrip())
    else:
        lines.append("- error: none" + (f"; note: {baseline.error_detail}" if baseline.error_detail else ""))
    if baseline.compile is not None:
        cs = baseline.compile
        lines.append(f"- compile for {cs.arch}: {cs.regs_per_thread} regs/thread, {cs.spill_bytes} B spills, "
                     f"{cs.smem_bytes} B shared memory, occupancy {cs.occupancy:.3g} ({cs.blocks_per_sm} block(s)/SM, "
                     f"limited by {cs.occupancy_limiter})")
    else:
        lines.append("- compile: none: recorded runs (nothing is compiled on this host)" if recorded
                     else "- compile: no compile facts (the variant did not compile, or the family wraps an external kernel)")
    if baseline.correctness is not None:
        c = baseline.correctness
        lines.append(f"- correctness: max_abs_err {c.max_abs_err:.4g}, max_rel_err {c.max_rel_err:.4g} on "
                     f"{', '.join(c.shapes_checked)}")
    else:
        lines.append("- correctness: not re-checked: recorded runs were validated when they were recorded" if recorded
                     else "- correctness: not checked")
    return lines


def narrative_origin(source: str) -> str:
    """Who wrote the narrative, in words: ``llm:<key alias>:<model>`` or ``fallback: <why>`` (the source's
    machine form, kept in the metadata) as a reader would say it."""
    if source.startswith("fallback: "):
        why = source.removeprefix("fallback: ")
        hint = "; export TAOTOKEN_API_KEY for a model's" if why.startswith("no TAOTOKEN key") else ""
        return f"written by kregress without a model ({why}{hint})"
    if source.startswith("llm:"):
        _, alias, model = (source.split(":", 2) + ["", ""])[:3]
        return f"written by {model or 'the model'} (key {alias})"
    return source


def _nonzero_cols(df: pd.DataFrame, cols: list[str]) -> list[str]:
    """``cols`` without the ones that hold nothing but zeros or blanks (e.g. GB/s of a recording with no byte count)."""
    out = []
    for c in cols:
        vals = df[c] if c in df else pd.Series(dtype=float)
        if vals.dtype.kind in "fi" and not vals.fillna(0).ne(0).any():
            continue
        out.append(c)
    return out


def conditions_lines(history: list[VariantResult], kind: str) -> list[str]:
    locked = sorted({m.clocks_locked for r in history for m in r.measurements if m.clocks_locked})
    devices = sorted({f"{m.gpu_name or m.device} {m.gpu_uuid}".strip() + (f" on {m.host}" if m.host else "")
                      for r in history for m in r.measurements if m.evidence in MEASURED_EVIDENCE})
    batches = sorted({m.batch for r in history for m in r.measurements if m.batch})
    evidence = {m.evidence for r in history for m in r.measurements}
    if kind == "model":
        return ["- devices: none: nothing was timed (every latency is a model estimate)",
                "- batches: none (nothing was timed)", "- clock locking: not applicable"]
    if not evidence:  # compile facts only, or nothing at all: no latency of any kind
        return [f"- devices: none: nothing was run or timed{' (compile facts only)' if kind == 'compile' else ''}",
                "- batches: none (nothing was timed)", "- clock locking: not applicable"]
    if evidence <= {"replay"}:
        return [f"- devices: {', '.join(devices) or 'unknown'} (as recorded in the file)",
                f"- batches: {len(batches)} replay batch(es): recorded data, nothing was timed here; each batch draws "
                "the baseline's recorded runs again for the variants it compares",
                "- clock locking: unknown (not recorded)"]
    return [f"- devices: {', '.join(devices) or 'none'}",
            f"- batches: {len(batches)} ({'the baseline re-timed in each batch, interleaved with its variants' if batches else 'no same-batch timing'})",
            f"- clock locking: {'; '.join(locked) if locked else 'off'}"]


def write_report(out_dir: Path, spec: TaskSpec, spec_path: str, state, verdicts: dict[str, Verdict],
                 param_names: list[str], narrative: str = "", narrative_source: str = "",
                 token_table: pd.DataFrame | None = None, extra_sections: list[tuple[str, str]] = (),
                 family=None, judgement: bool = False) -> dict:
    """Write report.md (titled "kregress sweep", or "kregress judge" for a ``judgement``), variants.parquet, verdicts.parquet, verdicts_by_shape.parquet, measurements.parquet
    and latency.png. Returns counts, causes, the summary line, the best-variant record, the evidence kind,
    what to run next for measured verdicts, and the frames."""
    from kernel_assets.sweep import best_measured, cause_counts, summary_line
    from kregress.core.family import get_family

    if family is None:
        family = get_family(spec.kernel_family).for_params(spec.params)
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
    rg = spec.regression_guard
    kind = evidence_of(state.history)
    recorded = family.kind == "recorded"
    shapes = [m.shape for m in baseline.measurements]
    follow = next_step(kind, spec, spec_path, judgement=judgement)
    lat = latency_label(kind)

    lines = [f"# {'kregress judge' if judgement else 'kregress sweep'}: {spec.task_id}", ""]
    if spec.description:
        lines += [spec.description, ""]
    lines += ["## Verdicts", "", f"**{line}** (of {len(verdict_df)} variants)", ""]
    if kind == "model":
        lines += ["**Evidence: `model`.** This host timed nothing: every latency below is an analytic estimate "
                  "from the variant's real compile facts, not a measurement, so no variant can PASS or REGRESS "
                  "on speed here; those that compiled, fit the limits and match the reference are NEEDS_REVIEW. "
                  "REGRESS verdicts (did not compile, over a limit, wrong numbers) are real. " + follow, ""]
    elif kind == "compile":
        lines += [compile_only_text(state.history, spec.hardware.arch) + " " + follow, ""]
    elif kind == "none":
        lines += ["**Nothing was timed**: no variant has a latency. " + follow, ""]
    ran = state.round  # the last round that ran (a skipped round passes the state on unchanged)
    skipped = (f"; rounds {ran + 1}-{MAX_GRAPH_ROUNDS} did not run (their assets are materialized marked skipped)"
               if ran + 1 < MAX_GRAPH_ROUNDS else f"; round {MAX_GRAPH_ROUNDS} did not run (its assets are "
               "materialized marked skipped)" if ran + 1 == MAX_GRAPH_ROUNDS else "")
    near = ""
    if kind == "model" and best["variant_id"] is not None:
        group = next((ids for ids, _ in _near_ties(variants, param_names) if best["variant_id"] in ids), [])
        others = [i for i in group if i not in best["ties"]]
        if others:
            near = (f" Within {NEAR_TIE:.0%} of it: {', '.join(f'`{i}`' for i in others)}; the model cannot rank "
                    "these (see \"How the estimates are made\").")
    lines += [best_line(best, spec) + near, ""]
    if not judgement:  # a judgement runs no rounds: nothing stopped and nothing was skipped
        lines += [f"Stopped: {state.stopped or 'not stopped'}{skipped}", ""]
    if kind == "measured":
        lines += [
            "PASS means *not worse than the guard* (x" + f"{guard:g}" + ", the interval entirely below it), not "
            "faster: the `measured vs baseline` column says by how much, with its interval.", "",
            f"Latency rule: per shape, the shift of the log times (variant vs the baseline samples of the same batch) "
            f"with its {rg.confidence:g} interval: the cluster-aligned likelihood shift and interval where the timings "
            "sit in tight clusters ('aligned shift ratio' in the reasons), else the Hodges-Lehmann shift with its "
            "distribution-free interval; REGRESS/slower when the shift is "
            f"above the guard {guard:g} and the interval lies above {1 + MIN_SHIFT:g}, PASS when the interval lies "
            "below the guard, "
            f"NEEDS_REVIEW otherwise or below {rg.min_samples} samples a side. A variant is REGRESS/slower if any "
            "shape is; `worst_shape` names it.", ""]
    lines += ["Evidence rule: PASS/REGRESS on latency needs `cuda` or `replay` evidence; `model` latencies give "
              "NEEDS_REVIEW. Correctness, NaN/Inf and constraint failures are real on every backend and give REGRESS "
              "with a cause: `infeasible` (did not compile, out of resources, spills or registers over the limit), "
              "`wrong` (numerics, NaN/Inf), `crashed` (the variant's process died or its call raised), `rejected` (a "
              "patch the gate refused) or `slower`.", ""]
    view, vcols, vheads = verdict_view(verdict_df, verdicts, kind)
    lines += [RATIO_NOTE + (" The `ratio` column is the same number: variant time / baseline time (above 1 is slower)."
                            if "ratio" in vcols else ""), "",
              _md_table(view, vcols, headers=vheads),
              "![each variant's time relative to the baseline](latency.png)", "",
              "## Per shape", "", per_shape_section(by_shape, kind, shapes)]
    if kind == "model":
        lines += ["## How the estimates are made", "", model_section(family, variants, param_names)]
    lines += ["## Measurement conditions", "", *conditions_lines(state.history, kind), "",
              "## Tolerance", "", tolerance_section(spec, state.history)]
    constraints = ("not checked: recorded runs carry no compile facts (registers, spills, shared memory)" if recorded
                   else str(spec.constraints.model_dump()))
    lines += [
        "## Spec", "",
        f"- file: `{spec_path}`; content hash `{spec.content_hash()}`",
        f"- family `{spec.kernel_family}`, dtype {spec.dtype}, target {spec.hardware.device} ({spec.hardware.arch})",
        f"- shape_matrix: {', '.join(map(str, spec.shape_matrix))}",
        f"- correctness_shapes: {', '.join(map(str, spec.correctness_shapes))}" + (" (not run: recorded runs)" if recorded else ""),
        f"- constraints: {constraints}",
        f"- regression guard: {rg.model_dump()}",
        f"- search: {spec.search.model_dump()}", "",
        "## Baseline", "", *_baseline_lines(baseline, recorded), "",
    ]
    est = {"tflops": "est_tflops", "gbps": "est_gbps"} if kind == "model" else {}  # derived from the estimate
    bmeas = meas[meas["variant_id"] == baseline.variant_id].rename(columns={"p50_ms": lat, **est})
    bcols = (["shape", "p20_ms", lat, "p80_ms"] if baseline.evidence in MEASURED_EVIDENCE else ["shape", lat])
    rates = _nonzero_cols(bmeas, [est.get("tflops", "tflops"), est.get("gbps", "gbps")])
    lines += [_md_table(bmeas, bcols + rates + ["evidence", "device"]), "## Rounds", ""]
    if len(shapes) > 1:
        lines += [f"`{lat}` below is the geometric mean of the variant's {len(shapes)} per-shape "
                  f"{'estimates' if kind == 'model' else 'p50s'} (each shape's value: the Per shape section).", ""]
    for rnd in sorted(set(variants["round"]) - {0}):
        sub = variants[variants["round"] == rnd].rename(columns={"latency_p50_ms": lat})
        cols = ["variant_id", "source", "config_label", "patch_summary", "expected_effect", "risk", lat]
        cols += [] if recorded else ["regs_per_thread", "smem_bytes", "occupancy"]
        cols += [c for c in ("error", "verdict", "cause") if c == "verdict" or sub[c].notna().any()]
        lines += [f"### Round {rnd}", "", _md_table(sub, cols)]
    lines += patch_section(state.history, verdicts)
    from kernel_assets.sweep import constraint_violations

    failed = [f"- {r.variant_id} [{config_label(r.config)}]: **{r.error}**: {' '.join(r.error_detail.split())}"
              for r in state.history if r.error]
    failed += [f"- {r.variant_id} [{config_label(r.config)}]: **over a constraint**: {'; '.join(v)}"
               for r in state.history if not r.error and (v := constraint_violations(r, spec))]
    lines += ["## Failures", ""]
    lines += failed or ["_none_"]
    lines += ["", "## Dropped proposals", ""]
    lines += [f"- round {d.round} ({d.source}): {d.reason}: `{d.raw[:160]}`" for d in state.dropped] or ["_none_"]
    if state.notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in state.notes]
    # Sections other modules add (baseline vs history, forecasts): each a (title, markdown) pair.
    for title, text in extra_sections:
        lines += ["", f"## {title}", "", text]
    if narrative:
        lines += ["", "## Narrative", "", f"_{narrative_origin(narrative_source)}_", "", narrative]
    if token_table is not None and len(token_table):
        lines += ["", "## Tokens", "", _md_table(token_table, list(token_table.columns))]
    lines += ["", "## Files", "", "- `variants.parquet` (every row, baseline first; `latency_p50_ms` is the geometric "
              "mean over the shapes, of the model's estimates where `evidence` is model, as `latency_aggregate` says; "
              "`measurements.parquet` has each shape, with `samples` 0 for an estimate), `verdicts.parquet` (variants with verdicts and causes), "
              "`verdicts_by_shape.parquet` (a verdict per variant per shape), `measurements.parquet` (per shape, with "
              "device identity and batch), `latency.png`"]
    (out_dir / "report.md").write_text("\n".join(lines) + "\n")
    return {"counts": counts, "causes": causes, "summary_line": line, "best": best, "variants": variants,
            "verdicts": verdict_df, "verdicts_by_shape": by_shape, "measurements": meas, "png": png,
            "evidence": kind, "next_step": follow, "verdict_view": (view, vcols, vheads)}
