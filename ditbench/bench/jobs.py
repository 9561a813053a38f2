"""`ditbench run SUITE --executor slurm|local`: each cell a submitit job, each record appended here.

The same guarantees as the local runner (`bench.runner`), through the same machinery: the out
directory's lock, one ticket per cell (`bench.inflight`: ticket, spec, result file, one append,
then clean-up), resume and `--force`. The tickets of submitted cells live in `<out>/.jobs/`, each
with `<key>.job.json` (the executor and job id, written as soon as sbatch answers) and
`<key>.started.json` (written by the job when it starts); submitit's own files (batch scripts,
logs) are under `<out>/.jobs/submitit/`. On SLURM the out directory must be on a file system the
nodes share.

A run, holding the lock:
1. appends what a killed local run left (`inflight.adopt`), as the local runner does;
2. picks up earlier submissions: a finished job's result is appended; a job still queued or
   running is waited for, never submitted again; a job that ended without a result is recorded
   from its state (SLURM's TIMEOUT is `timeout`); a ticket without a job file is removed;
3. submits the other cells: SLURM all at once, one job array per job shape; the local executor
   one cell at a time (cells sharing one machine would disturb each other's measurements);
4. appends each result as it arrives. Ctrl-C (or SIGTERM) cancels every job it waits for.

What the job runs is `launch.srun.run_task`; its result is the cell's JSON result file (the
submitter never reads submitit's pickles).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ditbench.bench import inflight
from ditbench.bench.cluster import EXECUTORS, ClusterOptions, job_parameters
from ditbench.bench.launch import executors
from ditbench.bench.launch.executors import JobRef
from ditbench.bench.launch.srun import started_path
from ditbench.bench.records import latest_by_cell, read_records
from ditbench.bench.runner import (
    LOGS_DIR,
    RESULTS_FILE,
    SUMMARY_FILE,
    RunOptions,
    SuiteRun,
    Visible,
    already_recorded,
    check_options,
    check_out_dir,
    new_run_id,
    now_iso,
    precheck,
    print_line,
    run_order,
    select_cells,
    sigterm_as_interrupt,
)
from ditbench.bench.summary import format_line, write_summary
from ditbench.errors import UserError, shorten
from ditbench.fileio import read_regular, write_json_atomic
from ditbench.outlock import OutputLock
from ditbench.outpaths import ensure_dir
from ditbench.precision import unsupported_reason
from ditbench.spec.suite import Suite, SuiteCell

JOBS_DIR = ".jobs"
POLL_S = 2.0


def job_path(ticket: inflight.Ticket) -> Path:
    return ticket.folder / f"{ticket.key}.job.json"


def submission_path(ticket: inflight.Ticket) -> Path:
    """`<key>.sbatch.json`: the SLURM job name (and array index) the cell is submitted under, written
    before sbatch runs (`executors.write_submission`)."""
    return ticket.folder / f"{ticket.key}.sbatch.json"


@dataclass
class Pending:
    """A submitted cell this run waits for."""

    ticket: inflight.Ticket
    ref: JobRef
    cell: SuiteCell | None  # None: submitted by an earlier run for a cell this suite no longer has
    handle: Any = None  # submitit's Job, when this run submitted it
    stopped: str | None = None  # why this run cancelled the job while it queued (`stop_queued`)


def submit_suite(
    suite: Suite,
    options: RunOptions,
    kind: str,
    cluster: ClusterOptions | None = None,
    echo: Callable[[str], None] | None = None,
    poll_s: float = POLL_S,
) -> list[dict[str, Any]]:
    """Run (or resume) the suite through submitit; the latest record of each selected cell, in suite order."""
    check_options(options)
    if kind not in EXECUTORS:
        raise UserError(f"--executor {shorten(kind)}: valid executors are {' and '.join(EXECUTORS)}.")
    if options.rendezvous:
        raise UserError(
            "--nnodes/--node-rank/--rdzv-* start torchrun on machines you log into; with --executor the "
            "job's nodes come from SLURM (a cell's `nodes` knob). Drop those flags."
        )
    executors.require_submitit()
    out = Path(options.out)
    check_out_dir(out, create=True)
    with OutputLock(out):
        return _Submitter(
            suite, options, kind, cluster or ClusterOptions(), out, echo or print_line, poll_s
        ).run()


class _Submitter:
    def __init__(self, suite, options, kind, cluster, out: Path, say, poll_s: float):
        self.suite, self.options, self.kind, self.cluster = suite, options, kind, cluster
        self.out, self.say, self.poll_s = out, say, poll_s
        self.results_path = out / RESULTS_FILE
        self.folder = out / JOBS_DIR
        self.run_id = new_run_id()
        self.pending: list[Pending] = []
        self.executor = None

    def run(self) -> list[dict[str, Any]]:
        from ditbench.environment import collect_env

        ensure_dir(self.out / LOGS_DIR, "--out's logs folder", probe=False)
        ensure_dir(self.folder, "--out's jobs folder", probe=False)
        adopted = inflight.adopt(
            self.results_path,
            inflight.inflight_dir(self.out),
            self.run_id,
            finish=inflight.scaling_finish(self.results_path),
        )
        for record in adopted:
            self.say(f"adopted the finished result of a killed run: {format_line(record)}")
        cells = select_cells(self.suite, self.options.cell_filters)
        gpus = max((c.config["gpus"] for c in cells), default=1)
        visible = Visible.detect() if self.kind == "local" else Visible(cuda=True, gpu_count=gpus)
        env = collect_env(probe_cuda=False)
        planner = None
        if self.suite.plan is not None:  # predicted in this process, before submitting (bench.plan_option)
            from ditbench.bench import plan_option

            planner = plan_option.SuitePlanner(self.suite, self.suite.plan, env)
        self.runner = SuiteRun(self.suite, self.options, self.run_id, env, visible, self.out, {}, planner)
        try:
            with sigterm_as_interrupt():
                self._pick_up()
                executors.clear_ended(self.folder / executors.SUBMITIT_DIR, self.say)
                previous = latest_by_cell(read_records(self.results_path))
                waiting = {p.ticket.read_context()["cell_id"] for p in self.pending}
                done = set()
                for cell in cells:
                    prev = previous.get(cell.cell_id)
                    if already_recorded(prev, self.options.force, lambda c=cell: self._verdict(c)):
                        done.add(cell.cell_id)
                        self.runner.latest[cell.cell_id] = prev
                todo = [c for c in run_order(cells) if c.cell_id not in done | waiting]
                if planner is not None:
                    todo = plan_option.run_order(todo, cells)
                if done or waiting:
                    self.say(
                        f"resuming {self.out}: {len(done)} of {len(cells)} cells already recorded, "
                        + (f"{len(waiting)} submitted earlier and waited for, " if waiting else "")
                        + f"{len(todo)} to submit"
                    )
                if self.kind == "slurm":
                    self._start(todo)
                    todo = []
                self._wait(todo)
        except BaseException:
            self._cancel()
            raise
        executors.clear_ended(self.folder / executors.SUBMITIT_DIR, self.say, last=True)
        latest = self.runner.latest
        records = [latest[c.cell_id] for c in cells if c.cell_id in latest]
        write_summary(self.out / SUMMARY_FILE, self.suite, records)
        return records

    # -- before submitting -------------------------------------------------------------------

    def _verdict(self, cell: SuiteCell) -> tuple[str, str] | None:
        return cell_verdict(cell, self.kind, self.runner.visible)

    def _pick_up(self) -> None:
        """The tickets earlier runs left in .jobs: append, wait for, or remove each."""
        by_id = {c.cell_id: c for c in self.suite.cells}
        appended = inflight.appended_keys(self.results_path)
        _sweep_orphans(self.folder)
        for path in sorted(self.folder.glob("*.ticket.json")):
            ticket = inflight.Ticket(self.folder, path.name[: -len(".ticket.json")])
            try:
                context = ticket.read_context()
                key = (context["run_id"], context["cell_id"])
            except (OSError, ValueError, KeyError, TypeError, RecursionError):
                ticket.remove()
                continue
            ref = JobRef.load(job_path(ticket))
            if ref is None and key not in appended:  # killed between sbatch's answer and the job file?
                ref = executors.find_submitted(
                    submission_path(ticket), str(self.folder / executors.SUBMITIT_DIR)
                )
                if ref is not None:
                    ref.save(job_path(ticket))
                    self.say(f"found job {ref.job_id} ({context.get('cell_name')}) by its name in SLURM")
            if key in appended or ref is None:  # appended already, or never (known to be) submitted
                ticket.remove()
                continue
            pending = Pending(ticket, ref, by_id.get(context["cell_id"]))
            if ticket.result_path.exists() or not executors.is_active(ref):
                self._finish(pending)
            else:
                self.say(
                    f"waiting for job {ref.job_id} ({context.get('cell_name')}), submitted by an earlier run"
                )
                self.pending.append(pending)

    # -- submitting --------------------------------------------------------------------------

    def _start(self, cells: list[SuiteCell]) -> None:
        """Open each cell's ticket; record the cells that must not start, submit the others."""
        groups: dict[str, tuple[dict, list[SuiteCell]]] = {}  # job shape -> its parameters, its cells
        for cell in cells:
            verdict = self._verdict(cell)
            # a cell predicted not to fit is recorded `skipped`, never submitted
            decided = self.runner.decide(
                cell, verdict, self.runner.skip_reason(cell) if verdict is None else None
            )
            if decided is not None:
                ticket = inflight.open_ticket(self.folder, self._context(cell))
                inflight.write_result_file(ticket, decided)
                self._finish(Pending(ticket, JobRef(self.kind, "", ""), cell), submitted=False)
                continue
            params = job_parameters(cell.config, self.runner.timeout(cell), self.cluster, self.kind)
            groups.setdefault(json.dumps(params, sort_keys=True, default=str), (params, []))[1].append(cell)
        if groups and self.executor is None:
            self.executor = executors.make_executor(self.kind, self.folder / executors.SUBMITIT_DIR)
        for params, members in groups.values():  # tickets per group: a refused group leaves none behind
            self._submit(params, [(c, inflight.open_ticket(self.folder, self._context(c))) for c in members])

    def _context(self, cell: SuiteCell) -> dict[str, Any]:
        # a cell reports its node's environment; a record without one must not claim the login node's
        env = self.runner.env if self.kind == "local" else None
        return self.runner.record_context(cell, env, now_iso())

    def _submit(self, params: dict, members: list[tuple[SuiteCell, inflight.Ticket]]) -> None:
        from ditbench.bench.launch.files import write_spec

        calls = []
        for cell, ticket in members:  # the job reads its cell from the spec file (`srun.run_task`)
            timeout = self.runner.timeout(cell)
            write_spec(ticket.spec_path, cell.spec, **self.runner.about(cell), timeout_s=timeout)
            log = self.out / LOGS_DIR / f"{cell.cell_id}.log"
            calls.append((str(ticket.spec_path), str(ticket.result_path), str(log), timeout))
        if self.kind == "slurm":  # a rerun finds the job by this name if we die before saving its id
            name = executors.job_name([ticket.key for _, ticket in members])
            for index, (_, ticket) in enumerate(members):
                executors.write_submission(submission_path(ticket), name, index if len(members) > 1 else None)
            params = {**params, "job_name": name}
        try:
            submitted = executors.submit_cells(self.executor, self.kind, params, calls)
        except Exception as err:  # sbatch refused (a partition or account the cluster does not know)
            for _, ticket in members:
                ticket.remove()
            if isinstance(err, UserError):
                raise
            raise UserError(
                f"submitting {len(members)} cell(s) failed: {' '.join(str(err).split())[:2000]}"
            ) from None
        for (cell, ticket), (handle, ref) in zip(members, submitted, strict=True):
            ref.save(job_path(ticket))
            self.pending.append(Pending(ticket, ref, cell, handle))
        ids = ", ".join(ref.job_id for _, ref in submitted)
        self.say(f"submitted {len(members)} cell(s) to {self.kind}: job(s) {ids}")

    # -- waiting -----------------------------------------------------------------------------

    def _wait(self, todo: list[SuiteCell]) -> None:
        """Append each result as it arrives; the local executor starts the next cell when one ends."""
        from ditbench.bench.suite_progress import JobWatch
        from ditbench.progress import is_terminal

        todo = list(todo)
        total = len(self.runner.latest) + len(todo) + len(self.pending)
        watch = JobWatch(total, heartbeat=self.options.progress and not is_terminal())
        while self.pending or todo:
            watch.poll([_watched(p) for p in self.pending], len(self.runner.latest))
            for pending in list(self.pending):  # a SLURM cell's result counts before its job has ended
                arrived = self.kind == "slurm" and pending.ticket.result_path.exists()
                if arrived or not executors.is_active(pending.ref, pending.handle):
                    self._finish(pending)
            executors.clear_ended(self.folder / executors.SUBMITIT_DIR, self.say)
            if self.kind == "local" and not self.pending and todo:
                self._start([todo.pop(0)])
                continue
            if self.pending:
                time.sleep(self.poll_s)

    def _finish(self, pending: Pending, submitted: bool = True) -> None:
        """Append the cell's record (from its result file, or from how its job ended), then clean up."""
        ticket, ref = pending.ticket, pending.ref
        if pending in self.pending:
            self.pending.remove(pending)
        wrote_result = ticket.result_path.exists()
        if submitted and not wrote_result:
            inflight.write_result_file(ticket, ended_result(pending))
        context, started = ticket.read_context(), _started(ticket)
        try:
            ended = ticket.result_path.stat().st_mtime
        except OSError:
            ended = time.time()
        begin = started.get("started_unix")
        if isinstance(begin, (int, float)) and not isinstance(begin, bool):
            context["started_at"] = now_iso(
                begin
            )  # the record starts when the job did, not when it was queued
            write_json_atomic(ticket.ticket_path, context, default=str)
        else:
            begin = ended  # it never started
        committing_run = self.run_id
        nodes = started.get("hostnames")  # as the job's task 0 saw them
        nodes = nodes if isinstance(nodes, list) and all(isinstance(n, str) for n in nodes) else None
        slurm_job = {"id": ref.job_id, "nodes": nodes} if ref.executor == "slurm" and ref.job_id else None

        def finish(record: dict[str, Any]) -> None:
            if record["run_id"] != committing_run:
                record["adopted_by"] = committing_run  # as the local runner marks a killed run's result
            if slurm_job is not None:
                record["slurm_job"] = slurm_job
            if pending.cell is not None:
                self.runner.finish(record, pending.cell)
            else:
                inflight.scaling_finish(self.results_path)(record)

        record = inflight.commit(self.results_path, ticket, max(0.0, ended - begin), finish)
        if pending.cell is not None:
            self.runner.note(pending.cell, record)
        if record["status"] == "oom" and self.kind == "slurm":
            self._stop_queued()
        if ref.job_id:  # a job that wrote its result may still be ending: its folder waits for that
            executors.retire(ref, self.folder / executors.SUBMITIT_DIR, may_run=wrote_result)
        self.say(format_line(record))

    def _stop_queued(self) -> None:
        """After an out-of-memory, the larger batches of its series that still queue are cancelled (and
        recorded `skipped` once SLURM says they ended); a job already running runs on to its own record."""
        for pending, reason in stop_queued(self.pending, self.runner.decide):
            if executors.cancel_if_queued(pending.ref):
                pending.stopped = reason
                self.say(f"cancelled queued job {pending.ref.job_id} ({pending.cell.cell_name}): {reason}")

    def _cancel(self) -> None:
        """Ctrl-C, SIGTERM or an error: cancel every job this run waits for; a finished result stays."""
        for pending in list(self.pending):
            executors.cancel(pending.ref, pending.handle)
            if not pending.ticket.result_path.exists():
                pending.ticket.remove()  # cut off before a result: the cell is submitted again next time
        if self.pending:
            self.say(f"cancelled {len(self.pending)} job(s): {', '.join(p.ref.job_id for p in self.pending)}")
        self.pending.clear()


def cell_verdict(cell: SuiteCell, kind: str, visible: Visible) -> tuple[str, str] | None:
    """(status, reason) for a cell that must not be submitted, else None."""
    config = cell.config
    if kind == "slurm":  # the job's nodes have what it asks for; only the precision can be refused here
        reason = unsupported_reason(config["precision"], config["device"])
        return ("unsupported", reason) if reason else None
    if config["nodes"] > 1:
        return "unsupported", (
            f"nodes={config['nodes']}: submitit's local executor runs on this one machine; "
            "use --executor slurm"
        )
    return precheck(cell, visible)


def ended_result(pending: Pending) -> dict[str, Any]:
    """The result of a cell whose job ended without writing one: from SLURM's state, or `skipped` when
    this run cancelled it before it started (`stop_queued`)."""
    from ditbench.bench.launch import procs

    ref = pending.ref
    # task 0 writes its started file first thing: a cancelled job without one never ran the cell
    if pending.stopped and not started_path(pending.ticket.result_path).exists():
        why = f"{pending.stopped}; ditbench cancelled its queued SLURM job {ref.job_id}"
        return {"status": "skipped", "reason": why}
    state = executors.state(ref, pending.handle)
    tail = procs.tail(executors.job_log(ref), 64_000)
    if state.startswith("TIMEOUT"):
        return {
            "status": "timeout",
            "reason": f"SLURM stopped job {ref.job_id} at its time limit before the cell wrote a result",
            "traceback": tail,
        }
    where = "SLURM job" if ref.executor == "slurm" else "local job"
    why = f": ditbench cancelled it as it started, because {pending.stopped}" if pending.stopped else ""
    return {
        "status": "error",
        "reason": f"{where} {ref.job_id} ended ({state}) without writing a result{why}",
        "traceback": tail,
    }


def stop_queued(pending: list[Pending], decide) -> list[tuple[Pending, str]]:
    """The waited-for cells the run's out-of-memory skip now rules out (`SuiteRun.decide`) and whose
    job has not started (no `<key>.started.json`): each with the skip's reason."""
    out = []
    for waiting in pending:
        if waiting.cell is None or waiting.stopped or started_path(waiting.ticket.result_path).exists():
            continue
        decided = decide(waiting.cell, None)
        if decided is not None and decided["status"] == "skipped":
            out.append((waiting, decided["reason"]))
    return out


def _watched(p: Pending) -> tuple[str, str, str | None, dict | None]:
    """(key, cell name, job id, what its start wrote or None) of a job the submitter waits for."""
    return (
        p.ticket.key,
        p.cell.cell_name if p.cell else p.ticket.key,
        p.ref.job_id,
        _started(p.ticket) or None,
    )


def _started(ticket: inflight.Ticket) -> dict[str, Any]:
    """What the job's task 0 wrote when it started (`srun.run_task`): {} before that."""
    try:
        found = json.loads(read_regular(started_path(ticket.result_path)))
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def _sweep_orphans(folder: Path) -> None:
    """Remove the files no ticket owns (a cancelled job's late result, an atomic write cut short)."""
    keys = {p.name[: -len(".ticket.json")] for p in folder.glob("*.ticket.json")}
    for path in folder.iterdir():
        if path.name == executors.SUBMITIT_DIR:
            continue
        if not any(path.name.startswith(f"{key}.") or path.name.startswith(f".{key}.") for key in keys):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
