"""`ditbench train`: train one DiT configuration for a number of steps and print the loss, a quick real
sanity check of a machine and a configuration.
"""

from __future__ import annotations

import argparse
import math
import time

from ditbench.records.metrics import IMAGES_PER_S

DEFAULT_MODEL = "DiT-S/8"  # a suite must name its model; a quick command-line check gets a small one
MAX_STEPS = 10**9  # beyond it a step count is a typo, and the run would never end


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ditbench.cli.options import add_device, add_json, add_no_progress, add_precision, add_yes
    from ditbench.spec.knobs import TRAIN_KNOBS, Knobs

    parser.add_argument("--steps", type=int, default=50, help="training steps")
    # One option per training knob, with the knob's default and help, its value read as in a suite file.
    for name in TRAIN_KNOBS:
        flag, field = "--" + name.replace("_", "-"), Knobs.model_fields[name]
        default = DEFAULT_MODEL if name == "model" else field.default
        if name == "precision":
            add_precision(parser, default, field.description)
        elif isinstance(default, bool):
            parser.add_argument(flag, action="store_true", help=field.description)
        else:  # --data takes what a command line can give (a suite's data: also takes a mapping)
            text = "synthetic, a .npz/.pt latent file, or an image folder" if name == "data" else None
            parser.add_argument(flag, default=default, help=text or field.description)
    parser.add_argument("--vae", help="VAE for an image folder: a local path, or 'random'")
    add_device(parser)
    parser.add_argument("--log-every", type=int, default=10, help="print the loss every N steps")
    parser.add_argument("--save", metavar="FILE.pt", help="write a checkpoint file here at the end")
    add_json(parser, "the run's summary (speed, loss, parameters)")
    add_no_progress(parser)
    add_yes(parser)


def train_step_s(config: dict, device: str) -> float | None:
    """Seconds of one steady training step of `config` (Knobs fields) on `device` (hardware/walltime.py's
    rate, the planner's time model on the traced step), or None (no datasheet; image-folder data)."""
    from ditbench.hardware.walltime import rate
    from ditbench.plan import speed
    from ditbench.plan.emulation import CPU, cuda_target
    from ditbench.plan.predict import normalize, series_trace, trace_knobs, traced_accum

    found = rate(device)
    cell = normalize({**config, "device": "cpu" if device == "cpu" else "cuda"})
    if found is None or isinstance(cell["data"], dict) and "images" in cell["data"]:
        return None
    peaks, params, _, card = found
    sheet = speed.cpu_datasheet(peaks["fp32"] * 1000) if device == "cpu" else speed.datasheet(card)
    target = CPU if device == "cpu" else cuda_target(card)
    series = series_trace(trace_knobs(cell, target), target, disk=True)
    depth, ckpt = speed.blocks(cell["model"], cell["grad_ckpt"])
    t = speed.step_time(
        series.trace.kernels, cell["batch_size"], sheet, cell["precision"], params,
        compiled=bool(cell["compile"]), overlap=device != "cpu", blocks=depth, ckpt_blocks=ckpt,
        accum=cell["grad_accum"], traced_accum=traced_accum(cell),
    )  # fmt: skip
    return t.seconds


def _announce(args: argparse.Namespace, cfg, device: str) -> None:
    """The estimate before the model is built (DiT-XL/2 takes a while to build on a CPU)."""
    from ditbench.hardware.walltime import LONG_CPU_S, announce

    step_s = train_step_s(cfg.model_dump(), device)
    cheaper = (
        f"Fewer steps (--steps {max(1, int(LONG_CPU_S / step_s)):,} takes about 30 min), a smaller model "
        "(--model DiT-S/8), or a GPU (`ditbench plan` predicts one)."
        if step_s
        else ""
    )
    what = f"{args.steps:,} steps of {cfg.model} at batch {cfg.batch_size}"
    announce("train", step_s and step_s * args.steps, what, device, args.yes, cheaper)


def run(args: argparse.Namespace) -> int:
    import json
    import sys

    import torch

    from ditbench.core.errors import UserError
    from ditbench.core.progress import progress
    from ditbench.hardware.device import resolve_device
    from ditbench.hardware.precision import uses_scaler
    from ditbench.spec.base import from_flags
    from ditbench.spec.knobs import TRAIN_KNOBS, Knobs
    from ditbench.train.data import data_spec
    from ditbench.train.step import Trainer

    if not 1 <= args.steps <= MAX_STEPS:
        raise UserError(f"--steps must be from 1 to {MAX_STEPS:,}, got {args.steps}")
    if args.log_every < 1:
        raise UserError(f"--log-every must be at least 1, got {args.log_every}")
    if args.save:
        from ditbench.files.outpaths import check_file_target, refuse_output_as_input

        refuse_output_as_input([("--save", args.save)], [("--data", args.data), ("--vae", args.vae)])
        check_file_target(args.save, "--save", writes=("a torch checkpoint", (".pt", ".pth")))
    device = str(resolve_device(args.device))
    knobs = {name: getattr(args, name) for name in TRAIN_KNOBS}
    cfg = from_flags(Knobs, {**knobs, "data": data_spec(args.data, args.vae)})
    _announce(args, cfg, device)
    trainer = Trainer(cfg, device=device)
    data_desc = trainer.data.describe()
    out = sys.stderr if args.json else sys.stdout  # with --json, stdout holds the JSON alone
    print(
        f"{cfg.model} ({trainer.num_params:,} parameters, impl {cfg.impl}) on {trainer.device}, "
        f"precision {cfg.precision}, grad_ckpt {cfg.grad_ckpt}, batch {cfg.batch_size}, "
        f"image {cfg.image_size} px, data {data_desc.get('kind')}"
        + (f", VAE {data_desc['vae']}" if "vae" in data_desc else ""),
        file=out,
        flush=True,
    )

    sync = torch.cuda.synchronize if trainer.device.type == "cuda" else (lambda: None)
    bar = progress(total=args.steps, unit="step", desc="training", disable=args.no_progress)
    window: list[torch.Tensor] = []
    means: list[float] = []  # the loss of each log interval
    sync()
    start = time.perf_counter()
    for i in range(1, args.steps + 1):
        loss = trainer.step(trainer.next_batch())
        window.append(loss)
        bar.update(1)
        if i % args.log_every == 0 or i == args.steps:
            mean = torch.stack(window).float().mean().item()  # one sync per log interval
            window.clear()
            means.append(mean)
            bar.set_postfix(loss=f"{mean:.4f}")
            bar.write(f"step {i:>6}  loss {mean:.4f}", file=out)
            if not math.isfinite(mean):
                bar.close()
                print(f"loss is not finite at step {i}; stopping", file=out)
                if args.json:
                    print(json.dumps({"status": "nan_loss", "step": i, "loss": None}))
                return 1
    sync()
    elapsed = time.perf_counter() - start
    bar.close()
    if args.save:
        trainer.save(args.save)
        print(f"checkpoint written to {args.save}", file=out)
    result = {
        "status": "ok",
        "config": {**cfg.train_knobs(), "device": str(trainer.device)},
        "params": trainer.num_params,
        "steps": args.steps,
        "elapsed_s": round(elapsed, 3),
        "steps_per_s": args.steps / elapsed,
        IMAGES_PER_S.key: args.steps * cfg.rank_batch / elapsed,
        "loss_first": means[0],
        "loss_last": means[-1],
        "scaler_skips": trainer.scaler_skips if uses_scaler(cfg.precision) else None,
        "checkpoint": args.save,
        "note": "speeds include the first steps' warm-up",
    }
    skips = result["scaler_skips"]
    print(
        f"done: {args.steps} steps in {elapsed:.1f} s, {result['steps_per_s']:.2f} steps/s, "
        f"{result[IMAGES_PER_S.key]:.1f} img/s (includes the first steps' warm-up); "
        f"loss {means[0]:.4f} -> {means[-1]:.4f}"
        + ("" if skips is None else f", {skips} {cfg.precision} steps skipped by the GradScaler"),
        file=out,
    )
    if args.json:
        print(json.dumps(result, indent=2, default=str))
    return 0
