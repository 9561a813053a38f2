"""How far a metric moved between two runs, and whether that crosses the policy's rule. The metrics
themselves (path, direction, label, default threshold) are declared in ditbench.records.metrics."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ditbench.records.metrics import HIGHER, Metric


@dataclass(frozen=True)
class Crossing:
    change_pct: float | None  # signed (new - base) / |base|; None when base is 0 (no finite percentage)
    direction: str  # "worse", "better" or "same"
    crossed: bool  # moved beyond the threshold (percent and min_abs) in that direction

    def verdict(self, significant: bool) -> str:
        """regression / improvement for a significant crossing, noise for another, else unchanged."""
        if not self.crossed:
            return "unchanged"
        if not significant:
            return "noise"
        return "regression" if self.direction == "worse" else "improvement"


def crossing(metric: Metric, base: float, new: float, threshold_pct: float, min_abs: float) -> Crossing:
    """How far new moved from base, and whether that crosses the rule. Values must be finite."""
    delta = new - base
    worse = -delta if metric.direction == HIGHER else delta  # > 0: moved the wrong way
    moved = direction(worse)
    change = delta / abs(base) * 100 if base != 0 else None
    if change is not None and not math.isfinite(change):
        change = None  # a base near the smallest float: the percentage overflows
    if moved == "same":
        return Crossing(0.0 if change is None else change, moved, False)
    # From a base of 0 any move is infinitely many percent: only min_abs can hold it back.
    pct = abs(change) if change is not None else math.inf
    return Crossing(change, moved, pct > threshold_pct and abs(delta) >= min_abs)


def direction(worse: float) -> str:
    """How a metric moved, from how far it moved the wrong way (> 0: worse)."""
    return "worse" if worse > 0 else "better" if worse < 0 else "same"
