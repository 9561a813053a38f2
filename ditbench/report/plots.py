"""Figures a reader would rather look at than read, as PNG bytes.

Matplotlib's object API with the Agg canvas (no pyplot, no global backend switch), so plotting
works on headless CI machines and inside any host program. Every figure has one panel per model;
colour says the precision and a dashed line says gradient checkpointing, in every figure alike.
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
from matplotlib.ticker import NullLocator

from ditbench.fileio import write_atomic
from ditbench.report.analysis import IMG_S, knobs, memory_metric, varying_knobs
from ditbench.report.load import column

PRECISION_COLOURS = {"fp32": "#1f77b4", "tf32": "#ff7f0e", "bf16": "#2ca02c", "fp16": "#d62728"}
OTHER_COLOURS = ["#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"]
CELL_COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]
CKPT_STYLES = {"none": "-", "full": "--"}
DPI = 100
PLOT_FILES = {"throughput": "throughput.png", "memory": "memory.png", "smoke_loss": "smoke_loss.png"}


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
    fig = Figure(figsize=(4.6 * ncols, 3.6 * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel().tolist()
    for ax in axes[n:]:
        ax.set_visible(False)
    fig.suptitle(title)
    return fig, axes[:n]


def _series(df: pd.DataFrame) -> dict[tuple, pd.DataFrame]:
    """Rows grouped into lines: every varying knob except model and batch size splits a line."""
    split = varying_knobs(df, exclude=("model", "batch_size"))
    groups: dict[tuple, list] = {}
    for label, row in df.iterrows():
        k = knobs(row["record"])
        key = tuple((name, k.get(name)) for name in split)
        groups.setdefault(key, []).append(label)
    return {
        key: df.loc[labels] for key, labels in sorted(groups.items(), key=lambda kv: _series_order(kv[0]))
    }


def _series_order(key: tuple) -> tuple:
    order = {"fp32": 0, "tf32": 1, "bf16": 2, "fp16": 3, "none": 0, "full": 1}
    return tuple((order.get(v, 9), str(v)) for _, v in key)


def _style(key: tuple, row: pd.Series, i: int) -> dict:
    precision = row.get("config.precision")
    ckpt = row.get("config.grad_ckpt")
    colour = PRECISION_COLOURS.get(precision, OTHER_COLOURS[i % len(OTHER_COLOURS)])
    label = " ".join(
        f"{v}" if n in ("precision",) else f"ckpt={v}" if n == "grad_ckpt" else f"{n}={v}" for n, v in key
    ) or str(precision)
    return {"color": colour, "linestyle": CKPT_STYLES.get(ckpt, ":"), "label": label}


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


MAX_LEGEND = 12  # beyond this a legend hides the plot; the tables name every cell anyway


def _legend(ax, extra: list | None = None) -> None:
    handles, _ = ax.get_legend_handles_labels()
    if len(handles) > MAX_LEGEND:
        ax.set_title(f"{ax.get_title()} ({len(handles)} lines, legend omitted)", fontsize="medium")
        return
    if handles or extra:
        ax.legend(handles=handles + (extra or []), fontsize="small")


_OOM_HANDLE = Line2D([], [], marker="x", linestyle="none", color="black", label="out of memory")


def throughput_figure(df: pd.DataFrame) -> Figure | None:
    """images/s against batch size, a line per precision (and checkpointing), a panel per model."""
    if not column(df[df["status"] == "ok"], IMG_S).notna().any():
        return None
    models = _models(df)
    multi_gpu = (column(df, "config.gpus").fillna(1) > 1).any()
    fig, axes = _panels(len(models), "Throughput against batch size")
    for ax, model in zip(axes, models, strict=True):
        sub = df[df["config.model"] == model]
        any_oom = False
        for i, (key, rows) in enumerate(_series(sub).items()):
            style = _style(key, rows.iloc[0], i)
            ok = rows[(rows["status"] == "ok") & column(rows, IMG_S).notna()]
            ok = ok.assign(_bs=column(ok, "config.batch_size")).sort_values("_bs")
            if len(ok):  # a line with no ok cell (fp16 on a CPU) would only clutter the legend
                ax.plot(ok["_bs"], column(ok, IMG_S), marker="o", **style)
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
        ax.set_ylim(bottom=0)
        ax.set_title(model)
        ax.set_ylabel("images/s (all GPUs)" if multi_gpu else "images/s")
        _legend(ax, [_OOM_HANDLE] if any_oom else [])
    return fig


def memory_figure(df: pd.DataFrame) -> Figure | None:
    """Peak memory against batch size, with and without checkpointing, and the card's budget."""
    mem_col, mem_label = memory_metric(df)
    if not column(df[df["status"] == "ok"], mem_col).notna().any():
        return None
    models = _models(df)
    fig, axes = _panels(len(models), "Peak memory against batch size")
    for ax, model in zip(axes, models, strict=True):
        sub = df[df["config.model"] == model]
        budgets = sorted(set(column(sub, "config.gpu_memory_gb").dropna()))
        ok_mem = column(sub[sub["status"] == "ok"], mem_col)  # a failed cell's memory is not a data point
        top = max(ok_mem.max(skipna=True) if ok_mem.notna().any() else 0, max(budgets, default=0))
        oom_y = budgets[0] if budgets else top * 1.05
        any_oom = False
        for i, (key, rows) in enumerate(_series(sub).items()):
            style = _style(key, rows.iloc[0], i)
            ok = rows[(rows["status"] == "ok") & column(rows, mem_col).notna()]
            ok = ok.assign(_bs=column(ok, "config.batch_size")).sort_values("_bs")
            if len(ok):
                ax.plot(ok["_bs"], column(ok, mem_col), marker="o", **style)
            oom = rows[rows["status"] == "oom"]
            if len(oom):
                any_oom = True
                ax.plot(
                    column(oom, "config.batch_size"),
                    np.full(len(oom), oom_y),
                    "x",
                    color=style["color"],
                    markersize=8,
                )
        for budget in budgets:
            ax.axhline(budget, color="black", linewidth=1.2, linestyle="-.", label=f"budget {budget:g} GiB")
        _batch_axis(ax, column(sub, "config.batch_size").dropna().tolist())
        ax.set_ylim(bottom=0, top=max(top, oom_y) * 1.12 or 1)
        ax.set_title(model)
        ax.set_ylabel(mem_label)
        _legend(ax, [_OOM_HANDLE] if any_oom else [])
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
    fig, axes = _panels(len(models), "Smoke-run training loss")
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
        _legend(ax)
    return fig


FIGURES = {"throughput": throughput_figure, "memory": memory_figure, "smoke_loss": smoke_loss_figure}


def render_plots(df: pd.DataFrame) -> dict[str, bytes]:
    """name -> PNG bytes for every figure the data supports (a CPU run has no GPU memory, say)."""
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
