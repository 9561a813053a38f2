"""Pixel data without a VAE: the image itself, scaled to [-1, 1], is the DiT's 4 x s x s latent (grey:
each cell a 2x2 block of a grey image of side 2s; `colour: rgb`: one RGB pixel and its luma). Decoding
is the exact inverse, so a CPU trains and scores a real image model in minutes (`suites/cpu_quality.yaml`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ditbench.core.errors import UserError, shorten
from ditbench.models import vae

BLOCK = 2  # pixels per latent cell along each side: BLOCK**2 == vae.LATENT_CHANNELS grey pixels
LUMA = (0.299, 0.587, 0.114)  # ITU-R 601, as to_grey
assert BLOCK * BLOCK == vae.LATENT_CHANNELS


def colour_of(data) -> str:
    """`grey` or `rgb`: how a `{pixels: ...}` data spec puts its images into the latent."""
    return data.get("colour", "grey") if isinstance(data, dict) else "grey"


def pixel_side(image_size: int, colour: str = "grey") -> int:
    """The side of the images a model of `image_size` trains on with pixel data of this colour."""
    return image_size // vae.DOWNSAMPLE * (BLOCK if colour == "grey" else 1)


def to_grey(images: np.ndarray) -> np.ndarray:
    """uint8 N x H x W (grey) or N x H x W x 3 (RGB, ITU-R 601 luma as PIL's convert('L')) -> N x H x W."""
    if images.ndim == 3:
        return images
    rgb = images.astype(np.uint32)
    return ((rgb[..., 0] * 299 + rgb[..., 1] * 587 + rgb[..., 2] * 114 + 500) // 1000).astype(np.uint8)


def encode(grey):
    """uint8 grey images (N, H, W) (numpy or torch) -> latents (N, 4, H/2, W/2) float32 in [-1, 1]."""
    import torch
    import torch.nn.functional as F

    x = torch.as_tensor(grey)
    return F.pixel_unshuffle(x.float().div(127.5).sub(1.0).unsqueeze(1), BLOCK)


def encode_rgb(rgb):
    """uint8 RGB images (N, H, W, 3) -> latents (N, 4, H, W) float32 in [-1, 1]: R, G, B and the luma
    (not a constant, whose noise prediction at small noise levels would need an unbounded gain)."""
    import torch

    x = torch.as_tensor(rgb).float().div(127.5).sub(1.0).permute(0, 3, 1, 2)
    luma = sum(w * x[:, c : c + 1] for c, w in enumerate(LUMA))
    return torch.cat([x, luma], dim=1).contiguous()


def decode_rgb(latents):
    """Latents (N, 4, s, s) -> RGB images in [-1, 1] (N, 3, s, s), fp32; the luma channel is dropped."""
    return latents[:, :3].float().clamp(-1.0, 1.0)


def decode(latents):
    """Latents (N, 4, s, s) -> images in [-1, 1] (N, 3, 2s, 2s), the grey in every channel, in fp32."""
    import torch.nn.functional as F

    grey = F.pixel_shuffle(latents.float(), BLOCK).clamp(-1.0, 1.0)
    return grey.expand(-1, 3, -1, -1)


def load_pixels(spec: str, image_size: int, num_classes: int, colour: str = "grey"):
    """(uint8 N x H x W grey or N x H x W x 3 RGB, labels int64 N) from an ADM npz (`arr_0` images of
    pixel_side(image_size, colour), optional `arr_1` labels) or a `builtin:` name, in `colour`."""
    from ditbench.models import builtin_data

    path = builtin_data.resolve(spec) if builtin_data.is_builtin(spec) else Path(spec)
    where = f"pixel data {shorten(str(spec), 200)}"
    if not path.is_file():
        raise UserError(
            f"{where} is not a file; give an .npz with `arr_0` (uint8 images N x H x W or N x H x W x 3) "
            f"and optional `arr_1` (labels), or a built-in dataset ({', '.join(builtin_data.names())})."
        )
    try:
        with np.load(path, allow_pickle=False) as f:
            if "arr_0" not in f.files:
                raise UserError(f"{where} has arrays {sorted(f.files)}; it needs `arr_0` (uint8 images).")
            images = f["arr_0"]
            labels = f["arr_1"] if "arr_1" in f.files else np.zeros(len(images), dtype=np.int64)
    except (OSError, ValueError) as err:
        raise UserError(f"{where} is not a readable .npz without pickled objects ({err}).") from None
    side = pixel_side(image_size, colour)
    if images.dtype != np.uint8 or images.ndim not in (3, 4) or (images.ndim == 4 and images.shape[3] != 3):
        raise UserError(
            f"{where}: `arr_0` is {images.dtype} {images.shape}; it must be uint8 N x H x W or N x H x W x 3."
        )
    if images.shape[1:3] != (side, side) or len(images) == 0:
        raise UserError(
            f"{where} holds {len(images)} images of {images.shape[1]}x{images.shape[2]} pixels, but a model "
            f"of image_size {image_size} trains on {colour} images of {side}x{side} with pixel data (its "
            f"{image_size // vae.DOWNSAMPLE}x{image_size // vae.DOWNSAMPLE} latent holds "
            f"{'2x2 grey pixel blocks' if colour == 'grey' else 'one RGB pixel per cell'}); set image_size "
            f"to {images.shape[1] * vae.DOWNSAMPLE // (BLOCK if colour == 'grey' else 1)} or resize the "
            "images."
        )
    labels = np.asarray(labels)
    if labels.shape != (len(images),) or labels.dtype.kind not in "iu":
        raise UserError(
            f"{where}: `arr_1` must hold one integer label per image, got {labels.dtype} {labels.shape}."
        )
    if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
        raise UserError(
            f"{where} has labels in [{labels.min()}, {labels.max()}], outside [0, {num_classes - 1}] for "
            f"num_classes {num_classes}."
        )
    if colour == "rgb":
        rgb = images if images.ndim == 4 else np.repeat(images[..., None], 3, axis=-1)
        return rgb, labels.astype(np.int64)
    return to_grey(images), labels.astype(np.int64)
