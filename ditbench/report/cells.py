"""Cells as sets of knobs: which records describe the same configuration, and which differ in one knob.
Knobs are the flattened `config` minus bookkeeping keys (`global_batch` follows batch size and GPUs;
`smoke_steps` and `quality` are set only on some cells); two cells "differ only in X" when their knobs
are equal once X is set alike.
"""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from ditbench.records.model import Record
from ditbench.report.load import flatten, value

MATCH_EXCLUDED = frozenset({"global_batch", "smoke_steps"})
MATCH_EXCLUDED_SECTIONS = ("quality.",)  # flattened keys under these prefixes

# Model sizes when a record carries no parameter count: S < B < L < XL, then smaller patch = more work.
_SIZE_ORDER = {"S": 0, "B": 1, "L": 2, "XL": 3}
# Display order of knob values: full precision first, then 16-bit; no checkpointing first.
_VALUE_ORDER = {"fp32": 0, "tf32": 1, "bf16": 2, "fp16": 3, "none": 0, "full": 1}

_KNOBS_CACHE: dict[int, tuple[Record, dict[str, Any]]] = {}


def knobs(record: Record) -> dict[str, Any]:
    """The flattened config of a record, without the bookkeeping keys (a fresh dict; safe to change)."""
    # Reports ask for the same record's knobs many times; flattening dominated big reports. The
    # entry keeps the record alive, so its id cannot be reused while cached.
    hit = _KNOBS_CACHE.get(id(record))
    if hit is None or hit[0] is not record:
        if len(_KNOBS_CACHE) > 200_000:
            _KNOBS_CACHE.clear()
        flat = flatten(record.config.model_dump(mode="json", exclude_unset=True))
        hit = _KNOBS_CACHE[id(record)] = (
            record,
            {
                k: v
                for k, v in flat.items()
                if k not in MATCH_EXCLUDED and not k.startswith(MATCH_EXCLUDED_SECTIONS)
            },
        )
    return dict(hit[1])


def knob_key(k: dict[str, Any]) -> str:
    return json.dumps(k, sort_keys=True, default=str)


def knob_index(df: pd.DataFrame, status: str | None = "ok") -> dict[str, list[int]]:
    """knob key -> row labels (only rows of the given status; None for all), in row order."""
    index: dict[str, list[int]] = {}
    for label, row in df.iterrows():
        if status is None or row["status"] == status:
            index.setdefault(knob_key(knobs(row["record"])), []).append(label)
    return index


def varying_knobs(df: pd.DataFrame, exclude: tuple[str, ...] = ()) -> list[str]:
    """Knobs that take more than one value across the rows (absent counts as a value), headline first."""
    all_knobs = [knobs(r) for r in df["record"]]
    keys = set().union(*all_knobs) if all_knobs else set()
    vary = {
        key
        for key in keys
        if key not in exclude
        and len({json.dumps(k.get(key, "<absent>"), sort_keys=True, default=str) for k in all_knobs}) > 1
    }
    head = ["model", "precision", "grad_ckpt", "batch_size", "gpus"]
    return [k for k in head if k in vary] + sorted(vary - set(head))


def value_order(v: Any) -> tuple:
    return (_VALUE_ORDER.get(v, 9) if isinstance(v, str) else 9, str(v))


def model_size_key(model: str, params: float | None) -> tuple:
    if params is not None:
        return (params, 0)
    name = str(model).removeprefix("DiT-")
    size, _, patch = name.partition("/")
    return (_SIZE_ORDER.get(size, -1), -int(patch) if patch.isdigit() else 0)


def pairs(
    df: pd.DataFrame, change_from: dict[str, Any], change_to: dict[str, Any]
) -> list[tuple[pd.Series, pd.Series]]:
    """(row, twin) for ok rows matching change_from whose twin (its knobs with change_to applied) ran ok;
    of several records of one twin (`--keep all`), the one from the same run."""
    index = knob_index(df)
    out = []
    for _, row in df[df["status"] == "ok"].iterrows():
        k = knobs(row["record"])
        if any(k.get(key, _ABSENT) != want for key, want in change_from.items()):
            continue
        labels = index.get(knob_key({**k, **change_to}), [])
        if labels:
            out.append((row, df.loc[same_run_first(df, labels, row)]))
    return out


_ABSENT = object()


def same_run_first(df: pd.DataFrame, labels: list[int], row: pd.Series) -> int:
    """Of several rows of one cell, the one from row's run if any, else the last one."""
    same = (
        [label for label in labels if df.at[label, "run_id"] == row.get("run_id")] if "run_id" in df else []
    )
    return (same or labels)[-1]


def cell_label(row: pd.Series | dict[str, Any]) -> str:
    return str(row.get("cell_name") or row.get("cell_id"))


def gpu_count(row: pd.Series | dict[str, Any]) -> int:
    return int((value(row, "config.gpus") or 1) * (value(row, "config.nodes") or 1))
