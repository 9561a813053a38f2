"""The suite loop: every cell of a suite through one executor (`launch.base.Executor`: a fresh process
per cell here, or a submitit job with `--executor local|slurm`, `bench.jobs`), one record per cell
repeat appended to results.jsonl through its ticket (`bench.inflight`), the folder's lock held throughout.
Resume, round-robin repeats and the OOM and planner skips are as docs/measurement.md describes them.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ditbench.bench import inflight, plan_option
from ditbench.bench.cell import threads
from ditbench.bench.launch import procs
from ditbench.bench.launch.base import Executor, Pending
from ditbench.bench.launch.base import for_cell as launcher_for
from ditbench.bench.launch.srun import read_started
from ditbench.bench.launch.torchrun import Rendezvous, node_verdict
from ditbench.bench.repeats import combined, latest_by_repeat, repeat_of
from ditbench.bench.runopts import (
    JOBS_DIR,
    LOGS_DIR,
    RESULTS_FILE,
    SUMMARY_FILE,
    RunOptions,
    already_recorded,
    check_options,
    check_out_dir,
    new_run_id,
    now_iso,
    run_order,
    select_cells,
)
from ditbench.bench.suite_progress import JobWatch, SuiteProgress, stderr_line
from ditbench.bench.summary import Notes, format_line, notes_of, write_summary
from ditbench.core.progress import is_terminal, progress
from ditbench.files.fileio import mkdir_real
from ditbench.files.outlock import OutputLock
from ditbench.files.outpaths import ensure_dir
from ditbench.hardware.device import cuda_visible, device_type
from ditbench.hardware.environment import collect_env
from ditbench.hardware.precision import unsupported_reason
from ditbench.records.jsonl import read_records
from ditbench.spec.suite import Suite, SuiteCell


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
        return node_verdict(config, Rendezvous(**(rendezvous or {})))
    return None


@dataclass(frozen=True)
class Processes:
    """The executor of `ditbench run`: each cell a fresh process here, one at a time. `python` and `env`
    are what every cell runs in: `ditbench ab` runs each side's cells in that side's interpreter."""

    python: str = sys.executable
    env: tuple[tuple[str, str], ...] = ()  # over `launch.process.child_env()`
    waits, remote, poll_s = True, False, 0.0

    def verdict(self, cell, visible, rendezvous: dict | None = None) -> tuple[str, str] | None:
        return precheck(cell, visible, rendezvous)

    def start(self, out: Path, say) -> list[Pending]:
        return []  # a killed run's cells died with it; `inflight.adopt` appends what they finished

    def submit(self, jobs: list[Pending]) -> None:
        for job in jobs:
            launcher = launcher_for(job.cell.spec)  # a module global: tests stand a launcher in
            if self.python != sys.executable or self.env:
                launcher = replace(launcher, python=self.python, env=self.env)
            ticket = job.ticket
            launcher.launch(
                job.cell.spec, job.about, job.timeout_s, ticket.spec_path, ticket.result_path, job.log
            )

    def poll(self, jobs: list[Pending]) -> list[Pending]:
        return list(jobs)  # `submit` waited for them

    def cancel(self, jobs: list[Pending], decide=None) -> None:
        pass  # nothing outlives `submit`: an interrupted launch kills its cell

    def collect(self, job: Pending) -> dict[str, Any]:
        return {}


def run_suite(
    suite: Suite,
    options: RunOptions,
    echo: Callable[[str], None] | None = None,
    executor: Executor | None = None,
    notes: Notes | None = None,
    before: Callable[[list[SuiteCell]], None] | None = None,
) -> list[dict[str, Any]]:
    """Run (or resume) the suite; return the latest record of every selected cell, in suite order.
    `before` is called with the cell repeats still to run, after the output folder is checked."""
    check_options(options)
    executor = executor or Processes()
    out = Path(options.out)
    check_out_dir(out, create=True)
    hint = "In a multi-node run every node needs its own --out, e.g. runs/NAME_node$NODE_RANK "
    hint = hint + "(docs/distributed.md)." if (options.rendezvous or {}).get("nnodes", 1) > 1 else ""
    with OutputLock(out, hint=hint):  # one run per folder, or two runs would each run every cell
        return _run_locked(suite, options, out, echo or stderr_line, executor, notes or Notes(), before)


def _run_locked(
    suite, options: RunOptions, out: Path, say, executor: Executor, notes: Notes, before
) -> list[dict]:
    ensure_dir(out / LOGS_DIR, "--out's logs folder", probe=False)
    run_id = new_run_id()
    results_path = out / RESULTS_FILE
    finish = inflight.scaling_finish(results_path)
    for record in inflight.adopt(results_path, inflight.inflight_dir(out), run_id, finish=finish):
        say(f"adopted the finished result of a killed run: {format_line(record, notes)}")
    env = collect_env(probe_cuda=False)  # no CUDA context in the parent: it would hold device memory
    planner = plan_option.SuitePlanner(suite, suite.plan, env) if suite.plan is not None else None
    k = options.repeats or suite.repeats
    run = SuiteRun(suite, options, run_id, env, Visible.detect(), out, {}, planner, k, executor, notes)
    run.before = before
    try:
        with procs.sigterm_as_interrupt():
            run.run(select_cells(suite, options.cell_filters), say)
    except BaseException:  # Ctrl-C, SIGTERM, a refused submission
        run.cancel()
        raise
    executor.poll([])  # the run's end
    # one record per cell: its repeats combined (bench.repeats), from the file's records and this run's
    by_cell = combined(read_records(results_path))
    records = [by_cell[c.cell_id] for c in select_cells(suite, options.cell_filters) if c.cell_id in by_cell]
    write_summary(out / SUMMARY_FILE, suite, records)
    return records


NO_FAILURE = ("ok", "skipped", "unsupported")  # statuses that rule no other cell out


class SuiteRun:
    """One run of a suite through its executor: the order, each cell's ticket, and the skips."""

    def __init__(self, suite, options, run_id, env, visible, out: Path, latest: dict[str, dict],
                 planner=None, repeats: int = 1, executor: Executor | None = None, notes=None):  # fmt: skip
        self.suite, self.options, self.run_id, self.env, self.visible = suite, options, run_id, env, visible
        self.out, self.latest, self.planner, self.repeats = out, latest, planner, repeats
        self.executor, self.notes = executor or Processes(), notes or Notes()
        self.before: Callable[[list[SuiteCell]], None] | None = None  # run_suite's `before`
        self.failed_repeat: dict[str, dict[str, Any]] = {}  # cell_id -> its first failed repeat's record
        self.results_path = out / RESULTS_FILE
        self.folder = inflight.inflight_dir(out) if self.executor.waits else out / JOBS_DIR
        # series -> (the smallest batch that ran out of memory, its cell's name)
        self.oom_at: dict[str, tuple[int, str]] = {}
        self.pending: list[Pending] = []  # the cells the executor runs or queues
        self.recorded = 0  # the records this run appended, for the `[i/N]` lines

    def verdict(self, cell: SuiteCell) -> tuple[str, str] | None:
        return self.executor.verdict(cell, self.visible, self.options.rendezvous)

    def run(self, cells: list[SuiteCell], say: Callable[[str], None]) -> None:
        """Pick up what earlier runs left, then run every cell repeat not yet recorded ok."""
        self.say, k = say, self.repeats
        self._pick_up()
        previous = latest_by_repeat(read_records(self.results_path))
        done = {
            (c.cell_id, r)
            for c in cells
            for r in range(1, k + 1)
            if already_recorded(previous.get((c.cell_id, r)), self.options.force, lambda c=c: self.verdict(c))
        }
        waiting = {(c["cell_id"], repeat_of(c)) for c in (job.ticket.read_context() for job in self.pending)}
        order = run_order(cells)
        if self.planner is not None:
            order = plan_option.run_order(order, cells)
        # round-robin: every cell's repeat 1, then every cell's repeat 2, ...
        todo = [(c, r) for r in range(1, k + 1) for c in order if (c.cell_id, r) not in done | waiting]
        unrunnable = [(c, r) for c, r in todo if self.verdict(c) is not None]  # recorded first, in one line
        cannot = {(c.cell_id, r) for c, r in unrunnable}
        todo = [(c, r) for c, r in todo if (c.cell_id, r) not in cannot]
        if self.before is not None:
            self.before([c for c, _ in todo])  # the estimate, said first (it may refuse)
        for cid, r in sorted(done, key=lambda key: key[1]):
            self.latest[cid] = previous[(cid, r)]
        if done or waiting:
            n_ok = sum(previous[key]["status"] == "ok" for key in done)
            say(
                f"resuming {self.out}: {n_ok} of {len(cells) * k} {'cells' if k == 1 else 'cell repeats'} "
                "already ok"
                + (f", {len(done) - n_ok} unsupported here" if len(done) > n_ok else "")
                + (f", {len(waiting)} submitted earlier and waited for" if waiting else "")
                + f", {len(todo)} to {'run' if self.executor.waits else 'submit'}"
            )
        if unrunnable:
            self._record_unrunnable(unrunnable, cells)
        self.total, self.done = len(todo) + len(self.pending), len(done)
        self.watch = self._watch([c for c, _ in todo])
        # a line per cell prints anyway: a log that is not a terminal gets no bar lines on top
        self.bar = progress(total=self.total, unit="cell", disable=not self.options.progress, plain=False)
        try:
            self._loop(todo)
        except BaseException:
            self.watch.end("interrupted")  # the heartbeat stops with the cell
            raise
        finally:
            self.bar.close()

    def _record_unrunnable(self, unrunnable: list[tuple[SuiteCell, int]], cells: list[SuiteCell]) -> None:
        """Record the cells this machine cannot run (unsupported here, another node's): a line each with
        --verbose, else one line with each reason once and the cells it applies to."""
        records = []
        for cell, repeat in unrunnable:
            job = self.open(cell, repeat, ran=False)
            inflight.write_result_file(job.ticket, self.decide(cell, self.verdict(cell)))
            records.append(self.finish(job, submitted=False))
        if self.options.verbose:
            for record in records:
                self.say(format_line(record))
            return
        texts = list(dict.fromkeys(text for r in records for text in notes_of(r)))
        for record in records:
            self.notes.refs(record)
        said = "; ".join(self.notes.lines([(c.cell_name, c.config) for c in cells], texts))
        n = len({c.cell_id for c, _ in unrunnable})
        self.say(f"{n} of {len(cells)} cells cannot run here and are recorded without running: {said}")

    def _pick_up(self) -> None:
        """The jobs earlier (killed) runs submitted: each appended if it ended, else waited for."""
        mkdir_real(self.folder, "--out")
        by_id = {c.cell_id: c for c in self.suite.cells}
        for job in self.executor.start(self.out, self.say):
            context = job.ticket.read_context()
            job.cell = by_id.get(context["cell_id"])
            if job.ticket.result_path.exists() or job in self.executor.poll([job]):
                self.say(format_line(self.finish(job), self.notes))
            else:
                name = context.get("cell_name")
                self.say(f"waiting for job {job.ref.job_id} ({name}), submitted by an earlier run")
                self.pending.append(job)

    def _watch(self, cells: list[SuiteCell]):
        heartbeat = self.options.progress and not is_terminal()  # a terminal has the bar
        if self.executor.waits:
            return SuiteProgress(cells, heartbeat, starts=self.options.verbose)
        return JobWatch(self.done + self.total, heartbeat, starts=self.options.verbose)

    def _loop(self, todo: list[tuple[SuiteCell, int]]) -> None:
        """Hand the executor the cells (all at once to a remote one, else one at a time), record each
        cell that must not start at once, and each result as it arrives."""
        taken = 0
        while todo or self.pending:
            batch: list[Pending] = []
            while todo and (self.executor.remote or not (self.pending or batch)):
                cell, repeat = todo.pop(0)
                taken += 1
                self.bar.set_postfix_str(cell.cell_name)
                self.watch.start(taken, cell)
                # before the clock starts: the first cell of a series waits for its series' trace
                decided = self.decide(cell, self.verdict(cell))
                job = self.open(cell, repeat, ran=decided is None)
                if decided is None:
                    batch.append(job)
                else:
                    inflight.write_result_file(job.ticket, decided)
                    self.recorded_line(self.finish(job, submitted=False))
            if batch:
                self.pending += batch  # first: Ctrl-C in `submit` finds them
                self.executor.submit(batch)
            if self.pending:
                self.watch.poll([_watched(job) for job in self.pending], self.done + self.recorded)
                for job in self.executor.poll(list(self.pending)):
                    self.recorded_line(self.finish(job))
            if self.pending:
                time.sleep(self.executor.poll_s)

    def recorded_line(self, record: dict[str, Any]) -> None:
        self.recorded += 1
        self.watch.end(record["status"])
        which = f" repeat {record['repeat']}/{self.repeats}" if self.repeats > 1 else ""
        line = format_line(record, None if self.options.verbose else self.notes)
        self.say(f"[{self.recorded}/{self.total}]{which} {line}")
        self.bar.update(1)

    def open(self, cell: SuiteCell, repeat: int, ran: bool = True) -> Pending:
        """The cell's ticket as a job for the executor. Its env is this machine's; none for a cell that
        does not run, or runs on a remote node (which reports its own)."""
        env = None
        if ran and not self.executor.remote:
            pinned = threads.pinned(
                cell.config["threads"], device_type(cell.config["device"], self.visible.cuda)
            )
            env = {**self.env, "torch_threads": pinned or self.env.get("torch_threads")}
        context = inflight.record_context(
            self.suite, self.run_id, cell, now_iso(), env=env, label=self.options.label, repeat=repeat,
            repeats=self.repeats,
        )  # fmt: skip
        about = {
            "cell_id": cell.cell_id,
            "cell_name": cell.cell_name,
            "rendezvous": self.options.rendezvous,
            "out_dir": str(self.out.resolve()),  # sample grids go under it
        }
        name = f"{cell.cell_id}.r{repeat}" if self.repeats > 1 else cell.cell_id
        log = self.out / LOGS_DIR / f"{name}.log"
        timeout_s = self.options.timeout_s or cell.timeout_s
        return Pending(
            inflight.open_ticket(self.folder, context), None, cell, about=about, timeout_s=timeout_s, log=log
        )

    def finish(self, job: Pending, submitted: bool = True) -> dict[str, Any]:
        """Append the job's record (from its result file, or from how its job ended), then clean up."""
        if job in self.pending:
            self.pending.remove(job)
        extra = self.executor.collect(job) if submitted else {}
        context = job.ticket.read_context()
        try:
            ended = job.ticket.result_path.stat().st_mtime
        except OSError:
            ended = time.time()
        duration = extra.pop("duration_s", ended - context.get("started_unix", ended))

        def complete(record: dict[str, Any]) -> None:
            record.update(extra)
            if record["run_id"] != self.run_id:
                record["adopted_by"] = self.run_id  # measured by a killed run, appended by this one
            if self.planner is not None and job.cell is not None:
                self.planner.annotate(record, job.cell)
            inflight.scaling_finish(self.results_path)(record)

        record = inflight.commit(self.results_path, job.ticket, max(0.0, duration), complete)
        if job.cell is not None:
            self.note(job.cell, record)
        if record["status"] not in NO_FAILURE and self.pending:  # it may rule out queued jobs (`decide`)
            self.executor.cancel(self.pending, self.decide)
        return record

    def cancel(self) -> None:
        """Ctrl-C, SIGTERM or an error: cancel every job; a finished result stays for the next run."""
        self.executor.cancel(self.pending)
        for job in self.pending:
            if not job.ticket.result_path.exists():
                job.ticket.remove()  # cut off before a result: the cell runs again next time
        self.pending.clear()

    def note(self, cell: SuiteCell, record: dict[str, Any]) -> None:
        """Remember an appended record: the latest per cell, and the smallest batch that ran out of memory."""
        if record["status"] == "oom":
            known = self.oom_at.get(cell.series_key)
            if known is None or cell.config["batch_size"] < known[0]:
                self.oom_at[cell.series_key] = (cell.config["batch_size"], cell.cell_name)
        self.latest[cell.cell_id] = record
        if self.repeats > 1 and record["status"] not in NO_FAILURE:
            self.failed_repeat.setdefault(cell.cell_id, record)

    def decide(self, cell: SuiteCell, verdict=None) -> dict[str, Any] | None:
        """The result of a cell that must not start now (the executor refuses it, predicted not to fit,
        an earlier repeat failed, a smaller batch ran out of memory), else None."""
        if verdict is not None:
            return {"status": verdict[0], "reason": verdict[1]}
        reason = self.planner.skip_reason(cell) if self.planner is not None else None
        if reason is None and (failed := self.failed_repeat.get(cell.cell_id)):
            reason = f"repeat {failed['repeat']} of this cell ended {failed['status']}; its other repeats "
            reason += "are not run"
        oom = self.oom_at.get(cell.series_key)
        if reason is None and self.options.oom_skip and oom and cell.config["batch_size"] > oom[0]:
            reason = f"{oom[1]} ran out of memory at batch {oom[0]}; this larger batch of the same series "
            reason += "would too"
        return None if reason is None else {"status": "skipped", "reason": reason}


def _watched(job: Pending) -> tuple[str, str, str | None, dict | None]:
    """(key, cell name, job id, what its start wrote or None) of a job the run waits for."""
    name = job.cell.cell_name if job.cell else job.ticket.key
    return (
        job.ticket.key,
        name,
        getattr(job.ref, "job_id", None),
        read_started(job.ticket.result_path) or None,
    )
