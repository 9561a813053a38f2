"""report.md, a self-contained report.html and results.csv from a results DataFrame.

The report is built once as a list of blocks (headings, paragraphs, tables, images) and rendered
twice, so the markdown and the HTML always say the same thing. The markdown links the plots as
PNG files next to it; the HTML embeds them as base64 and loads nothing from outside.
"""

from __future__ import annotations

import base64
import html
import json
import math
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd

from ditbench import __version__
from ditbench.fileio import write_atomic
from ditbench.report import analysis
from ditbench.report.analysis import IMG_S, knobs, memory_metric, varying_knobs
from ditbench.report.load import column, value
from ditbench.report.plots import PLOT_FILES, render_plots

PLOT_TITLES = {
    "throughput": "Throughput against batch size",
    "memory": "Peak memory against batch size",
    "smoke_loss": "Smoke-run loss curves",
}
STATUS_TEXT = {
    "ok": "ok",
    "oom": "OOM",
    "timeout": "timeout",
    "nan_loss": "NaN loss",
    "error": "error",
    "skipped": "skipped",
    "unsupported": "unsupported",
}


# ------------------------------------------------------------------------------------------ blocks


@dataclass
class Heading:
    level: int
    text: str


@dataclass
class Para:
    text: str


@dataclass
class Bullets:
    items: list[str]


@dataclass
class Table:
    headers: list[str]
    rows: list[list[str]]
    css: list[list[str]] = field(default_factory=list)  # per-cell class names for the HTML


@dataclass
class Image:
    name: str
    title: str
    png: bytes


Block = Heading | Para | Bullets | Table | Image


# ------------------------------------------------------------------------------------------ format


def num(x: Any, digits: int = 1, unit: str = "") -> str:
    if x is None or isinstance(x, bool):
        return "—"
    try:
        x = float(x)
    except (TypeError, ValueError):
        return "—"
    if math.isnan(x):
        return "—"
    if abs(x) >= 1000:
        text = f"{x:,.0f}"
    else:
        text = f"{x:.{digits}f}"
    return text + unit


def speedup_text(x: float | None) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.2f}x"


def saved_text(x: float | None) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:+.1f}%"


def knob_text(name: str, v: Any) -> str:
    if name == "grad_ckpt":
        return f"ckpt={v}"
    if name == "precision":
        return str(v)
    if name == "compile":
        return "compile" if v else "eager"
    return f"{name}={json.dumps(v) if isinstance(v, (dict, list)) else v}"


# ------------------------------------------------------------------------------------------ build


def build_report(
    df: pd.DataFrame, title: str | None = None, sources: list[str] | None = None
) -> tuple[list[Block], dict[str, bytes]]:
    """The report as blocks, and the PNG plots it refers to (name -> bytes)."""
    suites = (
        ", ".join(dict.fromkeys(str(s) for s in df.get("suite", pd.Series(dtype=str)).dropna())) or "results"
    )
    title = title or f"ditbench report: {suites}"
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
    blocks += _environment(df)
    blocks += _recommendations(df)
    blocks += _advice(df)
    for model in dict.fromkeys(df["config.model"].astype(str)):
        blocks += _model_section(df, df[df["config.model"].astype(str) == model], comparison, model)
    if plots:
        blocks.append(Heading(2, "Plots"))
        for name, png in plots.items():
            blocks.append(Image(name, PLOT_TITLES[name], png))
    blocks += _method(df)
    return blocks, plots


def _environment(df: pd.DataFrame) -> list[Block]:
    env_cols = [c for c in df.columns if c.startswith("env.")]
    rows = []
    mixed = []
    for c in env_cols:
        values = list(
            dict.fromkeys(
                str(v) for v in df[c] if v is not None and not (isinstance(v, float) and math.isnan(v))
            )
        )
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
    return out


def _recommendations(df: pd.DataFrame) -> list[Block]:
    recs = analysis.recommend(df)
    out: list[Block] = [Heading(2, "Recommendations")]
    groups = list(dict.fromkeys((r.budget, r.gpus) for r in recs.per_model))
    for budget, gpus in groups:
        gpu_text = f", {gpus} GPUs" if gpus > 1 else ""
        rows = []
        for r in recs.per_model:
            if (r.budget, r.gpus) != (budget, gpus):
                continue
            if r.cell_name is None:
                rows.append([r.model, "nothing fits", "—", "—", r.note])
                continue
            mem = f"{num(r.memory_gib, 2)} GiB ({r.memory_label})" if r.memory_gib is not None else "—"
            rows.append([r.model, r.cell_name, num(r.images_per_s), mem, r.note])
        out.append(Para(f"Fastest configuration that fits, per model, on {budget}{gpu_text}:"))
        out.append(Table(["model", "fastest cell that fits", "images/s", "memory", "note"], rows))
        largest = recs.largest.get((budget, gpus))
        if largest is not None:
            out.append(
                Para(
                    f"Largest model that fits on {budget}{gpu_text}: **{largest.model}** "
                    f"({largest.cell_name}, {num(largest.images_per_s)} images/s)."
                )
            )
        else:
            out.append(Para(f"No model fits on {budget}{gpu_text}."))
    return out


def _advice(df: pd.DataFrame) -> list[Block]:
    checks = analysis.advice_checks(df)
    css = {analysis.HELD: "held", analysis.NOT_HELD: "not-held", analysis.NOT_MEASURED: "not-measured"}
    table = Table(
        ["advice", "verdict", "evidence from this run"],
        [[c.claim, c.verdict, c.evidence] for c in checks],
        [["", css[c.verdict], ""] for c in checks],
    )
    return [
        Heading(2, "Common advice, checked"),
        table,
        Para("How each verdict is decided:"),
        Bullets([f"{c.claim}: {c.rule}." for c in checks]),
    ]


def _model_section(df: pd.DataFrame, sub: pd.DataFrame, comparison: pd.DataFrame, model: str) -> list[Block]:
    mem_col, mem_label = memory_metric(df)
    out: list[Block] = [Heading(2, f"{model}")]
    split = varying_knobs(sub, exclude=("model", "batch_size"))
    batches = sorted(set(column(sub, "config.batch_size").dropna()))
    lines: dict[tuple, dict[float, pd.Series]] = {}
    for _, row in sub.iterrows():
        k = knobs(row["record"])
        lines.setdefault(tuple((n, k.get(n)) for n in split), {})[value(row, "config.batch_size")] = row
    rows, css = [], []
    for key in sorted(lines, key=lambda key: tuple(_order(v) for _, v in key)):
        label = " ".join(knob_text(n, v) for n, v in key) or model
        cells, classes = [label], [""]
        for b in batches:
            row = lines[key].get(b)
            if row is None:
                cells.append("")
                classes.append("")
                continue
            status = row["status"]
            if status == "ok":
                text = f"{num(value(row, IMG_S))} img/s"
                mem = value(row, mem_col)
                if mem is not None:
                    text += f" · {num(mem, 1)} GiB"
                if comparison.at[row.name, "is_baseline"]:
                    text += " (baseline)"
            else:
                text = STATUS_TEXT.get(status, str(status))
            cells.append(text)
            classes.append(f"status-{status}")
        rows.append(cells)
        css.append(classes)
    out.append(
        Para(f"Images/s and {mem_label.replace(' (GiB)', '')} per cell; columns are the batch size per GPU.")
    )
    out.append(Table(["configuration"] + [f"bs {b:g}" for b in batches], rows, css))
    out.append(Heading(3, f"{model}: every cell against the baseline"))
    detail, detail_css = [], []
    order = sorted(
        sub.index,
        key=lambda i: (
            tuple(_order(v) for v in _line_values(sub.loc[i], split)),
            value(sub.loc[i], "config.batch_size") or 0,
        ),
    )
    for label in order:
        row = sub.loc[label]
        c = comparison.loc[label]
        smoke = row["record"].get("smoke")
        smoke_text = "—"
        if isinstance(smoke, dict) and smoke.get("first_mean") is not None:
            smoke_text = f"{num(smoke.get('first_mean'), 3)} → {num(smoke.get('last_mean'), 3)}"
            if smoke.get("nonfinite_steps"):
                smoke_text += f" ({smoke['nonfinite_steps']} non-finite)"
        p10, p90 = value(row, "metrics.step_ms.p10"), value(row, "metrics.step_ms.p90")
        step = num(value(row, "metrics.step_ms.median"))
        if p10 is not None and p90 is not None:
            step += f" ({num(p10)}–{num(p90)})"
        mfu = value(row, "metrics.mfu.value")
        scaling = value(row, "metrics.scaling_efficiency")
        if c["is_baseline"]:
            vs = "baseline"
        elif row["status"] == "ok" and not pd.isna(c["speedup"]):
            vs = f"{speedup_text(c['speedup'])}, {saved_text(c['mem_saved_pct'])} memory saved"
        else:
            vs = c["baseline_note"] if isinstance(c["baseline_note"], str) and row["status"] == "ok" else "—"
        reason = row.get("reason")
        detail.append(
            [
                str(row.get("cell_name") or row["cell_id"]),
                STATUS_TEXT.get(row["status"], row["status"]),
                num(value(row, IMG_S)),
                step,
                num(value(row, mem_col), 2),
                num(value(row, "metrics.peak_mem_reserved_gib"), 2),
                num(mfu * 100, 1, "%") if mfu is not None else "—",
                num(scaling * 100, 1, "%") if scaling is not None else "—",
                vs,
                smoke_text,
                str(reason) if isinstance(reason, str) else "",
            ]
        )
        detail_css.append(["", f"status-{row['status']}"] + [""] * 9)
    headers = [
        "cell",
        "status",
        "images/s",
        "step ms median (p10–p90)",
        mem_label,
        "reserved (GiB)",
        "MFU",
        "scaling efficiency",
        "vs baseline (speed-up, memory saved)",
        "smoke loss first → last",
        "reason",
    ]
    # A column no cell of this model has (reserved memory and MFU on a CPU) only adds noise.
    keep = [i for i, h in enumerate(headers) if i < 2 or any(r[i] not in ("—", "") for r in detail)]
    out.append(
        Table(
            [headers[i] for i in keep],
            [[r[i] for i in keep] for r in detail],
            [[c[i] for i in keep] for c in detail_css],
        )
    )
    return out


def _line_values(row: pd.Series, split: list[str]) -> list[Any]:
    k = knobs(row["record"])
    return [k.get(n) for n in split]


def _order(v: Any) -> tuple:
    rank = {"fp32": 0, "tf32": 1, "bf16": 2, "fp16": 3, "none": 0, "full": 1}
    return (rank.get(v, 9) if isinstance(v, str) else 9, str(v))


def _method(df: pd.DataFrame) -> list[Block]:
    _, mem_label = memory_metric(df)
    return [
        Heading(2, "How to read this report"),
        Bullets(
            [
                "A cell's baseline is the ok cell equal to it except on the suite's `baseline` keys. "
                "Speed-up is images/s over the baseline's; memory saved is 1 − memory / baseline memory "
                "(negative: more memory).",
                f"Memory in the tables is {mem_label.replace(' (GiB)', '')} (GiB = 2^30 bytes). Whether a "
                "cell fits a budget is decided on NVML device memory when measured (it includes the CUDA "
                "context), else on the allocator's reserved memory, else allocated.",
                "A budget is the suite's `gpu_memory_gb` when set, else the card the cells ran on (every "
                "ok cell fits it).",
                "MFU counts model FLOPs only; recomputation under checkpointing is not counted, so "
                "checkpointing lowers it.",
            ]
        ),
    ]


# ------------------------------------------------------------------------------------------ render


def _md_escape(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def to_markdown(blocks: list[Block]) -> str:
    parts = []
    for b in blocks:
        if isinstance(b, Heading):
            parts.append("#" * b.level + " " + b.text)
        elif isinstance(b, Para):
            parts.append(b.text)
        elif isinstance(b, Bullets):
            parts.append("\n".join(f"- {item}" for item in b.items))
        elif isinstance(b, Table):
            lines = [
                "| " + " | ".join(_md_escape(h) for h in b.headers) + " |",
                "|" + "|".join("---" for _ in b.headers) + "|",
            ]
            lines += ["| " + " | ".join(_md_escape(c) for c in row) + " |" for row in b.rows]
            parts.append("\n".join(lines))
        elif isinstance(b, Image):
            parts.append(f"[![{b.title}]({PLOT_FILES[b.name]})]({PLOT_FILES[b.name]})")
    return "\n\n".join(parts) + "\n"


def _inline_html(text: str) -> str:
    out = html.escape(str(text), quote=False)
    out = re.sub(r"`([^`]+)`", r"<code>\1</code>", out)
    return re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", out)


CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2rem auto; max-width: 1200px;
       padding: 0 1rem; color: #1d1d1f; line-height: 1.45; }
h1 { font-size: 1.6rem; } h2 { margin-top: 2.2rem; border-bottom: 1px solid #ddd; padding-bottom: .2rem; }
table { border-collapse: collapse; margin: .8rem 0; font-size: .9rem; display: block; overflow-x: auto; }
th, td { border: 1px solid #d0d0d0; padding: .3rem .55rem; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
code { background: #f3f3f3; padding: 0 .2rem; border-radius: 3px; }
.status-ok { background: #eef8ee; } .status-oom, .status-error, .status-timeout, .status-nan_loss
{ background: #fbeaea; } .status-skipped, .status-unsupported { background: #f2f2f2; color: #666; }
.held { background: #e3f4e3; font-weight: 600; } .not-held { background: #fbe3e3; font-weight: 600; }
.not-measured { color: #666; }
figure { margin: 1.2rem 0; } figure img { max-width: 100%; border: 1px solid #e5e5e5; }
figcaption { font-size: .9rem; color: #555; }
"""


def to_html(blocks: list[Block], title: str) -> str:
    body = []
    for b in blocks:
        if isinstance(b, Heading):
            body.append(f"<h{b.level}>{_inline_html(b.text)}</h{b.level}>")
        elif isinstance(b, Para):
            body.append(f"<p>{_inline_html(b.text)}</p>")
        elif isinstance(b, Bullets):
            body.append("<ul>" + "".join(f"<li>{_inline_html(i)}</li>" for i in b.items) + "</ul>")
        elif isinstance(b, Table):
            head = "".join(f"<th>{_inline_html(h)}</th>" for h in b.headers)
            rows = []
            for r, row in enumerate(b.rows):
                classes = b.css[r] if r < len(b.css) else []
                tds = []
                for c, cell in enumerate(row):
                    cls = classes[c] if c < len(classes) else ""
                    tds.append(f'<td class="{cls}">' if cls else "<td>")
                    tds[-1] += _inline_html(cell) + "</td>"
                rows.append("<tr>" + "".join(tds) + "</tr>")
            body.append(f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>")
        elif isinstance(b, Image):
            data = base64.b64encode(b.png).decode("ascii")
            body.append(
                f'<figure id="plot-{b.name}"><img class="plot" alt="{html.escape(b.title)}" '
                f'src="data:image/png;base64,{data}"><figcaption>{html.escape(b.title)}</figcaption>'
                "</figure>"
            )
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{html.escape(title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n"
        + "\n".join(body)
        + "\n</body>\n</html>\n"
    )


# ------------------------------------------------------------------------------------------ csv


def results_table(df: pd.DataFrame) -> pd.DataFrame:
    """The DataFrame as a flat table: lists and objects as JSON text, no raw record column."""
    comparison = analysis.baseline_comparison(df)
    flat = df.drop(columns=[c for c in ("record",) if c in df]).copy()
    for c in flat.columns:
        if flat[c].map(lambda v: isinstance(v, (list, dict))).any():
            flat[c] = flat[c].map(lambda v: json.dumps(v) if isinstance(v, (list, dict)) else v)
    if "started_at" in flat:
        flat["started_at"] = flat["started_at"].map(lambda t: t.isoformat() if not pd.isna(t) else None)
    flat["vs_baseline.cell_id"] = comparison["baseline_cell_id"]
    flat["vs_baseline.speedup"] = comparison["speedup"]
    flat["vs_baseline.mem_saved_pct"] = comparison["mem_saved_pct"]
    return flat


# ------------------------------------------------------------------------------------------ write


def write_report(
    df: pd.DataFrame, out_dir: str | Path, title: str | None = None, sources: list[str] | None = None
) -> dict[str, Path]:
    """Write report.md, report.html, results.csv and the plot PNGs into out_dir; name -> path."""
    out_dir = Path(out_dir)
    blocks, plots = build_report(df, title, sources)
    heading = next(b.text for b in blocks if isinstance(b, Heading))
    written = {}
    for name, png in plots.items():
        written[name] = write_atomic(out_dir / PLOT_FILES[name], png)
    for name in set(PLOT_FILES) - set(plots):  # a stale plot from an earlier report would mislead
        stale = out_dir / PLOT_FILES[name]
        if stale.exists():
            stale.unlink()
    written["markdown"] = write_atomic(out_dir / "report.md", to_markdown(blocks))
    written["html"] = write_atomic(out_dir / "report.html", to_html(blocks, heading))
    written["csv"] = write_atomic(out_dir / "results.csv", results_table(df).to_csv(index=False))
    return written
