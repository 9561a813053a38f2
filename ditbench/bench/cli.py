"""`ditbench run SUITE.yaml`: expand a suite and run its cells (resumable)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ditbench.bench.cluster import EXECUTORS

EXIT_NOTHING_MEASURED = 3  # a run in which no selected cell started (all unsupported or skipped)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "suite", help="a shipped suite's name (`ditbench suites` lists them), e.g. cpu_smoke, or a suite YAML"
    )
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="change the suite: a knob (model=DiT-L/4, batch_size=[16,32]: a list is a matrix axis), "
        "a suite key (gpu_memory_gib=22.5, card=H100, device=cpu) or a dotted key (steps.measure=10); "
        "values are YAML, validated like the file and recorded in each record's suite_overrides",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="DIR",
        help="the run's folder: results.jsonl, summary.md, logs/ (default: runs/<suite name>)",
    )
    parser.add_argument("--force", action="store_true", help="rerun cells that already have an ok record")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print the expanded matrix (what each cell would do, why a cell would not run, and with "
        "the suite's plan: the predicted peak) and exit",
    )
    parser.add_argument(
        "--allow-empty",
        action="store_true",
        help=f"exit 0 when no cell was measured (all unsupported here or skipped); without it such a "
        f"run exits {EXIT_NOTHING_MEASURED}",
    )
    import textwrap

    parser.epilog = textwrap.fill(
        f"exit status: 0 when at least one cell was measured (whatever its status), 2 for bad input, "
        f"{EXIT_NOTHING_MEASURED} when no selected cell was measured (every one unsupported here or "
        "skipped; --allow-empty makes that 0), 130 when interrupted.",
        width=78,
    )
    parser.add_argument(
        "--cells",
        action="append",
        default=[],
        metavar="SUBSTR",
        help="run only cells whose name contains SUBSTR (or whose id is SUBSTR); repeatable",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=None,
        metavar="K",
        help="measure each cell K times, each in a fresh process, round-robin across cells (over the "
        "suite's `repeats`); each repeat is a record of its own, speeds are the median of the "
        "per-process medians with a bootstrap interval, and compare tests the repeats",
    )
    parser.add_argument(
        "--timeout-s",
        type=float,
        default=None,
        help="per-cell timeout in seconds (overrides the suite's defaults.timeout_s)",
    )
    parser.add_argument(
        "--label",
        type=label_arg,
        default=None,
        help="a short name for this run (e.g. before-fix), written as `label` in each record; reports "
        "group a cell's records by it (up to 64 characters, one line)",
    )
    parser.add_argument(
        "--no-oom-skip",
        action="store_true",
        help="run larger batches even after a smaller batch of the same series ran out of memory",
    )
    from ditbench.expansion import add_max_cells

    add_max_cells(parser, "a suite whose matrix (with its overrides) expands to")
    from ditbench.cliopts import add_json, add_no_progress

    add_json(parser, "the records of the selected cells (or, with --dry-run, the planned cells)")
    add_no_progress(parser)
    from ditbench.bench.launch.rendezvous import add_rendezvous_arguments

    add_rendezvous_arguments(parser)
    g = parser.add_argument_group("cluster (through submitit: pip install 'ditbench[slurm]')")
    g.add_argument(
        "--executor",
        choices=EXECUTORS,
        default=None,
        help="submit each cell as a submitit job: slurm (sbatch; a job array per job shape) or local "
        "(submitit's local executor, one cell at a time); default: run the cells here",
    )
    g.add_argument(
        "--cluster",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a `cluster:` option of the suite, over the suite's own (partition=gpu, account=..., qos=..., "
        "constraint=..., time_limit_min=120, sbatch.mem=0, ...); repeatable, with --executor slurm",
    )


LABEL_MAX = 64  # characters: a label is a row's name in a report, not a note


def label_arg(text: str) -> str:
    """--label's value: short text on one line (a report row is named by it)."""
    if not text.strip() or len(text) > LABEL_MAX or not text.isprintable():
        raise argparse.ArgumentTypeError(
            f"{text[:80]!r} is not a label: give 1 to {LABEL_MAX} printable characters on one line, "
            "no newline or control character (e.g. --label before-fix)"
        )
    return text.strip()


def run(args: argparse.Namespace) -> int:
    from ditbench.bench.runner import Visible, run_suite
    from ditbench.bench.runopts import (
        RESULTS_FILE,
        RunOptions,
        check_options,
        check_out_dir,
        kept_entries,
        select_cells,
    )
    from ditbench.bench.summary import summary_table
    from ditbench.errors import UserError
    from ditbench.outpaths import refuse_output_as_input
    from ditbench.records.jsonl import latest_by_cell, read_records
    from ditbench.spec.suite import load_suite

    if any(not f.strip() for f in args.cells):
        raise UserError(
            "--cells needs a non-empty name substring or cell id (an empty one matches every cell)."
        )
    suite = load_suite(args.suite, args.overrides, max_cells=args.max_cells)
    out = args.out or Path("runs") / suite.name
    refuse_output_as_input(  # a suite file kept as the run's summary.md would be replaced by it
        [(f"--out's {name}", Path(out) / name) for name in kept_entries()], [("SUITE", suite.path)]
    )
    cells = select_cells(suite, args.cells)
    if not cells:
        raise UserError(
            f"--cells {' '.join(args.cells)} matches none of the {len(suite.cells)} cells of suite "
            f"{suite.path}; run with --dry-run to list their names"
        )
    import dataclasses

    from ditbench.bench.launch.rendezvous import rendezvous_from_args

    rdzv = rendezvous_from_args(args)  # --nnodes 0 or a --node-rank beyond --nnodes is refused, not ignored
    rendezvous = dataclasses.asdict(rdzv) if rdzv.nnodes > 1 or rdzv.endpoint else None
    options = RunOptions(
        out=Path(out),
        force=args.force,
        cell_filters=args.cells,
        timeout_s=args.timeout_s,
        oom_skip=not args.no_oom_skip,
        progress=not args.no_progress,
        rendezvous=rendezvous,
        label=args.label,
        repeats=args.repeats,
    )
    check_options(options)
    if args.cluster and args.executor is None:
        raise UserError("--cluster sets where --executor slurm submits the cells; add --executor slurm.")
    # the --cluster keys are checked before a dry run too: it promises what the real run would do
    cluster = _cluster_options(suite, args) if args.executor is not None else None
    if args.dry_run:
        check_out_dir(Path(out), create=False)  # run_suite checks (and creates) it for a real run
        previous = latest_by_cell(read_records(Path(out) / RESULTS_FILE))
        visible = Visible.detect()
        planner = _planner(suite)
        executor = _executor(args, cluster)
        plans = {c.cell_id: _plan(c, visible, rendezvous, previous, args, executor, planner) for c in cells}
        if args.json:
            rows = [
                {"cell_id": c.cell_id, "cell_name": c.cell_name, **plans[c.cell_id], "config": c.config}
                for c in cells
            ]
            print(
                json.dumps(
                    {"suite": suite.name, "overrides": suite.overrides, "out": str(out), "cells": rows}
                )
            )
            return 0
        _print_dry_run(suite, cells, plans, out, args)
        return 0
    # with --json the per-cell lines go to stderr; stdout holds the records alone
    echo = (lambda line: print(line, file=sys.stderr, flush=True)) if args.json else None
    if args.executor is not None:
        from ditbench.bench.jobs import submit_suite

        records = submit_suite(suite, options, args.executor, cluster, echo=echo)
    else:
        records = run_suite(suite, options, echo=echo)
    if args.json:
        print(json.dumps([r.dump() for r in records]))
        return _exit_status(records, args)
    print()
    print(summary_table(records), end="")
    print(f"\nresults: {Path(out) / RESULTS_FILE}   summary: {Path(out) / 'summary.md'}")
    return _exit_status(records, args)


NOT_MEASURED = ("unsupported", "skipped")  # statuses of cells that never started


def _exit_status(records: list[dict], args: argparse.Namespace) -> int:
    """0, or EXIT_NOTHING_MEASURED (said on stderr) when no selected cell was measured."""
    if any(r.get("status") not in NOT_MEASURED for r in records):
        return 0
    if getattr(args, "node_rank", 0):  # a node > 0 ran its ranks; node 0 records the cells (`skipped` here)
        return 0
    statuses = sorted({str(r.get("status")) for r in records})
    message = (
        f"nothing was measured: all {len(records)} selected cells are {' or '.join(statuses)} "
        "(the reasons are in the table and in summary.md)."
    )
    if args.allow_empty:
        print(f"ditbench: {message}", file=sys.stderr)
        return 0
    print(
        f"ditbench: {message} Exit status {EXIT_NOTHING_MEASURED}; choose cells that run here (--dry-run "
        "shows why each would not), or pass --allow-empty to accept an empty run.",
        file=sys.stderr,
    )
    return EXIT_NOTHING_MEASURED


def _cluster_options(suite, args):
    """The suite's `cluster:` with the --cluster KEY=VALUE flags over it, validated (UserError)."""
    from ditbench.errors import UserError
    from ditbench.spec.cluster import parse_cluster_flags

    flags = parse_cluster_flags(args.cluster)
    if args.executor == "local" and flags.any_set():
        raise UserError(
            f"--cluster {' '.join(args.cluster)} sets SLURM options, which --executor local does not use; "
            "drop --cluster, or use --executor slurm."
        )
    return suite.cluster.merged(flags)


def _executor(args, cluster):
    """What runs the cells: submitit's executor with --executor, else a fresh process per cell here."""
    if args.executor is None:
        from ditbench.bench.runner import Processes

        return Processes()
    from ditbench.bench.jobs import Submitit

    return Submitit(args.executor, cluster)


def _planner(suite):
    """The suite's `plan:` option's planner (predictions in this process, as the run makes them), or None."""
    if suite.plan is None:
        return None
    from ditbench.bench.plan_option import SuitePlanner
    from ditbench.environment import collect_env

    return SuitePlanner(suite, suite.plan, collect_env(probe_cuda=False))


def _plan(cell, visible, rendezvous, previous: dict, args, executor, planner=None) -> dict:
    """What a real run would do with the cell: {plan: the executor's verdict, skipped, done or run;
    reason: why it will not run (None when it will); with the suite's `plan:`, predicted_peak_gib}."""
    verdict = executor.verdict(cell, visible, rendezvous)
    out: dict = {"plan": "run", "reason": None}
    if planner is not None:
        prediction = planner.prediction(cell)
        out["predicted_peak_gib"] = prediction.get("peak_allocated_gib")
        out["prediction_status"] = prediction.get("status")
    if verdict:
        out.update(plan=verdict[0], reason=verdict[1])
    elif not args.force and (previous.get(cell.cell_id) or {}).get("status") == "ok":
        out["plan"] = "done (ok)"
    elif planner is not None and (skip := planner.skip_reason(cell)):
        out.update(plan="skipped", reason=skip)
    return out


def _print_dry_run(suite, cells, plans: dict, out, args) -> None:
    """The matrix, a row per cell; each reason a cell will not run once, numbered, under the table."""
    from ditbench.units import memory_text

    k = args.repeats or suite.repeats
    times = f", each {k} times in fresh processes, round-robin" if k > 1 else ""
    print(f"suite {suite.name} ({suite.path}): {len(cells)} cells{times} -> {out}")
    if args.overrides:
        print(f"overrides: {' '.join(args.overrides)}")
    peak = suite.plan is not None
    notes: dict[str, int] = {}
    print(
        f"{'cell_id':<13} {'smoke':>5}  {'plan':<16} "
        + (f"{'predicted peak':>14}  " if peak else "")
        + "cell"
    )
    for cell in cells:
        row = plans[cell.cell_id]
        plan = row["plan"]
        if row["reason"]:
            plan += f" [{notes.setdefault(row['reason'], len(notes) + 1)}]"
        predicted = ""
        if peak:
            gib = row.get("predicted_peak_gib")
            predicted = f"{memory_text(gib) if gib is not None else 'n/a':>14}  "
        print(f"{cell.cell_id:<13} {cell.config['smoke_steps']:>5}  {plan:<16} {predicted}{cell.cell_name}")
    counts = {reason: sum(plans[c.cell_id]["reason"] == reason for c in cells) for reason in notes}
    for reason, number in notes.items():
        print(f"[{number}] {reason} ({counts[reason]} cell{'s' * (counts[reason] != 1)})")
    runs = sum(plans[c.cell_id]["plan"] == "run" for c in cells)
    if not runs:
        print(f"nothing would be measured: none of the {len(cells)} cells would run here (see above)")
