"""Seeded percentile-bootstrap intervals of medians (the gate's timing change, the claims' ratios): the
same records always give the same interval. A figure is shown beside its interval to the decimals two
significant digits of the half-width justify (`73 ± 35`, not `72.9574 ± 35.2100`; `1339 ± 320`).
"""

from __future__ import annotations

import math
import re

import numpy as np

BOOTSTRAP_B = 1000  # resamples: cheap (a median of B x n values a side), enough for 95% ends
BOOTSTRAP_SEED = 0
LEVEL = 0.95
SIGNIFICANT = 2  # significant digits of the half-width
_FIXED = re.compile(r"\{:(,?)\.(\d+)f\}")  # a fixed-point format: "{:.4f}", "{:,.1f}"


def _ends(values: np.ndarray) -> tuple[float, float]:
    tail = (1 - LEVEL) / 2 * 100
    low, high = np.percentile(values, [tail, 100 - tail])
    return float(low), float(high)


def _medians(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return np.median(x[rng.integers(0, len(x), (BOOTSTRAP_B, len(x)))], axis=1)


def median_interval(values: list[float]) -> tuple[float, float]:
    """A percentile bootstrap interval of the median of `values` (resampled with replacement)."""
    return _ends(_medians(np.asarray(values, dtype=float), np.random.default_rng(BOOTSTRAP_SEED)))


def median_ratio_interval(
    base: list[float], new: list[float], seed: int = BOOTSTRAP_SEED
) -> tuple[float, float, float]:
    """(median(new) / median(base), low, high): a percentile bootstrap interval, each side resampled."""
    x, y = np.asarray(base, dtype=float), np.asarray(new, dtype=float)
    rng = np.random.default_rng(seed)
    return (float(np.median(y) / np.median(x)), *_ends(_medians(y, rng) / _medians(x, rng)))


def decimals(half_width: float | None, most: int) -> int:
    """Decimals that show SIGNIFICANT digits of `half_width`, within 0..most (`most` without one)."""
    if half_width is None or not math.isfinite(half_width) or half_width <= 0:
        return most
    return max(0, min(most, SIGNIFICANT - 1 - math.floor(math.log10(half_width))))


def _justified(fmt: str, half_width: float | None) -> str:
    """`fmt` with the decimals the half-width justifies; a format that is not fixed-point as it is."""
    fixed = _FIXED.fullmatch(fmt)
    if fixed is None:
        return fmt
    return f"{{:{fixed.group(1)}.{decimals(half_width, int(fixed.group(2)))}f}}"


def plus_minus(value: float, spread: float | None, fmt: str) -> str:
    """`73 ± 35`; the value alone in its own format without a finite spread."""
    if spread is None or not math.isfinite(spread):
        return fmt.format(value)
    shown = _justified(fmt, spread)
    return f"{shown.format(value)} ± {shown.format(spread)}"


def with_ends(value: float, low: float, high: float, fmt: str) -> tuple[str, str, str]:
    """(value, low, high) as text, to the decimals the interval's half-width justifies."""
    half = (high - low) / 2 if math.isfinite(low) and math.isfinite(high) else None
    shown = _justified(fmt, half)
    return shown.format(value), shown.format(low), shown.format(high)
