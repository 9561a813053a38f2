"""DiT models: configurations by name, the network, diffusers' DiT, checkpoints, FLOPs."""

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
