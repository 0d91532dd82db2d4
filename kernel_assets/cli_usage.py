"""``kregress usage``: the reconciliation table of the token ledger (calls, input, output, total per group).

    kregress usage                                   # per role and key alias, $DAGSTER_HOME/ledger.sqlite
    kregress usage --group-by task,model --partition gemm-h100
    kregress usage --csv usage.csv --jsonl usage.jsonl
    kregress usage --spec specs/gemm_h100_bf16.yaml [--sweep RUN_ID]   # spend vs the spec's budget

--csv writes the reconciliation table as printed; --jsonl writes every attempt (one UsageRecord a line).
--spec adds the spend of one sweep (--sweep, default the spec's latest) against the spec's budget, per
round, with every breach (the same rule as `kregress sweep`'s exit code and the token_budget check); it
exits 3 when the sweep is over budget. Keys never appear: the ledger holds only key aliases.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence, TextIO

from kregress.core.records import USAGE_GROUPABLE as GROUPABLE


def _group_by(text: str) -> list[str]:
    cols = [c.strip() for c in text.split(",") if c.strip()]
    bad = [c for c in cols if c not in GROUPABLE]
    if bad or not cols:
        raise argparse.ArgumentTypeError(f"--group-by: unknown column(s) {', '.join(bad) or '(none)'}; allowed: {', '.join(GROUPABLE)}")
    return cols


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "usage",
        help="print the token ledger's reconciliation table",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--group-by", type=_group_by, default=["role", "key_alias"], metavar="COLS",
                   help=f"comma-separated columns (default role,key_alias; any of {', '.join(GROUPABLE)})")
    p.add_argument("--csv", metavar="PATH", help="also write the table as CSV")
    p.add_argument("--jsonl", metavar="PATH", help="also write every attempt as usage.jsonl")
    p.add_argument("--dagster-home", metavar="DIR", help="read DIR/ledger.sqlite (default $DAGSTER_HOME)")
    p.add_argument("--ledger-url", metavar="URL", default="", help="ledger URL (sqlite:///PATH); overrides --dagster-home")
    p.add_argument("--partition", help="only this partition (spec task_id)")
    p.add_argument("--run-id", help="only this Dagster run")
    p.add_argument("--round", type=int, help="only this round")
    p.add_argument("--spec", metavar="FILE", help="also show one sweep's spend against this spec's budget (exit 3 when over)")
    p.add_argument("--sweep", metavar="ID", help="with --spec: the sweep (run id) to judge; default the spec's latest sweep")
    p.set_defaults(func=run_usage)
    return p


def run_usage(args: argparse.Namespace, out: TextIO | None = None) -> int:
    # imported here, not at the top: `kregress --help` must not load Dagster (resources.ledger does)
    from kernel_assets.usage import format_table, totals_row, write_csv
    from resources.ledger import RECONCILE_COLUMNS as COLUMNS
    from resources.ledger import Ledger, LedgerConfigError, is_postgres_url, ledger_from_url, mask_url, sqlite_path_from_url

    out = out or sys.stdout
    try:
        if is_postgres_url(args.ledger_url or ""):
            ledger, path = ledger_from_url(args.ledger_url), mask_url(args.ledger_url)
        else:
            path = sqlite_path_from_url(args.ledger_url or "", args.dagster_home)
            if not Path(path).is_file():
                print(f"no ledger at {path}: no model calls recorded yet", file=out)
                return 0
            ledger = Ledger(path)
    except LedgerConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    filters = {"partition": args.partition, "run_id": args.run_id, "round": args.round}
    table = ledger.usage.reconcile(args.group_by, **filters)
    rows = table + ([totals_row(table, args.group_by)] if table else [])
    print(f"ledger: {path}", file=out)
    print(format_table(rows, [*args.group_by, *COLUMNS]), file=out)
    if args.csv:
        write_csv(args.csv, rows, [*args.group_by, *COLUMNS])
        print(f"wrote {args.csv}", file=out)
    if args.jsonl:
        n = ledger.usage.export_jsonl(args.jsonl, **filters)
        print(f"wrote {n} rows to {args.jsonl}", file=out)
    if getattr(args, "spec", None):
        return _budget(args, ledger, out)
    return 0


EXIT_BUDGET = 3  # as `kregress sweep`: over budget


def _budget(args: argparse.Namespace, ledger, out: TextIO) -> int:
    """Spend of one sweep against the spec's budget, per round, and every breach; 3 when over budget."""
    from kernel_assets.usage import budget_report
    from kregress.core.spec import SpecError, load_spec

    try:
        spec = load_spec(args.spec)
    except SpecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    sweep = args.sweep or ledger.usage.latest_sweep(spec.task_id)
    if sweep is None:
        print(f"budget: no model calls recorded for {spec.task_id}", file=out)
        return 0
    rep = budget_report(ledger, spec.budget, sweep)
    print(f"budget of {spec.task_id}, sweep {sweep}{'' if args.sweep else ' (its latest)'}:", file=out)
    print(rep.markdown(), file=out)
    if rep.breaches:
        print(f"over budget: {'; '.join(b.text for b in rep.breaches)}", file=out)
        return EXIT_BUDGET
    print("within budget", file=out)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kregress")
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
