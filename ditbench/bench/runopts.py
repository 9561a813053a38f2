"""A run's options and what is decided before any cell starts: what a run refuses, which cells it
selects and in which order, which are recorded already, and what a run keeps in its --out."""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ditbench.bench.inflight import INFLIGHT_DIR
from ditbench.bench.plan_option import SuitePlanner
from ditbench.bench.summary import Notes
from ditbench.core.errors import UserError, shorten
from ditbench.core.faults import FAULT_ENV, FAULT_RANK_ENV, check_fault_rank, parse_fault_spec
from ditbench.core.units import memory_text
from ditbench.files.outlock import HELD_NAME, LOCK_NAME
from ditbench.files.outpaths import check_kept, ensure_dir
from ditbench.hardware.environment import collect_env
from ditbench.records.jsonl import latest_by_cell, read_records
from ditbench.spec.suite import REPEATS_MAX, TIMEOUT_MAX_S, Suite, SuiteCell

RESULTS_FILE = "results.jsonl"
SUMMARY_FILE = "summary.md"
LOGS_DIR = "logs"
JOBS_DIR = ".jobs"  # the tickets of the cells of an executor that does not wait (submitit's jobs)
# What a run keeps in its --out: name -> is a folder (outpaths.check_kept checks them)
KEPT = {RESULTS_FILE: False, SUMMARY_FILE: False, LOGS_DIR: True, INFLIGHT_DIR: True, JOBS_DIR: True}
KEPT.update({LOCK_NAME: False, HELD_NAME: False})  # and the lock's files (ditbench.files.outlock)


@dataclass
class RunOptions:
    out: Path
    force: bool = False
    cell_filters: list[str] = field(default_factory=list)
    timeout_s: float | None = None  # overrides the suite's per-cell timeout
    oom_skip: bool = True
    progress: bool = True
    rendezvous: dict | None = None  # torchrun's multi-node options (launch.torchrun.Rendezvous)
    label: str | None = None  # `run --label`: written into each record; reports group by it
    repeats: int | None = None  # `run --repeats K`: over the suite's `repeats`
    verbose: bool = False  # `run --verbose`: every cell's start and its notes in full on its line


def check_options(options: RunOptions) -> None:
    """Refuse, before any cell starts, what would otherwise fail midway (or never end)."""
    timeout = options.timeout_s
    if timeout is not None and (not math.isfinite(timeout) or not 0 < timeout <= TIMEOUT_MAX_S):
        raise UserError(
            f"--timeout-s must be a finite number of seconds above 0 and at most {TIMEOUT_MAX_S:g} "
            f"(a week), got {timeout}."
        )
    repeats = options.repeats
    if repeats is not None and (isinstance(repeats, bool) or not 1 <= repeats <= REPEATS_MAX):
        raise UserError(
            f"--repeats must be a whole number of runs from 1 to {REPEATS_MAX}, got {repeats}; each "
            "repeat is a fresh process per cell (3 to 10 is typical for a gate)."
        )
    parse_fault_spec(os.environ.get(FAULT_ENV))  # a typo would fail every cell it names, one by one
    check_fault_rank(os.environ.get(FAULT_RANK_ENV))


def check_out_dir(out: Path, *, create: bool) -> None:
    """Refuse an output folder the run could not finish in, before any cell starts (UserError);
    create=True also makes it and proves it writable (a dry run only checks what exists)."""
    where = shorten(str(out))
    if os.path.lexists(out) and not out.is_dir():
        raise UserError(f"--out {where} is a file, not a folder; give a folder for the run's results.")
    if create:
        ensure_dir(out, "--out")
    check_kept(out, KEPT)  # lstat: a link, a FIFO or a folder where a run keeps a file is refused
    if (out / LOGS_DIR).is_dir():  # a cell's log is truncated when the cell starts: a link, FIFO or hard link
        check_kept(out / LOGS_DIR, {p.name: False for p in (out / LOGS_DIR).glob("*.log")})
    results = out / RESULTS_FILE
    if results.exists() and not os.access(results, os.R_OK | (os.W_OK if create else 0)):
        raise UserError(f"{shorten(str(results))} is not readable and writable; a run appends to it.")


def select_cells(suite: Suite, filters: list[str]) -> list[SuiteCell]:
    if not filters:
        return list(suite.cells)
    return [c for c in suite.cells if any(f in c.cell_name or f == c.cell_id for f in filters)]


def already_recorded(prev: dict | None, force: bool, verdict: Callable[[], tuple[str, str] | None]) -> bool:
    """Whether a rerun leaves a cell as its latest record `prev` has it: ok, or unsupported here for the
    same reason as last time (`verdict()`: a new line would say nothing new)."""
    if force or prev is None or prev.get("status") not in ("ok", "unsupported"):
        return False
    return prev["status"] == "ok" or ((now := verdict()) is not None and prev.get("reason") == now[1])


def run_order(cells: list[SuiteCell]) -> list[SuiteCell]:
    """Suite order, except that within a series smaller batches go first (so an OOM can skip the rest)."""
    first: dict[str, int] = {}
    for i, cell in enumerate(cells):
        first.setdefault(cell.series_key, i)
    return sorted(cells, key=lambda c: (first[c.series_key], c.config["batch_size"]))


def now_iso(unix: float | None = None) -> str:
    """Now (or the time `unix`) as a record writes it: UTC to the second, e.g. 2026-01-31T12:00:00Z."""
    when = dt.datetime.fromtimestamp(time.time() if unix is None else unix, dt.timezone.utc)
    return when.isoformat(timespec="seconds").replace("+00:00", "Z")


def new_run_id() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(3)


def dry_run(suite, cells: list[SuiteCell], verdicts: dict, out: Path, args) -> None:
    """`run --dry-run`: what a real run would do with each cell (--json: one object), running none."""
    check_out_dir(out, create=False)  # run_suite checks (and creates) it for a real run
    previous = latest_by_cell(read_records(out / RESULTS_FILE))
    planner = (
        SuitePlanner(suite, suite.plan, collect_env(probe_cuda=False)) if suite.plan is not None else None
    )
    plans = {c.cell_id: dry_run_plan(c, verdicts[c.cell_id], previous, args, planner) for c in cells}
    if not args.json:
        print_dry_run(suite, cells, plans, out, args)
        return
    rows = [
        {"cell_id": c.cell_id, "cell_name": c.cell_name, **plans[c.cell_id], "config": c.config}
        for c in cells
    ]
    print(json.dumps({"suite": suite.name, "overrides": suite.overrides, "out": str(out), "cells": rows}))


def dry_run_plan(cell, verdict, previous: dict, args, planner=None) -> dict:
    """What a real run would do with the cell: {plan: the executor's verdict, skipped, done or run;
    reason: why it will not run (None when it will); with the suite's `plan:`, predicted_peak_gib}."""
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


def print_dry_run(suite, cells, plans: dict, out, args) -> None:
    """The matrix, a row per cell; each reason a cell will not run once, numbered, under the table."""
    k = args.repeats or suite.repeats
    times = f", each {k} times in fresh processes, round-robin" if k > 1 else ""
    print(f"suite {suite.name} ({suite.path}): {len(cells)} cells{times} -> {out}")
    if args.overrides:
        print(f"overrides: {' '.join(args.overrides)}")
    peak, notes = suite.plan is not None, Notes()
    print(
        f"{'cell_id':<13} {'smoke':>5}  {'plan':<16} "
        + (f"{'predicted peak':>14}  " if peak else "")
        + "cell"
    )
    for cell in cells:
        row = plans[cell.cell_id]
        plan = row["plan"]
        if row["reason"]:
            plan += " " + notes.ref(row["reason"], cell.cell_id, cell.cell_name, cell.config)
        gib = row.get("predicted_peak_gib")
        predicted = f"{memory_text(gib) if gib is not None else 'n/a':>14}  " if peak else ""
        print(f"{cell.cell_id:<13} {cell.config['smoke_steps']:>5}  {plan:<16} {predicted}{cell.cell_name}")
    for line in notes.lines([(c.cell_name, c.config) for c in cells]):
        print(line)
    if not any(plans[c.cell_id]["plan"] == "run" for c in cells):
        print(f"nothing would be measured: none of the {len(cells)} cells would run here (see above)")
