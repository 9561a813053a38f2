"""Every expansion counted from its factors before it is made (a 700-byte suite can name 4x10^9 cells),
and refused above a cap that `--max-cells N` (run, plan) raises."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from ditbench.core.errors import UserError

DEFAULT_MAX_CELLS = 10_000  # the shipped suites have at most a few dozen cells; 10,000 is days of GPU time


def add_max_cells(parser, refuse: str) -> None:
    """`--max-cells N` (`run`, `plan`): `refuse` says what is counted, e.g. "a grid of"."""
    parser.add_argument(
        "--max-cells",
        type=int,
        metavar="N",
        help=f"refuse {refuse} more than N cells, counted before expanding (default: {DEFAULT_MAX_CELLS})",
    )


def matrix_count(axes: Mapping[str, Sequence], n_include: int = 0) -> int:
    """Cells of `axes` x ... (before excludes, which can only remove) plus the includes."""
    return math.prod(len(values) for values in axes.values()) + n_include


def factors(axes: Mapping[str, Sequence], n_include: int = 0) -> str:
    """'model 4 x batch_size 1,000 + 2 include' for a message."""
    text = " x ".join(f"{name} {len(values):,}" for name, values in axes.items()) or "1"
    return text + (f" + {n_include:,} include" if n_include else "")


def over_cap(count: int, cap: int | None, what: str, detail: str) -> str | None:
    """The refusal when `count` exceeds the cap, else None (the caller raises it naming its file)."""
    limit = DEFAULT_MAX_CELLS if cap is None else cap
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise UserError(f"--max-cells must be a positive integer, got {cap!r}.")
    if count <= limit:
        return None
    return (
        f"{what} expands to {count:,} cells ({detail}), above the cap of {limit:,}; nothing was expanded "
        f"or run. Narrow it, or raise the cap with --max-cells {count} if you mean to run them all."
    )


def check_count(count: int, cap: int | None, what: str, detail: str) -> None:
    problem = over_cap(count, cap, what, detail)
    if problem:
        raise UserError(problem)
