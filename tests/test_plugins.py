"""Bring your own kernel: a scaffolded plugin installed with pip, an import-path family, an external kernel.

The plugin test really runs ``pip install -e`` of the scaffold, into a temporary target folder (never
into the environment running the tests): its entry point ``kregress.families`` is found there, the
conformance kit, a full sweep through the CLI in a temp DAGSTER_HOME, and then edits the plugin's
kernel: the spec sensor sees the change and the compile cache misses once.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest

from kregress.core.bind import bind, load_bound
from kregress.core.family import FAMILIES, compiled_parts, get_family
from kregress.core.spec import SpecError

REPO = Path(__file__).resolve().parent.parent
KREGRESS = [sys.executable, "-m", "kernel_assets.cli"]
NAME = "kr_plugtest"


def _run(args: list[str], env: dict, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def plugin(tmp_path_factory):
    """The scaffold, installed editable into a temporary target: the dist-info (entry point) lives there and
    the package imports from the plugin's own folder, for this process and for every child process."""
    from kernel_assets.cli_family import scaffold

    base = tmp_path_factory.mktemp("plugin")
    root, target = base / NAME, base / "site"
    scaffold(NAME, root)
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps", "--target", str(target),
           "-e", str(root)]
    res = subprocess.run(pip, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    mp = pytest.MonkeyPatch()
    mp.syspath_prepend(str(root))  # the package, from the plugin's own files (editable)
    mp.syspath_prepend(str(target))  # its dist-info: the kregress.families entry point
    mp.setenv("PYTHONPATH", os.pathsep.join([str(target), str(root)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    importlib.invalidate_caches()
    try:
        yield root
    finally:
        mp.undo()
        FAMILIES.pop(NAME, None)
        importlib.invalidate_caches()


def test_scaffold_refuses_bad_names_and_full_folders(tmp_path):
    from kernel_assets.cli_family import scaffold

    with pytest.raises(ValueError, match="lowercase"):
        scaffold("Bad-Name", tmp_path / "x")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "f").write_text("x")
    with pytest.raises(ValueError, match="not empty"):
        scaffold("ok_name", tmp_path / "full")


def test_plugin_checks_sweeps_and_follows_its_own_source(plugin, tmp_path, monkeypatch):
    home = tmp_path / "home"
    env = {**os.environ, "DAGSTER_HOME": str(home), "KREGRESS_SPEC_FILES": ""}
    spec_file = plugin / "specs" / f"{NAME}.yaml"

    # 1. the conformance kit through the CLI, in a fresh process (entry point discovery)
    res = _run(KREGRESS + ["family", "check", NAME], env, tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    lines = [ln for ln in res.stdout.splitlines() if ln[:4] in ("PASS", "FAIL", "SKIP")]
    assert [ln.split()[1].rstrip(":") for ln in lines] == [
        "spec", "space", "shapes", "formulas", "reference", "tolerance", "kernel_vs_reference", "sweep_path"]
    assert all(ln.startswith("PASS") for ln in lines), res.stdout

    # 2. a sweep end to end on the embedded default, same report and tables as a built-in family
    res = _run(KREGRESS + ["sweep", str(spec_file)], env, tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    out = home / "reports" / NAME
    v = pd.read_parquet(out / "verdicts.parquet")
    assert len(v) >= 1 and set(v["verdict"]) <= {"PASS", "REGRESS", "NEEDS_REVIEW"}
    assert (out / "report.md").is_file() and (out / "measurements.parquet").is_file()

    # 3. its kernel source drives the sensor and the compile cache
    import dagster as dg

    from kernel_assets.automation import evaluate_specs
    from kernel_assets.specs_resource import SpecStore
    from kregress.core.records import Suggestion
    from resources.gpu import InterpreterBackend

    monkeypatch.setenv("DAGSTER_HOME", str(home))
    fam = get_family(NAME)
    assert fam.source_files() == [(plugin / f"kregress_{NAME}" / "family.py").resolve()]
    bound = load_bound(spec_file)
    spec = bound.spec
    base = Suggestion(variant_id="baseline", config=spec.baseline, patch_summary="b", source="baseline", round=0)
    bench = InterpreterBackend(cache_dir=str(tmp_path / "cache"), workers=1)
    assert bench.evaluate(bound, [base], log=lambda m: None)[1].compiles == 1
    assert bench.evaluate(bound, [base], log=lambda m: None)[1].compile_cache_hits == 1

    with dg.instance_for_test() as instance:
        store = SpecStore(specs_dir=str(plugin / "specs"), extra_files=[])
        first = evaluate_specs(None, instance, store)
        instance.add_dynamic_partitions("specs", [NAME])
        quiet = evaluate_specs(first.cursor, instance, store)
        assert quiet.run_requests == []
        src = fam.source_files()[0]
        text = src.read_text()
        # a docstring edit is not a kernel change: no re-run, no recompile
        src.write_text(text.replace("Scaffolded by", "Scaffolded (edited) by", 1))
        assert evaluate_specs(quiet.cursor, instance, store).run_requests == []
        assert bench.evaluate(bind(spec), [base], log=lambda m: None)[1].compile_cache_hits == 1
        # a kernel edit is: the sensor re-runs the family's partition, the cache misses exactly once
        src.write_text(src.read_text().replace("(acc * alpha)", "(alpha * acc)"))
        changed = evaluate_specs(quiet.cursor, instance, store)
        assert [r.tags.get("kregress/trigger") for r in changed.run_requests] == [f"kernel source of {NAME} changed"]
    rebound = bind(spec)  # the next run binds the edited kernel: its hash changed
    assert rebound.kernel_hash != bound.kernel_hash
    s1 = bench.evaluate(rebound, [base], log=lambda m: None)[1]
    s2 = bench.evaluate(rebound, [base], log=lambda m: None)[1]
    assert (s1.compiles, s1.compile_cache_hits, s2.compiles, s2.compile_cache_hits) == (1, 0, 0, 1)

    # 4. the scaffold's own pytest file (the checks are importable)
    res = _run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(plugin / "tests")], env, plugin)
    assert res.returncode == 0, res.stdout[-3000:]


def test_import_path_family_from_a_folder_on_sys_path(tmp_path, monkeypatch):
    from kernel_assets.cli_family import TEMPLATES

    mod = tmp_path / "my_ip_family.py"
    mod.write_text((TEMPLATES / "family.py.tmpl").read_text().replace("$name", "ip_rowsum"))
    monkeypatch.syspath_prepend(str(tmp_path))
    spec_text = (TEMPLATES / "spec.yaml.tmpl").read_text().replace("$task_id", "ip_rowsum").replace("$name", "ip_rowsum")
    spec_text = spec_text.replace("kernel_family: ip_rowsum", "kernel_family: my_ip_family:FAMILY")
    (tmp_path / "ip.yaml").write_text(spec_text)
    bound = load_bound(tmp_path / "ip.yaml")
    spec, fam = bound.spec, bound.family
    assert fam.name == "ip_rowsum" and fam.lookup == "my_ip_family:FAMILY"

    from kregress.core.records import Suggestion
    from resources.gpu import InterpreterBackend

    base = Suggestion(variant_id="baseline", config=spec.baseline, patch_summary="b", source="baseline", round=0)
    (row,), _ = InterpreterBackend(cache_dir=str(tmp_path / "c"), workers=1).evaluate(bound, [base], log=lambda m: None)
    assert row.error is None, row.error_detail  # the child processes loaded it by its import path
    assert row.correctness.ok and row.compile.regs_per_thread > 0 and row.evidence == "model"


def test_unknown_family_lists_what_is_installed_and_how_to_add_one(tmp_path):
    text = (REPO / "specs" / "gemm_smoke.yaml").read_text().replace("kernel_family: gemm", "kernel_family: no_such_family")
    (tmp_path / "s.yaml").write_text(text)
    with pytest.raises(SpecError) as err:
        load_bound(tmp_path / "s.yaml")
    msg = str(err.value)
    assert "no_such_family" in msg and "gemm" in msg and "kregress.families" in msg and "family new" in msg
    text = text.replace("kernel_family: no_such_family", "kernel_family: no_such_module:FAMILY")
    (tmp_path / "s.yaml").write_text(text)
    with pytest.raises(SpecError, match="cannot import module 'no_such_module'"):
        load_bound(tmp_path / "s.yaml")


def test_source_hash_covers_what_is_compiled_only():
    src = (REPO / "kernels" / "gemm.py").read_text()
    base = compiled_parts(src)
    assert compiled_parts(src.replace("DeepGEMM-like dense GEMM", "A dense GEMM")) == base  # module docstring
    assert compiled_parts(src.replace("Launch 4 us.", "Launch 5 us.").replace("+ 4e-6", "+ 5e-6")) == base  # model
    assert compiled_parts(src.replace("acc = tl.zeros((BLOCK_M, BLOCK_N)", "acc = tl.zeros((BLOCK_M,  BLOCK_N)")) == base
    assert compiled_parts(src.replace("k_left = K - k * BLOCK_K", "k_left = K - BLOCK_K * k")) != base  # the kernel
    assert compiled_parts(src.replace('"stride_ak": 1,', '"stride_ak": 2,')) != base  # compile_units


def test_external_kernel_family_on_cpu(tmp_path, capsys):
    """torch_sdpa wraps PyTorch's fused attention: validated and checked on the CPU; a CPU sweep says it
    needs the cuda backend in one line. Its GPU path is tests/test_gpu.py (needs a GPU: not run here)."""
    from kernel_assets.conformance import run_checks

    checks = {c.name: c for c in run_checks("torch_sdpa", REPO / "specs" / "torch_sdpa_h100.yaml")}
    assert all(c.ok for c in checks.values()), [c.line() for c in checks.values()]
    assert checks["reference"].status == "PASS" and checks["sweep_path"].status == "SKIP"
    assert checks["kernel_vs_reference"].status == "PASS" and "backend0" in checks["kernel_vs_reference"].detail

    from kregress.core.records import Suggestion
    from resources.gpu import BenchmarkError, InterpreterBackend

    bound = load_bound(REPO / "specs" / "torch_sdpa_h100.yaml")
    base = Suggestion(variant_id="baseline", config=bound.spec.baseline, patch_summary="b", source="baseline", round=0)
    with pytest.raises(BenchmarkError, match="needs the cuda backend"):
        InterpreterBackend(cache_dir=str(tmp_path)).evaluate(bound, [base])


def test_family_list_shows_builtins_and_where_they_come_from(capsys):
    from kernel_assets.cli_family import cmd_list

    assert cmd_list(None) == 0
    out = capsys.readouterr().out
    for name in ("gemm", "attention", "mla_decode", "replay", "torch_sdpa"):
        assert name in out
    assert textwrap.dedent("kernels.torch_sdpa:FAMILY") in out
