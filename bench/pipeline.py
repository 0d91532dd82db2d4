"""Cold vs warm sweep of one spec, side by side in one run: in-process and as a user runs the CLI.

    .venv/bin/python bench/pipeline.py [specs/gemm_h100_bf16.yaml] [--env local|gpu] [--skip-in-process]
    .venv/bin/python bench/pipeline.py --vs /tmp/base --pairs 3     # cold sweeps, this checkout vs another, A B A B
    .venv/bin/python bench/pipeline.py --launched [--json OUT]       # the CLI against a run launched by `dagster dev`

Prints:
- `kregress --help` and `kregress sweep --help` wall time (fresh processes, median of 3) and whether they
  imported dagster/torch/triton;
- the CLI as a user runs it (whole `kregress sweep` processes, fresh DAGSTER_HOME): cold, warm (unchanged
  spec: answered from the last sweep's record) and warm --force (the whole graph again on warm caches), with
  ratios, and where the forced warm seconds go (interpreter start, imports, instance set-up, the run itself,
  event-log records written);
- where the COLD run's seconds go: imports (python, Dagster, the family's torch/Triton), instance set-up,
  the graph (Dagster steps, the agent, the report: everything but the benchmark work), compiles and
  interpreter checks (job counts, summed job seconds, how many checks were shared, workers started), read
  from the run's own record and the assets' metadata;
- the in-process figures (one process, job.execute_in_process twice): cold vs warm wall time, compiles,
  cache hits, compile and correctness seconds per variant, read from the assets' metadata;
- with ``--launched``: one instance (a fresh DAGSTER_HOME), a cold CLI sweep to warm the disk caches, then a
  run of the same spec submitted to a real ``dagster dev`` on that instance (GraphQL ``launchRun``, the way
  the UI launches it: queued, dequeued by the daemon, started by the instance's run launcher in a process
  of the code server), then a warm ``kregress sweep --force``: both timed runs find the same caches. It
  prints (and with ``--json OUT`` writes) ``cli_s`` (the warm CLI, whole process), ``launched_s`` (submit to
  the run's end), their ratio, and per step where its seconds go, read from the run's event log:
  ``process_start_s`` (the step's first event to STEP_START: a step process's start, imports and resource
  set-up under the multiprocess executor; 0 in-process), ``io_s`` (STEP_START to the last input loaded,
  plus STEP_OUTPUT to HANDLED_OUTPUT: the IO manager's loads and stores), ``work_s`` (inputs loaded to
  STEP_OUTPUT: the asset's own code) and ``events_s`` (the rest of the step: materialization and check
  events written, bookkeeping); ``run`` has the launch (submit to RUN_START: queue, launch, the run
  worker's imports) and the gaps between steps. ``KREGRESS_EXECUTOR`` in the environment picks the
  launched run's executor (unset: the definitions' default), so the same command measures before and after;
- with ``--vs DIR`` (another checkout of kregress, e.g. ``git worktree add /tmp/base main``): cold CLI sweeps
  of this checkout (A) and that one (B) in turn, each on a fresh DAGSTER_HOME with this interpreter, the
  wall and CPU seconds (children included) of each, and the ratio A/B pair by pair: on a shared machine
  the ratio of neighbouring runs is the figure to quote, not an absolute time.

Figures (the default spec, a shared 2-core machine whose load average moved between 3 and 13 while they ran;
B = the revision before the first-hour work, A = with it): ``--vs`` over 4 pairs, CPU seconds of the whole
process tree A 43.6-46.2 s vs B 60.3-70.2 s (A/B median 0.70; on B's 24-variant work, before one BLAS
thread per worker and the new latency model, A/B CPU was 1.01: overlap alone buys wall time, not CPU), wall
A/B median 0.60 (0.27-1.84: the load moved more than the code). One cold run at load 3.4: 35.2 s wall, 42.8 s CPU; before the run 5.8 s,
benchmark work 27.0 s, graph 2.3 s, 17 compiles, 15 interpreter checks (2 from the cache through shared
keys), 4 workers started. A now stops after 2 rounds (16 variants; B ran 24): its latency model sees the
pipelining and L2 effects and finds no round-2 gain of 1% over the baseline, so the stop rule fires.

Later figures (2026-12-04, the same 2-core machine idle, load average 0.7-1.8): cold CLI sweeps 21.3 and 23.1 s
wall (32.8 s CPU), 17 compiles in 17.3 job-s (1.0 s each: no SASS disassembly in a sweep, and the config past the
shared-memory limit stops at its LLVM IR instead of taking ptxas's 3-15 s), 2 jobs (the baseline's compile and
check) run ahead while Dagster imported; ``--vs`` against the revision before those changes, 3 pairs: A 19.1-19.8 s
vs B 24.7-26.3 s wall, A/B median wall 0.80, CPU 0.86.

``--launched`` figures (2026-12-07, the default spec, 2 cores shared with other sessions): before,
``KREGRESS_EXECUTOR=multiprocess`` (a process per step), load average 19-20: CLI 95.0 s, launched 774.5 s, ratio 8.16,
and again at 18-20: CLI 81.0 s, launched 375.2 s, ratio 4.63 (process start and imports 11.9-30.1 s a step, 290.5 s in all);
after, the in-process default, load average 13.8: CLI 33.6 s, launched 41.2 s, ratio 1.23 (submit to RUN_START 21.9 s:
queue, launch, the run worker's imports; 16 steps 16.8 s: IO 8.3 s, events 2.1 s, work 6.4 s, no process starts).
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
HEAVY = ("dagster", "torch", "triton")


def _env(home: Path | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KREGRESS_TEST_")}
    if home is not None:
        env["DAGSTER_HOME"] = str(home)
    return env


def _wall(cmd: list[str], env: dict | None = None) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=REPO, env=env or _env(), capture_output=True, text=True)
    return time.perf_counter() - t0, p


def _fresh_home() -> Path:
    home = Path(tempfile.mkdtemp(prefix="kregress-bench-"))
    (home / "dagster.yaml").write_text((REPO / "dagster_home" / "dagster.yaml").read_text())
    return home


def help_lines() -> list[str]:
    probe = ("import sys\nfrom kernel_assets.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
             f"print(','.join(m for m in {HEAVY!r} if m in sys.modules) or 'none', file=sys.stderr)")
    out = []
    for argv in (["--help"], ["sweep", "--help"]):
        walls = []
        for _ in range(3):
            w, p = _wall([sys.executable, "-c", probe, *argv])
            walls.append(w)
        heavy = p.stderr.strip().splitlines()[-1]
        base, _ = _wall([sys.executable, "-c", "pass"])
        out.append(f"kregress {' '.join(argv):<14} {statistics.median(walls):6.2f} s (median of 3; bare python start "
                   f"{base:.2f} s); heavy modules imported: {heavy}")
    return out


def _import_s(stmt: str) -> float:
    w, p = _wall([sys.executable, "-c", stmt])
    if p.returncode:
        raise RuntimeError(p.stderr[-500:])
    return w


def cli_lines(spec_path: Path, env_name: str) -> list[str]:
    home = _fresh_home()
    cmd = [sys.executable, "-m", "kernel_assets.cli", "sweep", str(spec_path), "--env", env_name]
    cold, p_cold = _wall(cmd, _env(home))
    warm, p_warm = _wall(cmd, _env(home))
    forced, p_forced = _wall(cmd + ["--force"], _env(home))
    for label, p in (("cold", p_cold), ("warm", p_warm), ("warm --force", p_forced)):
        if p.returncode:
            return [f"CLI {label} run failed (exit {p.returncode}): {p.stderr.strip().splitlines()[-1:]}"]
    short_circuit = "unchanged since run" in p_warm.stderr
    # where the forced warm seconds go
    py = _import_s("pass")
    spec_load = _import_s(f"from kregress.core.spec import load_spec; load_spec({str(spec_path)!r})")
    defs_import = _import_s("import kernel_assets.definitions")
    prep = _import_s("import os, sys; from pathlib import Path; os.environ['DAGSTER_HOME'] = sys.argv[1]; "
                     "from kernel_assets.run_guard import prepared_instance; import time; t = time.perf_counter(); "
                     "prepared_instance(Path(sys.argv[1]), 'bench'); print(time.perf_counter() - t)"
                     .replace("sys.argv[1]", repr(str(home))))
    os.environ["DAGSTER_HOME"] = str(home)
    import dagster as dg

    instance = dg.DagsterInstance.get()
    runs = instance.get_runs(limit=1)
    n_events = len(instance.all_logs(runs[0].run_id)) if runs else 0
    last_step = [ln for ln in p_forced.stderr.splitlines() if ln.strip() and ln.strip()[0].isdigit()]
    run_s = float(last_step[-1].split("s", 1)[0]) if last_step else float("nan")
    lines = [
        f"{'CLI run':<16}{'wall s':>9}",
        f"{'cold':<16}{cold:>9.1f}",
        f"{'warm':<16}{warm:>9.1f}   ({'answered as unchanged since the last sweep' if short_circuit else 'ran the graph'})",
        f"{'warm --force':<16}{forced:>9.1f}   (the whole graph again on warm caches)",
        f"CLI cold/warm ratio: {cold / warm:.1f}x; cold/(warm --force): {cold / forced:.1f}x",
        f"warm --force breakdown: python start {py:.1f} s; spec load incl. family import (torch, triton) {spec_load:.1f} s; "
        f"import kernel_assets.definitions (dagster + assets) {defs_import:.1f} s; instance set-up under the lock "
        f"(process incl. imports) {prep:.1f} s; graph run until its last step started {run_s:.1f} s; "
        f"{n_events} event-log records written by the run",
    ]
    return lines


def _cold_run(spec_path: Path, env_name: str, cwd: Path = REPO) -> tuple[float, float, Path, subprocess.CompletedProcess]:
    """(wall s, CPU s of the process and its children, DAGSTER_HOME, process) of one cold CLI sweep."""
    import resource

    home = _fresh_home()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "kernel_assets.cli", "sweep", str(spec_path), "--env", env_name],
                       cwd=cwd, env=_env(home), capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, home, p


def cold_breakdown_lines(spec_path: Path, env_name: str) -> list[str]:
    """Where a cold CLI sweep's seconds go: imports, instance, graph, compiles, interpreter."""
    wall, cpu, home, p = _cold_run(spec_path, env_name)
    if p.returncode:
        return [f"cold CLI run failed (exit {p.returncode}): {p.stderr.strip().splitlines()[-1:]}"]
    py = _import_s("pass")
    imports = _import_s("import kernel_assets.cli, kernel_assets.definitions, kernels.measure; "
                        f"from kregress.core.spec import load_spec; load_spec({str(spec_path)!r})")
    probe = _fresh_home()
    inst = subprocess.run([sys.executable, "-c", "import os, sys, time; from pathlib import Path; "
                           "from kernel_assets.run_guard import prepared_instance; t = time.perf_counter(); "
                           f"prepared_instance(Path({str(probe)!r}), 'bench'); print(time.perf_counter() - t)"],
                          cwd=REPO, env=_env(probe), capture_output=True, text=True)
    instance_s = float(inst.stdout.strip().splitlines()[-1]) if inst.returncode == 0 else float("nan")
    os.environ["DAGSTER_HOME"] = str(home)
    import dagster as dg

    instance = dg.DagsterInstance.get()
    run = instance.get_runs(limit=1)[0]
    stats = instance.get_run_stats(run.run_id)
    run_s = (stats.end_time or 0) - (stats.start_time or 0)
    md: dict[str, dict] = {}
    for rec in instance.get_records_for_run(run.run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION).records:
        m = rec.event_log_entry.dagster_event.event_specific_data.materialization
        md[m.asset_key.to_user_string()] = {k: getattr(v, "value", v) for k, v in m.metadata.items()}
    steps = [k for k, v in md.items() if "evaluate_s" in v]
    bench_s = sum(md[k]["evaluate_s"] for k in steps)
    n = lambda key: sum(int(md[k].get(key, 0)) for k in steps)  # noqa: E731
    tot = lambda key: sum(float(md[k].get(key, 0.0)) for k in steps)  # noqa: E731
    spawned = max((int(md[k].get("workers_spawned", 0)) for k in steps), default=0)
    before_run = wall - run_s
    shutil.rmtree(home, ignore_errors=True)
    shutil.rmtree(probe, ignore_errors=True)
    return [
        f"cold CLI sweep: {wall:.1f} s wall, {cpu:.1f} s CPU (process and children), {os.cpu_count()} CPUs",
        f"  before the run {before_run:5.1f} s: python start {py:.1f} s; imports (Dagster, assets, the family's torch and "
        f"Triton) {imports - py:.1f} s; instance set-up {instance_s:.1f} s; spec, definitions, rest {max(0.0, before_run - imports - instance_s):.1f} s",
        f"  the run       {run_s:5.1f} s: benchmark work {bench_s:.1f} s + graph (Dagster steps, agent, report, plot) "
        f"{run_s - bench_s:.1f} s",
        f"  benchmark work: {n('compiles')} compiles ({tot('compile_s_total'):.1f} job-s, {n('compile_cache_hits')} from "
        f"cache); interpreter checks {n('correctness_runs')} run ({tot('correctness_s_total'):.1f} job-s), "
        f"{n('correctness_shared')} shared, {n('correctness_cache_hits')} from cache; {spawned} worker processes started; "
        f"{max((int(md[k].get('answered_ahead', 0)) for k in steps), default=0)} job(s) (the baseline's) run ahead "
        f"while Dagster imported; job-s overlap on {min(4, os.cpu_count() or 1)} workers per pool",
    ]


def vs_lines(spec_path: Path, env_name: str, other: Path, pairs: int) -> list[str]:
    """Cold CLI sweeps of this checkout (A) and ``other`` (B), in turn; the ratio A/B pair by pair."""
    rows, ratios, cpu_ratios = [], [], []
    for i in range(pairs):
        wa, ca, home_a, pa = _cold_run(spec_path, env_name, REPO)
        wb, cb, home_b, pb = _cold_run(spec_path, env_name, other)
        for home in (home_a, home_b):
            shutil.rmtree(home, ignore_errors=True)
        if pa.returncode or pb.returncode:
            return [f"pair {i + 1}: a run failed (A exit {pa.returncode}, B exit {pb.returncode}): "
                    f"{(pa.stderr or pb.stderr).strip().splitlines()[-1:]}"]
        rows.append(f"pair {i + 1}: A {wa:6.1f} s wall {ca:6.1f} s CPU | B {wb:6.1f} s wall {cb:6.1f} s CPU | "
                    f"A/B wall {wa / wb:.2f}, CPU {ca / cb:.2f}; load average {os.getloadavg()[0]:.1f}")
        ratios.append(wa / wb)
        cpu_ratios.append(ca / cb)
    return [f"A = {REPO}, B = {other}, cold CLI sweeps of {spec_path.name}, {os.cpu_count()} CPUs", *rows,
            f"median A/B: wall {statistics.median(ratios):.2f}, CPU {statistics.median(cpu_ratios):.2f}"]


def in_process_lines(spec_path: Path, env_name: str) -> list[str]:
    home = _fresh_home()
    os.environ["DAGSTER_HOME"] = str(home)
    import dagster as dg

    from kernel_assets.constants import SPECS_PARTITIONS
    from kernel_assets.definitions import build_definitions, build_resources
    from kernel_assets.specs_resource import SpecStore
    from kregress.core.spec import load_spec

    spec = load_spec(spec_path)
    instance = dg.DagsterInstance.get()
    instance.add_dynamic_partitions(SPECS_PARTITIONS.name, [spec.task_id])
    os.environ["KREGRESS_SPEC_FILES"] = str(spec_path.resolve())
    resources = build_resources(env_name)
    resources["specs"] = SpecStore()
    job = build_definitions(resources).resolve_job_def("sweep_job")
    quiet = {"loggers": {"console": {"config": {"log_level": "ERROR"}}}}

    runs = []
    for label in ("cold", "warm"):
        t0 = time.perf_counter()
        result = job.execute_in_process(partition_key=spec.task_id, instance=instance, run_config=quiet)
        wall = time.perf_counter() - t0
        md = {}
        for e in result.all_events:
            if e.event_type_value == "ASSET_MATERIALIZATION":
                m = e.event_specific_data.materialization
                md[m.asset_key.to_user_string()] = {k: getattr(v, "value", v) for k, v in m.metadata.items()}
        steps = [k for k in md if k == "baseline_metrics" or k.endswith("_variants")]
        compiles = sum(md[k].get("compiles", 0) for k in steps)
        hits = sum(md[k].get("compile_cache_hits", 0) for k in steps)
        c_s = [md[k]["compile_s_per_variant"] for k in steps if md[k].get("compiles")]
        k_s = [md[k]["correctness_s_per_variant"] for k in steps if md[k].get("correctness_runs")]
        variants = md["verdict_report"]
        runs.append((label, wall, compiles, hits, sum(c_s) / len(c_s) if c_s else 0.0, sum(k_s) / len(k_s) if k_s else 0.0,
                     int(variants["n_PASS"]) + int(variants["n_REGRESS"]) + int(variants["n_NEEDS_REVIEW"])))
    lines = [f"{'in-process':<12}{'wall s':>9}{'compiles':>10}{'cache hits':>12}{'compile s/var':>15}{'check s/var':>13}{'variants':>10}"]
    for label, wall, compiles, hits, cs, ks, n in runs:
        lines.append(f"{label:<12}{wall:>9.1f}{compiles:>10}{hits:>12}{cs:>15.2f}{ks:>13.2f}{n:>10}")
    lines.append(f"in-process cold/warm ratio: {runs[0][1] / runs[1][1]:.1f}x")
    return lines


# --- the CLI against a run launched by `dagster dev` ------------------------------------------------


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop_group(proc: subprocess.Popen, grace_s: float = 60.0) -> None:
    """SIGTERM to ``dagster dev`` (it stops its webserver, daemon and code server), then SIGKILL to what is left
    of its process group."""
    import signal

    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def step_breakdown(instance, run_id: str, submitted_at: float | None = None) -> dict:
    """Where a run's seconds went, step by step, from its event log (see the module docstring)."""
    import dagster as dg

    T = dg.DagsterEventType
    run_kinds = {T.RUN_ENQUEUED: "RUN_ENQUEUED", T.RUN_STARTING: "RUN_STARTING", T.RUN_START: "RUN_START",
                 T.RUN_SUCCESS: "RUN_SUCCESS", T.RUN_FAILURE: "RUN_FAILURE", T.RUN_CANCELED: "RUN_CANCELED"}
    # written when the run is created, long before its step starts: not the step's
    planned = {T.ASSET_MATERIALIZATION_PLANNED.value, T.ASSET_CHECK_EVALUATION_PLANNED.value}
    by_step: dict[str, list] = {}
    run_events: dict[str, float] = {}
    for rec in instance.all_logs(run_id):
        ev = rec.dagster_event
        kind = ev.event_type_value if ev else "LOG"
        if rec.step_key and kind not in planned:
            by_step.setdefault(rec.step_key, []).append((rec.timestamp, kind))
        elif ev is not None and ev.event_type in run_kinds:
            run_events.setdefault(run_kinds[ev.event_type], rec.timestamp)
    steps: dict[str, dict] = {}
    spans = []
    for key, evs in by_step.items():
        evs.sort()
        first = evs[0][0]
        at = lambda kind, pick=min, evs=evs: pick((t for t, k in evs if k == kind), default=None)  # noqa: E731
        start, success = at("STEP_START"), at("STEP_SUCCESS") or at("STEP_FAILURE")
        if start is None or success is None:
            continue
        loaded = at("LOADED_INPUT", max)
        inputs_done = max(t for t in (start, loaded, at("STEP_INPUT", max)) if t is not None)
        output, handled = at("STEP_OUTPUT"), at("HANDLED_OUTPUT", max)
        work_end = output if output is not None else success
        load_s = (loaded - start) if loaded is not None else 0.0
        store_s = (handled - output) if handled is not None and output is not None else 0.0
        process_s = start - first
        work_s = max(0.0, work_end - inputs_done)
        wall = success - first
        steps[key] = {"process_start_s": round(process_s, 3), "io_s": round(load_s + store_s, 3),
                      "events_s": round(max(0.0, wall - process_s - load_s - store_s - work_s), 3),
                      "work_s": round(work_s, 3), "wall_s": round(wall, 3), "events": len(evs)}
        spans.append((first, success))
    spans.sort()
    gaps = sum(max(0.0, b[0] - a[1]) for a, b in zip(spans, spans[1:]))
    start = run_events.get("RUN_START")
    end = run_events.get("RUN_SUCCESS") or run_events.get("RUN_FAILURE") or run_events.get("RUN_CANCELED")
    run = {"launch_s": round(start - submitted_at, 3) if start and submitted_at else None,
           "steps_first_to_last_s": round(spans[-1][1] - spans[0][0], 3) if spans else None,
           "between_steps_s": round(gaps, 3),
           "run_start_to_end_s": round(end - start, 3) if start and end else None}
    return {"steps": steps, "run": run}


def _wait_for_location(client, deadline: float) -> None:
    """Until the code location of ``dagster dev`` has loaded the sweep job."""
    q = "{ repositoriesOrError { __typename ... on RepositoryConnection { nodes { name jobs { name } } } } }"
    while True:
        try:
            got = client._execute(q)
            nodes = (got.get("repositoriesOrError") or {}).get("nodes") or []
            if any(j["name"] == "sweep_job" for n in nodes for j in n["jobs"]):
                return
        except Exception:  # noqa: BLE001 - the server is still starting
            pass
        if time.monotonic() > deadline:
            raise TimeoutError("dagster dev did not load the sweep job within its deadline")
        time.sleep(1.0)


def launched_figures(spec_path: Path, env_name: str, timeout_s: float = 1200.0) -> dict:
    """A cold CLI sweep (warms the caches), a run of the same spec launched by `dagster dev` on the same
    instance, a warm CLI sweep --force; the figures of the module docstring."""
    from dagster_graphql import DagsterGraphQLClient

    from kregress.core.spec import load_spec

    spec = load_spec(spec_path)
    home = _fresh_home()
    env = _env(home)
    env["KREGRESS_SPEC_FILES"] = str(spec_path)
    env["KREGRESS_ENV"] = env_name
    cmd = [sys.executable, "-m", "kernel_assets.cli", "sweep", str(spec_path), "--env", env_name]
    cold, p = _wall(cmd, env)
    if p.returncode:
        raise RuntimeError(f"cold CLI sweep failed (exit {p.returncode}): {p.stderr.strip()[-800:]}")
    port = _free_port()
    log = open(home / "dagster_dev.log", "w")
    dev = subprocess.Popen([str(Path(sys.executable).parent / "dagster"), "dev", "-w", str(REPO / "workspace.yaml"),
                            "-p", str(port)], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                           start_new_session=True)
    try:
        client = DagsterGraphQLClient("127.0.0.1", port_number=port, timeout=60)
        _wait_for_location(client, time.monotonic() + 600)
        time.sleep(5.0)  # the daemon's first pass (its own imports) out of the way
        load = os.getloadavg()[0]
        submitted = time.time()
        run_id = client.submit_job_execution("sweep_job", tags={"dagster/partition": spec.task_id})
        os.environ["DAGSTER_HOME"] = str(home)
        import dagster as dg

        instance = dg.DagsterInstance.get()
        deadline = time.monotonic() + timeout_s
        while True:
            run = instance.get_run_by_id(run_id)
            if run is not None and run.is_finished:
                break
            if time.monotonic() > deadline or dev.poll() is not None:
                raise RuntimeError(f"launched run {run_id} did not finish (dagster dev log: {home / 'dagster_dev.log'})")
            time.sleep(0.5)
        if run.status != dg.DagsterRunStatus.SUCCESS:
            raise RuntimeError(f"launched run {run_id} ended {run.status.value} (see {home / 'dagster_dev.log'})")
        figures = step_breakdown(instance, run_id, submitted)
        ends = [r.timestamp for r in instance.all_logs(run_id, of_type=dg.DagsterEventType.RUN_SUCCESS)]
        launched = ends[-1] - submitted
    finally:
        _stop_group(dev)
        log.close()
    warm, p = _wall(cmd + ["--force"], env)
    if p.returncode:
        raise RuntimeError(f"warm CLI sweep failed (exit {p.returncode}): {p.stderr.strip()[-800:]}")
    from kernel_assets.executors import executor_kind

    out = {"dagster_home": str(home), "spec": spec_path.name, "cli_s": round(warm, 2), "cli_cold_s": round(cold, 2), "launched_s": round(launched, 2),
           "ratio": round(launched / warm, 3), "executor": executor_kind(), "run_id": run_id,
           "cpus": os.cpu_count(), "load_average_at_launch": round(load, 2), "load_average_end": round(os.getloadavg()[0], 2),
           **figures}
    return out  # the home is kept: its event log is the figures' evidence (dagster_home in the JSON)


def launched_lines(fig: dict) -> list[str]:
    run = fig["run"]
    lines = [f"launched vs CLI, {fig['spec']}, executor {fig['executor']}, {fig['cpus']} CPUs, load average "
             f"{fig['load_average_at_launch']} at launch, {fig['load_average_end']} at the end; DAGSTER_HOME {fig['dagster_home']}",
             f"CLI (warm caches, --force) {fig['cli_s']:.1f} s; CLI cold {fig['cli_cold_s']:.1f} s; launched by dagster dev "
             f"{fig['launched_s']:.1f} s; ratio launched/CLI {fig['ratio']:.2f}",
             f"launched run: submit to RUN_START {run['launch_s']} s; first step to last {run['steps_first_to_last_s']} s; "
             f"between steps {run['between_steps_s']} s",
             f"{'step':<24}{'process':>9}{'io':>8}{'events':>8}{'work':>8}{'wall':>8}"]
    tot = dict.fromkeys(("process_start_s", "io_s", "events_s", "work_s", "wall_s"), 0.0)
    for key, st in fig["steps"].items():
        lines.append(f"{key:<24}{st['process_start_s']:>9.2f}{st['io_s']:>8.2f}{st['events_s']:>8.2f}{st['work_s']:>8.2f}"
                     f"{st['wall_s']:>8.2f}")
        for k in tot:
            tot[k] += st[k]
    lines.append(f"{'total':<24}{tot['process_start_s']:>9.2f}{tot['io_s']:>8.2f}{tot['events_s']:>8.2f}{tot['work_s']:>8.2f}"
                 f"{tot['wall_s']:>8.2f}")
    return lines


def main() -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("spec", nargs="?", default=str(REPO / "specs" / "gemm_h100_bf16.yaml"))
    ap.add_argument("--env", default="local", choices=["local", "gpu"], help="resource set: gpu = the cuda backend")
    ap.add_argument("--skip-in-process", action="store_true", help="only the CLI and --help figures")
    ap.add_argument("--vs", type=Path, help="another kregress checkout: cold sweeps of both in turn, ratio A/B (only that)")
    ap.add_argument("--pairs", type=int, default=3, help="with --vs: A/B pairs (default 3)")
    ap.add_argument("--launched", action="store_true", help="the CLI against a run launched by `dagster dev` (only that)")
    ap.add_argument("--json", type=Path, metavar="OUT", help="with --launched: write the figures as JSON to OUT")
    args = ap.parse_args()
    spec_path = Path(args.spec).resolve()
    from kregress.core.spec import load_spec

    spec = load_spec(spec_path)
    print(f"spec {spec_path.name} (env {args.env}): {spec.search.variants_per_round} variants x up to "
          f"{spec.search.max_rounds} rounds, {len(spec.correctness_shapes)} correctness shapes, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f}")
    if args.launched:
        import json

        fig = launched_figures(spec_path, args.env)
        for line in launched_lines(fig):
            print(line, flush=True)
        if args.json:
            args.json.write_text(json.dumps(fig, indent=1))
        return 0
    if args.vs:
        for line in vs_lines(spec_path, args.env, args.vs.resolve(), args.pairs):
            print(line, flush=True)
        return 0
    for line in help_lines():
        print(line, flush=True)
    for line in cold_breakdown_lines(spec_path, args.env):
        print(line, flush=True)
    for line in cli_lines(spec_path, args.env):
        print(line, flush=True)
    if not args.skip_in_process:
        for line in in_process_lines(spec_path, args.env):
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
