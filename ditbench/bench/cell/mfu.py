"""Model FLOPs per image and the peak table behind MFU (the measured matmul ceiling: hardware/walltime.py).

Model FLOPs: one forward + backward of the plain model (no recomputation, no optimizer), counted on the
meta device. A GPU missing from the datasheet table (and any CPU) gets no MFU, never a guess.
"""

from __future__ import annotations

import functools
import re
from typing import Any

# Dense (no sparsity) datasheet peaks in TFLOP/s for the precision a cell trains in.
# "fp32" is true fp32 (tf32 off); "tf32" is fp32 storage with TF32 tensor-core matmuls.
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "NVIDIA H200": {"fp32": 67.0, "tf32": 495.0, "bf16": 989.0, "fp16": 989.0},
    "NVIDIA H100 SXM": {"fp32": 67.0, "tf32": 495.0, "bf16": 989.0, "fp16": 989.0},
    "NVIDIA A100": {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0},
}
PEAK_SOURCES = {
    "NVIDIA H200": "NVIDIA H200 datasheet (SXM), dense tensor-core peak",
    "NVIDIA H100 SXM": "NVIDIA H100 datasheet (SXM5), dense tensor-core peak",
    "NVIDIA A100": "NVIDIA A100 datasheet (SXM4 and PCIe share these), dense tensor-core peak",
}


def gpu_table_key(gpu_name: str | None) -> str | None:
    """Map a `torch.cuda.get_device_name()` string to a table row, or None when unsure. Variants with
    other clocks (H100 PCIe / NVL, H200 NVL, H20, H800) are not matched: a wrong peak is worse than none.
    """
    if not gpu_name:
        return None
    name = gpu_name.upper()
    if "A100" in name:  # SXM4 and PCIe, 40 and 80 GB: one set of peaks
        return "NVIDIA A100"
    if re.search(r"\bNVL\b|PCIE|\bH20\b|H800", name):
        return None
    if "H200" in name:
        return "NVIDIA H200"
    if "H100" in name and ("SXM" in name or "HBM3" in name):
        return "NVIDIA H100 SXM"
    return None


def peak_entry(gpu_name: str | None, precision: str) -> dict[str, Any] | None:
    """{peak_tflops, peak_basis} for MFU, or None when the device is not in the table."""
    key = gpu_table_key(gpu_name)
    if key is None or precision not in PEAK_TFLOPS[key]:
        return None
    return {
        "peak_tflops": PEAK_TFLOPS[key][precision],
        "peak_basis": f"datasheet dense {precision} peak of {key} ({PEAK_SOURCES[key]})",
    }


def mfu(tflops_per_s_per_gpu: float | None, gpu_name: str | None, precision: str) -> dict[str, Any] | None:
    entry = peak_entry(gpu_name, precision)
    if entry is None or tflops_per_s_per_gpu is None:
        return None
    return {"value": tflops_per_s_per_gpu / entry["peak_tflops"], **entry}


# -- FLOPs --


@functools.lru_cache(maxsize=64)
def count_train_flops_per_image(
    model: str, image_size: int, impl: str = "ditbench", num_classes: int = 1000
) -> int:
    """FLOPs of one training forward+backward for one image, counted with FlopCounterMode on meta."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from ditbench.models import vae
    from ditbench.models.build import build_model
    from ditbench.models.diffusion import NUM_TIMESTEPS

    batch = 2  # any batch works (every op is per-sample); 2 guards against batch-1 special cases
    with torch.device("meta"):
        net = build_model(model, image_size=image_size, num_classes=num_classes, grad_ckpt="none", impl=impl)
        net.train()
        latent = image_size // vae.DOWNSAMPLE
        x = torch.randn(batch, net.in_channels, latent, latent)
        t = torch.randint(0, NUM_TIMESTEPS, (batch,))
        y = torch.randint(0, num_classes, (batch,))
    with FlopCounterMode(display=False) as counter:
        out = net(x, t, y)
        out.float().pow(2).mean().backward()
    total = counter.get_total_flops()
    if total % batch:
        raise RuntimeError(f"FLOP count {total} of a batch of {batch} is not a multiple of the batch")
    return total // batch


def model_flops_per_image(
    model: str, image_size: int, impl: str = "ditbench", num_classes: int = 1000
) -> int | None:
    """Counted FLOPs; the paper's closed form if the meta-device count fails for an implementation."""
    try:
        return count_train_flops_per_image(model, image_size, impl, num_classes)
    except Exception:  # noqa: BLE001 - a missing FLOP count must not fail the cell
        if impl != "ditbench":
            return None
        from ditbench.models.flops import train_flops_per_image

        return train_flops_per_image(model, image_size)
