"""Analytic model FLOPs of a DiT, the way the paper counts them.

The paper's "Gflops" are multiply-accumulates of one forward pass (DiT-XL/2 at 256 px: 118.6 GMACs); a
training image costs 3 passes of 2 FLOPs per MAC: 6 x forward MACs. Gradient checkpointing's
recomputation is work the hardware does, not the model needs, so it is not counted (it lowers MFU).
"""

from __future__ import annotations

from ditbench.models.configs import get_config, latent_size
from ditbench.vae import LATENT_CHANNELS


def forward_macs(name: str, image_size: int = 256, learn_sigma: bool = True) -> int:
    """Multiply-accumulates of one forward pass for one image (matmuls and convolutions only)."""
    cfg = get_config(name)
    side = latent_size(image_size, cfg.patch_size) // cfg.patch_size
    t, d, p = side * side, cfg.hidden_size, cfg.patch_size
    out_ch = LATENT_CHANNELS * (2 if learn_sigma else 1)
    per_block = (
        t * 12 * d * d  # qkv (3 D^2), attention output projection (D^2), MLP (8 D^2) per token
        + 2 * t * t * d  # Q K^T and attention-weighted V
        + 6 * d * d  # adaLN modulation, once per image
    )
    return (
        cfg.depth * per_block
        + t * d * p * p * LATENT_CHANNELS  # patch embedding
        + t * d * p * p * out_ch  # final linear
        + 2 * d * d  # final adaLN
        + 256 * d
        + d * d  # timestep MLP
    )


def train_flops_per_image(name: str, image_size: int = 256) -> int:
    return 6 * forward_macs(name, image_size)
