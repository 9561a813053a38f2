"""Training: precision policies, AdamW + EMA, data sources, and the Trainer (one step)."""

from ditbench.train.step import TrainConfig, Trainer

__all__ = ["TrainConfig", "Trainer"]
