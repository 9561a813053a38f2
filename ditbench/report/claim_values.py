"""What a claim reads from a run: a cell's value of a claim's metric, which cells a selector matches,
and where a speed was measured (a speed speaks only for the card that computed it).
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from ditbench.cards import find_card
from ditbench.errors import UserError
from ditbench.metrics import registry
from ditbench.records.metrics import MFU, RECORD_METRICS, STEP_MS
from ditbench.report.cells import knobs
from ditbench.report.claims import METRICS, Claim, metric_kind
from ditbench.report.load import value
from ditbench.report.memory import MEM_ALLOCATED, cell_budget, fit_memory
from ditbench.report.timing import gpu_hours_per_million_images, time_to_steps_s

GIB_TO_GB = 2**30 / 1e9
RECORD_PATHS = {m.name: m.path for m in RECORD_METRICS}
_ABSENT = object()


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
        v = _last_evaluation(row).get(metric)
        v = v if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None
        return (v, "") if v is not None else (None, f"no quality evaluation of the record has {metric}")
    if kind == "memory" and row.get("config.device") == "cpu":
        return None, "a CPU cell has no GPU memory figure"
    if metric in ("peak_memory_gib", "peak_memory_gb"):
        mem, _ = fit_memory(row)
        v = None if mem is None else mem * (GIB_TO_GB if metric == "peak_memory_gb" else 1)
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


def _last_evaluation(row: pd.Series) -> dict[str, Any]:
    """The metrics of the record's last quality evaluation ({} without one)."""
    q = row["record"].quality
    return q.evaluations[-1].metrics if q is not None and q.evaluations else {}


def _same_card(gpu_name: Any, card: str) -> bool:
    try:
        return bool(gpu_name) and find_card(str(gpu_name)).name == card
    except UserError:
        return False


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
    return "" if _same_card(gpu, card) else f"ran on {gpu or 'an unknown GPU'}, not on an {card}"


def where_measured(rows: list[pd.Series]) -> str:
    """' (speeds of NVIDIA H200 capped to ...)' for speed evidence; '' on a plain GPU."""
    places = []
    for row in rows:
        budget = cell_budget(row)
        if row.get("config.device") == "cpu":
            places.append("a CPU")
        elif budget is not None and budget.emulated:
            places.append(budget.ran_on())
    places = list(dict.fromkeys(places))
    return f"; speeds measured on {' and '.join(places)}" if places else ""


def matches(k: dict[str, Any], selector: dict[str, Any]) -> bool:
    for key, want in selector.items():
        have = k.get(key, _ABSENT)
        if isinstance(want, list):
            if not any(_equal(have, w) for w in want):
                return False
        elif not _equal(have, want):
            return False
    return True


def _equal(have: Any, want: Any) -> bool:
    if isinstance(have, bool) or isinstance(want, bool):
        return have is want
    return have == want


def why_no_match(df: pd.DataFrame, selector: dict[str, Any]) -> str:
    all_knobs = [knobs(r) for r in df["record"]]
    for key, want in selector.items():
        wanted = want if isinstance(want, list) else [want]
        present = list(dict.fromkeys(str(k.get(key, "(not set)")) for k in all_knobs))
        if not any(_equal(k.get(key, _ABSENT), w) for k in all_knobs for w in wanted):
            listed = ", ".join(present[:8]) + (", ..." if len(present) > 8 else "")
            return f"no cell in this run has {key} = {want} (it has {listed})"
    text = ", ".join(f"{k}={v}" for k, v in selector.items())
    return f"no cell in this run matches {text} as a whole"


def latest_per_cell(df: pd.DataFrame) -> pd.DataFrame:
    if not df["cell_id"].duplicated().any():
        return df
    order = df.assign(_order=range(len(df)))
    order = order.sort_values(["started_at", "_order"], na_position="first", kind="stable")
    return order.drop_duplicates("cell_id", keep="last").sort_values("_order").drop(columns="_order")


def claimed_text(claim: Claim) -> str:
    m, tol = claim.metric, claim.tolerance_pct
    if claim.expect == "fits":
        gib = claim.fits_gib
        return f"fits {claim.fits_card} ({gib:g} GiB)" if claim.fits_card else f"fits {gib:g} GiB"
    if claim.expect in ("ratio", "ratio_range"):
        interval = f"{claim.low:.3g}–{claim.high:.3g}"
        if claim.expect == "ratio":
            return f"{m} to/from ×{float(claim.stated):g} ± {tol:g}% ({interval})"
        return f"{m} to/from ×{interval}"
    interval = f"{_bare(claim.low, m)}–{fmt(claim.high, m)}"
    if claim.expect == "value":
        return f"{fmt(float(claim.stated), m)} ± {tol:g}% ({interval})"
    if claim.expect == "range":
        return interval
    if claim.expect == "at_most":
        return f"at most {fmt(claim.high, m)}"
    return f"at least {fmt(claim.low, m)}"


def _bare(v: float, metric: str | None) -> str:
    """fmt without the unit."""
    unit = _unit(metric) if metric and metric != MFU.name else ""
    return fmt(v, metric).removesuffix(unit).strip() if unit else fmt(v, metric)


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
