"""The two runs the gate reads, and what it can take from them: every value comes with the reason it
cannot be used, so a value that cannot be compared is reported by file, line and cell, never skipped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from ditbench.bench.window import noise_advice
from ditbench.errors import UserError, shorten
from ditbench.escape import md_inline
from ditbench.records.metrics import STEP_MS
from ditbench.records.model import Part, Record

MAX_NAMED = 5  # problems a refusal names one by one; the rest are counted


@dataclass(frozen=True)
class Row:
    """One record of one run, with where it came from."""

    side: str  # "BASE" or "NEW"
    source: str  # "path line N"
    record: Record  # (a mapping in the gate's own tests)

    @property
    def cell(self) -> str:
        name = shorten(self.record.get("cell_name") or "", 100, quote=False)
        return f"cell `{name}` ({shorten(self.record.get('cell_id'), 40, quote=False)})"

    @property
    def where(self) -> str:
        return f"{self.side} {self.source}, {self.cell}"


def rows(df: pd.DataFrame, side: str) -> dict[str, Row]:
    """cell_id -> Row for a run loaded by report.load (its `source` column is "path:line")."""
    out = {}
    for record, source in zip(df["record"], df["source"], strict=True):
        path, _, line = str(source).rpartition(":")
        out[record["cell_id"]] = Row(side, f"{path} line {line}" if path else str(source), record)
    return out


def load_run(path: str | Path, side: str = "") -> pd.DataFrame:
    """One run's latest record per cell; a run directory is read through its results.jsonl, so that
    messages name the file itself."""
    from ditbench.report.load import load_results

    p = Path(path)
    if p.is_dir() and (p / "results.jsonl").is_file():
        p = p / "results.jsonl"
    return load_results(p, judge_metrics=True, side=side)  # the gate names each unusable metric by cell


# ------------------------------------------------------------------------------------------ values


def number(value: Any) -> tuple[float | None, str | None]:
    """(float, None) for a finite number, (None, None) for null, else (None, why it is not usable)."""
    if value is None:
        return None, None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None, f"is {shorten(value)}, not a number"
    try:
        v = float(value)
    except OverflowError:  # an integer beyond the float range
        return None, "is a number too large to compare"
    if not math.isfinite(v):
        return None, f"is {value!r}, not a finite number"
    return v, None


def number_at(record: Record, dotted: str) -> tuple[float | None, str | None]:
    """The number at a dotted path of a record: (value, None), (None, None) if absent, or a problem."""
    node: Any = record
    parts = dotted.split(".")
    for i, part in enumerate(parts):
        if node is None:
            return None, None
        if not isinstance(node, (dict, Part)):
            return None, f"cannot be read: `{'.'.join(parts[:i])}` is {shorten(node)}, not an object"
        node = getattr(node, part, None) if isinstance(node, Part) else node.get(part)  # a record's: typed
    return number(node)


def _positive_times(values: Any, where: str, what: str, rule: str) -> tuple[list[float], str | None]:
    """`values` as floats, or a problem naming the first that is not a positive finite number."""
    if not isinstance(values, list):
        return [], f"{where} is {shorten(values)}, not a list of {what}"
    out = []
    for i, s in enumerate(values):
        v, problem = number(s)
        if v is None or v <= 0:
            why = problem or ("is null" if s is None else "is not a positive time")
            return [], f"{where}[{i}] {why} ({rule})"
        out.append(v)
    return out, None


def step_samples(record: Record) -> tuple[list[float], str | None]:
    """metrics.step_ms.samples as floats ([] when absent), or a problem naming the first bad sample."""
    step = (record.get("metrics") or {}).get(STEP_MS.key)
    samples = step.get("samples") if isinstance(step, dict) else None
    if samples is None:
        return [], None
    return _positive_times(
        samples, "metrics.step_ms.samples", "per-step times", "per-step times must be finite numbers of ms"
    )


def run_samples(record: Record) -> tuple[list[float], str | None]:
    """The per-process median step times of a cell's repeats (metrics.repeats.step_ms, written by
    bench.repeats.combine): [] for a cell measured once, or a problem naming the first bad value."""
    repeats = (record.get("metrics") or {}).get("repeats")
    if repeats is None:
        return [], None
    values = repeats.get(STEP_MS.key) if isinstance(repeats, dict) else None
    return _positive_times(
        values,
        "metrics.repeats.step_ms",
        "per-repeat step times",
        "per-repeat step times must be positive ms",
    )


def noisy(record: Record) -> tuple[str | None, str | None]:
    """(why the cell's timing is weak, or None; a problem with metrics.noisy / metrics.noise)."""
    metrics = record.get("metrics") or {}
    flag = metrics.get("noisy")
    if flag is None or flag is False:
        return None, None
    if flag is not True:
        return None, f"metrics.noisy is {shorten(flag)}, not true or false"
    noise = metrics.get("noise")
    if noise is None:
        return "noisy measurement window", None
    if not isinstance(noise, dict):
        return None, f"metrics.noise is {shorten(noise)}, not an object"
    parts = []
    for value, bound, label in (
        ("step_spread", "spread_bound", "step spread p90/p10"),
        ("throughput_gap", "gap_bound", "throughput gap"),
    ):
        v, b = noise.get(value), noise.get(bound)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            limit = f" (bound {b:.3g})" if isinstance(b, (int, float)) and math.isfinite(b) else ""
            parts.append(f"{label} {v:.3g}{limit}")
    if (advice := noise_advice(noise)) is not None:
        parts.append(advice)
    return "noisy measurement window" + (f": {', '.join(parts)}" if parts else ""), None


# ------------------------------------------------------------------------------------------ problems


@dataclass
class Problem:
    row: Row
    text: str  # what is wrong, starting with the field
    metric: str | None  # the metric it stops from being compared; None: the record itself is wrong


@dataclass
class Problems:
    """What could not be compared; allowed ones become "not compared" entries, the rest refuse."""

    found: list[Problem] = field(default_factory=list)

    def add(self, row: Row, text: str, metric: str | None = None) -> None:
        self.found.append(Problem(row, text, metric))

    def raise_any(self) -> None:
        if self.found:
            raise IncomparableError(self.found)


class GateRefusal(UserError):
    """The gate cannot decide: exit 2. `markdown` is what the summary files get instead."""

    title = "refused"

    def markdown(self) -> str:
        return f"## ⛔ ditbench compare: {self.title}\n\n{md_inline(self)}\n"  # user values inside


class IncomparableError(GateRefusal):
    title = "refused, values that cannot be compared"

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        first = problems[0]
        records = {(p.row.side, p.row.source) for p in problems}
        also = ""
        if len(problems) > 1:
            named = "; ".join(f"{p.row.side} {p.row.source}: {p.text}" for p in problems[1:MAX_NAMED])
            rest = len(problems) - MAX_NAMED
            also = (
                f" {len(problems)} problems in {len(records)} record(s); also {named}"
                + (f"; and {rest} more" if rest > 0 else "")
                + "."
            )
        allow = ""
        if first.metric is not None:
            allow = (
                f" If this is expected, list `{first.metric}` under `allow_incomparable` in the policy "
                "to report it as not compared instead."
            )
        super().__init__(
            f"{first.row.where}: {first.text}. A gate cannot pass what it cannot compare, so it refuses "
            f"(exit 2).{also} Re-run the cell or fix the record.{allow}"
        )
