"""DiT models: the ditbench DiT (official names and counts), checkpoints, diffusers' DiT."""

from ditbench.models.dit import (
    CONFIGS,
    MODEL_NAMES,
    PAPER_MODEL_NAMES,
    DiT,
    DiTConfig,
    build_model,
    count_params,
    get_config,
    parse_grad_ckpt,
)

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
