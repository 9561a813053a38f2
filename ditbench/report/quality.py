"""Sample quality: the noise rule the report and the gate share (`noise_rule`: numbers made the same way,
IDENTITY, at the last step both evaluated, differ only beyond k combined spreads), and the report's
quality section: every quality output per evaluated cell against its baseline, the sample grids, FID
against GPU-hours of training and "FID after X GPU-hours".
"""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import dataclass
from typing import Any

import pandas as pd

from ditbench.core.errors import UserError, shorten
from ditbench.files.imageload import GRID_PIXELS, load_rgb
from ditbench.hardware.precision import LOW_PRECISIONS
from ditbench.metrics import registry
from ditbench.metrics.spec import Output
from ditbench.records.metrics import finite
from ditbench.records.model import Evaluation
from ditbench.records.model import Quality as QualitySection
from ditbench.report.analysis import baseline_comparison
from ditbench.report.blocks import Block, Heading, Image, Para, Table, num
from ditbench.report.cells import cell_label, pairs
from ditbench.report.load import grid_file, number

DEFAULT_QUALITY_NOISE_K = 2.0  # a quality difference counts beyond k combined spreads (the gate's default)
# (what a reader calls it, where it lives in `quality`)
IDENTITY = (
    ("Inception weights (sha256)", ("inception", "sha256")),
    ("reference batch (digest)", ("reference", "digest")),
    ("sampler", ("sampler",)),
    ("samples per evaluation", ("samples",)),
)
SAMPLE_COUNT = "samples per evaluation"


@dataclass
class Quality:
    identity: dict[str, Any]  # IDENTITY label -> value
    official: bool | None  # whether the Inception weights are the official ones
    evaluations: dict[int, Evaluation]  # training step -> evaluation


def read_quality(q: QualitySection | dict[str, Any] | None) -> tuple[Quality | None, str | None]:
    """A record's quality section (typed by the record's model; its JSON is typed here) checked for what
    the gate needs beyond its types; (None, None) when there is none."""
    if q is None:
        return None, None
    if isinstance(q, dict):
        q = QualitySection.model_validate(q)
    identity = {}
    for label, path in IDENTITY:
        node: Any = q
        for part in path:
            node = getattr(node, part, None)
        name = "quality." + ".".join(path)
        if path == ("sampler",):
            if not node:
                return None, f"{name} is {shorten(node)}, not an object such as {{name, steps, cfg_scale}}"
            node = json.dumps(node, sort_keys=True, default=str)  # compared as a whole, canonically
        elif path == ("samples",):
            if node is None or node <= 0:
                return None, f"{name} is {shorten(node)}, not a positive number of samples"
        elif not node:
            return None, f"{name} is {shorten(node)}, not a non-empty string"
        identity[label] = node
    if not q.evaluations:
        return None, f"quality.evaluations is {shorten(q.evaluations)}, not a non-empty list"
    by_step: dict[int, Evaluation] = {}
    for i, e in enumerate(q.evaluations):
        if e.step in by_step:
            return None, f"quality.evaluations[{i}].step {e.step} appears twice"
        by_step[e.step] = e
    return Quality(identity, getattr(q.inception, "official", None), by_step), None


def evaluation_noise(evaluation: Evaluation | dict[str, Any], key: str) -> tuple[float | None, str | None]:
    """(one evaluation's noise in `key`, None) or (None, what is wrong): the larger of the seeds'
    spread and the bootstrap's standard error over samples (either may be absent)."""
    found = []
    for field in ("spread", "bootstrap_se"):
        v, why = number((evaluation.get(field) or {}).get(key))
        if why is None and v is not None and v < 0:
            why = f"is {v:g}, not a spread (>= 0)"
        if why:
            return None, f"{field}.{key} {why}"
        if v is not None:
            found.append(v)
    return (max(found) if found else None), None


@dataclass(frozen=True)
class Noise:
    """The noise rule's verdict on one difference: the bound it must exceed, and how sure that bound is."""

    bound: float | None  # k * sqrt(spread_base^2 + spread_new^2); None when neither side has a spread
    beyond: bool | None  # |new - base| > bound; None when the noise is unknown
    weak_reason: str | None  # why the bound rests on less than both runs' spreads


def noise_rule(b: float, n: float, sb: float | None, sn: float | None, k: float) -> Noise:
    """Whether new differs from base beyond the seeds' noise: |n - b| > k * sqrt(sb^2 + sn^2).

    The one rule for quality differences: the gate judges with it and the reports' "within noise"
    verdicts come from it. A spread on one side only stands for both; with none the noise is unknown.
    """
    if sb is None and sn is None:
        return Noise(
            None,
            None,
            "noise unknown: neither run recorded a spread or a bootstrap SE (one seed, --bootstrap 0?), so "
            "the threshold alone decided",
        )
    weak_reason = None
    if sb is None or sn is None:
        sb = sn = sn if sb is None else sb
        weak_reason = "only one run recorded a spread; it stands for both"
    bound = k * math.hypot(sb, sn)
    if not math.isfinite(bound):
        bound = math.inf
    return Noise(bound, abs(n - b) > bound, weak_reason)


BANNER = "not the official Inception: numbers are not comparable with papers"
GRIDS_FILE = "quality_grids.png"
GRID_WIDTH_IN = 10.0  # each grid's width in the figure: at the report's 100 dpi, about its PNG's own width
GPU_HOURS_FILE = "quality_gpu_hours.png"
QUALITY_FILES = (GRIDS_FILE, GPU_HOURS_FILE)
MAX_HOUR_COLUMNS = 6


@dataclass
class Verdict:
    text: str  # better / worse / within noise / noise unknown / baseline / not comparable
    detail: str  # the numbers behind it
    step: int | None = None


def evaluated(df: pd.DataFrame) -> list[tuple[Any, QualitySection]]:
    """(row label, quality field) of every record with at least one evaluation."""
    pairs = zip(df.index, (r.quality for r in df["record"]), strict=True)
    return [(label, q) for label, q in pairs if q is not None and q.evaluations]


def not_official(df: pd.DataFrame) -> bool:
    return any((q.get("inception") or {}).get("official") is not True for _, q in evaluated(df))


def compare_fid(
    base: QualitySection | dict, new: QualitySection | dict, k: float = DEFAULT_QUALITY_NOISE_K
) -> Verdict:
    """new's FID against base's at the last step both evaluated, by the gate's noise rule."""
    qb, why_b = read_quality(base)
    qn, why_n = read_quality(new)
    if qb is None or qn is None:
        return Verdict("not comparable", why_b or why_n or "no quality field")
    differs = [label for label in qb.identity if qb.identity[label] != qn.identity[label]]
    if differs:
        return Verdict("not comparable", f"made with a different {', '.join(differs)}")
    common = sorted(set(qb.evaluations) & set(qn.evaluations))
    if not common:
        return Verdict("not comparable", "no training step evaluated in both")
    step = common[-1]
    eb, en = qb.evaluations[step], qn.evaluations[step]
    b, n = (e["metrics"].get("fid") for e in (eb, en))
    if finite(b) is None or finite(n) is None:
        return Verdict("not comparable", f"no FID at step {step:,}", step)
    sb, sn = (evaluation_noise(e, "fid")[0] for e in (eb, en))
    noise = noise_rule(b, n, sb, sn, k)
    delta = f"FID {n - b:+.2f} at step {step:,}"
    if noise.beyond is None:
        return Verdict("noise unknown", f"{delta}; {noise.weak_reason}", step)
    bound = f"noise bound {noise.bound:.2f} (k={k:g} x the spreads: seeds' or bootstrap's)"
    if not noise.beyond:
        return Verdict("within noise", f"{delta}, within the {bound}", step)
    return Verdict("better" if n < b else "worse", f"{delta}, beyond the {bound}", step)


def quality_caveat(df: pd.DataFrame) -> list[Block]:
    if not evaluated(df) or not not_official(df):
        return []
    return [
        Para(
            f"**Quality metrics: {BANNER}.** They were scored with a test Inception network; they show "
            "differences between these cells and nothing else."
        )
    ]


def quality_section(df: pd.DataFrame) -> tuple[list[Block], dict[str, bytes]]:
    """The section's blocks and the figures it refers to (file name -> PNG bytes)."""
    cells = evaluated(df)
    if not cells:
        return [], {}
    comparison = baseline_comparison(df)
    blocks: list[Block] = [Heading(2, "Sample quality")]
    first = cells[0][1]
    sampler = first.get("sampler") or {}
    intro = (
        f"{len(cells)} cell(s) evaluated: EMA weights sampled with {sampler.get('name')} "
        f"({sampler.get('steps')} steps, guidance {sampler.get('cfg_scale')}), "
        f"{first.get('samples')} samples per seed and evaluation, "
        f"{len(first.get('seeds') or [])} seed(s), against "
        f"{(first.get('reference') or {}).get('path')}. FID is the mean over seeds ± the larger of their "
        f"standard deviation and the bootstrap standard error over samples; a cell differs from its "
        f"baseline only when the FID difference exceeds "
        f"{DEFAULT_QUALITY_NOISE_K:g} x the combined spread of the two (the gate's rule), else it is "
        '"within noise".'
    )
    if not_official(df):
        intro += f" **{BANNER}.**"
    blocks.append(Para(intro))
    blocks.append(_summary_table(df, cells, comparison))
    blocks += _hours_table(df, cells)
    figures = {}
    for name, make, title in (
        (GPU_HOURS_FILE, _gpu_hours_figure, "FID against GPU-hours of training, one line per setting"),
        (GRIDS_FILE, _grids_figure, "Sample grids (same noise and labels in every cell) per training step"),
    ):
        png = make(df, cells)
        if png is not None:
            figures[name] = png
            blocks.append(Image(name.removesuffix(".png"), title, png, name))
    blocks.append(_evaluations_table(df, cells))
    return blocks, figures


def _metric_cells(e: dict[str, Any]) -> list[str]:
    """An evaluation's quality figures, one column per quality output of the metric registry."""
    m = e.get("metrics") or {}
    return [_pm(m.get(o.key), evaluation_noise(e, o.key)[0], o) for o in registry.quality_outputs()]


def _metric_headers() -> list[str]:
    return [o.label for o in registry.quality_outputs()]


def _summary_table(df: pd.DataFrame, cells, comparison: pd.DataFrame) -> Table:
    rows, css = [], []
    for label, q in cells:
        last = q["evaluations"][-1]
        verdict = _verdict(df, label, q, comparison)
        figures = _metric_cells(last)
        rows.append(
            [cell_label(df.loc[label]), f"{last.get('step', 0):,}", *figures, verdict.text, verdict.detail]
        )
        css.append([""] * (2 + len(figures)) + [_CSS.get(verdict.text, ""), ""])
    headers = ["cell", "step", *_metric_headers(), "vs baseline", "why"]
    return Table(headers, rows, css)


_CSS = {"better": "held", "within noise": "held", "worse": "not-held"}


def _verdict(df: pd.DataFrame, label, q: QualitySection, comparison: pd.DataFrame) -> Verdict:
    if bool(comparison.at[label, "is_baseline"]):
        return Verdict("baseline", "")
    base_label = comparison.at[label, "baseline_label"]
    if base_label is None or (isinstance(base_label, float) and math.isnan(base_label)):
        return Verdict("no baseline", str(comparison.at[label, "baseline_note"] or ""))
    base_q = df.loc[base_label]["record"].quality
    if base_q is None:
        return Verdict("no baseline", "its baseline cell was not evaluated")
    return compare_fid(base_q, q)


def _pm(mean: Any, spread: Any, output: Output) -> str:
    """mean ± spread to the decimals the spread justifies; the mean alone without a spread (one seed)."""
    if finite(mean) is None:
        return "—"
    return output.plus_minus(mean, spread if finite(spread) is not None else None)


def _points(q: QualitySection) -> list[tuple[float, float, float | None, int]]:
    """(GPU-hours of training, FID, FID spread, step) per evaluation with an FID."""
    out = []
    for e in q["evaluations"]:
        fid = (e.get("metrics") or {}).get("fid")
        if finite(fid) is not None and finite(e.get("train_gpu_s")) is not None:
            out.append((e["train_gpu_s"] / 3600, fid, evaluation_noise(e, "fid")[0], e.get("step", 0)))
    return out


def _hours_table(df: pd.DataFrame, cells) -> list[Block]:
    """FID after X GPU-hours: each cell's FID at its last evaluation within X GPU-hours of training."""
    points = {label: _points(q) for label, q in cells}
    # exact: a rounded X misses its own point
    hours = sorted({h for p in points.values() for h, *_ in p if h > 0})
    if not hours:
        return []
    if len(hours) > MAX_HOUR_COLUMNS:  # evenly spaced picks, the last one always shown
        step = (len(hours) - 1) / (MAX_HOUR_COLUMNS - 1)
        hours = [hours[round(i * step)] for i in range(MAX_HOUR_COLUMNS)]
    rows = []
    for label, p in points.items():
        row = [cell_label(df.loc[label])]
        for x in hours:
            within = [point for point in p if point[0] <= x]  # none yet: a cell evaluated later
            if within:
                _, fid, spread, step = within[-1]
                row.append(f"{_pm(fid, spread, registry.OUTPUTS['fid'])} (step {step:,})")
            else:
                row.append("—")
        rows.append(row)
    return [
        Para(
            "**FID after X GPU-hours** of training (sampling and scoring excluded): each cell's FID at "
            "its last evaluation within that budget; a faster setting reaches more steps in the same hours."
        ),
        Table(["cell", *(f"after {_hours_text(x)}" for x in hours)], rows),
    ]


def _hours_text(h: float) -> str:
    if h < 1 / 60:
        return f"{h * 3600:.3g} GPU-s"
    if h < 1:
        return f"{h * 60:.3g} GPU-min"
    return f"{h:.3g} GPU-h"


def _evaluations_table(df: pd.DataFrame, cells) -> Table:
    rows = []
    for label, q in cells:
        for e in q["evaluations"]:
            times = [num(e.get(k), 1) for k in ("train_wall_s", "train_gpu_s", "sample_s", "score_s")]
            rows.append(
                [cell_label(df.loc[label]), f"{e.get('step', 0):,}", *times, *_metric_cells(e)]
                + [str(e.get("grid") or "—")]
            )
    headers = ["cell", "step", "train s", "train GPU-s", "sample s", "score s", *_metric_headers(), "grid"]
    return Table(headers, rows)


def _gpu_hours_figure(df: pd.DataFrame, cells) -> bytes | None:
    from ditbench.report.figures import CELL_COLOURS, figure_png, panels

    lines = [(label, _points(q)) for label, q in cells]
    lines = [(label, p) for label, p in lines if p]
    if not lines:
        return None
    fig, (ax,) = panels(1, "FID against GPU-hours of training")
    for i, (label, p) in enumerate(lines):
        xs = [h for h, *_ in p]
        ys = [fid for _, fid, *_ in p]
        errs = [spread if finite(spread) is not None else 0.0 for _, _, spread, _ in p]
        ax.errorbar(
            xs,
            ys,
            yerr=errs,
            marker="o",
            capsize=3,
            color=CELL_COLOURS[i % len(CELL_COLOURS)],
            label=cell_label(df.loc[label]),
        )
    ax.set_xlabel("GPU-hours of training (processes x wall clock; sampling and scoring excluded)")
    ax.set_ylabel("FID (mean over seeds; bars: their std)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    if not_official(df):
        ax.set_title(f"{BANNER}", fontsize=8, color="#b00000")
    return figure_png(fig)


def _grids_figure(df: pd.DataFrame, cells) -> bytes | None:
    """One grid per row, at full width (cells in turn, each cell's steps in order): side by side, a
    32-pixel sample would be drawn a few screen pixels wide and nothing in it could be judged."""
    from matplotlib.figure import Figure

    from ditbench.report.figures import figure_png

    rows: list[tuple[str, Any]] = []
    for label, q in cells:
        name = cell_label(df.loc[label])
        for e in q["evaluations"]:
            path = grid_file(df.loc[label].get("source"), e.get("grid"))
            try:
                if path is not None:
                    rows.append(
                        (f"{name}, step {e.get('step', 0):,}", load_rgb(path, GRID_PIXELS, "a sample grid"))
                    )
            except UserError as err:  # too large, or damaged: the report goes on without it
                warnings.warn(str(err), stacklevel=2)
    if not rows:
        return None
    width = GRID_WIDTH_IN
    heights = [width * image.height / image.width for _, image in rows]
    fig = Figure(figsize=(width, sum(heights) + 0.3 * len(rows) + 0.5), constrained_layout=True)
    axes = fig.subplots(len(rows), 1, squeeze=False, gridspec_kw={"height_ratios": heights})
    for ax, (title, image) in zip(axes[:, 0], rows, strict=True):
        ax.set_axis_off()
        ax.imshow(image, interpolation="nearest")
        ax.set_title(title, fontsize=9)
    fig.suptitle("Sample grids: the same noise and class labels in every cell", fontsize=10)
    return figure_png(fig)


# ------------------------------------------------------------------------------------------ advice

QUALITY_CHANGES = (
    *((p, {"precision": p}, {"precision": "fp32"}) for p in LOW_PRECISIONS),
    ("checkpointing", {"grad_ckpt": "full"}, {"grad_ckpt": "none"}),
)


def quality_unchanged(df: pd.DataFrame) -> tuple[str, str, int | None]:
    """(verdict, evidence, step) for "fp16 / bf16 / checkpointing do not change quality after N steps":
    held when every evaluated pair (the setting and its twin without it) is within noise."""
    judged: list[tuple[str, Verdict]] = []
    for name, change, twin in QUALITY_CHANGES:
        for row, other in pairs(df, change, twin):
            q, base = row["record"].quality, other["record"].quality
            if q is not None and base is not None:
                verdict = compare_fid(base, q)
                if verdict.step is not None and verdict.text != "not comparable":
                    judged.append((f"{name} ({cell_label(row)})", verdict))
    if not judged:
        return (
            "not measured",
            "no evaluated cell has an evaluated twin without fp16, bf16 or checkpointing",
            None,
        )
    step = min(v.step for _, v in judged if v.step is not None)
    changed = [(n, v) for n, v in judged if v.text in ("better", "worse")]
    unknown = [(n, v) for n, v in judged if v.text == "noise unknown"]
    evidence = "; ".join(f"{n}: {v.text}, {v.detail}" for n, v in judged)
    if changed:
        return "not held", evidence, step
    if unknown:
        return "not measured", evidence, step
    return "held", evidence, step
