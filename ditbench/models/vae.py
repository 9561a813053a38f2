"""The autoencoder DiT trains in the latent space of: sd-vae-ft-ema (diffusers' AutoencoderKL), every
fact about it. Weights from a path or by name (`ema`, `mse`: `pretrained`); random only for `random`.
Training and sampling both use it, so sampling never imports training.
"""

from __future__ import annotations

import os
from pathlib import Path

from ditbench.core.errors import UserError, shorten

DOWNSAMPLE = 8  # pixels per latent cell along each side: a 256 px image is a 32x32 latent
LATENT_CHANNELS = 4
SCALE_FACTOR = 0.18215  # latents are scaled to about unit variance (the LDM/DiT convention)
RANDOM = "random"  # the spelling that asks for untrained weights

# sd-vae-ft-ema / sd-vae-ft-mse (stabilityai) configuration; both share the encoder.
SD_VAE_CONFIG = dict(
    in_channels=3,
    out_channels=3,
    down_block_types=["DownEncoderBlock2D"] * 4,
    up_block_types=["UpDecoderBlock2D"] * 4,
    block_out_channels=[128, 256, 512, 512],
    layers_per_block=2,
    act_fn="silu",
    latent_channels=LATENT_CHANNELS,
    norm_num_groups=32,
    sample_size=256,
)


def require_vae_spec(spec) -> None:
    if spec is None or str(spec).strip() == "":
        raise UserError(
            "an image-folder data source needs a VAE: give `vae: ema` or `vae: mse` (stabilityai's "
            "sd-vae-ft-ema/-mse by name), `vae: PATH` (a diffusers AutoencoderKL folder or a state-dict "
            "file) or `vae: random` to measure speed with random weights"
        )


def build_vae(spec: str | os.PathLike, device="cpu"):
    """(AutoencoderKL in eval mode on `device`, its description): `ema`/`mse` (`pretrained.load_vae`), a
    diffusers folder or state-dict file (.safetensors, .bin, .pt, .ckpt), or untrained for `random`."""
    import torch

    from ditbench.core.extras import require_diffusers
    from ditbench.files import pretrained

    require_vae_spec(spec)
    text = str(spec)
    AutoencoderKL = require_diffusers(f"the VAE ({shorten(text, 80)})").AutoencoderKL
    if pretrained.is_vae_name(text):
        vae = pretrained.load_vae(text)
        desc = f"pretrained {pretrained.VAE_REPOS[text]} (by name `{text}`)"
    elif text == RANDOM:
        with torch.random.fork_rng(devices=[]):  # fixed weights without disturbing the caller's RNG
            torch.manual_seed(0)
            vae = AutoencoderKL(**SD_VAE_CONFIG)
        desc = "random (sd-vae-ft-ema architecture, untrained weights: latents carry no image content)"
    else:
        vae = _load_pretrained(Path(text), text, AutoencoderKL)
        desc = f"pretrained from {text}"
    return vae.to(device).eval().requires_grad_(False), desc


def _load_pretrained(p: Path, text: str, AutoencoderKL):  # noqa: N803 - diffusers' class
    shown = shorten(text, 200)
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise UserError(f"VAE folder {shown} has no config.json; give a diffusers AutoencoderKL folder")
        try:
            return AutoencoderKL.from_pretrained(str(p), local_files_only=True)
        except Exception as err:
            raise UserError(f"VAE folder {shown} could not be loaded by diffusers ({err})") from err
    if p.is_file():
        vae = AutoencoderKL(**SD_VAE_CONFIG)
        missing, unexpected = vae.load_state_dict(_read_state_dict_file(p), strict=False)
        if missing or unexpected:
            raise UserError(
                f"VAE weights {shown} do not match the sd-vae-ft-ema AutoencoderKL: {len(missing)} missing "
                f"keys (e.g. {missing[:2]}), {len(unexpected)} unexpected (e.g. {unexpected[:2]}); give "
                "diffusers-format weights"
            )
        return vae
    from ditbench.files.outpaths import not_a_file

    why = not_a_file(p) or "is not a file"  # a FIFO or /dev/null named as such, not "does not exist"
    raise UserError(f"VAE path {shown} {why}; give a local folder or file, or `random`")


def _read_state_dict_file(p: Path) -> dict:
    import torch

    shown = shorten(str(p), 200)
    if p.suffix == ".safetensors":
        from safetensors.torch import load_file

        try:
            return load_file(str(p))
        except Exception as err:
            raise UserError(f"VAE weights {shown} are not a readable safetensors file ({err})") from err
    try:
        obj = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as err:
        raise UserError(
            f"VAE weights {shown} could not be loaded safely with torch.load(weights_only=True) ({err}); "
            "use a .safetensors file or a diffusers folder"
        ) from err
    if isinstance(obj, dict) and "state_dict" in obj and isinstance(obj["state_dict"], dict):
        obj = obj["state_dict"]
    if not isinstance(obj, dict):
        raise UserError(f"VAE weights {shown} do not hold a state dict")
    return obj


def encode_images(vae, images, generator=None):
    """Images in [-1, 1] (N, 3, H, W) -> scaled latents (N, 4, H/8, W/8), sampled from the posterior."""
    import torch

    with torch.no_grad():
        dist = vae.encode(images).latent_dist
        return dist.sample(generator=generator).mul_(SCALE_FACTOR)


def decode_latents(vae, latents):
    """Scaled latents (N, 4, h, w) -> images in about [-1, 1] (N, 3, 8h, 8w), in fp32."""
    return vae.decode(latents.float() / SCALE_FACTOR).sample
