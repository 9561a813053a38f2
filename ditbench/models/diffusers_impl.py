"""`impl: diffusers`: diffusers' DiTTransformer2DModel behind ditbench's forward(x, t, y).

Same configuration as the ditbench DiT, but NOT parameter-identical (docs/training.md): +11.1% at
DiT-XL/2, so weights, gradients and AdamW state grow by ~11% at almost the same FLOPs. Each block also
draws its own label-dropout mask, and timestep frequencies divide by half - 1.
"""

from __future__ import annotations

import torch
from torch import nn

from ditbench.core.errors import UnsupportedError
from ditbench.models.attention import kernel_context, refused
from ditbench.models.configs import DiTConfig, impl_problem, parse_grad_ckpt
from ditbench.models.dit import GuidedForward, dit_init
from ditbench.models.vae import LATENT_CHANNELS


class DiffusersDiT(GuidedForward, nn.Module):
    """Wraps a DiTTransformer2DModel so that forward(x, t, y) returns the (N, 8, H, W) tensor."""

    def __init__(self, transformer: nn.Module, num_classes: int, attention: str = "sdpa"):
        super().__init__()
        self.transformer = transformer
        self.attention = attention  # a forced SDPA kernel (flash, efficient, cudnn) is entered in forward
        self.in_channels = LATENT_CHANNELS
        self.num_classes = num_classes

    def forward(self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """x (N, 4, H, W) latents, t (N,) timesteps, y (N,) labels -> (N, 8, H, W), as `DiT.forward`."""
        try:
            with kernel_context(self.attention):
                return self.transformer(x, timestep=t, class_labels=y, return_dict=False)[0]
        except RuntimeError as err:
            refusal = refused(err, self.attention, f"this model's attention on {x.device.type}")
            if refusal is not None:
                raise refusal from err
            raise


def apply_dit_init(transformer: nn.Module) -> None:
    """DiT's initialisation on diffusers' names (which keep PyTorch's default), so both start as an
    identity network with zero output; q, k and v get xavier bounds of their own, not fused qkv's."""
    embedders, zero = [], [transformer.proj_out_1, transformer.proj_out_2]
    for block in transformer.transformer_blocks:
        emb = block.norm1.emb
        embedders += [emb.class_embedder.embedding_table, emb.timestep_embedder.linear_1]
        embedders.append(emb.timestep_embedder.linear_2)
        zero.append(block.norm1.linear)
    dit_init(transformer, transformer.pos_embed.proj, embedders, zero)


def build_diffusers_dit(
    cfg: DiTConfig,
    latent_size: int,
    num_classes: int = 1000,
    grad_ckpt: str | int = "none",
    class_dropout_prob: float = 0.1,
    learn_sigma: bool = True,
    attention: str = "sdpa",
) -> DiffusersDiT:
    from ditbench.core.extras import require_diffusers

    DiTTransformer2DModel = require_diffusers("impl: diffusers").DiTTransformer2DModel
    if problem := impl_problem("diffusers", grad_ckpt):
        raise UnsupportedError(problem)
    if class_dropout_prob != 0.1:
        raise UnsupportedError(
            "impl: diffusers fixes label dropout at 0.1 (CombinedTimestepLabelEmbeddings' default); "
            f"class_dropout_prob {class_dropout_prob} needs impl: ditbench"
        )
    transformer = DiTTransformer2DModel(
        num_attention_heads=cfg.num_heads,
        attention_head_dim=cfg.hidden_size // cfg.num_heads,
        in_channels=LATENT_CHANNELS,
        out_channels=LATENT_CHANNELS * (2 if learn_sigma else 1),
        num_layers=cfg.depth,
        sample_size=latent_size,
        patch_size=cfg.patch_size,
        activation_fn="gelu-approximate",
        num_embeds_ada_norm=num_classes,
        norm_type="ada_norm_zero",
        norm_elementwise_affine=False,
    )
    apply_dit_init(transformer)
    if parse_grad_ckpt(grad_ckpt) == 1:
        transformer.enable_gradient_checkpointing()
    if attention == "math":  # diffusers' default processor, AttnProcessor2_0, calls SDPA
        from diffusers.models.attention_processor import Attention, AttnProcessor

        for module in transformer.modules():
            if isinstance(module, Attention):
                module.set_processor(AttnProcessor())  # the written-out scores, softmax and bmm
    return DiffusersDiT(transformer, num_classes=num_classes, attention=attention)
