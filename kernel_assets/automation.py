"""Nightly regression sweeps and the spec sensor (change-driven re-runs).

- ``nightly_sweeps``: every partition (spec) once a night; cron from KREGRESS_NIGHTLY_CRON
  (default 02:00 UTC).
- ``spec_sensor``: watches the specs directory. Added specs add a partition and run; changed specs
  (content hash) re-run; removed specs drop their partition. It also keeps each kernel family's source
  hash, so a change to ``kernels/<family>.py`` re-runs just the partitions of that family (the assets'
  code_version changes too, so the UI shows them stale). The cursor is JSON.

Both are OFF by default: opening the UI (``dagster dev``) starts no work. Turn them on in the UI
(Automation -> toggle) or with ``dagster schedule start nightly_sweeps`` / ``dagster sensor start spec_sensor``.
Even when on, the sensor never re-runs a spec whose current content hash and family kernel hash were
already swept by anyone (a CLI sweep counts): it reads the ``spec_hash`` and ``kernel_hash`` metadata of
``baseline_metrics``'s latest materialization for the partition, not only its own cursor.
"""

from __future__ import annotations

import json
import os

import dagster as dg

from kernel_assets.constants import SPECS_PARTITIONS
from kernel_assets.specs_resource import SpecStore
from kregress.core.bind import load_bound
from kregress.core.family import get_family
from kregress.core.spec import SpecError

DEFAULT_CRON = "0 2 * * *"


def nightly_cron() -> str:
    return os.environ.get("KREGRESS_NIGHTLY_CRON", DEFAULT_CRON)


def build_automation(job) -> tuple[list, list]:
    """(schedules, sensors) for the sweep job."""

    @dg.schedule(job=job, cron_schedule=nightly_cron(), execution_timezone="UTC",
                 description="Re-run every spec's sweep once a night (KREGRESS_NIGHTLY_CRON).")
    def nightly_sweeps(context: dg.ScheduleEvaluationContext):
        day = context.scheduled_execution_time.strftime("%Y-%m-%d")
        keys = context.instance.get_dynamic_partitions(SPECS_PARTITIONS.name)
        if not keys:
            return dg.SkipReason("no spec partitions yet: the spec_sensor adds them from the specs directory")
        return [dg.RunRequest(run_key=f"nightly-{day}-{k}", partition_key=k, tags={"kregress/trigger": "nightly"})
                for k in sorted(keys)]

    @dg.sensor(job=job, minimum_interval_seconds=60, default_status=dg.DefaultSensorStatus.STOPPED,
               description="Adds, re-runs and removes spec partitions when spec files or kernel sources change.")
    def spec_sensor(context: dg.SensorEvaluationContext):
        return evaluate_specs(context.cursor, context.instance, SpecStore(), context.log)

    return [nightly_sweeps], [spec_sensor]


def evaluate_specs(cursor: str | None, instance, store: SpecStore, log=None) -> dg.SensorResult:
    """The sensor's logic, separate so it can be tested with a real instance and a temp directory."""
    state = json.loads(cursor) if cursor else {"specs": {}, "families": {}}
    seen_specs: dict[str, str] = {}
    families: dict[str, str] = {}
    spec_family: dict[str, str] = {}
    invalid = []
    for task_id, path in sorted(store.paths().items()):
        try:
            bound = load_bound(path)  # the family bound to the spec's params (a recorded file: that file)
        except SpecError as exc:
            invalid.append(str(exc).splitlines()[0])
            continue
        spec = bound.spec
        seen_specs[task_id] = bound.spec_hash
        key = spec.kernel_family if bound.family is get_family(spec.kernel_family) else \
            f"{spec.kernel_family}:{json.dumps(spec.params, sort_keys=True)}"
        spec_family[task_id] = key
        families.setdefault(key, bound.kernel_hash)
    existing = set(instance.get_dynamic_partitions(SPECS_PARTITIONS.name))
    added = sorted(set(seen_specs) - existing)
    removed = sorted(existing - set(seen_specs))
    runs = []
    for task_id, h in seen_specs.items():
        old = state["specs"].get(task_id)
        fam = spec_family[task_id]
        fam_changed = fam in state["families"] and state["families"][fam] != families[fam]
        if old is None:
            why = "new spec"
        elif old != h:
            why = "spec changed"
        elif fam_changed:
            why = f"kernel source of {fam} changed"
        else:
            continue
        done = last_sweep_of(instance, task_id)
        if done is not None and done[0] == h and done[1] == families[fam]:
            if log is not None:
                log.info(f"{task_id}: {why}, but run {done[2]} already swept spec hash {h} with this kernel code: "
                         "not re-run")
            continue
        runs.append(dg.RunRequest(run_key=f"{task_id}-{h}-{families[fam]}", partition_key=task_id,
                                  tags={"kregress/trigger": why, "kregress/spec_hash": h}))
    if log is not None:
        for line in invalid:
            log.warning(f"spec skipped: {line}")
    requests = []
    if added:
        requests.append(SPECS_PARTITIONS.build_add_request(added))
    if removed:
        requests.append(SPECS_PARTITIONS.build_delete_request(removed))
    new_cursor = json.dumps({"specs": seen_specs, "families": {**state["families"], **families}}, sort_keys=True)
    return dg.SensorResult(run_requests=runs, dynamic_partitions_requests=requests, cursor=new_cursor)


def last_sweep_of(instance, task_id: str) -> tuple[str, str, str] | None:
    """(spec_hash, kernel_hash, run_id) of the latest ``baseline_metrics`` materialization of a partition,
    whoever launched it (CLI, UI, schedule); None when it was never materialized. ``kernel_hash`` is the
    swept family's own source hash (a plugin installed beside it changes nothing for this spec)."""
    result = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey("baseline_metrics"), asset_partitions=[task_id]), limit=1)
    if not result.records:
        return None
    rec = result.records[0]
    mat = rec.asset_materialization
    if mat is None:
        return None
    spec_hash = mat.metadata.get("spec_hash")
    spec_hash = getattr(spec_hash, "value", getattr(spec_hash, "text", spec_hash))
    kernel_hash = mat.metadata.get("kernel_hash")
    kernel_hash = getattr(kernel_hash, "value", getattr(kernel_hash, "text", kernel_hash))
    return str(spec_hash or ""), str(kernel_hash or ""), rec.run_id
