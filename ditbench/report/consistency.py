"""A record checked against itself before report or compare uses it (its types are the model's): a
forged or edited record is an input error naming its field, never a number that passes a gate.

Its `cell_id` is its config's (else it would be compared as another cell); images/s agrees with
steps/s x the global batch and with its per-step samples (within RATE_TOLERANCE; the runner's agree
within 0.3%); `started_at` is not in the future (a record dated 2999 would shadow every real one);
and every value is one pandas can hold: integers within 64 bits, finite floats (the writer stores
NaN and inf as null: a JSON `Infinity` was put there by hand).
"""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

from ditbench.errors import shorten
from ditbench.records.metrics import IMAGES_PER_S, STEPS_PER_S, finite
from ditbench.records.model import Record
from ditbench.spec.cell import cell_id

RATE_TOLERANCE = 0.10  # relative; a halved rate with unchanged samples is 50% off
FUTURE_SLACK = dt.timedelta(hours=1)
INT_LIMIT = 2**63  # pandas' int64 and numpy's C long; an integer at or beyond it is no count we write


def record_problem(record: Record, now: dt.datetime | None = None) -> tuple[str, str] | None:
    """(field, what is wrong) for the first contradiction in `record`, or None."""
    return _identity(record) or _rates(record) or _started(record, now)


def value_problem(raw: dict[str, Any], *, judge_metrics: bool = False) -> tuple[str, str] | None:
    """(field, what is wrong) for the first value of a record as read (JSON) that a report cannot hold.

    judge_metrics=True leaves the values under `metrics` and `quality` to a caller that reports each
    one it cannot use by cell (the gate, whose policy may allow some); the rest is checked all the same.
    """
    skip = ("metrics", "quality") if judge_metrics else ()
    stack: list[tuple[str, Any]] = [(k, v) for k, v in raw.items() if k not in skip]
    while stack:
        path, value = stack.pop()
        if isinstance(value, bool) or value is None or isinstance(value, str):
            continue
        if isinstance(value, int):
            if not -INT_LIMIT <= value < INT_LIMIT:
                digits = len(str(abs(value))) if value.bit_length() < 20_000 else "thousands of"
                return path, f"is an integer of {digits} digits, beyond the 64-bit range a report can hold"
        elif isinstance(value, float):
            if not math.isfinite(value):
                return path, f"is {value!r}; a record holds finite numbers (its writer stores NaN as null)"
        elif isinstance(value, dict):
            stack.extend((f"{path}.{k}", v) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((f"{path}[{i}]", v) for i, v in enumerate(value))
    return None


def _identity(record: Record) -> tuple[str, str] | None:
    expected = cell_id(record.config)
    if record.cell_id == expected:
        return None
    return "cell_id", (
        f"is {shorten(record.cell_id)}, which is not the id of the record's config (that config's id is "
        f"{expected}); a record with another cell's id would be compared as that cell"
    )


def parse_time(text: Any) -> dt.datetime | None:
    if not isinstance(text, str):
        return None
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=dt.timezone.utc)


def _started(record: Record, now: dt.datetime | None) -> tuple[str, str] | None:
    when = parse_time(record.started_at)
    now = now or dt.datetime.now(dt.timezone.utc)
    if when is not None and when > now + FUTURE_SLACK:
        return "started_at", (
            f"is {shorten(record.started_at)}, in the future (now is "
            f"{now.isoformat(timespec='seconds').replace('+00:00', 'Z')}); a record states when it ran"
        )
    return None


def _positive(value: Any) -> float | None:
    v = finite(value)
    return v if v is not None and v > 0 else None


def _off(have: float, want: float) -> bool:
    return abs(have / want - 1.0) > RATE_TOLERANCE


def _rates(record: Record) -> tuple[str, str] | None:
    rate, per_step = _positive(IMAGES_PER_S.of(record)), float(record.config.global_batch)
    if record.status != "ok" or rate is None:
        return None
    steps_per_s = _positive(STEPS_PER_S.of(record))
    if steps_per_s is not None and _off(rate, steps_per_s * per_step):
        return IMAGES_PER_S.path, (
            f"is {rate:.4g}, but steps_per_s {steps_per_s:.4g} x {per_step:g} images a step is "
            f"{steps_per_s * per_step:.4g}"
        )
    samples = record.metrics.step_ms.samples if record.metrics.step_ms else None
    values = [_positive(s) for s in samples or []]
    if values and all(v is not None for v in values):
        implied = per_step * 1000.0 * len(values) / sum(values)  # type: ignore[arg-type]
        if _off(rate, implied):
            return IMAGES_PER_S.path, (
                f"is {rate:.4g}, but its {len(values)} per-step samples (mean "
                f"{sum(values) / len(values):.4g} ms for {per_step:g} images a step) give "  # type: ignore[arg-type]
                f"{implied:.4g} images/s"
            )
    return None
