"""Repeats: a cell measured K times, each in a fresh process, and how its K records make one figure.

Each repeat is a record of its own (`repeat` 1..K, `repeats` K); a cell's repeats are the latest record
of each index up to the K of its latest record. Speed across repeats is the median of the per-process
medians with a bootstrap interval over the processes: run-to-run noise is what repeats sample.
"""

from __future__ import annotations

import statistics
from typing import Any

from ditbench.records.metrics import IMAGES_PER_S, PER_GPU, STEP_MS, STEPS_PER_S, finite
from ditbench.records.model import Record


def repeat_of(record: Any) -> int:
    """The repeat index (1-based) of a record or a ticket's context; 1 for a run without repeats."""
    value = record.get("repeat")
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else 1


def latest_by_repeat(records: list[Record]) -> dict[tuple[str, int], Record]:
    """(cell_id, repeat) -> the last record of that repeat (later lines supersede earlier ones)."""
    return {(record.cell_id, record.repeat_index): record for record in records}


def cell_groups(records: list[Record]) -> dict[str, list[Record]]:
    """cell_id -> its repeats in repeat order: the latest record of each index up to the K of the
    cell's latest record. `records` in the order they were written (the latest last)."""
    last = {record.cell_id: record for record in records}
    groups: dict[str, list[Record]] = {cid: [] for cid in last}
    for (cid, index), record in sorted(latest_by_repeat(records).items(), key=lambda kv: kv[0][1]):
        if index <= last[cid].repeat_count:
            groups[cid].append(record)
    return groups


def combine(group: list[Record]) -> Record:
    """One record for a cell from its repeats: the median repeat's (by images/s, lower median) with
    its speeds the medians over the finished ok repeats and `metrics.repeats` the per-repeat figures.
    No such repeat: the first failure (the skipped repeats after it say less)."""
    from ditbench.core.intervals import median_interval  # numpy: only where repeats are combined

    if len(group) == 1 and group[0].repeat_count == 1:
        return group[0]
    ok = [r for r in group if r.status == "ok" and r.unfinished() is None]
    if not ok:
        return next((r for r in group if r.status not in ("ok", "skipped", "unsupported")), group[-1])
    rates = [float(IMAGES_PER_S.of(r)) for r in ok]
    steps = [float(STEP_MS.of(r)) for r in ok]
    out = ok[sorted(range(len(ok)), key=lambda i: rates[i])[(len(ok) - 1) // 2]].dump()
    out.pop("repeat", None)
    metrics = out["metrics"]
    metrics[IMAGES_PER_S.key] = statistics.median(rates)
    metrics[STEP_MS.key]["median"] = statistics.median(steps)
    for metric in (STEPS_PER_S, PER_GPU):
        values = [finite(metric.of(r)) for r in ok]
        if all(v is not None for v in values):
            metrics[metric.key] = statistics.median(values)
    metrics["repeats"] = {
        "count": len(ok),  # ok repeats: the figures are theirs
        "of": group[-1].repeat_count,
        "failed": {str(r.repeat_index): r.status for r in group if r.status != "ok"},
        IMAGES_PER_S.key: rates,
        STEP_MS.key: steps,  # each process's median step time: the gate's run-level samples
        f"{IMAGES_PER_S.key}_ci": list(median_interval(rates)),
        f"{STEP_MS.key}_ci": list(median_interval(steps)),
        "run_ids": [r.run_id for r in ok],
    }
    return Record.model_validate(out)


def combined(records: list[Record]) -> dict[str, Record]:
    """cell_id -> one record (combine) for every cell in `records`, in the order they were written."""
    return {cid: combine(group) for cid, group in cell_groups(records).items() if group}
