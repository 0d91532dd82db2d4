"""The GPU check (scripts/gpu_check.sh, scripts/gpu_check.py, scripts/gpu_site.py) on a CPU host.

What the GPU machine will run is planned here and checked: the jobs it sends (devices, shapes, the
same-batch timing with unlocked clocks), the budget, the part time limits that keep a slow part from
eating the rest, the re-run of what failed, the size limits of what comes back, and the install of
carried wheels into a temporary site dir. The whole dry run (every part) runs in CI's second job
under Triton 3.6 and 3.9 (.ci/run); here the parts run one or two at a time.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _module(name: str):
    spec = importlib.util.spec_from_file_location(f"kregress_{name}", REPO / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


check = _module("gpu_check")


# --- the plan ---------------------------------------------------------------------------------------

def test_gpu_budget_fits_one_call_of_eight_minutes():
    limits = {name: lim["gpu"] for name, lim in check.PARTS.items()}
    # every part can have its whole limit, plus what is kept back from each for the summary
    assert sum(limits.values()) + check.RESERVE_S * len(limits) <= check.BUDGET_S["gpu"] + 1e-9
    assert check.BUDGET_S["gpu"] + 30 < 8 * 60  # + the site install and start-up of gpu_check.sh
    assert check.RERUN_BUDGET_S["gpu"] < check.BUDGET_S["gpu"]
    assert list(check.PARTS) == list(check.PART_FUNCS)
    assert len(check.OUT_FILES) <= 8


def test_gpu_jobs_check_on_the_gpu_and_time_in_one_unlocked_batch():
    from bench.families import REFERENCE_FLOP_CAP, gpu_correctness_shapes

    labels = check.spec_labels()
    assert {"gemm", "gemm_fp8", "grouped_gemm_fp8", "grouped_gemm_fp8_masked", "mla_decode", "attention"} <= set(labels)
    for label in labels:
        spec, fam = check.load(label)
        cfgs = check.configs_for(label, "gpu")
        assert cfgs[0] == spec.baseline and len(cfgs) == check.N_CONFIGS["gpu"]
        assert all(fam.space.check(c, spec.params) is None for c in cfgs)
        shapes = gpu_correctness_shapes(spec, fam)
        assert shapes[: len(spec.correctness_shapes)] == spec.correctness_shapes
        assert all(fam.flops(s, spec.params) <= REFERENCE_FLOP_CAP for s in shapes[len(spec.correctness_shapes):])
        timed = check.timing_shapes(spec, fam)
        assert len(timed) == min(2, len(spec.shape_matrix)) and all(s in spec.shape_matrix for s in timed)
        job = check._measure_batch_job(spec, cfgs[0], {f"v{i}": c for i, c in enumerate(cfgs[1:], 1)}, timed, "b")
        assert job["op"] == "measure_batch" and job["lock_clocks"] is None and job["order"] == "interleaved"
        assert job["baseline"] == spec.baseline and len(job["configs"]) == len(cfgs) - 1
    # the cheap GEMM shape is checked on the GPU; the prefill shapes (hours of float64 on a CPU) are not
    spec, fam = check.load("gemm")
    assert len(gpu_correctness_shapes(spec, fam)) == len(spec.correctness_shapes) + 1
    spec, fam = check.load("attention")
    assert gpu_correctness_shapes(spec, fam) == spec.correctness_shapes


def test_the_job_fields_are_what_the_worker_reads():
    """The batch job is passed to kernels.measure.batch_measurements by kernels/worker.py: its fields
    bind to that function's signature (a renamed parameter would break the GPU run)."""
    import inspect

    from kernels.measure import batch_measurements

    spec, fam = check.load("gemm")
    job = check._measure_batch_job(spec, spec.baseline, {}, spec.shape_matrix[:1], "b")
    params = set(inspect.signature(batch_measurements).parameters)
    assert {"warmup_ms", "rep_ms", "rounds", "order", "lock_clocks", "batch_id", "seed"} <= params
    assert {k for k in job if k not in ("op", "family", "configs", "shapes", "params", "dtype", "baseline")} <= params


def test_overall_status():
    def parts(*statuses):
        return {"p": {"items": {f"i{n}": {"status": st} for n, st in enumerate(statuses)}}}

    assert check.overall(parts("ok", "planned", "skipped")) == ("ok", [])
    assert check.overall(parts("ok", "not_run")) == ("incomplete", ["p/i1"])
    assert check.overall(parts("not_run", "timeout", "ok")) == ("failed", ["p/i0", "p/i1"])


def test_gpu_marked_test_files_are_found():
    files = check.gpu_test_files()
    assert "tests/test_gpu.py" in files and "tests/test_batching.py" in files
    assert "tests/test_gemm.py" not in files


def test_outputs_are_capped(tmp_path):
    (tmp_path / "parts.log").write_bytes(b"a" * (17 * 2**20))
    (tmp_path / "stray.txt").write_text("x")
    notes = check.cap_outputs(tmp_path)
    assert (tmp_path / "parts.log").stat().st_size < 16 * 2**20
    assert not (tmp_path / "stray.txt").exists() and len(notes) == 2
    assert b"bytes cut" in (tmp_path / "parts.log").read_bytes()


# --- what the GPU run does with its answers (a stand-in only for the GPU worker's answer) -----------------

class _StandInPool:
    """Answers the one job sent to the GPU worker (which cannot run here) with ``answer``."""

    def __init__(self, answer: dict):
        self.answer, self.jobs = answer, []

    def run(self, jobs, timeout):
        self.jobs += jobs
        return [dict(self.answer, wall_s=1.5)]


def _part(tmp_path, mode: str):
    ctx = {"mode": mode, "part": "timing", "items": ["gemm"], "timeout_s": 60, "out": str(tmp_path),
           "cache": str(tmp_path / "cache"), "items_file": str(tmp_path / "items.jsonl")}
    return check.Part(ctx)


def _batch_answer(factors: dict[str, float], locked: str = "") -> dict:
    """What batch_measurements returns through the worker: Measurement dumps per config, per shape,
    made by kernels.measure's own constructor from samples (log-normal, 0.5% spread)."""
    import numpy as np

    from kernels.measure import measurement_from_samples

    spec, fam = check.load("gemm")
    shapes = check.timing_shapes(spec, fam)
    rng = np.random.default_rng(3)
    ident = {"gpu_name": "NVIDIA H200", "gpu_uuid": "GPU-0000", "host": "lent", "driver": "570.1",
             "sm_clock_mhz_start": 1980.0, "sm_clock_mhz_end": 1965.0, "mem_clock_mhz_start": 3201.0,
             "mem_clock_mhz_end": 3201.0, "clocks_locked": locked}
    batch = {}
    for key, f in factors.items():
        batch[key] = [measurement_from_samples(fam, s, list(f * (i + 1) * np.exp(rng.normal(0, 0.005, 80))), spec.dtype,
                                               spec.params, "cuda", "NVIDIA H200", identity=ident, batch="b").model_dump()
                      for i, s in enumerate(shapes)]
    return {"batch": batch}


def test_a_gpu_batch_answer_becomes_verdicts_against_its_own_baseline(tmp_path):
    spec, fam = check.load("gemm")
    cfgs = check.configs_for("gemm", "gpu")
    variants = {"v1": cfgs[1], "v2": cfgs[2]}
    pool = _StandInPool(_batch_answer({"baseline": 1.0, "v1": 1.10, "v2": 1.0}))
    status, data = check._run_batch_item(_part(tmp_path, "gpu"), pool, "gemm", spec, fam, cfgs[0], variants,
                                         check.timing_shapes(spec, fam), 60)
    assert status == "ok", data
    assert pool.jobs[0]["lock_clocks"] is None and pool.jobs[0]["configs"] == variants
    assert data["verdicts"]["v1"]["verdict"] == "REGRESS" and data["verdicts"]["v1"]["ratio"] == pytest.approx(1.10, rel=0.01)
    assert data["verdicts"]["v2"]["verdict"] == "PASS"
    m = data["measurements"]["baseline"][0]
    assert m["gpu_name"] == "NVIDIA H200" and m["gpu_uuid"] == "GPU-0000" and m["n_samples"] == 80
    assert (m["sm_clock_mhz_start"], m["sm_clock_mhz_end"]) == (1980.0, 1965.0) and m["clocks_locked"] == ""
    # a batch that ran with locked clocks is not what the lent machine allows
    status, _ = check._run_batch_item(_part(tmp_path, "gpu"), _StandInPool(_batch_answer({"baseline": 1.0, "v1": 1.0},
                                                                                       locked="sm 1755")),
                                      "gemm", spec, fam, cfgs[0], {"v1": cfgs[1]}, check.timing_shapes(spec, fam), 60)
    assert status == "failed"


def test_a_batch_error_is_failed_on_the_gpu_and_planned_only_for_a_missing_gpu(tmp_path):
    spec, fam = check.load("gemm")
    cfgs = check.configs_for("gemm", "gpu")
    args = ("gemm", spec, fam, cfgs[0], {"v1": cfgs[1]}, check.timing_shapes(spec, fam), 60)
    crash = {"error": "crashed", "detail": "child process died: worker exited with code -11"}
    no_gpu = {"error": "runtime_error", "detail": "AssertionError: Torch not compiled with CUDA enabled"}
    renamed = {"error": "runtime_error", "detail": "TypeError: batch_measurements() got an unexpected keyword 'rep'"}
    assert check._run_batch_item(_part(tmp_path, "gpu"), _StandInPool(crash), *args)[0] == "failed"
    assert check._run_batch_item(_part(tmp_path, "gpu"), _StandInPool(no_gpu), *args)[0] == "failed"
    assert check._run_batch_item(_part(tmp_path, "dry"), _StandInPool(no_gpu), *args)[0] == "planned"
    assert check._run_batch_item(_part(tmp_path, "dry"), _StandInPool(renamed), *args)[0] == "failed"
    assert check._run_batch_item(_part(tmp_path, "gpu"), _StandInPool({"error": "timeout", "detail": "no answer"}),
                                 *args)[0] == "timeout"


def test_bench_families_table_is_read_per_spec():
    """The dry run's real output of bench/families.py --cuda (its GPU jobs stop at the missing device)
    is planned in a dry run and a failure on a GPU; a table of a good GPU run is ok."""
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "families.py"), "--cuda", "--families", "gemm_fp8"],
                          capture_output=True, text=True, cwd=REPO, env=env, timeout=600)
    status, data = check.classify_bench("gemm_fp8", "dry", proc.returncode, proc.stdout, proc.stderr)
    assert status == "planned" and data["rows"][0][1] == "correctness on GPU", (proc.stdout, proc.stderr[-1500:])
    status, data = check.classify_bench("gemm_fp8", "gpu", proc.returncode, proc.stdout, proc.stderr)
    assert status == "failed" and "CUDA" in data["detail"]
    good = ("| spec | shape | latency | headline | vs peak |\n|---|---|---|---|---|\n"
            "| gemm | correctness on GPU | 4 shapes | ok | max_abs_err=1.25e-01 |\n"
            "| gemm | 4096x4096x4096 | p50 0.2100 ms | 654.5 TFLOP/s BF16 | 66.2% of 989 |\n")
    assert check.classify_bench("gemm", "gpu", 0, good, "")[0] == "ok"
    assert check.classify_bench("gemm", "gpu", 0, good.replace("| ok |", "| FAIL |"), "")[0] == "failed"
    assert check.classify_bench("gemm", "gpu", 0, "", "Traceback ...")[0] == "failed"


# --- budgeted parts and the re-run of what failed (real dry-run parts) -------------------------------------

def _run_check(out: Path, *args: str, timeout: float = 900) -> tuple[int, dict]:
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_check.py"), "--dry-run", "--out", str(out), *args],
                          capture_output=True, text=True, cwd=REPO, env=env, timeout=timeout)
    summary = json.loads((out / "summary.json").read_text())
    return proc.returncode, summary


def test_a_part_past_its_limit_is_cut_and_the_rerun_runs_only_what_failed(tmp_path):
    first = tmp_path / "first"
    # 0.3 s (+0.3 s grace): less than a Python child takes to import torch, however warm the machine
    rc, s = _run_check(first, "--only", "timing,pytest_gpu", "--part-timeout", "timing=0.3")
    assert rc == 1 and s["status"] == "failed" and s["mode"] == "dry"
    timing = s["parts"]["timing"]
    assert timing["status"] == "timeout" and timing["rc"] is None
    assert all(v["status"] == "timeout" for v in timing["items"].values())
    assert set(timing["items"]) == set(check.spec_labels())
    assert sorted(s["failed"]) == sorted(f"timing/{i}" for i in check.spec_labels())
    # the part after it still ran, in its own time
    tests = s["parts"]["pytest_gpu"]
    assert tests["status"] == "ok" and tests["items"]["tests/test_batching.py"]["status"] == "planned"
    assert {p.name for p in first.iterdir()} <= set(check.OUT_FILES) and (first / "progress.log").is_file()

    second = tmp_path / "second"
    rc, s2 = _run_check(second, "--only", "timing,pytest_gpu", "--rerun-failed", str(first / "summary.json"))
    assert rc == 0 and s2["status"] == "ok" and s2["rerun_of"] == str(first / "summary.json")
    assert s2["parts"]["pytest_gpu"]["from_previous"] is True  # nothing of it failed: not run again
    assert all(v.get("from_previous") for v in s2["parts"]["pytest_gpu"]["items"].values())
    items = s2["parts"]["timing"]["items"]
    # re-run: the batch job went to the worker and stopped at the missing GPU, for every spec
    assert all(v["status"] == "planned" and not v.get("from_previous") for v in items.values())
    assert all("CUDA" in v["detail"] for v in items.values())
    assert items["gemm"]["variants"] and items["gemm"]["shapes"]
    assert "timing/gemm: planned" in (second / "progress.log").read_text()


def test_rerun_refuses_a_summary_of_the_other_mode(tmp_path):
    prev = tmp_path / "prev.json"
    prev.write_text(json.dumps({"schema": check.SCHEMA, "mode": "gpu", "parts": {}}))
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_check.py"), "--dry-run", "--out",
                           str(tmp_path / "o"), "--rerun-failed", str(prev)], capture_output=True, text=True, env=env)
    assert proc.returncode != 0 and "is a gpu summary; pass no --dry-run" in proc.stderr


# --- the wrapper and the carried wheels -------------------------------------------------------------------

def test_the_shell_wrapper_runs_a_part_with_this_python(tmp_path):
    out = tmp_path / "out"
    env = dict(os.environ, KREGRESS_CHECK_PYTHON=sys.executable, PYTHONWARNINGS="ignore")
    proc = subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh"), "--dry-run", "--only", "pytest_gpu",
                           "--out", str(out), "--wheels", str(tmp_path / "no-wheels")],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    s = json.loads((out / "summary.json").read_text())
    assert s["status"] == "ok" and set(s["parts"]) == {"pytest_gpu"}
    setup = (out / "setup.log").read_text()
    assert "pydantic>=2.7: this Python has" in setup  # nothing to install in the test environment


def _wheel(folder: Path, name: str, version: str, requires: tuple[str, ...] = (), module: str = "") -> Path:
    """A real, minimal py3-none-any wheel (what pip installs and what gpu_site.py unpacks)."""
    dist = f"{name.replace('-', '_')}-{version}"
    mod = module or name.replace("-", "_").lower()
    files = {
        f"{mod}.py": f"VERSION = {version!r}\n",
        f"{dist}.dist-info/METADATA": "Metadata-Version: 2.1\n" + f"Name: {name}\nVersion: {version}\n"
                                       + "".join(f"Requires-Dist: {r}\n" for r in requires),
        f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }

    def digest(text: str) -> str:
        return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()

    record = "".join(f"{p},{digest(t)},{len(t.encode())}\n" for p, t in files.items()) + f"{dist}.dist-info/RECORD,,\n"
    path = folder / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for p, t in {**files, f"{dist}.dist-info/RECORD": record}.items():
            zf.writestr(p, t)
    return path


@pytest.mark.parametrize("no_pip", [False, True], ids=["pip", "unpacked"])
def test_site_install_takes_only_what_this_python_lacks(tmp_path, monkeypatch, no_pip):
    site_mod = _module("gpu_site")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _wheel(wheels, "kregress-probe", "1.0", ("kregress-probe-dep>=1", "PyYAML>=5"))
    _wheel(wheels, "kregress-probe-dep", "1.2")
    _wheel(wheels, "PyYAML", "99.0", module="yaml_carried")  # this Python has PyYAML 6: must not shadow it
    monkeypatch.setattr(site_mod, "REQUIRED", ("kregress-probe>=1",))
    target = tmp_path / "site"
    args = ["--wheels", str(wheels), "--target", str(target)] + (["--no-pip"] if no_pip else [])
    assert site_mod.main(args) == 0
    rec = json.loads((target / site_mod.RECORD_NAME).read_text())
    assert rec["installed"] == {"kregress-probe": "1.0", "kregress-probe-dep": "1.2"}
    assert rec["method"] == ("unpacked (no pip)" if no_pip else "pip --target")
    assert rec["missing"] == ["kregress-probe>=1"] and "pyyaml" in rec["machine_has"]
    assert not (target / "yaml_carried.py").exists() and not (target / "bin").exists()
    import yaml

    assert (target / "kregress_probe.py").is_file() and (target / "kregress_probe_dep.py").is_file()
    out = subprocess.run([sys.executable, "-c", "import kregress_probe, kregress_probe_dep, yaml; "
                          "print(kregress_probe.VERSION, yaml.__version__)"],
                         capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(target)))
    assert out.stdout.split() == ["1.0", yaml.__version__]
    # a second look finds everything: nothing to do
    monkeypatch.setattr(site_mod, "REQUIRED", ("pyyaml>=5",))
    target2 = tmp_path / "site2"
    assert site_mod.main(["--wheels", str(wheels), "--target", str(target2)]) == 0
    assert json.loads((target2 / site_mod.RECORD_NAME).read_text())["method"] == "none needed"


def test_the_trees_entry_points_are_visible_without_installing_it(tmp_path):
    """The GPU machine imports the tree from PYTHONPATH; the family registry reads built-ins from
    entry points, so gpu_site.py writes the tree's metadata (only) into the site dir."""
    site_mod = _module("gpu_site")
    project = tmp_path / "tree"
    project.mkdir()
    (project / "pyproject.toml").write_text(
        '[project]\nname = "kregress-probe-tree"\nversion = "0.3.0"\n\n'
        '[project.entry-points."kregress_probe.families"]\ngemm = "kernels.gemm:FAMILY"\nmine = "pkg.mod:FAM"\n')
    target = tmp_path / "site"
    assert site_mod.main(["--wheels", str(tmp_path / "none"), "--target", str(target), "--project", str(project)]) == 0
    rec = json.loads((target / site_mod.RECORD_NAME).read_text())
    assert rec["tree_metadata"]["written"] and rec["tree_metadata"]["entry_point_groups"] == {
        "kregress_probe.families": ["gemm", "mine"]}
    assert "kregress-probe-tree" not in rec["installed"]  # metadata of the tree, not an installed package
    code = ("from importlib.metadata import entry_points, version; "
            "print(version('kregress-probe-tree'), sorted((e.name, e.value) for e in entry_points(group='kregress_probe.families')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=str(target)), check=True).stdout
    assert out.strip() == "0.3.0 [('gemm', 'kernels.gemm:FAMILY'), ('mine', 'pkg.mod:FAM')]"
    # an installed project (this test environment's kregress) keeps its own metadata
    target2 = tmp_path / "site2"
    assert site_mod.main(["--wheels", str(tmp_path / "none"), "--target", str(target2), "--project", str(REPO)]) == 0
    tree = json.loads((target2 / site_mod.RECORD_NAME).read_text())["tree_metadata"]
    assert not tree["written"] and tree["why"].startswith("this Python has kregress")


def test_site_install_without_wheels_says_how_to_get_them(tmp_path, monkeypatch):
    site_mod = _module("gpu_site")
    monkeypatch.setattr(site_mod, "REQUIRED", ("kregress-probe-absent>=1",))
    with pytest.raises(SystemExit) as exc:
        site_mod.main(["--wheels", str(tmp_path / "none"), "--target", str(tmp_path / "site")])
    assert "scripts/fetch_gpu_wheels.sh" in str(exc.value) and "kregress-probe-absent" in str(exc.value)


def test_requirements_list_is_what_fetch_downloads():
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_site.py"), "--requirements", "--with-dagster"],
                         capture_output=True, text=True, check=True).stdout.split()
    assert out[0].startswith("pydantic>=") and any(x.startswith("dagster>=1.13") for x in out)
    assert "--with-dagster" in (REPO / "scripts" / "fetch_gpu_wheels.sh").read_text()
