"""Records as the runner writes them for emulated cards and noisy cells, for the report tests.

These helpers turn a `make_record` (synthetic_records) record into another the runner would write:
the cell run on an H200 capped to a card (`config.card`, `config.gpu_memory_gib`,
`metrics.emulation`, `metrics.fits_budget` and `fits_basis`, NVML unavailable), on a card that
really ran it, or a cell the runner marked noisy.
"""

from __future__ import annotations

import copy
from typing import Any

from synthetic_records import H200_ENV, cell_id, make_record

from ditbench.bench.cell import memory

RTX4090_ENV = dict(H200_ENV, gpu_name="NVIDIA GeForce RTX 4090", gpu_memory_gib=23.99, host="desk")
A6000_ENV = dict(H200_ENV, gpu_name="NVIDIA RTX A6000", gpu_memory_gib=47.99, host="ws")
CONTEXT_GIB = 0.5


def _recompute_id(record: dict[str, Any]) -> dict[str, Any]:
    record["cell_id"] = cell_id(record["config"])
    return record


def emulated(record: dict[str, Any], card: str = "RTX 4090", budget: float = 23.99) -> dict[str, Any]:
    """The record of a cell that ran on an H200 capped to `card` (context measured: 0.5 GiB)."""
    r = copy.deepcopy(record)
    r["config"].update(card=card, gpu_memory_gib=budget)
    r["env"] = dict(H200_ENV)
    emulation = {
        "card": card,
        "budget_gib": budget,
        "context_gib": CONTEXT_GIB,
        "allocator_cap_gib": budget - CONTEXT_GIB,
        "real_gpu": "NVIDIA H200",
        "real_total_gib": 139.8,
        "note": memory.NOTE,
    }
    if r["status"] == "ok":
        r["metrics"].update(emulation=emulation, device_mem_gib=None, **memory.fits(emulation, "ok"))
    elif r["status"] == "oom":
        r["metrics"] = {"emulation": emulation, **memory.fits(emulation, "oom")}
    return _recompute_id(r)


def on_card(record: dict[str, Any], env: dict[str, Any]) -> dict[str, Any]:
    """The record of a cell that ran on a real card (no emulation: the runner writes null)."""
    r = copy.deepcopy(record)
    r["env"] = dict(env)
    if isinstance(r.get("metrics"), dict):
        r["metrics"]["emulation"] = None
    return _recompute_id(r)


def noisy(record: dict[str, Any], spread: float = 0.12, gap: float = 0.08) -> dict[str, Any]:
    r = copy.deepcopy(record)
    r["metrics"]["noisy"] = True
    r["metrics"]["noise"] = {
        "step_spread": spread,
        "throughput_gap": gap,
        "spread_bound": 0.05,
        "gap_bound": 0.05,
    }
    return r


def cell(model, precision, ckpt, bs, *, reserved=None, steps_per_s=None, status="ok", **kw) -> dict[str, Any]:
    """A record with its memory given as peak reserved and its speed as steps/s."""
    if status != "ok":
        return make_record(model, precision, ckpt, bs, status, **kw)
    img_s = steps_per_s * bs if steps_per_s is not None else None
    alloc = reserved - 0.3 if reserved is not None else None
    return make_record(
        model, precision, ckpt, bs, images_per_s=img_s, peak_alloc=alloc, peak_reserved=reserved, **kw
    )
