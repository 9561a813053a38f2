"""A suite's `plan` option (`spec.suite.PlanOption`, e.g. `plan: {skip_predicted_oom: true}`): the
planner's prediction in every record, cells predicted not to fit the (emulated) card skipped unrun, and
each series run largest batch first (the closest call shows a wrong prediction early).
Predictions are made in the runner's process, never a cell's: tracing patches process-wide state.
"""

from __future__ import annotations

from typing import Any

from ditbench.core.errors import UserError, shorten

REASON_CHARS = 300


def run_order(cells: list, first_order: list) -> list:
    """`first_order`'s series order, each series' cells largest batch first."""
    rank: dict[str, int] = {}
    for i, cell in enumerate(first_order):
        rank.setdefault(cell.series_key, i)
    return sorted(cells, key=lambda c: (rank.get(c.series_key, len(rank)), -c.config["batch_size"]))


def target_budget(suite, env: dict[str, Any] | None):
    """The planner's Budget for the suite's cells: the emulated card, else this machine's GPU, else none."""
    from ditbench.plan.predict import budget

    if suite.cells and all(c.config["device"] == "cpu" for c in suite.cells):
        return budget(None, device="cpu")
    if suite.card or suite.gpu_memory_gib is not None:
        return budget(suite.card or suite.gpu_memory_gib)
    name, gib = (env or {}).get("gpu_name"), (env or {}).get("gpu_memory_gib")
    if name:
        try:
            return budget(name)
        except UserError:  # a GPU the card table does not know: plan for its memory size
            pass
    return budget(gib if isinstance(gib, (int, float)) and gib > 0 else None)


class SuitePlanner:
    """Predicts each cell of a suite on demand (one trace per series) for the runner."""

    def __init__(self, suite, option, env: dict[str, Any] | None = None):
        self.suite, self.option = suite, option
        self._budget = None
        self._env = env
        self._by_cell: dict[str, dict[str, Any]] = {}

    def _predict_series(self, cell) -> None:
        from ditbench.plan.predict import normalize, predict_budgets

        series = [c for c in self.suite.cells if c.series_key == cell.series_key]
        batches = sorted({c.config["batch_size"] for c in series})
        try:
            if self._budget is None:
                self._budget = target_budget(self.suite, self._env)
            rows = predict_budgets(normalize(dict(cell.config)), batches, [self._budget], disk_cache=True)[0]
            by_batch = {p.batch_size: _as_record(p) for p in rows}
        except Exception as err:  # noqa: BLE001 - no prediction is a fact about the cell, not a failure
            reason = shorten(f"the planner failed: {type(err).__name__}: {err}", REASON_CHARS, quote=False)
            by_batch = {b: {"status": "error", "reason": reason} for b in batches}
        for c in series:
            self._by_cell[c.cell_id] = by_batch[c.config["batch_size"]]

    def prediction(self, cell) -> dict[str, Any]:
        if cell.cell_id not in self._by_cell:
            self._predict_series(cell)
        return self._by_cell[cell.cell_id]

    def skip_reason(self, cell) -> str | None:
        """Why the cell is skipped unrun (predicted not to fit), or None."""
        pred = self.prediction(cell)
        if not self.option.skip_predicted_oom or pred["status"] != "oom":
            return None
        card = pred["card"] or f"{pred['memory_gib']:g} GiB card"
        return f"predicted not to fit the {card}: {pred['reason']}"

    def annotate(self, record: dict[str, Any], cell) -> None:
        """The record's metrics.predicted_peak_gib and metrics.prediction (status, card, components)."""
        pred = self.prediction(cell)
        metrics = record.get("metrics") if isinstance(record.get("metrics"), dict) else {}
        record["metrics"] = {
            **metrics,
            "predicted_peak_gib": pred.get("peak_allocated_gib"),
            "prediction": pred,
        }


def _as_record(p) -> dict[str, Any]:
    def gib(value):
        return None if value is None else round(value, 4)

    return {
        "status": p.status,
        "reason": shorten(p.reason, REASON_CHARS, quote=False) if p.reason else None,
        "card": p.card,
        "memory_gib": p.memory_gib,
        "device": p.device,
        "peak_allocated_gib": gib(p.peak_allocated_gib),
        "peak_reserved_gib": gib(p.peak_reserved_gib),
        "device_gib": gib(p.device_gib),
        "components": {k: round(v, 4) for k, v in p.components.items()},
    }
