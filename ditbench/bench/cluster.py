"""Where a suite's cells run when they go to a cluster: the suite's `cluster:` section, `--cluster KEY=VALUE`.

    cluster:
      partition: gpu          # sbatch --partition
      account: my_project     # sbatch --account
      qos: normal             # sbatch --qos
      constraint: h100        # sbatch --constraint
      time_limit_min: 120     # the job's time limit; default: the cell's timeout plus a margin
      sbatch: {cpus-per-task: 16, mem: 0}   # any other sbatch option, without the leading --
      setup: ["module load cuda/12.4", "source ~/venvs/dit/bin/activate"]   # lines before srun

These options say where a cell runs, not what it measures: they never enter a cell's id or its
record. The GPUs, nodes and tasks of each job come from the cell itself (`job_parameters`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from ditbench.errors import UserError, shorten

EXECUTORS = ("local", "slurm")  # --executor: submitit's executors
TEXT_KEYS = ("partition", "account", "qos", "constraint")
CLUSTER_KEYS = (*TEXT_KEYS, "time_limit_min", "sbatch", "setup")
# sbatch options ditbench sets from the cell (or submitit sets itself): a second value would contradict them
MANAGED_SBATCH = (
    "array",
    "error",
    "gpus-per-node",
    "job-name",
    "nodes",
    "ntasks-per-node",
    "open-mode",
    "output",
    "signal",
    "time",
    "wckey",
    "partition",
    "account",
    "qos",
    "constraint",
)
SBATCH_KEY = re.compile(r"[a-z][a-z0-9-]{0,63}")
MAX_TEXT = 1000
MAX_SETUP_LINES = 64
MAX_TIME_LIMIT_MIN = 366 * 24 * 60  # a year: beyond it a time limit is a typo
# The job outlives the cell's own timeout by this much, so the cell is stopped (and recorded
# `timeout`) by ditbench inside the job before SLURM kills the job: start-up, imports, the record.
MARGIN_MIN_S = 300.0
MARGIN_FRACTION = 0.1


@dataclass(frozen=True)
class ClusterOptions:
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    time_limit_min: int | None = None
    sbatch: dict[str, Any] = field(default_factory=dict)
    setup: tuple[str, ...] = ()

    def merged(self, other: ClusterOptions) -> ClusterOptions:
        """These options with every option `other` sets (the command line over the suite)."""
        out = {k: getattr(self, k) for k in CLUSTER_KEYS}
        for key in CLUSTER_KEYS:
            value = getattr(other, key)
            if key == "sbatch":
                out[key] = {**self.sbatch, **value}
            elif value not in (None, ()):
                out[key] = value
        return ClusterOptions(**out)

    def any_set(self) -> list[str]:
        return [k for k in CLUSTER_KEYS if getattr(self, k) not in (None, (), {})]


def _text(value: Any, fail, key: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise fail(key, f"expected text, got {shorten(value)}.")
    value = str(value)
    if not value.strip() or len(value) > MAX_TEXT or any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise fail(
            key,
            f"expected non-empty text of at most {MAX_TEXT} characters on one line (it goes into the "
            f"batch script), got {shorten(value)}.",
        )
    return value


def _sbatch(value: Any, fail) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise fail("sbatch", f"expected a mapping of sbatch options (e.g. {{mem: 0}}), got {shorten(value)}.")
    out = {}
    for key, item in value.items():
        name = str(key).lstrip("-").replace("_", "-")
        where = f"sbatch.{shorten(key, quote=False)}"
        if not SBATCH_KEY.fullmatch(name):
            raise fail(where, "expected an sbatch option name such as cpus-per-task or mem.")
        if name in MANAGED_SBATCH:
            own = name if name in TEXT_KEYS else None
            raise fail(
                where,
                f"--{name} is "
                + (f"set by `cluster.{own}`; write it there." if own else "set by ditbench from the cell.")
                + " The other sbatch options are free.",
            )
        if isinstance(item, float) and not math.isfinite(item):
            raise fail(where, f"{item} is not a finite number.")
        if item is True:
            out[name] = True  # a flag such as --exclusive
        elif isinstance(item, (int, float)) and not isinstance(item, bool):
            out[name] = item
        else:
            out[name] = _text(item, fail, where)
    return out


def parse_cluster(value: Any, fail) -> ClusterOptions:
    """A `cluster:` mapping as ClusterOptions; fail(key, message) -> Exception names the key."""
    if value is None:
        return ClusterOptions()
    if not isinstance(value, dict):
        raise fail(None, f"expected a mapping such as {{partition: gpu}}, got {shorten(value)}.")
    for key in value:
        if key not in CLUSTER_KEYS:
            raise fail(str(key), f"unknown key; valid: {', '.join(CLUSTER_KEYS)}.")
    out: dict[str, Any] = {k: _text(value[k], fail, k) for k in TEXT_KEYS if value.get(k) is not None}
    limit = value.get("time_limit_min")
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_TIME_LIMIT_MIN:
            raise fail(
                "time_limit_min",
                f"expected whole minutes from 1 to {MAX_TIME_LIMIT_MIN}, got {shorten(limit)}.",
            )
        out["time_limit_min"] = limit
    if value.get("sbatch") is not None:
        out["sbatch"] = _sbatch(value["sbatch"], fail)
    setup = value.get("setup")
    if setup is not None:
        if not isinstance(setup, list) or len(setup) > MAX_SETUP_LINES:
            raise fail(
                "setup", f"expected a list of at most {MAX_SETUP_LINES} shell lines, got {shorten(setup)}."
            )
        out["setup"] = tuple(_text(line, fail, f"setup[{i}]") for i, line in enumerate(setup))
    return ClusterOptions(**out)


def parse_cluster_flags(items: list[str]) -> ClusterOptions:
    """`--cluster KEY=VALUE` (repeatable; `sbatch.OPTION=VALUE` sets an sbatch option), as in the file."""
    from ditbench.yamlio import parse_yaml_text

    raw: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UserError(
                f"--cluster {shorten(item)}: expected KEY=VALUE, e.g. --cluster partition=gpu or "
                "--cluster sbatch.mem=0 (keys: " + ", ".join(CLUSTER_KEYS) + ")."
            )
        value = parse_yaml_text(text, f"--cluster {shorten(key, quote=False)}") if text.strip() else None
        if key.startswith("sbatch."):
            raw.setdefault("sbatch", {})[key[len("sbatch.") :]] = value
        else:
            raw[key] = value

    def fail(key, message):
        return UserError(f"--cluster {key}: {message}" if key else f"--cluster: {message}")

    return parse_cluster(raw, fail)


# ---------------------------------------------------------------------------------------------


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
