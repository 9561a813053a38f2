"""What the measurements say: speed-up over the suite's baseline, the fastest cell that fits, and the
training time: N / the measured steps/s, N the DiT paper's 400,000 steps unless the suite or
`report --target-steps` says otherwise; GPU-hours per million images = GPUs x 10^6 / images/s / 3600,
which does not depend on the batch."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from ditbench.core.errors import UserError
from ditbench.records.metrics import IMAGES_PER_S, STEPS_PER_S
from ditbench.report.cells import gpu_count, knob_index, knob_key, knobs, model_size_key, same_run_first
from ditbench.report.load import column, flatten, value
from ditbench.report.memory import cell_budget, fit_memory, fits, memory_metric, not_meaningful


def baseline_comparison(df: pd.DataFrame) -> pd.DataFrame:
    """Per row: its baseline cell (the record's suite_baseline keys set), the speed-up (images/s over the
    baseline's) and memory saved (1 - memory / the baseline's, in percent; a `mem_note` instead where
    the baseline's activations are too small a share of its peak for a saving to show)."""
    mem_col, _ = memory_metric(df)
    index = knob_index(df)
    out = pd.DataFrame(
        index=df.index,
        columns=[
            "baseline_label",
            "baseline_cell_id",
            "baseline_name",
            "is_baseline",
            "speedup",
            "mem_saved_pct",
            "mem_note",
            "baseline_note",
        ],
    )
    out["is_baseline"] = False
    for label, row in df.iterrows():
        base = row.get("suite_baseline")
        if not isinstance(base, dict) or not base:
            out.at[label, "baseline_note"] = "the suite names no baseline"
            continue
        k = knobs(row["record"])
        wanted = flatten(base)
        unknown = [key for key in wanted if key not in k]
        if unknown:
            out.at[label, "baseline_note"] = f"baseline key {', '.join(unknown)} is not a knob of this cell"
            continue
        target = {**k, **wanted}
        matches = index.get(knob_key(target), [])
        if not matches:
            out.at[label, "baseline_note"] = "its baseline cell did not run ok"
            continue
        base_label = same_run_first(df, matches, row)
        brow = df.loc[base_label]
        out.at[label, "baseline_label"] = base_label
        out.at[label, "baseline_cell_id"] = brow["cell_id"]
        out.at[label, "baseline_name"] = brow.get("cell_name")
        out.at[label, "is_baseline"] = target == k
        if row["status"] != "ok":
            continue
        speed, base_speed = value(row, IMAGES_PER_S.path), value(brow, IMAGES_PER_S.path)
        if speed is not None and base_speed:
            out.at[label, "speedup"] = speed / base_speed
        mem, base_mem = value(row, mem_col), value(brow, mem_col)
        note = not_meaningful(brow) if target != k else None
        if note:
            out.at[label, "mem_note"] = note
        elif mem is not None and base_mem:
            out.at[label, "mem_saved_pct"] = (1 - mem / base_mem) * 100
    out["speedup"] = pd.to_numeric(out["speedup"], errors="coerce")
    out["mem_saved_pct"] = pd.to_numeric(out["mem_saved_pct"], errors="coerce")
    return out


# ----------------------------------------------------------------------------------- recommendations


@dataclass
class Recommendation:
    budget: str  # "24 GiB (suite cap)" or "the NVIDIA H200 it ran on"
    gpus: int
    model: str
    cell_name: str | None  # None: nothing fits
    rate: float | None = None  # images/s
    memory_gib: float | None = None
    memory_label: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    note: str = ""


@dataclass
class Recommendations:
    per_model: list[Recommendation]
    largest: dict[tuple[str, int], Recommendation]  # (budget, gpus) -> the biggest model with a fitting cell


def _budget_label(row: pd.Series) -> tuple[str, float | None]:
    budget = cell_budget(row)
    if budget is not None:
        if budget.emulated:
            return (
                f"{budget.name}, emulated on {budget.ran_on()} (speeds are the {budget.real_gpu}'s)",
                budget.gib,
            )
        return budget.name, budget.gib
    gpu = row.get("env.gpu_name")
    device = row.get("config.device")
    if device == "cpu" or not gpu:
        return "this machine (CPU)", None
    card = value(row, "env.gpu_memory_gib")
    return (f"the {gpu} ({card:.1f} GiB) it ran on" if card else f"the {gpu} it ran on"), None


def recommend(df: pd.DataFrame) -> Recommendations:
    """Per model and budget: the fastest ok cell that fits; per budget: the largest model that fits."""
    per_model: list[Recommendation] = []
    largest: dict[tuple[str, int], Recommendation] = {}
    best_size: dict[tuple[str, int], tuple] = {}
    groups: dict[tuple[str, int], list[Any]] = {}
    budgets: dict[str, float | None] = {}
    for label, row in df.iterrows():
        name, cap = _budget_label(row)
        budgets[name] = cap
        gpus = gpu_count(row)
        groups.setdefault((name, gpus), []).append(label)
    for (budget, gpus), labels in groups.items():
        sub = df.loc[labels]
        cap = budgets[budget]
        for model in _ordered_models(sub):
            rows = sub[sub["config.model"] == model]
            fitting = [
                r
                for _, r in rows.iterrows()
                if r["status"] == "ok" and (cap is None or fits(r, cap) is not False)
            ]
            if not fitting:
                statuses = ", ".join(f"{n} {s}" for s, n in rows["status"].value_counts().items())
                per_model.append(Recommendation(budget, gpus, model, None, note=f"nothing fits ({statuses})"))
                continue
            best = max(fitting, key=lambda r: value(r, IMAGES_PER_S.path) or 0.0)
            mem, mem_label = fit_memory(best)
            rec = Recommendation(
                budget,
                gpus,
                model,
                best.get("cell_name"),
                value(best, IMAGES_PER_S.path),
                mem,
                mem_label,
                knobs(best["record"]),
            )
            if cap is not None and mem is None:
                rec.note = "memory not measured; ran inside the cap"
            per_model.append(rec)
            size = model_size_key(model, value(best, "metrics.params"))
            if (budget, gpus) not in best_size or size > best_size[(budget, gpus)]:
                best_size[(budget, gpus)] = size
                largest[(budget, gpus)] = rec
    return Recommendations(per_model, largest)


def _ordered_models(df: pd.DataFrame) -> list[str]:
    """Smallest first: by the largest parameter count a model's records give, else by its name."""
    params = column(df, "metrics.params").groupby(df["config.model"], sort=False).max().fillna(0)
    return sorted(params.index, key=lambda m: model_size_key(m, params[m] or None))


# ------------------------------------------------------------------------------------------ time

DEFAULT_TARGET_STEPS = 400_000
PAPER_GLOBAL_BATCH = 256
MAX_TARGET_STEPS = 10**12


def target_steps(df: pd.DataFrame, override: int | None = None) -> tuple[int, str]:
    """(N, where it came from): the report option, else the suite's target_steps, else 400,000."""
    if override is not None:
        check_target_steps(override, "--target-steps")
        return int(override), "given with --target-steps"
    found = set()
    for record in df["record"]:
        v = record.get("target_steps")
        if isinstance(v, int) and not isinstance(v, bool) and 0 < v <= MAX_TARGET_STEPS:
            found.add(v)
    if len(found) == 1:
        return found.pop(), "the suite's target_steps"
    if len(found) > 1:
        raise UserError(
            f"the records name different target_steps ({', '.join(f'{n:,}' for n in sorted(found))}); "
            "give one with --target-steps N."
        )
    return DEFAULT_TARGET_STEPS, "default: the DiT paper's checkpoint for its model table"


def check_target_steps(n: Any, where: str) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or not 0 < n <= MAX_TARGET_STEPS:
        raise UserError(f"{where} must be a whole number of steps from 1 to {MAX_TARGET_STEPS:,}, got {n!r}.")
    return n


def time_to_steps_s(row: pd.Series | dict[str, Any], steps: int) -> float | None:
    sps = value(row, STEPS_PER_S.path)
    return steps / sps if sps else None


def gpu_hours_per_million_images(row: pd.Series | dict[str, Any]) -> float | None:
    img_s = value(row, IMAGES_PER_S.path)
    return gpu_count(row) * 1e6 / img_s / 3600 if img_s else None


def duration_text(seconds: float | None) -> str:
    """Hours below two days, days above; minutes below an hour."""
    if seconds is None or seconds != seconds:
        return "—"
    hours = seconds / 3600
    if hours < 1:
        return f"{seconds / 60:.0f} min"
    if hours < 48:
        return f"{hours:.1f} h"
    days = hours / 24
    return f"{days:.1f} days" if days < 1000 else f"{days:,.0f} days"


def global_batch(row: pd.Series | dict[str, Any]) -> int | None:
    """The record's global batch (`spec.knobs.Knobs.global_batch`, which every record's config states)."""
    gb = value(row, "config.global_batch")
    return int(gb) if gb is not None else None


def time_text(row: pd.Series | dict[str, Any], steps: int) -> str:
    """'12.4 days on 1 GPU (global batch 32, not the paper's 256)'."""
    seconds = time_to_steps_s(row, steps)
    if seconds is None:
        return "—"
    n = gpu_count(row)
    where = "the CPU" if on_cpu(row) else f"{n} GPU{'s' if n > 1 else ''}"
    text = f"{duration_text(seconds)} on {where}"
    gb = global_batch(row)
    if gb is not None and gb != PAPER_GLOBAL_BATCH:
        text += f" (global batch {gb}, not the paper's {PAPER_GLOBAL_BATCH})"
    return text


def gpu_hours_text(row: pd.Series | dict[str, Any]) -> str:
    h = gpu_hours_per_million_images(row)
    if h is None:
        return "—"
    text = f"{h:,.0f}" if h >= 100 else f"{h:.1f}" if h >= 1 else f"{h:.2f}"
    return f"{text} (CPU-hours)" if on_cpu(row) else text


def on_cpu(row: pd.Series | dict[str, Any]) -> bool:
    return row.get("config.device") == "cpu"
