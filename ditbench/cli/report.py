"""`ditbench report RESULTS... --out DIR [--claims FILE] [--json]`: reports, and claims checked."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ditbench.core.errors import UserError
from ditbench.files.fileio import check_target
from ditbench.files.outpaths import refuse_output_as_input
from ditbench.records.metrics import IMAGES_PER_S
from ditbench.report.analysis import DEFAULT_TARGET_STEPS
from ditbench.report.load import KEEP_CHOICES, add_results, load_results


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_results(parser)
    parser.add_argument(
        "--out",
        metavar="DIR",
        help="directory for report.md, report.html, results.csv and the plot PNGs "
        "(required unless --json; created if missing)",
    )
    parser.add_argument("--title", help="report title (default: the suite names)")
    parser.add_argument(
        "--keep",
        choices=KEEP_CHOICES,
        default="latest",
        help="when a cell appears more than once: keep its latest record, or all of them, with their runs",
    )
    parser.add_argument(
        "--claims",
        metavar="FILE|NAME",
        help="a claims YAML file, or the name of one shipped with ditbench (dit_resource_guide): each "
        "claim gets the measured value and a verdict (held / not held / not measured)",
    )
    parser.add_argument(
        "--predict",
        action="store_true",
        help="the common advice checks, and with --claims the claims, that the run did not measure get "
        'the planner\'s verdict ("predicted: held / not held / inconclusive", with its band); a measured '
        "one keeps its verdict, the prediction shown beside it (traces each predicted cell: minutes on a "
        "CPU)",
    )
    parser.add_argument(
        "--target-steps",
        type=_steps,
        metavar="N",
        help=f"steps for the 'time to N steps' column (default: the suite's target_steps, else "
        f"{DEFAULT_TARGET_STEPS:,}, the DiT paper's checkpoint for its model table)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print the verdicts (claims and common advice), recommendations and written files as "
        "JSON on stdout",
    )


def _steps(text: str) -> int:
    try:
        n = int(text.replace("_", "").replace(",", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of steps, got {text!r}") from None
    if n <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of steps, got {n}")
    return n


def run(args: argparse.Namespace) -> int:
    from ditbench.report import advice, analysis
    from ditbench.report.analysis import target_steps
    from ditbench.report.claim_check import VERDICTS, check_claims
    from ditbench.report.claims import load_claims, resolve_claims
    from ditbench.report.render import report_files, write_report

    out = Path(args.out) if args.out else None
    if args.claims:  # a path, or a shipped claims file's name (as a suite's)
        args.claims = resolve_claims(args.claims)
    if out is None and not args.json:
        raise UserError("give --out DIR for the report files, or --json to print the verdicts only.")
    if out is not None:  # before any work: a file, a report file that is an input, a link or a FIFO
        if out.exists() and not out.is_dir():
            raise UserError(
                f"--out {out} is a file; give a directory for the report files (it is created if missing)."
            )
        for name in report_files():
            check_target(out / name, "--out")
        refuse_output_as_input(
            [(f"--out's {name}", out / name) for name in report_files()],
            [("RESULTS", p) for p in args.results] + [("--claims", args.claims)],
        )
    claims_file = load_claims(args.claims) if args.claims else None  # a bad file fails before any work
    df = load_results(args.results, keep=args.keep)
    steps, steps_source = target_steps(df, args.target_steps)
    results = check_claims(df, claims_file, steps) if claims_file else None
    checks = advice.advice_checks(df)
    if args.predict:
        from ditbench.report.predict import predict_advice, predict_claims

        predict_advice(checks)
        if results:
            predict_claims(results, claims_file.card, steps)
    claims = (results, claims_file.path, claims_file.source, claims_file.card) if claims_file else None
    written: dict[str, Path] = {}
    if out is not None:  # steps=None: the report finds the records' own, or the default
        sources = [str(p) for p in args.results]
        written = write_report(df, out, args.title, sources, claims, args.target_steps, checks)
    if args.json:
        doc: dict[str, Any] = {
            "cells": len(df),
            "target_steps": {"steps": steps, "from": steps_source},
            "claims": None,
            "advice": [
                {key: getattr(c, key) for key in ("claim", "verdict", "evidence", "rule", "predicted")}
                for c in checks
            ],
            "recommendations": [
                {
                    "budget": r.budget,
                    "gpus": r.gpus,
                    "model": r.model,
                    "cell": r.cell_name,
                    IMAGES_PER_S.key: r.rate,
                    "memory_gib": r.memory_gib,
                    "memory_basis": r.memory_label or None,
                    "note": r.note or None,
                }
                for r in analysis.recommend(df).per_model
            ],
            "files": {name: str(path) for name, path in written.items()},
        }
        if claims_file is not None and results is not None:
            doc["claims"] = {
                "file": claims_file.path,
                "source": claims_file.source,
                "card": claims_file.card,
                "results": [r.as_dict() for r in results],
            }
        print(json.dumps(doc, indent=2, allow_nan=False, default=str))
        return 0
    print(f"report of {len(df)} cells written to {out}/:")
    for path in written.values():
        print(f"  {path}")
    if results:
        always = VERDICTS[:3]  # held, not held, not measured: said even when none
        counts = {v: sum(r.verdict == v for r in results) for v in VERDICTS}
        if args.predict:
            from ditbench.report.predict import counts as predicted_counts

            counts.update(predicted_counts(results))
        print("claims: " + ", ".join(f"{n} {v}" for v, n in counts.items() if n or v in always))
    return 0
