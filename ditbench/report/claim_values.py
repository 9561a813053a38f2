"""What a claim reads from a run: a cell's value of a claim's metric, which cells a selector matches,
and where a speed was measured (a speed speaks only for the card that computed it).
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from ditbench.cards import find_card
from ditbench.errors import UserError
from ditbench.metrics import registry
from ditbench.records.metrics import MFU, RECORD_METRICS, STEP_MS, finite
from ditbench.report.analysis import gpu_hours_per_million_images, time_to_steps_s
from ditbench.report.cells import knobs
from ditbench.report.claims import METRICS, Claim, metric_kind
from ditbench.report.load import value
from ditbench.report.memory import MEM_ALLOCATED, cell_budget, fit_memory

GIB_TO_GB = 2**30 / 1e9
RECORD_PATHS = {m.name: m.path for m in RECORD_METRICS}
_ABSENT = object()


def gb_scale(metric: str | None) -> float:
    """The factor from GiB to the metric's memory unit."""
    return GIB_TO_GB if metric == "peak_memory_gb" else 1


def _unit(metric: str) -> str:
    return METRICS[metric][1] if metric in METRICS else ""  # a quality figure has none


def fmt(v: float, metric: str | None) -> str:
    if metric == MFU.name:
        return MFU.show(v)
    if metric is not None and metric_kind(metric) == "quality":
        return registry.OUTPUTS[metric].fmt.format(v)
    unit = _unit(metric) if metric else "GiB"
    if unit in ("GiB", "GB"):
        return f"{v:.2f} {unit}"  # as every memory figure in the report
    text = f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}"
    return f"{text} {unit}".rstrip()


def metric_value(row: pd.Series, metric: str, target_steps: int) -> tuple[float | None, str]:
    """(value, "") of an ok cell, or (None, why it has none)."""
    kind = metric_kind(metric)
    if kind == "quality":
        q = row["record"].quality  # the last evaluation's figure
        v = q.evaluations[-1].metrics.get(metric) if q is not None and q.evaluations else None
        v = finite(v)
        return (v, "") if v is not None else (None, f"no quality evaluation of the record has {metric}")
    if kind == "memory" and row.get("config.device") == "cpu":
        return None, "a CPU cell has no GPU memory figure"
    if metric in ("peak_memory_gib", "peak_memory_gb"):
        mem, _ = fit_memory(row)
        v = None if mem is None else mem * gb_scale(metric)
    elif metric == "peak_allocated_gib":
        v = value(row, MEM_ALLOCATED)
    elif metric == "step_time":
        ms = value(row, STEP_MS.path)
        v = None if ms is None else ms / 1000
    elif metric == "days_to_target":
        s = time_to_steps_s(row, target_steps)
        v = None if s is None else s / 86400
    elif metric == "gpu_hours_per_million_images":
        v = gpu_hours_per_million_images(row)
    else:  # the record's own (images/s, steps/s, MFU): read where the gate reads them
        v = value(row, RECORD_PATHS[metric])
    return (v, "") if v is not None else (None, f"the record has no {metric}")


def speed_elsewhere(row: pd.Series, card: str | None) -> str:
    """Why this cell's absolute speed does not speak for `card` ('' when it does, or no card is named)."""
    if card is None:
        return ""
    if row.get("config.device") == "cpu":
        return f"ran on a CPU, not on an {card}"
    budget = cell_budget(row)
    if budget is not None and budget.emulated:
        return f"ran on {budget.ran_on()}: that is the {budget.real_gpu}'s speed, not an {card}'s"
    gpu = row.get("env.gpu_name")
    try:
        same = bool(gpu) and find_card(str(gpu)).name == card
    except UserError:
        same = False
    return "" if same else f"ran on {gpu or 'an unknown GPU'}, not on an {card}"


def where_measured(rows: list[pd.Series]) -> str:
    """'; speeds measured on a CPU' (or on a capped bigger card) for speed evidence; '' on a plain GPU."""
    places = []
    for row in rows:
        budget = cell_budget(row)
        if row.get("config.device") == "cpu":
            places.append("a CPU")
        elif budget is not None and budget.emulated:
            places.append(budget.ran_on())
    places = list(dict.fromkeys(places))
    return f"; speeds measured on {' and '.join(places)}" if places else ""


def _listed(want: Any) -> list[Any]:
    return want if isinstance(want, list) else [want]


def _equal(have: Any, want: Any) -> bool:
    if isinstance(have, bool) or isinstance(want, bool):
        return have is want
    return have == want


def matches(k: dict[str, Any], selector: dict[str, Any]) -> bool:
    return all(any(_equal(k.get(key, _ABSENT), w) for w in _listed(want)) for key, want in selector.items())


def why_no_match(df: pd.DataFrame, selector: dict[str, Any]) -> str:
    all_knobs = [knobs(r) for r in df["record"]]
    for key, want in selector.items():
        present = list(dict.fromkeys(str(k.get(key, "(not set)")) for k in all_knobs))
        if not any(_equal(k.get(key, _ABSENT), w) for k in all_knobs for w in _listed(want)):
            listed = ", ".join(present[:8]) + (", ..." if len(present) > 8 else "")
            return f"no cell in this run has {key} = {want} (it has {listed})"
    return f"no cell in this run matches {selector_text(selector)} as a whole"


def selector_text(selector: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in selector.items())


def latest_per_cell(df: pd.DataFrame) -> pd.DataFrame:
    if not df["cell_id"].duplicated().any():
        return df
    order = df.assign(_order=range(len(df)))
    order = order.sort_values(["started_at", "_order"], na_position="first", kind="stable")
    return order.drop_duplicates("cell_id", keep="last").sort_values("_order").drop(columns="_order")


def claimed_text(claim: Claim) -> str:
    m, tol, low, high = claim.metric, claim.tolerance_pct, claim.low, claim.high
    if claim.expect == "fits":
        gib = claim.fits_gib
        return f"fits {claim.fits_card} ({gib:g} GiB)" if claim.fits_card else f"fits {gib:g} GiB"
    if claim.expect == "ratio":
        return f"{m} to/from ×{float(claim.stated):g} ± {tol:g}% ({low:.3g}–{high:.3g})"
    if claim.expect == "ratio_range":
        return f"{m} to/from ×{low:.3g}–{high:.3g}"
    if claim.expect == "at_most":
        return f"at most {fmt(high, m)}"
    if claim.expect == "at_least":
        return f"at least {fmt(low, m)}"
    unit = _unit(m) if m and m != MFU.name else ""  # said once, after the upper end
    interval = f"{fmt(low, m).removesuffix(unit).strip() if unit else fmt(low, m)}–{fmt(high, m)}"
    return interval if claim.expect == "range" else f"{fmt(float(claim.stated), m)} ± {tol:g}% ({interval})"


def spread(values: list[float], metric: str | None) -> str:
    if len(values) == 1:
        return fmt(values[0], metric)
    return f"{fmt(min(values), metric)} to {fmt(max(values), metric)} over {len(values)} cells"


def basis(row: pd.Series, metric: str) -> str:
    if metric in ("peak_memory_gib", "peak_memory_gb"):
        _, label = fit_memory(row)
        return f" {label}" if label else ""
    return ""


def status_text(row: pd.Series) -> str:
    reason = row.get("reason")
    reason = f" ({str(reason)[:120]})" if isinstance(reason, str) and reason else ""
    return f"status {row['status']}{reason}"
