"""Shared fixtures. Everything here is real: a Triton interpreter child process, a temp DAGSTER_HOME."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

REPO = Path(__file__).resolve().parent.parent


def pytest_collection_modifyitems(config, items):
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
    """A scripted local OpenAI-compatible server (tests/fake_openai.py) on 127.0.0.1."""
    from fake_openai import FakeOpenAI

    with FakeOpenAI() as s:
        yield s


@pytest.fixture
def ledger(tmp_path):
    from resources.ledger import Ledger

    return Ledger(tmp_path / "ledger.sqlite")
