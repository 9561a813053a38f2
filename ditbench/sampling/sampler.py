"""Sampling as a library: `sample(job)` runs (or resumes) a job on this process's share of the shards.

Shard k holds samples [k*B, (k+1)*B), its noise seeded from (seed, k), so the images do not depend on
the rank count; shards are written atomically to `<out>.shards/`, a rerun skips those on disk, and rank 0
merges them into `--out` and `<out stem>.json`.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from ditbench.core.errors import UserError
from ditbench.files.fileio import atomic_write, read_regular, write_json_atomic
from ditbench.files.pretrained import DIT_CHECKPOINTS, is_vae_name, resolve_checkpoint
from ditbench.records.metrics import IMAGES_PER_S
from ditbench.sampling.shards import (
    default_paths,
    discard_if_empty,
    file_fingerprint,
    labels_for,
    merge_shards,
    prepare_shard_dir,
    shard_count,
    shard_path,
    shard_seed,
)

SCHEMA = "ditbench.samples/1"
# For tests of resumption: raise after this many shards were written in this run.
FAIL_AFTER_ENV = "DITBENCH_SAMPLE_FAIL_AFTER_SHARDS"


def load_model_cached(
    checkpoint: str, model_name: str | None, image_size: int | None, num_classes: int | None
):
    """load_model, kept for the life of the process (one at a time, per file content): building
    DiT-XL/2 costs seconds, and sampling never changes the weights."""
    fingerprint = json.dumps(file_fingerprint(checkpoint), sort_keys=True)
    return _load_model(fingerprint, checkpoint, model_name, image_size, num_classes)


@functools.lru_cache(maxsize=1)
def _load_model(fingerprint: str, checkpoint: str, model_name, image_size, num_classes):
    """(model in eval mode on CPU, its name, image size, which weights) from a checkpoint or 'random',
    with a ditbench checkpoint's EMA weights when it has them (a released file holds EMA weights already)."""
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


def build_vae(vae: str, device):
    """diffusers' AutoencoderKL (sd-vae-ft-ema architecture) from local weights, or random ones (seeded:
    the same on every rank), kept per (weights, device) for the life of the process, one at a time."""
    return _build_vae(str(Path(vae).resolve()) if vae != "random" else vae, vae, device)


@functools.lru_cache(maxsize=1)
def _build_vae(where: str, vae: str, device):
    """`where` (the weights' absolute path) keys the cache: a relative --vae names another file elsewhere."""
    from ditbench.models.vae import build_vae as build

    return build(vae, device)[0]


def check_args(args) -> None:
    from ditbench.models.vae import LATENT_CHANNELS
    from ditbench.spec.base import from_flags
    from ditbench.spec.knobs import MAX_CLASSES, MAX_IMAGE_SIZE, SEED_MAX
    from ditbench.spec.quality import Sampler

    for name in ("num_samples", "batch_size", "num_classes"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise UserError(f"--{name.replace('_', '-')} {getattr(args, name)} must be at least 1.")
    # the bounds of the quality section's sampler (--sampler and --precision are checked as choices)
    from_flags(Sampler, {"steps": args.steps, "cfg_scale": args.cfg_scale})
    bounds = (  # beyond them a value is a typo, and an allocation the size of the typo
        ("seed", 0, SEED_MAX),
        ("num_classes", 1, MAX_CLASSES),
        ("image_size", 1, MAX_IMAGE_SIZE),
        ("guidance_channels", 1, LATENT_CHANNELS),  # the latent has 4 channels; 0 would silently guide none
    )
    for name, low, high in bounds:
        value = getattr(args, name, None)
        if value is not None and not low <= value <= high:
            raise UserError(f"--{name.replace('_', '-')} {value} must be from {low} to {high:,}.")
    if args.checkpoint != "random":
        args.checkpoint = str(resolve_checkpoint(args.checkpoint))  # a released checkpoint by name
    if args.checkpoint != "random" and not Path(args.checkpoint).is_file():
        raise UserError(
            f"checkpoint {args.checkpoint!r} is not a file; give a .pt checkpoint, the name of a released "
            f"one ({', '.join(DIT_CHECKPOINTS)}) or 'random'."
        )
    if args.vae != "random" and not is_vae_name(args.vae) and not Path(args.vae).exists():
        raise UserError(
            f"--vae {args.vae!r} does not exist. Give `ema` or `mse` (stabilityai's sd-vae-ft-ema/-mse, "
            "from the Hugging Face cache), a local folder with AutoencoderKL weights (config.json + "
            "diffusion_pytorch_model.safetensors) or a state-dict file, or 'random' to time sampling with "
            "random VAE weights (the images are then meaningless)."
        )
    from ditbench.files.outpaths import NPZ, check_file_target, refuse_output_as_input

    check_file_target(args.out, "--out", create_parent=False, writes=NPZ)  # rank 0 creates the folder later
    shard_dir, record_path = default_paths(Path(args.out))
    check_file_target(record_path, "--out's record", create_parent=False)
    refuse_output_as_input(  # the npz, its record and its shard folder, against what sampling reads
        [("--out", args.out), ("--out's record", record_path), ("--out's shard folder", shard_dir)],
        [("CHECKPOINT", None if args.checkpoint == "random" else args.checkpoint), ("--vae", args.vae)],
    )


def _precision_context(precision: str, device):
    """The training policy's autocast and TF32 setting, without its GradScaler (no backward here)."""
    from ditbench.hardware.precision import get_precision_policy

    policy = get_precision_policy(precision, device)
    policy.apply_backend_flags()
    return policy.autocast()


def make_shard(
    model,
    vae,
    diffusion,
    labels: np.ndarray,
    *,
    latent: int,
    seed: int,
    cfg_scale: float,
    sampler: str,
    guidance_channels: int | None,
    precision: str,
    device,
    decode=None,
) -> np.ndarray:
    """uint8 (n, H, W, 3) images for one shard's labels, all noise from one seeded generator; `decode`
    (latents -> images in [-1, 1], e.g. `ditbench.models.pixels.decode`) replaces the VAE where given."""
    import torch

    from ditbench.models.diffusion import sample_latents
    from ditbench.models.vae import decode_latents

    gen = torch.Generator(device=device).manual_seed(seed)
    y = torch.from_numpy(labels).to(device)
    with torch.inference_mode(), _precision_context(precision, device):
        z = sample_latents(
            model,
            diffusion,
            y,
            latent,
            cfg_scale=cfg_scale,
            sampler=sampler,
            guidance_channels=guidance_channels,
            generator=gen,
            in_channels=getattr(model, "in_channels", 4),
        )
        x = decode(z) if decode is not None else decode_latents(vae, z)
    x = torch.clamp(127.5 * x.float() + 128.0, 0, 255)  # [-1, 1] -> [0, 255], DiT's rounding
    return x.permute(0, 2, 3, 1).to("cpu", dtype=torch.uint8).numpy()


def _settings(args, model_name: str, image_size: int, num_classes: int, weights: str) -> dict:
    """Everything that shapes the images: a resumed run must match it exactly."""
    named = ("num_samples", "batch_size", "steps", "sampler", "cfg_scale", "guidance_channels", "seed")
    return {
        "checkpoint": file_fingerprint(args.checkpoint),
        "weights": weights,
        "vae": file_fingerprint(args.vae),
        "model": model_name,
        "image_size": image_size,
        "num_classes": num_classes,
        **{name: getattr(args, name) for name in (*named, "precision")},
    }


def _finished(args, out: Path, record_path: Path, settings: dict) -> dict | None:
    """The record of an npz already made with these settings; UserError if --out holds another."""
    if not out.exists():
        return None
    if record_path.exists():
        try:
            old = json.loads(read_regular(record_path, "--out's record"))
        except ValueError:  # not UTF-8 JSON: no usable record of how --out was made
            old = None
        if isinstance(old, dict) and old.get("settings") == settings:
            return old
        why = "was made with other settings"
    else:
        why = f"has no record of how it was made ({record_path} is missing)"
    if not args.overwrite:
        raise UserError(f"{out} exists and {why}; pass --overwrite to replace it or choose another --out.")
    return None


def _announce(args, ctx, settings: dict, images: int) -> None:
    """The estimate of the images still to make (rank 0), before the first shard: a DiT forward per
    step (two with guidance) and a VAE decode per image, at the device's rate (walltime)."""
    from ditbench.hardware.walltime import LONG_CPU_S, VAE_DECODE_FLOPS_PER_PIXEL, announce, flops_s
    from ditbench.models.flops import forward_macs

    device = ctx.device.type if ctx.device.type == "cpu" else str(ctx.device)
    size, passes = settings["image_size"], args.steps * (2 if args.cfg_scale > 1 else 1)
    flops = 2 * forward_macs(settings["model"], size) * passes + VAE_DECODE_FLOPS_PER_PIXEL * size**2
    per_image = flops_s(flops, device, args.precision)
    cheaper = (
        f"Fewer images (--num-samples {max(1, int(LONG_CPU_S / per_image)):,} takes about 30 min), fewer "
        "steps (--steps 50 --sampler ddim), or a GPU."
        if per_image
        else ""
    )
    what = f"{images:,} images of {settings['model']}, {args.steps} steps each"
    yes = getattr(args, "yes", False)
    announce("sample", per_image and per_image * images / ctx.world_size, what, device, yes, cheaper)


def _make_shards(args, ctx, model, vae, settings: dict, shard_dir: Path, missing: list[int]) -> dict:
    """This rank's share of the missing shards (announced first, on rank 0), each written atomically;
    {rank, images, seconds}."""
    import torch

    from ditbench.core.progress import progress
    from ditbench.models.configs import latent_size
    from ditbench.models.diffusion import create_diffusion

    device = ctx.device
    diffusion = create_diffusion(str(args.steps))
    latent = latent_size(settings["image_size"])
    labels = labels_for(args.num_samples, settings["num_classes"])
    fail_after = int(os.environ.get(FAIL_AFTER_ENV, "0") or 0)
    n, b = args.num_samples, args.batch_size
    todo = sum(min(b, n - k * b) for k in missing)
    if ctx.is_main and missing:
        _announce(args, ctx, settings, todo)
    quiet = args.no_progress or not ctx.is_main
    bar = progress(total=n, initial=n - todo, unit="img", desc="sampling", disable=quiet)
    made = 0
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for written, k in enumerate(missing[ctx.rank :: ctx.world_size]):
        if fail_after and written >= fail_after:
            raise RuntimeError(f"{FAIL_AFTER_ENV}={fail_after}: stopping after {written} shards (test hook)")
        lab = labels[k * args.batch_size : (k + 1) * args.batch_size]
        images = make_shard(
            model,
            vae,
            diffusion,
            lab,
            latent=latent,
            seed=shard_seed(args.seed, k),
            cfg_scale=args.cfg_scale,
            sampler=args.sampler,
            guidance_channels=args.guidance_channels,
            precision=args.precision,
            device=device,
        )
        atomic_write(shard_path(shard_dir, k), lambda f, x=images, y=lab: np.savez(f, images=x, labels=y))
        made += len(lab)
        bar.update(min(len(lab) * ctx.world_size, bar.total - bar.n))
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    bar.close()
    return {"rank": ctx.rank, "images": made, "seconds": time.perf_counter() - t0}


def _record(args, ctx, out: Path, settings: dict, shape, per_rank: list[dict]) -> dict:
    from ditbench.hardware.environment import collect_env

    total_made = sum(r["images"] for r in per_rank)
    wall = max(r["seconds"] for r in per_rank)
    random_parts = [
        x for x, r in (("model", settings["weights"] == "random"), ("VAE", args.vae == "random")) if r
    ]
    record = {
        "schema": SCHEMA,
        "npz": str(out),
        "settings": settings,
        "shape": list(shape),
        "world_size": ctx.world_size,
        "batch_size_per_rank": args.batch_size,
        "images_generated_this_run": total_made,
        "images_resumed": args.num_samples - total_made,
        "sampling_seconds": wall,
        # Sampling only (model and VAE loading excluded), over the ranks working in parallel.
        IMAGES_PER_S.key: (total_made / wall) if total_made and wall > 0 else None,
        "per_rank": per_rank,
        "for_speed_only": bool(random_parts),
        "env": {**collect_env(), "device": str(ctx.device)},
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if random_parts:
        record["warning"] = (
            f"random {' and '.join(random_parts)} weights: these images measure speed only and are "
            "meaningless for FID"
        )
    return record


def sample(args) -> dict:
    """Run (or resume) a sampling job; returns the record written next to the npz (on rank 0)."""
    from ditbench.hardware import dist

    check_args(args)
    out = Path(args.out)
    shard_dir, record_path = default_paths(out)
    ctx = dist.init(args.device)
    fresh = not os.path.lexists(shard_dir)  # a folder this run makes is this run's to take back
    try:
        _precision_context(args.precision, ctx.device)  # refuse fp16/tf32 on a CPU before any work
        model, model_name, image_size, weights = load_model_cached(
            args.checkpoint, args.model, args.image_size, args.num_classes
        )
        settings = _settings(args, model_name, image_size, int(model.num_classes), weights)
        done = _finished(args, out, record_path, settings)
        if done is not None:
            if ctx.is_main:
                print(
                    f"ditbench: {out} is already complete with these settings; nothing to do.",
                    file=sys.stderr,
                )
            return done
        if ctx.is_main:
            out.parent.mkdir(parents=True, exist_ok=True)
            prepare_shard_dir(shard_dir, settings, args.overwrite)
        dist.barrier(ctx)
        if not ctx.is_main:  # every rank checks the manifest (rank 0 wrote it)
            prepare_shard_dir(shard_dir, settings, overwrite=False)
        model = model.to(ctx.device).eval()
        vae = build_vae(args.vae, ctx.device)
        n_shards = shard_count(args.num_samples, args.batch_size)
        # Every rank takes every world_size-th missing shard, listed by rank 0 before anyone writes, so a
        # resumed run is balanced however the interrupted one left it (no rank waits long at the barrier).
        missing = (
            [k for k in range(n_shards) if not shard_path(shard_dir, k).exists()] if ctx.is_main else None
        )
        missing = dist.all_gather_objects(ctx, missing)[0]
        mine = _make_shards(args, ctx, model, vae, settings, shard_dir, missing)
        per_rank = dist.all_gather_objects(ctx, mine)
        dist.barrier(ctx)
        if not ctx.is_main:
            return {}
        images, labels_out = merge_shards(shard_dir, n_shards, args.num_samples)
        atomic_write(out, lambda f: np.savez(f, arr_0=images, arr_1=labels_out))
        record = _record(args, ctx, out, settings, images.shape, per_rank)
        write_json_atomic(record_path, record, indent=1)
        if not args.keep_shards:
            shutil.rmtree(shard_dir, ignore_errors=True)
        return record
    except BaseException:  # failed or interrupted: a shard folder it made with no shard claims none
        if ctx.is_main and fresh:
            discard_if_empty(shard_dir)
        raise
    finally:
        dist.shutdown()
