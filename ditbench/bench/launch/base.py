"""The two interfaces of running a suite: where its cells run (`Executor`) and how a cell's processes
start (`Launcher`). Either way each cell leaves its result in its ticket's result file.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

from ditbench.bench.cell import threads
from ditbench.bench.launch.process import ONE_PROCESS, TORCHRUN
from ditbench.spec.cell import CellSpec

# What a multi-process cell's ranks run, whoever starts them (torchrun, or a submitit job's tasks)
RANK_MODULE = "ditbench.bench.launch.rank"


@dataclass(eq=False)
class Pending:
    """A cell handed to an executor: its ticket, and the executor's name for its job."""

    ticket: Any  # bench.inflight.Ticket: context, spec, result file
    ref: Any = None  # the executor's name for the job (submitit: a JobRef); None for a process
    cell: Any = None  # the SuiteCell; None: an earlier run's job for a cell this suite no longer has
    handle: Any = None  # submitit's Job, when this run submitted it
    stopped: str | None = None  # why this run cancelled the job while it queued
    about: dict[str, Any] = field(default_factory=dict)  # the spec file's fields beside the cell
    timeout_s: float = 0.0
    log: Path | None = None


class Executor(Protocol):
    waits: ClassVar[bool]  # submit returns once its cells have ended (their tickets: <out>/.inflight)
    remote: ClassVar[bool]  # cells run elsewhere, all submitted at once (else one at a time, here)
    poll_s: float  # between polls while jobs are pending

    def verdict(self, cell, visible, rendezvous: dict | None = None) -> tuple[str, str] | None:
        """(status, reason) of a cell this executor cannot run, decided without starting it."""

    def start(self, out: Path, say: Callable[[str], None]) -> list[Pending]:
        """Begin a run in `out`: the jobs of earlier (killed) runs whose results may still come."""

    def submit(self, jobs: list[Pending]) -> None:
        """Start the cells (raises UserError, leaving none of their tickets, when refused)."""

    def poll(self, jobs: list[Pending]) -> list[Pending]:
        """The jobs whose result has arrived or that have ended. `poll([])`: the run has ended."""

    def cancel(self, jobs: list[Pending], decide: Callable | None = None) -> None:
        """Cancel the jobs (Ctrl-C, an error); with `decide` (`SuiteRun.decide`), only the queued
        ones it now rules out (an OOM in their series, a failed repeat), each `stopped` with why."""

    def collect(self, job: Pending) -> dict[str, Any]:
        """After a job ended: write its result from how it ended if it wrote none; the record's fields
        the executor knows (started_at, duration_s, slurm_job)."""


class Launcher(Protocol):
    def launch(
        self,
        spec: CellSpec,
        about: dict[str, Any],
        timeout_s: float,
        spec_path: Path,
        result_path: Path,
        log_path: Path,
    ) -> None:
        """Run the cell; afterwards `result_path` holds its result (the caller appends, then removes it).
        `about` goes into the spec file beside the cell: cell_id, cell_name, rendezvous, out_dir."""


def for_cell(spec: CellSpec, ranks: Launcher | None = None) -> Launcher:
    """The launcher of a cell: one process, else `ranks`, which starts a multi-process cell's ranks where
    the cell runs: torchrun's on this machine by default, the job's own tasks in a submitit job."""
    return ONE_PROCESS if spec.world_size == 1 else ranks or TORCHRUN


def report_dir(result_path: str | Path) -> Path:
    """`<key>.result.ranks/`: a multi-process cell's ranks' reports (removed with the ticket)."""
    return Path(result_path).with_name(Path(result_path).stem + ".ranks")


def share_cores(env: dict[str, str], spec: CellSpec, ranks_here: int, outer: Mapping[str, str]) -> None:
    """OMP_NUM_THREADS for the ranks on one machine: the `threads` knob's count; with `auto` CPU ranks
    share the cores a one-process cell has alone, so scaling efficiency compares like with like."""
    n = threads.pinned(spec.knobs.threads, spec.device)
    if n is not None:
        env["OMP_NUM_THREADS"] = str(n)
    elif spec.device == "cpu" and "OMP_NUM_THREADS" not in outer:
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // max(1, ranks_here)))
