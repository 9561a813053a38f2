"""Figures a reader would rather look at than read, as PNG bytes.

Matplotlib's object API with the Agg canvas (no pyplot, no global backend switch), so plotting
works on headless CI machines and inside any host program. Every figure has one panel per model
and one legend below the panels, where it cannot cover a point. Colour says the precision in every
figure; in line figures the marker also says the precision and a dashed line says checkpointing,
and the points of different lines at one batch size are nudged sideways so that equal values
(bf16 and fp16 often are) stay visible; in the speed-against-memory figure the marker says
checkpointing and each point is labelled with its batch size. Every speed point carries a bar from
the images/s of its p90 step time to that of its p10 step time (figures.speed_spread), and a noisy
cell is ringed. Memory reads in MiB on a panel where every value is below 1 GiB.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import NullLocator

from ditbench.fileio import write_atomic
from ditbench.report.cells import knobs, value_order, varying_knobs
from ditbench.report.figures import (
    CELL_COLOURS,
    CKPT_STYLES,
    DODGE_OCTAVES,
    IMG_S,
    NOISY_RING,
    OTHER_COLOURS,
    PLOT_FILES,
    PLOT_TITLES,
    PRECISION_COLOURS,
    PRECISION_MARKERS,
    SPREAD_HANDLE,
    budget_lines,
    figure_legend,
    figure_png,
    memory,
    memory_label,
    memory_unit,
    panel_models,
    panels,
    speed_spread,
    spread_bars,
)
from ditbench.report.load import column
from ditbench.report.memory import cell_budget, metrics_of, needs_more_than
from ditbench.report.speed_memory import speed_memory_figure

__all__ = ["PLOT_FILES", "PLOT_TITLES", "render_plots", "save_plots", "speed_memory_figure"]


def _split(df: pd.DataFrame) -> list[str]:
    """The knobs that make a line: those varying across the whole report except model and batch size
    (decided once for all panels, so a line has one name and one style in every panel)."""
    return varying_knobs(df, exclude=("model", "batch_size"))


def _series(df: pd.DataFrame, split: list[str]) -> dict[tuple, pd.DataFrame]:
    """Rows grouped into lines by the values of `split`."""
    groups: dict[tuple, list] = {}
    for label, row in df.iterrows():
        k = knobs(row["record"])
        key = tuple((name, k.get(name)) for name in split)
        groups.setdefault(key, []).append(label)
    return {
        key: df.loc[labels]
        for key, labels in sorted(groups.items(), key=lambda kv: tuple(value_order(v) for _, v in kv[0]))
    }


def _style(key: tuple, row: pd.Series, i: int) -> dict:
    precision = row.get("config.precision")
    ckpt = row.get("config.grad_ckpt")
    colour = PRECISION_COLOURS.get(precision, OTHER_COLOURS[i % len(OTHER_COLOURS)])
    label = " ".join(
        f"{v}" if n in ("precision",) else f"ckpt={v}" if n == "grad_ckpt" else f"{n}={v}" for n, v in key
    ) or str(precision)
    return {
        "color": colour,
        "linestyle": CKPT_STYLES.get(ckpt, ":"),
        "marker": PRECISION_MARKERS.get(precision, "o"),
        "markerfacecolor": "white" if ckpt not in (None, "none") else colour,  # hollow: checkpointing
        "label": label,
    }


def _dodge(x: pd.Series, i: int, n: int) -> pd.Series:
    return x * 2 ** ((i - (n - 1) / 2) * DODGE_OCTAVES)


def _batch_axis(ax, batches: list[float]) -> None:
    if not batches:
        return
    ax.set_xscale("log", base=2)
    ticks = sorted(set(batches))
    ax.set_xticks(ticks)
    ax.set_xticklabels([f"{b:g}" for b in ticks])
    ax.xaxis.set_minor_locator(NullLocator())
    lo, hi = min(ticks), max(ticks)
    ax.set_xlim(lo / 1.4, hi * 1.4)
    ax.set_xlabel("batch size per GPU")
    ax.grid(True, alpha=0.3)


_OOM_HANDLE = Line2D([], [], marker="x", linestyle="none", color="black", label="out of memory")
_NOISY_HANDLE = Line2D(
    [], [], marker="o", linestyle="none", markerfacecolor="none", markeredgecolor=NOISY_RING,
    markeredgewidth=2, markersize=11, label="noisy (unsteady step times)",
)  # fmt: skip


def throughput_figure(df: pd.DataFrame) -> Figure | None:
    """images/s against batch size, a line per precision (and checkpointing), a panel per model."""
    if not column(df[df["status"] == "ok"], IMG_S).notna().any():
        return None
    models = panel_models(df)
    multi_gpu = (column(df, "config.gpus").fillna(1) > 1).any()
    fig, axes = panels(len(models), PLOT_TITLES["throughput"])
    any_oom = any_noisy = any_spread = False
    split = _split(df)
    for ax, model in zip(axes, models, strict=True):
        sub = df[df["config.model"] == model]
        series = _series(sub, split)
        for i, (key, rows) in enumerate(series.items()):
            style = _style(key, rows.iloc[0], i)
            ok = rows[(rows["status"] == "ok") & column(rows, IMG_S).notna()]
            ok = ok.assign(_bs=column(ok, "config.batch_size")).sort_values("_bs")
            if len(ok):  # a line with no ok cell (fp16 on a CPU) would only clutter the legend
                x = _dodge(ok["_bs"], i, len(series))
                ax.plot(x, column(ok, IMG_S), **style)
                spread_bars(ax, x, ok, style["color"])
                any_spread = any_spread or column(ok, "metrics.step_ms.p10").notna().any()
                noisy = [metrics_of(r).get("noisy") is True for _, r in ok.iterrows()]
                if any(noisy):
                    any_noisy = True
                    ax.scatter(
                        x[noisy], column(ok, IMG_S)[noisy], s=150, facecolors="none",
                        edgecolors=NOISY_RING, linewidths=2, zorder=4,
                    )  # fmt: skip
            oom = rows[rows["status"] == "oom"]
            if len(oom):
                any_oom = True
                ax.plot(
                    column(oom, "config.batch_size"),
                    np.zeros(len(oom)),
                    "x",
                    color=style["color"],
                    markersize=8,
                    clip_on=False,
                )
        _batch_axis(ax, column(sub, "config.batch_size").dropna().tolist())
        ok_rows = sub[sub["status"] == "ok"]
        top = pd.concat([column(ok_rows, IMG_S), speed_spread(ok_rows)[1]]).max(skipna=True)
        ax.set_ylim(0, (top if top == top and top > 0 else 1) * 1.1)
        ax.set_title(model)
        ax.set_ylabel("images/s (all GPUs)" if multi_gpu else "images/s")
    handles = [(_OOM_HANDLE, any_oom), (_NOISY_HANDLE, any_noisy), (SPREAD_HANDLE, any_spread)]
    figure_legend(fig, axes, [h for h, shown in handles if shown])
    return fig


def memory_figure(df: pd.DataFrame) -> Figure | None:
    """The memory that decides fit against batch size, and each card budget on the same measure."""
    ok_all = df[df["status"] == "ok"]
    if not len(ok_all) or not memory(ok_all).notna().any():
        return None
    models = panel_models(df)
    fig, axes = panels(len(models), PLOT_TITLES["memory"])
    any_oom = False
    split = _split(df)
    for ax, model in zip(axes, models, strict=True):
        sub = df[df["config.model"] == model]
        budgets = budget_lines(sub)
        ok_mem = memory(sub[sub["status"] == "ok"])  # a failed cell's memory is not a data point
        top = max(ok_mem.max(skipna=True) if ok_mem.notna().any() else 0, max(budgets, default=0))
        scale, unit = memory_unit(top)
        top *= scale
        series = _series(sub, split)
        for i, (key, rows) in enumerate(series.items()):
            style = _style(key, rows.iloc[0], i)
            ok = rows[rows["status"] == "ok"]
            ok = ok.assign(_bs=column(ok, "config.batch_size"), _mem=memory(ok) * scale)
            ok = ok.dropna(subset=["_mem"]).sort_values("_bs")
            if len(ok):
                ax.plot(_dodge(ok["_bs"], i, len(series)), ok["_mem"], **style)
            oom = rows[rows["status"] == "oom"]
            if len(oom):
                any_oom = True
                # at the cap it exceeded; without a cap, on the top edge: "more than this chart shows"
                need = [needs_more_than(r) if cell_budget(r) else None for _, r in oom.iterrows()]
                bs = column(oom, "config.batch_size").tolist()
                at_cap = [(b, n) for b, n in zip(bs, need, strict=True) if n is not None]
                above = [b for b, n in zip(bs, need, strict=True) if n is None]
                if at_cap:
                    xs, ys = zip(*at_cap, strict=True)
                    ax.plot(xs, [y * scale for y in ys], "x", color=style["color"], markersize=8)
                if above:  # an empty line off the axes would collapse the layout
                    ax.plot(
                        above,
                        [1.0] * len(above),
                        "x",
                        color=style["color"],
                        markersize=8,
                        clip_on=False,
                        transform=ax.get_xaxis_transform(),
                    )
        for gib, text in budgets.items():
            ax.axhline(gib * scale, color="black", linewidth=1.2, linestyle="-.", label=text)
        _batch_axis(ax, column(sub, "config.batch_size").dropna().tolist())
        ax.set_ylim(bottom=0, top=top * 1.12 or 1)
        ax.set_title(model)
        ax.set_ylabel(memory_label(sub[sub["status"] == "ok"], unit))
    oom = Line2D(
        [], [], marker="x", linestyle="none", color="black", label="out of memory (at its cap, or above)"
    )
    figure_legend(fig, axes, [oom] if any_oom else [])
    return fig


def _smoothed(loss: np.ndarray) -> np.ndarray:
    window = max(1, len(loss) // 25)
    if window == 1:
        return loss
    kernel = np.ones(window) / window
    head = np.cumsum(loss[: window - 1]) / np.arange(1, window)  # growing window at the start
    return np.concatenate([head, np.convolve(loss, kernel, mode="valid")])


def smoke_loss_figure(df: pd.DataFrame) -> Figure | None:
    """Training loss of the smoke runs: raw per step (faint) and a moving average."""
    curves = []
    for _, row in df.iterrows():
        loss = row["record"].smoke.loss if row["record"].smoke is not None else None
        if loss is not None and len(loss) > 1:
            curves.append((row, np.array([np.nan if v is None else v for v in loss], dtype=float)))
    if not curves:
        return None
    models = list(dict.fromkeys(str(r.get("config.model")) for r, _ in curves))
    fig, axes = panels(len(models), PLOT_TITLES["smoke_loss"])
    for ax, model in zip(axes, models, strict=True):
        mine = [r for r in curves if str(r[0].get("config.model")) == model]
        by_precision = len({r.get("config.precision") for r, _ in mine}) == len(mine)
        for i, (row, loss) in enumerate(mine):
            colour = (
                PRECISION_COLOURS.get(row.get("config.precision")) if by_precision else None
            ) or CELL_COLOURS[i % len(CELL_COLOURS)]
            steps = np.arange(1, len(loss) + 1)
            ax.plot(steps, loss, color=colour, alpha=0.25, linewidth=0.8)
            finite = np.where(np.isfinite(loss), loss, np.nanmean(loss) if np.isfinite(loss).any() else 0)
            name = str(row.get("cell_name") or row.get("cell_id")).removeprefix(f"{model} ")
            ax.plot(
                steps,
                _smoothed(finite),
                color=colour,
                linestyle=CKPT_STYLES.get(row.get("config.grad_ckpt"), ":"),
                label=name,
            )
        ax.set_title(model)
        ax.set_xlabel("step")
        ax.set_ylabel("loss")
        ax.grid(True, alpha=0.3)
    figure_legend(fig, axes)
    return fig


FIGURES = {
    "speed_memory": speed_memory_figure,
    "throughput": throughput_figure,
    "memory": memory_figure,
    "smoke_loss": smoke_loss_figure,
}


def render_plots(df: pd.DataFrame) -> dict[str, bytes]:
    """name -> PNG bytes for every figure the data supports (no ok cell, no figure)."""
    out = {}
    for name, make in FIGURES.items():
        fig = make(df)
        if fig is not None:
            out[name] = figure_png(fig)
    return out


def save_plots(df: pd.DataFrame, out_dir: str | Path) -> dict[str, Path]:
    """Write the PNG files into out_dir; name -> path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, png in render_plots(df).items():
        paths[name] = write_atomic(out_dir / PLOT_FILES[name], png)
    return paths
