"""Figures a reader would rather look at than read, as PNG bytes.

Matplotlib's object API with the Agg canvas (no pyplot, no global backend switch), so plotting
works on headless CI machines and inside any host program. Every figure has one panel per model
and one legend below the panels, where it cannot cover a point. Colour says the precision in every
figure; in line figures the marker also says the precision and a dashed line says checkpointing,
and the points of different lines at one batch size are nudged sideways so that equal values
(bf16 and fp16 often are) stay visible; in the speed-against-memory figure the marker says
checkpointing and each point is labelled with its batch size.
"""

from __future__ import annotations

import io
import math
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import NullLocator

from ditbench.fileio import write_atomic
from ditbench.report.cells import knobs, value_order, varying_knobs
from ditbench.report.load import column, value
from ditbench.report.memory import cell_budget, needs_more_than, shown_memory

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


def _models(df: pd.DataFrame) -> list[str]:
    return list(dict.fromkeys(df["config.model"].astype(str)))


def _panels(n: int, title: str) -> tuple[Figure, list]:
    ncols = min(3, n)
    nrows = math.ceil(n / ncols)
    fig = Figure(figsize=(4.8 * ncols, 3.8 * nrows + 0.6), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel().tolist()
    for ax in axes[n:]:
        ax.set_visible(False)
    fig.suptitle(title)
    return fig, axes[:n]


def _figure_legend(fig: Figure, axes: list, extra: list | None = None) -> None:
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


def _budget_lines(sub: pd.DataFrame) -> dict[float, str]:
    """GiB -> legend label of each card budget the model's cells ran under."""
    out: dict[float, str] = {}
    for _, row in sub.iterrows():
        budget = cell_budget(row)
        if budget is not None:
            out.setdefault(budget.gib, f"budget: {budget.name}")
    return dict(sorted(out.items()))


def _memory(rows: pd.DataFrame) -> pd.Series:
    return pd.Series([shown_memory(r)[0] for _, r in rows.iterrows()], index=rows.index, dtype=float)


def _memory_label(rows: pd.DataFrame) -> str:
    labels = list(
        dict.fromkeys(shown_memory(r)[1] for _, r in rows.iterrows() if shown_memory(r)[0] is not None)
    )
    return (" / ".join(labels) or "peak memory") + " (GiB)"


# ------------------------------------------------------------------------------ speed against memory


def speed_memory_figure(df: pd.DataFrame) -> Figure | None:
    """images/s against the memory that decides fit; every ok cell a point, the Pareto front, the budgets."""
    ok = df[(df["status"] == "ok") & column(df, IMG_S).notna()]
    ok = ok[_memory(ok).notna()] if len(ok) else ok
    if not len(ok):
        return None
    models = _models(ok)
    fig, axes = _panels(len(models), PLOT_TITLES["speed_memory"])
    precisions, ckpts, any_noisy, any_oom = {}, {}, False, False
    for ax, model in zip(axes, models, strict=True):
        sub = df[df["config.model"].astype(str) == model]
        pts = ok[ok["config.model"].astype(str) == model]
        mem, img = _memory(pts), column(pts, IMG_S)
        for label, row in pts.iterrows():
            precision, ckpt = row.get("config.precision"), row.get("config.grad_ckpt")
            colour = PRECISION_COLOURS.get(precision, OTHER_COLOURS[0])
            precisions.setdefault(str(precision), colour)
            ckpts.setdefault(str(ckpt), CKPT_MARKERS.get(ckpt, "D"))
            if (row["record"].get("metrics") or {}).get("noisy") is True:
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
            ax.annotate(
                f"{value(row, 'config.batch_size') or 0:g}",
                (mem[label], img[label]),
                xytext=(5, 3),
                textcoords="offset points",
                fontsize=7,
                color="#333333",
            )
        front = _pareto(mem, img)
        ax.plot(
            mem[front],
            img[front],
            drawstyle="steps-post",
            color="#555555",
            linewidth=1,
            zorder=2,
            label="Pareto front",
        )
        top_x = float(mem.max())
        for gib, text in _budget_lines(sub).items():
            ax.axvline(gib, color="black", linewidth=1.2, linestyle="-.", label=text, zorder=1)
            top_x = max(top_x, gib)
        # Out of memory under a cap: at the cap, on the speed axis' zero. Without a cap the card's size
        # would stretch the axis far past every point: such cells are named under the axis instead.
        capped, beyond = [], []
        for _, r in sub[sub["status"] == "oom"].iterrows():
            need = needs_more_than(r)
            (capped if cell_budget(r) is not None and need is not None else beyond).append((r, need))
        if capped:
            any_oom = True
            xs = [n for _, n in capped]
            ax.plot(xs, np.zeros(len(xs)), "x", color="black", markersize=8, clip_on=False, zorder=3)
            for r, n in capped:
                bs = value(r, "config.batch_size") or 0
                ax.annotate(f"{bs:g}", (n, 0), xytext=(5, 3), textcoords="offset points", fontsize=7)
        xlabel = _memory_label(pts)
        if beyond:
            names = ", ".join(_short_name(r) for r, _ in beyond[:4]) + (", ..." if len(beyond) > 4 else "")
            xlabel += f"\nout of memory on the whole card: {names}"
        ax.set_xlim(0, top_x * 1.12)
        ax.set_ylim(0, float(img.max()) * 1.15)
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
    _figure_legend(fig, axes, extra)
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


def throughput_figure(df: pd.DataFrame) -> Figure | None:
    """images/s against batch size, a line per precision (and checkpointing), a panel per model."""
    if not column(df[df["status"] == "ok"], IMG_S).notna().any():
        return None
    models = _models(df)
    multi_gpu = (column(df, "config.gpus").fillna(1) > 1).any()
    fig, axes = _panels(len(models), PLOT_TITLES["throughput"])
    any_oom = False
    split = _split(df)
    for ax, model in zip(axes, models, strict=True):
        sub = df[df["config.model"] == model]
        series = _series(sub, split)
        for i, (key, rows) in enumerate(series.items()):
            style = _style(key, rows.iloc[0], i)
            ok = rows[(rows["status"] == "ok") & column(rows, IMG_S).notna()]
            ok = ok.assign(_bs=column(ok, "config.batch_size")).sort_values("_bs")
            if len(ok):  # a line with no ok cell (fp16 on a CPU) would only clutter the legend
                ax.plot(_dodge(ok["_bs"], i, len(series)), column(ok, IMG_S), **style)
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
        top = column(sub[sub["status"] == "ok"], IMG_S).max(skipna=True)
        ax.set_ylim(0, (top if top == top and top > 0 else 1) * 1.1)
        ax.set_title(model)
        ax.set_ylabel("images/s (all GPUs)" if multi_gpu else "images/s")
    _figure_legend(fig, axes, [_OOM_HANDLE] if any_oom else [])
    return fig


def memory_figure(df: pd.DataFrame) -> Figure | None:
    """The memory that decides fit against batch size, and each card budget on the same measure."""
    ok_all = df[df["status"] == "ok"]
    if not len(ok_all) or not _memory(ok_all).notna().any():
        return None
    models = _models(df)
    fig, axes = _panels(len(models), PLOT_TITLES["memory"])
    any_oom = False
    split = _split(df)
    for ax, model in zip(axes, models, strict=True):
        sub = df[df["config.model"] == model]
        budgets = _budget_lines(sub)
        ok_mem = _memory(sub[sub["status"] == "ok"])  # a failed cell's memory is not a data point
        top = max(ok_mem.max(skipna=True) if ok_mem.notna().any() else 0, max(budgets, default=0))
        series = _series(sub, split)
        for i, (key, rows) in enumerate(series.items()):
            style = _style(key, rows.iloc[0], i)
            ok = rows[rows["status"] == "ok"]
            ok = ok.assign(_bs=column(ok, "config.batch_size"), _mem=_memory(ok)).dropna(subset=["_mem"])
            ok = ok.sort_values("_bs")
            if len(ok):
                ax.plot(_dodge(ok["_bs"], i, len(series)), ok["_mem"], **style)
            oom = rows[rows["status"] == "oom"]
            if len(oom):
                any_oom = True
                # at the cap it exceeded; without a cap, on the top edge: "more than this chart shows"
                need = [needs_more_than(r) if cell_budget(r) else None for _, r in oom.iterrows()]
                capped = [n is not None for n in need]
                bs = column(oom, "config.batch_size")
                ax.plot(
                    bs[capped], [n for n in need if n is not None], "x", color=style["color"], markersize=8
                )
                ax.plot(
                    bs[[not c for c in capped]],
                    np.ones(len(need) - sum(capped)),
                    "x",
                    color=style["color"],
                    markersize=8,
                    clip_on=False,
                    transform=ax.get_xaxis_transform(),
                )
        for gib, text in budgets.items():
            ax.axhline(gib, color="black", linewidth=1.2, linestyle="-.", label=text)
        _batch_axis(ax, column(sub, "config.batch_size").dropna().tolist())
        ax.set_ylim(bottom=0, top=top * 1.12 or 1)
        ax.set_title(model)
        ax.set_ylabel(_memory_label(sub[sub["status"] == "ok"]))
    oom = Line2D(
        [], [], marker="x", linestyle="none", color="black", label="out of memory (at its cap, or above)"
    )
    _figure_legend(fig, axes, [oom] if any_oom else [])
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
        smoke = row["record"].get("smoke")
        loss = smoke.get("loss") if isinstance(smoke, dict) else None
        if isinstance(loss, list) and len(loss) > 1:
            curves.append((row, np.array([np.nan if v is None else v for v in loss], dtype=float)))
    if not curves:
        return None
    models = list(dict.fromkeys(str(r.get("config.model")) for r, _ in curves))
    fig, axes = _panels(len(models), PLOT_TITLES["smoke_loss"])
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
    _figure_legend(fig, axes)
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
