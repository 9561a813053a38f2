"""Predicted training memory for any card, without the card (`ditbench plan`).

`predict_cell(config, card_or_gib) -> Prediction` is the entry point; see predict.py.
"""

from ditbench.plan.predict import Prediction, predict_cell, predict_series

__all__ = ["Prediction", "predict_cell", "predict_series"]
