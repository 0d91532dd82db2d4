"""`kregress`: run a sweep in-process through Dagster, validate specs, and the gateway tools.

    kregress sweep specs/gemm_h100_bf16.yaml      # whole graph for one spec, with progress
    kregress specs validate specs/*.yaml          # check specs, run nothing
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import time
from pathlib import Path

from kregress.core import paths
from kregress.core.names import STRATEGIES

# Subcommands contributed by other modules: each exposes register(subparsers).
PLUGINS = ("kernel_assets.cli_usage", "kregress.clients.cli", "kernel_assets.cli_family")


def _ensure_home(arg: str | None) -> Path:
    home = Path(arg).resolve() if arg else paths.home()
    home.mkdir(parents=True, exist_ok=True)
    os.environ["DAGSTER_HOME"] = str(home)
    if not (home / "dagster.yaml").exists():
        repo_yaml = paths.REPO_ROOT / "dagster_home" / "dagster.yaml"
        if repo_yaml.exists() and repo_yaml.parent != home:
            (home / "dagster.yaml").write_text(repo_yaml.read_text())
    return home


class _Progress(logging.Handler):
    """Turns Dagster's step events and the assets' log lines into a compact progress display."""

    def __init__(self, total_steps: int, stream=sys.stderr):
        super().__init__(logging.DEBUG)
        self.total = total_steps
        self.done = 0
        self.t0 = time.perf_counter()
        self.stream = stream

    def emit(self, record: logging.LogRecord) -> None:
        meta = getattr(record, "dagster_meta", None) or {}
        event = meta.get("dagster_event")
        step = meta.get("step_key") or ""
        elapsed = f"{time.perf_counter() - self.t0:6.1f}s"
        if event is not None:
            kind = event.event_type_value
            if kind == "STEP_START":
                self._line(f"{elapsed} [{self.done + 1:>2}/{self.total}] {step} ...")
            elif kind == "STEP_SUCCESS":
                self.done += 1
            elif kind == "STEP_FAILURE":
                self.done += 1
                self._line(f"{elapsed} FAILED {step}: {str(getattr(event.event_specific_data, 'error', ''))[:400]}")
            elif kind == "ASSET_CHECK_EVALUATION":
                data = event.event_specific_data
                if not data.passed:
                    self._line(f"{elapsed}   check {data.check_name} FAILED ({data.severity.value})")
            return
        msg = meta.get("orig_message") or record.getMessage()
        if record.levelno >= logging.INFO and msg and not msg.startswith(("Finished", "Started", "Executing", "Dependencies for step")):
            self._line(f"{elapsed}   {msg}")

    def _line(self, text: str) -> None:
        print(text, file=self.stream, flush=True)


def _prepare(args: argparse.Namespace):
    """(spec, home, resources, instance) for a command that runs one spec in-process, or None after
    printing why the spec cannot run (exit 2)."""
    from kregress.core.spec import SpecError, load_spec

    try:
        spec = load_spec(args.spec)
    except SpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None
    home = _ensure_home(args.dagster_home)
    import dagster as dg

    from kernel_assets.constants import SPECS_PARTITIONS
    from kernel_assets.definitions import build_resources
    from kernel_assets.specs_resource import SpecStore

    spec_file = str(Path(args.spec).resolve())
    os.environ["KREGRESS_SPEC_FILES"] = os.pathsep.join(
        [spec_file] + [f for f in os.environ.get("KREGRESS_SPEC_FILES", "").split(os.pathsep) if f and f != spec_file])
    resources = build_resources(getattr(args, "env", None))
    resources["specs"] = SpecStore()
    instance = dg.DagsterInstance.get()
    if not instance.has_dynamic_partition(SPECS_PARTITIONS.name, spec.task_id):
        instance.add_dynamic_partitions(SPECS_PARTITIONS.name, [spec.task_id])
    return spec, home, resources, instance


def cmd_sweep(args: argparse.Namespace) -> int:
    prepared = _prepare(args)
    if prepared is None:
        return 2
    spec, home, resources, instance = prepared
    import dagster as dg

    from kernel_assets.constants import ROUNDS, SWEEP_JOB
    from kernel_assets.definitions import build_definitions
    from kregress.core.family import get_family
    from resources.gpu import backend_for, compiled_backend

    if args.backend:
        resources["bench"] = compiled_backend(args.backend)
    handler = _Progress(total_steps=0)

    @dg.logger(description="kregress CLI progress display")
    def progress(_init_context):
        lg = logging.getLogger(f"kregress.progress.{id(handler)}")
        lg.setLevel(logging.DEBUG)
        lg.propagate = False
        lg.handlers = [handler]
        return lg

    defs = build_definitions(resources, loggers={"progress": progress})
    job = defs.resolve_job_def(SWEEP_JOB)
    handler.total = len(job.graph.node_defs)
    # Dagster's console logger would print every DEBUG event: the progress logger replaces it.
    run_config: dict = {"loggers": {"progress": {}}}
    if args.strategy:
        run_config["ops"] = {f"round_{k}_suggestions": {"config": {"strategy": args.strategy}}
                             for k in ROUNDS}
    print(f"kregress: sweep {spec.task_id} ({spec.kernel_family}, {spec.dtype}, {spec.hardware.arch}); "
          f"DAGSTER_HOME={home}; backend={backend_for(get_family(spec.kernel_family), resources['bench'], resources['replay']).kind}; strategy={args.strategy or spec.search.strategy}",
          file=sys.stderr)
    result = job.execute_in_process(partition_key=spec.task_id, instance=instance, run_config=run_config,
                                    raise_on_error=False)
    if not result.success:
        failed = [e.step_key for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
        print(f"kregress: sweep {spec.task_id} FAILED (run {result.run_id}); failed steps: {', '.join(failed) or 'see the run in dagster'}",
              file=sys.stderr)
        return 1
    summary = result.output_for_node("verdict_report")
    counts = summary["counts"]
    print(f"report: {summary['report_dir']}/report.md")
    print(f"verdicts: PASS {counts['PASS']}, REGRESS {counts['REGRESS']}, NEEDS_REVIEW {counts['NEEDS_REVIEW']} "
          f"({summary['variants']} variants; best {summary['best']}; stopped: {summary['stopped'] or 'no'})")
    return 0


def cmd_review(args: argparse.Namespace) -> int:
    prepared = _prepare(args)
    if prepared is None:
        return 2
    spec, home, resources, instance = prepared
    import dagster as dg

    from kernel_assets.definitions import REVIEW_ASSETS

    config = {"base_ref": args.base or "", "use_model": not args.offline}
    print(f"kregress: reviewing the kernels/ diff for {spec.task_id} (base: {args.base or 'last reviewed revision, else HEAD'})",
          file=sys.stderr)
    result = dg.materialize(REVIEW_ASSETS, partition_key=spec.task_id, instance=instance, resources=resources,
                            run_config={"ops": {"kernel_source_review": {"config": config}},
                                        "loggers": {"console": {"config": {"log_level": "WARNING"}}}},
                            raise_on_error=False)
    if not result.success:
        why = [str(getattr(e.event_specific_data.error, "message", "")).strip() for e in result.all_events
               if e.event_type_value == "STEP_FAILURE"]
        print(f"kregress: review FAILED (run {result.run_id}): {' '.join(why)[:800]}", file=sys.stderr)
        return 1
    print(f"review: {home / 'reports' / spec.task_id / 'review.md'}")
    return 0


def cmd_specs_validate(args: argparse.Namespace) -> int:
    from kregress.core import spec as spec_mod

    bad = 0
    for f in args.files:
        try:
            spec = spec_mod.load_spec(f)
        except spec_mod.SpecError as exc:
            bad += 1
            print(str(exc), file=sys.stderr)
            continue
        except Exception as exc:  # noqa: BLE001 - one line per file, never a traceback
            bad += 1
            print(f"{f}: could not be validated: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}", file=sys.stderr)
            continue
        print(f"{f}: ok ({spec.task_id}, {spec.kernel_family}, {len(spec.shape_matrix)} shapes, hash {spec.content_hash()})")
    return 1 if bad else 0


def cmd_history_show(args: argparse.Namespace) -> int:
    _ensure_home(args.dagster_home)
    from kernel_assets import history

    df = history.load(args.task_id)
    if df.empty:
        print(f"no history for {args.task_id} under {history.history_root()}")
        return 0
    base = df[df["is_baseline"]][["run_id", "ts", "device", "torch_version", "triton_version", "evidence", "verdict", "p50_ms"]]
    base = base.assign(ts=base["ts"].map(lambda t: time.strftime("%Y-%m-%d %H:%M", time.gmtime(t))),
                       run_id=base["run_id"].str[:8], p50_ms=base["p50_ms"].map(lambda xs: ", ".join(f"{x:.4g}" for x in xs)))
    print(base.to_string(index=False))
    for a in history.acks(args.task_id):
        print(f"acknowledged {a['run_id'][:8]} by {a['by']}: {a['why']}")
    return 0


def cmd_history_ack(args: argparse.Namespace) -> int:
    _ensure_home(args.dagster_home)
    from kernel_assets import history

    try:
        ack = history.acknowledge(args.task_id, args.by, args.why, run_id=args.run_id)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"acknowledged run {ack['run_id']} of {ack['task_id']} as the new reference (by {ack['by']}: {ack['why']})")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kregress", description="Budgeted, auditable kernel regression sweeps on Dagster.")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("sweep", help="run one spec's whole graph in-process")
    s.add_argument("spec", help="path to a task spec YAML")
    s.add_argument("--dagster-home", help="default: $DAGSTER_HOME, else ./dagster_home")
    s.add_argument("--env", choices=["local", "gpu"], help="resource set (default $KREGRESS_ENV or local)")
    s.add_argument("--backend", choices=["auto", "cuda", "interpreter"], help="override the benchmark backend")
    s.add_argument("--strategy", choices=list(STRATEGIES), help="override the spec's search strategy")
    s.set_defaults(func=cmd_sweep)
    r = sub.add_parser("review", help="review the kernels/ diff that matters to a spec (role review; offline checks without a key)")
    r.add_argument("spec", help="path to a task spec YAML")
    r.add_argument("--base", help="git ref to diff against (default: the revision last reviewed, else HEAD)")
    r.add_argument("--offline", action="store_true", help="no model call: compile-stat deltas and test coverage only")
    r.add_argument("--dagster-home")
    r.set_defaults(func=cmd_review)
    sp = sub.add_parser("specs", help="work with spec files")
    spsub = sp.add_subparsers(dest="specs_command", required=True)
    v = spsub.add_parser("validate", help="validate spec files; run nothing")
    v.add_argument("files", nargs="+")
    v.set_defaults(func=cmd_specs_validate)
    h = sub.add_parser("history", help="baseline history across sweeps")
    hsub = h.add_subparsers(dest="history_command", required=True)
    hs = hsub.add_parser("show", help="the baselines recorded for a task")
    hs.add_argument("task_id")
    hs.add_argument("--dagster-home")
    hs.set_defaults(func=cmd_history_show)
    ha = hsub.add_parser("ack", help="accept a known step change: that sweep becomes the new reference")
    ha.add_argument("task_id")
    ha.add_argument("--by", required=True, help="who accepts it")
    ha.add_argument("--why", required=True, help="why (e.g. 'driver 560 update, expected +4%')")
    ha.add_argument("--run-id", help="default: the latest sweep of the task")
    ha.add_argument("--dagster-home")
    ha.set_defaults(func=cmd_history_ack)
    for mod in PLUGINS:
        try:
            module = importlib.import_module(mod)
        except ModuleNotFoundError as exc:
            if exc.name == mod:
                continue
            raise
        module.register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
