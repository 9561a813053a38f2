"""Memory budgets and fit: which card a cell was meant for, which card really ran it, and whether it fits.

A suite caps a bigger GPU to emulate a smaller card (`card: "RTX 4090"` or `gpu_memory_gib`). The
runner records
`metrics.emulation` = {card, budget_gib, context_gib, allocator_cap_gib, real_gpu, real_total_gib,
note}: the allocator is capped at the card's usable memory minus the CUDA context measured on the
spot, so "completed under the cap" means "peak reserved + context <= the card's memory". That sum is
the memory that decides fit here, in tables, plots and claims alike. Without a measured context the
next best figure is NVML device memory (it includes the context), then reserved, then allocated.

Memory fits on an emulated card; speed does not carry over: a capped H200 computes at an H200's
speed. Everything that shows an emulated cell says which card really ran it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from ditbench.cards import find_card
from ditbench.errors import UserError, shorten
from ditbench.records.metrics import (
    CPU_ALLOC,
    CPU_RSS,
    DEVICE_MEM,
    PEAK_ALLOCATED,
    PEAK_RESERVED,
    finite,
)
from ditbench.records.model import Metrics, Record
from ditbench.report.load import column, value

MEM_ALLOCATED, MEM_RESERVED, MEM_DEVICE, MEM_RSS = (
    m.path for m in (PEAK_ALLOCATED, PEAK_RESERVED, DEVICE_MEM, CPU_RSS)
)
MEM_CPU_ALLOC = CPU_ALLOC.path  # the CPU allocator's peak (RSS stays flat on a CPU)
MEM_PREDICTED = "metrics.predicted_peak_gib"  # the planner's peak allocated, with the suite's `plan` option
SAME_GIB = 0.05  # budgets closer than this (51 MiB) are the same card: 23.99 GiB is "24 GiB"


@dataclass(frozen=True)
class Budget:
    """The memory a cell was allowed: an emulated (or real) card's usable GiB."""

    gib: float
    card: str | None = None  # the card name the suite gave, if any
    real_gpu: str | None = None  # set when a bigger card was capped to emulate this budget
    real_total_gib: float | None = None
    context_gib: float | None = None
    allocator_cap_gib: float | None = None

    @property
    def emulated(self) -> bool:
        return self.real_gpu is not None

    @property
    def name(self) -> str:
        return f"{self.card} ({self.gib:g} GiB)" if self.card else f"{self.gib:g} GiB"

    def ran_on(self) -> str:
        """'an NVIDIA H200 (139.8 GiB) capped to 23.99 GiB' or '' when not emulated."""
        if not self.emulated:
            return ""
        total = f" ({self.real_total_gib:.1f} GiB)" if self.real_total_gib else ""
        return f"{self.real_gpu}{total} capped to {self.gib:g} GiB"


def _record(row: pd.Series | dict[str, Any]) -> Record | None:
    record = row.get("record") if hasattr(row, "get") else None
    return record if isinstance(record, Record) else None


def metrics_of(row: pd.Series | dict[str, Any]) -> Metrics:
    """The record's metrics (empty when null, or for a row without a record)."""
    record = _record(row)
    return (record.metrics if record is not None else None) or Metrics()


def _card_gib(name: Any) -> float | None:
    try:
        return find_card(str(name)).usable_gib
    except UserError:
        return None


def _number(v: Any) -> float | None:
    """A finite number >= 0, else None."""
    v = finite(v)
    return v if v is not None and v >= 0 else None


def cell_budget(row: pd.Series | dict[str, Any]) -> Budget | None:
    """The budget this cell ran under, or None (no cap, or a CPU cell)."""
    record = _record(row)
    if record is None or record.config.device == "cpu":
        return None
    em, card = metrics_of(row).emulation, record.config.card
    if em is not None and _number(em.budget_gib):  # > 0
        return Budget(
            gib=em.budget_gib,
            card=_text(em.card) or _text(card),
            real_gpu=_text(em.real_gpu) or _text(row.get("env.gpu_name")) or "a bigger GPU",
            real_total_gib=_number(em.real_total_gib),
            context_gib=_number(em.context_gib),
            allocator_cap_gib=_number(em.allocator_cap_gib),
        )
    gib = record.config.gpu_memory_gib or (_card_gib(card) if card else None)
    if gib is None:
        return None
    real_gpu, real_total = _real_card(row, gib)
    return Budget(gib=gib, card=_text(card), real_gpu=real_gpu, real_total_gib=real_total)


def _text(v: Any) -> str | None:
    return shorten(v, 60, quote=False) if isinstance(v, str) and v.strip() else None


def _real_card(row: pd.Series | dict[str, Any], gib: float) -> tuple:
    """(real GPU, its GiB) when a capped bigger card ran a cell without metrics (one the runner
    skipped, or that timed out); (None, None) when it was the card."""
    gpu, total = row.get("env.gpu_name"), value(row, "env.gpu_memory_gib")
    if _text(gpu) and total is not None and total > gib + 0.05:
        return _text(gpu), total
    return None, None


def fit_memory(row: pd.Series | dict[str, Any]) -> tuple[float | None, str]:
    """The memory that decides whether a cell fits a card (GiB), and what it is."""
    reserved = value(row, MEM_RESERVED)
    em = metrics_of(row).emulation
    context = _number(em.context_gib) if em is not None else None
    if reserved is not None and context is not None:
        return reserved + context, "peak reserved + CUDA context"
    for name, label in (
        (MEM_DEVICE, "NVML device memory"),
        (MEM_RESERVED, "peak reserved"),
        (MEM_ALLOCATED, "peak allocated"),
    ):
        v = value(row, name)
        if v is not None:
            return v, label
    return None, ""


def shown_memory(row: pd.Series | dict[str, Any]) -> tuple[float | None, str]:
    """fit_memory on a GPU; on a CPU the allocator's peak, else (a job of several processes, which
    does not measure it) the process's peak RSS."""
    mem, label = fit_memory(row)
    if mem is None:
        for name, text in ((MEM_CPU_ALLOC, "CPU allocator peak"), (MEM_RSS, "CPU peak RSS")):
            if value(row, name) is not None:
                return value(row, name), text
    return mem, label


def memory_metric(df: pd.DataFrame) -> tuple[str, str]:
    """(column, label) of the memory in the tables: peak allocated on a GPU, else the CPU allocator's
    peak, else (a CPU job of several processes, which does not measure it) the peak RSS."""
    ok = df[df["status"] == "ok"]
    if column(ok, MEM_ALLOCATED).notna().any():
        return MEM_ALLOCATED, "peak allocated (GiB)"
    if column(ok, MEM_CPU_ALLOC).notna().any():
        return MEM_CPU_ALLOC, "CPU allocator peak (GiB)"
    if column(ok, MEM_RSS).notna().any():
        return MEM_RSS, "CPU peak RSS (GiB)"
    return MEM_ALLOCATED, "peak allocated (GiB)"


def card_lower_bounds(df: pd.DataFrame) -> dict[Any, float]:
    """gpu_name -> the most memory an ok cell used on it (the card holds at least that)."""
    bounds: dict[Any, float] = {}
    for _, row in df[df["status"] == "ok"].iterrows():
        mem, _ = fit_memory(row)
        if mem is not None:
            name = row.get("env.gpu_name")
            bounds[name] = max(bounds.get(name, 0.0), mem)
    return bounds


def needs_more_than(row: pd.Series, bounds: dict[Any, float] | None = None) -> float | None:
    """For an out-of-memory cell: the GiB it is known to need more than (its cap, or its card)."""
    if row["status"] != "oom":
        return None
    own = cell_budget(row)
    if own is not None:
        return own.gib
    return value(row, "env.gpu_memory_gib") or (bounds or {}).get(row.get("env.gpu_name"))


def fits(row: pd.Series, budget_gib: float, bounds: dict[Any, float] | None = None) -> bool | None:
    """Does this cell fit a card of budget_gib? None when the record cannot tell."""
    own = cell_budget(row)
    if row["status"] == "ok":
        flag = metrics_of(row).fits_budget
        if flag is not None and own is not None and abs(own.gib - budget_gib) < SAME_GIB:
            return flag  # the runner's verdict for the budget it ran under
        mem, _ = fit_memory(row)
        if mem is not None:
            return mem <= budget_gib
        return True if own is not None and own.gib <= budget_gib else None
    need = needs_more_than(row, bounds)
    return False if need is not None and need >= budget_gib - SAME_GIB else None


def emulated_cells(df: pd.DataFrame) -> dict[Budget, list[int]]:
    """Budget -> row labels of the cells that ran on a bigger card capped to it."""
    out: dict[Budget, list[int]] = {}
    for label, row in df.iterrows():
        budget = cell_budget(row)
        if budget is not None and budget.emulated:
            out.setdefault(budget, []).append(label)
    return out
