"""Cold vs warm sweep of one spec, side by side in one run.

    .venv/bin/python bench/pipeline.py [specs/gemm_h100_bf16.yaml] [--env local|gpu]

Prints the cold sweep time (empty caches), the warm re-run time (unchanged spec: zero compiles), their
ratio, and the seconds per variant spent compiling (AOT for the spec's arch) and checking correctness
(Triton interpreter), read from the assets' metadata. Uses a fresh temp DAGSTER_HOME.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")


def main() -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("spec", nargs="?", default=str(REPO / "specs" / "gemm_h100_bf16.yaml"))
    ap.add_argument("--env", default="local", choices=["local", "gpu"], help="resource set: gpu = the cuda backend")
    args = ap.parse_args()
    spec_path = Path(args.spec)
    home = Path(tempfile.mkdtemp(prefix="kregress-bench-"))
    (home / "dagster.yaml").write_text((REPO / "dagster_home" / "dagster.yaml").read_text())
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
    resources = build_resources(args.env)
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

    print(f"spec {spec_path.name} (env {args.env}, backend {resources['bench'].resolved_backend(spec)}): "
          f"{spec.search.variants_per_round} variants x up to {spec.search.max_rounds} rounds, "
          f"{len(spec.correctness_shapes)} correctness shapes, {os.cpu_count()} CPUs")
    print(f"{'run':<6}{'wall s':>9}{'compiles':>10}{'cache hits':>12}{'compile s/var':>15}{'check s/var':>13}{'variants':>10}")
    for label, wall, compiles, hits, cs, ks, n in runs:
        print(f"{label:<6}{wall:>9.1f}{compiles:>10}{hits:>12}{cs:>15.2f}{ks:>13.2f}{n:>10}")
    print(f"cold/warm ratio: {runs[0][1] / runs[1][1]:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
