"""What every ditbench figure shares: colours and markers, panels, one legend below them, the memory a
cell is drawn at. Matplotlib's object API on the Agg canvas (no pyplot): works headless and in any host.
"""

from __future__ import annotations

import io
import math

import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from ditbench.core.units import MIB_PER_GIB
from ditbench.records.metrics import IMAGES_PER_S
from ditbench.report.load import column
from ditbench.report.memory import cell_budget, shown_memory

IMG_S = IMAGES_PER_S.path
PRECISION_COLOURS = {"fp32": "#1f77b4", "tf32": "#ff7f0e", "bf16": "#2ca02c", "fp16": "#d62728"}
PRECISION_MARKERS = {"fp32": "o", "tf32": "D", "bf16": "s", "fp16": "^"}
OTHER_COLOURS = ["#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"]
CELL_COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]
CKPT_STYLES = {"none": "-", "full": "--"}
CKPT_MARKERS = {"none": "o", "full": "s"}  # every_K: "D"
NOISY_RING = "#f0a000"
DODGE_OCTAVES = 0.035  # sideways nudge between lines at one batch size, on the log2 batch axis
DPI = 100
MAX_LEGEND = 16  # beyond this a legend says little; the tables name every cell anyway


def figure_png(fig: Figure) -> bytes:
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
    return buf.getvalue()


def panel_models(df: pd.DataFrame) -> list[str]:
    return list(dict.fromkeys(df["config.model"].astype(str)))


def panels(n: int, title: str) -> tuple[Figure, list]:
    ncols = min(3, n)
    nrows = math.ceil(n / ncols)
    fig = Figure(figsize=(4.8 * ncols, 3.8 * nrows + 0.6), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel().tolist()
    for ax in axes[n:]:
        ax.set_visible(False)
    fig.suptitle(title)
    return fig, axes[:n]


def figure_legend(fig: Figure, axes: list, extra: list | None = None) -> None:
    """One legend for the whole figure, below the panels (it never covers a point)."""
    seen: dict[str, object] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            seen.setdefault(label, handle)
    for handle in extra or []:
        seen.setdefault(handle.get_label(), handle)
    if not seen:
        return
    if len(seen) > MAX_LEGEND:
        fig.suptitle(f"{fig.get_suptitle()} ({len(seen)} lines, legend omitted: see the tables)")
        return
    fig.legend(
        list(seen.values()),
        list(seen),
        loc="outside lower center",
        ncols=min(4, len(seen)),
        fontsize="small",
        frameon=False,
    )


def budget_lines(sub: pd.DataFrame) -> dict[float, str]:
    """GiB -> legend label of each card budget the model's cells ran under."""
    out: dict[float, str] = {}
    for _, row in sub.iterrows():
        budget = cell_budget(row)
        if budget is not None:
            out.setdefault(budget.gib, f"budget: {budget.name}")
    return dict(sorted(out.items()))


def memory(rows: pd.DataFrame) -> pd.Series:
    return pd.Series([shown_memory(r)[0] for _, r in rows.iterrows()], index=rows.index, dtype=float)


def memory_label(rows: pd.DataFrame, unit: str = "GiB") -> str:
    labels = list(
        dict.fromkeys(shown_memory(r)[1] for _, r in rows.iterrows() if shown_memory(r)[0] is not None)
    )
    return (" / ".join(labels) or "peak memory") + f" ({unit})"


def memory_unit(largest_gib: float) -> tuple[float, str]:
    """(factor from GiB, unit) an axis reads in: MiB when everything on it is below 1 GiB (core/units.py)."""
    return (1.0, "GiB") if largest_gib >= 1 else (float(MIB_PER_GIB), "MiB")


def speed_spread(rows: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """images/s at the window's p90 and p10 step times (its rate scaled by median/p90 and median/p10):
    the step times' spread on the speed axis; NaN where a record has no per-step times."""
    img, median = column(rows, IMG_S), column(rows, "metrics.step_ms.median")
    p10, p90 = column(rows, "metrics.step_ms.p10"), column(rows, "metrics.step_ms.p90")
    return img * median / p90, img * median / p10


def legend_marker(marker: str, label: str, **style) -> Line2D:
    return Line2D([], [], marker=marker, linestyle="none", label=label, **style)


def noisy_marker(size: float) -> Line2D:
    ring = dict(markerfacecolor="none", markeredgecolor=NOISY_RING, markeredgewidth=2, markersize=size)
    return legend_marker("o", "noisy (unsteady step times)", **ring)


SPREAD_HANDLE = legend_marker("|", "p10–p90 of step times", color="#555555", markersize=10)


def spread_bars(ax, x, rows: pd.DataFrame, colour: str) -> None:
    """Vertical p10-p90 bars at x for the rows' images/s (nothing where the spread is unknown)."""
    lo, hi = speed_spread(rows)
    img = column(rows, IMG_S)
    known = (lo.notna() & hi.notna()).to_numpy()
    if known.any():
        err = [(img - lo).clip(lower=0)[known], (hi - img).clip(lower=0)[known]]
        ax.errorbar(
            list(pd.Series(list(x))[known]), img[known], yerr=err, fmt="none", ecolor=colour,
            elinewidth=1, capsize=2.5, alpha=0.8, zorder=2,
        )  # fmt: skip


# ---------------------------------------------------------------------------------- point labels

LABEL_FONT = 7  # points


def place_labels(ax, points: list[tuple[float, float, str]], radius_px: float = 9.0) -> None:
    """Label points, deterministically, so that no label covers another label or a point. Points on the
    same pixel share one label ("4, 8"); each label takes the first spot around its point that overlaps
    nothing placed yet and stays inside the axes, else the least-overlapping one. Needs the figure laid
    out (fig.draw_without_rendering())."""
    dpi = ax.figure.dpi
    to_px = ax.transData.transform
    merged: list[list] = []
    for x, y, text in sorted(points, key=lambda p: (p[0], p[1], p[2])):
        px, py = to_px((x, y))
        for m in merged:
            if abs(m[0] - px) < 4 and abs(m[1] - py) < 4:
                m[2].append(text)
                break
        else:
            merged.append([px, py, [text], x, y])
    r = radius_px
    taken = [(m[0] - r, m[1] - r, m[0] + r, m[1] + r) for m in merged]  # the markers themselves
    frame = ax.bbox.extents
    height = LABEL_FONT * dpi / 72 * 1.25
    for px, py, texts, x, y in merged:
        text = ", ".join(dict.fromkeys(texts))
        width = len(text) * LABEL_FONT * dpi / 72 * 0.62
        spots = [
            (r + 1, -height / 2), (r, r * 0.3), (-r - 1 - width, -height / 2), (r, -r * 0.3 - height),
            (-width / 2, r + 1), (-width / 2, -r - 1 - height), (r + 1, r + 1), (r + 1, -r - 1 - height),
            (-r - 1 - width, r + 1), (-r - 1 - width, -r - 1 - height), (2 * r + 2, -height / 2),
            (-2 * r - 2 - width, -height / 2), (-width / 2, 2 * r + 2), (-width / 2, -2 * r - 2 - height),
        ]  # fmt: skip
        boxes = [(px + dx, py + dy, px + dx + width, py + dy + height) for dx, dy in spots]
        costs = [  # area over labels and points, and (twice) area outside the axes
            sum(_overlap(b, t) for t in taken) + 2 * (width * height - _overlap(b, frame)) for b in boxes
        ]
        dx, dy = spots[costs.index(min(costs))]  # the first of equal costs: the order above
        taken.append((px + dx, py + dy, px + dx + width, py + dy + height))
        label = ax.annotate(
            text, (x, y), xytext=(dx * 72 / dpi, dy * 72 / dpi), textcoords="offset points",
            fontsize=LABEL_FONT, color="#333333", ha="left", va="bottom", annotation_clip=False,
        )  # fmt: skip
        label.set_in_layout(False)  # the layout that placed it must not move under it


def _overlap(a: tuple, b: tuple) -> float:
    w = min(a[2], b[2]) - max(a[0], b[0])
    h = min(a[3], b[3]) - max(a[1], b[1])
    return w * h if w > 0 and h > 0 else 0.0
