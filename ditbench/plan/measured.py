"""What measured records bring to a plan: a record of the same cell replaces the prediction (`--results`),
and records of GPUs in the card table calibrate the speed model (`--calibrate`).

A record matches when every knob that shapes device memory (_KEYS) is equal; a run out of memory does
not fit a card no larger than what it had. A calibration fits the time model to the measured speeds;
parameters the records cannot inform keep the shipped calibration's values.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ditbench.core.errors import UserError
from ditbench.plan.predict import Prediction, normalize
from ditbench.records.metrics import DEVICE_MEM, PEAK_ALLOCATED, PEAK_RESERVED, STEPS_PER_S, finite
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


def _card(record: Record) -> str | None:
    from ditbench.hardware.cards import DATASHEETS, find_card

    emulation = record.metrics.emulation if record.metrics else None
    name = (emulation.real_gpu if emulation else None) or (record.env.gpu_name if record.env else None)
    if name is None:
        return None
    try:
        card = find_card(name)
    except UserError:
        return None
    return card.name if card.name in DATASHEETS else None


def cells_from_records(records: list[Record]):
    """(speed.Cell list, why each skipped record was skipped)."""
    from ditbench.hardware.cards import DATASHEETS
    from ditbench.plan.emulation import cuda_target
    from ditbench.plan.predict import series_trace, trace_knobs
    from ditbench.plan.speed import Cell, blocks

    cells, skipped = [], []
    target = cuda_target(None)
    for i, record in enumerate(records, 1):
        steps = finite(STEPS_PER_S.of(record))
        card = _card(record)
        why = None
        if record.status != "ok":
            why = f"status {record.status!r}"
        elif steps is None or not steps > 0:
            why = f"no measured {STEPS_PER_S.name}"
        elif card is None:
            why = "not run on a GPU of the card table"
        if why is None:
            try:
                cell = cell_of(record)
                gpus = cell["gpus"] * cell["nodes"]
                one = {**cell, "gpus": 1, "nodes": 1}
                series = series_trace(trace_knobs(one, target), target, disk=True)
            except Exception as err:  # a record the planner cannot trace is skipped, said why
                why = f"not traceable ({type(err).__name__}: {err})"
        if why is not None:
            skipped.append(f"record {i}: {why}")
            continue
        depth, ckpt_blocks = blocks(cell["model"], cell["grad_ckpt"])
        cells.append(
            Cell(f"{cell['model']} {cell['precision']} ckpt={cell['grad_ckpt']} b{cell['batch_size']} {card}",
                 series.trace.kernels, cell["batch_size"], DATASHEETS[card], cell["precision"],
                 bool(cell["compile"]), float(steps), gpus=gpus, grad_bytes=4 * series.trace.params,
                 blocks=depth, ckpt_blocks=ckpt_blocks)
        )  # fmt: skip
    return cells, skipped


def from_records(path: Path, records: list[Record]):
    """The calibration fitted on a results file's measured GPU cells, or a one-paragraph error."""
    from ditbench.plan.speed import calibrate, shipped

    cells, skipped = cells_from_records(records)
    if not cells:
        reasons = "; ".join(skipped[:5]) + (f"; and {len(skipped) - 5} more" if len(skipped) > 5 else "")
        raise UserError(
            f"--calibrate {path}: no record can calibrate the speed model ({reasons}). A calibration cell "
            "is a record with status ok, a measured steps_per_s, run on a GPU of the card table "
            "(`ditbench plan --help` lists where the cards are)."
        )
    return calibrate(cells, f"{path} ({len(cells)} measured cells)", start=shipped().params)
