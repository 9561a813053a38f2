"""DiT models: configurations by name, the network, diffusers' DiT, checkpoints, FLOPs.

The names are imported on first use, so reading a configuration (`ditbench.models.configs`: what
the knobs and `ditbench suites` need) does not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ditbench.models.build import build_model, count_params
    from ditbench.models.configs import (
        CONFIGS,
        MODEL_NAMES,
        PAPER_MODEL_NAMES,
        DiTConfig,
        get_config,
        parse_grad_ckpt,
    )
    from ditbench.models.dit import DiT

_HOMES = {
    "build_model": "build",
    "count_params": "build",
    "CONFIGS": "configs",
    "MODEL_NAMES": "configs",
    "PAPER_MODEL_NAMES": "configs",
    "DiTConfig": "configs",
    "get_config": "configs",
    "parse_grad_ckpt": "configs",
    "DiT": "dit",
}
__all__ = [
    "CONFIGS",
    "MODEL_NAMES",
    "PAPER_MODEL_NAMES",
    "DiT",
    "DiTConfig",
    "build_model",
    "count_params",
    "get_config",
    "parse_grad_ckpt",
]


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(f"ditbench.models.{_HOMES[name]}"), name)
    raise AttributeError(f"module 'ditbench.models' has no attribute {name!r}")
