"""Training: precision policies, AdamW + EMA, data sources, and the Trainer (one step)."""

from ditbench.train.step import Trainer

__all__ = ["Trainer"]
