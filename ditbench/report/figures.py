"""What every ditbench figure shares: colours and markers, panels, one legend below the panels, and
the memory each cell is drawn at (the memory that decides fit, or the process's RSS on a CPU).

Matplotlib's object API with the Agg canvas (no pyplot, no global backend switch), so plotting
works on headless CI machines and inside any host program.
"""

from __future__ import annotations

import io
import math

import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from ditbench.report.memory import cell_budget, shown_memory

IMG_S = "metrics.images_per_s"
PRECISION_COLOURS = {"fp32": "#1f77b4", "tf32": "#ff7f0e", "bf16": "#2ca02c", "fp16": "#d62728"}
PRECISION_MARKERS = {"fp32": "o", "tf32": "D", "bf16": "s", "fp16": "^"}
OTHER_COLOURS = ["#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"]
CELL_COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]
CKPT_STYLES = {"none": "-", "full": "--"}
CKPT_MARKERS = {"none": "o", "full": "s"}  # every_K: "D"
NOISY_RING = "#f0a000"
DODGE_OCTAVES = 0.035  # sideways nudge between lines at one batch size, on the log2 batch axis
DPI = 100
PLOT_FILES = {
    "speed_memory": "speed_memory.png",
    "throughput": "throughput.png",
    "memory": "memory.png",
    "smoke_loss": "smoke_loss.png",
}
PLOT_TITLES = {
    "speed_memory": "Images/s against peak memory, per model",
    "throughput": "Throughput against batch size",
    "memory": "Peak memory against batch size",
    "smoke_loss": "Smoke-run loss curves",
}
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


def memory_label(rows: pd.DataFrame) -> str:
    labels = list(
        dict.fromkeys(shown_memory(r)[1] for _, r in rows.iterrows() if shown_memory(r)[0] is not None)
    )
    return (" / ".join(labels) or "peak memory") + " (GiB)"


# ------------------------------------------------------------------------------ speed against memory
