"""A speed calibration from the user's own measured cells (`ditbench plan --calibrate RESULTS.jsonl`).

Each record that finished on a GPU of the card table with a measured `steps_per_s` is traced as any
cell and the time model is fitted to the measured speeds (speed.calibrate); parameters the records
cannot inform keep the shipped calibration's values, which also start the fit.
"""

from __future__ import annotations

from pathlib import Path

from ditbench.errors import UserError
from ditbench.records.metrics import STEPS_PER_S, finite
from ditbench.records.model import Record


def _card(record: Record) -> str | None:
    from ditbench.cards import DATASHEETS, find_card

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
    from ditbench.cards import DATASHEETS
    from ditbench.plan.emulation import cuda_target
    from ditbench.plan.measured_records import cell_of
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
