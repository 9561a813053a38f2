"""The report's sections that read cells: recommendations, verdicts, and one section per model, each
table showing images/s, time to the target steps, memory, noise and the card that really ran a cell.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from ditbench.core.intervals import decimals
from ditbench.core.units import memory_text
from ditbench.records.metrics import ENERGY_PER_IMAGE, IMAGES_PER_S, MFU, STEP_MS
from ditbench.report import advice, analysis
from ditbench.report.analysis import gpu_hours_text, time_text
from ditbench.report.blocks import (
    Block,
    Bullets,
    Heading,
    Para,
    Table,
    knob_text,
    num,
    saved_text,
    speedup_text,
)
from ditbench.report.cells import cell_label, knobs, value_order, varying_knobs
from ditbench.report.claim_check import VERDICTS, ClaimResult
from ditbench.report.load import column, noise_parts, value
from ditbench.report.memory import MEM_PREDICTED, MEM_RESERVED, cell_budget, fits, memory_metric, metrics_of
from ditbench.report.predict import counts as predicted_counts

STATUS_TEXT = {"oom": "OOM", "nan_loss": "NaN loss"}  # the other statuses read as they are written
# Statuses that measured nothing: in a table, such cells sharing a reason are one row that names them.
NOT_MEASURED = ("unsupported", "skipped")


def verdict_css(verdict: str) -> str:
    return {"held": "held", "not held": "not-held"}.get(verdict.removeprefix("predicted: "), "not-measured")


def steps_text(n: int) -> str:
    """400000 -> '400K', 1000000 -> '1M', 12345 -> '12,345'."""
    for div, suffix in ((1_000_000, "M"), (1_000, "K")):
        if n >= div and n % div == 0:
            return f"{n // div:,}{suffix}"
    return f"{n:,}"


def noise_text(row: pd.Series) -> str:
    """'noisy: step-time spread 0.12 (bound 0.05)' for a cell the runner marked noisy, else ''."""
    metrics = metrics_of(row)
    if metrics.noisy is not True:
        return ""
    parts = noise_parts(metrics.get("noise") or {}, "step-time spread")
    return "noisy: " + ", ".join(parts) if parts else "noisy"


def ran_on_text(row: pd.Series) -> str:
    budget = cell_budget(row)
    if budget is not None and budget.emulated:
        return f"{budget.ran_on()} (emulating {budget.card or budget.name})"
    if row.get("config.device") == "cpu":
        return "CPU"
    return str(row.get("env.gpu_name") or "—")


def run_text(row: pd.Series) -> str:
    started = row.get("started_at")
    when = started.strftime("%Y-%m-%d %H:%M") if isinstance(started, pd.Timestamp) else ""
    label = run_label(row)
    return (f"{label} · " if label else "") + f"{row.get('run_id') or '—'}" + (f" ({when})" if when else "")


def run_label(row: pd.Series) -> str | None:
    label = row.get("label")
    return label if isinstance(label, str) and label else None


def run_group(row: pd.Series) -> str:
    """Which row of a model's table a record of a cell measured more than once belongs to: its run's
    label where it has one (runs labelled alike share a row), else its run id (never its start time,
    which differs cell by cell within one run)."""
    return run_label(row) or str(row.get("run_id") or "—")


def recommendations(df: pd.DataFrame, steps: int) -> list[Block]:
    recs = analysis.recommend(df)
    out: list[Block] = [Heading(2, "Recommendations")]
    rows_by_name = {cell_label(row): row for _, row in df.iterrows()}
    mem_col, mem_label = memory_metric(df)  # where the card's measure is missing (a CPU): the tables'
    groups = list(dict.fromkeys((r.budget, r.gpus) for r in recs.per_model))
    for budget, gpus in groups:
        gpu_text = f", {gpus} GPUs" if gpus > 1 else ""
        rows = []
        for r in [x for x in recs.per_model if (x.budget, x.gpus) == (budget, gpus)]:
            if r.cell_name is None:
                rows.append([r.model, "nothing fits", "—", "—", "—", r.note])
                continue
            row = rows_by_name.get(r.cell_name)
            mem = f"{mem_text(r.memory_gib)} ({r.memory_label})" if r.memory_gib is not None else "—"
            if r.memory_gib is None and row is not None and value(row, mem_col) is not None:
                mem = f"{mem_text(value(row, mem_col))} ({mem_label.replace(' (GiB)', '')})"
            noisy = noise_text(row) if row is not None else ""
            note = "; ".join(x for x in (r.note, noisy) if x)
            when = time_text(row, steps) if row is not None else "—"
            rows.append([r.model, r.cell_name, num(r.rate), when, mem, note])
        out.append(Para(f"Fastest configuration that fits, per model, on {budget}{gpu_text}:"))
        headers = ["model", "fastest cell that fits", "images/s", f"time to {steps_text(steps)} steps"]
        headers += ["memory", "note"]
        keep = [i for i in range(len(headers)) if i < 4 or any(row[i] not in ("", "—") for row in rows)]
        out.append(Table([headers[i] for i in keep], [[row[i] for i in keep] for row in rows]))
        largest = recs.largest.get((budget, gpus))
        if largest is not None:
            out.append(
                Para(
                    f"Largest model that fits on {budget}{gpu_text}: **{largest.model}** "
                    f"({largest.cell_name}, {num(largest.rate)} images/s)."
                )
            )
        else:
            out.append(Para(f"No model fits on {budget}{gpu_text}."))
    return out


# ------------------------------------------------------------------------------------------ verdicts


def collapse_unmeasured(rows: list[tuple[str, str, list[str], str]]) -> list[tuple[str, list[str], int]]:
    """(verdict, reason, table row, name) -> (verdict, row, count): "not measured" rows that give the
    same reason become one row, where the first one was, whose first cell joins their names."""
    out: list[tuple[str, list[str], list[str]]] = []
    where: dict[str, int] = {}
    for verdict, reason, row, name in rows:
        if verdict == "not measured" and reason in where:
            out[where[reason]][2].append(name)
            continue
        if verdict == "not measured":
            where[reason] = len(out)
        out.append((verdict, list(row), [name]))
    for _, row, names in out:
        if len(names) > 1:
            row[0] = "; ".join(names)
    return [(verdict, row, len(names)) for verdict, row, names in out]


def advice_section(df: pd.DataFrame, checks: list[advice.AdviceCheck] | None = None) -> list[Block]:
    """checks: the run's advice checks (with `report --predict`'s predictions); None: checked here."""
    checks = advice.advice_checks(df) if checks is None else checks
    rows = collapse_unmeasured(
        [
            (c.shown_verdict, c.shown_evidence, [c.claim, c.shown_verdict, c.shown_evidence], c.claim)
            for c in checks
        ]
    )
    table = Table(
        ["advice", "verdict", "evidence from this run"],
        [row for _, row, _ in rows],
        [["", verdict_css(verdict), ""] for verdict, _, _ in rows],
    )
    return [
        Heading(2, "Common advice, checked"),
        table,
        Para("How each verdict is decided:"),
        Bullets([f"{c.claim}: {c.rule}." + _predicted_rule(c) for c in checks]),
    ]


def _predicted_rule(check: advice.AdviceCheck) -> str:
    rule = (check.predicted or {}).get("rule")
    return f" {rule[0].upper()}{rule[1:]}." if rule else ""


def claims_section(
    results: list[ClaimResult], path: str, source: str | None, card: str | None
) -> list[Block]:
    counts = {v: sum(r.verdict == v for r in results) for v in VERDICTS}
    summary = ", ".join(f"{n} {v}" for v, n in counts.items())
    predicted = predicted_counts(results)
    if any(predicted.values()):  # `report --predict`
        summary += "; of those not measured, " + ", ".join(f"{n} {v}" for v, n in predicted.items())
    intro = f"{len(results)} claims from `{path}`" + (f" ({source})" if source else "") + f": {summary}."
    if card:
        intro += (
            f" The claims' speeds are about an {card}: a speed measured on another card, or on a bigger card "
            "capped to emulate it, is shown but not judged."
        )
    entries = []
    for r in results:
        says = r.claim.says + (f" (note: {r.claim.note})" if r.claim.note else "")
        evidence = r.evidence or "—"
        row = [says, r.verdict, r.claimed, r.measured, evidence]
        # unmeasured claims with one reason share a row: each keeps what it claimed in its name there
        entries.append((r.verdict, evidence, row, f"{says} (claimed: {r.claimed})"))
    rows, css = [], []
    for verdict, row, count in collapse_unmeasured(entries):
        if count > 1:
            row[2] = "—"
        rows.append(row)
        css.append(["", verdict_css(verdict), "", "", ""])
    return [
        Heading(2, "Claims checked against this run"),
        Para(intro),
        Table(["claim", "verdict", "claimed", "measured", "evidence (cells used)"], rows, css),
        Bullets(
            [
                "held: every matching cell is inside the claimed interval (for a comparison, the median "
                "ratio to/from over cells that differ only as stated); not held: measured outside it, or "
                "a cell ran out of memory where the claim needs less; not measured: no matching cell "
                "could say.",
                "Memory is the figure that decides fit: peak reserved plus the CUDA context where the "
                "context was measured, else NVML device memory, else reserved.",
            ]
        ),
    ]


# --------------------------------------------------------------------------------------- per model


def model_section(
    df: pd.DataFrame, sub: pd.DataFrame, comparison: pd.DataFrame, model: str, steps: int
) -> list[Block]:
    mem_col, mem_label = memory_metric(df)
    multi_run = bool(df["cell_id"].duplicated().any())
    out: list[Block] = [Heading(2, f"{model}")]
    split = varying_knobs(sub, exclude=("model", "batch_size"))
    batches = sorted(set(column(sub, "config.batch_size").dropna()))
    lines: dict[tuple, dict[float, pd.Series]] = {}
    for _, row in sub.iterrows():
        k = knobs(row["record"])
        key = tuple((n, k.get(n)) for n in split) + ((("run", run_group(row)),) if multi_run else ())
        lines.setdefault(key, {})[value(row, "config.batch_size")] = row
    rows, css = [], []
    for key in sorted(lines, key=lambda key: tuple(value_order(v) for _, v in key)):
        grid = [_grid_cell(lines[key].get(b), comparison, mem_col) for b in batches]
        rows.append([" ".join(knob_text(n, v) for n, v in key) or model, *(text for text, _ in grid)])
        css.append(["", *(cls for _, cls in grid)])
    out.append(
        Para(f"Images/s and {mem_label.replace(' (GiB)', '')} per cell; columns are the batch size per GPU.")
    )
    out.append(Table(["configuration"] + [f"bs {b:g}" for b in batches], rows, css))
    out.append(Heading(3, f"{model}: every cell"))
    order = sorted(
        sub.index,
        key=lambda i: (
            tuple(value_order(knobs(sub.loc[i, "record"]).get(n)) for n in split),
            value(sub.loc[i], "config.batch_size") or 0,
            str(sub.loc[i].get("started_at")),
        ),
    )
    budgets = {cell_budget(sub.loc[i]) for i in order} - {None}
    fit_header = f"fits {next(iter(budgets)).name}" if len(budgets) == 1 else "fits its budget"
    emulated = any(b.emulated for b in budgets)
    columns = (mem_col, mem_label, steps, fit_header, multi_run, emulated)
    detail: list[tuple[str, dict[str, str]]] = []  # (status, header -> text)
    unmeasured: dict[tuple, list] = {}  # (status, reason) -> cells: one row each, after the measured
    for label in order:
        row = sub.loc[label]
        if row["status"] in NOT_MEASURED:
            unmeasured.setdefault((row["status"], str(row.get("reason"))), []).append(label)
        else:
            detail.append((row["status"], _detail_row(row, comparison.loc[label], *columns)))
    for (status, _), labels in unmeasured.items():
        cells = _detail_row(sub.loc[labels[0]], comparison.loc[labels[0]], *columns)
        if len(labels) > 1:
            names = [cell_label(sub.loc[i]).removeprefix(f"{model} ") for i in labels]
            cells["cell"] = f"{len(labels)} cells: " + ", ".join(names)
        detail.append((status, cells))
    headers = list(detail[0][1])
    # A column no cell of this model has (reserved memory and MFU on a CPU) only adds noise.
    keep = [h for i, h in enumerate(headers) if i < 2 or any(r[h] not in ("—", "") for _, r in detail)]
    rows = [[r[h] for h in keep] for _, r in detail]
    css = [["", f"status-{status}"] + [""] * (len(keep) - 2) for status, _ in detail]
    return [*out, Table(keep, rows, css)]


def _grid_cell(row: pd.Series | None, comparison: pd.DataFrame, mem_col: str) -> tuple[str, str]:
    """A cell of a model's grid (images/s and memory, or the status) and its HTML class."""
    if row is None:
        return "", ""
    status, noisy = row["status"], bool(noise_text(row))
    text = STATUS_TEXT.get(status, status)
    if status == "ok":
        text = f"{num(value(row, IMAGES_PER_S.path))} img/s"
        mem, predicted = value(row, mem_col), value(row, MEM_PREDICTED)
        if mem is not None:
            text += f" · {mem_text(mem)}"
        if predicted is not None:
            text += f" (predicted {mem_text(predicted)})"
        if comparison.at[row.name, "is_baseline"]:
            text += " (baseline)"
        if noisy:
            text += " (noisy)"
    return text, f"status-{status}" + (" noisy" if noisy else "")


def _detail_row(
    row: pd.Series,
    c: pd.Series,
    mem_col: str,
    mem_label: str,
    steps: int,
    fit_header: str,
    multi_run: bool,
    emulated: bool,
) -> dict[str, str]:
    """A cell's row of a model's every-cell table: header -> text."""
    smoke = row["record"].smoke
    smoke_text = "—"
    if smoke is not None and smoke.first_mean is not None:
        smoke_text = f"{num(smoke.first_mean, 3)} → {num(smoke.last_mean, 3)}"
        if smoke.nonfinite_steps:
            smoke_text += f" ({smoke.nonfinite_steps} non-finite)"
    p10, p90 = value(row, "metrics.step_ms.p10"), value(row, "metrics.step_ms.p90")
    step = num(value(row, STEP_MS.path))
    if p10 is not None and p90 is not None:
        step += f" ({num(p10)}–{num(p90)})"
    mfu = value(row, MFU.path)
    scaling = value(row, "metrics.scaling_efficiency")
    ok = row["status"] == "ok"
    if c["is_baseline"]:
        vs = "baseline"
    elif ok and not pd.isna(c["speedup"]):
        note, saved = c["mem_note"], f", {saved_text(c['mem_saved_pct'])} memory saved"
        vs = speedup_text(c["speedup"]) + (f"; memory {note}" if isinstance(note, str) else saved)
    else:
        vs = c["baseline_note"] if isinstance(c["baseline_note"], str) and ok else "—"
    budget = cell_budget(row)
    fit = {True: "yes", False: "no", None: "—"}[fits(row, budget.gib)] if budget is not None else "—"
    noisy, reason = noise_text(row), row.get("reason")
    notes = "; ".join(x for x in (noisy, reason if isinstance(reason, str) else "") if x)
    status = STATUS_TEXT.get(row["status"], row["status"]) + (" (noisy)" if noisy else "")
    return {
        "cell": cell_label(row),
        "status": status,
        "images/s": rate_text(row),
        "step ms median (p10–p90)": step,
        f"time to {steps_text(steps)} steps": time_text(row, steps) if ok else "—",
        "GPU-hours / 1M images": gpu_hours_text(row) if ok else "—",
        # each value has its unit: GiB, or MiB below 1 GiB
        mem_label.replace(" (GiB)", ""): mem_text(value(row, mem_col)),
        "predicted peak": _predicted_text(row),
        "reserved": mem_text(value(row, MEM_RESERVED)),
        fit_header: fit,
        "MFU": num(mfu * 100, 1, "%") if mfu is not None else "—",
        "energy J / image": num(value(row, ENERGY_PER_IMAGE.path), 3),
        "scaling efficiency": num(scaling * 100, 1, "%") if scaling is not None else "—",
        "vs baseline (speed-up, memory saved)": vs,
        "smoke loss first → last": smoke_text,
        "run": run_text(row) if multi_run else "—",
        "ran on": ran_on_text(row) if emulated else "—",
        "notes": notes,
    }


def rate_text(row: pd.Series) -> str:
    """images/s; a cell with repeats: the median of the per-process medians, its 95% interval and
    the number of processes (bench.repeats)."""
    rep = metrics_of(row).repeats
    ci = rep.get(f"{IMAGES_PER_S.key}_ci") if rep is not None else None
    if not (isinstance(ci, list) and len(ci) == 2):
        return num(value(row, IMAGES_PER_S.path))
    # to the decimals the interval justifies (intervals), at most num's one
    ends = [x for x in ci if x is not None]
    digits = decimals((ends[1] - ends[0]) / 2, 1) if len(ends) == 2 else 1
    text = num(value(row, IMAGES_PER_S.path), digits)
    return text + f" (95% CI {num(ci[0], digits)}–{num(ci[1], digits)}, {rep.count} runs)"


def mem_text(gib: Any) -> str:
    """A memory figure in GiB, or MiB below 1 GiB (ditbench.core.units); — when missing or not a number."""
    return "—" if num(gib) == "—" else memory_text(float(gib))


def _predicted_text(row: pd.Series) -> str:
    """The planner's peak allocated for the cell (the suite's `plan` option), or why there is none."""
    predicted = value(row, MEM_PREDICTED)
    if predicted is not None:
        return mem_text(predicted)
    pred = metrics_of(row).get("prediction")
    if isinstance(pred, dict) and pred.get("status") in ("unsupported", "error"):
        return f"not predicted ({pred['status']})"
    return "—"
