"""`ditbench sample`: class-conditional samples from a DiT checkpoint into an ADM batch `.npz`.

Defaults follow the DiT paper's FID protocol: 50,000 samples with equal counts per class
(sample i has label i mod num_classes), classifier-free guidance at scale 1.5, ancestral
DDPM over 250 respaced steps, and the sd-vae-ft-ema decoder. The output is what the ADM
evaluator and `ditbench fid` read: `arr_0` uint8 (N, H, W, 3) and `arr_1` int64 labels (N,).

Work is cut into shards of `--batch-size` samples. Shard k holds samples
[k*B, (k+1)*B), draws all its noise from its own generator seeded from (seed, k), and is
written atomically to `<out>.shards/shard_<k>.npz`. So:

- under torchrun each rank takes shards k with k mod world_size == rank, and the images do
  not depend on how many ranks made them (on the same kind of device);
- an interrupted run restarted with the same options skips the shards on disk and makes the
  others, and the merged npz equals an uninterrupted run's;
- the same seed gives the same npz twice.

When every shard exists, rank 0 merges them in order into `--out` (atomically), writes
`<out stem>.json` (settings, images/s, environment) and removes the shard folder.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import socket
import sys
import time
from pathlib import Path

import numpy as np

from ditbench.errors import UserError
from ditbench.fileio import atomic_write, write_json_atomic

SCHEMA = "ditbench.samples/1"
# For tests of resumption: raise after this many shards were written in this run.
FAIL_AFTER_ENV = "DITBENCH_SAMPLE_FAIL_AFTER_SHARDS"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Sample class-conditional images from a DiT checkpoint into an ADM-format .npz (arr_0 uint8 NHWC "
        "images, arr_1 labels). Run it under torchrun to sample on several GPUs; rerun the same command "
        "to resume an interrupted run."
    )
    parser.add_argument(
        "checkpoint",
        help="a ditbench checkpoint, an official DiT checkpoint "
        "(e.g. DiT-XL-2-256x256.pt; EMA weights are used when present), or 'random' for "
        "random initial weights (speed measurement only)",
    )
    parser.add_argument("--out", default="samples.npz", help="the .npz to write (default: %(default)s)")
    parser.add_argument(
        "--vae",
        required=True,
        help="local folder (or file) of the sd-vae-ft-ema/mse "
        "AutoencoderKL weights, or 'random' for random weights (speed measurement only)",
    )
    parser.add_argument(
        "--model",
        default=None,
        help="DiT configuration, e.g. DiT-XL/2 (default: from the "
        "checkpoint when it records it, else DiT-XL/2)",
    )
    parser.add_argument(
        "--image-size",
        type=int,
        default=None,
        help="image side in pixels (default: from the checkpoint when it records it, else 256)",
    )
    parser.add_argument(
        "--num-classes", type=int, default=None, help="(default: from the checkpoint, else 1000)"
    )
    parser.add_argument(
        "--num-samples", type=int, default=50_000, help="(default: %(default)s, the FID protocol)"
    )
    parser.add_argument(
        "--steps", type=int, default=250, help="sampling steps, respaced from 1000 (default: %(default)s)"
    )
    parser.add_argument("--sampler", choices=("ddpm", "ddim"), default="ddpm", help="(default: %(default)s)")
    parser.add_argument(
        "--cfg-scale",
        type=float,
        default=1.5,
        help="classifier-free guidance scale; 1 = off (default: %(default)s)",
    )
    parser.add_argument(
        "--guidance-channels",
        type=int,
        default=None,
        help="guide only the first K latent "
        "channels; 3 reproduces the official DiT sampler exactly (default: all)",
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=32,
        help="samples per shard and per forward pass on each rank (the doubled CFG batch is twice "
        "this; default: %(default)s)",
    )
    parser.add_argument("--seed", type=int, default=0, help="(default: %(default)s)")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default: %(default)s)")
    parser.add_argument(
        "--precision",
        choices=("fp32", "tf32", "bf16", "fp16"),
        default="fp32",
        help="fp32 (default) is the reference; tf32/bf16/fp16 are faster and change the images slightly",
    )
    parser.add_argument("--keep-shards", action="store_true", help="keep the shard folder after merging")
    parser.add_argument(
        "--overwrite", action="store_true", help="replace an existing --out made with other settings"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


# --------------------------------------------------------------------------------------------
# Plan: what each index of the batch is


def labels_for(num_samples: int, num_classes: int) -> np.ndarray:
    """Equal counts per class (exactly equal when num_samples is a multiple of num_classes)."""
    return (np.arange(num_samples, dtype=np.int64) % num_classes).astype(np.int64)


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
    """(<out>.shards folder, <out stem>.json record)."""
    return out.with_name(out.name + ".shards"), out.with_suffix(".json")


def _file_fingerprint(path: str) -> dict:
    if path == "random":
        return {"path": "random"}
    p = Path(path)
    st = p.stat()
    return {"path": str(p.resolve()), "bytes": st.st_size, "mtime": int(st.st_mtime)}


# --------------------------------------------------------------------------------------------
# Model and VAE


_MODEL_CACHE: dict[tuple, tuple] = {}


def load_model_cached(
    checkpoint: str, model_name: str | None, image_size: int | None, num_classes: int | None
):
    """load_model, kept for the life of the process (one at a time): building DiT-XL/2 costs seconds,
    and sampling never changes the weights."""
    fingerprint = json.dumps(_file_fingerprint(checkpoint), sort_keys=True)
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


# --------------------------------------------------------------------------------------------
# Sampling


def _precision_context(precision: str, device):
    """The training policy's autocast and TF32 setting, without its GradScaler (no backward here)."""
    from ditbench.precision import get_precision_policy

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
) -> np.ndarray:
    """uint8 (n, H, W, 3) images for one shard's labels, all noise from one seeded generator."""
    import torch

    from ditbench.diffusion import sample_latents
    from ditbench.vae import decode_latents

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
        x = decode_latents(vae, z)
    x = torch.clamp(127.5 * x.float() + 128.0, 0, 255)  # [-1, 1] -> [0, 255], DiT's rounding
    return x.permute(0, 2, 3, 1).to("cpu", dtype=torch.uint8).numpy()


def _settings(args, model_name: str, image_size: int, num_classes: int, weights: str) -> dict:
    """Everything that shapes the images: a resumed run must match it exactly."""
    return {
        "checkpoint": _file_fingerprint(args.checkpoint),
        "weights": weights,
        "vae": _file_fingerprint(args.vae),
        "model": model_name,
        "image_size": image_size,
        "num_classes": num_classes,
        "num_samples": args.num_samples,
        "batch_size": args.batch_size,
        "steps": args.steps,
        "sampler": args.sampler,
        "cfg_scale": args.cfg_scale,
        "guidance_channels": args.guidance_channels,
        "seed": args.seed,
        "precision": args.precision,
    }


def _check_args(args) -> None:
    for name in ("num_samples", "batch_size", "steps", "num_classes"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise UserError(f"--{name.replace('_', '-')} {getattr(args, name)} must be at least 1.")
    if args.steps > 1000:
        raise UserError(f"--steps {args.steps} must be at most 1000 (the diffusion has 1000 steps).")
    if args.cfg_scale < 1.0:
        raise UserError(f"--cfg-scale {args.cfg_scale} must be >= 1 (1 turns guidance off).")
    if args.checkpoint != "random" and not Path(args.checkpoint).is_file():
        raise UserError(f"checkpoint {args.checkpoint!r} is not a file; give a .pt checkpoint or 'random'.")
    if args.vae != "random" and not Path(args.vae).exists():
        raise UserError(
            f"--vae {args.vae!r} does not exist. Give a local folder with the sd-vae-ft-ema (or -mse) "
            "AutoencoderKL weights (config.json + diffusion_pytorch_model.safetensors) or a state-dict "
            "file, or 'random' to time sampling with random VAE weights (the images are then meaningless)."
        )
    if not str(args.out).endswith(".npz"):
        raise UserError(f"--out {args.out!r} must end in .npz (the ADM batch format).")


def _prepare_shard_dir(shard_dir: Path, settings: dict, overwrite: bool) -> None:
    manifest = shard_dir / "manifest.json"
    if manifest.exists():
        old = json.loads(manifest.read_text())
        if old != settings:
            if overwrite:
                shutil.rmtree(shard_dir)
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


def _env_info(device) -> dict:
    import torch

    import ditbench

    info = {
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "ditbench": ditbench.__version__,
        "device": str(device),
    }
    if device.type == "cuda":
        info["gpu_name"] = torch.cuda.get_device_name(device)
    return info


def sample(args) -> dict:
    """Run (or resume) a sampling job; returns the record written next to the npz (on rank 0)."""
    import torch

    from ditbench import dist
    from ditbench.diffusion import create_diffusion
    from ditbench.models.configs import latent_size

    _check_args(args)
    out = Path(args.out)
    shard_dir, record_path = default_paths(out)
    ctx = dist.init(args.device)
    try:
        _precision_context(args.precision, ctx.device)  # refuse fp16/tf32 on a CPU before any work
        model, model_name, image_size, weights = load_model_cached(
            args.checkpoint, args.model, args.image_size, args.num_classes
        )
        num_classes = int(model.num_classes)
        settings = _settings(args, model_name, image_size, num_classes, weights)
        if out.exists() and record_path.exists():
            old = json.loads(record_path.read_text())
            if old.get("settings") == settings:
                if ctx.is_main:
                    print(
                        f"ditbench: {out} is already complete with these settings; nothing to do.",
                        file=sys.stderr,
                    )
                return old
            if not args.overwrite:
                raise UserError(
                    f"{out} exists and was made with other settings; pass --overwrite to "
                    "replace it or choose another --out."
                )
        elif out.exists() and not args.overwrite:
            raise UserError(
                f"{out} exists and has no record of how it was made ({record_path} is missing); "
                "pass --overwrite to replace it or choose another --out."
            )
        if ctx.is_main:
            out.parent.mkdir(parents=True, exist_ok=True)
            _prepare_shard_dir(shard_dir, settings, args.overwrite)
        dist.barrier(ctx)
        if not ctx.is_main:  # every rank checks the manifest (rank 0 wrote it)
            _prepare_shard_dir(shard_dir, settings, overwrite=False)

        device = ctx.device
        model = model.to(device).eval()
        vae = build_vae(args.vae, device)
        diffusion = create_diffusion(str(args.steps))
        latent = latent_size(image_size)
        labels = labels_for(args.num_samples, num_classes)
        n_shards = shard_count(args.num_samples, args.batch_size)
        # Rank 0 lists the missing shards and every rank takes every world_size-th of them, so a
        # resumed run is balanced however the interrupted one left it (and no rank waits long
        # at the final barrier). Listed before anyone writes, so all ranks see the same list.
        missing = (
            [k for k in range(n_shards) if not shard_path(shard_dir, k).exists()] if ctx.is_main else None
        )
        missing = dist.all_gather_objects(ctx, missing)[0]
        todo = missing[ctx.rank :: ctx.world_size]
        fail_after = int(os.environ.get(FAIL_AFTER_ENV, "0") or 0)

        bar = None
        if ctx.is_main and not args.no_progress:
            from tqdm.auto import tqdm

            done_images = args.num_samples - sum(
                len(labels[k * args.batch_size : (k + 1) * args.batch_size]) for k in missing
            )
            bar = tqdm(
                total=args.num_samples, initial=done_images, unit="img", desc="sampling", dynamic_ncols=True
            )
        made = 0
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        for written, k in enumerate(todo):
            if fail_after and written >= fail_after:
                raise RuntimeError(
                    f"{FAIL_AFTER_ENV}={fail_after}: stopping after {written} shards (test hook)"
                )
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
            if bar is not None:
                bar.update(min(len(lab) * ctx.world_size, bar.total - bar.n))
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - t0
        if bar is not None:
            bar.close()

        per_rank = dist.all_gather_objects(ctx, {"rank": ctx.rank, "images": made, "seconds": seconds})
        dist.barrier(ctx)
        if not ctx.is_main:
            return {}
        images, labels_out = merge_shards(shard_dir, n_shards, args.num_samples)
        atomic_write(out, lambda f: np.savez(f, arr_0=images, arr_1=labels_out))
        total_made = sum(r["images"] for r in per_rank)
        wall = max(r["seconds"] for r in per_rank)
        record = {
            "schema": SCHEMA,
            "npz": str(out),
            "settings": settings,
            "shape": list(images.shape),
            "world_size": ctx.world_size,
            "batch_size_per_rank": args.batch_size,
            "images_generated_this_run": total_made,
            "images_resumed": args.num_samples - total_made,
            "sampling_seconds": wall,
            # Sampling only (model and VAE loading excluded), over the ranks working in parallel.
            "images_per_s": (total_made / wall) if total_made and wall > 0 else None,
            "per_rank": per_rank,
            "for_speed_only": weights == "random" or args.vae == "random",
            "env": _env_info(device),
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        if record["for_speed_only"]:
            what = " and ".join(
                x for x, r in (("model", weights == "random"), ("VAE", args.vae == "random")) if r
            )
            record["warning"] = (
                f"random {what} weights: these images measure speed only and are meaningless for FID"
            )
        write_json_atomic(record_path, record, indent=1)
        if not args.keep_shards:
            shutil.rmtree(shard_dir, ignore_errors=True)
        return record
    finally:
        dist.shutdown()


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


def npz_digest(path: str | Path) -> str:
    """sha256 over the arrays (not the zip container, whose timestamps vary)."""
    h = hashlib.sha256()
    with np.load(path) as z:
        for key in ("arr_0", "arr_1"):
            h.update(key.encode())
            h.update(np.ascontiguousarray(z[key]).tobytes())
    return h.hexdigest()


def run(args) -> int:
    record = sample(args)
    if record:
        ips = record.get("images_per_s")
        speed = f"{ips:.3f} images/s" if ips else "all shards were already on disk"
        print(
            f"wrote {record['npz']}: {record['shape'][0]} images {tuple(record['shape'][1:])}, "
            f"{speed} on {record['world_size']} process(es)"
        )
        if record.get("warning"):
            print(f"note: {record['warning']}")
        print(f"record: {default_paths(Path(record['npz']))[1]}")
    return 0
