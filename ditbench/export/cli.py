"""`ditbench export RESULTS... --to tensorboard DIR | --to mlflow URI`: each cell as a tracker's run.

A command of its own rather than `report --to`: a report renders files into --out, while an export
writes into another tool's store, with its own target, experiment and rules for what is there
already; keeping it apart also keeps the trackers off report's path. The report is rendered and
attached (TensorBoard: its markdown and plots; MLflow: its files as artifacts) unless --no-report.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path

from ditbench.errors import UserError
from ditbench.report.load import KEEP_CHOICES, add_results

TRACKERS = {"tensorboard": "DIR", "mlflow": "URI"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_results(parser)
    parser.add_argument(
        "--to",
        nargs=2,
        required=True,
        metavar=("TRACKER", "TARGET"),
        help="tensorboard DIR (a log directory: one run folder per cell) or mlflow URI (a tracking "
        "server, or a local store such as file:///path/mlruns); needs pip install 'ditbench[TRACKER]'",
    )
    parser.add_argument(
        "--experiment",
        metavar="NAME",
        default=None,
        help="MLflow experiment to write into (default: the suite's name, or ditbench for several suites)",
    )
    parser.add_argument(
        "--keep",
        choices=KEEP_CHOICES,
        default="latest",
        help="when a cell appears more than once: export its latest record, or all of them",
    )
    parser.add_argument("--no-report", action="store_true", help="do not render and attach the report")
    parser.add_argument("--json", action="store_true", help="print what was written and skipped as JSON")


def _target(args: argparse.Namespace) -> tuple[str, str]:
    tracker, target = args.to
    if tracker not in TRACKERS:
        raise UserError(
            f"--to {tracker!r} is not a tracker ditbench exports to; give --to tensorboard DIR or "
            "--to mlflow URI (for example --to tensorboard runs/tb, --to mlflow file:///tmp/mlruns)."
        )
    if tracker == "tensorboard" and Path(target).exists() and not Path(target).is_dir():
        raise UserError(
            f"--to tensorboard {target}: that is a file; give a log directory (created if missing)."
        )
    if tracker != "mlflow" and args.experiment:
        raise UserError("--experiment names an MLflow experiment; it applies only to --to mlflow URI.")
    return tracker, target


def run(args: argparse.Namespace) -> int:
    from ditbench.export.runs import tracker_runs
    from ditbench.extras import require_extra
    from ditbench.report.load import load_results

    tracker, target = _target(args)
    require_extra(tracker, tracker, f"ditbench export --to {tracker}")  # before any work
    df = load_results(args.results, keep=args.keep)
    runs = tracker_runs(df)
    notes = [note for r in runs for note in r.notes]  # grids left out: outside the run, too large
    for note in notes:
        print(f"ditbench: note: {note}", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="ditbench-export-") as tmp:
        report = None
        if not args.no_report:
            from ditbench.report.render import write_report

            files = write_report(df, tmp, sources=[str(p) for p in args.results])
            keys = "\n".join(sorted(f"{r.tags.get('run_id')}/{r.tags.get('cell_id')}" for r in runs))
            report = (hashlib.sha256(keys.encode()).hexdigest()[:12], files)
        if tracker == "tensorboard":
            from ditbench.export import tensorboard_writer

            done = tensorboard_writer.export(runs, Path(target), report)
        else:
            from ditbench.export import mlflow_writer

            suites = sorted(set(df["suite"].dropna()))
            experiment = args.experiment or (suites[0] if len(suites) == 1 else "ditbench")
            done = mlflow_writer.export(runs, target, experiment, report)
    if args.json:
        json.dump({"tracker": tracker, "target": target, **done, "notes": notes}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    print(
        f"{tracker}: {len(done['written'])} run(s) written to {target}"
        + (f", {len(done['skipped'])} already there (skipped)" if done["skipped"] else "")
    )
    return 0
