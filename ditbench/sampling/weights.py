"""The model and the VAE a sampling job decodes with, each kept for the life of the process."""

from __future__ import annotations

import json
from pathlib import Path

from ditbench.sampling.shards import file_fingerprint

_MODEL_CACHE: dict[tuple, tuple] = {}


def load_model_cached(
    checkpoint: str, model_name: str | None, image_size: int | None, num_classes: int | None
):
    """load_model, kept for the life of the process (one at a time): building DiT-XL/2 costs seconds,
    and sampling never changes the weights."""
    fingerprint = json.dumps(file_fingerprint(checkpoint), sort_keys=True)
    key = (fingerprint, model_name, image_size, num_classes)
    if key not in _MODEL_CACHE:
        _MODEL_CACHE.clear()
        _MODEL_CACHE[key] = load_model(checkpoint, model_name, image_size, num_classes)
    return _MODEL_CACHE[key]


def load_model(checkpoint: str, model_name: str | None, image_size: int | None, num_classes: int | None):
    """(model in eval mode on CPU, its name, image size, which weights) from a checkpoint or 'random'.

    A ditbench checkpoint gives its EMA weights when it has them; an official release file
    (a bare state dict) holds EMA weights already. The configuration is read from the tensor shapes.
    """
    import torch

    from ditbench.models.build import build_model
    from ditbench.models.checkpoint import infer_config, load_model_weights
    from ditbench.models.configs import canonical_name

    if checkpoint == "random":
        name = canonical_name(model_name or "DiT-XL/2")
        size = image_size or 256
        torch.manual_seed(0)  # the same random model on every rank and every run
        model = build_model(name, image_size=size, num_classes=num_classes or 1000)
        return model.eval(), name, size, "random"
    model, loaded = load_model_weights(
        checkpoint, model_name, prefer_ema=True, image_size=image_size, num_classes=num_classes
    )
    info = infer_config(loaded.state_dict)
    name = canonical_name(model_name) if model_name else info["name"]
    weights = {"ema": "ema", "model": "model (no EMA in the file)", "bare": "state dict"}[loaded.source]
    return model, name, image_size or info["image_size"], weights


_VAE_CACHE: dict[tuple[str, str], object] = {}


def build_vae(vae: str, device):
    """diffusers' AutoencoderKL (sd-vae-ft-ema architecture) from local weights, or random ones.

    Kept per (weights, device) for the life of the process: building one costs seconds, and a
    notebook or test that samples twice should not pay it twice (the VAE is never modified).
    """
    from ditbench.vae import build_vae as _build

    key = (str(Path(vae).resolve()) if vae != "random" else vae, str(device))
    if key not in _VAE_CACHE:
        model, _desc = _build(vae, device)  # 'random' is seeded inside: the same weights on every rank
        _VAE_CACHE.clear()  # hold one at a time
        _VAE_CACHE[key] = model
    return _VAE_CACHE[key]
