"""Memory budgets and fit: which card a cell was meant for, which card really ran it, whether it fits.
An emulated card is a bigger GPU capped to the card's usable memory minus the measured CUDA context, so
peak reserved + context decides fit everywhere; memory carries over to the emulated card, speed does
not. Where activations are under NEGLIGIBLE_SHARE of the peak, no setting can move it by more (the fp32
training state stays), so such a memory comparison is not judged (`not_meaningful`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from ditbench.core.errors import UserError, shorten
from ditbench.hardware.cards import find_card
from ditbench.records.metrics import CPU_ALLOC, CPU_RSS, DEVICE_MEM, PEAK_ALLOCATED, PEAK_RESERVED, finite
from ditbench.records.model import Metrics
from ditbench.report.cells import gpu_count
from ditbench.report.load import column, value

MEM_ALLOCATED, MEM_RESERVED, MEM_DEVICE, MEM_RSS, MEM_CPU_ALLOC = (
    m.path for m in (PEAK_ALLOCATED, PEAK_RESERVED, DEVICE_MEM, CPU_RSS, CPU_ALLOC)
)
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


def metrics_of(row: pd.Series) -> Metrics:
    return row["record"].metrics or Metrics()


def _number(v: Any) -> float | None:
    v = finite(v)
    return v if v is not None and v >= 0 else None


def _text(v: Any) -> str | None:
    return shorten(v, 60, quote=False) if isinstance(v, str) and v.strip() else None


def cell_budget(row: pd.Series) -> Budget | None:
    """The budget this cell ran under, or None (no cap, or a CPU cell)."""
    config = row["record"].config
    if config.device == "cpu":
        return None
    em, card = metrics_of(row).emulation, config.card
    if em is not None and _number(em.budget_gib):  # > 0
        return Budget(
            gib=em.budget_gib,
            card=_text(em.card) or _text(card),
            real_gpu=_text(em.real_gpu) or _text(row.get("env.gpu_name")) or "a bigger GPU",
            real_total_gib=_number(em.real_total_gib),
            context_gib=_number(em.context_gib),
            allocator_cap_gib=_number(em.allocator_cap_gib),
        )
    try:
        gib = config.gpu_memory_gib or (find_card(str(card)).usable_gib if card else None)
    except UserError:
        return None
    if gib is None:
        return None
    # a capped bigger card that ran a cell without metrics (one the runner skipped, or that timed out)
    gpu, total = _text(row.get("env.gpu_name")), value(row, "env.gpu_memory_gib")
    bigger = gpu is not None and total is not None and total > gib + 0.05
    return Budget(gib, _text(card), gpu if bigger else None, total if bigger else None)


def fit_memory(row: pd.Series) -> tuple[float | None, str]:
    """The memory that decides whether a cell fits a card (GiB), and what it is."""
    reserved = value(row, MEM_RESERVED)
    em = metrics_of(row).emulation
    context = _number(em.context_gib) if em is not None else None
    if reserved is not None and context is not None:
        return reserved + context, "peak reserved + CUDA context"
    return _first(row, (MEM_DEVICE, "NVML device memory"), (MEM_RESERVED, "peak reserved"), _ALLOCATED)


_ALLOCATED = (MEM_ALLOCATED, "peak allocated")
_CPU = ((MEM_CPU_ALLOC, "CPU allocator peak"), (MEM_RSS, "CPU peak RSS"))


def _first(row: pd.Series, *choices: tuple[str, str]) -> tuple[float | None, str]:
    for name, label in choices:
        if (v := value(row, name)) is not None:
            return v, label
    return None, ""


def shown_memory(row: pd.Series) -> tuple[float | None, str]:
    """fit_memory on a GPU; on a CPU the allocator's peak, else (a job of several processes, which
    does not measure it) the process's peak RSS."""
    mem, label = fit_memory(row)
    return (mem, label) if mem is not None else _first(row, *_CPU)


def memory_metric(df: pd.DataFrame) -> tuple[str, str]:
    """(column, label) of the memory in the tables: peak allocated on a GPU, else as shown_memory."""
    ok = df[df["status"] == "ok"]
    name, label = next(((n, t) for n, t in (_ALLOCATED, *_CPU) if column(ok, n).notna().any()), _ALLOCATED)
    return name, f"{label} (GiB)"


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


STATE_BYTES_PER_PARAM = 20  # fp32 weights 4, gradients 4, Adam 8, EMA 4
NEGLIGIBLE_SHARE = 0.10


def activation_share(row: pd.Series) -> float | None:
    """Activations' share of the cell's peak allocated, or None when unknown: the planner's components
    where the record has them (a suite's `plan` option writes metrics.prediction), else the measured peak
    (GPU, or the CPU allocator's) less the training state (FSDP shards it over the ranks)."""
    pred = metrics_of(row).get("prediction")
    parts = pred.get("components") if isinstance(pred, dict) else None
    if isinstance(parts, dict):
        act, peak = value(parts, "activations"), value(pred, "peak_allocated_gib")
        if act is not None and peak:
            return min(max(act / peak, 0.0), 1.0)
    peak = value(row, MEM_ALLOCATED) or value(row, MEM_CPU_ALLOC)
    params = value(row, "metrics.params")
    if not peak or not params:
        return None
    ranks = gpu_count(row) if row.get("config.strategy") == "fsdp" else 1
    return max(peak - params * STATE_BYTES_PER_PARAM / ranks / 2**30, 0.0) / peak


def not_meaningful(row: pd.Series) -> str | None:
    """'not meaningful at this scale: activations are 3.0% of the peak' when the cell's share is under
    NEGLIGIBLE_SHARE; None when it is not, or is unknown."""
    share = activation_share(row)
    if share is None or share >= NEGLIGIBLE_SHARE:
        return None
    return f"not meaningful at this scale: activations are {share:.{1 if share < 0.1 else 0}%} of the peak"
