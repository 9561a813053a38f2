"""Data-parallel cells per rank: what one rank of N holds, from the one-GPU trace of the cell.

DDP: every rank holds what one GPU does plus the reducer's buckets (25 MiB after a first of 1 MiB).
FSDP2: a rank holds 1/N of the weights, gradients, AdamW state and EMA; while a step runs also the
root's gathered weights and, where the backward starts, five float32 blocks' worth (the computed and
the prefetched block's all-gather output and weights, its gradients and their reduce-scatter input).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

from ditbench.plan.allocator import live_at
from ditbench.plan.speed import DDP_BUCKET_BYTES
from ditbench.plan.trace import STATE_LABELS

FIRST_BUCKET_BYTES = 1 << 20  # torch.distributed's first DDP bucket


def world(cell: dict[str, Any]) -> int:
    return cell.get("gpus", 1) * cell.get("nodes", 1)


@functools.lru_cache(maxsize=32)
def _shapes(model: str, image_size: int, num_classes: int) -> tuple[list, list]:
    """(the first block's parameter shapes, every parameter's shape), from the model built on meta."""
    import torch

    from ditbench.models.build import build_model

    with torch.device("meta"):
        m = build_model(model, image_size=image_size, num_classes=num_classes)
    return [tuple(p.shape) for p in m.blocks[0].parameters()], [tuple(p.shape) for p in m.parameters()]


def _numel(shape: tuple, n: int = 1) -> int:
    """Elements of a parameter's shard on one of n ranks (the first dimension split, padded)."""
    rows = shape[0] if shape else 1
    return -(-rows // n) * math.prod(shape[1:])


def sizes(cell: dict[str, Any]) -> tuple[float, int, int]:
    """(the share of a state tensor one FSDP rank holds, a block's parameter bytes, the root's)."""
    from ditbench.models.configs import get_config

    block, every = _shapes(cell["model"], cell["image_size"], cell["num_classes"])
    total = sum(_numel(s) for s in every)
    share = sum(_numel(s, world(cell)) for s in every) / total
    block_bytes = 4 * sum(_numel(s) for s in block)
    return share, block_bytes, 4 * total - get_config(cell["model"]).depth * block_bytes


def state_bytes(cell: dict[str, Any]) -> dict[str, float]:
    """Bytes one rank's weights, gradients, AdamW state (two moments) and EMA hold."""
    share, _, _ = sizes(cell) if cell.get("strategy") == "fsdp" else (1.0, 0, 0)
    _, every = _shapes(cell["model"], cell["image_size"], cell["num_classes"])
    whole = 4 * sum(_numel(s) for s in every)
    one = whole * share
    return {"weights": one, "gradients": one, "optimizer": 2 * one, "ema": one}


@dataclass
class RankTrace:
    """The events and sizes one rank allocates, its measured window and what each allocation holds."""

    events: list[int]
    sizes: list[int]
    window: tuple[int, int]
    labels: dict[int, str]


def per_rank(trace, sizes_: list[int], cell: dict[str, Any]) -> RankTrace:
    """One rank's allocations from the one-GPU trace (`sizes_` at the cell's per-rank batch)."""
    window = (trace.marks["step2"], trace.marks["end"])
    n = world(cell)
    if n == 1:
        return RankTrace(trace.events, sizes_, window, trace.labels)
    sizes_, labels = list(sizes_), dict(trace.labels)
    live = live_at(trace.events, len(trace.events) - 1)  # the step's own gradients, not the last step's
    grads = sum(sizes_[a] for a in live if trace.labels.get(a) == "gradients")
    if cell["strategy"] == "fsdp":
        share, block, root = sizes(cell)
        for aid, label in trace.labels.items():
            if label in STATE_LABELS:
                sizes_[aid] = math.ceil(sizes_[aid] * share)
        extra, at = [root + 5 * block], window[0]  # gathered and reduce-scatter buffers, while a step runs
    else:
        extra, at = [], 0  # the buckets, from the model's wrapping on
        while sum(extra) < grads:
            extra.append(min(DDP_BUCKET_BYTES if extra else FIRST_BUCKET_BYTES, grads - sum(extra)))
    first = len(sizes_)
    for i, nbytes in enumerate(extra):
        sizes_.append(nbytes)
        labels[first + i] = "buffers"
    events = trace.events[:at] + [first + i + 1 for i in range(len(extra))] + trace.events[at:]
    start = window[0] + (len(extra) if at < window[0] else 0)
    return RankTrace(events, sizes_, (start, window[1] + len(extra)), labels)
