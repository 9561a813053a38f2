"""`ditbench run SUITE --executor slurm|local`: the suite loop (`bench.runner`) with each cell a submitit job.

`<out>/.jobs/` holds `<key>.job.json` (the job id, as soon as sbatch answers), `<key>.started.json`
(written as the job starts) and submitit's files, which SLURM's nodes must share. A job that ended
without a result is recorded from its state (TIMEOUT is `timeout`); submitit's pickles are never read.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ditbench.bench import inflight
from ditbench.bench.launch import executors, procs
from ditbench.bench.launch.base import Pending
from ditbench.bench.launch.executors import JobRef
from ditbench.bench.launch.files import write_spec
from ditbench.bench.launch.srun import read_started, started_path
from ditbench.bench.runner import RunOptions, Visible, precheck, run_suite
from ditbench.bench.runopts import JOBS_DIR, RESULTS_FILE, now_iso
from ditbench.core.errors import UserError, shorten
from ditbench.files.fileio import rmtree_real
from ditbench.hardware.precision import unsupported_reason
from ditbench.spec.cluster import TEXT_KEYS, ClusterOptions
from ditbench.spec.suite import Suite, SuiteCell

POLL_S = 2.0
EXECUTORS = ("local", "slurm")  # --executor: submitit's executors
# The job outlives the cell's own timeout by this much, so the cell is stopped (and recorded
# `timeout`) by ditbench inside the job before SLURM kills the job: start-up, imports, the record.
MARGIN_MIN_S = 300.0
MARGIN_FRACTION = 0.1


def job_timeout_min(cell_timeout_s: float) -> int:
    """The job's time limit in whole minutes: the cell's own timeout plus the margin."""
    margin = max(MARGIN_MIN_S, MARGIN_FRACTION * cell_timeout_s)
    return max(1, math.ceil((cell_timeout_s + margin) / 60.0))


def job_parameters(config: dict[str, Any], cell_timeout_s: float, options: ClusterOptions, kind: str) -> dict:
    """submitit's parameters for one cell's job: one task per rank, the cell's GPUs on each of its nodes."""
    gpus, nodes = int(config["gpus"]), int(config["nodes"])
    minutes = job_timeout_min(cell_timeout_s)
    if options.time_limit_min is not None:
        if options.time_limit_min < minutes:
            raise UserError(
                f"cluster time_limit_min {options.time_limit_min} is shorter than a cell's timeout "
                f"({cell_timeout_s:g} s) plus the margin ditbench keeps to record a timeout ({minutes} min "
                f"in all); raise it to at least {minutes}, or lower the suite's timeout_s / --timeout-s."
            )
        minutes = options.time_limit_min
    if kind == "local":  # submitit's LocalExecutor: one machine, its tasks are the ranks
        params: dict[str, Any] = {"timeout_min": minutes, "nodes": nodes, "tasks_per_node": gpus}
        if config["device"] == "cuda":
            params["gpus_per_node"] = gpus
        return params
    # SlurmExecutor's own names (submitit turns them into #SBATCH lines)
    params = {
        "job_name": "ditbench",
        "time": minutes,
        "nodes": nodes,
        "ntasks_per_node": gpus,  # srun starts one task per rank
        "stderr_to_stdout": True,
        "signal_delay_s": 60,
    }
    if config["device"] == "cuda":
        # SLURM's default binding gives every task the job's GPUs on its node (CUDA_VISIBLE_DEVICES)
        # and each rank takes cuda:LOCAL_RANK, as under torchrun. Not --gpu-bind=none: that leaves
        # CUDA_VISIBLE_DEVICES unset, so every GPU of the node (other jobs' too) is visible.
        params["gpus_per_node"] = gpus
    for key in TEXT_KEYS:
        if getattr(options, key) is not None:
            params[key] = getattr(options, key)
    if options.sbatch:
        params["additional_parameters"] = dict(options.sbatch)
    if options.setup:
        params["setup"] = list(options.setup)
    return params


def job_path(ticket: inflight.Ticket) -> Path:
    return ticket.folder / f"{ticket.key}.job.json"


def submission_path(ticket: inflight.Ticket) -> Path:
    """`<key>.sbatch.json`: the SLURM job name (and array index) the cell is submitted under."""
    return ticket.folder / f"{ticket.key}.sbatch.json"


def submit_suite(
    suite: Suite,
    options: RunOptions,
    kind: str,
    cluster: ClusterOptions | None = None,
    echo: Callable[[str], None] | None = None,
    poll_s: float = POLL_S,
    notes=None,
) -> list[dict[str, Any]]:
    """Run (or resume) the suite through submitit; the latest record of each selected cell, in suite order."""
    if kind not in EXECUTORS:
        raise UserError(f"--executor {shorten(kind)}: valid executors are {' and '.join(EXECUTORS)}.")
    if options.rendezvous:
        raise UserError(
            "--nnodes/--node-rank/--rdzv-* start torchrun on machines you log into; with --executor the "
            "job's nodes come from SLURM (a cell's `nodes` knob). Drop those flags."
        )
    executors.require_submitit()
    return run_suite(suite, options, echo, Submitit(kind, cluster or ClusterOptions(), poll_s), notes)


@dataclass
class Submitit:
    """A `launch.base.Executor`: each cell a submitit job, on SLURM (`slurm`) or this machine (`local`)."""

    kind: str
    cluster: ClusterOptions = field(default_factory=ClusterOptions)
    poll_s: float = POLL_S
    waits = False
    executor: Any = None  # submitit's, made at the first submission
    say: Callable[[str], None] = print
    folder: Path = Path(JOBS_DIR)

    @property
    def remote(self) -> bool:
        return self.kind == "slurm"

    @property
    def submitit_dir(self) -> Path:
        return self.folder / executors.SUBMITIT_DIR

    def verdict(self, cell: SuiteCell, visible: Visible, rendezvous=None) -> tuple[str, str] | None:
        return cell_verdict(cell, self.kind, visible)

    def start(self, out: Path, say: Callable[[str], None]) -> list[Pending]:
        """The tickets earlier runs left in .jobs: removed, unless their job may still write a result."""
        self.folder, self.say = out / JOBS_DIR, say
        appended = inflight.appended_keys(out / RESULTS_FILE)
        _sweep_orphans(self.folder)
        found = []
        for ticket, context in inflight.tickets(self.folder):
            try:
                key = (context["run_id"], context["cell_id"], inflight.repeat_of(context))
            except (KeyError, TypeError):
                ticket.remove()
                continue
            ref = JobRef.load(job_path(ticket))
            if ref is None and key not in appended:  # killed between sbatch's answer and the job file?
                ref = executors.find_submitted(submission_path(ticket), str(self.submitit_dir))
                if ref is not None:
                    ref.save(job_path(ticket))
                    say(f"found job {ref.job_id} ({context.get('cell_name')}) by its name in SLURM")
            if key in appended or ref is None:  # appended already, or never (known to be) submitted
                ticket.remove()
            else:
                found.append(Pending(ticket, ref))
        executors.clear_ended(self.submitit_dir, say)
        return found

    def submit(self, jobs: list[Pending]) -> None:
        """One submission per job shape (a job array on SLURM); a refused one leaves no ticket behind."""
        groups: dict[str, tuple[dict, list[Pending]]] = {}
        for job in jobs:
            params = job_parameters(job.cell.config, job.timeout_s, self.cluster, self.kind)
            groups.setdefault(json.dumps(params, sort_keys=True, default=str), (params, []))[1].append(job)
        if self.executor is None:
            self.executor = executors.make_executor(self.kind, self.submitit_dir)
        for params, members in groups.values():
            self._submit(params, members)

    def _submit(self, params: dict, members: list[Pending]) -> None:
        calls = []
        for job in members:  # the job reads its cell from the spec file (`srun.run_task`)
            write_spec(job.ticket.spec_path, job.cell.spec, **job.about, timeout_s=job.timeout_s)
            calls.append(
                (str(job.ticket.spec_path), str(job.ticket.result_path), str(job.log), job.timeout_s)
            )
        if self.kind == "slurm":  # a rerun finds the job by this name if we die before saving its id
            name = executors.job_name([job.ticket.key for job in members])
            for index, job in enumerate(members):
                executors.write_submission(
                    submission_path(job.ticket), name, index if len(members) > 1 else None
                )
            params = {**params, "job_name": name}
        try:
            submitted = executors.submit_cells(self.executor, self.kind, params, calls)
        except Exception as err:  # sbatch refused (a partition or account the cluster does not know)
            for job in members:
                job.ticket.remove()
            if isinstance(err, UserError):
                raise
            raise UserError(
                f"submitting {len(members)} cell(s) failed: {' '.join(str(err).split())[:2000]}"
            ) from None
        for job, (handle, ref) in zip(members, submitted, strict=True):
            ref.save(job_path(job.ticket))
            job.ref, job.handle = ref, handle
        ids = ", ".join(ref.job_id for _, ref in submitted)
        self.say(f"submitted {len(members)} cell(s) to {self.kind}: job(s) {ids}")

    def poll(self, jobs: list[Pending]) -> list[Pending]:
        # a SLURM cell's result counts before its job has ended; a local job is waited for to its end
        ended = [
            job
            for job in jobs
            if (self.remote and job.ticket.result_path.exists())
            or not executors.is_active(job.ref, job.handle)
        ]
        executors.clear_ended(self.submitit_dir, self.say, last=not jobs)
        return ended

    def cancel(self, jobs: list[Pending], decide=None) -> None:
        if decide is not None:  # an out-of-memory: the larger batches of its series that still queue
            for job, reason in stop_queued(jobs, decide):
                if executors.cancel_if_queued(job.ref):  # recorded `skipped` once SLURM says it ended
                    job.stopped = reason
                    self.say(f"cancelled queued job {job.ref.job_id} ({job.cell.cell_name}): {reason}")
            return
        submitted = [job for job in jobs if job.ref is not None]
        for job in submitted:
            executors.cancel(job.ref, job.handle)
        if submitted:
            self.say(f"cancelled {len(submitted)} job(s): {', '.join(job.ref.job_id for job in submitted)}")

    def collect(self, job: Pending) -> dict[str, Any]:
        ticket, ref = job.ticket, job.ref
        wrote_result = ticket.result_path.exists()
        if not wrote_result:
            inflight.write_result_file(ticket, ended_result(job))
        info = read_started(ticket.result_path)
        extra: dict[str, Any] = {"duration_s": 0.0}  # a job that never started took no time
        begin = info.get("started_unix")
        if isinstance(begin, (int, float)) and not isinstance(begin, bool):  # the job's start, not its queue
            extra.update(started_at=now_iso(begin), duration_s=ticket.result_path.stat().st_mtime - begin)
        nodes = info.get("hostnames")  # as the job's task 0 saw them
        nodes = nodes if isinstance(nodes, list) and all(isinstance(n, str) for n in nodes) else None
        if ref.executor == "slurm" and ref.job_id:
            extra["slurm_job"] = {"id": ref.job_id, "nodes": nodes}
        # a job that wrote its result may still be ending: its folder waits for that
        executors.retire(ref, self.submitit_dir, may_run=wrote_result)
        return extra


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


def _sweep_orphans(folder: Path) -> None:
    """Remove the files no ticket owns (a cancelled job's late result, an atomic write cut short)."""
    keys = {p.name[: -len(".ticket.json")] for p in folder.glob("*.ticket.json")}
    for path in folder.iterdir():
        if path.name == executors.SUBMITIT_DIR:
            continue
        if not any(path.name.startswith(f"{key}.") or path.name.startswith(f".{key}.") for key in keys):
            rmtree_real(path)
