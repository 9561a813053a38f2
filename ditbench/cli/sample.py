"""`ditbench sample`: the command line of a sampling job (the work is `sampling.sampler.sample`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ditbench.records.metrics import IMAGES_PER_S
from ditbench.sampling.shards import default_paths


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ditbench.cli.options import add_device, add_json, add_no_progress, add_precision, add_yes

    parser.description = (
        "Sample class-conditional images from a DiT checkpoint into an ADM-format .npz (arr_0 uint8 NHWC "
        "images, arr_1 labels). Run it under torchrun to sample on several GPUs; rerun the same command "
        "to resume an interrupted run."
    )
    parser.add_argument(
        "checkpoint",
        help="a ditbench checkpoint, an official DiT checkpoint (e.g. DiT-XL-2-256x256.pt; EMA weights are "
        "used when present), or 'random' for random initial weights (speed measurement only)",
    )
    parser.add_argument("--out", default="samples.npz", metavar="FILE.npz", help="the sample file to write")
    parser.add_argument(
        "--vae",
        required=True,
        help="local folder (or file) of the sd-vae-ft-ema/mse AutoencoderKL weights, or 'random' for random "
        "weights (speed measurement only)",
    )
    parser.add_argument(
        "--model",
        help="DiT configuration, e.g. DiT-XL/2 (default: from the checkpoint when it records it, else "
        "DiT-XL/2)",
    )
    parser.add_argument(
        "--image-size",
        type=int,
        help="image side in pixels (default: from the checkpoint when it records it, else 256)",
    )
    parser.add_argument("--num-classes", type=int, help="(default: from the checkpoint, else 1000)")
    parser.add_argument(
        "--num-samples", type=int, default=50_000, help="(default: %(default)s, the FID protocol)"
    )
    from ditbench.spec.quality import SAMPLERS, Sampler

    default = Sampler()  # the quality section's sampler: the same defaults and bounds
    parser.add_argument("--steps", type=int, default=default.steps, help="sampling steps, respaced from 1000")
    parser.add_argument("--sampler", choices=SAMPLERS, default=default.name, help="(default: %(default)s)")
    parser.add_argument(
        "--cfg-scale", type=float, default=default.cfg_scale, help="classifier-free guidance scale; 1 = off"
    )
    parser.add_argument(
        "--guidance-channels",
        type=int,
        help="guide only the first K latent channels; 3 reproduces the official DiT sampler exactly "
        "(default: all)",
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=32,
        help="samples per shard and per forward pass on each rank (the doubled CFG batch is twice this)",
    )
    parser.add_argument("--seed", type=int, default=0, help="(default: %(default)s)")
    add_device(parser)
    add_precision(
        parser, "fp32", "fp32 is the reference; tf32/bf16/fp16 are faster and change the images slightly"
    )
    parser.add_argument("--keep-shards", action="store_true", help="keep the shard folder after merging")
    parser.add_argument(
        "--overwrite", action="store_true", help="replace an existing --out made with other settings"
    )
    add_json(parser, "the sampling record")
    add_no_progress(parser)
    add_yes(parser)


def run(args) -> int:
    from ditbench.sampling.sampler import sample

    args._resume = "the shards written so far are kept; the same command makes only the missing ones"
    record = sample(args)
    if record and args.json:
        import json

        print(json.dumps(record, indent=2, default=str))
    elif record:
        ips = record.get(IMAGES_PER_S.key)
        speed = f"{ips:.3f} images/s" if ips else "all shards were already on disk"
        print(
            f"wrote {record['npz']}: {record['shape'][0]} images {tuple(record['shape'][1:])}, "
            f"{speed} on {record['world_size']} process(es)"
        )
        if record.get("warning"):
            print(f"note: {record['warning']}")
        print(f"record: {default_paths(Path(record['npz']))[1]}")
    return 0
