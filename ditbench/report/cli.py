"""`ditbench report RESULTS... --out DIR`: markdown, HTML and CSV reports from result records."""

from __future__ import annotations

import argparse
from pathlib import Path

from ditbench.errors import UserError
from ditbench.report.load import KEEP_CHOICES, load_results
from ditbench.report.render import write_report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "results",
        nargs="+",
        metavar="RESULTS",
        help="results.jsonl files written by `ditbench run` (or their run directories)",
    )
    parser.add_argument(
        "--out",
        required=True,
        metavar="DIR",
        help="directory for report.md, report.html, results.csv and the plot PNGs",
    )
    parser.add_argument("--title", default=None, help="report title (default: the suite names)")
    parser.add_argument(
        "--keep",
        choices=KEEP_CHOICES,
        default="latest",
        help="when a cell appears more than once: keep the latest record (default) or all",
    )


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UserError(
            f"--out {out} is a file; give a directory for the report files (it is created if missing)."
        )
    df = load_results(args.results, keep=args.keep)
    written = write_report(df, out, title=args.title, sources=[str(p) for p in args.results])
    print(f"report of {len(df)} cells written to {out}/:")
    for path in written.values():
        print(f"  {path}")
    return 0
