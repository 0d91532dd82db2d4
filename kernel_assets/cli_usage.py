"""``kregress usage``: the reconciliation table of the token ledger (calls, input, output, total per group).

    kregress usage                                   # per role and key alias, $DAGSTER_HOME/ledger.sqlite
    kregress usage --group-by task,model --partition gemm-h100
    kregress usage --csv usage.csv --jsonl usage.jsonl

--csv writes the reconciliation table as printed; --jsonl writes every attempt (one UsageRecord a line).
Keys never appear: the ledger holds only key aliases.
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
    table = ledger.reconcile(args.group_by, **filters)
    rows = table + ([totals_row(table, args.group_by)] if table else [])
    print(f"ledger: {path}", file=out)
    print(format_table(rows, [*args.group_by, *COLUMNS]), file=out)
    if args.csv:
        write_csv(args.csv, rows, [*args.group_by, *COLUMNS])
        print(f"wrote {args.csv}", file=out)
    if args.jsonl:
        n = ledger.export_jsonl(args.jsonl, **filters)
        print(f"wrote {n} rows to {args.jsonl}", file=out)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kregress")
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
