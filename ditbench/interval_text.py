"""How a figure reads beside its interval: to the decimals that two significant digits of the interval's
half-width justify (`73 ± 35`, not `72.9574 ± 35.2100`), never more than the figure's own format gives,
and no rounding of the integer part (`1339 ± 320`). Without a usable interval: the figure's own format.
"""

from __future__ import annotations

import math
import re

SIGNIFICANT = 2  # significant digits of the half-width
_FIXED = re.compile(r"\{:(,?)\.(\d+)f\}")  # a fixed-point format: "{:.4f}", "{:,.1f}"


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
