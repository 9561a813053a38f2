"""The two runs the gate reads, and what it can take from them: every value comes with the reason it
cannot be used, so a value that cannot be compared is reported by file, line and cell, never skipped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from ditbench.core.errors import UserError, shorten
from ditbench.core.escape import md_inline
from ditbench.records.metrics import STEP_MS
from ditbench.records.model import Record
from ditbench.report.load import load_results, noise_parts, number

MAX_NAMED = 5  # problems a refusal names one by one; the rest are counted


@dataclass(frozen=True)
class Row:
    side: str  # "BASE" or "NEW"
    source: str  # "path line N"
    record: Record

    @property
    def cell(self) -> str:
        name = shorten(self.record.cell_name, 100, quote=False)
        return f"cell `{name}` ({shorten(self.record.cell_id, 40, quote=False)})"

    @property
    def where(self) -> str:
        return f"{self.side} {self.source}, {self.cell}"


def rows(df: pd.DataFrame, side: str) -> dict[str, Row]:
    """cell_id -> Row for a run loaded by report.load (its `source` column is "path:line")."""
    out = {}
    for record, source in zip(df["record"], df["source"], strict=True):
        path, _, line = str(source).rpartition(":")
        out[record.cell_id] = Row(side, f"{path} line {line}" if path else str(source), record)
    return out


def load_run(path: str | Path, side: str = "") -> pd.DataFrame:
    """One run's latest record per cell; a run directory is read through its results.jsonl, so that
    messages name the file itself."""
    p = Path(path)
    if p.is_dir() and (p / "results.jsonl").is_file():
        p = p / "results.jsonl"
    return load_results(p, judge_metrics=True, side=side)  # the gate names each unusable metric by cell


# ------------------------------------------------------------------------------------------ values
# A record's numbers are typed by its model (records.model): null, or a float that may be NaN or inf,
# which the loader leaves to the gate (judge_metrics) to name by cell.


def _times(values: list[float | None] | None, where: str, rule: str) -> tuple[list[float], str | None]:
    """`values` ([] when absent), or a problem naming the first that is not a positive finite time."""
    for i, s in enumerate(values or []):
        v, problem = number(s)
        if v is None or v <= 0:
            why = problem or ("is null" if s is None else "is not a positive time")
            return [], f"{where}[{i}] {why} ({rule})"
    return list(values or []), None


def step_samples(record: Record) -> tuple[list[float], str | None]:
    """metrics.step_ms.samples ([] when absent), or a problem naming the first bad sample."""
    step = getattr(record.metrics, STEP_MS.key, None)
    rule = "per-step times must be finite numbers of ms"
    return _times(getattr(step, "samples", None), "metrics.step_ms.samples", rule)


def run_samples(record: Record) -> tuple[list[float], str | None]:
    """The per-process median step times of a cell's repeats (metrics.repeats.step_ms, written by
    bench.repeats.combine): [] for a cell measured once, or a problem naming the first bad value."""
    repeats = getattr(record.metrics, "repeats", None)
    if repeats is None:
        return [], None
    values = getattr(repeats, STEP_MS.key)
    if values is None:
        return [], "metrics.repeats.step_ms is None, not a list of per-repeat step times"
    return _times(values, "metrics.repeats.step_ms", "per-repeat step times must be positive ms")


def noisy(record: Record) -> str | None:
    """Why the cell's timing is weak (metrics.noisy, with metrics.noise's figures), or None."""
    if not getattr(record.metrics, "noisy", None):
        return None
    noise = record.metrics.noise
    if noise is None:
        return "noisy measurement window"
    parts = noise_parts(noise.dump(), "step spread p90/p10")
    return "noisy measurement window" + (f": {', '.join(parts)}" if parts else "")


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
