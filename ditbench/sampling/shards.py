"""The sampling plan and its files: which label each index has, the shards, their seeds, the merge."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from ditbench.core.errors import UserError
from ditbench.files.fileio import read_regular, refuse_link, rmtree_real, write_json_atomic
from ditbench.files.pretrained import is_vae_name


def labels_for(num_samples: int, num_classes: int) -> np.ndarray:
    """Equal counts per class (exactly equal when num_samples is a multiple of num_classes)."""
    return np.arange(num_samples, dtype=np.int64) % num_classes


def shard_seed(seed: int, shard: int) -> int:
    """A well-mixed 63-bit seed per (seed, shard), so neighbouring shards share no stream."""
    return int(
        np.random.SeedSequence([seed, shard]).generate_state(2, dtype=np.uint32).view(np.uint64)[0] >> 1
    )


def shard_count(num_samples: int, batch_size: int) -> int:
    return (num_samples + batch_size - 1) // batch_size


def shard_path(shard_dir: Path, k: int) -> Path:
    return shard_dir / f"shard_{k:06d}.npz"


def default_paths(out: Path) -> tuple[Path, Path]:
    return out.with_name(out.name + ".shards"), out.with_suffix(".json")


def file_fingerprint(path: str) -> dict:
    if path == "random" or is_vae_name(path):  # a VAE by name: its repository, pinned by the HF cache
        return {"path": path}
    p = Path(path)
    st = p.stat()
    return {"path": str(p.resolve()), "bytes": st.st_size, "mtime": int(st.st_mtime)}


def prepare_shard_dir(shard_dir: Path, settings: dict, overwrite: bool) -> None:
    refuse_link(shard_dir, "sample --out")  # shards are written, then deleted: never through a link
    manifest = shard_dir / "manifest.json"
    if os.path.lexists(manifest):
        old = _read_manifest(manifest)
        if old is None and not overwrite:
            raise UserError(
                f"{manifest} is damaged (not the JSON object of settings a sampling run writes), so the "
                f"shards in {shard_dir} cannot be matched to these settings. Pass --overwrite to delete "
                "them and start again, or move the folder away."
            )
        if old != settings:
            if overwrite:
                rmtree_real(shard_dir)
            else:
                diff = sorted(k for k in set(old) | set(settings) if old.get(k) != settings.get(k))
                raise UserError(
                    f"{shard_dir} holds shards of an interrupted run made with other settings "
                    f"({', '.join(f'{k}: {old.get(k)!r} now {settings.get(k)!r}' for k in diff)}). "
                    "Rerun with the same options to resume it, or pass --overwrite to start again."
                )
    shard_dir.mkdir(parents=True, exist_ok=True)
    if not manifest.exists():
        write_json_atomic(manifest, settings, indent=1, sort_keys=True)


def discard_if_empty(shard_dir: Path) -> None:
    """Remove a shard folder that holds its manifest and nothing else (a run that made no shard)."""
    try:
        if not shard_dir.is_symlink() and {p.name for p in shard_dir.iterdir()} <= {"manifest.json"}:
            rmtree_real(shard_dir)
    except OSError:  # nothing there, or not ours to read: leave it
        pass


def _read_manifest(manifest: Path) -> dict | None:
    """The settings a sampling run recorded, or None when the file is not that (damaged, a link, a FIFO)."""
    try:
        value = json.loads(read_regular(manifest))
    except (OSError, UserError, ValueError, RecursionError):  # ValueError: not UTF-8, not JSON
        return None
    return value if isinstance(value, dict) else None


def merge_shards(shard_dir: Path, n_shards: int, num_samples: int) -> tuple[np.ndarray, np.ndarray]:
    missing = [k for k in range(n_shards) if not shard_path(shard_dir, k).exists()]
    if missing:
        raise RuntimeError(
            f"{len(missing)} shard(s) missing in {shard_dir} (first: {missing[0]}); "
            "a rank did not finish. Rerun the same command to make them."
        )
    imgs, labs = [], []
    for k in range(n_shards):
        with np.load(shard_path(shard_dir, k)) as z:
            imgs.append(z["images"])
            labs.append(z["labels"])
    images, labels = np.concatenate(imgs), np.concatenate(labs)
    if len(images) != num_samples:
        raise RuntimeError(f"merged {len(images)} images from {shard_dir}, expected {num_samples}")
    return images, labels
