"""How long `train`, `sample` and `fid` will take, said before they start; long CPU work needs --yes.

A training step is the planner's time model (plan/speed.py) on the traced step: its kernels at the
device's rate. A CPU's rate is its matmul rate measured now (0.3 s, at this process's threads, so a
busy machine gets a longer estimate), with the efficiencies fitted on CPU cells (reports/plan_vs_cpu,
shipped as plan/speed_calibration_cpu.json); a GPU's is its datasheet with the shipped calibration.
The warm-up is not the estimate: DiT-XL/2's first CPU step takes minutes. Sampling and Inception
features are not traced steps: a DiT forward pass is a third of a traced step (forward and backward
are three forwards), a VAE decode and an Inception pass are their FLOPs at the calibrated matmul rate
(torch's FLOP counter on meta tensors; tests/unit/test_walltime.py counts them again).

On a CPU, work estimated over LONG_CPU_S is refused in a terminal without --yes, naming the estimate
and a cheaper way; elsewhere (CI, a log) it proceeds, the estimate printed first.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path

from ditbench.errors import UserError
from ditbench.progress import duration, is_terminal

LONG_CPU_S = 30 * 60
INCEPTION_FLOPS = 11.426e9  # one image, any size: it is resized to 299 x 299 first
VAE_DECODE_FLOPS_PER_PIXEL = 9.494e6  # sd-vae's decoder: 622.2 GFLOP for a 256 x 256 image
CPU_CALIBRATION = Path(__file__).with_name("plan") / "speed_calibration_cpu.json"


@functools.lru_cache(maxsize=4)
def _rate(device: str):
    """(datasheet, calibrated params, what it is) for `device`, or None (a GPU without a datasheet)."""
    from ditbench.plan import speed

    if device == "cpu":
        from ditbench.bench.mfu import measure_matmul_tflops

        peak = measure_matmul_tflops("cpu", "fp32", n=512, seconds=0.3)
        params = json.loads(CPU_CALIBRATION.read_text())["params"]
        return speed.cpu_datasheet(peak * 1000), params, f"this CPU's measured {peak * 1000:.0f} GFLOP/s"
    import torch

    from ditbench.cards import find_card

    try:
        card = find_card(torch.cuda.get_device_name(torch.device(device))).name
    except UserError:
        return None
    sheet = speed.datasheet(card)
    return (sheet, speed.shipped().params, f"the {card}'s datasheet") if sheet else None


def train_step_s(config: dict, device: str) -> float | None:
    """Seconds of one steady training step of `config` (Knobs fields) on `device`, or None."""
    from ditbench.plan import speed
    from ditbench.plan.emulation import CPU, cuda_target
    from ditbench.plan.predict import normalize, series_trace, trace_knobs

    rate = _rate(device)
    cell = normalize({**config, "device": "cpu" if device == "cpu" else "cuda"})
    if rate is None or not (cell["data"] == "synthetic" or "latents" in str(cell["data"])):
        return None  # no datasheet for this GPU; an image folder encodes through the VAE each step
    target = CPU if device == "cpu" else cuda_target(None)
    series = series_trace(trace_knobs(cell, target), target, disk=True)
    depth, ckpt = speed.blocks(cell["model"], cell["grad_ckpt"])
    t = speed.step_time(
        series.trace.kernels, cell["batch_size"], rate[0], cell["precision"], rate[1],
        compiled=bool(cell["compile"]), overlap=device != "cpu", blocks=depth, ckpt_blocks=ckpt,
    )  # fmt: skip
    return t.seconds * cell["grad_accum"]


def flops_s(flops: float, device: str, precision: str = "fp32") -> float | None:
    """Seconds for `flops` of convolutions and matmuls at the calibrated matmul rate, or None."""
    rate = _rate(device)
    if rate is None:
        return None
    sheet, params, _ = rate
    peak = sheet.fp16 if precision in ("fp16", "bf16") else sheet.tf32 if precision == "tf32" else sheet.fp32
    return flops / (params["matmul_eff"] * peak * 1e12)


def announce(command: str, seconds: float | None, what: str, device: str, yes: bool, cheaper: str) -> None:
    """Print the estimate first (stderr); refuse long CPU work in a terminal without --yes."""
    if seconds is None:
        print(f"ditbench {command}: no time estimate for {what} on {device}", file=sys.stderr, flush=True)
        return
    basis = _rate(device)[2]
    print(f"ditbench {command}: {what}: estimated {duration(seconds)} at {basis}", file=sys.stderr, flush=True)
    interactive = is_terminal(sys.stdin) and is_terminal() and not os.environ.get("CI")
    if device == "cpu" and seconds > LONG_CPU_S and not yes and interactive:
        raise UserError(
            f"{what} is estimated at {duration(seconds)} on this CPU, over the {LONG_CPU_S // 60} minutes "
            f"ditbench starts without asking. {cheaper} Add --yes to run it as it is."
        )
