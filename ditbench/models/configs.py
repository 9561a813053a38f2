"""What a DiT configuration is, by name: sizes, the latent geometry it needs, and the checkpointing knob.
Pure data and small checks (no torch), read by the suite validator, FLOPs, checkpoints and the builder.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ditbench import vae
from ditbench.errors import UserError, did_you_mean, shorten


@dataclass(frozen=True)
class DiTConfig:
    depth: int
    hidden_size: int
    num_heads: int
    patch_size: int


# (depth, width, heads) per size, from the paper's Table 1.
_SIZES = {"S": (12, 384, 6), "B": (12, 768, 12), "L": (24, 1024, 16), "XL": (28, 1152, 16)}
# Tiny configurations for tests and CPU smoke runs: a full DiT in miniature, milliseconds per step.
_TINY = {"T": (4, 64, 4)}
PATCH_SIZES = (2, 4, 8)

CONFIGS: dict[str, DiTConfig] = {
    f"DiT-{size}/{p}": DiTConfig(depth=d, hidden_size=w, num_heads=h, patch_size=p)
    for size, (d, w, h) in {**_SIZES, **_TINY}.items()
    for p in PATCH_SIZES
}

#: The 12 configurations of the paper, in the paper's order, then the tiny test configurations.
PAPER_MODEL_NAMES = [f"DiT-{s}/{p}" for s in ("XL", "L", "B", "S") for p in PATCH_SIZES]
MODEL_NAMES = PAPER_MODEL_NAMES + [f"DiT-T/{p}" for p in PATCH_SIZES]

IMPLS = ("ditbench", "diffusers")  # this package's DiT, or diffusers' DiTTransformer2DModel
# The attention kernel (models/attention.py): written-out math, torch's choice, or one forced SDPA kernel
ATTENTION_BACKENDS = ("math", "sdpa", "flash", "efficient", "cudnn")

_NAME = re.compile(r"DiT-(S|B|L|XL|T)[-/](2|4|8)")


def canonical_name(name: str) -> str:
    """'DiT-XL/2' for 'DiT-XL/2' or the official file spelling 'DiT-XL-2'; UserError for others."""
    m = _NAME.fullmatch(str(name).strip())
    if m is None:
        hint = did_you_mean(name, MODEL_NAMES, cutoff=0.6)
        valid = ", ".join(MODEL_NAMES)
        raise UserError(f"unknown model {shorten(name)}.{hint} The valid models are {valid}.")
    return f"DiT-{m.group(1)}/{m.group(2)}"


def get_config(name: str) -> DiTConfig:
    return CONFIGS[canonical_name(name)]


def latent_size(image_size: int, patch_size: int = 1) -> int:
    """Latent side for an image side, checking that the model can tile it with patches."""
    if isinstance(image_size, bool) or not isinstance(image_size, int) or image_size <= 0:
        raise UserError(f"image_size must be a positive integer, got {shorten(image_size)}")
    step = vae.DOWNSAMPLE * patch_size
    if image_size % step:
        raise UserError(
            f"image_size {image_size} does not fit patch size {patch_size}: the VAE downsamples by "
            f"{vae.DOWNSAMPLE} and the latent must be a multiple of the patch, so image_size must be a "
            f"multiple of {step} (for example 256 or 512)"
        )
    return image_size // vae.DOWNSAMPLE


# Gradient checkpointing: one grammar for suites, `ditbench train` and the model.
GRAD_CKPT_HELP = "none, full (every block), or every_K (every K-th block, e.g. every_2)"
# YAML 1.1 reads on/off/yes/no/true/false as booleans, so a suite and the command line must both
# take them: as booleans and as the same words typed on a command line.
GRAD_CKPT_OFF = ("none", "off", "no", "false")
GRAD_CKPT_ON = ("full", "on", "yes", "true")
GRAD_CKPT_EVERY = r"every_([1-9]\d{0,3})"  # every K-th block, K up to 9999


def parse_grad_ckpt(value: str | bool | None) -> int:
    """'none' -> 0, 'full' -> 1, 'every_K' -> K: checkpoint the blocks whose index is a multiple of K."""
    if value is None or value is False:
        return 0
    if value is True:
        return 1
    text = str(value).strip().lower() if isinstance(value, str) else None
    if text in GRAD_CKPT_OFF:
        return 0
    if text in GRAD_CKPT_ON:
        return 1
    m = re.fullmatch(GRAD_CKPT_EVERY, text or "")
    if m:
        return int(m.group(1))
    raise UserError(f"grad_ckpt {shorten(value)} is not valid; use {GRAD_CKPT_HELP}")


def grad_ckpt_name(value: str | bool | None) -> str:
    """The canonical spelling: 'none', 'full' or 'every_K' (K >= 2), so equal settings get one cell id."""
    every = parse_grad_ckpt(value)
    return {0: "none", 1: "full"}.get(every, f"every_{every}")


def impl_problem(impl: str, grad_ckpt: str | bool | None) -> str | None:
    """Why `impl` cannot checkpoint as `grad_ckpt` asks, or None: diffusers checkpoints all blocks or none."""
    if impl == "diffusers" and parse_grad_ckpt(grad_ckpt) > 1:
        return (
            f"grad_ckpt {grad_ckpt_name(grad_ckpt)} is not available with impl diffusers, which checkpoints "
            "every block or none; use grad_ckpt full or none, or impl ditbench"
        )
    return None
