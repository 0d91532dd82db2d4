"""Shared fixtures. Everything here is real: a Triton interpreter child process, a temp DAGSTER_HOME."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

REPO = Path(__file__).resolve().parent.parent


# The slow tier: modules whose tests together take 9 s or more on 2 cores (`pytest --durations=0`, summed
# per module: whole sweeps, servers, sandboxed judgements, compiles, killed processes). Everything else is
# the fast tier, `pytest -m "not slow"`; the README's test command and .ci/run run both tiers. A single
# test can carry @pytest.mark.slow itself.
SLOW_MODULES = frozenset({
    "test_attention.py",
    "test_cuda_family.py",
    "test_bind.py",
    "test_cli_gateway.py",
    "test_compile_facts.py",
    "test_dagster_dev_stop.py",
    "test_gateway_budget.py",
    "test_gateway_failover.py",
    "test_gemm.py",
    "test_gemm_fp8.py",
    "test_gpu_check.py",
    "test_judge_cli.py",
    "test_judge_corpus.py",
    "test_judge_records.py",
    "test_judge_review.py",
    "test_judge_sandbox.py",
    "test_ledger_postgres.py",
    "test_mla_decode.py",
    "test_plugins.py",
    "test_pool.py",
    "test_reliability_kill.py",
    "test_reliability_parallel.py",
    "test_replay_collect.py",
    "test_replay_import.py",
    "test_review.py",
    "test_review_worktree.py",
    "test_run_context.py",
    "test_search_bench.py",
    "test_shared_instance.py",
    "test_sweep.py",
    "test_sweep_llm.py",
    "test_sweep_llm_replay.py",
})


# The README's test command runs on two pytest-xdist workers (`-n 2`), scheduled by module (ModuleScheduling
# below): a module stays on one worker (its module fixtures made once, its tests in file order), and the judging
# modules, which judge their candidates side by side on every core already, are one unit: one after another on
# one worker, first, while the other worker takes everything else. (xdist's own `--dist loadgroup` does not group
# under pytest 9: it renames node ids, which pytest 9 no longer reads back.)
JUDGING_MODULES = frozenset({
    "test_judge_corpus.py",
    "test_judge_sandbox.py",
    "test_mutants_sample.py",
    "test_redteam_families.py",
    "test_upstream36_cheats.py",
})


# The tiers. The README's test command is the default tier, `pytest -m "not long"` (at most 10 minutes on two
# cores); the long tier, `pytest -m long`, holds the judging corpora (every module that judges candidates on the
# interpreter: JUDGING_MODULES, or a module marked `judging`) and the fleet-scale runs (LONG_MODULES). `.ci/run`
# runs both. One cheat per gate check stays in the default tier (tests/test_gate_one_per_check.py).
LONG_MODULES = JUDGING_MODULES | frozenset({
    "test_shared_instance.py",  # the fleet: PostgreSQL, the daemon, a 24-spec backfill
    # The default tier measured 18 minutes on a fresh clone with these in it (10 is its budget): each of these
    # runs whole processes several times over (sweeps and judgements beside each other, pip installs, pytest
    # collections of the suite, dagster dev with Chromium, PostgreSQL with bench/scale.py).
    "test_judge_records.py",  # sweeps and judgements on one spec, in every order: judging
    "test_replay_collect.py",  # the suite's own collection in fresh-clone layouts
    "test_plugins.py",  # a scaffolded plugin pip-installed and swept
    "test_pool.py",  # two processes racing for one device's pool slot, repeated
    "test_paste_and_interrupt.py",  # Ctrl-C of sweeps and of bench/scale.py with its PostgreSQL
    "test_ui_screenshots.py",  # dagster dev and headless Chromium
})


@pytest.hookimpl(optionalhook=True)  # xdist's hook: without xdist (the GPU check's minimal environments) unused
def pytest_xdist_make_scheduler(config, log):
    """`-n N` (xdist's default `--dist load`): one unit of work per module, the judging modules one unit."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "judging" if Path(path).name in JUDGING_MODULES else path

    config.option.loadscopereorder = False  # the units in collection order: the judging one first (the longest)
    return ModuleScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    slow, judging, long = pytest.mark.slow, pytest.mark.judging, pytest.mark.long
    for item in items:
        name = item.path.name
        if name in SLOW_MODULES:
            item.add_marker(slow)
        if name in JUDGING_MODULES:
            item.add_marker(judging)
        if name in LONG_MODULES or item.get_closest_marker("judging") is not None:
            item.add_marker(long)
    if hasattr(config, "workerinput"):  # an xdist worker: the judging unit first (the longest), the rest beside it
        items.sort(key=lambda item: item.path.name not in JUDGING_MODULES)
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except Exception:
        has_gpu = False
    if has_gpu:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; this host has none")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_configure(config):
    """Collection-time guard: the default replay spec and many tests read the recorded file shipped in
    data/replay/ (a same-named file in $KREGRESS_REPLAY_DIR shadows it). Missing or unreadable, that is
    one line here instead of a traceback in every module that loads the spec."""
    from kregress.core.recorded import ENV_DIR, SHIPPED_FILE, ReplayError, ReplayTable, resolve_cache_file

    try:
        ReplayTable.load(resolve_cache_file(SHIPPED_FILE))
    except ReplayError as exc:
        env = os.environ.get(ENV_DIR, "").strip()
        raise pytest.UsageError(f"the tests' recorded data: {exc} (the default replay spec needs {SHIPPED_FILE}, "
                                f"shipped in data/replay/; ${ENV_DIR} is {repr(env) if env else 'unset'} and is "
                                "searched first)") from None


def pytest_terminal_summary(terminalreporter):
    """One line when benchmark replay files are absent: which, where, and how to point at them."""
    from kregress.core.recorded import ENV_DIR, SHIPPED_FILE, missing_benchmark_files, replay_dir

    missing = missing_benchmark_files()
    if missing:
        env = os.environ.get(ENV_DIR, "").strip()
        terminalreporter.write_line(
            f"recorded data: {len(missing)} benchmark file(s) absent from {replay_dir()} ({ENV_DIR} is "
            f"{repr(env) if env else 'unset'}): {', '.join(missing)}; the tests on them skip, the rest use the "
            f"shipped data/replay/{SHIPPED_FILE}")


class InterpreterWorker:
    """One long-lived `python -m kernels.worker` with TRITON_INTERPRET=1 (kernels must be decorated
    in interpreter mode, so it cannot share the test process). Jobs are the worker's JSON jobs."""

    def __init__(self, cache_dir: Path):
        from resources.workers import Worker, worker_env

        self._worker = Worker(worker_env(Path(cache_dir), interpret=True))
        self._worker.wait_ready(180)

    def correctness(self, family: str, config: dict, shapes: list[dict], dtype: str = "fp16", tolerance: float = 1e-2,
                    params: dict | None = None, seed: int = 0, timeout: float = 300) -> dict:
        job = {"op": "correctness", "family": family, "config": config, "dtype": dtype, "shapes": shapes,
               "tolerance": tolerance, "params": params or {}, "device": "cpu", "interpret": True, "seed": seed}
        return self._worker.call(job, timeout)

    def call(self, job: dict, timeout: float = 300) -> dict:
        return self._worker.call(job, timeout)

    def close(self) -> None:
        self._worker.kill()


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch):
    """`kregress sweep` records its spec file in the environment; never let it leak between tests."""
    monkeypatch.setenv("KREGRESS_SPEC_FILES", "")


@pytest.fixture(scope="session")
def interpreter(tmp_path_factory):
    w = InterpreterWorker(tmp_path_factory.mktemp("interp-cache"))
    yield w
    w.close()


@pytest.fixture()
def dagster_home(tmp_path, monkeypatch):
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text((REPO / "dagster_home" / "dagster.yaml").read_text())
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    return home


@pytest.fixture
def srv():
    """A scripted local OpenAI-compatible server (kregress/testing/fake_gateway.py) on 127.0.0.1."""
    from kregress.testing.fake_gateway import FakeOpenAI

    with FakeOpenAI() as s:
        yield s


@pytest.fixture
def ledger(tmp_path):
    from resources.ledger import Ledger

    return Ledger(tmp_path / "ledger.sqlite")
