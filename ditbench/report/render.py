"""report.md, a self-contained report.html and results.csv from a results DataFrame: `build_report`
puts the sections in reading order as blocks that `blocks` renders to markdown and HTML alike.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd

from ditbench import __version__
from ditbench.core.escape import csv_safe
from ditbench.files.fileio import write_atomic
from ditbench.records.metrics import CPU_ALLOC, CPU_RSS, DEVICE_MEM
from ditbench.report import analysis
from ditbench.report.advice import AdviceCheck
from ditbench.report.analysis import PAPER_GLOBAL_BATCH, target_steps
from ditbench.report.blocks import Block, Bullets, Heading, Image, Para, Table, to_html, to_markdown
from ditbench.report.claim_check import ClaimResult
from ditbench.report.memory import emulated_cells, memory_metric
from ditbench.report.plots import PLOT_FILES, PLOT_TITLES, render_plots
from ditbench.report.quality import QUALITY_FILES, quality_caveat, quality_section
from ditbench.report.sections import (
    STATUS_TEXT,
    advice_section,
    claims_section,
    model_section,
    noise_text,
    recommendations,
    steps_text,
)


def build_report(
    df: pd.DataFrame,
    title: str | None = None,
    sources: list[str] | None = None,
    claims: tuple[list[ClaimResult], str, str | None, str | None] | None = None,
    steps: int | None = None,
    advice_checks: list[AdviceCheck] | None = None,
) -> tuple[list[Block], dict[str, bytes]]:
    """The report as blocks, and the PNG plots it refers to (name -> bytes). claims: (results, path,
    source, card); steps: N of "time to N steps" (None: the records' or 400,000); advice_checks: with
    `report --predict`'s predictions (None: checked here)."""
    suites = (
        ", ".join(dict.fromkeys(str(s) for s in df.get("suite", pd.Series(dtype=str)).dropna())) or "results"
    )
    title = title or f"ditbench report: {suites}"
    steps, steps_source = target_steps(df, steps)
    plots = render_plots(df)
    comparison = analysis.baseline_comparison(df)
    blocks: list[Block] = [Heading(1, title)]
    counts = ", ".join(f"{n} {STATUS_TEXT.get(s, s)}" for s, n in df["status"].value_counts().items())
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    runs = ", ".join(dict.fromkeys(str(r) for r in df.get("run_id", pd.Series(dtype=str)).dropna()))
    blocks.append(
        Para(
            f"{len(df)} cells ({counts}) from {', '.join(sources or []) or 'the given results'}; "
            f"run {runs or 'unknown'}; written {when} by ditbench {__version__}."
        )
    )
    blocks += _caveats(df)
    blocks += quality_caveat(df)
    blocks += _environment(df)
    blocks += recommendations(df, steps)
    if "speed_memory" in plots:
        blocks += _speed_memory(df, plots["speed_memory"])
    blocks += advice_section(df, advice_checks)
    quality_blocks, quality_figures = quality_section(df)
    blocks += quality_blocks
    if claims is not None:
        blocks += claims_section(*claims)
    for model in dict.fromkeys(df["config.model"].astype(str)):
        blocks += model_section(df, df[df["config.model"].astype(str) == model], comparison, model, steps)
    rest = {name: png for name, png in plots.items() if name != "speed_memory"}
    if rest:
        blocks.append(Heading(2, "Plots"))
        for name, png in rest.items():
            blocks.append(Image(name, PLOT_TITLES[name], png, PLOT_FILES[name]))
    blocks += _method(df, steps, steps_source)
    return blocks, {**plots, **quality_figures}  # quality figures are named by their file


def _caveats(df: pd.DataFrame) -> list[Block]:
    """What a reader must know before reading any number: emulated cards, noisy cells, several runs."""
    out: list[Block] = []
    for budget, labels in emulated_cells(df).items():
        card = f"the {budget.card}" if budget.card else f"a {budget.gib:g} GiB card"
        out.append(
            Para(
                f"**Emulated card:** {len(labels)} cell(s) were meant for {budget.name} and ran on "
                f"{budget.ran_on()}. Memory and whether a cell fits are {card}'s; speeds, times to a "
                f"target and MFU are the {budget.real_gpu}'s, not {card}'s."
            )
        )
    noisy = [label for label, row in df.iterrows() if noise_text(row)]
    if noisy:
        out.append(
            Para(
                f"**Noisy cells:** {len(noisy)} cell(s) had unsteady step times or a loaded machine (marked "
                "noisy in the tables, with the figure and the bound it exceeded); their speeds are less "
                "certain than the others'. Rerun them on a quiet machine before relying on a small "
                "difference; where other processes took the CPUs, cells with more than one thread also "
                "gain from threads=1."
            )
        )
    if df["cell_id"].duplicated().any():
        out.append(
            Para(
                "**Several runs:** some cells appear more than once (`--keep all`); each model's grid has "
                "one row per run label (`run --label`), or per run where a run has none, and the tables "
                "show each record with its label, run id and start time. Claims use the latest record "
                "of each cell."
            )
        )
    return out


def _speed_memory(df: pd.DataFrame, png: bytes) -> list[Block]:
    _, label = memory_metric(df)
    text = (
        "Each ok cell is a point: images/s against the memory that decides whether it fits a card "
        "(peak reserved + CUDA context where the context was measured, else NVML device memory, else "
        "reserved; on a CPU the allocator's peak, or the peak RSS of a job of several processes). Colour "
        "is the precision, the marker says gradient checkpointing, the label is the batch size per GPU "
        "(one label for cells on the same spot). A bar spans the images/s of the cell's p90 to its p10 "
        "step time (the step-to-step spread); an orange ring marks a noisy cell. The line joins the "
        "Pareto front: the cells no other cell beats on both speed and memory. A vertical line marks "
        "each card budget. Memory reads in MiB on a panel where every value is below 1 GiB."
    )
    if emulated_cells(df):
        text += " Speeds of cells that ran on a capped bigger card are that card's."
    return [
        Heading(2, "Speed against memory"),
        Para(text),
        Image("speed_memory", PLOT_TITLES["speed_memory"], png, PLOT_FILES["speed_memory"]),
    ]


def _environment(df: pd.DataFrame) -> list[Block]:
    env_cols = [c for c in df.columns if c.startswith("env.")]
    rows, mixed = [], []
    for c in env_cols:
        values = list(dict.fromkeys(str(v) for v in df[c].dropna()))
        if len(values) > 1:
            mixed.append(c[4:])
        rows.append([c[4:], " | ".join(values) if values else "—"])
    device = list(dict.fromkeys(str(v) for v in df.get("config.device", pd.Series(dtype=str)).dropna()))
    rows.insert(0, ["device", ", ".join(device) or "—"])
    out: list[Block] = [Heading(2, "Environment"), Table(["key", "value"], rows)]
    if mixed:
        out.append(
            Para(
                f"Warning: these records come from more than one environment ({', '.join(mixed)} "
                "differ); compare numbers across them with care."
            )
        )
    nvml = [str(v) for v in df.get("env.nvml", pd.Series(dtype=object)).dropna()]
    if any(v.startswith("missing") for v in nvml):
        out.append(
            Para(
                f"The driver and the device memory NVML reports ({DEVICE_MEM.path}, CUDA context "
                "included) are empty: nvidia-ml-py was not installed where these records were made "
                "(`pip install 'ditbench[gpu]'`). The allocator's peaks do not need it."
            )
        )
    return out


def _method(df: pd.DataFrame, steps: int, steps_source: str) -> list[Block]:
    _, mem_label = memory_metric(df)
    return [
        Heading(2, "How to read this report"),
        Bullets(
            [
                "A cell's baseline is the ok cell equal to it except on the suite's `baseline` keys. "
                "Speed-up is images/s over the baseline's; memory saved is 1 − memory / baseline memory "
                '(negative: more memory), and "not meaningful at this scale" where the baseline\'s '
                "activations are under 10% of its peak: the training state (20 bytes a parameter: fp32 "
                "weights, gradients, Adam, EMA) stays whatever the precision or checkpointing, so no "
                "saving can show (the planner's components where the record has them).",
                f"Memory in the tables is {mem_label.replace(' (GiB)', '')} (GiB = 2^30 bytes; below 1 GiB "
                "in MiB = 2^20 bytes). On a CPU that is the CPU allocator peak over a fresh trainer's "
                f"second step ({CPU_ALLOC.path}), or in older records the CPU peak RSS, the "
                f"process's resident memory ({CPU_RSS.path}), which stays flat across settings. "
                "Whether a cell fits a card is decided on peak reserved + CUDA context where the context "
                "was measured (a cell that completed under an emulated card's cap fits it), else on NVML "
                "device memory (it includes the context), else on reserved.",
                "A budget is the card a suite emulated (`card` / `gpu_memory_gib`), else the card the "
                "cells ran on (every ok cell fits it).",
                f"Time to {steps_text(steps)} steps ({steps_source}) is that many steps at the measured "
                "steps/s, on the GPUs the cell used; the DiT paper trains at global batch "
                f"{PAPER_GLOBAL_BATCH}, so a cell at another global batch sees a different number of "
                "images in that time (said next to the figure). GPU-hours per million images = GPUs × "
                f"10^6 / images/s / 3600; the paper's {steps_text(steps)} steps at batch "
                f"{PAPER_GLOBAL_BATCH} are {steps * PAPER_GLOBAL_BATCH / 1e6:,.1f} million images.",
                "MFU counts model FLOPs only; recomputation under checkpointing is not counted, so "
                "checkpointing lowers it.",
            ]
        ),
    ]


def results_table(df: pd.DataFrame) -> pd.DataFrame:
    """The DataFrame as a flat table: lists and objects as JSON text, no raw record column."""
    comparison = analysis.baseline_comparison(df)
    flat = df.drop(columns=[c for c in ("record",) if c in df]).copy()
    for c in flat.columns:
        if flat[c].dtype == object and flat[c].map(lambda v: isinstance(v, (list, dict))).any():
            flat[c] = flat[c].map(lambda v: json.dumps(v) if isinstance(v, (list, dict)) else v)
    if "started_at" in flat:
        flat["started_at"] = flat["started_at"].map(lambda t: t.isoformat() if not pd.isna(t) else None)
    for name in ("cell_id", "speedup", "mem_saved_pct", "mem_note"):
        flat[f"vs_baseline.{name}"] = comparison["baseline_cell_id" if name == "cell_id" else name]
    return flat


def report_files() -> list[str]:
    """Every file name write_report writes or removes in its folder."""
    return ["report.md", "report.html", "results.csv", *PLOT_FILES.values(), *QUALITY_FILES]


def write_report(df: pd.DataFrame, out_dir: str | Path, *args: Any, **kwargs: Any) -> dict[str, Path]:
    """Write report.md, report.html, results.csv and the plot PNGs into out_dir; name -> path. The other
    arguments are build_report's."""
    out_dir = Path(out_dir)
    blocks, plots = build_report(df, *args, **kwargs)
    heading = next(b.text for b in blocks if isinstance(b, Heading))
    written = {name: write_atomic(out_dir / PLOT_FILES.get(name, name), png) for name, png in plots.items()}
    for name in (set(PLOT_FILES.values()) | set(QUALITY_FILES)) - {
        PLOT_FILES.get(n, n) for n in plots
    }:  # a stale plot from an earlier report would mislead
        stale = out_dir / name
        if stale.exists():
            stale.unlink()
    written["markdown"] = write_atomic(out_dir / "report.md", to_markdown(blocks))
    written["html"] = write_atomic(out_dir / "report.html", to_html(blocks, heading))
    # text a spreadsheet would run as a formula (a cell_name starting with `=`) is written as text
    written["csv"] = write_atomic(out_dir / "results.csv", csv_safe(results_table(df)).to_csv(index=False))
    return written
