"""Measured cells override predicted ones: a results.jsonl record of the same cell replaces the prediction.

A record matches when every knob that shapes device memory (_KEYS) is equal. A finished run fits when
what the card held (NVML's device memory, else reserved + the context) is within the card; a run out
of memory does not fit a card no larger than what it had. Anything else keeps the prediction.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ditbench.plan.predict import Prediction, normalize

_KEYS = tuple(
    "model impl image_size precision grad_ckpt batch_size compile optimizer_impl num_classes device gpus "
    "nodes".split()
)


def read_results(path: str | Path) -> list[dict[str, Any]]:
    """The result records of a results.jsonl; lines that are not UTF-8 JSON objects with a config are
    skipped (a torn line must not stop a plan; a file without records is the caller's error)."""
    records = []
    with open(path, "rb") as f:
        for line in f:
            try:
                record = json.loads(line.decode("utf-8"))
            except (UnicodeDecodeError, ValueError):
                continue
            if isinstance(record, dict) and isinstance(record.get("config"), dict):
                records.append(record)
    return records


def _key(config: dict[str, Any]) -> tuple | None:
    try:
        cell = normalize(config)
    except Exception:  # a record from another version or a foreign file: it simply does not match
        return None
    return tuple(repr(cell.get(k)) for k in _KEYS)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value < 0:
        return None
    return float(value)


def apply_measured(predictions: list[Prediction], records: list[dict[str, Any]]) -> int:
    """Replace predictions that have a measured record (the latest wins); returns how many."""
    by_key: dict[tuple, dict[str, Any]] = {}
    for record in records:
        config = record.get("config")
        if isinstance(config, dict) and record.get("status") in ("ok", "oom"):
            key = _key(config)
            if key is not None:
                by_key[key] = record
    replaced = 0
    for pred in predictions:
        record = by_key.get(_key(pred.config))
        if record is not None and _override(pred, record):
            replaced += 1
    return replaced


def _override(pred: Prediction, record: dict[str, Any]) -> bool:
    metrics = record.get("metrics") or {}
    env = record.get("env") or {}
    gpu = env.get("gpu_name") or "the measuring machine"
    if record["status"] == "oom":
        config = record.get("config") or {}
        had = _number(config.get("gpu_memory_gib")) or _number(env.get("gpu_memory_gib"))
        if had is None or pred.memory_gib is None or pred.memory_gib > had:
            return False
        pred.status, pred.measured = "oom", True
        pred.reason = f"measured: ran out of memory on {gpu} with {had:g} GiB"
        return True
    alloc = _number(metrics.get("peak_mem_allocated_gib"))
    if alloc is None:
        return False
    reserved = _number(metrics.get("peak_mem_reserved_gib"))
    device = _number(metrics.get("device_mem_gib"))
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
