"""The report's figures, as PNG bytes: speed against memory, throughput and memory against batch size,
the smoke runs' loss. One panel per model; colour says the precision; lines at one batch size are nudged
sideways so equal values (bf16 and fp16 often are) stay visible; a speed point carries a bar from the
images/s of its p90 step time to that of its p10; a noisy cell is ringed.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import NullLocator

from ditbench.report.cells import cell_label, knobs, value_order, varying_knobs
from ditbench.report.figures import (
    CELL_COLOURS,
    CKPT_MARKERS,
    CKPT_STYLES,
    DODGE_OCTAVES,
    IMG_S,
    NOISY_RING,
    OTHER_COLOURS,
    PRECISION_COLOURS,
    PRECISION_MARKERS,
    SPREAD_HANDLE,
    budget_lines,
    figure_legend,
    figure_png,
    legend_marker,
    memory,
    memory_label,
    memory_unit,
    noisy_marker,
    panel_models,
    panels,
    place_labels,
    speed_spread,
    spread_bars,
)
from ditbench.report.load import column, value
from ditbench.report.memory import cell_budget, metrics_of, needs_more_than

PLOT_TITLES = {
    "speed_memory": "Images/s against peak memory, per model",
    "throughput": "Throughput against batch size",
    "memory": "Peak memory against batch size",
    "smoke_loss": "Smoke-run loss curves",
}
PLOT_FILES = {name: f"{name}.png" for name in PLOT_TITLES}


def speed_memory_figure(df: pd.DataFrame) -> Figure | None:
    """images/s against the memory that decides fit; every ok cell a point, the Pareto front, the budgets."""
    ok = df[(df["status"] == "ok") & column(df, IMG_S).notna()]
    ok = ok[memory(ok).notna()] if len(ok) else ok
    if not len(ok):
        return None
    models = panel_models(ok)
    fig, axes = panels(len(models), PLOT_TITLES["speed_memory"])
    precisions, ckpts, any_noisy, any_oom = {}, {}, False, False
    labels: dict = {}  # axes -> [(x, y, text)], placed once the figure is laid out
    for ax, model in zip(axes, models, strict=True):
        sub = df[df["config.model"].astype(str) == model]
        pts = ok[ok["config.model"].astype(str) == model]
        budgets = budget_lines(sub)
        scale, unit = memory_unit(max([float(memory(pts).max()), *budgets]))
        mem, img = memory(pts) * scale, column(pts, IMG_S)
        labels[ax] = []
        for label, row in pts.iterrows():
            precision, ckpt = row.get("config.precision"), row.get("config.grad_ckpt")
            colour = PRECISION_COLOURS.get(precision, OTHER_COLOURS[0])
            precisions.setdefault(str(precision), colour)
            marker, x, y = CKPT_MARKERS.get(ckpt, "D"), mem[label], img[label]
            ckpts.setdefault(str(ckpt), marker)
            if metrics_of(row).get("noisy") is True:
                any_noisy = True
                ax.scatter(x, y, s=190, facecolors="none", edgecolors=NOISY_RING, linewidths=2)
            ax.scatter(x, y, s=46, marker=marker, color=colour, edgecolors="black", linewidths=0.5, zorder=3)
            labels[ax].append((x, y, f"{value(row, 'config.batch_size') or 0:g}"))
            spread_bars(ax, [x], pts.loc[[label]], colour)
        front = _pareto(mem, img)
        ax.plot(  # rings as well as the line, so a front of one cell still shows
            mem[front],
            img[front],
            drawstyle="steps-post",
            color="#555555",
            linewidth=1,
            marker="o",
            markersize=13,
            markerfacecolor="none",
            markeredgecolor="#777777",
            zorder=2,
            label="Pareto front",
        )
        top_x = float(mem.max())
        for gib, text in budgets.items():
            ax.axvline(gib * scale, color="black", linewidth=1.2, linestyle="-.", label=text, zorder=1)
            top_x = max(top_x, gib * scale)
        # Out of memory under a cap: at the cap, on the speed axis' zero. Without a cap the card's size
        # would stretch the axis far past every point: such cells are named under the axis instead.
        capped, beyond = [], []
        for _, r in sub[sub["status"] == "oom"].iterrows():
            need = needs_more_than(r)
            (capped if cell_budget(r) is not None and need is not None else beyond).append((r, need))
        if capped:
            any_oom = True
            xs = [n * scale for _, n in capped]
            _crosses(ax, xs, np.zeros(len(xs)), "black", clip_on=False, zorder=3)
            for r, n in capped:
                labels[ax].append((n * scale, 0.0, f"{value(r, 'config.batch_size') or 0:g}"))
        xlabel = memory_label(pts, unit)
        if beyond:
            names = ", ".join(_short_name(r) for r, _ in beyond[:4]) + (", ..." if len(beyond) > 4 else "")
            xlabel += f"\nout of memory on the whole card: {names}"
        ax.set_xlim(0, top_x * 1.12)
        high = speed_spread(pts)[1].max(skipna=True)  # the spread's top stays on the axes
        ax.set_ylim(0, max(float(img.max()), float(high) if high == high else 0.0) * 1.15)
        ax.set_title(model)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("images/s")
        ax.grid(True, alpha=0.3)
    extra: list = [Patch(color=c, label=p) for p, c in precisions.items()]
    extra += [
        legend_marker(m, f"ckpt={c}", color="#bbbbbb", markeredgecolor="black") for c, m in ckpts.items()
    ]
    if any_noisy:
        extra.append(noisy_marker(12))
    if any_oom:
        extra.append(legend_marker("x", "out of memory at its cap", color="black"))
    extra.append(SPREAD_HANDLE)
    figure_legend(fig, axes, extra)
    fig.draw_without_rendering()  # lay out first: labels are placed in pixels
    for ax, points in labels.items():
        place_labels(ax, points)
    return fig


def _short_name(row: pd.Series) -> str:
    return cell_label(row).removeprefix(f"{row.get('config.model')} ")


def _pareto(mem: pd.Series, img: pd.Series) -> list:
    """Labels of the points no other point beats on both memory (lower) and speed (higher), by memory."""
    order = sorted(mem.index, key=lambda i: (mem[i], -img[i]))
    front, best = [], -math.inf
    for i in order:
        if img[i] > best:
            front.append(i)
            best = img[i]
    return front


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


def _crosses(ax, x, y, colour: str, **style) -> None:
    """A cross at each out-of-memory cell."""
    ax.plot(x, y, "x", color=colour, markersize=8, **style)


def _batch_axis(ax, batches: list[float]) -> None:
    if not batches:
        return
    ax.set_xscale("log", base=2)
    ticks = sorted(set(batches))
    ax.set_xticks(ticks)
    ax.set_xticklabels([f"{b:g}" for b in ticks])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlim(ticks[0] / 1.4, ticks[-1] * 1.4)
    ax.set_xlabel("batch size per GPU")
    ax.grid(True, alpha=0.3)


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
                _crosses(
                    ax, column(oom, "config.batch_size"), np.zeros(len(oom)), style["color"], clip_on=False
                )
        _batch_axis(ax, column(sub, "config.batch_size").dropna().tolist())
        ok_rows = sub[sub["status"] == "ok"]
        top = pd.concat([column(ok_rows, IMG_S), speed_spread(ok_rows)[1]]).max(skipna=True)
        ax.set_ylim(0, (top if top == top and top > 0 else 1) * 1.1)
        ax.set_title(model)
        ax.set_ylabel("images/s (all GPUs)" if multi_gpu else "images/s")
    oom = legend_marker("x", "out of memory", color="black")
    handles = [(oom, any_oom), (noisy_marker(11), any_noisy), (SPREAD_HANDLE, any_spread)]
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
                    _crosses(ax, xs, [y * scale for y in ys], style["color"])
                if above:  # an empty line off the axes would collapse the layout
                    on_top = dict(clip_on=False, transform=ax.get_xaxis_transform())
                    _crosses(ax, above, [1.0] * len(above), style["color"], **on_top)
        for gib, text in budgets.items():
            ax.axhline(gib * scale, color="black", linewidth=1.2, linestyle="-.", label=text)
        _batch_axis(ax, column(sub, "config.batch_size").dropna().tolist())
        ax.set_ylim(bottom=0, top=top * 1.12 or 1)
        ax.set_title(model)
        ax.set_ylabel(memory_label(sub[sub["status"] == "ok"], unit))
    oom = legend_marker("x", "out of memory (at its cap, or above)", color="black")
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
            ax.plot(
                steps,
                _smoothed(finite),
                color=colour,
                linestyle=CKPT_STYLES.get(row.get("config.grad_ckpt"), ":"),
                label=_short_name(row),
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
    return {name: figure_png(fig) for name, make in FIGURES.items() if (fig := make(df)) is not None}
