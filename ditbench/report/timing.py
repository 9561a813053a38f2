"""Training time a reader can plan with: time to N steps and GPU-hours per million images.

Time to N steps is N / the measured steps/s at the cell's global batch, on the GPUs the cell used
(gpus x nodes). The DiT paper trains at global batch 256 and reports its model table at 400,000
steps, so N defaults to 400,000; a suite's `target_steps` (or `ditbench report --target-steps`)
overrides it. A cell at another global batch sees another number of images in N steps, and the
figure says so. GPU-hours per million images = GPUs x 10^6 / images/s / 3600, a per-image cost that
does not depend on the batch.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from ditbench.errors import UserError
from ditbench.records.metrics import IMAGES_PER_S, STEPS_PER_S
from ditbench.report.cells import gpu_count
from ditbench.report.load import value

DEFAULT_TARGET_STEPS = 400_000
PAPER_GLOBAL_BATCH = 256
MAX_TARGET_STEPS = 10**12


def target_steps(df: pd.DataFrame, override: int | None = None) -> tuple[int, str]:
    """(N, where it came from): the report option, else the suite's target_steps, else 400,000."""
    if override is not None:
        check_target_steps(override, "--target-steps")
        return int(override), "given with --target-steps"
    found = set()
    for record in df["record"]:
        v = record.get("target_steps")
        if isinstance(v, int) and not isinstance(v, bool) and 0 < v <= MAX_TARGET_STEPS:
            found.add(v)
    if len(found) == 1:
        return found.pop(), "the suite's target_steps"
    if len(found) > 1:
        raise UserError(
            f"the records name different target_steps ({', '.join(f'{n:,}' for n in sorted(found))}); "
            "give one with --target-steps N."
        )
    return DEFAULT_TARGET_STEPS, "default: the DiT paper's checkpoint for its model table"


def check_target_steps(n: Any, where: str) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or not 0 < n <= MAX_TARGET_STEPS:
        raise UserError(f"{where} must be a whole number of steps from 1 to {MAX_TARGET_STEPS:,}, got {n!r}.")
    return n


def time_to_steps_s(row: pd.Series | dict[str, Any], steps: int) -> float | None:
    sps = value(row, STEPS_PER_S.path)
    return steps / sps if sps else None


def gpu_hours_per_million_images(row: pd.Series | dict[str, Any]) -> float | None:
    img_s = value(row, IMAGES_PER_S.path)
    return gpu_count(row) * 1e6 / img_s / 3600 if img_s else None


def duration_text(seconds: float | None) -> str:
    """Hours below two days, days above; minutes below an hour."""
    if seconds is None or seconds != seconds:
        return "—"
    hours = seconds / 3600
    if hours < 1:
        return f"{seconds / 60:.0f} min"
    if hours < 48:
        return f"{hours:.1f} h"
    days = hours / 24
    return f"{days:.1f} days" if days < 1000 else f"{days:,.0f} days"


def global_batch(row: pd.Series | dict[str, Any]) -> int | None:
    """The record's global batch (`spec.knobs.Knobs.global_batch`, which every record's config states)."""
    gb = value(row, "config.global_batch")
    return int(gb) if gb is not None else None


def time_text(row: pd.Series | dict[str, Any], steps: int) -> str:
    """'12.4 days on 1 GPU (global batch 32, not the paper's 256)'."""
    seconds = time_to_steps_s(row, steps)
    if seconds is None:
        return "—"
    n = gpu_count(row)
    where = "the CPU" if on_cpu(row) else f"{n} GPU{'s' if n > 1 else ''}"
    text = f"{duration_text(seconds)} on {where}"
    gb = global_batch(row)
    if gb is not None and gb != PAPER_GLOBAL_BATCH:
        text += f" (global batch {gb}, not the paper's {PAPER_GLOBAL_BATCH})"
    return text


def gpu_hours_text(row: pd.Series | dict[str, Any]) -> str:
    h = gpu_hours_per_million_images(row)
    if h is None:
        return "—"
    text = f"{h:,.0f}" if h >= 100 else f"{h:.1f}" if h >= 1 else f"{h:.2f}"
    return f"{text} (CPU-hours)" if on_cpu(row) else text


def on_cpu(row: pd.Series | dict[str, Any]) -> bool:
    return row.get("config.device") == "cpu"
