"""`ditbench export RESULTS... --to tensorboard|mlflow|wandb [TARGET]`: each cell as a tracker's run
(docs/export.md says why this is not `report --to`)."""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path

from ditbench.core.errors import UserError
from ditbench.report.load import KEEP_CHOICES, add_results

TRACKERS = {"tensorboard": "DIR", "mlflow": "URI", "wandb": "DIR"}
DEFAULT_DIRS = {"tensorboard": "runs", "wandb": "."}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_results(parser)
    parser.add_argument(
        "--to",
        nargs="+",
        required=True,
        metavar="TRACKER [TARGET]",
        help="tensorboard [DIR] (a log directory, default runs: one run folder per cell), mlflow [URI] "
        "(a tracking server, or a local store: sqlite:///mlflow.db, MLflow 3's default, or file:///path) "
        "or wandb [DIR] (offline runs under DIR/wandb, default ./wandb; `wandb sync` uploads them); "
        "needs pip install 'ditbench[TRACKER]'",
    )
    parser.add_argument(
        "--experiment",
        metavar="NAME",
        help="MLflow experiment or W&B project to write into (default: the suite's name, or ditbench for "
        "several suites)",
    )
    parser.add_argument(
        "--keep",
        choices=KEEP_CHOICES,
        default="latest",
        help="when a cell appears more than once: export its latest record, or all of them",
    )
    parser.add_argument("--no-report", action="store_true", help="do not render and attach the report")
    parser.add_argument("--json", action="store_true", help="print what was written and skipped as JSON")


def _target(args: argparse.Namespace) -> tuple[str, str | None]:
    tracker, target = args.to[0], (args.to[1:] or [DEFAULT_DIRS.get(args.to[0])])[0]
    if tracker not in TRACKERS or len(args.to) > 2:
        raise UserError(
            f"--to {' '.join(args.to)!r} is not a tracker ditbench exports to; give --to tensorboard [DIR], "
            "--to mlflow [URI] or --to wandb [DIR] (for example --to tensorboard runs/tb, "
            "--to mlflow sqlite:///mlflow.db, --to wandb runs/wb)."
        )
    if TRACKERS[tracker] == "DIR" and Path(target).exists() and not Path(target).is_dir():
        raise UserError(f"--to {tracker} {target}: that is a file; give a directory (created if missing).")
    if tracker == "tensorboard" and args.experiment:
        raise UserError(
            "--experiment names an MLflow experiment or a W&B project; it does not apply to --to tensorboard."
        )
    return tracker, target


def run(args: argparse.Namespace) -> int:
    from ditbench.core.extras import require_extra
    from ditbench.export.runs import tracker_runs
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
        from ditbench.export import trackers

        if tracker == "tensorboard":
            done = trackers.to_tensorboard(runs, Path(target), report)
        else:
            suites = sorted(set(df["suite"].dropna()))
            experiment = args.experiment or (suites[0] if len(suites) == 1 else "ditbench")
            if tracker == "wandb":
                done = trackers.to_wandb(runs, Path(target), experiment, report)
            else:
                target = trackers.tracking_uri(target)
                done = trackers.to_mlflow(runs, target, experiment, report)
    if args.json:
        print(json.dumps({"tracker": tracker, "target": target, **done, "notes": notes}, indent=2))
        return 0
    print(
        f"{tracker}: {len(done['written'])} run(s) written to {target}"
        + (f", {len(done['skipped'])} already there (skipped)" if done["skipped"] else "")
    )
    return 0
