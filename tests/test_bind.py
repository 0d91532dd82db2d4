"""Bind once: a sweep reads, validates and binds its spec one time, and carries the binding through."""

from __future__ import annotations

import pickle
import textwrap
from collections import Counter
from pathlib import Path

import pytest

from kregress.core.bind import BoundSpec, bind, load_bound
from kregress.core.budget import budget_scope
from kregress.core.spec import load_spec

REPO = Path(__file__).resolve().parent.parent
REPLAY = REPO / "specs" / "replay_clblast_rtx3090.yaml"


def _count(monkeypatch, counts: Counter, module, name: str) -> None:
    real = getattr(module, name)

    def counted(*args, **kwargs):
        counts[name] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)


@pytest.mark.slow
def test_a_sweep_binds_and_validates_its_spec_once(tmp_path, monkeypatch):
    """`kregress sweep`: the schema is checked once, the family's checks run once, the kernel hash is read
    from disk once; every later step (and the token assets) gets the binding handed on, never the file."""
    import kernel_assets.definitions  # noqa: F401 - the definitions' own code_version hashing happens at import
    import kregress.core.bind as bind_mod
    import kregress.core.spec as spec_mod
    from kernel_assets.cli import main
    from kregress.core.family import get_family

    counts: Counter = Counter()
    _count(monkeypatch, counts, spec_mod, "parse_spec_data")
    _count(monkeypatch, counts, bind_mod, "bind")
    _count(monkeypatch, counts, bind_mod, "family_problems")
    family_type = type(get_family("replay"))
    real_hash = family_type.source_hash

    def counted_hash(self):
        counts["source_hash"] += 1
        return real_hash(self)

    monkeypatch.setattr(family_type, "source_hash", counted_hash)
    monkeypatch.setenv("KREGRESS_EXECUTOR", "in_process")
    rc = main(["sweep", str(REPLAY), "--dagster-home", str(tmp_path / "home")])
    assert rc == 0
    assert counts == Counter(parse_spec_data=1, bind=1, family_problems=1, source_hash=1), counts


def test_a_bound_spec_travels_as_a_reference_and_is_never_revalidated(monkeypatch):
    import kregress.core.bind as bind_mod
    import kregress.core.spec as spec_mod

    bound = load_bound(REPLAY).for_run("run-1")
    counts: Counter = Counter()
    _count(monkeypatch, counts, spec_mod, "parse_spec_data")
    _count(monkeypatch, counts, bind_mod, "bind")
    _count(monkeypatch, counts, bind_mod, "family_problems")
    again = pickle.loads(pickle.dumps(bound))
    assert isinstance(again, BoundSpec) and again.family is bound.family
    assert (again.kernel_hash, again.spec_hash, again.budget_scope, again.source) == \
        (bound.kernel_hash, bound.spec_hash, budget_scope("run-1", "replay_clblast_rtx3090"), bound.source)
    assert again.spec == bound.spec and again.spec.source == bound.spec.source
    assert not counts, counts
    assert bound.for_run("run-2").budget_scope.sweep == "run-2" and bound.for_run("run-1") is bound


def test_bind_resolves_params_against_the_spec_folder(tmp_path):
    """A recorded file named relative to the spec: the schema keeps the text, the binding the real path."""
    import shutil

    from kregress.core.recorded import shipped_path

    shutil.copy(shipped_path(), tmp_path / "local.json.gz")
    spec_file = tmp_path / "r.yaml"
    spec_file.write_text(REPLAY.read_text().replace("cache_file: gemm_clblast_RTX_3090_trimmed.json.gz",
                                                    "cache_file: local.json.gz"))
    assert "local.json.gz" in spec_file.read_text()
    raw = load_spec(spec_file)
    assert raw.params["cache_file"] == "local.json.gz"
    bound = bind(raw)
    assert bound.spec.params["cache_file"] == str((tmp_path / "local.json.gz").resolve())
    assert bound.family.source_files() == [(tmp_path / "local.json.gz").resolve()]


def test_a_plugin_whose_latency_model_raises_fails_family_check(tmp_path, monkeypatch):
    """Passing `family check` means the sweep runs: the kit calls model_latency_ms as the CPU sweep does."""
    from kernel_assets.conformance import run_checks

    pkg = tmp_path / "brokenmodel"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "fam.py").write_text(textwrap.dedent('''
        import sys
        from kernels.gemm import SPACE, GemmFamily

        class NoModel(GemmFamily):
            def model_latency_ms(self, shape, config, stats, hw, dtype_bytes, params):
                raise ZeroDivisionError("the model divides by the spill count")

        FAMILY = NoModel(name="brokenmodel", space=SPACE, shape_keys=("M", "N", "K"), headline_metric="tflops",
                         module=sys.modules["kernels.gemm"])
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    spec = tmp_path / "spec.yaml"
    text = (REPO / "specs" / "gemm_smoke.yaml").read_text().replace("kernel_family: gemm", "kernel_family: brokenmodel.fam:FAMILY")
    spec.write_text(text)
    checks = {c.name: c for c in run_checks("brokenmodel.fam:FAMILY", spec)}
    assert checks["spec"].status == "PASS"
    sweep = checks["sweep_path"]
    assert sweep.status == "FAIL", sweep.line()
    assert "model_latency_ms raised ZeroDivisionError" in sweep.detail and "model_latency_ms" in sweep.fix


def test_family_check_finds_a_builtins_shipped_spec():
    from kernel_assets.conformance import default_spec_path
    from kregress.core.family import get_family

    assert default_spec_path(get_family("gemm_fp8")) == REPO / "specs" / "gemm_fp8_h100.yaml"
    assert default_spec_path(get_family("gemm")) == REPO / "specs" / "gemm_smoke.yaml"  # the cheapest to check
    assert default_spec_path(get_family("replay")) is None or default_spec_path(get_family("replay")).name.startswith("replay")
