"""Predicted training memory and speed for any card, without the card (`ditbench plan`): predict.py's
names, imported on first use (importing a submodule does not pull in the tracer)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ditbench.plan.predict import Prediction, predict_cell, predict_series

__all__ = ["Prediction", "predict_cell", "predict_series"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from ditbench.plan import predict

        return getattr(predict, name)
    raise AttributeError(f"module 'ditbench.plan' has no attribute {name!r}")
