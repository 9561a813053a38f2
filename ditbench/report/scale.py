"""Whether a memory comparison can show at the scale a cell ran: activations' share of its peak.

Checkpointing, 16-bit autocast, the attention kernel and the batch size change the activations kept
for backward; weights, gradients, Adam's moments and the EMA stay fp32 whatever they are set to. Under
NEGLIGIBLE_SHARE no such setting can move the peak by more than that share, so "0% saved" or "not held"
would be about the model's size, not the technique: such a comparison is not shown or judged. Above it
the comparison stands (DiT-L/4 at batch 16 keeps about a fifth of its peak in activations on an H200).
"""

from __future__ import annotations

import pandas as pd

from ditbench.report.cells import gpu_count
from ditbench.report.load import value
from ditbench.report.memory import MEM_ALLOCATED, MEM_CPU_ALLOC, metrics_of

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
