"""Precision policies: how a training step's matmuls run.

fp32  true fp32: TF32 off for matmul and cuDNN (what "fp32" means in the anchors table)
tf32  fp32 storage, TF32 tensor-core matmuls and convolutions (the official train.py default)
fp16  autocast to float16 + a GradScaler; steps the scaler skips are counted
bf16  autocast to bfloat16, no scaler (same exponent range as fp32)

Under fp16/bf16 the few fp32 matmuls left outside autocast use TF32 on CUDA, as the official
scripts do. The weights, gradients, optimizer state and EMA stay fp32 in every policy.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from ditbench.errors import UnsupportedError, UserError

PRECISIONS = ("fp32", "tf32", "fp16", "bf16")


def set_tf32(enabled: bool) -> None:
    """Switch TF32 for CUDA matmuls and cuDNN convolutions."""
    mode = "tf32" if enabled else "ieee"
    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):  # torch >= 2.9 API; the legacy flags are deprecated there
        matmul.fp32_precision = mode
        torch.backends.cudnn.conv.fp32_precision = mode
        torch.backends.cudnn.rnn.fp32_precision = mode
    else:  # pragma: no cover - older torch
        matmul.allow_tf32 = enabled
        torch.backends.cudnn.allow_tf32 = enabled


@dataclass(frozen=True)
class PrecisionPolicy:
    name: str
    device_type: str  # "cpu" or "cuda"
    autocast_dtype: torch.dtype | None
    tf32: bool
    use_scaler: bool

    def apply_backend_flags(self) -> None:
        if self.device_type == "cuda":
            set_tf32(self.tf32)

    def autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.autocast_dtype)

    def make_scaler(self):
        if not self.use_scaler:
            return None
        return torch.amp.GradScaler(self.device_type)


def get_precision_policy(name: str, device: str | torch.device = "cpu") -> PrecisionPolicy:
    """The policy for `name` on `device`; UnsupportedError where the device cannot run it."""
    key = str(name).strip().lower()
    if key not in PRECISIONS:
        raise UserError(f"precision {name!r} is not known; valid precisions are {', '.join(PRECISIONS)}")
    device_type = torch.device(device).type
    if device_type not in ("cpu", "cuda"):
        raise UnsupportedError(f"device type {device_type!r} is not supported; use cpu or cuda")
    if device_type == "cpu":
        if key == "tf32":
            raise UnsupportedError("tf32 is a CUDA matmul mode; on CPU use fp32 or bf16")
        if key == "fp16":
            raise UnsupportedError(
                "fp16 training needs CUDA: CPU autocast to float16 is slow and its GradScaler path is not "
                "what a GPU run measures; on CPU use fp32 or bf16"
            )
    if key == "bf16" and device_type == "cuda" and not torch.cuda.is_bf16_supported():
        raise UnsupportedError(
            "bf16 needs a GPU with bfloat16 support (compute capability 8.0+); use fp16 or fp32"
        )
    return PrecisionPolicy(
        name=key,
        device_type=device_type,
        autocast_dtype={"fp16": torch.float16, "bf16": torch.bfloat16}.get(key),
        tf32=key != "fp32",
        use_scaler=key == "fp16",
    )
