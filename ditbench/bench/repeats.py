"""Repeats: a cell measured K times, each in a fresh process, and how its K records make one figure.

A run with `repeats: K` (suite key, or `run --repeats K`) records each repeat as a record of its own,
under the cell's own cell_id, with `repeat` (1..K) and `repeats` (K). A cell's repeats are the latest
record of each repeat index, up to the K of the cell's latest record (a rerun with a smaller K does
not mix in the old extra repeats). Records without `repeat` are repeat 1 of 1, as before.

Speed across repeats is the median of the per-process medians, with a bootstrap interval over the
processes: the run-to-run noise (process start, allocator, clocks, machine load) is what the repeats
sample, and consecutive steps of one process do not.
"""

from __future__ import annotations

import copy
import statistics
from typing import Any

REPEATS_MAX = 100  # a cell measured more often than this is a soak test, not a benchmark


def repeat_of(record: dict[str, Any]) -> int:
    """The record's repeat index (1-based); 1 for a record of a run without repeats."""
    value = record.get("repeat")
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else 1


def repeats_of(record: dict[str, Any]) -> int:
    """K of the run that wrote the record; 1 without repeats."""
    value = record.get("repeats")
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else 1


def latest_by_repeat(records: list[dict[str, Any]]) -> dict[tuple[str, int], dict[str, Any]]:
    """(cell_id, repeat) -> the last record of that repeat (later lines supersede earlier ones)."""
    out: dict[tuple[str, int], dict[str, Any]] = {}
    for record in records:
        if isinstance(record, dict) and isinstance(record.get("cell_id"), str):
            out[(record["cell_id"], repeat_of(record))] = record
    return out


def cell_groups(records: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """cell_id -> its repeats in repeat order: the latest record of each index up to the K of the
    cell's latest record. `records` in the order they were written (the latest last)."""
    last: dict[str, dict[str, Any]] = {}
    for record in records:
        last[record["cell_id"]] = record
    groups: dict[str, list[dict[str, Any]]] = {cid: [] for cid in last}
    for (cid, index), record in sorted(latest_by_repeat(records).items(), key=lambda kv: kv[0][1]):
        if index <= repeats_of(last[cid]):
            groups[cid].append(record)
    return groups


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def combine(group: list[dict[str, Any]]) -> dict[str, Any]:
    """One record for a cell from its repeats (cell_groups' list). A single record without repeats is
    returned as it is. With repeats: the record of the repeat whose images/s is the median (lower
    median for an even count), with images/s, steps/s and the median step time replaced by the
    median over the ok repeats, and `metrics.repeats` holding the per-repeat figures and their
    bootstrap intervals. No ok repeat: the first failure (the skipped repeats after it say less)."""
    from ditbench.intervals import median_interval  # numpy: only where repeats are combined

    if len(group) == 1 and repeats_of(group[0]) == 1:
        return group[0]
    ok = [r for r in group if r.get("status") == "ok"]
    if not ok:
        return next((r for r in group if r.get("status") not in ("skipped", "unsupported")), group[-1])
    rates = [float(r["metrics"]["images_per_s"]) for r in ok]
    steps = [float(r["metrics"]["step_ms"]["median"]) for r in ok]
    pick = ok[sorted(range(len(ok)), key=lambda i: rates[i])[(len(ok) - 1) // 2]]
    out = copy.deepcopy(pick)
    out.pop("repeat", None)
    metrics = out["metrics"]
    metrics["images_per_s"] = statistics.median(rates)
    metrics["step_ms"]["median"] = statistics.median(steps)
    for key in ("steps_per_s", "images_per_s_per_gpu"):
        values = [_number(r["metrics"].get(key)) for r in ok]
        if all(v is not None for v in values):
            metrics[key] = statistics.median(values)
    metrics["repeats"] = {
        "count": len(ok),  # ok repeats: the figures are theirs
        "of": repeats_of(group[-1]),
        "failed": {str(repeat_of(r)): r.get("status") for r in group if r.get("status") != "ok"},
        "images_per_s": rates,
        "step_ms": steps,  # each process's median step time: the gate's run-level samples
        "images_per_s_ci": list(median_interval(rates)),
        "step_ms_ci": list(median_interval(steps)),
        "run_ids": [r.get("run_id") for r in ok],
    }
    return out


def combined(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """cell_id -> one record (combine) for every cell in `records`, in the order they were written."""
    return {cid: combine(group) for cid, group in cell_groups(records).items() if group}
