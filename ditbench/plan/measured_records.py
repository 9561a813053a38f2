"""Measured cells override predicted ones: a results.jsonl record of the same cell replaces the prediction.

A record matches when every knob that shapes device memory (_KEYS) is equal. A finished run fits when
what the card held (NVML's device memory, else reserved + the context) is within the card; a run out
of memory does not fit a card no larger than what it had. Anything else keeps the prediction.
"""

from __future__ import annotations

from typing import Any

from ditbench.plan.predict import Prediction, normalize
from ditbench.records.metrics import DEVICE_MEM, PEAK_ALLOCATED, PEAK_RESERVED
from ditbench.records.model import Record

_KEYS = tuple(
    "model impl image_size precision grad_ckpt batch_size compile optimizer_impl num_classes device gpus "
    "nodes".split()
)


def cell_of(record: Record) -> dict[str, Any]:
    """The record's cell as `predict.normalize` gives a config's: its knobs and its device."""
    return {**dict(record.config.knobs), "device": record.config.device}


def _key(config: dict[str, Any]) -> tuple | None:
    try:
        cell = normalize(config)
    except Exception:  # a config the planner does not know: it simply does not match
        return None
    return tuple(repr(cell.get(k)) for k in _KEYS)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value < 0:
        return None
    return float(value)


def apply_measured(predictions: list[Prediction], records: list[Record]) -> int:
    """Replace predictions that have a measured record (the latest wins); returns how many."""
    by_key: dict[tuple, Record] = {}
    for record in records:
        if (
            record.status in ("ok", "oom")
            and (key := _key(record.config.model_dump(mode="json"))) is not None
        ):
            by_key[key] = record
    replaced = 0
    for pred in predictions:
        record = by_key.get(_key(pred.config))
        if record is not None and _override(pred, record):
            replaced += 1
    return replaced


def _override(pred: Prediction, record: Record) -> bool:
    env = record.env
    gpu = (env.gpu_name if env else None) or "the measuring machine"
    if record.status == "oom":
        had = _number(record.config.gpu_memory_gib) or _number(env.gpu_memory_gib if env else None)
        if had is None or pred.memory_gib is None or pred.memory_gib > had:
            return False
        pred.status, pred.measured = "oom", True
        pred.reason = f"measured: ran out of memory on {gpu} with {had:g} GiB"
        return True
    alloc = _number(PEAK_ALLOCATED.of(record))
    if alloc is None:
        return False
    reserved = _number(PEAK_RESERVED.of(record))
    device = _number(DEVICE_MEM.of(record))
    pred.peak_allocated_gib = alloc
    pred.peak_reserved_gib = reserved
    context = pred.components.get("context", 0.0)
    pred.device_gib = device if device is not None else (reserved + context if reserved is not None else None)
    pred.components = {}
    pred.measured = True
    pred.reason = f"measured on {gpu}"
    if pred.memory_gib is not None:
        need = pred.device_gib if pred.device_gib is not None else alloc + context
        pred.status = "fits" if need <= pred.memory_gib else "oom"
    else:
        pred.status = "ok"
    return True
