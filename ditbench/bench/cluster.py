"""The submitit parameters of one cell's job: where it runs (`spec.cluster.ClusterOptions`: the suite's
`cluster:` section and `--cluster KEY=VALUE`) and what the cell itself needs (its GPUs, nodes, tasks
and timeout). The options never enter a cell's id or its record.
"""

from __future__ import annotations

import math
from typing import Any

from ditbench.errors import UserError
from ditbench.spec.cluster import TEXT_KEYS, ClusterOptions

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
