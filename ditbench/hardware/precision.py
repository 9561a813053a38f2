"""Precision: the four names a knob takes, what each does to a step, and the one switch for TF32.

fp32: TF32 off; tf32: TF32 tensor-core math (official train.py's); fp16: autocast + a GradScaler; bf16:
autocast, no scaler. Weights, gradients, optimizer state and EMA stay fp32 in every policy; under
fp16/bf16 the matmuls left outside autocast use TF32 on CUDA, as the official scripts do.

TF32 is switched only by `set_tf32` / `tf32_mode`. torch >= 2.9 has two APIs (per-op `fp32_precision`,
the legacy `allow_tf32` flags); set one alone and every legacy getter raises ("mix of the legacy and new
APIs"), so `set_tf32` writes the legacy flags first and then the new API.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ditbench.core.errors import UnsupportedError, UserError, shorten

if TYPE_CHECKING:
    import torch

# torch is imported where it is used (`ditbench --help` reads these names). The one place these names
# are written as a list (tests/unit/test_structure.py checks it).
PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
_LOW = {"fp16": "float16", "bf16": "bfloat16"}  # the autocast dtypes; fp32 and tf32 compute in float32
LOW_PRECISIONS = tuple(_LOW)  # 16-bit autocast: fp16 (loss-scaled), bf16
BY_SPEED = ("bf16", "fp16", "tf32", "fp32")  # fastest first where the tensor cores run them all
BF16_CAPABILITY = (8, 0)  # the compute capability from which CUDA runs bf16 (and TF32): Ampere


def check_precision(name: Any, where: str = "precision") -> str:
    if not isinstance(name, str) or name not in PRECISIONS:
        raise UserError(f"{where} {shorten(name)} is not known; valid precisions are {', '.join(PRECISIONS)}")
    return name


def uses_scaler(name: str) -> bool:
    """Whether a step in this precision runs under a GradScaler (fp16: its range needs loss scaling)."""
    return name == "fp16"


def supported_on(device_type: str) -> tuple[str, ...]:
    return tuple(p for p in PRECISIONS if unsupported_reason(p, device_type) is None)


def compute_dtype(name: str) -> torch.dtype:
    import torch

    return getattr(torch, _LOW.get(check_precision(name), "float32"))


def _new_api_targets() -> dict[str, Any]:
    """What the per-op `fp32_precision` API (torch >= 2.9) sets; {} before it."""
    import torch

    cudnn = torch.backends.cudnn
    if not hasattr(torch.backends.cuda.matmul, "fp32_precision"):
        return {}
    return {"matmul": torch.backends.cuda.matmul, "conv": cudnn.conv, "rnn": cudnn.rnn}


def set_tf32(enabled: bool) -> None:
    """Allow (True) or forbid (False) TF32 for CUDA matmuls and cuDNN, through both APIs."""
    _apply(dict.fromkeys(("matmul", "conv", "rnn"), "tf32" if enabled else "ieee"))


def _snapshot() -> dict[str, Any]:
    """The settings to restore, read through the new API where it exists (it never refuses a read)."""
    import torch

    if targets := _new_api_targets():
        return {n: t.fp32_precision for n, t in targets.items()}
    return {"matmul": torch.backends.cuda.matmul.allow_tf32, "conv": torch.backends.cudnn.allow_tf32}


def _apply(modes: dict[str, Any]) -> None:
    """`modes` (a _snapshot, or "tf32"/"ieee" a target) set: the legacy flags first, then the new API."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = modes["matmul"] in (True, "tf32")  # also sets its fp32_precision
    torch.backends.cudnn.allow_tf32 = modes["conv"] in (True, "tf32")
    for name, target in _new_api_targets().items():
        target.fp32_precision = modes[name]


@contextlib.contextmanager
def tf32_mode(enabled: bool, cudnn_benchmark: bool | None = None) -> Iterator[None]:
    """TF32 on or off (and optionally cuDNN's algorithm search) for a block, restored afterwards."""
    import torch

    saved, benchmark = _snapshot(), torch.backends.cudnn.benchmark
    set_tf32(enabled)
    if cudnn_benchmark is not None:
        torch.backends.cudnn.benchmark = cudnn_benchmark
    try:
        yield
    finally:
        _apply(saved)
        torch.backends.cudnn.benchmark = benchmark


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
        import torch

        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.autocast_dtype)

    def make_scaler(self):
        import torch

        return torch.amp.GradScaler(self.device_type) if self.use_scaler else None


def unsupported_reason(name: str, device_type: str) -> str | None:
    """Why `name` cannot run on `device_type` ("cpu"/"cuda"), decided without touching the device."""
    if device_type == "cpu" and name == "tf32":
        return "tf32 is a tensor-core mode of CUDA devices; on a CPU use fp32 or bf16"
    if device_type == "cpu" and name == "fp16":
        return "fp16 needs a CUDA device (CPU autocast has no loss-scaled fp16); use bf16 on CPU"
    return None


def get_precision_policy(
    name: str, device: str | torch.device = "cpu", bf16_supported: bool | None = None
) -> PrecisionPolicy:
    """The policy for `name` on `device`; UnsupportedError where the device cannot run it.
    `bf16_supported`: the answer for a CUDA device that is not this machine's (the planner's target)."""
    import torch

    key = check_precision(name)
    device_type = torch.device(device).type
    if device_type not in ("cpu", "cuda"):
        raise UnsupportedError(f"device type {device_type!r} is not supported; use cpu or cuda")
    if reason := unsupported_reason(key, device_type):
        raise UnsupportedError(reason)
    if bf16_supported is None and device_type == "cuda":
        bf16_supported = torch.cuda.is_bf16_supported()
    if key == "bf16" and device_type == "cuda" and not bf16_supported:
        raise UnsupportedError(
            "bf16 needs a GPU with bfloat16 support (compute capability 8.0+); use fp16 or fp32"
        )
    return PrecisionPolicy(
        name=key,
        device_type=device_type,
        autocast_dtype=compute_dtype(key) if key in _LOW else None,
        tf32=key != "fp32",
        use_scaler=uses_scaler(key),
    )
