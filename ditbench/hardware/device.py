"""The one place that turns `auto`, `cuda`, `cuda:N`, `cpu` into a device: `device_type` without creating
a CUDA context (the runner's parent holds no device memory), `resolve_device` the torch.device to use."""

from __future__ import annotations

import re

from ditbench.core.errors import UnsupportedError, UserError, shorten

DEVICE_CHOICES = ("cuda", "cpu", "auto")  # what a suite's `device` takes; the CLI also takes cuda:N


def cuda_visible() -> bool:
    import torch

    return torch.cuda.is_available()


def device_type(requested: str, cuda: bool | None = None) -> str:
    """'cuda' or 'cpu' for a requested device, `auto` meaning cuda where one is visible."""
    text = str(requested).strip().lower()
    if text == "auto":
        return "cuda" if (cuda_visible() if cuda is None else cuda) else "cpu"
    if text == "cpu":
        return "cpu"
    if re.fullmatch(r"cuda(:\d{1,4})?", text):
        return "cuda"
    raise UserError(f"device {shorten(requested)} is not valid; use auto, cpu, cuda or cuda:N")


def resolve_device(requested: str = "auto", local_rank: int = 0):
    """The torch.device to use (`cuda`: its LOCAL_RANK's GPU under torchrun); UnsupportedError where that
    GPU is not visible, so the cell is `unsupported`, not an error."""
    import torch

    kind = device_type(requested)
    if kind == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise UnsupportedError(f"device {shorten(requested)} needs CUDA, but no CUDA device is visible")
    count = torch.cuda.device_count()
    text = str(requested).strip().lower()
    if text in ("auto", "cuda"):
        return torch.device("cuda", local_rank % count)
    index = int(text.split(":", 1)[1])
    if not 0 <= index < count:
        raise UnsupportedError(f"device {shorten(requested)}: only {count} CUDA device(s) are visible")
    return torch.device("cuda", index)
