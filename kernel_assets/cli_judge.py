"""`kregress judge SPEC PATCH [PATCH ...]`: judge candidate patches with the gate a sweep uses.

    kregress judge specs/gemm_smoke.yaml fix.patch other.patch
    git diff HEAD~1 -- kernels/ > mine.patch && kregress judge specs/gemm_smoke.yaml mine.patch
    kregress judge specs/gemm_smoke.yaml tiles.patch:config.json      # a config for this patch (JSON file)
    kregress judge specs/gemm_smoke.yaml a.patch --config '{"BLOCK_K": 64}'

Each PATCH is a unified diff as `git diff` writes it, paths relative to the family package's root (the
project for built-in families). It runs against the spec's baseline config, or the baseline with the
given config's tunables. One line per patch: `<variant_id> <VERDICT> <cause>: <reason>` (variant_id:
the file's stem; cause `-` when the verdict has none). Each judgement gets its own folder,
$DAGSTER_HOME/reports/<task_id>/judge/<judgement id>/ (report.md, the Parquet tables, the judged
patches), listed in reports/<task_id>/judge/index.md; a sweep's report is never touched. The working
tree is never modified.

Input errors are errors, never verdicts: a malformed or truncated diff, a patch that does not apply to the
family's source as it is, or a config outside the family's space exits 2 with one line (the file, the field,
the fix) before anything is judged. What a patch does (an edit outside the kernel, a cheat, a kernel that does
not compile) is judged: that is a verdict.

A patch already applied to the working tree (`git diff > mine.patch`, then judge) is refused with exit
2: judge it against the committed source with `--base HEAD` (an export of that commit is judged; the
working tree stays as it is), or stash the change first.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

EXIT_OK, EXIT_BAD_ARGUMENT = 0, 2
EPILOG = ("exit codes: 0 judging completed, whatever the verdicts; 2 an input error, one line naming the file, the "
          "field and the fix, and nothing was judged: an argument is not a patch (no such file, not a diff, a "
          "malformed or truncated diff), a patch does not apply to the family's source, a config is unreadable or "
          "outside the family's space (a value not allowed, an unknown key), the spec is invalid, or a patch is "
          "already applied to the working tree (use --base HEAD, or stash)")


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
    j.add_argument("--base", metavar="REF",
                   help="judge against the family's source as committed at REF (e.g. HEAD) instead of the working tree; "
                        "the working tree is not touched (for a patch that is already applied there)")
    j.add_argument("--dagster-home", help="where reports go (default: $DAGSTER_HOME, else ./dagster_home)")
    j.set_defaults(func=cmd_judge)


def cmd_judge(args: argparse.Namespace) -> int:
    from kernel_assets.judge import BadArgument, check_inputs, judge, read_patch_args
    from kregress.core import paths
    from kregress.core.bind import load_bound
    from kregress.core.spec import SpecError
    from resources.gpu import BenchmarkError

    if args.dagster_home:
        os.environ["DAGSTER_HOME"] = str(Path(args.dagster_home).resolve())
    home = paths.home()
    home.mkdir(parents=True, exist_ok=True)
    try:  # read, checked and bound once: the schema and the family's own checks (no nvcc here: one line)
        bound = load_bound(args.spec)
    except SpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_ARGUMENT
    try:
        patches = read_patch_args(args.patches, args.config)
    except BadArgument as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_ARGUMENT
    if args.base:
        return _judge_at_base(args, home, bound.family)
    applied = _already_applied(bound.family, patches)
    if applied:
        print(f"error: {applied}", file=sys.stderr)
        return EXIT_BAD_ARGUMENT
    try:  # input errors are errors, never verdicts: a truncated diff, one that does not apply, a bad config
        check_inputs(bound, patches, args.spec)
    except BadArgument as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return EXIT_BAD_ARGUMENT

    def log(msg: str) -> None:
        print(f"  {msg}", file=sys.stderr, flush=True)

    print(f"kregress: judging {len(patches)} patch(es) against {args.spec}; DAGSTER_HOME={home}", file=sys.stderr)
    try:
        result = judge(args.spec, patches, backend=args.backend, seed=args.seed, log=log, bound=bound)
    except (SpecError, BenchmarkError) as exc:  # the family's own checks (no nvcc here), a backend this host lacks
        print(f"error: {args.spec}: {exc}", file=sys.stderr)
        return EXIT_BAD_ARGUMENT
    for line in result.lines:
        print(line, flush=True)
    print(f"report: {result.report_dir / 'report.md'}", file=sys.stderr)
    print(f"all judgements of {result.report_dir.parent.parent.name}: {result.index}", file=sys.stderr)
    return EXIT_OK


def _already_applied(family, patches: list) -> str:
    """One line when a patch is already applied to the working tree (its reverse applies cleanly), else ''."""
    from kernel_assets.judge import already_applied

    for p in patches:
        files = already_applied(family, p.text)
        if files:
            return (f"{p.path} is already applied to {', '.join(files)} in the working tree (its reverse applies cleanly), "
                    f"so the baseline would be the patched kernel. Fix: judge it against the committed source with "
                    f"--base HEAD (the working tree is not touched), or stash the change first (git stash)")
    return ""


def _judge_at_base(args: argparse.Namespace, home: Path, family) -> int:
    """``--base REF``: the same judgement, run in a child whose imports come from an export of REF (the
    family's checkout at that commit); the working tree and the index are only read."""
    import subprocess
    import tempfile

    from kernel_assets.judge import BASE_ENV, BadArgument, export_base

    with tempfile.TemporaryDirectory(prefix="kregress-base-") as tmp:
        try:
            import_root, sha = export_base(family, args.base, Path(tmp))
        except BadArgument as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_BAD_ARGUMENT

        def absolute(arg: str) -> str:
            if Path(arg).exists() or ":" not in arg:
                return str(Path(arg).resolve())
            head, _, tail = arg.rpartition(":")
            return f"{Path(head).resolve()}:{Path(tail).resolve() if Path(tail).is_file() else tail}"

        argv = ["judge", str(Path(args.spec).resolve()), *map(absolute, args.patches), "--backend", args.backend,
                "--seed", str(args.seed)]
        if args.config:
            argv += ["--config", str(Path(args.config).resolve()) if Path(args.config).is_file() else args.config]
        env = {**os.environ, "DAGSTER_HOME": str(home), BASE_ENV: f"{args.base} ({sha[:10]})", "PYTHONSAFEPATH": "1",
               "PYTHONPATH": os.pathsep.join([str(import_root)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
        print(f"kregress: judging against {args.base} ({sha[:10]}): an export of that commit in {import_root}; "
              "the working tree is not touched", file=sys.stderr)
        return subprocess.run([sys.executable, "-m", "kernel_assets.cli", *argv], cwd=str(import_root), env=env).returncode
