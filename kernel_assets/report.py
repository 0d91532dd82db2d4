"""The sweep's outputs: report.md for people, Parquet tables for tools, plots for both."""

from __future__ import annotations

import base64
import io
import math
from pathlib import Path

import pandas as pd

from kregress.core.records import Verdict, VariantResult, config_label
from kregress.core.spec import TaskSpec

COLUMNS = [
    "variant_id", "round", "source", "config_label", "error", "error_detail", "latency_p50_ms", "latency_p20_ms",
    "latency_p80_ms", "tflops", "gbps", "regs_per_thread", "spill_bytes", "smem_bytes", "occupancy",
    "occupancy_limiter", "max_abs_err", "max_rel_err", "verdict", "ratio", "ratio_ci_low", "ratio_ci_high",
    "evidence", "reasons", "patch_summary", "expected_effect", "risk", "parent", "config_hash",
]


def _geomean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x and x > 0]
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
        "verdict": verdict.verdict if verdict else ("BASELINE" if row.round == 0 else None),
        "ratio": verdict.ratio if verdict else None,
        "ratio_ci_low": verdict.ratio_ci_low if verdict else None,
        "ratio_ci_high": verdict.ratio_ci_high if verdict else None,
        "evidence": row.evidence,
        "reasons": "; ".join(verdict.reasons) if verdict else "",
        "patch_summary": row.patch_summary, "expected_effect": row.expected_effect, "risk": row.risk,
        "parent": row.parent, "config_hash": row.config_hash,
    }
    for p in param_names:
        rec[p] = row.config.get(p)
    return rec


def tables(history: list[VariantResult], verdicts: dict[str, Verdict], param_names: list[str]) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(variants, verdicts, measurements) frames; config parameters are columns of their own."""
    recs = [row_record(r, verdicts.get(r.variant_id), param_names) for r in history]
    cols = COLUMNS[:4] + param_names + COLUMNS[4:]
    variants = pd.DataFrame.from_records(recs, columns=cols)
    verdict_df = variants[variants["round"] > 0].reset_index(drop=True)
    meas = pd.DataFrame.from_records(
        [
            {"variant_id": r.variant_id, "round": r.round, "shape": m.shape, "p20_ms": m.p20_ms, "p50_ms": m.p50_ms,
             "p80_ms": m.p80_ms, "tflops": m.tflops, "gbps": m.gbps, "samples": len(m.samples_ms), "evidence": m.evidence,
             "device": m.device, "torch_version": m.torch_version, "triton_version": m.triton_version}
            for r in history for m in r.measurements
        ],
        columns=["variant_id", "round", "shape", "p20_ms", "p50_ms", "p80_ms", "tflops", "gbps", "samples", "evidence",
                 "device", "torch_version", "triton_version"],
    )
    return variants, verdict_df, meas


VERDICT_COLORS = {"PASS": "#2e7d32", "REGRESS": "#c62828", "NEEDS_REVIEW": "#f9a825", "BASELINE": "#1565c0"}


def latency_plot(variants: pd.DataFrame, title: str) -> bytes:
    """p50 (with p20-p80 bars) per variant, coloured by verdict; the baseline is the dashed line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    df = variants.dropna(subset=["latency_p50_ms"]).reset_index(drop=True)
    fig, ax = plt.subplots(figsize=(max(6, 0.35 * len(df) + 2), 3.6), dpi=110)
    if len(df):
        colors = [VERDICT_COLORS.get(v, "#777") for v in df["verdict"].fillna("")]
        yerr = [df["latency_p50_ms"] - df["latency_p20_ms"], df["latency_p80_ms"] - df["latency_p50_ms"]]
        ax.bar(range(len(df)), df["latency_p50_ms"], color=colors, yerr=yerr, capsize=2)
        ax.set_xticks(range(len(df)))
        ax.set_xticklabels(df["variant_id"], rotation=70, fontsize=7)
        base = df[df["round"] == 0]["latency_p50_ms"]
        if len(base):
            ax.axhline(float(base.iloc[0]), ls="--", color=VERDICT_COLORS["BASELINE"], lw=1)
    ev = ",".join(sorted(set(variants["evidence"].dropna()))) or "none"
    ax.set_ylabel("p50 latency, ms (geomean over shapes)")
    ax.set_title(f"{title} (evidence: {ev})", fontsize=9)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in VERDICT_COLORS.values()]
    ax.legend(handles, VERDICT_COLORS.keys(), fontsize=7, loc="upper right")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


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


def write_report(out_dir: Path, spec: TaskSpec, spec_path: str, state, verdicts: dict[str, Verdict],
                 param_names: list[str], narrative: str = "", narrative_source: str = "",
                 token_table: pd.DataFrame | None = None, extra_sections: list[tuple[str, str]] = ()) -> dict:
    """Write report.md, variants.parquet, verdicts.parquet, measurements.parquet and latency.png."""
    out_dir.mkdir(parents=True, exist_ok=True)
    variants, verdict_df, meas = tables(state.history, verdicts, param_names)
    variants.to_parquet(out_dir / "variants.parquet", index=False)
    verdict_df.to_parquet(out_dir / "verdicts.parquet", index=False)
    meas.to_parquet(out_dir / "measurements.parquet", index=False)
    png = latency_plot(variants, spec.task_id)
    (out_dir / "latency.png").write_bytes(png)
    counts = verdict_df["verdict"].value_counts().to_dict() if len(verdict_df) else {}
    baseline = state.history[0]
    b = variants.iloc[0]

    lines = [f"# kregress sweep: {spec.task_id}", ""]
    if spec.description:
        lines += [spec.description, ""]
    lines += [
        "## Verdicts", "",
        " / ".join(f"**{k}** {counts.get(k, 0)}" for k in ("PASS", "REGRESS", "NEEDS_REVIEW")) + f" (of {len(verdict_df)} variants)", "",
        f"Best: `{state.best_id}`" + (f" at {state.best_value:.4g} ms ({spec.objective.aggregate} p50)" if state.best_value else ""),
        f"Stopped: {state.stopped or 'not stopped'}", "",
        "Evidence rule: PASS/REGRESS on latency needs `cuda` or `replay` evidence; `model` latencies are analytic "
        "estimates from real compile stats and give NEEDS_REVIEW. Correctness, NaN/Inf and constraint failures are real on "
        "every backend and give REGRESS.", "",
        _md_table(verdict_df, ["variant_id", "round", "source", "config_label", "verdict", "ratio", "ratio_ci_low",
                               "ratio_ci_high", "evidence", "reasons"]),
        "![p50 latency per variant](latency.png)", "",
        "## Spec", "",
        f"- file: `{spec_path}`; content hash `{spec.content_hash()}`",
        f"- family `{spec.kernel_family}`, dtype {spec.dtype}, target {spec.hardware.device} ({spec.hardware.arch})",
        f"- shape_matrix: {', '.join(map(str, spec.shape_matrix))}",
        f"- correctness_shapes: {', '.join(map(str, spec.correctness_shapes))}",
        f"- constraints: {spec.constraints.model_dump()}",
        f"- regression guard: {spec.regression_guard.model_dump()}",
        f"- search: {spec.search.model_dump()}", "",
        "## Baseline", "",
        f"- config `{config_label(baseline.config)}`; backend {baseline.backend}; evidence {baseline.evidence}",
        f"- error: {baseline.error or 'none'} {baseline.error_detail}",
        f"- compile: {b['regs_per_thread']} regs/thread, {b['spill_bytes']} B spills, {b['smem_bytes']} B smem, "
        f"occupancy {b['occupancy']} (limited by {b['occupancy_limiter']})",
        f"- correctness: max_abs_err {b['max_abs_err']}, max_rel_err {b['max_rel_err']} on "
        f"{', '.join(baseline.correctness.shapes_checked) if baseline.correctness else '-'}", "",
        _md_table(meas[meas["variant_id"] == baseline.variant_id], ["shape", "p20_ms", "p50_ms", "p80_ms", "tflops", "gbps", "evidence", "device"]),
        "## Rounds", "",
    ]
    for rnd in sorted(set(variants["round"]) - {0}):
        sub = variants[variants["round"] == rnd]
        lines += [f"### Round {rnd}", "",
                  _md_table(sub, ["variant_id", "source", "config_label", "patch_summary", "expected_effect", "risk",
                                  "latency_p50_ms", "regs_per_thread", "smem_bytes", "occupancy", "error", "verdict"])]
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
    lines += ["", "## Files", "", "- `variants.parquet` (every row, baseline first), `verdicts.parquet` (variants with verdicts), "
              "`measurements.parquet` (per shape), `latency.png`"]
    (out_dir / "report.md").write_text("\n".join(lines) + "\n")
    return {"counts": counts, "variants": variants, "verdicts": verdict_df, "measurements": meas, "png": png}
