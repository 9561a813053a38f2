"""DiT (Peebles & Xie, "Scalable Diffusion Models with Transformers"), written for ditbench.

Architecture, initialisation and state-dict names follow the official facebookresearch/DiT `models.py`:
the released checkpoints load without conversion and parameter counts are equal.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ditbench.core.errors import UserError
from ditbench.models import vae
from ditbench.models.attention import attend
from ditbench.models.configs import ATTENTION_BACKENDS, parse_grad_ckpt


def sincos_pos_embed_2d(embed_dim: int, grid_size: int) -> torch.Tensor:
    """The fixed 2-D sine-cosine table of MAE/DiT, (grid_size**2, embed_dim), float64: row-major tokens,
    the first half of the channels the column index (MAE's meshgrid(w, h) order), the second the row."""
    quarter = embed_dim // 4
    omega = 1.0 / 10000 ** (torch.arange(quarter, dtype=torch.float64) / quarter)
    coords = torch.arange(grid_size, dtype=torch.float64)
    rows, cols = torch.meshgrid(coords, coords, indexing="ij")

    def one_axis(pos: torch.Tensor) -> torch.Tensor:
        angles = pos.reshape(-1, 1) * omega.reshape(1, -1)
        return torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)

    return torch.cat([one_axis(cols), one_axis(rows)], dim=1)


class PatchEmbed(nn.Module):
    """p x p patches -> tokens with a strided convolution (timm PatchEmbed's parameter names)."""

    def __init__(self, patch_size: int, in_channels: int, hidden_size: int):
        super().__init__()
        self.proj = nn.Conv2d(in_channels, hidden_size, kernel_size=patch_size, stride=patch_size, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)  # (N, T, D)


class TimestepEmbedder(nn.Module):
    """Scalar timesteps -> vectors: 256 sinusoidal frequencies (cos first) then a 2-layer MLP."""

    def __init__(self, hidden_size: int, frequency_size: int = 256):
        super().__init__()
        self.frequency_size = frequency_size
        self.mlp = nn.Sequential(
            nn.Linear(frequency_size, hidden_size, bias=True), nn.SiLU(), nn.Linear(hidden_size, hidden_size)
        )

    @staticmethod
    def frequencies(t: torch.Tensor, dim: int, max_period: float = 10000.0) -> torch.Tensor:
        half = dim // 2
        freqs = torch.exp(
            -math.log(max_period) * torch.arange(half, dtype=torch.float32, device=t.device) / half
        )
        args = t.float().reshape(-1, 1) * freqs.reshape(1, -1)
        return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)  # dim is even (256)

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        freq = self.frequencies(t, self.frequency_size)
        return self.mlp(freq.to(self.mlp[0].weight.dtype))


class LabelEmbedder(nn.Module):
    """Class labels -> vectors; a null class (row num_classes) for classifier-free guidance, which each
    label becomes with probability dropout_prob in training."""

    def __init__(self, num_classes: int, hidden_size: int, dropout_prob: float):
        super().__init__()
        has_null = dropout_prob > 0
        self.embedding_table = nn.Embedding(num_classes + int(has_null), hidden_size)
        self.num_classes = num_classes
        self.dropout_prob = dropout_prob

    def token_drop(self, labels: torch.Tensor, force_drop_ids: torch.Tensor | None = None) -> torch.Tensor:
        if force_drop_ids is None:
            drop = torch.rand(labels.shape[0], device=labels.device) < self.dropout_prob
        else:
            drop = force_drop_ids == 1
        return torch.where(drop, torch.full_like(labels, self.num_classes), labels)

    def forward(self, labels: torch.Tensor, train: bool, force_drop_ids: torch.Tensor | None = None):
        if (train and self.dropout_prob > 0) or force_drop_ids is not None:
            labels = self.token_drop(labels, force_drop_ids)
        return self.embedding_table(labels)


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)


class Attention(nn.Module):
    """Multi-head self-attention with a fused qkv projection (timm's names, as the official model);
    `attention` names the kernel (models/attention.py)."""

    def __init__(self, dim: int, num_heads: int, attention: str = "sdpa"):
        super().__init__()
        if attention not in ATTENTION_BACKENDS:
            valid = ", ".join(ATTENTION_BACKENDS)
            raise UserError(f"attention {attention!r} is not available; valid: {valid}")
        self.num_heads = num_heads
        self.attention = attention
        self.qkv = nn.Linear(dim, dim * 3, bias=True)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(N, T, D) -> (N, T, D)."""
        n, t, d = x.shape
        qkv = self.qkv(x).reshape(n, t, 3, self.num_heads, d // self.num_heads).permute(2, 0, 3, 1, 4)
        out = attend(qkv[0], qkv[1], qkv[2], self.attention)  # each (N, heads, T, D / heads)
        return self.proj(out.transpose(1, 2).reshape(n, t, d))


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU(approximate="tanh")
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class DiTBlock(nn.Module):
    """Transformer block with adaLN-Zero conditioning (shift, scale, gate for attention and MLP)."""

    def __init__(self, hidden_size: int, num_heads: int, mlp_ratio: float = 4.0, attention: str = "sdpa"):
        super().__init__()
        self.norm1 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.attn = Attention(hidden_size, num_heads, attention)
        self.norm2 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.mlp = Mlp(hidden_size, int(hidden_size * mlp_ratio))
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden_size, 6 * hidden_size, bias=True))

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.adaLN_modulation(c).chunk(
            6, dim=1
        )
        x = x + gate_msa.unsqueeze(1) * self.attn(modulate(self.norm1(x), shift_msa, scale_msa))
        x = x + gate_mlp.unsqueeze(1) * self.mlp(modulate(self.norm2(x), shift_mlp, scale_mlp))
        return x


class FinalLayer(nn.Module):
    def __init__(self, hidden_size: int, patch_size: int, out_channels: int):
        super().__init__()
        self.norm_final = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(hidden_size, patch_size * patch_size * out_channels, bias=True)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden_size, 2 * hidden_size, bias=True))

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        shift, scale = self.adaLN_modulation(c).chunk(2, dim=1)
        return self.linear(modulate(self.norm_final(x), shift, scale))


class GuidedForward:
    """`forward_with_cfg` for any network whose `forward(x, t, y)` returns eps then the rest (this DiT,
    and diffusers' in `diffusers_impl`)."""

    def forward_with_cfg(self, x, t, y, cfg_scale: float, guidance_channels: int | None = None):
        """Classifier-free guidance over a [cond half; uncond half] batch, on all noise channels by default.
        The official code guides the first 3 of 4 (a GLIDE leftover, DiT issue #41): guidance_channels=3."""
        half = x[: len(x) // 2]
        out = self.forward(torch.cat([half, half], dim=0), t, y)
        g = self.in_channels if guidance_channels is None else guidance_channels
        eps, rest = out[:, :g], out[:, g:]
        cond, uncond = torch.split(eps, len(eps) // 2, dim=0)
        guided = uncond + cfg_scale * (cond - uncond)
        return torch.cat([torch.cat([guided, guided], dim=0), rest], dim=1)


class DiT(GuidedForward, nn.Module):
    """Class-conditional latent diffusion transformer: forward(x, t, y) -> (N, out_channels, H, W)."""

    def __init__(
        self,
        input_size: int = 32,
        patch_size: int = 2,
        in_channels: int = vae.LATENT_CHANNELS,
        hidden_size: int = 1152,
        depth: int = 28,
        num_heads: int = 16,
        mlp_ratio: float = 4.0,
        class_dropout_prob: float = 0.1,
        num_classes: int = 1000,
        learn_sigma: bool = True,
        grad_ckpt: str | bool | None = "none",
        attention: str = "sdpa",
    ):
        super().__init__()
        self.input_size = input_size
        self.in_channels = in_channels
        self.out_channels = in_channels * 2 if learn_sigma else in_channels
        self.learn_sigma = learn_sigma
        self.patch_size = patch_size
        self.num_heads = num_heads
        self.num_classes = num_classes
        self.grad_ckpt_every = parse_grad_ckpt(grad_ckpt)

        self.x_embedder = PatchEmbed(patch_size, in_channels, hidden_size)
        self.t_embedder = TimestepEmbedder(hidden_size)
        self.y_embedder = LabelEmbedder(num_classes, hidden_size, class_dropout_prob)
        grid = input_size // patch_size
        # Fixed, but an nn.Parameter like the official model: it is in the state dict, the
        # parameter count and the EMA.
        self.pos_embed = nn.Parameter(torch.zeros(1, grid * grid, hidden_size), requires_grad=False)
        self.blocks = nn.ModuleList(
            [DiTBlock(hidden_size, num_heads, mlp_ratio, attention) for _ in range(depth)]
        )
        self.final_layer = FinalLayer(hidden_size, patch_size, self.out_channels)
        self.initialize_weights()

    def initialize_weights(self) -> None:
        with torch.no_grad():
            grid = int(round(self.pos_embed.shape[1] ** 0.5))
            table = sincos_pos_embed_2d(self.pos_embed.shape[-1], grid)
            self.pos_embed.copy_(table.float().unsqueeze(0).to(self.pos_embed.device))
        embedders = (self.y_embedder.embedding_table, self.t_embedder.mlp[0], self.t_embedder.mlp[2])
        zero = [block.adaLN_modulation[-1] for block in self.blocks]
        zero += [self.final_layer.adaLN_modulation[-1], self.final_layer.linear]
        dit_init(self, self.x_embedder.proj, embedders, zero)

    def unpatchify(self, x: torch.Tensor) -> torch.Tensor:
        """(N, T, p*p*C) -> (N, C, H, W)."""
        c, p = self.out_channels, self.patch_size
        h = w = int(round(x.shape[1] ** 0.5))
        x = x.reshape(x.shape[0], h, w, p, p, c)
        x = torch.einsum("nhwpqc->nchpwq", x)
        return x.reshape(x.shape[0], c, h * p, w * p)

    def forward(self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """(N, C, H, W) latents, (N,) timesteps in [0, 1000), (N,) labels (num_classes: the null label)
        -> (N, out_channels, H, W): eps in the first C channels, then (learn_sigma) the variance's."""
        x = self.x_embedder(x) + self.pos_embed  # (N, T, D), T = (H / patch) * (W / patch)
        c = self.t_embedder(t) + self.y_embedder(y, self.training)  # (N, D) conditioning
        k = self.grad_ckpt_every
        recompute = k > 0 and torch.is_grad_enabled()
        for i, block in enumerate(self.blocks):
            if recompute and i % k == 0:
                x = checkpoint(block, x, c, use_reentrant=False)
            else:
                x = block(x, c)
        return self.unpatchify(self.final_layer(x, c))


@torch.no_grad()
def dit_init(model: nn.Module, patch: nn.Conv2d, embedders, zero) -> None:
    """DiT's initialisation (also on diffusers' names), adaLN-Zero included (`zero` layers), so every
    block starts as the identity and the output as zeros."""
    for module in model.modules():
        if isinstance(module, nn.Linear):
            nn.init.xavier_uniform_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
    nn.init.xavier_uniform_(patch.weight.view(patch.weight.shape[0], -1))
    nn.init.zeros_(patch.bias)
    for module in embedders:
        nn.init.normal_(module.weight, std=0.02)
    for layer in zero:
        nn.init.zeros_(layer.weight)
        nn.init.zeros_(layer.bias)
