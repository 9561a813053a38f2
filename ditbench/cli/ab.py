"""`ditbench ab SUITE --a PYTHON --b PYTHON`: rounds until every cell is decided or the rounds or the
budget run out; then the gate's summary and exit status, as `compare`."""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from pathlib import Path

DEFAULT_ROUNDS = 20
DEFAULT_BUDGET_MIN = 60.0
MAX_ROUNDS = 1000
EPILOG = """\
A side is a Python interpreter or a virtual environment's folder with ditbench installed, plus
environment variables of its own; every cell runs as a fresh process of the side's interpreter (its
own torch, ditbench and model code). Both sides must read the cell spec this ditbench writes: a side
that cannot is refused by name (exit 2). Each round runs every undecided cell once per side, in a
random order (--seed repeats it), interleaved or --duet (at once, on disjoint CPUs; a CUDA suite on
one GPU runs interleaved). Per round the ratio B/A of the two processes' median step times; an exact
signed-rank interval, looked at after every round with O'Brien-Fleming-type alpha spending; a pass
needs the interval and the minimum detectable effect within the threshold. Memory, loss, quality and
status changes are gated as by `compare` (its --help describes the policy). docs/gate-in-ci.md.

exit status: 0 pass or improvement, 1 regression, 2 usage or input error, 3 inconclusive.
Written: OUT/a/results.jsonl, OUT/b/results.jsonl (every process's record, appended at once),
OUT/logs/RUN_ID/, OUT/summary.md, OUT/ab.json; the summary also to stdout (--json: the JSON),
--summary FILE and $GITHUB_STEP_SUMMARY.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    parser.add_argument("suite", help="a shipped suite's name or a suite YAML (`ditbench suites` lists them)")
    parser.add_argument(
        "overrides", nargs="*", metavar="KEY=VALUE", help="change the suite, as for `ditbench run`"
    )
    for side in ("a", "b"):
        parser.add_argument(
            f"--{side}",
            metavar="PYTHON",
            help=f"side {side.upper()}'s interpreter or virtual environment (default: this interpreter)",
        )
        parser.add_argument(
            f"--{side}-env",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help=f"an environment variable for side {side.upper()}'s processes; repeatable",
        )
    parser.add_argument("--duet", action="store_true", help="run A and B at the same time on disjoint CPUs")
    parser.add_argument("--seed", type=int, help="the order's seed (default: drawn and printed)")
    parser.add_argument("--max-rounds", type=int, default=DEFAULT_ROUNDS, help="rounds at most")
    parser.add_argument(
        "--budget-min",
        type=float,
        default=DEFAULT_BUDGET_MIN,
        help="minutes from the start (the sides' check included) after which no round may end; a round "
        "is expected to take as long a pair as the slowest so far",
    )
    parser.add_argument("--cells", action="append", default=[], metavar="SUBSTR", help="only these cells")
    parser.add_argument("--policy", metavar="POLICY.yaml", help="as for compare (default: defaults)")
    parser.add_argument("--timeout-s", type=float, help="per-process timeout in seconds")
    parser.add_argument(
        "--out", type=Path, default=Path("runs") / "ab", metavar="DIR", help="the run's folder"
    )
    from ditbench.cli.compare import add_summary_options

    add_summary_options(parser)


def _check(args: argparse.Namespace, alpha: float) -> None:
    from ditbench.core.errors import UserError
    from ditbench.spec.suite import TIMEOUT_MAX_S

    fewest = math.ceil(math.log2(2 / alpha))  # 2 / 2^n: the exact interval's smallest level
    if not fewest <= args.max_rounds <= MAX_ROUNDS:
        raise UserError(
            f"--max-rounds {args.max_rounds}: give {fewest} to {MAX_ROUNDS}; with fewer than {fewest} "
            f"rounds no exact signed-rank interval reaches the policy's alpha {alpha:g}, so nothing could "
            "be decided."
        )
    if not (math.isfinite(args.budget_min) and args.budget_min > 0):
        raise UserError(f"--budget-min {args.budget_min}: give a number of minutes above 0.")
    timeout = args.timeout_s
    if timeout is not None and not (math.isfinite(timeout) and 0 < timeout <= TIMEOUT_MAX_S):
        raise UserError(
            f"--timeout-s {timeout}: give a number of seconds above 0, at most {TIMEOUT_MAX_S:g}."
        )
    if args.seed is not None and not 0 <= args.seed < 2**63:
        raise UserError(f"--seed {args.seed}: give a whole number from 0 to 2^63 - 1.")
    if any(not f.strip() for f in args.cells):
        raise UserError("--cells needs a non-empty name substring or cell id.")


def run(args: argparse.Namespace) -> int:
    from ditbench.ab.sides import Side, env_items, interpreter
    from ditbench.bench.runopts import new_run_id, select_cells
    from ditbench.cli.compare import check_summary_target
    from ditbench.core.errors import UserError
    from ditbench.files.outlock import HELD_NAME, LOCK_NAME, OutputLock
    from ditbench.files.outpaths import check_kept, ensure_dir, refuse_output_as_input
    from ditbench.report.gate.policy import load_policy
    from ditbench.spec.suite import load_suite

    policy = load_policy(args.policy)
    _check(args, policy.alpha)
    suite = load_suite(args.suite, args.overrides)
    cells = select_cells(suite, args.cells)
    if not cells:
        raise UserError(
            f"--cells {' '.join(args.cells)} matches none of the {len(suite.cells)} cells of {suite.path}."
        )
    sides = tuple(
        Side(name, interpreter(f"--{name.lower()}", getattr(args, name.lower()) or sys.executable),
             env_items(f"--{name.lower()}", getattr(args, f"{name.lower()}_env")))
        for name in ("A", "B")
    )  # fmt: skip
    out: Path = args.out
    kept = {"a": True, "b": True, "logs": True, "summary.md": False, "ab.json": False, ".ab": True}
    kept.update({LOCK_NAME: False, HELD_NAME: False})
    inputs = [("SUITE", suite.path), ("--policy", args.policy)]
    refuse_output_as_input([(f"--out's {name}", out / name) for name in kept], inputs)
    check_summary_target(args.summary, inputs)
    ensure_dir(out, "--out")
    check_kept(out, kept)
    for side in ("a", "b"):
        check_kept(out / side, {"results.jsonl": False})
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    with OutputLock(out):
        return _gate(args, suite, cells, sides, policy, out, seed, new_run_id())


def _gate(args, suite, cells, sides, policy, out: Path, seed: int, run_id: str) -> int:
    from ditbench.ab.rounds import Rounds
    from ditbench.ab.sequential import Gate
    from ditbench.ab.sides import probe
    from ditbench.bench.launch.files import write_spec
    from ditbench.cli.compare import publish, refused
    from ditbench.files.fileio import write_atomic
    from ditbench.report.gate.inputs import GateRefusal
    from ditbench.report.gate.result import to_json_text
    from ditbench.report.gate.summary import summary_markdown

    def say(line: str) -> None:
        print(f"ditbench ab: {line}", file=sys.stderr, flush=True)

    start = time.monotonic()  # the budget counts the probe too
    rounds = Rounds(suite, sides, out, run_id, args.max_rounds, rng=random.Random(seed), say=say,
                    duet=args.duet, timeout_s=args.timeout_s, cells=cells)  # fmt: skip
    specs = []
    for cell in cells:
        specs.append(rounds.work / f"probe.{cell.cell_id}.spec.json")
        write_spec(specs[-1], cell.spec, cell_id=cell.cell_id, cell_name=cell.cell_name, timeout_s=1.0)
    try:
        sides = tuple(probe(side, specs) for side in sides)
    finally:
        for spec in specs:
            spec.unlink(missing_ok=True)
    rounds.sides = sides
    mode = "duet" if rounds.duet else "interleaved"
    rounds_at_most = f"{len(cells)} cells, {args.max_rounds} rounds at most"
    say(f"seed {seed} (--seed {seed} repeats the order); {mode}; {rounds_at_most}")
    gate = Gate(cells, policy, args.max_rounds, rounds.where, tuple(f"{s.name} {s.python}" for s in sides))
    budget_s, stopped, result, n, pair_s = args.budget_min * 60, "", None, 0, 0.0
    try:
        while not stopped:
            n += 1
            ran, t0 = gate.open, time.monotonic()
            gate.add(n, rounds.round(ran, n))
            result = gate.judge(last=False)
            # the next round, at the slowest pair so far: no round starts that would end past the budget
            pair_s, left = max(pair_s, (time.monotonic() - t0) / len(ran)), len(gate.open)
            more = time.monotonic() - start + pair_s * left <= budget_s
            stopped = (
                "every cell decided" if not left
                else f"{args.max_rounds} rounds run" if n >= args.max_rounds
                else "" if more else f"the next round would end after --budget-min {args.budget_min:g}"
            )  # fmt: skip
            if stopped and left:
                result = gate.judge(last=True)  # no round follows: the open cells' last look spends the rest
            mde = result.largest_mde
            say(
                f"round {n}: {len(ran) - left} of {len(ran)} cells decided"
                + (f"; largest MDE {mde:.1f}%" if mde else "")
            )
    except GateRefusal as err:
        refused(err, args.summary, args.json)
        write_atomic(out / "summary.md", err.markdown())
        raise
    result.ab = {
        "mode": mode,
        "seed": seed,
        "rounds": n,
        "max_rounds": args.max_rounds,
        "budget_min": args.budget_min,
        "stopped": stopped,
        "wall_s": round(time.monotonic() - start, 1),
        "run_id": run_id,
        "out": str(out),
        "sides": {s.name: s.about() for s in sides},
        "cells": gate.about(),
    }
    text = summary_markdown(result)
    write_atomic(out / "summary.md", text)
    write_atomic(out / "ab.json", to_json_text(result) + "\n")
    publish(text, args.summary)
    sys.stdout.write(to_json_text(result) + "\n" if args.json else text)
    return result.exit_code
