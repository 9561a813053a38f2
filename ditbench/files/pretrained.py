"""Weights by name, as the official DiT sampler finds them: `ema` / `mse` (stabilityai's sd-vae-ft-ema /
-mse, the Hugging Face cache) and the released DiT checkpoints (`pretrained_models/` or the ditbench
cache, downloaded there once). Offline ($DITBENCH_OFFLINE / $HF_HUB_OFFLINE) nothing is downloaded.
"""

from __future__ import annotations

import os
from pathlib import Path

from ditbench.core.errors import UserError, shorten
from ditbench.files.fileio import download_atomic

OFFLINE_ENVS = ("DITBENCH_OFFLINE", "HF_HUB_OFFLINE")
CACHE_ENV = "DITBENCH_CACHE"
VAE_REPOS = {"ema": "stabilityai/sd-vae-ft-ema", "mse": "stabilityai/sd-vae-ft-mse"}
VAE_FILES = ("config.json", "diffusion_pytorch_model.safetensors")
DIT_URL = "https://dl.fbaipublicfiles.com/DiT/models/"
DIT_CHECKPOINTS = ("DiT-XL-2-256x256.pt", "DiT-XL-2-512x512.pt")
OFFICIAL_DIR = "pretrained_models"  # where the official DiT code downloads them


def offline() -> bool:
    return any(
        os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on") for name in OFFLINE_ENVS
    )


def cache_root() -> Path:
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "ditbench"


def is_vae_name(spec) -> bool:
    return isinstance(spec, str) and spec in VAE_REPOS


def hf_cache_dir() -> Path:
    """The Hugging Face hub cache, read now ($HF_HUB_CACHE, $HF_HOME/hub; the library's default)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def load_vae(name: str):
    """diffusers' AutoencoderKL for `ema` or `mse`: the Hugging Face cache first, then one download."""
    from ditbench.core.extras import require_diffusers

    AutoencoderKL = require_diffusers(f"the pretrained VAE `{name}`").AutoencoderKL
    repo = VAE_REPOS[name]
    cache = hf_cache_dir()
    try:
        return AutoencoderKL.from_pretrained(repo, cache_dir=cache, local_files_only=True)
    except (OSError, ValueError) as err:
        reason = f"not in the cache ({shorten(str(err).splitlines()[0], 160, quote=False)})"
    if not offline():
        try:
            return AutoencoderKL.from_pretrained(repo, cache_dir=cache)
        except Exception as err:  # noqa: BLE001 - offline, proxy, disk full: all end in the same advice
            reason = f"the download failed ({type(err).__name__}: {shorten(str(err), 200, quote=False)})"
    else:
        reason += "; downloading is off ($DITBENCH_OFFLINE or $HF_HUB_OFFLINE)"
    raise UserError(
        f"The VAE `{name}` is the AutoencoderKL {repo} ({' and '.join(VAE_FILES)}), and it could not be "
        f"loaded: {reason}. On a machine with network access run `huggingface-cli download {repo}` and "
        f"copy its folder {cache / ('models--' + repo.replace('/', '--'))} to the same place here (the "
        f"Hugging Face cache, $HF_HUB_CACHE: {cache}), or download those two files from "
        f"https://huggingface.co/{repo} into a folder and give that folder instead of `{name}`."
    )


def resolve_checkpoint(spec: str | os.PathLike) -> Path:
    """A checkpoint file: `spec` itself when it is one, else a released DiT checkpoint by name."""
    path = Path(spec).expanduser()
    if path.is_file() or path.name not in DIT_CHECKPOINTS or str(spec) != path.name:
        return path  # a path (or an unknown name): the loader says what is wrong with it
    dest = cache_root() / "checkpoints" / path.name
    for candidate in (Path(OFFICIAL_DIR) / path.name, dest):
        if candidate.is_file():
            return candidate
    url = DIT_URL + path.name
    if offline():
        reason = "downloading is off ($DITBENCH_OFFLINE or $HF_HUB_OFFLINE)"
    else:
        try:
            download_atomic(url, dest)
            return dest
        except Exception as err:  # noqa: BLE001 - offline, proxy, disk full: all end in the same advice
            reason = f"the download failed ({type(err).__name__}: {shorten(str(err), 200, quote=False)})"
    raise UserError(
        f"The DiT checkpoint {path.name} is not in {OFFICIAL_DIR}/ nor at {dest}, and {reason}. Download "
        f"{url} on a machine with network access and put it at {dest} (or in ./{OFFICIAL_DIR}/, or give "
        "its path instead of the name)."
    )
