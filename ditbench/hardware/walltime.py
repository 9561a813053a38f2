"""How long `train`, `sample`, `fid` and `run` will take, said first.

The rate is the planner's time model's (plan/speed.py): a CPU's matmul rate measured now (0.3 s: a busy
machine gets a longer estimate) with the CPU-fitted efficiencies, or a GPU's datasheet with the shipped
calibration. Over LONG_CPU_S on a CPU a terminal without --yes is refused; CI and logs proceed."""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from pathlib import Path

from ditbench.core.errors import UserError
from ditbench.core.progress import duration, is_terminal
from ditbench.hardware.precision import LOW_PRECISIONS, PRECISIONS

LONG_CPU_S = 30 * 60
INCEPTION_FLOPS = 11.426e9  # one image, any size: it is resized to 299 x 299 first
VAE_DECODE_FLOPS_PER_PIXEL = 9.494e6  # sd-vae's decoder: 622.2 GFLOP for a 256 x 256 image
CALIBRATIONS = Path(__file__).parent.parent / "plan"  # speed_calibration.json (GPU), ..._cpu.json


@functools.lru_cache(maxsize=4)
def rate(device: str) -> tuple[dict[str, float], dict[str, float], str, str | None] | None:
    """({fp32, tf32, fp16} peak TFLOP/s, calibrated time-model params, what they are, the card) of
    `device`; None for a GPU without a datasheet."""
    if device == "cpu":
        peak = measure_matmul_tflops("cpu", "fp32", n=512, seconds=0.3)
        peaks, card = dict.fromkeys(PRECISIONS, peak), None
        basis = f"this CPU's {peak * 1000:.0f} GFLOP/s"
    else:
        import torch

        from ditbench.hardware.cards import DATASHEETS, find_card
        from ditbench.hardware.environment import nvml_gpu

        try:
            # "cuda" (`run`'s parent, which must not hold a CUDA context): the first visible GPU, by NVML
            name = nvml_gpu()[0] if device == "cuda" else None
            card = find_card(name or torch.cuda.get_device_name(torch.device(device))).name
        except UserError:
            return None
        if card not in DATASHEETS:
            return None
        sheet, basis = DATASHEETS[card], f"the {card}'s datasheet"
        peaks = {"fp32": sheet.fp32, "tf32": sheet.tf32, "fp16": sheet.fp16}
    name = "speed_calibration.json" if card else "speed_calibration_cpu.json"
    return peaks, json.loads((CALIBRATIONS / name).read_text())["params"], basis, card


def flops_s(flops: float, device: str, precision: str = "fp32") -> float | None:
    """Seconds for `flops` of convolutions and matmuls at the calibrated matmul rate, or None."""
    found = rate(device)
    if found is None:
        return None
    peaks, params = found[0], found[1]
    peak = peaks["fp16"] if precision in LOW_PRECISIONS else peaks.get(precision, peaks["fp32"])
    return flops / (params["matmul_eff"] * peak * 1e12)


def announce(command: str, seconds: float | None, what: str, device: str, yes: bool, cheaper: str) -> None:
    """Print the estimate first (stderr); refuse long CPU work in a terminal without --yes."""
    if seconds is None:
        print(f"ditbench {command}: no time estimate for {what} on {device}", file=sys.stderr, flush=True)
        return
    basis = rate(device)[2]
    print(
        f"ditbench {command}: {what}: estimated {duration(seconds)} at {basis}", file=sys.stderr, flush=True
    )
    interactive = is_terminal(sys.stdin) and is_terminal() and not os.environ.get("CI")
    if device == "cpu" and seconds > LONG_CPU_S and not yes and interactive:
        raise UserError(
            f"{what} is estimated at {duration(seconds)} on this CPU, over the {LONG_CPU_S // 60} minutes "
            f"ditbench starts without asking. {cheaper} Add --yes to run it as it is."
        )


# The measured matmul rate (also `ditbench env --measure-peak`, and MFU's measured basis)

MATMUL_SIDE_CUDA = 8192  # large enough to saturate an H100/H200's tensor cores
MATMUL_SIDE_CPU = 1024
WARMUP_MATMULS = 3  # cuBLAS picks its kernel on the first calls
MATMULS_PER_SYNC = 5  # enough queued work that the host's synchronisation costs nothing


def measure_matmul_tflops(device: str, precision: str, n: int | None = None, seconds: float = 1.0) -> float:
    """Achieved TFLOP/s of a square matmul in `precision`: a ceiling that is honest on any card."""
    import torch

    from ditbench.hardware.precision import compute_dtype, tf32_mode

    dev = torch.device(device)
    n = n or (MATMUL_SIDE_CUDA if dev.type == "cuda" else MATMUL_SIDE_CPU)
    dtype = compute_dtype(precision)
    with tf32_mode(precision == "tf32"):
        a = torch.randn(n, n, device=dev, dtype=dtype)
        b = torch.randn(n, n, device=dev, dtype=dtype)
        sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
        for _ in range(WARMUP_MATMULS):
            a @ b
        sync()
        count, start, elapsed = 0, time.perf_counter(), 0.0
        while elapsed < seconds:
            for _ in range(MATMULS_PER_SYNC):
                a @ b
            count += MATMULS_PER_SYNC
            sync()
            elapsed = time.perf_counter() - start
        return 2 * n**3 * count / elapsed / 1e12
