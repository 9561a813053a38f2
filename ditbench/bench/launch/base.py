"""The launcher interface: how a cell's processes start, whichever starts them.

A launcher runs one cell spec under a timeout, its output in a log, and leaves the cell's result
in a result file: the cell's own, or one saying how its processes died or timed out. The caller
(the runner, or a submitit job's task) turns that file into a record (`bench.inflight.commit`);
a multi-process cell's ranks are judged in one place (`launch.torchrun.result_of_launch`), whether
torchrun or srun started them.

Implementations: `FreshProcess` (`launch.process`): a fresh process of its own session running
one module, either the one-process cell (`ONE_PROCESS`) or torchrun's parent (`TORCHRUN`), which
starts the ranks; `JobRanks` (`launch.srun`): inside a submitit job (srun's tasks on SLURM), each
task runs one rank. `for_cell` picks one from the cell's gpus x nodes and where it runs. Whoever
starts the cell (the runner, `bench.jobs`'s job task `srun.run_task`) goes through `for_cell`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from ditbench.bench import threads
from ditbench.spec.cell import CellSpec

# What a multi-process cell's ranks run, whoever starts them (torchrun, or a submitit job's tasks)
RANK_MODULE = "ditbench.bench.launch.rank"


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

        `about` goes into the spec file beside the cell: cell_id, cell_name, rendezvous, out_dir.
        """


def for_cell(spec: CellSpec, ranks: Launcher | None = None) -> Launcher:
    """The launcher of a cell: one process, else `ranks`, which starts a multi-process cell's ranks where
    the cell runs: torchrun's on this machine by default, the job's own tasks in a submitit job."""
    from ditbench.bench.launch.process import ONE_PROCESS, TORCHRUN

    return ONE_PROCESS if spec.world_size == 1 else ranks or TORCHRUN


def report_dir(result_path: str | Path) -> Path:
    """`<key>.result.ranks/`: a multi-process cell's ranks' reports (removed with the ticket)."""
    return Path(result_path).with_name(Path(result_path).stem + ".ranks")


def share_cores(env: dict[str, str], spec: CellSpec, ranks_here: int, outer: Mapping[str, str]) -> None:
    """OMP_NUM_THREADS for the ranks on one machine. The `threads` knob wins where it pins a count (by
    default 1 per CPU rank); with `auto` CPU ranks share the cores a one-process cell has alone (unless
    the user set OMP_NUM_THREADS in `outer`), so scaling efficiency compares like with like."""
    n = threads.pinned(spec.knobs.threads, spec.device)
    if n is not None:
        env["OMP_NUM_THREADS"] = str(n)
    elif spec.device == "cpu" and "OMP_NUM_THREADS" not in outer:
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // max(1, ranks_here)))
