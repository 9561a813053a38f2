"""Training: AdamW + EMA, data sources and the Trainer (imported on first use: `--help` needs no torch)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ditbench.train.step import Trainer

__all__ = ["Trainer"]


def __getattr__(name: str) -> Any:
    if name == "Trainer":
        from ditbench.train.step import Trainer

        return Trainer
    raise AttributeError(f"module 'ditbench.train' has no attribute {name!r}")
