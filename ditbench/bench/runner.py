"""Run a suite: every cell in a fresh process, one record per cell appended to results.jsonl.

Isolation: each cell runs in a fresh process of its own session (a `launch.base.Launcher`: one
process, or torchrun's for several), so the allocator and its peak counters start clean, and a crash,
an out-of-memory or a hang in one cell cannot take the suite down; a timeout kills the cell's
whole process group.

Resume: a rerun into the same directory skips cells whose latest record is `ok` (same cell_id);
`force=True` reruns everything.

Repeats (`repeats: K`, `run --repeats K`): every cell K times, each in a fresh process, round-robin
(cell 1 repeat 1, cell 2 repeat 1, ..., cell 1 repeat 2, ...) so that a load spike hits every cell
alike; each repeat is a record of its own (`repeat`, `repeats`), and resume skips the repeats whose
latest record is `ok`. A repeat that fails (oom, error, ...) stops the cell's later repeats
(`skipped`, naming it). `bench.repeats` makes one figure of a cell's repeats.

Out of memory: after an out-of-memory at batch B, the larger batches of the same series (the same
cell except the batch size) are recorded `skipped` without being started.

One writer, nothing lost: a run holds the output folder's lock (`ditbench.outlock`) from start to
end, so a second run on the same folder stops at once naming the first. Each cell's result goes
through `<out>/.inflight/` (`bench.inflight`): written there, appended once, then removed; a run
killed between a cell's end and its append leaves the result there, and the next run appends it.

Planning: with the suite's `plan` option (`bench.plan_option`) every record holds the planner's
prediction, cells predicted not to fit are `skipped` unrun, and each series runs largest batch first.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import math
import os
import secrets
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ditbench.bench import inflight
from ditbench.bench.launch.base import for_cell as launcher_for
from ditbench.bench.records import read_records
from ditbench.bench.repeats import REPEATS_MAX, combined, latest_by_repeat
from ditbench.bench.suite import TIMEOUT_MAX_S, Suite, SuiteCell
from ditbench.bench.summary import format_line, write_summary
from ditbench.device import cuda_visible, device_type
from ditbench.errors import UserError, shorten
from ditbench.faults import FAULT_ENV, FAULT_RANK_ENV, check_fault_rank, parse_fault_spec
from ditbench.outlock import HELD_NAME, LOCK_NAME, OutputLock
from ditbench.outpaths import check_kept, ensure_dir
from ditbench.precision import unsupported_reason

RESULTS_FILE = "results.jsonl"
SUMMARY_FILE = "summary.md"
LOGS_DIR = "logs"


@dataclass
class RunOptions:
    out: Path
    force: bool = False
    cell_filters: list[str] = field(default_factory=list)
    timeout_s: float | None = None  # overrides the suite's per-cell timeout
    oom_skip: bool = True
    progress: bool = True
    rendezvous: dict | None = None  # torchrun's multi-node options (launch.rendezvous.Rendezvous)
    label: str | None = None  # `run --label`: written into each record; reports group by it
    repeats: int | None = None  # `run --repeats K`: over the suite's `repeats`


@dataclass
class Visible:
    """What this machine can run, decided once in the parent (no CUDA context is created)."""

    cuda: bool
    gpu_count: int

    @classmethod
    def detect(cls) -> Visible:
        import torch

        cuda = cuda_visible()
        return cls(cuda=cuda, gpu_count=torch.cuda.device_count() if cuda else 0)


def precheck(cell: SuiteCell, visible: Visible, rendezvous: dict | None = None) -> tuple[str, str] | None:
    """(status, reason) for a cell that cannot run here, decided without starting it."""
    config = cell.config
    device = device_type(config["device"], visible.cuda)
    if device == "cuda" and not visible.cuda:
        return "unsupported", "the suite asks for device cuda but no CUDA device is visible"
    reason = unsupported_reason(config["precision"], device)
    if reason:
        return "unsupported", reason
    # gpus > 1 on a CPU: that many gloo processes through torchrun (the multi-GPU path, testable anywhere)
    if device == "cuda" and config["gpus"] > visible.gpu_count:
        return "unsupported", f"gpus={config['gpus']} but {visible.gpu_count} CUDA device(s) are visible"
    if rendezvous or config["nodes"] > 1:
        from ditbench.bench.launch.rendezvous import Rendezvous, node_verdict

        return node_verdict(config, Rendezvous(**(rendezvous or {})))
    return None


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


def kept_entries() -> dict[str, bool]:
    """What a run keeps in its --out: name -> is a folder (outpaths.check_kept checks them)."""
    return {
        RESULTS_FILE: False,
        SUMMARY_FILE: False,
        LOGS_DIR: True,
        inflight.INFLIGHT_DIR: True,
        ".jobs": True,  # bench.jobs.JOBS_DIR (submitit executors)
        LOCK_NAME: False,
        HELD_NAME: False,
    }


def check_out_dir(out: Path, *, create: bool) -> None:
    """Refuse an output folder the run could not finish in, before any cell starts (UserError).

    create=False (a dry run) only checks what exists; create=True makes the folder and proves it
    writable.
    """
    where = shorten(str(out))
    if os.path.lexists(out) and not out.is_dir():
        raise UserError(f"--out {where} is a file, not a folder; give a folder for the run's results.")
    if create:
        ensure_dir(out, "--out")
    check_kept(out, kept_entries())  # lstat: a link, a FIFO or a folder where a run keeps a file is refused
    if (out / LOGS_DIR).is_dir():  # a cell's log is truncated when the cell starts: never through a link
        check_kept(out / LOGS_DIR, {p.name: False for p in (out / LOGS_DIR).iterdir() if p.is_symlink()})
    results = out / RESULTS_FILE
    if results.exists() and not os.access(results, os.R_OK | (os.W_OK if create else 0)):
        raise UserError(f"{shorten(str(results))} is not readable and writable; a run appends to it.")


def already_recorded(prev: dict | None, force: bool, verdict: Callable[[], tuple[str, str] | None]) -> bool:
    """Whether a rerun leaves a cell as its latest record `prev` has it: ok, or unsupported here for the
    same reason as last time (`verdict()`: a new line would say nothing new)."""
    if force or prev is None or prev.get("status") not in ("ok", "unsupported"):
        return False
    return prev["status"] == "ok" or ((now := verdict()) is not None and prev.get("reason") == now[1])


def select_cells(suite: Suite, filters: list[str]) -> list[SuiteCell]:
    if not filters:
        return list(suite.cells)
    return [c for c in suite.cells if any(f in c.cell_name or f == c.cell_id for f in filters)]


def run_order(cells: list[SuiteCell]) -> list[SuiteCell]:
    """Suite order, except that within a series smaller batches go first (so an OOM can skip the rest)."""
    first: dict[str, int] = {}
    for i, cell in enumerate(cells):
        first.setdefault(cell.series_key, i)
    return sorted(cells, key=lambda c: (first[c.series_key], c.config["batch_size"]))


# ---------------------------------------------------------------------------------------------


def now_iso(unix: float | None = None) -> str:
    """Now (or the time `unix`) as a record writes it: UTC to the second, e.g. 2026-01-31T12:00:00Z."""
    when = dt.datetime.fromtimestamp(time.time() if unix is None else unix, dt.timezone.utc)
    return when.isoformat(timespec="seconds").replace("+00:00", "Z")


def new_run_id() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(3)


def run_suite(
    suite: Suite, options: RunOptions, echo: Callable[[str], None] | None = None
) -> list[dict[str, Any]]:
    """Run (or resume) the suite; return the latest record of every selected cell, in suite order."""
    check_options(options)
    out = Path(options.out)
    check_out_dir(out, create=True)
    rdzv = options.rendezvous or {}
    hint = (
        "In a multi-node run every node needs its own --out, e.g. runs/NAME_node$NODE_RANK "
        "(docs/distributed.md)."
        if rdzv.get("nnodes", 1) > 1
        else ""
    )
    with OutputLock(out, hint=hint):  # one run per folder, or two runs would each run every cell
        return _run_locked(suite, options, out, echo or print_line)


def _run_locked(suite: Suite, options: RunOptions, out: Path, say: Callable[[str], None]) -> list[dict]:
    from ditbench.environment import collect_env
    from ditbench.progress import progress

    ensure_dir(out / LOGS_DIR, "--out's logs folder", probe=False)
    results_path = out / RESULTS_FILE
    run_id = new_run_id()
    adopted = inflight.adopt(
        results_path, inflight.inflight_dir(out), run_id, finish=inflight.scaling_finish(results_path)
    )
    for record in adopted:
        say(f"adopted the finished result of a killed run: {format_line(record)}")
    cells = select_cells(suite, options.cell_filters)
    k = options.repeats or suite.repeats
    written = read_records(results_path)
    previous = latest_by_repeat(written)
    visible = Visible.detect()
    env = collect_env(probe_cuda=False)  # no CUDA context in the parent: it would hold device memory

    done = {
        (c.cell_id, r)
        for c in cells
        for r in range(1, k + 1)
        if already_recorded(previous.get((c.cell_id, r)), options.force, lambda c=c: precheck(c, visible))
    }
    order = run_order(cells)
    planner = None
    if suite.plan is not None:  # imported only then: a suite without it never loads the planner
        from ditbench.bench import plan_option

        planner = plan_option.SuitePlanner(suite, suite.plan, env)
        order = plan_option.run_order(order, cells)
    # round-robin: every cell's repeat 1, then every cell's repeat 2, ...
    todo = [(c, r) for r in range(1, k + 1) for c in order if (c.cell_id, r) not in done]
    latest = {cid: previous[(cid, r)] for cid, r in sorted(done, key=lambda key: key[1])}
    # a line per cell prints anyway: a log that is not a terminal gets no bar lines on top
    bar = progress(total=len(todo), unit="cell", disable=not options.progress, plain=False)
    if done:
        n_ok = sum(previous[key]["status"] == "ok" for key in done)
        what = "cells" if k == 1 else "cell repeats"
        say(
            f"resuming {out}: {n_ok} of {len(cells) * k} {what} already ok"
            + (f", {len(done) - n_ok} unsupported here" if len(done) > n_ok else "")
            + f", {len(todo)} to run"
        )
    from ditbench.bench.suite_progress import SuiteProgress
    from ditbench.progress import is_terminal

    watch = SuiteProgress(
        [c for c, _ in todo],
        lambda c: precheck(c, visible, options.rendezvous) is None,
        heartbeat=options.progress and not is_terminal(),  # a terminal has the bar
    )
    try:
        with sigterm_as_interrupt():
            run = SuiteRun(suite, options, run_id, env, visible, out, latest, planner, k)
            for i, (cell, repeat) in enumerate(todo, 1):
                bar.set_postfix_str(cell.cell_name)
                watch.start(i, cell)
                record = None
                try:
                    record = run.cell(cell, repeat)
                finally:  # the heartbeat stops with the cell, Ctrl-C included
                    watch.end(record["status"] if record else "interrupted")
                which = f" repeat {repeat}/{k}" if k > 1 else ""
                say(f"[{i}/{len(todo)}]{which} {format_line(record)}")
                bar.update(1)
    finally:
        bar.close()
    # one record per cell: its repeats combined (bench.repeats), from the file's records and this run's
    by_cell = combined(written + run.appended)
    records = [by_cell[c.cell_id] for c in cells if c.cell_id in by_cell]
    write_summary(out / SUMMARY_FILE, suite, records)
    return records


def print_line(line: str) -> None:
    from tqdm import tqdm

    tqdm.write(line, file=sys.stdout)  # above the bar, which lives on stderr
    sys.stdout.flush()  # a line per cell shows at once in a piped log, not at exit


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM stops the run like Ctrl-C (so the running cell is killed too), in the main thread."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _interrupt(_signum, _frame):
    raise KeyboardInterrupt


class SuiteRun:
    """The cells of one run: each through its ticket (start, result file, one append); the OOM skip;
    the planner's skip and its prediction in each record. The local runner runs cells through it
    (`cell`); the submitter (`bench.jobs`) decides, finishes and notes the cells its jobs run."""

    def __init__(
        self,
        suite,
        options,
        run_id,
        env,
        visible,
        out: Path,
        latest: dict[str, dict],
        planner=None,
        repeats: int = 1,
    ):
        self.suite, self.options, self.run_id, self.env, self.visible = suite, options, run_id, env, visible
        self.out, self.latest, self.planner, self.repeats = out, latest, planner, repeats
        self.appended: list[dict[str, Any]] = []  # the records this run wrote, in order
        self.failed_repeat: dict[str, dict[str, Any]] = {}  # cell_id -> its first failed repeat's record
        self.results_path = out / RESULTS_FILE
        self.folder = inflight.inflight_dir(out)
        # series -> (the smallest batch that ran out of memory, its cell's name)
        self.oom_at: dict[str, tuple[int, str]] = {}

    def record_context(
        self, cell: SuiteCell, env: dict | None, started_at: str, repeat: int = 1
    ) -> dict[str, Any]:
        """inflight.record_context of this run's cell (and, with repeats, which repeat of how many)."""
        return inflight.record_context(
            self.suite, self.run_id, cell, started_at, env=env, label=self.options.label, repeat=repeat,
            repeats=self.repeats,
        )  # fmt: skip

    def cell(self, cell: SuiteCell, repeat: int = 1) -> dict[str, Any]:
        """Run one cell (or decide it need not start) and append its record; returns the record as written."""
        verdict = precheck(cell, self.visible, self.options.rendezvous)
        # Before the clock starts: the first cell of a series waits for its series' trace.
        skip = self.skip_reason(cell) if verdict is None else None
        if skip is None and verdict is None and (failed := self.failed_repeat.get(cell.cell_id)):
            skip = (
                f"repeat {failed['repeat']} of this cell ended {failed['status']}; its other repeats "
                "are not run"
            )
        started_at, t0 = now_iso(), time.monotonic()
        context = self.record_context(cell, self.env, started_at, repeat)
        ticket = inflight.open_ticket(self.folder, context)
        try:
            decided = self.decide(cell, verdict, skip)
            if decided is not None:
                inflight.write_result_file(ticket, decided)
            else:
                name = f"{cell.cell_id}.r{repeat}.log" if self.repeats > 1 else f"{cell.cell_id}.log"
                log = self.out / LOGS_DIR / name
                launcher = launcher_for(cell.spec)  # one process, or torchrun's ranks
                launcher.launch(
                    cell.spec, self.about(cell), self.timeout(cell), ticket.spec_path, ticket.result_path, log
                )
        except BaseException:  # Ctrl-C, SIGTERM
            if not ticket.result_path.exists():
                ticket.remove()  # cut off before a result: the cell runs again next time
            raise  # a finished result stays for the next run to append
        record = inflight.commit(
            self.results_path, ticket, time.monotonic() - t0, lambda record: self.finish(record, cell)
        )
        self.note(cell, record)
        self.appended.append(record)
        return record

    def timeout(self, cell: SuiteCell) -> float:
        return self.options.timeout_s or cell.timeout_s

    def about(self, cell: SuiteCell) -> dict[str, Any]:
        """What a launcher writes into the cell's spec file beside the cell (`launch.base.Launcher`)."""
        return {
            "cell_id": cell.cell_id,
            "cell_name": cell.cell_name,
            "rendezvous": self.options.rendezvous,
            "out_dir": str(self.out.resolve()),  # sample grids go under it
        }

    def note(self, cell: SuiteCell, record: dict[str, Any]) -> None:
        """Remember an appended record: the latest per cell, and the smallest batch that ran out of memory."""
        if record["status"] == "oom":
            known = self.oom_at.get(cell.series_key)
            if known is None or cell.config["batch_size"] < known[0]:
                self.oom_at[cell.series_key] = (cell.config["batch_size"], cell.cell_name)
        self.latest[cell.cell_id] = record
        if self.repeats > 1 and record["status"] not in ("ok", "skipped", "unsupported"):
            self.failed_repeat.setdefault(cell.cell_id, record)

    def decide(self, cell: SuiteCell, verdict, skip: str | None = None) -> dict[str, Any] | None:
        """The result of a cell that must not start (unsupported, predicted or seen not to fit), else None."""
        if verdict is not None:
            return {"status": verdict[0], "reason": verdict[1]}
        if skip is not None:
            return {"status": "skipped", "reason": skip}
        oom = self.oom_at.get(cell.series_key)
        if self.options.oom_skip and oom and cell.config["batch_size"] > oom[0]:
            return {
                "status": "skipped",
                "reason": f"{oom[1]} ran out of memory at batch {oom[0]}; this larger batch of the same "
                "series would too",
            }
        return None

    def skip_reason(self, cell: SuiteCell) -> str | None:
        """Why the planner says not to start the cell (predicted not to fit), else None."""
        return self.planner.skip_reason(cell) if self.planner is not None else None

    def finish(self, record: dict[str, Any], cell: SuiteCell) -> None:
        if self.planner is not None:
            self.planner.annotate(record, cell)
        config = record["config"]
        if config["gpus"] * config["nodes"] > 1:
            from ditbench.bench.launch.aggregate import add_scaling_efficiency

            add_scaling_efficiency(record, list(self.latest.values()))
