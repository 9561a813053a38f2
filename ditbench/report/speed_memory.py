"""Speed against memory: per model, images/s against the memory that decides fit, every ok cell a
point (colour: precision, marker: checkpointing, label: batch size, a bar: the p10-p90 spread of
its step times as images/s, a ring: noisy), the Pareto front, and each card budget as a vertical
line on the same memory measure. Memory reads in MiB on a panel where everything is below 1 GiB;
labels are placed so that none covers another or a point (figures.place_labels).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from ditbench.report.figures import (
    CKPT_MARKERS,
    IMG_S,
    NOISY_RING,
    OTHER_COLOURS,
    PLOT_TITLES,
    PRECISION_COLOURS,
    SPREAD_HANDLE,
    budget_lines,
    figure_legend,
    memory,
    memory_label,
    memory_unit,
    panel_models,
    panels,
    place_labels,
    speed_spread,
    spread_bars,
)
from ditbench.report.load import column, value
from ditbench.report.memory import cell_budget, metrics_of, needs_more_than


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
            ckpts.setdefault(str(ckpt), CKPT_MARKERS.get(ckpt, "D"))
            if metrics_of(row).get("noisy") is True:
                any_noisy = True
                ax.scatter(
                    mem[label], img[label], s=190, facecolors="none", edgecolors=NOISY_RING, linewidths=2
                )
            ax.scatter(
                mem[label],
                img[label],
                s=46,
                marker=CKPT_MARKERS.get(ckpt, "D"),
                color=colour,
                edgecolors="black",
                linewidths=0.5,
                zorder=3,
            )
            labels[ax].append((mem[label], img[label], f"{value(row, 'config.batch_size') or 0:g}"))
            spread_bars(ax, [mem[label]], pts.loc[[label]], colour)
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
            ax.plot(xs, np.zeros(len(xs)), "x", color="black", markersize=8, clip_on=False, zorder=3)
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
        Line2D(
            [], [], marker=m, linestyle="none", color="#bbbbbb", markeredgecolor="black", label=f"ckpt={c}"
        )
        for c, m in ckpts.items()
    ]
    if any_noisy:
        ring = dict(markerfacecolor="none", markeredgecolor=NOISY_RING, markeredgewidth=2, markersize=12)
        extra.append(
            Line2D([], [], marker="o", linestyle="none", label="noisy (unsteady step times)", **ring)
        )
    if any_oom:
        extra.append(
            Line2D([], [], marker="x", linestyle="none", color="black", label="out of memory at its cap")
        )
    extra.append(SPREAD_HANDLE)
    figure_legend(fig, axes, extra)
    fig.draw_without_rendering()  # lay out first: labels are placed in pixels
    for ax, points in labels.items():
        place_labels(ax, points)
    return fig


def _short_name(row: pd.Series) -> str:
    return str(row.get("cell_name") or row.get("cell_id")).removeprefix(f"{row.get('config.model')} ")


def _pareto(mem: pd.Series, img: pd.Series) -> list:
    """Labels of the points no other point beats on both memory (lower) and speed (higher), by memory."""
    order = sorted(mem.index, key=lambda i: (mem[i], -img[i]))
    front, best = [], -math.inf
    for i in order:
        if img[i] > best:
            front.append(i)
            best = img[i]
    return front


# ------------------------------------------------------------------------------ against batch size
