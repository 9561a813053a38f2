"""`ditbench run SUITE.yaml`: expand a suite and run its cells (resumable)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

from ditbench.core.errors import UserError

EXIT_NOTHING_MEASURED = 3  # a run in which no selected cell started (all unsupported or skipped)


SWITCHES = {
    "--force": "rerun cells that already have an ok record",
    "--dry-run": "print the expanded matrix (what each cell would do, why a cell would not run, and with "
    "the suite's plan: the predicted peak) and exit",
    "--allow-unsupported": "run even when no selected cell can run on this machine (a GPU suite on a CPU): "
    "each is recorded `unsupported` with its reason, without running",
    "--verbose": "a line as each cell starts, every note in full on its cell's line, and the table of every "
    "cell at the end (default: a line per cell, each note once at the end)",
    "--allow-empty": "exit 0 when no cell was measured (all unsupported here or skipped); without it such a "
    f"run exits {EXIT_NOTHING_MEASURED}",
    "--no-oom-skip": "run larger batches even after a smaller batch of the same series ran out of memory",
}


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
        metavar="DIR",
        help="the run's folder: results.jsonl, summary.md, logs/ (default: runs/<suite name>)",
    )
    for flag, text in SWITCHES.items():
        parser.add_argument(flag, action="store_true", help=text)
    parser.epilog = textwrap.fill(
        f"exit status: 0 when at least one cell was measured (whatever its status), 2 for bad input or "
        f"when no selected cell can run on this machine (--allow-unsupported records them), "
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
        metavar="K",
        help="measure each cell K times, each in a fresh process, round-robin across cells (over the "
        "suite's `repeats`); each repeat is a record of its own, speeds are the median of the "
        "per-process medians with a bootstrap interval, and compare tests the repeats",
    )
    parser.add_argument(
        "--timeout-s",
        type=float,
        help="per-cell timeout in seconds (overrides the suite's defaults.timeout_s)",
    )
    parser.add_argument(
        "--label",
        type=label_arg,
        help="a short name for this run (e.g. before-fix), written as `label` in each record; reports "
        "group a cell's records by it (up to 64 characters, one line)",
    )
    from ditbench.core.expansion import add_max_cells

    add_max_cells(parser, "a suite whose matrix (with its overrides) expands to")
    from ditbench.cli.options import add_json, add_no_progress, add_yes

    add_json(parser, "the records of the selected cells (or, with --dry-run, the planned cells)")
    add_no_progress(parser)
    add_yes(parser)
    from ditbench.bench.launch.torchrun import add_rendezvous_arguments

    add_rendezvous_arguments(parser)
    from ditbench.bench.jobs import EXECUTORS

    g = parser.add_argument_group("cluster (through submitit: pip install 'ditbench[slurm]')")
    g.add_argument(
        "--executor",
        choices=EXECUTORS,
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
    from ditbench.bench.launch.torchrun import rendezvous_from_args
    from ditbench.bench.runner import Visible, run_suite
    from ditbench.bench.runopts import KEPT, RESULTS_FILE, RunOptions, check_options, dry_run, select_cells
    from ditbench.bench.summary import Notes, closing, summary_table
    from ditbench.core.progress import duration
    from ditbench.files.outpaths import refuse_output_as_input
    from ditbench.spec.suite import load_suite

    if any(not f.strip() for f in args.cells):
        raise UserError(
            "--cells needs a non-empty name substring or cell id (an empty one matches every cell)."
        )
    suite = load_suite(args.suite, args.overrides, max_cells=args.max_cells)
    out = args.out or Path("runs") / suite.name
    refuse_output_as_input(  # a suite file kept as the run's summary.md would be replaced by it
        [(f"--out's {name}", Path(out) / name) for name in KEPT], [("SUITE", suite.path)]
    )
    cells = select_cells(suite, args.cells)
    if not cells:
        raise UserError(
            f"--cells {' '.join(args.cells)} matches none of the {len(suite.cells)} cells of suite "
            f"{suite.path}; run with --dry-run to list their names"
        )
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
        verbose=args.verbose,
    )
    check_options(options)
    executor, cluster = _executor(suite, args)
    visible = Visible.detect()
    verdicts = {c.cell_id: executor.verdict(c, visible, rendezvous) for c in cells}
    if args.dry_run:
        dry_run(suite, cells, verdicts, out, args)
        return 0
    if not args.allow_unsupported:
        _refuse_unrunnable(suite, cells, verdicts, visible, args)
    estimate: list[float | None] = [None]

    def announce(todo: list) -> None:  # once the output folder is checked, before any cell starts
        estimate[0] = _announce(suite, todo, args, visible)

    # Ctrl-C: cli.main prints this and the command that resumes (without --force, which would rerun all)
    args._resume = "the cells recorded so far are kept; this runs only the rest"
    args._resume_drop = ("--force",)
    notes, started = Notes(), time.monotonic()
    if args.executor is not None:
        from ditbench.bench.jobs import submit_suite

        records = submit_suite(suite, options, args.executor, cluster, notes=notes)
    else:
        records = run_suite(suite, options, notes=notes, before=announce)
    took = f"in {duration(time.monotonic() - started)}"
    took += f" (estimated {duration(estimate[0])})" if estimate[0] else ""
    say = sys.stderr if args.json else sys.stdout  # with --json, stdout holds the records alone
    if args.json:
        print(json.dumps([r.dump() for r in records]))
    elif args.verbose:
        print(summary_table(records, notes), end="")
    for line in closing(records, notes, took):
        print(line, file=say)
    print(f"results: {Path(out) / RESULTS_FILE}   summary: {Path(out) / 'summary.md'}", file=say)
    return _exit_status(records, args)


def _refuse_unrunnable(suite, cells, verdicts: dict, visible, args) -> None:
    """Refuse (UserError) a run in which no selected cell can run on this machine, naming what would."""
    from ditbench.bench.runner import precheck

    if any(verdicts[c.cell_id] is None or verdicts[c.cell_id][0] != "unsupported" for c in cells):
        return
    reasons = Counter(verdicts[c.cell_id][1] for c in cells)
    why = "; ".join(f"{n} cell{'s' * (n != 1)}: {reason}" for reason, n in reasons.items())
    name = shlex.join([args.suite, *args.overrides])
    text = (
        f"none of the {len(cells)} selected cells of suite {suite.name} can run on this machine ({why}). "
        f"`ditbench plan {name}` predicts their memory and speed on a card without running them"
    )
    if not visible.cuda and any(c.config["device"] == "cuda" for c in cells):
        on_cpu = [SimpleNamespace(config={**c.config, "device": "cpu"}) for c in cells]
        here = sum(precheck(c, visible) is None for c in on_cpu)
        unset = " card=null" if suite.card else " gpu_memory_gib=null" if suite.gpu_memory_gib else ""
        text += (
            f"; `ditbench run {name} device=cpu{unset}` runs {here} of them on this CPU (it says first "
            "how long that takes)"
        )
    raise UserError(
        text + ". --allow-unsupported records each as unsupported without running it; --dry-run lists "
        "every cell with its reason."
    )


def _announce(suite, todo: list, args, visible) -> float | None:
    """Print the estimate of the cells `todo` (walltime.announce: long CPU work needs --yes), return it."""
    from ditbench.hardware.device import device_type
    from ditbench.hardware.environment import nvml_gpu
    from ditbench.hardware.walltime import announce

    if not todo:
        return None
    device = device_type(todo[0].config["device"], visible.cuda)
    if device == "cpu":  # the CPU's rate at the cells' threads (this process computes nothing itself)
        import torch

        from ditbench.bench.cell.threads import pinned

        torch.set_num_threads(pinned(todo[0].config["threads"], device) or torch.get_num_threads())
    # this process holds no CUDA context: without NVML (ditbench[gpu]) it cannot name the GPU
    seconds = suite_seconds(todo, device) if device == "cpu" or nvml_gpu()[0] else None
    name = shlex.join([args.suite, *args.overrides])
    cheaper = (
        f"Run a part (--cells SUBSTR; --dry-run lists the cells), fewer steps (steps.min_seconds=0 "
        f"smoke.steps=0), or predict it without running: `ditbench plan {name}`."
    )
    repeats = ", repeats included" if len(todo) > len({c.cell_id for c in todo}) else ""
    what = f"suite {suite.name} ({len(todo)} cell{'s' * (len(todo) != 1)}{repeats})"
    announce("run", seconds, what, device, args.yes, cheaper)
    return seconds


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
        "(the reasons are above and in summary.md)."
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


def _executor(suite, args):
    """(executor, cluster): here, or as submitit jobs with the suite's `cluster:` under the --cluster
    KEY=VALUE flags, checked before a dry run too (it promises what the real run would do)."""
    if args.executor is None:
        if args.cluster:
            raise UserError("--cluster sets where --executor slurm submits the cells; add --executor slurm.")
        from ditbench.bench.runner import Processes

        return Processes(), None
    from ditbench.bench.jobs import Submitit
    from ditbench.spec.cluster import parse_cluster_flags

    flags = parse_cluster_flags(args.cluster)
    if args.executor == "local" and flags.any_set():
        raise UserError(
            f"--cluster {' '.join(args.cluster)} sets SLURM options, which --executor local does not use; "
            "drop --cluster, or use --executor slurm."
        )
    cluster = suite.cluster.merged(flags)
    return Submitit(args.executor, cluster), cluster


# A cell's process besides its steps: the interpreter and torch, the runner's gap between cells
# (CELL_START_S), and each Trainer it builds (BUILD_S_PER_MPARAM per million parameters; a CPU cell
# builds a second for the allocator peak, whose two profiled steps take about twice as long, and a
# smoke or quality run one more). CPU: fitted on cpu_smoke and a CPU ci_gate on 2 shared cores, scaled
# to the calibration's quiet CPU (reports/plan_vs_cpu); a CPU measured slower now (busy, or slower)
# takes longer in proportion. CUDA: a guess, no GPU measured it (ci_gate's "about 10 minutes").
CELL_START_S = {"cpu": 5.5, "cuda": 10.0}
BUILD_S_PER_MPARAM = {"cpu": 0.04, "cuda": 0.0}


def suite_seconds(cells, device: str) -> float | None:
    """Seconds to run the suite cells `cells` here one after another (None: a cell has no estimate): its
    process and builds, and every step it trains at the planner's step time (not a quality run's scoring)."""
    from ditbench.cli.train import train_step_s
    from ditbench.hardware.walltime import CALIBRATIONS, rate
    from ditbench.models.configs import get_config

    if (found := rate(device)) is None:
        return None
    slower = 1.0
    if device == "cpu":
        slower = json.loads((CALIBRATIONS / "speed_calibration_cpu.json").read_text())["peak_tflops"]
        slower /= found[0]["fp32"]
    total = 0.0
    for cell in cells:
        config, cpu = cell.config, device == "cpu"
        step = train_step_s(config, device)
        if step is None:
            return None
        at = (config.get("quality") or {}).get("at")
        steps = config["steps"]["warmup"] + config["smoke_steps"] + (max(at) if isinstance(at, list) else 0)
        window = max(config["steps"]["measure"] * step, config["steps"]["min_seconds"])
        model = get_config(config["model"])
        builds = 1 + cpu + (config["smoke_steps"] > 0) + bool(at)
        build_s = BUILD_S_PER_MPARAM[device] * 18 * model.depth * model.hidden_size**2 / 1e6  # ~ parameters
        total += slower * (CELL_START_S[device] + builds * build_s) + window + (steps + 4 * cpu) * step
    return total
