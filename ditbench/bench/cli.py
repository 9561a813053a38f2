"""`ditbench run SUITE.yaml`: expand a suite and run its cells (resumable)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ditbench.bench.cluster import EXECUTORS


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
    parser.add_argument("--dry-run", action="store_true", help="print the expanded matrix and exit")
    parser.add_argument(
        "--cells",
        action="append",
        default=[],
        metavar="SUBSTR",
        help="run only cells whose name contains SUBSTR (or whose id is SUBSTR); repeatable",
    )
    parser.add_argument(
        "--timeout-s",
        type=float,
        default=None,
        help="per-cell timeout in seconds (overrides the suite's defaults.timeout_s)",
    )
    parser.add_argument(
        "--no-oom-skip",
        action="store_true",
        help="run larger batches even after a smaller batch of the same series ran out of memory",
    )
    from ditbench.expansion import DEFAULT_MAX_CELLS

    parser.add_argument(
        "--max-cells",
        type=int,
        default=None,
        metavar="N",
        help="refuse a suite whose matrix (with its overrides) expands to more than N cells, counted "
        f"before expanding (default: {DEFAULT_MAX_CELLS})",
    )
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


def run(args: argparse.Namespace) -> int:
    from ditbench.bench.records import latest_by_cell, read_records
    from ditbench.bench.runner import (
        RESULTS_FILE,
        RunOptions,
        Visible,
        check_options,
        check_out_dir,
        kept_entries,
        run_suite,
        select_cells,
    )
    from ditbench.bench.suite import load_suite
    from ditbench.bench.summary import summary_table
    from ditbench.errors import UserError
    from ditbench.outpaths import refuse_output_as_input

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
        if args.json:
            rows = [
                {
                    "cell_id": c.cell_id,
                    "cell_name": c.cell_name,
                    "plan": _plan(c, visible, rendezvous, previous, args),
                }
                | {"config": c.config}
                for c in cells
            ]
            print(
                json.dumps(
                    {"suite": suite.name, "overrides": suite.overrides, "out": str(out), "cells": rows}
                )
            )
            return 0
        print(f"suite {suite.name} ({suite.path}): {len(cells)} cells -> {out}")
        if args.overrides:
            print(f"overrides: {' '.join(args.overrides)}")
        print(f"{'cell_id':<13} {'smoke':>5}  {'plan':<12} cell")
        for cell in cells:
            plan = _plan(cell, visible, rendezvous, previous, args)
            print(f"{cell.cell_id:<13} {cell.config['smoke_steps']:>5}  {plan:<12} {cell.cell_name}")
        return 0
    if args.executor is not None:
        echo = (lambda line: print(line, file=sys.stderr, flush=True)) if args.json else None
        records = _submit(suite, options, args, cluster, echo)
        if args.json:
            print(json.dumps(records, default=str))
            return 0
    elif args.json:  # the per-cell lines go to stderr; stdout holds the records alone
        records = run_suite(suite, options, echo=lambda line: print(line, file=sys.stderr, flush=True))
        print(json.dumps(records, default=str))
        return 0
    else:
        records = run_suite(suite, options)
    print()
    print(summary_table(records), end="")
    print(f"\nresults: {Path(out) / RESULTS_FILE}   summary: {Path(out) / 'summary.md'}")
    return 0


def _cluster_options(suite, args):
    """The suite's `cluster:` with the --cluster KEY=VALUE flags over it, validated (UserError)."""
    from ditbench.bench.cluster import parse_cluster_flags
    from ditbench.errors import UserError

    flags = parse_cluster_flags(args.cluster)
    if args.executor == "local" and flags.any_set():
        raise UserError(
            f"--cluster {' '.join(args.cluster)} sets SLURM options, which --executor local does not use; "
            "drop --cluster, or use --executor slurm."
        )
    return suite.cluster.merged(flags)


def _submit(suite, options, args, cluster, echo=None) -> list[dict]:
    from ditbench.bench.jobs import submit_suite

    return submit_suite(suite, options, args.executor, cluster, echo=echo)


def _plan(cell, visible, rendezvous, previous: dict, args: argparse.Namespace) -> str:
    """What a real run would do with the cell: the precheck's verdict, done, or run."""
    if args.executor is not None:
        from ditbench.bench.jobs import cell_verdict

        verdict = cell_verdict(cell, args.executor, visible)
    else:
        from ditbench.bench.runner import precheck

        verdict = precheck(cell, visible, rendezvous)
    if verdict:
        return verdict[0]
    if not args.force and (previous.get(cell.cell_id) or {}).get("status") == "ok":
        return "done (ok)"
    return "run"
