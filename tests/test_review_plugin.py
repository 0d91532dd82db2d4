"""A plugin's kernel is reviewed in the plugin's own repository.

The family lives outside this repository, in a throwaway git repository with a src layout
(``src/plugk/scale.py``, imported as ``plugk.scale:FAMILY``). With no repo_dir, the review finds that
repository from the family's ``source_files()`` (``git rev-parse --show-toplevel``), diffs there, and compiles
both sides with this installation's worker, the base side importing the plugin from a worktree of the base
revision. The change narrows the space so the spec's baseline falls outside it: that comes from the new side's
own rules (the worker's describe op). Two real AOT compiles of a tiny kernel for sm_90 (no GPU).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile

import pytest
from review_helpers import REPO, commit_all, worktrees

from kernel_assets.review import family_sources, run_review
from kregress.core import family as registry
from kregress.core.spec import load_spec

TARGET = "plugk.scale:FAMILY"

PLUGIN = '''"""A tiny plugin family: y = 2 x on one block per program."""

import sys

import triton
import triton.language as tl

import torch

from kregress.core.family import CompileUnit, Space, TritonFamily


@triton.jit
def scale_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, x * 2, mask=mask)


def scale(x, config):
    y = torch.empty_like(x)
    n = x.numel()
    scale_kernel[(triton.cdiv(n, config["BLOCK"]),)](x, y, n, BLOCK=config["BLOCK"], num_warps=config["num_warps"])
    return y


class ScaleFamily(TritonFamily):
    launch_wrappers = ("scale",)

    def make_inputs(self, shape, dtype, device, seed, params):
        g = torch.Generator(device="cpu").manual_seed(seed)
        return {"x": torch.randn(shape["n"], generator=g).to(dtype).to(device)}

    def run(self, inputs, config, params):
        return scale(inputs["x"], config)

    def reference(self, inputs, params):
        return 2 * inputs["x"].double()

    def flops(self, shape, params):
        return float(shape["n"])

    def bytes_moved(self, shape, dtype_bytes, params):
        return float(2 * dtype_bytes * shape["n"])

    def model_latency_ms(self, shape, config, stats, hw, dtype_bytes, params):
        return self.bytes_moved(shape, dtype_bytes, params) / (hw.limits.hbm_gbps * 1e9) * 1e3 + 3e-3

    def compile_units(self, config, dtype, params):
        sig = {"x_ptr": "*fp16", "y_ptr": "*fp16", "n": "i32", "BLOCK": "constexpr"}
        return [CompileUnit(scale_kernel, sig, {"BLOCK": config["BLOCK"]}, config["num_warps"], config["num_stages"],
                            ("x_ptr", "y_ptr", "n"))]


SPACE = Space(params={"BLOCK": BLOCKS, "num_warps": (4,), "num_stages": (1,)})
FAMILY = ScaleFamily(name="plug_scale", space=SPACE, shape_keys=("n",), headline_metric="gbps", module=sys.modules[__name__])
'''


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    repo = tmp_path / "plugin-repo"
    pkg = repo / "src" / "plugk"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "scale.py").write_text(PLUGIN.replace("BLOCKS", "(128, 256)"))
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    commit_all(repo, "plugin: scale kernel")
    # the change under review (uncommitted): 128 is no longer allowed, and the store converts through fp32
    (pkg / "scale.py").write_text(PLUGIN.replace("BLOCKS", "(256,)").replace("x * 2, mask", "(x.to(tl.float32) * 2).to(tl.float16), mask"))
    monkeypatch.syspath_prepend(str(repo / "src"))
    home = tmp_path / "dagster_home"
    home.mkdir()
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.setenv("KREGRESS_REVIEW_CACHE", str(tmp_path / "review-cache"))
    monkeypatch.delenv("KREGRESS_REVIEW_REPO", raising=False)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    yield repo, home, scratch
    registry.FAMILIES.pop(TARGET, None)
    for name in [m for m in sys.modules if m == "plugk" or m.startswith("plugk.")]:
        del sys.modules[name]


def test_plugin_kernel_is_reviewed_and_compiled_from_its_own_repository(plugin):
    repo, home, scratch = plugin
    src = family_sources(registry.get_family(TARGET))
    assert (src.repo, src.files, src.import_root, src.package) == (repo.resolve(), ["src/plugk/scale.py"], "src", "plugk")

    spec = load_spec(REPO / "specs" / "gemm_smoke.yaml").model_copy(
        update={"kernel_family": TARGET, "baseline": {"BLOCK": 128, "num_warps": 4, "num_stages": 1}, "params": {},
                "shape_matrix": [{"n": 4096}], "correctness_shapes": [{"n": 1000}]})
    r = run_review(spec, home=home, no_model_reason="offline test")
    assert r.repo == str(repo.resolve()) and r.base_ref == "HEAD" and r.worktree_dirty
    assert r.files_reviewed == ["src/plugk/scale.py"] and r.files_changed_elsewhere == []
    cd = r.compile
    assert cd is not None and cd.base is not None and cd.base.ok and cd.new.ok, (cd.base, cd.new)
    # each side's rules come from its own tree: 128 is allowed at the base, not in the working tree
    assert cd.base.space_check is None and cd.new.space_check and "BLOCK=128 is not allowed" in cd.new.space_check
    assert any(f.checklist_item == "tile_scheduling" and f.risk == "high" and f.file == "src/plugk/scale.py" for f in r.findings)
    assert {row["metric"] for row in cd.rows} >= {"regs_per_thread", "sass_instructions"}
    assert worktrees(repo) == 1 and list(scratch.iterdir()) == []
