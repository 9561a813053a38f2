"""Seeded percentile-bootstrap intervals of medians: the gate's timing change and the claims' ratios.

Seeded so that the same records always give the same interval (a report or a gate that changes
between two runs on the same files would be noise of its own making).
"""

from __future__ import annotations

import numpy as np

BOOTSTRAP_B = 1000  # resamples: cheap (a median of B x n values a side), enough for 95% ends
BOOTSTRAP_SEED = 0
LEVEL = 0.95


def _ends(values: np.ndarray, level: float) -> tuple[float, float]:
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(values, [tail, 100 - tail])
    return float(low), float(high)


def _medians(x: np.ndarray, rng: np.random.Generator, b: int) -> np.ndarray:
    return np.median(x[rng.integers(0, len(x), (b, len(x)))], axis=1)


def median_interval(
    values: list[float], b: int = BOOTSTRAP_B, level: float = LEVEL, seed: int = BOOTSTRAP_SEED
) -> tuple[float, float]:
    """A percentile bootstrap interval of the median of `values` (resampled with replacement)."""
    return _ends(_medians(np.asarray(values, dtype=float), np.random.default_rng(seed), b), level)


def median_ratio_interval(
    base: list[float],
    new: list[float],
    b: int = BOOTSTRAP_B,
    level: float = LEVEL,
    seed: int = BOOTSTRAP_SEED,
) -> tuple[float, float, float]:
    """(median(new) / median(base), low, high): a percentile bootstrap interval of that ratio,
    each side resampled with replacement."""
    x, y = np.asarray(base, dtype=float), np.asarray(new, dtype=float)
    rng = np.random.default_rng(seed)
    ratios = _medians(y, rng, b) / _medians(x, rng, b)
    return (float(np.median(y) / np.median(x)), *_ends(ratios, level))
