"""Where a suite's cells run on a cluster: the suite's `cluster:` section and `--cluster KEY=VALUE`
(docs/distributed.md). They say where a cell runs, not what it measures: never in a cell's id or record
(GPUs, nodes and tasks come from the cell, `bench/jobs.py`).
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any

from pydantic import BeforeValidator, Field

from ditbench.core.errors import UserError, shorten
from ditbench.core.validation import refuse, rule, validate, where
from ditbench.spec.base import SpecModel

TEXT_KEYS = ("partition", "account", "qos", "constraint")
# sbatch options ditbench sets from the cell (or submitit sets itself): a second value would contradict them
MANAGED_SBATCH = (
    "array", "error", "gpus-per-node", "job-name", "nodes", "ntasks-per-node", "open-mode", "output",
    "signal", "time", "wckey", *TEXT_KEYS,
)  # fmt: skip
SBATCH_KEY = re.compile(r"[a-z][a-z0-9-]{0,63}")
MAX_TEXT = 1000
MAX_SETUP_LINES = 64
MAX_TIME_LIMIT_MIN = 366 * 24 * 60  # a year: beyond it a time limit is a typo


def _line_problem(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        return f"expected text, got {shorten(value)}."
    value = str(value)
    if not value.strip() or len(value) > MAX_TEXT or any(ord(c) < 32 or ord(c) == 127 for c in value):
        return (
            f"expected non-empty text of at most {MAX_TEXT} characters on one line (it goes into the "
            f"batch script), got {shorten(value)}."
        )
    return None


def _text(value: Any, at: str = "") -> str:
    if problem := _line_problem(value):
        raise refuse(problem, at)
    return str(value)


def _sbatch(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise refuse(f"expected a mapping of sbatch options (e.g. {{mem: 0}}), got {shorten(value)}.")
    out = {}
    for key, item in value.items():
        name, at = str(key).lstrip("-").replace("_", "-"), shorten(key, quote=False)
        if not SBATCH_KEY.fullmatch(name):
            raise refuse("expected an sbatch option name such as cpus-per-task or mem.", at)
        if name in MANAGED_SBATCH:
            own = (
                f"set by `cluster.{name}`; write it there."
                if name in TEXT_KEYS
                else "set by ditbench from the cell."
            )
            raise refuse(f"--{name} is {own} The other sbatch options are free.", at)
        if isinstance(item, float) and not math.isfinite(item):
            raise refuse(f"{item} is not a finite number.", at)
        if item is True or (isinstance(item, (int, float)) and not isinstance(item, bool)):
            out[name] = item  # True: a flag such as --exclusive
        else:
            out[name] = _text(item, at)
    return out


Line = Annotated[str, BeforeValidator(_text)]


class ClusterOptions(SpecModel):
    partition: Line | None = None
    account: Line | None = None
    qos: Line | None = None
    constraint: Line | None = None
    time_limit_min: Annotated[
        Annotated[int, Field(strict=True, ge=1, le=MAX_TIME_LIMIT_MIN)] | None,
        rule(f"expected whole minutes from 1 to {MAX_TIME_LIMIT_MIN}, got {{value}}."),
    ] = None
    sbatch: Annotated[dict[str, Any], BeforeValidator(_sbatch)] = {}
    setup: tuple[Line, ...] = Field(
        (), max_length=MAX_SETUP_LINES, description=f"a list of at most {MAX_SETUP_LINES} shell lines"
    )

    def merged(self, other: ClusterOptions) -> ClusterOptions:
        """These options with every option `other` sets (the command line over the suite)."""
        given = {k: v for k, v in other if v not in (None, (), {})}
        return self.replace(**{**given, "sbatch": {**self.sbatch, **other.sbatch}})

    def any_set(self) -> list[str]:
        return [k for k, v in self if v not in (None, (), {})]


def parse_cluster_flags(items: list[str]) -> ClusterOptions:
    """`--cluster KEY=VALUE` (repeatable; `sbatch.OPTION=VALUE` sets an sbatch option), as in the file."""
    from ditbench.files.yamlio import parse_yaml_text

    raw: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UserError(
                f"--cluster {shorten(item)}: expected KEY=VALUE, e.g. --cluster partition=gpu or "
                "--cluster sbatch.mem=0 (keys: " + ", ".join(ClusterOptions.model_fields) + ")."
            )
        value = parse_yaml_text(text, f"--cluster {shorten(key, quote=False)}") if text.strip() else None
        if key.startswith("sbatch."):
            raw.setdefault("sbatch", {})[key[len("sbatch.") :]] = value
        else:
            raw[key] = value
    return validate(
        ClusterOptions, raw, lambda loc, text: f"--cluster{f' {where(loc)}' if loc else ''}: {text}"
    )
