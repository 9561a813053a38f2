"""Prepared GPU check for issue 6: sampling throughput and single-GPU DDP overhead (one H200, < 3 min).

    python benchmarks/gpu_dist_sample.py --out reports/gpu/dist_sample.json

1. Sampling: DiT-XL/2 at 256 px, random initial weights, 250 respaced DDPM steps, classifier-free
   guidance 1.5 (the doubled batch), decoded by a random-weight sd-vae-ft-ema AutoencoderKL, through
   the real `ditbench sample` code path (shards, npz, record). images/s per precision, after a
   short warm-up run of the same shapes. Random weights cost exactly what trained ones do.
2. DDP overhead at world size 1: the same training cell (DiT-XL/2 and DiT-B/4, bf16, batch 32)
   with the bare model and wrapped in DistributedDataParallel (NCCL, one rank), measured A/B/A/B
   with the runner's measured window. The difference is DDP's own cost (bucketing, the all-reduce
   kernels, hooks) with no communication to hide.

Without CUDA it stops with a message (exit 2). `--smoke` runs the same code with a tiny model on
any device, to check the script itself.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sampling(device: str, plan: list[tuple[str, int]], model: str, image_size: int, steps: int) -> list[dict]:
    from ditbench.cli import sample as cli
    from ditbench.sampling import sampler

    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for precision, n in plan:
            common = [
                "random",
                "--model",
                model,
                "--image-size",
                str(image_size),
                "--vae",
                "random",
                "--cfg-scale",
                "1.5",
                "--device",
                device,
                "--precision",
                precision,
                "--batch-size",
                str(n),
                "--no-progress",
            ]
            # Warm-up: the same shapes, a few steps (kernels chosen, allocator grown).
            sampler.sample(
                parser.parse_args(
                    [*common, "--num-samples", str(n), "--steps", "3", "--out", f"{tmp}/warm_{precision}.npz"]
                )
            )
            rec = sampler.sample(
                parser.parse_args(
                    [
                        *common,
                        "--num-samples",
                        str(n),
                        "--steps",
                        str(steps),
                        "--out",
                        f"{tmp}/{precision}.npz",
                    ]
                )
            )
            row = {
                "precision": precision,
                "images": n,
                "batch_size": n,
                "steps": steps,
                "cfg_scale": 1.5,
                "seconds": rec["sampling_seconds"],
                "images_per_s": rec["images_per_s"],
                "s_per_image": rec["sampling_seconds"] / n,
                "shape": rec["shape"],
            }
            print(
                f"sampling {model} {image_size}px {precision}: {row['images_per_s']:.3f} images/s "
                f"({n} images, {steps} steps, cfg 1.5)",
                flush=True,
            )
            rows.append(row)
    return rows


def ddp_overhead(
    device: str,
    models: list[str],
    image_size: int,
    batch: int,
    precision: str,
    warmup: int,
    measure: int,
    repeats: int,
) -> list[dict]:
    import torch

    from ditbench.bench.cell.window import measure_window
    from ditbench.hardware import dist
    from ditbench.spec.knobs import Knobs
    from ditbench.train.step import Trainer

    os.environ.update(
        {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_port()),
            "RANK": "0",
            "WORLD_SIZE": "1",
            "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "1",
        }
    )
    ctx = dist.init(device)
    dev = ctx.device.type
    rows = []
    try:
        for model in models:
            times: dict[str, list[float]] = {"plain": [], "ddp": []}
            for _ in range(repeats):
                for mode in ("plain", "ddp"):
                    cfg = Knobs(model=model, image_size=image_size, precision=precision, batch_size=batch)
                    wrap = (lambda m: dist.wrap_model(m, "ddp", ctx)) if mode == "ddp" else None
                    trainer = Trainer(cfg, device=str(ctx.device), wrap_model=wrap)
                    w = measure_window(trainer, trainer.step, dev, warmup, measure, 0.0)
                    times[mode].append(statistics.median(w["step_ms"]))
                    del trainer
                    if dev == "cuda":
                        torch.cuda.empty_cache()
            plain, ddp = statistics.median(times["plain"]), statistics.median(times["ddp"])
            row = {
                "model": model,
                "precision": precision,
                "batch_size": batch,
                "image_size": image_size,
                "step_ms_plain": plain,
                "step_ms_ddp": ddp,
                "images_per_s_plain": 1e3 * batch / plain,
                "images_per_s_ddp": 1e3 * batch / ddp,
                "ddp_overhead": ddp / plain - 1.0,
                "step_ms_runs": times,
                "backend": ctx.backend,
                "world_size": ctx.world_size,
            }
            print(
                f"DDP at world size 1, {model} {precision} bs={batch}: {plain:.2f} ms plain, "
                f"{ddp:.2f} ms DDP ({100 * row['ddp_overhead']:+.1f}%)",
                flush=True,
            )
            rows.append(row)
    finally:
        dist.shutdown()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default=str(REPO / "reports" / "gpu" / "dist_sample.json"))
    parser.add_argument("--smoke", action="store_true", help="tiny models on any device: checks this script")
    parser.add_argument("--skip-sampling", action="store_true")
    parser.add_argument("--skip-ddp", action="store_true")
    args = parser.parse_args(argv)

    import torch

    if not torch.cuda.is_available() and not args.smoke:
        print(
            "gpu_dist_sample: no CUDA device is visible; this check needs one GPU (run it on the GPU "
            "machine, or pass --smoke to exercise the script with a tiny model on the CPU)",
            file=sys.stderr,
        )
        return 2
    device = "cuda" if torch.cuda.is_available() else "cpu"
    from ditbench.hardware.environment import collect_env

    t0 = time.time()
    result = {
        "schema": "ditbench.gpu_dist_sample/1",
        "smoke": args.smoke,
        "env": collect_env(),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if args.smoke:
        model, size, steps, plan = "DiT-T/2", 32, 5, [("fp32", 4), ("bf16", 4)]
        train_models, train_size, batch, warmup, measure, repeats = ["DiT-T/4"], 64, 4, 2, 5, 1
    else:
        # ~118.6 TFLOP per image at 250 steps with CFG: fp32 ~2.5 s/img, tf32 ~0.5, bf16 ~0.25 on an H200.
        model, size, steps, plan = "DiT-XL/2", 256, 250, [("bf16", 32), ("tf32", 16), ("fp32", 4)]
        train_models, train_size, batch, warmup, measure, repeats = ["DiT-XL/2", "DiT-B/4"], 256, 32, 5, 20, 2
    if not args.skip_sampling:
        result["sampling"] = {
            "model": model,
            "image_size": size,
            "weights": "random init",
            "vae": "random",
            "sampler": "ddpm",
            "rows": sampling(device, plan, model, size, steps),
        }
    if not args.skip_ddp:
        result["ddp_overhead"] = ddp_overhead(
            device, train_models, train_size, batch, "bf16", warmup, measure, repeats
        )
    result["duration_s"] = time.time() - t0
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=1, default=str))
    os.replace(tmp, out)
    print(f"wrote {out} ({result['duration_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
