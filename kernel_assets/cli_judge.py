"""`kregress judge SPEC PATCH [PATCH ...]`: judge candidate patches with the gate a sweep uses.

    kregress judge specs/gemm_smoke.yaml fix.patch other.patch
    git diff HEAD~1 -- kernels/ > mine.patch && kregress judge specs/gemm_smoke.yaml mine.patch
    kregress judge specs/gemm_smoke.yaml tiles.patch:config.json      # a config for this patch (JSON file)
    kregress judge specs/gemm_smoke.yaml a.patch --config '{"BLOCK_K": 64}'

Each PATCH is a unified diff as `git diff` writes it, paths relative to the family package's root (the
project for built-in families). It runs against the spec's baseline config, or the baseline with the
given config's tunables. One line per patch: `<variant_id> <VERDICT> <cause>: <reason>` (variant_id:
the file's stem; cause `-` when the verdict has none). The report, the Parquet tables and the judged
patches land in $DAGSTER_HOME/reports/<task_id>/. The working tree is never modified.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

EXIT_OK, EXIT_BAD_ARGUMENT = 0, 2
EPILOG = ("exit codes: 0 judging completed, whatever the verdicts; 2 an argument is not a patch (no such file, not a "
          "diff), a config is unreadable, or the spec is invalid: nothing was judged")


def register(sub: argparse._SubParsersAction) -> None:
    j = sub.add_parser("judge", help="judge candidate patches (unified diffs) with the gate sweeps use",
                       description=__doc__, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    j.add_argument("spec", help="path to a task spec YAML")
    j.add_argument("patches", nargs="+", metavar="PATCH", help="a unified diff file, optionally PATCH:CONFIG.json")
    j.add_argument("--config", help="JSON object of tunables (or a JSON file) for every patch without its own")
    j.add_argument("--backend", choices=["auto", "cuda", "interpreter"], default="auto",
                   help="default: the spec's benchmark.backend, else cuda when a GPU is visible, else the interpreter")
    j.add_argument("--seed", type=int, default=0,
                   help="reproduce a judgement with this input seed (default 0: a fresh secret seed)")
    j.add_argument("--dagster-home", help="where reports go (default: $DAGSTER_HOME, else ./dagster_home)")
    j.set_defaults(func=cmd_judge)


def cmd_judge(args: argparse.Namespace) -> int:
    from kernel_assets.judge import BadArgument, judge, read_patch_args
    from kregress.core import paths
    from kregress.core.spec import SpecError, load_spec

    if args.dagster_home:
        os.environ["DAGSTER_HOME"] = str(Path(args.dagster_home).resolve())
    home = paths.home()
    home.mkdir(parents=True, exist_ok=True)
    try:
        load_spec(args.spec)
    except SpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_ARGUMENT
    try:
        patches = read_patch_args(args.patches, args.config)
    except BadArgument as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_ARGUMENT

    def log(msg: str) -> None:
        print(f"  {msg}", file=sys.stderr, flush=True)

    print(f"kregress: judging {len(patches)} patch(es) against {args.spec}; DAGSTER_HOME={home}", file=sys.stderr)
    try:
        result = judge(args.spec, patches, backend=args.backend, seed=args.seed, log=log)
    except SpecError as exc:  # the family's own checks (a CUDA family with no nvcc on this host, say)
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_ARGUMENT
    for line in result.lines:
        print(line, flush=True)
    print(f"report: {result.report_dir / 'report.md'}", file=sys.stderr)
    return EXIT_OK
