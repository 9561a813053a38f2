"""`ditbench compare BASE NEW`: the regression gate. Exit 0 pass, 1 regression, 2 usage or input error.

The markdown summary goes to stdout (or JSON with --json), to --summary FILE (replaced), and is
appended to $GITHUB_STEP_SUMMARY when GitHub Actions sets it, so a workflow step needs no glue.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ditbench.report.compare import (
    EnvMismatchError,
    compare_files,
    load_policy,
    refusal_markdown,
    summary_markdown,
    to_json_text,
)
from ditbench.report.files import write_atomic


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("base", metavar="BASE", help="the baseline results.jsonl (or its run directory)")
    parser.add_argument("new", metavar="NEW", help="the new results.jsonl (or its run directory)")
    parser.add_argument(
        "--policy",
        metavar="POLICY.yaml",
        default=None,
        help="thresholds per metric, significance level, per-cell overrides (default: images/s "
        "-5%%, peak allocated memory +2%%, peak reserved memory +5%%, FID +2%%, alpha 0.01)",
    )
    parser.add_argument(
        "--allow-env-mismatch",
        action="store_true",
        help="compare even when GPU, driver, CUDA or torch differ between the runs",
    )
    parser.add_argument(
        "--summary",
        metavar="FILE",
        default=None,
        help="also write the markdown summary to FILE (e.g. for a pull-request comment)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print the full comparison as JSON instead of markdown"
    )


def _publish(text: str, summary: str | None) -> None:
    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    same = summary and step_summary and Path(summary).resolve() == Path(step_summary).resolve()
    if summary and not same:
        write_atomic(summary, text)
    if step_summary:  # other steps write there too: append, never replace
        with open(step_summary, "a", encoding="utf-8") as f:
            f.write(text + "\n")


def run(args: argparse.Namespace) -> int:
    policy = load_policy(args.policy)
    try:
        result = compare_files(args.base, args.new, policy, args.allow_env_mismatch)
    except EnvMismatchError as err:
        _publish(refusal_markdown(args.base, args.new, err), args.summary)
        raise
    text = summary_markdown(result)
    _publish(text, args.summary)
    sys.stdout.write(to_json_text(result) + "\n" if args.json else text)
    return result.exit_code
