"""DiT checkpoints: ditbench's own format and the official released files, loaded safely.

Written atomically; read (ditbench's or a bare released state dict) with `torch.load(weights_only=True)`
only, the configuration inferred from tensor shapes so that a mismatch is named.
"""

from __future__ import annotations

import pickle
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ditbench.core.errors import UserError
from ditbench.files.fileio import atomic_write
from ditbench.files.outpaths import not_a_file
from ditbench.files.pretrained import resolve_checkpoint
from ditbench.models import vae
from ditbench.models.build import build_model
from ditbench.models.configs import CONFIGS, canonical_name, get_config

FORMAT = "ditbench.checkpoint/1"


def save_checkpoint(
    path, model: nn.Module, ema: nn.Module | None, optimizer, step: int, config: dict
) -> None:
    """Write a ditbench checkpoint atomically; model/ema are bare modules (not DDP/compiled)."""
    state = {
        "format": FORMAT,
        "model": model.state_dict(),
        "ema": ema.state_dict() if ema is not None else None,
        "opt": optimizer.state_dict() if optimizer is not None else None,
        "step": int(step),
        "config": dict(config),
    }
    atomic_write(path, lambda f: torch.save(state, f))


def read_checkpoint(path) -> dict:
    """torch.load(weights_only=True) with user-facing errors; returns whatever dict the file holds."""
    p = Path(path)
    why = not_a_file(p)  # a FIFO or /dev/null named as such, not "does not exist"
    if why is not None:
        raise UserError(f"checkpoint {str(p)!r} {why}; give a .pt checkpoint file")
    try:
        obj = torch.load(p, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        raise UserError(
            f"checkpoint {str(p)!r} was refused: loading it needs arbitrary unpickling (it references code "
            "or classes beyond tensors and plain containers), which could run code from the file. ditbench "
            "loads checkpoints with torch.load(weights_only=True) only. If you trust the file, re-save just "
            f"its state dict (torch.save(model.state_dict(), ...)). Detail: {str(err).splitlines()[0]}"
        ) from None
    except Exception as err:
        raise UserError(
            f"checkpoint {str(p)!r} is not a readable PyTorch file ({type(err).__name__}: {err})"
        ) from None
    if not isinstance(obj, dict):
        raise UserError(f"checkpoint {str(p)!r} holds a {type(obj).__name__}, not a state dict")
    return obj


_PREFIXES = re.compile(r"^(?:module\.|_orig_mod\.)+")  # DDP's and torch.compile's wrappers


def _strip_prefixes(state: dict) -> dict:
    return {_PREFIXES.sub("", k): v for k, v in state.items()}


@dataclass
class LoadedWeights:
    state_dict: dict
    source: str  # "ema", "model" or "bare"
    step: int | None
    config: dict | None  # the ditbench training config, when the file has one


def extract_state_dict(obj: dict, prefer_ema: bool = True, path: str = "checkpoint") -> LoadedWeights:
    if obj.get("format") == FORMAT or ("model" in obj and isinstance(obj.get("model"), dict)):
        for key in ("ema", "model") if prefer_ema else ("model", "ema"):
            sd = obj.get(key)
            if isinstance(sd, dict) and sd:
                return LoadedWeights(_strip_prefixes(sd), key, obj.get("step"), obj.get("config"))
        raise UserError(f"{path!r} has neither 'ema' nor 'model' weights")
    if all(isinstance(v, torch.Tensor) for v in obj.values()) and obj:
        return LoadedWeights(_strip_prefixes(obj), "bare", None, None)
    raise UserError(
        f"{path!r} is neither a ditbench checkpoint (keys model/ema/opt/step/config) nor a bare state dict "
        f"of tensors; its top-level keys are {sorted(map(str, obj))[:8]}"
    )


def infer_config(state: dict) -> dict:
    """What DiT a state dict holds, from its shapes: name (or None), depth, width, patch, image size..."""
    try:
        width = int(state["pos_embed"].shape[-1])
        tokens = int(state["pos_embed"].shape[1])
        patch = int(state["x_embedder.proj.weight"].shape[-1])
        in_ch = int(state["x_embedder.proj.weight"].shape[1])
        rows = int(state["y_embedder.embedding_table.weight"].shape[0])
        out_features = int(state["final_layer.linear.weight"].shape[0])
    except (KeyError, IndexError) as err:
        raise UserError(
            f"the weights are not a DiT state dict (missing or odd {err}); expected official DiT names"
        ) from None
    depth = len({m.group(1) for k in state if (m := re.match(r"blocks\.(\d+)\.", k))})
    grid = int(round(tokens**0.5))
    out_ch = out_features // (patch * patch)
    shape = (depth, width, patch)
    name = next((n for n, c in CONFIGS.items() if (c.depth, c.hidden_size, c.patch_size) == shape), None)
    return {
        "name": name,
        "depth": depth,
        "hidden_size": width,
        "patch_size": patch,
        "image_size": grid * patch * vae.DOWNSAMPLE,
        "num_classes": rows - 1,
        "in_channels": in_ch,
        "learn_sigma": out_ch == 2 * in_ch,
    }


def describe_config(info: dict) -> str:
    label = (
        info["name"]
        or f"an unnamed DiT (depth {info['depth']}, width {info['hidden_size']}, patch {info['patch_size']})"
    )
    return (
        f"{label} at {info['image_size']} px ({info['depth']} blocks, width {info['hidden_size']}, patch "
        f"{info['patch_size']}, {info['num_classes']} classes"
        f"{', learned sigma' if info['learn_sigma'] else ''})"
    )


def load_model_weights(
    path,
    model_name: str | None = None,
    prefer_ema: bool = True,
    image_size: int | None = None,
    num_classes: int | None = None,
) -> tuple[nn.Module, LoadedWeights]:
    """(the DiT a checkpoint holds, or `model_name`, which must match, in eval mode on CPU; its weights):
    with prefer_ema a ditbench checkpoint's EMA weights (the released files hold EMA weights already)."""
    path = resolve_checkpoint(path)  # a released checkpoint by name (DiT-XL-2-256x256.pt): cache, download
    loaded = extract_state_dict(read_checkpoint(path), prefer_ema, str(path))
    info = infer_config(loaded.state_dict)
    want_size = image_size or info["image_size"]
    want_classes = num_classes or info["num_classes"]
    name = canonical_name(model_name) if model_name else info["name"]
    if name is None:
        raise UserError(
            f"checkpoint {str(path)!r} holds {describe_config(info)}, which matches no known configuration"
        )
    c = get_config(name)
    matches = (
        (c.depth, c.hidden_size, c.patch_size) == (info["depth"], info["hidden_size"], info["patch_size"])
        and want_size == info["image_size"]
        and want_classes == info["num_classes"]
    )
    if not matches:
        raise UserError(
            f"checkpoint {str(path)!r} holds {describe_config(info)}, but {name} at {want_size} px with "
            f"{want_classes} classes was asked for; use --model {info['name'] or '?'} --image-size "
            f"{info['image_size']} or the matching checkpoint"
        )
    model = build_model(name, image_size=want_size, num_classes=want_classes, learn_sigma=info["learn_sigma"])
    try:
        model.load_state_dict(loaded.state_dict, strict=True)
    except RuntimeError as err:
        raise UserError(
            f"checkpoint {str(path)!r} ({describe_config(info)}) does not load into {name}: "
            f"{str(err).splitlines()[0]}"
        ) from None
    return model.eval(), loaded
