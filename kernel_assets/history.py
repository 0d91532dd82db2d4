"""Sweep history: append-only Parquet, and today's baseline against the last accepted one.

Layout: ``$DAGSTER_HOME/kregress_history/task=<t>/dev=<d>/date=<YYYY-MM-DD>/<run_id>.parquet``
(hive partitions, read with pyarrow.dataset). Each file holds one sweep's rows: the baseline and every
variant with its verdict and raw samples, with the GPU model, driver, torch/Triton versions, host and GPU
UUID. Nothing is ever rewritten; acknowledgements of a known step change live beside it in ``acks.jsonl``.

A baseline is compared only with earlier baselines of the same task and hardware-and-toolchain identity (GPU
model, driver, torch and Triton versions) that were *accepted* (their own comparison was not REGRESS, or a
person acknowledged them), and never across an acknowledged step: after an ack, the acknowledged sweep is
the new reference.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from kregress.core import paths, stats
from kregress.core.records import VariantResult, Verdict
from kregress.core.spec import TaskSpec


def history_root(home: Path | None = None) -> Path:
    return Path(home) / "kregress_history" if home else paths.history_dir()


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)[:80] or "unknown"


# A sweep is compared only with sweeps of the same hardware-and-toolchain identity: the GPU model, the driver
# and the torch and Triton versions (and the evidence kind). The host and the GPU's UUID are kept in every
# row, to say where a sweep ran, but do not split the history: a nightly sweep lands on any GPU of the model.
IDENTITY_KEYS = ("device", "driver", "torch_version", "triton_version")


def _identity(row: VariantResult) -> dict[str, str]:
    m = row.measurements[0] if row.measurements else None
    return {
        "device": (m.gpu_name or m.device) if m else "none",
        "driver": m.driver if m else "",
        "torch_version": m.torch_version if m else "",
        "triton_version": m.triton_version if m else "",
        "host": m.host if m else "",
        "gpu_uuid": m.gpu_uuid if m else "",
    }


def identity_text(ident) -> str:
    """``NVIDIA H100 80GB HBM3, driver 550.54, torch 2.13.0, triton 3.9.0`` (unknown parts shown as ?)."""
    return (f"{ident['device'] or '?'}, driver {ident.get('driver') or '?'}, torch {ident['torch_version'] or '?'}, "
            f"triton {ident['triton_version'] or '?'}")


def append_sweep(spec: TaskSpec, run_id: str, history: list[VariantResult], verdicts: dict[str, Verdict],
                 baseline_verdict: str, home: Path | None = None) -> Path:
    """Write one sweep's rows (append-only); returns the file written."""
    baseline = history[0]
    ident = _identity(baseline)
    now = datetime.now(timezone.utc)
    recs = []
    for r in history:
        v = verdicts.get(r.variant_id)
        recs.append({
            "run_id": run_id, "ts": now.timestamp(), "task_id": spec.task_id, "spec_hash": spec.content_hash(),
            "variant_id": r.variant_id, "round": r.round, "config_hash": r.config_hash, "config": json.dumps(r.config),
            "is_baseline": r.round == 0, "error": r.error or "", "evidence": r.evidence or "",
            "verdict": (baseline_verdict if r.round == 0 else (v.verdict if v else "")),
            "ratio": v.ratio if v else None,
            "p50_ms": [m.p50_ms for m in r.measurements], "shapes": [m.shape for m in r.measurements],
            "samples_ms": [m.samples_ms for m in r.measurements], **ident,
        })
    table = pa.Table.from_pylist(recs)
    # Partition directories use their own names (task, dev) so they never shadow the exact columns.
    out = (history_root(home) / f"task={_safe(spec.task_id)}" / f"dev={_safe(ident['device'])}"
           / f"date={now:%Y-%m-%d}" / f"{_safe(run_id)}.parquet")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    pq.write_table(table, tmp)
    tmp.replace(out)
    return out


def load(task_id: str | None = None, home: Path | None = None) -> pd.DataFrame:
    root = history_root(home)
    if not root.exists() or not any(root.rglob("*.parquet")):
        return pd.DataFrame()
    dataset = ds.dataset(str(root), format="parquet", partitioning="hive", exclude_invalid_files=True)
    # Files written before a column existed (driver, host, gpu_uuid) lack it: read every file with the union of
    # their schemas, else the first file's schema would decide which columns exist.
    schemas = [f.physical_schema for f in dataset.get_fragments()]
    if schemas:
        merged = pa.unify_schemas(schemas + [dataset.partitioning.schema] if dataset.partitioning else schemas)
        dataset = ds.dataset(str(root), format="parquet", partitioning="hive", exclude_invalid_files=True, schema=merged)
    flt = (ds.field("task") == _safe(task_id)) if task_id else None
    df = dataset.to_table(filter=flt).to_pandas()
    for col in IDENTITY_KEYS:
        df[col] = df[col].fillna("") if col in df else ""
    return df.sort_values("ts").reset_index(drop=True)


# --- acknowledgements ------------------------------------------------------------------------


def _acks_path(home: Path | None = None) -> Path:
    return history_root(home) / "acks.jsonl"


def acknowledge(task_id: str, who: str, why: str, run_id: str | None = None, home: Path | None = None) -> dict:
    """Accept the sweep ``run_id`` (default: the latest of the task) as the new reference baseline."""
    if not who.strip() or not why.strip():
        raise ValueError("an acknowledgement needs who (--by) and why (--why)")
    df = load(task_id, home)
    if df.empty:
        raise ValueError(f"no history for task {task_id!r} under {history_root(home)}")
    runs = df[df["is_baseline"]]
    if run_id is None:
        run_id = str(runs.iloc[-1]["run_id"])
    elif run_id not in set(runs["run_id"]):
        raise ValueError(f"run {run_id!r} is not in the history of {task_id!r}; known: {', '.join(runs['run_id'][-5:])}")
    ack = {"task_id": task_id, "run_id": run_id, "by": who.strip(), "why": why.strip(), "ts": time.time()}
    p = _acks_path(home)
    p.parent.mkdir(parents=True, exist_ok=True)
    with open(p, "a") as f:  # append-only, one line per acknowledgement
        f.write(json.dumps(ack) + "\n")
        f.flush()
        os.fsync(f.fileno())
    return ack


def acks(task_id: str | None = None, home: Path | None = None) -> list[dict]:
    p = _acks_path(home)
    if not p.exists():
        return []
    out = [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
    return [a for a in out if task_id is None or a["task_id"] == task_id]


# --- comparison ------------------------------------------------------------------------------


@dataclass
class HistoryComparison:
    verdict: str  # PASS / REGRESS / NEEDS_REVIEW / NO_HISTORY
    reason: str
    reference_run: str | None = None
    ratio: float | None = None
    low: float | None = None
    high: float | None = None


def compare_baseline(spec: TaskSpec, baseline: VariantResult, home: Path | None = None) -> HistoryComparison:
    """Today's baseline against the last accepted one on the same device and versions."""
    if baseline.error or not baseline.measurements:
        return HistoryComparison("NEEDS_REVIEW", "today's baseline has no timing to compare")
    ident = _identity(baseline)
    df = load(spec.task_id, home)
    if df.empty:
        return HistoryComparison("NO_HISTORY", "first sweep of this task: nothing to compare with")
    same = df["is_baseline"] & (df["evidence"] == (baseline.evidence or ""))
    for key in IDENTITY_KEYS:  # only within one hardware-and-toolchain identity
        same &= df[key] == ident[key]
    base = df[same]
    task_acks = acks(spec.task_id, home)
    if task_acks:  # never mix distributions across an acknowledged step
        last_ack = task_acks[-1]
        ack_rows = df[df["run_id"] == last_ack["run_id"]]
        if len(ack_rows):
            base = base[base["ts"] >= ack_rows["ts"].min()]
    accepted = base[base["verdict"].isin(["PASS", "NO_HISTORY", "ACKNOWLEDGED"]) |
                    base["run_id"].isin({a["run_id"] for a in task_acks})]
    if accepted.empty:
        return HistoryComparison("NO_HISTORY", f"no accepted baseline on {identity_text(ident)}")
    ref = accepted.iloc[-1]
    ref_samples = [list(s) for s in ref["samples_ms"]]
    today = [m.samples_ms for m in baseline.measurements]
    if [m.shape for m in baseline.measurements] != list(ref["shapes"]):
        return HistoryComparison("NEEDS_REVIEW", "the shape matrix changed since the reference sweep", str(ref["run_id"]))
    if baseline.evidence not in ("cuda", "replay"):
        ratio = stats.p50_ratio(today, ref_samples)
        return HistoryComparison("NEEDS_REVIEW", f"p50 ratio {ratio:.3f} vs {ref['run_id'][:8]} on evidence="
                                 f"{baseline.evidence}: a latency verdict needs cuda or replay evidence",
                                 str(ref["run_id"]), ratio)
    ci = stats.ratio_ci(today, ref_samples, confidence=spec.regression_guard.confidence, seed=spec.search.seed)
    verdict, reason = stats.classify(ci, guard=spec.regression_guard.not_worse_than_baseline_ratio,
                                     min_samples=spec.regression_guard.min_samples)
    return HistoryComparison(verdict, f"vs accepted baseline of run {ref['run_id'][:8]}: {reason}", str(ref["run_id"]),
                             ci.ratio, ci.low, ci.high)


# --- display ---------------------------------------------------------------------------------


def tasks(home: Path | None = None) -> list[str]:
    """Task ids with at least one recorded sweep (as their partition folders name them)."""
    root = history_root(home)
    return sorted(p.name.removeprefix("task=") for p in root.glob("task=*") if p.is_dir()) if root.exists() else []


def show(task_id: str, home: Path | None = None) -> str:
    """The baselines recorded for a task as a table: one row per sweep, one column per shape, each column
    labelled with its shape (``p50 ms 4096x4096x4096``); a shape a sweep did not time shows ``-``. A model
    estimate is never shown as a p50: columns of estimates say ``est ms``, and in a mixed column each
    estimate is marked ``(est)``. Raises LookupError when the task has no recorded sweep."""
    df = load(task_id, home)
    if df.empty:
        known = tasks(home)
        raise LookupError(f"no history for {task_id} under {history_root(home)}; "
                          + (f"tasks with history: {', '.join(known)}" if known else
                             "no sweep is recorded yet (kregress sweep SPEC appends one)"))
    base = df[df["is_baseline"]]
    labels: list[str] = []
    for shapes in base["shapes"]:
        for s in shapes:
            if str(s) not in labels:
                labels.append(str(s))
    model = base["evidence"].eq("model")
    unit = "est ms" if model.all() else "p50 ms" if not model.any() else "ms"
    rows = []
    for _, r in base.iterrows():
        p50 = {str(s): p for s, p in zip(r["shapes"], r["p50_ms"])}
        mark = " (est)" if unit == "ms" and r["evidence"] == "model" else ""
        rows.append({
            "run_id": str(r["run_id"])[:8], "ts": time.strftime("%Y-%m-%d %H:%M", time.gmtime(r["ts"])),
            "device": r["device"], "torch": r["torch_version"], "triton": r["triton_version"],
            "evidence": r["evidence"], "verdict": r["verdict"],
            **{f"{unit} {lab}": (f"{p50[lab]:.4g}{mark}" if lab in p50 else "-") for lab in labels},
        })
    text = pd.DataFrame(rows).to_string(index=False)
    if model.any():
        text += ("\nevidence model: the family's analytic estimate from real compile facts, not a measured p50 "
                 "(a sweep on a GPU or from recorded runs adds measured rows)")
    return text
