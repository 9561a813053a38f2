"""DiT models: configurations by name (`configs`, no torch), the network (`dit`), diffusers' DiT
(`diffusers_impl`), building either (`build`), checkpoints, attention kernels and FLOPs."""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {"build_model": "build", "count_params": "build", "DiT": "dit"} | dict.fromkeys(
    ("CONFIGS", "MODEL_NAMES", "PAPER_MODEL_NAMES", "DiTConfig", "get_config", "parse_grad_ckpt"), "configs"
)


def __getattr__(name: str) -> Any:
    """The public names, imported on first use: reading `models.configs` must not import torch."""
    if name in _HOMES:
        return getattr(importlib.import_module(f"ditbench.models.{_HOMES[name]}"), name)
    raise AttributeError(f"module 'ditbench.models' has no attribute {name!r}")
