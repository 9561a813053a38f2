"""A record checked against itself before report or compare uses it: a forged or edited record is an
input error naming its field, never a number that passes a gate.

What a record states twice must agree:
- its `config` is a cell's (`CellSpec` reads it back) and its `cell_id` is that
  cell's id: a record keeping another cell's id with a changed config would be compared as that cell;
- its rates agree with each other and with its per-step samples: `images_per_s` is
  `steps_per_s` x images a step, and the images a step over the mean of `step_ms.samples` (within
  RATE_TOLERANCE; the runner's records agree within 0.3%);
- its `started_at` is not in the future (beyond FUTURE_SLACK for clocks a little apart): a record
  dated 2999 would shadow every real one.

And every value pandas and matplotlib will hold is one they can: integers within 64 bits, floats
finite where they are numbers (the writer turns NaN and inf into null; a JSON `Infinity` was put there
by hand), knob values scalars (a list where a knob's string belongs breaks grouping and plots).
"""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

from ditbench.errors import UserError, shorten

RATE_TOLERANCE = 0.10  # relative; a halved rate with unchanged samples is 50% off
FUTURE_SLACK = dt.timedelta(hours=1)
INT_LIMIT = 2**63  # pandas' int64 and numpy's C long; an integer at or beyond it is no count we write


def record_problem(
    record: dict[str, Any], now: dt.datetime | None = None, *, judge_metrics: bool = False
) -> tuple[str, str] | None:
    """(field, what is wrong) for the first contradiction or unholdable value in `record`, or None.

    judge_metrics=True leaves the values under `metrics` and `quality` to a caller that reports each
    one it cannot use by cell (the gate, whose policy may allow some); the rest is checked all the same.
    """
    found = _values(record, skip=("metrics", "quality") if judge_metrics else ())
    for check in (_knobs, _identity, _rates):
        found = found or check(record)
    return found or _started(record, now)


# ------------------------------------------------------------------------------ values pandas can hold


def _values(record: dict[str, Any], skip: tuple[str, ...] = ()) -> tuple[str, str] | None:
    stack: list[tuple[str, Any]] = [(k, v) for k, v in record.items() if k not in skip]
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


def _knobs(record: dict[str, Any]) -> tuple[str, str] | None:
    """A knob's value is a scalar (text, number, true/false, null); `data` and `quality` may be objects."""
    config = record.get("config")
    if not isinstance(config, dict):
        return None
    for key, value in config.items():
        if key in ("steps", "quality", "data"):
            continue
        if isinstance(value, (list, dict)):
            return f"config.{key}", f"is {shorten(value)}; a knob holds one value (text, number, true/false)"
    return None


# ------------------------------------------------------------------------------------- the id


def config_id(config: dict[str, Any]) -> str:
    """The id of the cell whose record `config` this is; UserError when it is not a cell's config."""
    from ditbench.spec.cell import CellSpec, cell_id

    return cell_id(CellSpec.read(config, "config"))


def _identity(record: dict[str, Any]) -> tuple[str, str] | None:
    config, own = record.get("config"), record.get("cell_id")
    if not isinstance(config, dict) or not isinstance(own, str):
        return None
    try:
        expected = config_id(config)
    except UserError as err:  # "config at `key`: what is wrong" or "config: what is wrong"
        head, _, why = str(err).partition(": ")
        field = f"config.{head[len('config at `') : -1]}" if head.startswith("config at `") else "config"
        return field, f"{why.rstrip('.')}; a record's config is the cell's, as `ditbench run` writes it"
    if own == expected:
        return None
    return "cell_id", (
        f"is {shorten(own)}, which is not the id of the record's config (that config's id is "
        f"{expected}); a record with another cell's id would be compared as that cell"
    )


# -------------------------------------------------------------------------------------- the date


def parse_time(text: Any) -> dt.datetime | None:
    if not isinstance(text, str):
        return None
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=dt.timezone.utc)


def _started(record: dict[str, Any], now: dt.datetime | None) -> tuple[str, str] | None:
    when = parse_time(record.get("started_at"))
    now = now or dt.datetime.now(dt.timezone.utc)
    if when is not None and when > now + FUTURE_SLACK:
        return "started_at", (
            f"is {shorten(record['started_at'])}, in the future (now is "
            f"{now.isoformat(timespec='seconds').replace('+00:00', 'Z')}); a record states when it ran"
        )
    return None


# ------------------------------------------------------------------------------------- the rates


def _positive(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        v = float(value)
    except OverflowError:  # an integer beyond floats: the gate names it, nothing to check it against
        return None
    return v if math.isfinite(v) and v > 0 else None


def images_per_step(config: dict[str, Any]) -> float | None:
    """Images one optimizer step consumes: the record's global_batch (batch x GPUs x nodes x grad_accum)."""
    return _positive(config.get("global_batch"))


def _off(have: float, want: float) -> bool:
    return abs(have / want - 1.0) > RATE_TOLERANCE


def _rates(record: dict[str, Any]) -> tuple[str, str] | None:
    metrics, config = record.get("metrics"), record.get("config")
    if record.get("status") != "ok" or not isinstance(metrics, dict) or not isinstance(config, dict):
        return None
    rate = _positive(metrics.get("images_per_s"))
    per_step = images_per_step(config)
    if rate is None or per_step is None:
        return None
    steps_per_s = _positive(metrics.get("steps_per_s"))
    if steps_per_s is not None and _off(rate, steps_per_s * per_step):
        return "metrics.images_per_s", (
            f"is {rate:.4g}, but steps_per_s {steps_per_s:.4g} x {per_step:g} images a step is "
            f"{steps_per_s * per_step:.4g}"
        )
    step_ms = metrics.get("step_ms")
    samples = step_ms.get("samples") if isinstance(step_ms, dict) else None
    if isinstance(samples, list) and samples:
        values = [_positive(s) for s in samples]
        if all(v is not None for v in values):
            implied = per_step * 1000.0 * len(values) / sum(values)  # type: ignore[arg-type]
            if _off(rate, implied):
                return "metrics.images_per_s", (
                    f"is {rate:.4g}, but its {len(values)} per-step samples (mean "
                    f"{sum(values) / len(values):.4g} ms for {per_step:g} images a step) give "  # type: ignore[arg-type]
                    f"{implied:.4g} images/s"
                )
    return None
