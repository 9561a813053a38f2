"""`ditbench extract-latents`: encode an image folder through the VAE once, to a latent file (training
from it skips the encoder, ~38% of a DiT-XL/2 step's FLOPs).

Resumable: shards go to `<out>.parts/` with a progress marker and the final .npz appears atomically. A
fixed order, ADM centre crop, no flip and a seed per shard make a resumed run write the same file.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np

from ditbench.core.errors import UserError, shorten
from ditbench.files.fileio import atomic_write, refuse_link, write_json_atomic
from ditbench.files.outlock import OutputLock
from ditbench.files.outpaths import NPZ, check_file_target, ensure_dir, refuse_output_as_input
from ditbench.sampling.shards import shard_count, shard_path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("image_dir", help="ImageFolder tree: one subfolder per class")
    parser.add_argument(
        "--vae", required=True, help="a local VAE (diffusers folder or state-dict file), or random"
    )
    from ditbench.cli.options import add_device, add_json, add_no_progress

    parser.add_argument(
        "--out",
        required=True,
        metavar="FILE.npz",
        help="the latent file to write (a .parts/ folder next to it holds progress)",
    )
    parser.add_argument("--image-size", type=int, default=256, help="centre-crop size in pixels")
    parser.add_argument("--batch-size", type=int, default=32, help="images per VAE forward")
    parser.add_argument("--shard-size", type=int, default=1024, help="images per resumable shard")
    add_device(parser)
    parser.add_argument("--workers", type=int, default=0, help="image decoding worker processes")
    parser.add_argument("--seed", type=int, default=0, help="seed of the VAE's latent sampling")
    add_json(parser, "what was written (file, count, VAE)")
    add_no_progress(parser)


MAX_SHARD_SIZE = 1 << 24  # images per shard and per batch; beyond it a value is a typo
PROGRESS_FILE = "progress.json"
WHERE = "the progress folder of --out"


def check_arguments(out, image_size: int, batch_size: int, shard_size: int, workers: int, seed: int) -> Path:
    """Refuse, before any work, what would fail midway (UserError naming the option)."""
    from ditbench.spec.knobs import MAX_IMAGE_SIZE, SEED_MAX

    for flag, value, low, high in (
        ("--image-size", image_size, 1, MAX_IMAGE_SIZE),
        ("--batch-size", batch_size, 1, MAX_SHARD_SIZE),
        ("--shard-size", shard_size, 1, MAX_SHARD_SIZE),
        ("--workers", workers, 0, 1024),
        ("--seed", seed, 0, SEED_MAX),
    ):
        if not low <= value <= high:
            raise UserError(f"{flag} must be from {low} to {high:,}, got {value}")
    # the folder is made when the first shard is written
    return check_file_target(out, "--out", create_parent=False, writes=NPZ)


def read_progress(parts: Path, job: dict) -> dict:
    """The progress marker of an interrupted extraction of the same job, or a fresh one (written)."""
    marker = parts / PROGRESS_FILE
    if not marker.is_file():
        state = {"job": job, "done": []}
        write_json_atomic(marker, state, indent=1)
        return state
    try:
        state = json.loads(marker.read_bytes())
    except (ValueError, RecursionError):
        state = None
    done = state.get("done") if isinstance(state, dict) else None
    shards = shard_count(job["count"], job["shard_size"])
    if not isinstance(done, list) or not all(isinstance(s, int) and 0 <= s < shards for s in done):
        raise UserError(
            f"{str(marker)!r} is not a progress file ditbench wrote (damaged?); delete {str(parts)!r} to "
            "start the extraction over"
        )
    if state.get("job") != job:
        raise UserError(
            f"{str(parts)!r} holds progress of a different extraction (other images, VAE, size or shard "
            "size); delete that folder to start over, or rerun with the original arguments"
        )
    # a shard listed as done whose file is gone is encoded again
    state["done"] = [s for s in done if shard_path(parts, s).is_file()]
    return state


def extract_latents(
    image_dir,
    vae: str,
    out,
    image_size: int = 256,
    batch_size: int = 32,
    shard_size: int = 1024,
    device: str = "cpu",
    workers: int = 0,
    seed: int = 0,
    progress: bool = True,
    stop_after_shards: int | None = None,
) -> dict:
    """Encode `image_dir` to `out` (.npz); stop_after_shards stops early, as an interruption would."""
    from ditbench.hardware.device import resolve_device
    from ditbench.models.configs import latent_size
    from ditbench.models.vae import build_vae
    from ditbench.train.data import image_folder

    out = check_arguments(out, image_size, batch_size, shard_size, workers, seed)
    parts = out.with_name(out.name + ".parts")
    refuse_output_as_input(
        [("--out", out), ("--out's progress folder", parts)], [("--vae", vae), ("IMAGES", image_dir)]
    )
    latent_size(image_size)
    dev = resolve_device(device)  # before anything is written: a bad device leaves no .parts/ behind
    dataset = image_folder(image_dir, image_size, flip=False)
    if len(dataset) == 0:
        raise UserError(f"image folder {str(image_dir)!r} holds no images")
    files = [os.path.relpath(p, image_dir) for p, _ in dataset.samples]
    job = {
        "image_dir": str(Path(image_dir).resolve()),
        "vae": str(vae),
        "image_size": image_size,
        "shard_size": shard_size,
        "seed": seed,
        "files_sha1": hashlib.sha1("\n".join(files).encode()).hexdigest(),
        "count": len(files),
    }
    model, vae_desc = build_vae(vae, dev)  # before .parts/: a VAE that does not load leaves nothing behind
    refuse_link(parts, "extract-latents --out")  # its shards are written and then deleted there
    created = not os.path.lexists(parts)
    if not created and not parts.is_dir():
        raise UserError(
            f"{str(parts)!r} is in the way: extract-latents keeps the progress of --out {str(out)!r} in a "
            "folder of that name. Move the file away, or give another --out."
        )
    ensure_dir(parts, WHERE, probe=False)
    try:
        with OutputLock(parts, what=WHERE):  # two extractions into one --out would race on its shards
            state = read_progress(parts, job)
            encoded = _encode_shards(
                dataset, model, dev, parts, state, job, batch_size, workers, progress, stop_after_shards
            )
            if encoded is None:
                return {"path": None, "count": len(files), "shards_encoded": stop_after_shards, "done": False}
            _merge(parts, out, dataset, job, vae_desc)
            shutil.rmtree(parts)  # still holding the lock: no other extraction starts in it meanwhile
    except BaseException:
        if created and not list(parts.glob("shard_*.npz")):
            shutil.rmtree(parts, ignore_errors=True)  # nothing finished: leave no folder behind
        raise
    return {"path": str(out), "count": len(files), "shards_encoded": encoded, "done": True, "vae": vae_desc}


def _encode_shards(
    dataset, model, dev, parts, state, job, batch_size, workers, progress, stop_after
) -> int | None:
    """Encode every shard not yet done; the number encoded, or None when stopped by stop_after."""
    import torch

    from ditbench.core.progress import progress as progress_bar
    from ditbench.models.vae import encode_images

    count, shard_size = job["count"], job["shard_size"]
    done = set(state["done"])
    encoded = 0
    bar = progress_bar(total=count, unit="img", desc="encoding", disable=not progress)
    bar.update(sum(min(shard_size, count - s * shard_size) for s in done))
    for s in range(shard_count(count, shard_size)):
        if s in done:
            continue
        if stop_after is not None and encoded >= stop_after:
            bar.close()
            return None
        lo, hi = s * shard_size, min(count, (s + 1) * shard_size)
        subset = torch.utils.data.Subset(dataset, range(lo, hi))
        loader = torch.utils.data.DataLoader(
            subset, batch_size=batch_size, shuffle=False, num_workers=workers
        )
        gen = torch.Generator(device=dev).manual_seed(job["seed"] * 1_000_003 + s)
        lat, lab = [], []
        for images, labels in loader:
            lat.append(encode_images(model, images.to(dev), generator=gen).float().cpu())
            lab.append(labels)
            bar.update(len(labels))
        shard = {"latents": torch.cat(lat).numpy(), "labels": torch.cat(lab).numpy()}
        atomic_write(shard_path(parts, s), lambda f, shard=shard: np.savez(f, **shard))
        done.add(s)
        state["done"] = sorted(done)
        write_json_atomic(parts / PROGRESS_FILE, state, indent=1)
        encoded += 1
    bar.close()
    return encoded


def _merge(parts: Path, out: Path, dataset, job: dict, vae_desc: str):
    """The final .npz from every shard, written atomically."""
    lat_parts, lab_parts = [], []
    for s in range(shard_count(job["count"], job["shard_size"])):
        path = shard_path(parts, s)
        try:
            with np.load(path, allow_pickle=False) as f:
                lat_parts.append(f["latents"])
                lab_parts.append(f["labels"])
        except (OSError, ValueError, KeyError) as err:
            raise UserError(
                f"shard {str(path)!r} cannot be read ({shorten(str(err), quote=False)}); delete it and rerun "
                "to encode it again"
            ) from None
    out.parent.mkdir(parents=True, exist_ok=True)
    final = {
        "latents": np.concatenate(lat_parts),
        "labels": np.concatenate(lab_parts).astype(np.int64),
        "class_names": np.array(dataset.classes),
        "image_size": np.array(job["image_size"]),
        "vae": np.array(vae_desc),
    }
    atomic_write(out, lambda f: np.savez(f, **final))


def run(args: argparse.Namespace) -> int:
    options = {
        k: getattr(args, k) for k in ("image_size", "batch_size", "shard_size", "device", "workers", "seed")
    }
    result = extract_latents(args.image_dir, args.vae, args.out, progress=not args.no_progress, **options)
    if args.json:
        print(json.dumps(result, indent=2, default=str))
    else:
        print(f"wrote {result['count']} latents to {result['path']} (VAE {result['vae']})")
    return 0
