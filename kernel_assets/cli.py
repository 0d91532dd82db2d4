"""`kregress`: run a sweep in-process through Dagster, validate specs, and the gateway tools.

    kregress sweep specs/gemm_h100_bf16.yaml      # whole graph for one spec, with progress
    kregress specs validate specs/*.yaml          # check specs, run nothing

Start-up imports nothing heavy: Dagster, Triton and torch are imported by the commands that need them,
and a plugin's module (PLUGINS) is imported only when its command runs (``kregress --help`` reads the
plugins' command names and help from their source).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import importlib
import importlib.util
import json
import logging
import os
import re
import signal
import socket
import sys
import threading
import time
from pathlib import Path

from kregress.core import paths
from kregress.core.names import COMMAND_ENV, RESOURCE_ENVS, STRATEGIES, resource_env

# Subcommands contributed by other modules: each exposes register(subparsers).
PLUGINS = ("kernel_assets.cli_usage", "kernel_assets.clients.cli", "kernel_assets.cli_family", "kernel_assets.cli_replay",
           "kernel_assets.cli_judge")

# Exit codes. A bad spec is 2 wherever a spec is read (sweep, specs validate, review).
EXIT_OK, EXIT_FAILED, EXIT_BAD_SPEC, EXIT_BUDGET, EXIT_NO_PROPOSAL = 0, 1, 2, 3, 4
EXIT_CANNOT_RUN = 2  # sweep: the chosen backend cannot work on this host (refused before any run is created)
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT, as a shell reports it)
EXIT_NOT_FOUND = 1  # history show: no sweep of that task recorded
SWEEP_EPILOG = ("exit codes: 0 done (or unchanged since the last sweep); 1 a step failed (the reason is printed on one "
                "line); 2 the spec is invalid, or the backend asked for cannot run on this host (refused before any run starts); "
                "3 the token budget was exceeded, or refused every prompt so that no model "
                "call was sent (--budget-overshoot warn: a warning); 4 strategy llm and no round produced a usable "
                "proposal (the round's line names the cause and the fix); 130 interrupted (Ctrl-C)")
VALIDATE_EPILOG = "exit codes: 0 every spec is valid; 2 at least one is not (one line per problem, naming file and field)"
HISTORY_EPILOG = "exit codes: 0 shown; 1 no sweep of that task is recorded under this DAGSTER_HOME"
# Test hook: `step:<step_key>` (at that step's start) or `log:<text>` (after a progress line containing text)
# makes the sweep process SIGKILL itself, as a crash would. Only tests set it.
KILL_ENV = "KREGRESS_TEST_KILL_AT"


def _ensure_home(arg: str | None) -> Path:
    home = Path(arg).resolve() if arg else paths.home()
    home.mkdir(parents=True, exist_ok=True)
    os.environ["DAGSTER_HOME"] = str(home)
    if not (home / "dagster.yaml").exists():
        repo_yaml = paths.REPO_ROOT / "dagster_home" / "dagster.yaml"
        if repo_yaml.exists() and repo_yaml.parent != home:
            tmp = home / f".dagster.yaml.{os.getpid()}"
            tmp.write_text(repo_yaml.read_text())
            tmp.replace(home / "dagster.yaml")  # atomic: a parallel first sweep never reads half a file
    return home


# --- errors on one line ----------------------------------------------------------------------------


def _error_chain(err) -> list:
    """A SerializableErrorInfo and its causes/contexts, outermost first."""
    out, seen = [], set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        out.append(err)
        err = getattr(err, "cause", None) or getattr(err, "context", None)
    return out


def failure_line(err) -> str:
    """What a user reads for a failed step: a classified gateway error's ``[class] ... Fix: ...`` line when the
    cause chain holds one, else the innermost error as ``Type: first line``, never Dagster's wrapper."""
    from kregress.core.endpoints import gateway_error_line

    if err is None:
        return "no error recorded"
    from resources.ledger import ledger_error_line

    chain = _error_chain(err)
    for e in chain:
        line = ledger_error_line(getattr(e, "message", "") or "")
        if line:  # the file and the fix; the exception's name tells a user nothing more
            return line
    for e in chain:
        line = gateway_error_line(getattr(e, "message", "") or "")
        if line:
            cls = getattr(e, "cls_name", "") or ""
            return f"{cls}: {line}" if cls and cls not in line else line
    wrappers = {"DagsterExecutionStepExecutionError", "DagsterUserCodeExecutionError", "DagsterExecutionInterruptedError"}
    user = [e for e in chain if getattr(e, "cls_name", "") not in wrappers] or chain
    e = user[-1] if len(user) > 1 else user[0]
    msg = " ".join((getattr(e, "message", "") or "").split())
    cls = getattr(e, "cls_name", "") or ""
    msg = msg.removeprefix(f"{cls}: ") if cls else msg
    return f"{cls}: {msg}"[:600] if cls else msg[:600]


# --- progress display ------------------------------------------------------------------------------

_IMPORTED_AT = time.perf_counter()


def process_started_at() -> float:
    """When this process started, on the ``time.perf_counter`` clock: the progress clock counts from the
    launch, not from the end of the imports (Linux: /proc/self/stat's start time against /proc/uptime;
    elsewhere, the import of this module)."""
    try:
        start_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        age = uptime - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return _IMPORTED_AT
    return time.perf_counter() - max(0.0, age)


def invoked_as() -> str:
    """The command a user can paste to run kregress again, as they ran it: ``.venv/bin/kregress`` when
    that is what they typed, ``kregress`` when it came from PATH, ``python -m kernel_assets.cli`` otherwise."""
    arg0 = sys.argv[0] if sys.argv else ""
    name = Path(arg0).name
    if name == "kregress" or name.startswith("kregress."):
        if os.sep not in arg0:
            return "kregress"
        try:
            return os.path.relpath(arg0) if not os.path.relpath(arg0).startswith("..") else arg0
        except ValueError:
            return arg0
    exe = os.path.relpath(sys.executable) if not os.path.relpath(sys.executable).startswith("..") else sys.executable
    return f"{exe} -m kernel_assets.cli"

ROUND_STEPS = ("suggestions", "variants", "profiles")  # the steps of one round, in order
_ROUND_STEP = re.compile(r"^round_(\d+)_(suggestions|variants|profiles)$")
_SKIPPED = re.compile(r"^round (\d+) skipped: (.*)$")
_UNEVALUATED_CHECKS = re.compile(r"^op '[^']+' did not yield or return expected outputs \{.*\}\.?$", re.S)
_NOT_CHECKED = re.compile(r"^check (\S+) not checked: (.*)$", re.S)  # kernel_assets.assets.NotChecked.line


INTERRUPT_ERRORS = ("DagsterExecutionInterruptedError", "KeyboardInterrupt")


def is_interrupt(err) -> bool:
    """Whether a Dagster error (a SerializableErrorInfo) is a Ctrl-C, anywhere in its chain."""
    return any(getattr(e, "cls_name", None) in INTERRUPT_ERRORS for e in _error_chain(err))


class SweepInterrupted(KeyboardInterrupt):
    """Ctrl-C ended the run: Dagster ended it as a failure, the CLI has marked it canceled."""

    def __init__(self, run_id: str):
        super().__init__(run_id)
        self.note = f"; run {run_id} marked canceled"


class _Progress(logging.Handler):
    """Turns Dagster's step events and the assets' log lines into a compact progress display.

    A failed step prints one line with the user-facing reason; a failed check names the variants and why;
    a skipped round prints once, numbered with the range of its steps ("[11-13/16] round 4 skipped: ..."),
    and its steps print nothing, so the numbering stays consecutive."""

    def __init__(self, total_steps: int, stream=None):
        super().__init__(logging.DEBUG)
        self.total = total_steps
        self.done = 0
        self.t0 = process_started_at()  # the clock counts from the launch, imports included
        self.stream = stream
        self.failures: list[tuple[str, str]] = []  # (step, one line)
        self.skipped_rounds: set[int] = set()
        self.not_checked: set[str] = set()  # the reasons of "check X not checked: why" lines already printed
        self._pending: str | None = None  # a round's suggestions step line, held until we know it ran
        self.interrupted = False  # a step ended by Ctrl-C
        self.kill_at = os.environ.get(KILL_ENV, "")

    def emit(self, record: logging.LogRecord) -> None:
        meta = getattr(record, "dagster_meta", None) or {}
        event = meta.get("dagster_event")
        step = meta.get("step_key") or ""
        elapsed = f"{time.perf_counter() - self.t0:6.1f}s"
        if event is not None:
            kind = event.event_type_value
            if kind == "STEP_START":
                self._flush()
                m = _ROUND_STEP.match(step)
                line = f"{elapsed} [{self.done + 1:>2}/{self.total}] {step} ..."
                if m and int(m.group(1)) in self.skipped_rounds:
                    pass  # the round was already reported as skipped
                elif m and m.group(2) == "suggestions":
                    self._pending = line
                else:
                    self._line(line)
                if self.kill_at == f"step:{step}":
                    self._die()
            elif kind == "STEP_SUCCESS":
                self.done += 1
            elif kind == "STEP_FAILURE":
                self._flush()
                self.done += 1
                if is_interrupt(getattr(event.event_specific_data, "error", None)):
                    self.interrupted = True  # Ctrl-C: main() says so on one line
                    return
                why = failure_line(getattr(event.event_specific_data, "error", None))
                self.failures.append((step, why))
                self._line(f"{elapsed} FAILED {step}: {why}")
            elif kind == "ASSET_CHECK_EVALUATION":
                data = event.event_specific_data
                if not data.passed:
                    self._flush()
                    detail = (data.description or "").strip() or _check_detail(data.metadata)
                    self._line(f"{elapsed}   check {data.check_name} FAILED ({data.severity.value})"
                               + (f": {' '.join(detail.split())[:400]}" if detail else ""))
            return
        msg = meta.get("orig_message") or record.getMessage()
        if _UNEVALUATED_CHECKS.match(msg or ""):
            return  # Dagster's note on a check that yielded no result: the asset said why on its own line
        if record.levelno >= logging.INFO and msg and not msg.startswith(("Finished", "Started", "Executing", "Dependencies for step")):
            nc = _NOT_CHECKED.match(msg)
            if nc:  # a check that could not run: said once per reason (every round of a replay has the same one)
                if nc.group(2) not in self.not_checked:
                    self.not_checked.add(nc.group(2))
                    self._flush()
                    self._line(f"{elapsed}   {' '.join(msg.split())[:300]}")
                return
            m = _SKIPPED.match(msg)
            if m:
                self.skipped_rounds.add(int(m.group(1)))
                self._pending = None
                first = self.done + 1
                span = f"{first}-{min(first + len(ROUND_STEPS) - 1, self.total)}" if self.total > first else f"{first:>2}"
                self._line(f"{elapsed} [{span}/{self.total}] round {m.group(1)} skipped: {m.group(2)} (its "
                           f"{len(ROUND_STEPS)} steps run nothing)")
                return
            self._flush()
            self._line(f"{elapsed}   {msg}")

    def _flush(self) -> None:
        if self._pending:
            self._line(self._pending)
            self._pending = None

    def _line(self, text: str) -> None:
        print(text, file=self.stream or sys.stderr, flush=True)
        if self.kill_at.startswith("log:") and self.kill_at[4:] in text:
            self._die()

    @staticmethod
    def _die() -> None:
        os.kill(os.getpid(), signal.SIGKILL)


def _check_detail(metadata) -> str:
    for key in ("problems", "violations", "details", "error"):
        v = (metadata or {}).get(key)
        text = str(getattr(v, "value", getattr(v, "text", v)) or "")
        if text and text not in ("none", "_none_", "None"):
            return text
    return ""


# --- unchanged since the last sweep ----------------------------------------------------------------


def _code_hash() -> str:
    """Hash of the project's own Python sources (what a sweep runs), read from disk without importing them."""
    h = hashlib.sha256()
    for pkg in ("kregress", "kernel_assets", "resources", "kernels"):
        spec = importlib.util.find_spec(pkg)
        for root in (spec.submodule_search_locations or []) if spec else []:
            for f in sorted(Path(root).rglob("*.py")):
                h.update(str(f.relative_to(root)).encode())
                h.update(f.read_bytes())
    return h.hexdigest()[:16]


def _gpu_probe() -> str:
    """Whether this host exposes an NVIDIA device to us, without importing torch (device nodes and the
    visibility variable): part of what picks the `auto` backend."""
    return f"{os.path.exists('/dev/nvidiactl')}:{os.environ.get('CUDA_VISIBLE_DEVICES', '')}"


def _file_sha(path: str | Path) -> str:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]
    except OSError:
        return "missing"


def _run_inputs(args: argparse.Namespace, code_hash: str) -> dict[str, str]:
    """What decides a sweep's outcome outside the spec and the kernels: code, environment, CLI overrides."""
    return {
        "code_hash": code_hash,
        "env": resource_env(getattr(args, "env", None)),
        "backend_arg": args.backend or "",
        "strategy_arg": args.strategy or "",
        "gpu": _gpu_probe(),
        "model": os.environ.get("TAOTOKEN_MODEL_ID", ""),
        "base_url": os.environ.get("TAOTOKEN_BASE_URL", ""),
    }


def sweep_fingerprint(spec, family_files: dict[str, str], args: argparse.Namespace, code_hash: str | None = None) -> dict:
    """What decides a sweep's outcome besides the caches: the spec's content hash (schema-checked, no
    family imported), the bytes of the family's kernel files (the list the last binding gave), the
    project's code and every run input. If all of it equals the last successful sweep's, re-running it
    would redo the same work to write the same report."""
    return {"spec_hash": spec.content_hash(), "family_files": dict(family_files), **_run_inputs(args, code_hash or _code_hash())}


def _times_on_a_gpu(args: argparse.Namespace) -> bool:
    """A sweep that measures on a GPU is never answered from the last one: its timings are the point
    (clocks, drivers and neighbours change while the spec does not)."""
    env = resource_env(getattr(args, "env", None))
    return args.backend == "cuda" or env == "gpu" or (args.backend in (None, "", "auto") and os.path.exists("/dev/nvidiactl"))


def _unchanged(home: Path, spec, args: argparse.Namespace) -> dict | None:
    """The last successful sweep's record when nothing that decides the outcome changed since, else None.
    Needs no family import: the family's files are the ones the last binding listed, hashed again."""
    if args.force or _times_on_a_gpu(args):
        return None
    try:
        last = json.loads(_last_sweep_file(home, spec.task_id).read_text())
    except (OSError, ValueError):
        return None
    files = (last.get("fingerprint") or {}).get("family_files") or {}
    if not files or not Path(last.get("report", "")).is_file():
        return None
    if last.get("fingerprint") != sweep_fingerprint(spec, {f: _file_sha(f) for f in files}, args):
        return None
    # the report it names must still be the one it describes: an edited, replaced or older record re-runs
    report_sha = _report_sha(last["report"])
    if report_sha != last.get("report_sha256"):
        _say(f"kregress: sweep {spec.task_id}: {last['report']} is not the report run {last.get('run_id', '?')} wrote "
             f"(its sha256 changed since); re-running")
        return None
    return last


def _report_sha(report: str | Path) -> str:
    """sha256 of report.md and of the tables beside it (verdicts.parquet, variants.parquet): what the
    "unchanged" answer points the user to."""
    h = hashlib.sha256()
    d = Path(report).parent
    for f in (Path(report), d / "verdicts.parquet", d / "variants.parquet"):
        try:
            h.update(f.read_bytes())
        except OSError:
            h.update(b"missing")
    return h.hexdigest()


def _last_sweep_file(home: Path, task_id: str) -> Path:
    return home / "kregress_cli" / "last_sweep" / f"{task_id}.json"


def _record_sweep(home: Path, task_id: str, record: dict) -> None:
    f = _last_sweep_file(home, task_id)
    f.parent.mkdir(parents=True, exist_ok=True)
    tmp = f.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record, indent=1, sort_keys=True))
    tmp.replace(f)


# --- commands --------------------------------------------------------------------------------------


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _spec_problems(path: str) -> str:
    """Every problem of a spec file in one message: schema and the family's checks together."""
    from kregress.core.bind import load_bound
    from kregress.core.spec import SpecError

    try:
        load_bound(path)
    except SpecError as exc:
        return str(exc)
    return f"{path}: the spec could not be loaded"


def _load(args: argparse.Namespace):
    """The spec, schema-checked (no family imported), or None after printing every problem."""
    from kregress.core.spec import SpecError, load_spec

    try:
        return load_spec(args.spec)
    except SpecError:
        print(f"error: {_spec_problems(args.spec)}", file=sys.stderr)
        return None


def _bind(spec):
    """The spec bound to its family (the run's one binding), or None after printing why not."""
    from kregress.core.bind import bind
    from kregress.core.spec import SpecError

    try:
        return bind(spec)
    except SpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None


def _prepare(args: argparse.Namespace, spec, start_workers: bool = False, capture_compute_logs: bool = True):
    """(spec, home, resources, instance) for a command that runs one spec in-process. A bound spec (a
    sweep) becomes the run's ``run_context`` resource: its first step takes it and validates nothing again. ``start_workers``
    (a bound spec): start a CPU sweep's workers first."""
    home = _ensure_home(args.dagster_home)
    spec_file = str(Path(args.spec).resolve())
    os.environ["KREGRESS_SPEC_FILES"] = os.pathsep.join(
        [spec_file] + [f for f in os.environ.get("KREGRESS_SPEC_FILES", "").split(os.pathsep) if f and f != spec_file])
    if start_workers:
        _start_cpu_workers(args, spec)
    from kernel_assets.definitions import build_resources
    from kernel_assets.run_context import HandedRunContext
    from kernel_assets.run_guard import prepared_instance
    from kernel_assets.specs_resource import SpecStore
    from kregress.core.bind import BoundSpec

    resources = build_resources(getattr(args, "env", None))
    resources["specs"] = SpecStore()
    if isinstance(spec, BoundSpec):  # the run's context starts from this binding (its first step takes it)
        resources["run_context"] = HandedRunContext(spec)
    instance = prepared_instance(home, spec.task_id, log=_say, capture_compute_logs=capture_compute_logs)
    return spec, home, resources, instance


def _start_cpu_workers(args: argparse.Namespace, bound) -> None:
    """On a CPU sweep, start the compile and interpreter workers now: each imports torch and Triton for
    seconds, which then overlap this process's Dagster import and instance set-up instead of following
    them, and once ready they compile and check the baseline (its answers go to the first step, which
    would otherwise start on them only then). The interpreter backend's pools adopt them (same
    environment); none are started for a GPU sweep, a recorded family or an external kernel (only Triton
    families compile)."""
    from kregress.core.family import TritonFamily

    if _times_on_a_gpu(args) or args.backend == "cuda" or not isinstance(bound.family, TritonFamily):
        return
    from resources.workers import reserve, worker_env

    n = min(min(4, os.cpu_count() or 1), bound.spec.search.variants_per_round)
    root = paths.cache_dir()
    reserve(worker_env(root, interpret=False), n)
    reserve(worker_env(root, interpret=True), n)
    if args.backend in (None, "", "auto", "interpreter"):
        from resources.gpu import run_baseline_ahead

        run_baseline_ahead(bound, root)


def _budget_verdict(resources: dict, spec, run_id: str) -> list[str]:
    """Why the sweep's token use went over its budget (one typed breach a line, ``kregress.core.budget``); []
    when within. The run's budget scope is the one every model call of the run counted against."""
    from kernel_assets.usage import budget_report
    from kregress.core.budget import budget_scope

    scope = budget_scope(run_id, spec.task_id)  # the CLI's run is its own root
    return [b.text for b in budget_report(resources["ledger"].get_ledger(), spec.budget, scope.sweep).breaches]


_BACKQUOTED = re.compile(r"`([^`]*)`")
_SENTENCE_END = re.compile(r"(?<=\.)\s+(?=[A-Z])")


def next_lines(text: str, command: str | None = None) -> list[str]:
    """The report's ``next_step`` text as lines to act on: per sentence, the explanation on one line
    (``next: ...``, its command named "the command below") and then the command alone on the next line, quoted
    for a POSIX shell, so that pasting that line runs it. A command is a back-quoted part that starts with the
    kregress the user invoked (``command``, default ``$KREGRESS_COMMAND`` or ``kregress``); other back quotes
    become plain quotes. Never a back quote in what is printed: bash would run what they enclose."""
    import shlex

    cmd = command or os.environ.get(COMMAND_ENV) or "kregress"
    lines: list[str] = []
    for sentence in _SENTENCE_END.split(" ".join(text.split())):
        found: list[str] = []
        parts, at = [], 0
        for m in _BACKQUOTED.finditer(sentence):
            inner = m.group(1).strip()
            parts.append(sentence[at:m.start()])
            at = m.end()
            if inner == cmd or inner.startswith(cmd + " "):
                parts.append("" if found else "{below}")
                found.append(shlex.join(shlex.split(inner)))
            else:
                parts.append(f"'{inner}'")
        explained = ("".join(parts) + sentence[at:]).replace("`", "'")
        below = "the command below" if len(found) == 1 else "the commands below"
        lines.append("next: " + explained.replace("{below}", below).strip())
        lines.extend(found)
    return lines if text.strip() else []


def cuda_refusal(args: argparse.Namespace, bound) -> str:
    """One line when the sweep asks for the cuda backend (``--backend cuda``, or ``--env gpu`` without a
    ``--backend``) and this host cannot give it, '' otherwise. A recorded family replays: it needs no GPU."""
    from kregress.core.family import RecordedFamily

    how = "--backend cuda" if args.backend == "cuda" else (
        f"--env gpu ({'KREGRESS_ENV' if not getattr(args, 'env', None) else 'the option'})"
        if resource_env(getattr(args, "env", None)) == "gpu" and not args.backend else "")
    if not how or isinstance(bound.family, RecordedFamily):
        return ""
    from resources.gpu import cuda_unavailable

    why = cuda_unavailable()
    if not why:
        return ""
    return (f"kregress: sweep {bound.spec.task_id}: {how} cannot run on this host: {why}; nothing was started. Run it "
            f"on a GPU host, or here without {how.split(' (')[0]} (the interpreter backend: compile facts and modelled "
            "latency)")


def _say_unchanged(task_id: str, last: dict) -> int:
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(last.get("ts", 0)))
    _say(f"kregress: sweep {task_id} unchanged since run {last['run_id']} ({when}): same spec hash "
         f"{last['fingerprint']['spec_hash']}, kernel and code versions, backend and strategy; nothing re-run "
         f"(--force re-runs it)")
    print(f"report: {last['report']}")
    if last.get("verdicts"):
        print(last["verdicts"])
    for line in next_lines(last.get("next") or ""):
        print(line)
    return EXIT_OK


def cmd_sweep(args: argparse.Namespace) -> int:
    spec = _load(args)  # schema only: no family, no torch, no Triton
    if spec is None:
        return EXIT_BAD_SPEC
    home = paths.home() if not args.dagster_home else Path(args.dagster_home).resolve()
    last = _unchanged(home, spec, args)  # answered before anything heavy is imported
    if last is not None:
        return _say_unchanged(spec.task_id, last)
    bound = _bind(spec)  # the run's one binding: the family's checks, the kernel hash
    if bound is None:
        return EXIT_BAD_SPEC
    refused = cuda_refusal(args, bound)
    if refused:  # before any run exists: no partition is left Failed by a run that could not do its work
        _say(refused)
        return EXIT_CANNOT_RUN
    _say(f"kregress: sweep {spec.task_id}: spec valid, family {spec.kernel_family} bound; starting workers and "
         f"Dagster (seconds before the first step)")
    loaded, (bound, home, resources, instance) = spec, _prepare(args, bound, start_workers=True, capture_compute_logs=False)
    spec = bound.spec
    import dagster as dg

    from kernel_assets.constants import ROUNDS, SWEEP_JOB
    from kernel_assets.definitions import build_definitions
    from kernel_assets.run_guard import run_tags
    from resources.gpu import backend_for, compiled_backend

    if args.backend:
        resources["bench"] = compiled_backend(args.backend)
    handler = _Progress(total_steps=0)
    # A blocking check that could not run yields no result (kernel_assets.assets.NotChecked) and Dagster warns
    # that the downstream steps proceed ungated; the progress already said "check ... not checked: why".
    logging.getLogger("dagster._core.execution.plan.active").addFilter(
        lambda rec: "emitted no result" not in rec.getMessage())

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
    backend = backend_for(bound.family, resources['bench'], resources['replay']).kind
    _say(f"kregress: sweep {spec.task_id} ({spec.kernel_family}, {spec.dtype}, {spec.hardware.arch}); "
         f"DAGSTER_HOME={home}; backend={backend}; strategy={args.strategy or spec.search.strategy}")
    # The report's libraries load in the background while this process mostly waits on its workers.
    threading.Thread(target=_warm_report_imports, daemon=True).start()
    result = job.execute_in_process(partition_key=spec.task_id, instance=instance, run_config=run_config,
                                    raise_on_error=False, tags=run_tags())
    if handler.interrupted or any(is_interrupt(getattr(e.event_specific_data, "error", None)) for e in result.all_events
                                  if e.event_type_value in ("STEP_FAILURE", "RUN_FAILURE")):
        # Dagster ends an interrupted run as failed: canceled is what it was (no partition reads Failed)
        instance.report_run_canceled(instance.get_run_by_id(result.run_id), message="kregress: interrupted (Ctrl-C)")
        instance.event_log_storage.free_concurrency_slots_for_run(result.run_id)
        raise SweepInterrupted(result.run_id)
    try:
        over = _budget_verdict(resources, spec, result.run_id)
    except Exception as exc:  # noqa: BLE001 - an unreadable ledger: its one line, not a traceback
        from resources.ledger import LedgerConnectionError

        if not isinstance(exc, LedgerConnectionError):
            raise
        _say(f"kregress: sweep {spec.task_id}: the token ledger could not be read after the run: {exc}")
        return EXIT_FAILED
    budget_rc = EXIT_OK
    if over:
        warn = args.budget_overshoot == "warn"
        _say(f"kregress: {'warning: ' if warn else ''}token budget EXCEEDED in sweep {spec.task_id} (run {result.run_id}): "
             + "; ".join(over))
        budget_rc = EXIT_OK if warn else EXIT_BUDGET
    if not result.success:
        failures = handler.failures or [
            (e.step_key, failure_line(getattr(e.event_specific_data, "error", None)))
            for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
        # the reason was printed once, on the step's FAILED line; say it here only if no such line was printed
        first = "" if handler.failures else "; " + (failures[0][1] if failures else "see the run in dagster")
        _say(f"kregress: sweep {spec.task_id} FAILED (run {result.run_id}); failed steps: "
             f"{', '.join(s for s, _ in failures) or '-'}{first}")
        return EXIT_FAILED
    summary = result.output_for_node("verdict_report", "verdict_report")  # its output is named for the asset
    counts = summary["counts"]
    report = f"{summary['report_dir']}/report.md"
    causes = summary.get("causes") or {}
    shown = ", ".join(f"{c} {n}" for c, n in causes.items() if n or c in ("slower", "wrong", "infeasible"))
    regress = f"REGRESS {counts['REGRESS']}" + (f" ({shown})" if counts["REGRESS"] else "")
    ties = [t for t in summary.get("best_ties") or [] if t != summary["best"]]
    best = ("no best (nothing was timed)" if summary.get("best_kind") == "none" else
            f"{summary.get('best_kind', 'best')} {summary['best']}" + (f" (tied with {', '.join(ties)})" if ties else ""))
    verdicts = (f"verdicts: PASS {counts['PASS']}, {regress}, NEEDS_REVIEW {counts['NEEDS_REVIEW']} "
                f"({summary['variants']} variants; {best}; stopped: {summary['stopped'] or 'no'})")
    print(f"report: {report}")
    print(verdicts + ("; budget EXCEEDED" if over else ""))
    for line in next_lines(summary.get("next_step") or ""):  # model evidence only: how to see measured verdicts
        print(line)
    strategy = args.strategy or spec.search.strategy
    if strategy == "llm" and not (summary.get("sources") or {}).get("llm") and not over:
        _say(f"kregress: sweep {spec.task_id}: no round produced a usable proposal from the model "
             f"(stopped: {summary['stopped'] or 'no'}); exit {EXIT_NO_PROPOSAL}")
        return EXIT_NO_PROPOSAL
    if not over:
        fingerprint = sweep_fingerprint(loaded, {str(f): _file_sha(f) for f in bound.family.source_files()}, args)
        _record_sweep(home, spec.task_id, {"run_id": result.run_id, "ts": time.time(), "fingerprint": fingerprint,
                                           "task_id": spec.task_id,
                                           "report": report, "report_sha256": _report_sha(report), "verdicts": verdicts,
                                           "next": summary.get("next_step") or ""})
    return budget_rc


def _warm_report_imports() -> None:
    """Import what verdict_report needs (matplotlib, pyarrow's Parquet writer) ahead of it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot  # noqa: F401
    import pyarrow.parquet  # noqa: F401


def cmd_review(args: argparse.Namespace) -> int:
    spec = _load(args)  # schema only: the kernel change under review may break the spec's baseline
    if spec is None:
        return EXIT_BAD_SPEC
    spec, home, resources, instance = _prepare(args, spec)
    import dagster as dg

    from kernel_assets.definitions import REVIEW_ASSETS
    from kernel_assets.run_guard import run_tags

    config = {"base_ref": args.base or "", "use_model": not args.offline, "patch_variant": args.patch or ""}
    print(f"kregress: reviewing the kernel diff for {spec.task_id} (base: {args.base or 'last reviewed revision, else HEAD or the commit before the last one touching the kernel'})",
          file=sys.stderr)
    result = dg.materialize(REVIEW_ASSETS, partition_key=spec.task_id, instance=instance, resources=resources,
                            run_config={"ops": {"kernel_source_review": {"config": config}},
                                        "loggers": {"console": {"config": {"log_level": "WARNING"}}}},
                            raise_on_error=False, tags=run_tags())
    if not result.success:
        why = [failure_line(getattr(e.event_specific_data, "error", None)) for e in result.all_events
               if e.event_type_value == "STEP_FAILURE"]
        print(f"kregress: review FAILED (run {result.run_id}): {' '.join(why)[:800]}", file=sys.stderr)
        return 1
    out = result.output_for_node("kernel_source_review")
    print(f"diff: {out['base_ref']} ({out['base_sha'][:10]}) -> working tree; {out['reviewed_by']}")
    print(f"review: {home / 'reports' / spec.task_id / 'review.md'}")
    return 0


def cmd_specs_validate(args: argparse.Namespace) -> int:
    from kregress.core.bind import load_bound
    from kregress.core.spec import SpecError

    bad = 0
    for f in args.files:
        try:
            spec = load_bound(f).spec  # the schema and the family's checks, every problem at once
        except SpecError as exc:
            bad += 1
            print(str(exc), file=sys.stderr)
            continue
        except Exception as exc:  # noqa: BLE001 - one line per file, never a traceback
            bad += 1
            print(f"{f}: could not be validated: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}", file=sys.stderr)
            continue
        print(f"{f}: ok ({spec.task_id}, {spec.kernel_family}, {len(spec.shape_matrix)} shapes, hash {spec.content_hash()})")
    return EXIT_BAD_SPEC if bad else EXIT_OK


def cmd_history_show(args: argparse.Namespace) -> int:
    _ensure_home(args.dagster_home)
    from kernel_assets import history

    try:
        text = history.show(args.task_id)
    except LookupError as exc:
        print(f"error: {exc.args[0]}", file=sys.stderr)
        return EXIT_NOT_FOUND
    print(text)
    for a in history.acks(args.task_id):
        print(f"acknowledged {a['run_id'][:8]} by {a['by']}: {a['why']}")
    return EXIT_OK


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


# --- plugins, imported only when their command runs -----------------------------------------------


def plugin_commands(module: str) -> list[tuple[str, str]] | None:
    """(command, help) that ``module.register(sub)`` adds, read from its source without importing it; None when
    the source does not say plainly (the module is then imported)."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    try:
        tree = ast.parse(Path(spec.origin).read_text())
    except (OSError, SyntaxError):
        return None
    reg = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "register"), None)
    if reg is None or not reg.args.args:
        return None
    sub = reg.args.args[0].arg
    out = []
    for node in ast.walk(reg):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_parser"
                and isinstance(node.func.value, ast.Name) and node.func.value.id == sub):
            if not node.args or not isinstance(node.args[0], ast.Constant) or not isinstance(node.args[0].value, str):
                return None
            help_kw = next((k.value for k in node.keywords if k.arg == "help"), None)
            try:
                help_text = ast.literal_eval(help_kw) if help_kw is not None else None
            except ValueError:
                return None
            out.append((node.args[0].value, help_text))
    return out or None


def _command_of(argv: list[str]) -> str | None:
    return next((a for a in argv if not a.startswith("-")), None)


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The full parser. With ``argv``, a plugin whose command is not the one being run is listed from its
    source (name and help) instead of being imported; without it, every plugin is imported."""
    p = argparse.ArgumentParser(prog="kregress", description="Budgeted, auditable kernel regression sweeps on Dagster.")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("sweep", help="run one spec's whole graph in-process", epilog=SWEEP_EPILOG)
    s.add_argument("spec", help="path to a task spec YAML")
    s.add_argument("--dagster-home", help="default: $DAGSTER_HOME, else ./dagster_home")
    s.add_argument("--env", choices=list(RESOURCE_ENVS), help="resource set (default $KREGRESS_ENV or local)")
    s.add_argument("--backend", choices=["auto", "cuda", "interpreter"], help="override the benchmark backend")
    s.add_argument("--strategy", choices=list(STRATEGIES), help="override the spec's search strategy")
    s.add_argument("--force", action="store_true",
                   help="re-run even when the spec, kernels, code and backend are unchanged since the last sweep")
    s.add_argument("--budget-overshoot", choices=["fail", "warn"], default="fail",
                   help="a sweep over its token budget exits 3 (fail, default) or warns and exits 0 (warn)")
    s.set_defaults(func=cmd_sweep)
    r = sub.add_parser("review", help="review the kernels/ diff that matters to a spec (role review; offline checks without a key)")
    r.add_argument("spec", help="path to a task spec YAML")
    r.add_argument("--base", help="git ref to diff against (default: the revision last reviewed, else HEAD when the kernel has "
                   "uncommitted changes, else the commit before the last one touching it)")
    r.add_argument("--offline", action="store_true", help="no model call: compile-stat deltas and test coverage only")
    r.add_argument("--patch", metavar="VARIANT_ID", help="review the patch `kregress judge` judged as VARIANT_ID instead of the git diff")
    r.add_argument("--dagster-home")
    r.set_defaults(func=cmd_review)
    sp = sub.add_parser("specs", help="work with spec files")
    spsub = sp.add_subparsers(dest="specs_command", required=True)
    v = spsub.add_parser("validate", help="validate spec files; run nothing", epilog=VALIDATE_EPILOG)
    v.add_argument("files", nargs="+")
    v.set_defaults(func=cmd_specs_validate)
    h = sub.add_parser("history", help="baseline history across sweeps")
    hsub = h.add_subparsers(dest="history_command", required=True)
    hs = hsub.add_parser("show", help="the baselines recorded for a task", epilog=HISTORY_EPILOG)
    hs.add_argument("task_id")
    hs.add_argument("--dagster-home")
    hs.set_defaults(func=cmd_history_show)
    ha = hsub.add_parser("ack", help="accept a known step change: that sweep becomes the new reference")
    ha.add_argument("task_id")
    ha.add_argument("--by", required=True, help="who accepts it")
    ha.add_argument("--why", required=True, help="why (e.g. 'driver 560 update, expected +4%%')")
    ha.add_argument("--run-id", help="default: the latest sweep of the task")
    ha.add_argument("--dagster-home")
    ha.set_defaults(func=cmd_history_ack)
    wanted = _command_of(argv) if argv is not None else None
    for mod in PLUGINS:
        listed = plugin_commands(mod) if argv is not None else None
        if listed is not None and wanted not in {name for name, _ in listed}:
            for name, help_text in listed:  # a placeholder: never run, the real parser replaces it when asked for
                sub.add_parser(name, help=help_text, add_help=False)
            continue
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
    os.environ[COMMAND_ENV] = invoked_as()  # what the report's `next:` line tells the user to paste
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(argv).parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt as exc:
        return interrupted(args, getattr(exc, "note", None))


def interrupted(args: argparse.Namespace, note: str | None = None) -> int:
    """Ctrl-C: one line, no traceback. The worker processes end with this process (``resources.workers``
    ends them at exit); a run left STARTED is marked canceled here, so no partition reads Failed for it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C while tidying up prints nothing either
    if note is None:
        try:
            note = _cancel_own_runs()
        except Exception:  # noqa: BLE001 - tidying up after Ctrl-C never prints a traceback
            note = ""
    _say(f"kregress: {getattr(args, 'command', '') or 'command'} interrupted (Ctrl-C){note}; exit {EXIT_INTERRUPTED}")
    return EXIT_INTERRUPTED


def _cancel_own_runs() -> str:
    """Mark the runs this process started and left unfinished as canceled (only when Dagster was imported)."""
    if "dagster" not in sys.modules:
        return ""
    import dagster as dg

    from kernel_assets.run_guard import HOST_TAG, PID_TAG

    instance = dg.DagsterInstance.get()
    live = [dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED,
            dg.DagsterRunStatus.CANCELING, dg.DagsterRunStatus.QUEUED]
    runs = instance.get_runs(filters=dg.RunsFilter(statuses=live, tags={HOST_TAG: socket.gethostname(),
                                                                          PID_TAG: str(os.getpid())}))
    for run in runs:
        instance.report_run_canceled(run, message="kregress: interrupted (Ctrl-C)")
        instance.event_log_storage.free_concurrency_slots_for_run(run.run_id)
    return f"; run {runs[0].run_id} marked canceled" if runs else ""


if __name__ == "__main__":
    sys.exit(main())
