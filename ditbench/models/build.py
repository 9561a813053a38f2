"""Build a named DiT in either implementation: the one place that dispatches on `impl`."""

from __future__ import annotations

import dataclasses

from torch import nn

from ditbench.errors import UserError, shorten
from ditbench.models.configs import IMPLS, get_config, latent_size


def build_model(
    name: str,
    image_size: int = 256,
    num_classes: int = 1000,
    grad_ckpt: str | bool | None = "none",
    impl: str = "ditbench",
    class_dropout_prob: float = 0.1,
    learn_sigma: bool = True,
    attention: str = "sdpa",
) -> nn.Module:
    """A named DiT ("DiT-XL/2") for `image_size` pixels: `models.dit.DiT` or (impl="diffusers") diffusers'
    DiTTransformer2DModel behind the same forward(). Build under the meta device for shapes and counts."""
    cfg = get_config(name)
    size = latent_size(image_size, cfg.patch_size)
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise UserError(f"num_classes must be a positive integer, got {shorten(num_classes)}")
    if not 0.0 <= float(class_dropout_prob) < 1.0:
        raise UserError(f"class_dropout_prob must be in [0, 1), got {shorten(class_dropout_prob)}")
    common = dict(
        num_classes=num_classes,
        grad_ckpt=grad_ckpt,
        class_dropout_prob=class_dropout_prob,
        learn_sigma=learn_sigma,
        attention=attention,
    )
    if impl == "ditbench":
        from ditbench.models.dit import DiT

        return DiT(input_size=size, **dataclasses.asdict(cfg), **common)  # depth, hidden_size, heads, patch
    if impl == "diffusers":
        from ditbench.models.diffusers_impl import build_diffusers_dit

        return build_diffusers_dit(cfg, latent_size=size, **common)
    raise UserError(f"impl {shorten(impl)} is not known; valid implementations are {', '.join(IMPLS)}")


def count_params(model: nn.Module) -> int:
    """All parameters, frozen pos_embed included (how the official train.py counts)."""
    return sum(p.numel() for p in model.parameters())
