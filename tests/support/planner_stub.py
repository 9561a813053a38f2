"""The memory planner's `predict_cell` answering known numbers, for the `report --predict` tests."""

from __future__ import annotations

from ditbench.core.errors import UserError
from ditbench.hardware.cards import find_card
from ditbench.plan.predict import Prediction


class Planner:
    """predict_cell answering from a table: (model, precision, grad_ckpt) -> (status, allocated GiB,
    device GiB, steps/s, speed band %); it records each (cell, card, batch) it was asked for."""

    def __init__(self, monkeypatch, table):
        self.table, self.calls = table, []
        monkeypatch.setattr("ditbench.plan.predict.predict_cell", self)

    def __call__(self, config, card, **_options):
        key = (config["model"], config["precision"], config["grad_ckpt"])
        self.calls.append((key, card, config["batch_size"]))
        if key not in self.table:
            raise UserError(f"no such cell {key}")
        status, alloc, device, steps, band = self.table[key]
        found = find_card(card)
        return Prediction(
            model=key[0], precision=key[1], grad_ckpt=key[2], batch_size=config["batch_size"], device="cuda",
            card=found.name, memory_gib=found.usable_gib, status=status, reason=f"{status} here",
            peak_allocated_gib=alloc, device_gib=device, predicted_steps_per_s=steps,
            predicted_images_per_s=None if steps is None else steps * config["batch_size"],
            predicted_speed_band_pct=band,
        )  # fmt: skip
