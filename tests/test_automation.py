"""Nightly schedule and the spec sensor, against a real instance and a temp specs directory."""

from __future__ import annotations

import json
import shutil
from datetime import datetime, timezone
from pathlib import Path

import dagster as dg
import yaml

from kernel_assets.automation import evaluate_specs
from kernel_assets.constants import SPECS_PARTITIONS
from kernel_assets.specs_resource import SpecStore

REPO = Path(__file__).resolve().parent.parent


def apply(instance, result):
    for req in result.dynamic_partitions_requests:
        if isinstance(req, dg.AddDynamicPartitionsRequest):
            instance.add_dynamic_partitions(req.partitions_def_name, list(req.partition_keys))
        else:
            for k in req.partition_keys:
                instance.delete_dynamic_partition(req.partitions_def_name, k)


def test_spec_sensor_adds_changes_removes(tmp_path):
    specs = tmp_path / "specs"
    specs.mkdir()
    shutil.copy(REPO / "specs" / "gemm_smoke.yaml", specs)
    shutil.copy(REPO / "specs" / "replay_clblast_rtx3090.yaml", specs)
    (specs / "broken.yaml").write_text("task_id: broken\nkernel_family: nope\n")
    store = SpecStore(specs_dir=str(specs), extra_files=[])
    with dg.DagsterInstance.ephemeral() as instance:
        r1 = evaluate_specs(None, instance, store)
        assert sorted(r.partition_key for r in r1.run_requests) == ["gemm_smoke", "replay_clblast_rtx3090"]
        assert {r.tags["kregress/trigger"] for r in r1.run_requests} == {"new spec"}
        apply(instance, r1)
        assert set(instance.get_dynamic_partitions(SPECS_PARTITIONS.name)) == {"gemm_smoke", "replay_clblast_rtx3090"}

        r2 = evaluate_specs(r1.cursor, instance, store)
        assert r2.run_requests == [] and r2.dynamic_partitions_requests == []  # nothing changed: nothing runs

        data = yaml.safe_load((specs / "gemm_smoke.yaml").read_text())
        data["search"]["seed"] = 99
        (specs / "gemm_smoke.yaml").write_text(yaml.safe_dump(data))
        (specs / "replay_clblast_rtx3090.yaml").unlink()
        r3 = evaluate_specs(r2.cursor, instance, store)
        assert [(r.partition_key, r.tags["kregress/trigger"]) for r in r3.run_requests] == [("gemm_smoke", "spec changed")]
        apply(instance, r3)
        assert instance.get_dynamic_partitions(SPECS_PARTITIONS.name) == ["gemm_smoke"]

        # a kernel source change re-runs only that family's partitions
        cursor = json.loads(r3.cursor)
        cursor["families"]["gemm"] = "0" * 16
        r4 = evaluate_specs(json.dumps(cursor), instance, store)
        assert [(r.partition_key, r.tags["kregress/trigger"]) for r in r4.run_requests] == [
            ("gemm_smoke", "kernel source of gemm changed")]


def test_nightly_schedule_requests_every_partition(tmp_path):
    from kernel_assets.definitions import defs

    schedule = defs.get_schedule_def("nightly_sweeps")
    assert schedule.cron_schedule == "0 2 * * *"
    with dg.DagsterInstance.local_temp(tempdir=str(tmp_path)) as instance:
        when = datetime(2026, 12, 3, 2, 0, tzinfo=timezone.utc)
        assert isinstance(schedule(dg.build_schedule_context(instance=instance, scheduled_execution_time=when)), dg.SkipReason)
        instance.add_dynamic_partitions(SPECS_PARTITIONS.name, ["gemm_smoke", "mla_decode_h100_bf16"])
        reqs = schedule(dg.build_schedule_context(instance=instance, scheduled_execution_time=when))
        assert {r.run_key for r in reqs} == {"nightly-2026-12-03-gemm_smoke", "nightly-2026-12-03-mla_decode_h100_bf16"}
        assert sorted(r.partition_key for r in reqs) == ["gemm_smoke", "mla_decode_h100_bf16"]
        assert all(r.tags["kregress/trigger"] == "nightly" for r in reqs)


def test_automation_is_off_by_default():
    """Opening the UI starts no work: the schedule and the sensor are both STOPPED until someone turns them on."""
    from kernel_assets.definitions import defs

    assert defs.get_sensor_def("spec_sensor").default_status == dg.DefaultSensorStatus.STOPPED
    assert defs.get_schedule_def("nightly_sweeps").default_status == dg.DefaultScheduleStatus.STOPPED


def _swept(instance, task_id: str, spec_hash: str, kernel_hash: str) -> None:
    """The materialization baseline_metrics records (spec_hash and the family's kernel_hash metadata)."""
    instance.report_runless_asset_event(dg.AssetMaterialization(
        asset_key="baseline_metrics", partition=task_id, metadata={"spec_hash": spec_hash, "kernel_hash": kernel_hash}))


def test_sensor_never_reruns_a_spec_swept_at_its_current_hash(tmp_path, monkeypatch):
    from kernel_assets.definitions import defs
    from kregress.core.family import get_family
    from kregress.core.spec import load_spec

    specs = tmp_path / "specs"
    specs.mkdir()
    shutil.copy(REPO / "specs" / "gemm_smoke.yaml", specs)
    shutil.copy(REPO / "specs" / "gemm_h100_bf16.yaml", specs)
    monkeypatch.setenv("KREGRESS_SPECS_DIR", str(specs))
    smoke = load_spec(specs / "gemm_smoke.yaml")
    gemm_hash = get_family("gemm").source_hash()
    sensor = defs.get_sensor_def("spec_sensor")
    with dg.DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions(SPECS_PARTITIONS.name, ["gemm_smoke"])
        _swept(instance, "gemm_smoke", smoke.content_hash(), gemm_hash)
        # a fresh sensor (empty cursor): without reading the materializations it would run both specs
        result = sensor(dg.build_sensor_context(instance=instance, cursor=None))
        assert [r.partition_key for r in result.run_requests] == ["gemm_h100_bf16"]

        # the swept hash is an older one: the spec changed since, so it runs
        _swept(instance, "gemm_smoke", "0" * 16, gemm_hash)
        result = sensor(dg.build_sensor_context(instance=instance, cursor=None))
        assert sorted(r.partition_key for r in result.run_requests) == ["gemm_h100_bf16", "gemm_smoke"]

        # swept at this hash but with other kernel code: runs as well
        _swept(instance, "gemm_smoke", smoke.content_hash(), "f" * 16)
        result = sensor(dg.build_sensor_context(instance=instance, cursor=None))
        assert "gemm_smoke" in [r.partition_key for r in result.run_requests]
