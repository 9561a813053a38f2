"""Cell ids: a short stable hash a rerun uses to recognise finished cells, and the ids of older records.

Today's id hashes only what differs from the defaults (`CellSpec.identity`), so adding a knob
with a default leaves every existing id as it was. Records written before that (ditbench 0.1.0:
`reports/cpu_smoke/results.jsonl`, any resumed run or CI baseline of then) hashed the whole config
as it was then; `legacy_cell_id` recomputes that id from today's spec, so a resume still finds
those records. It is frozen: never edit LEGACY_KNOBS.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

from ditbench.bench.spec import CellSpec

ID_CHARS = 12  # hex characters of the sha256: 48 bits, no collision within any real suite


def _digest(obj: Any) -> str:
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:ID_CHARS]


def cell_id(spec: CellSpec) -> str:
    """Short stable hash of the cell (key order and defaults left implicit do not matter)."""
    return _digest(spec.identity())


# The knobs of ditbench 0.1.0 with their defaults then (its `config` held exactly these, plus
# global_batch, steps, smoke_steps, device and gpu_memory_gb).
LEGACY_KNOBS: dict[str, Any] = {
    "model": None,
    "impl": "ditbench",
    "image_size": 256,
    "precision": "fp32",
    "grad_ckpt": "none",
    "batch_size": 32,
    "gpus": 1,
    "nodes": 1,
    "strategy": "ddp",
    "compile": False,
    "attention": "sdpa",
    "optimizer": "adamw",
    "optimizer_impl": "auto",
    "data": "synthetic",
    "seed": 0,
    "lr": 1e-4,
    "weight_decay": 0.0,
    "ema_decay": 0.9999,
    "num_classes": 1000,
}


def legacy_cell_id(spec: CellSpec) -> str | None:
    """The id ditbench 0.1.0 gave this cell, or None when no cell of then could be this one.

    Then, `gpu_memory_gb` was the allocator budget in GiB (what `gpu_memory_gib` is now); a cell
    emulating a card by name, or set by a knob added since, did not exist.
    """
    knobs = spec.knobs.to_dict()
    if spec.card is not None or any(k not in LEGACY_KNOBS for k in spec.knobs.non_defaults()):
        return None
    config = {k: knobs[k] for k in LEGACY_KNOBS}
    config.update(
        global_batch=spec.global_batch,
        steps=dataclasses.asdict(spec.steps),
        smoke_steps=spec.smoke_steps,
        device=spec.device,
        gpu_memory_gb=spec.gpu_memory_gib,
    )
    return _digest(config)


def record_ids(record: dict) -> tuple[str, ...]:
    """Every id a record answers to: its cell_id, and the 0.1.0 id of the same cell where one exists.

    For matching records across versions (a resume, a gate against an older baseline); a record
    whose config cannot be read back (an old one, or a damaged one) answers to its cell_id only.
    """
    own = record.get("cell_id")
    ids = (own,) if isinstance(own, str) else ()
    try:
        legacy = legacy_cell_id(CellSpec.from_record_config(record.get("config")))
    except Exception:  # noqa: BLE001 - any unreadable config: no second id, never a crash
        return ids
    return ids + ((legacy,) if legacy and legacy not in ids else ())
