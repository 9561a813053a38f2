"""What a traced step borrows from the target device: CUDA behaviour on the fake CPU device.

The trace runs the real Trainer on fake CPU tensors (trace.py says why). Where a CUDA step differs
from a CPU step, this module supplies the CUDA behaviour, each piece stated:

* precision: the CUDA policy (autocast to fp16/bf16, a GradScaler for fp16; tf32 allocates exactly
  like fp32, it only changes the matmul math mode), applied to the fake device. bf16 needs sm80+.
* optimizer: `optimizer_impl: auto` is fused AdamW on CUDA (no temporaries), foreach on a CPU (one
  temporary per parameter tensor), as the Trainer picks.
* cuBLAS: each thread that runs a matmul gets a handle with its own workspace from the caching
  allocator: 32 MiB on sm90/sm100/sm120, 8 MiB + 128 KiB elsewhere (PyTorch's defaults), one for
  the caller's thread and one for autograd's device thread.
* attention: the backward kernels' float32 scratch (trace.py); forward outputs and saved tensors
  are the same for CPU and CUDA kernels.
* `Module.to(device)` on a module already on that device is a no-op (FakeTensorMode cannot swap
  parameters, and a real `.to()` to the same device copies nothing), and `copy.deepcopy` of a fake
  tensor clones it in the trace's fake mode (torch's own deepcopy of a fake tensor makes it in a
  new fake mode, whose tensors the trace could not follow), as a real deepcopy clones the storage.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from unittest import mock

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor
from torch.overrides import TorchFunctionMode

MiB = 1 << 20

# Compute capability per card of ditbench.cards (decides bf16, flash attention, cuBLAS workspace).
CARD_ARCH: dict[str, tuple[int, int]] = {
    "RTX 3060 12GB": (8, 6),
    "RTX 4070 12GB": (8, 9),
    "T4": (7, 5),
    "RTX 4080 16GB": (8, 9),
    "V100 16GB": (7, 0),
    "RTX 3090": (8, 6),
    "RTX 4090": (8, 9),
    "L4": (8, 9),
    "A10": (8, 6),
    "A100-40GB": (8, 0),
    "RTX A6000": (8, 6),
    "L40S": (8, 9),
    "A100-80GB": (8, 0),
    "H100": (9, 0),
    "H100 NVL": (9, 0),
    "H200": (9, 0),
}
# A bare memory size (--memory-gib) plans for an Ampere-class GPU: bf16 and flash attention work.
GENERIC_ARCH = (8, 0)


@dataclass(frozen=True)
class Target:
    """The device a trace predicts: "cuda" (with its compute capability) or "cpu"."""

    device: str
    sm: tuple[int, int] | None = None

    @property
    def cublas_workspace_bytes(self) -> int:
        if self.sm is not None and self.sm[0] in (9, 10, 12):
            return 32 * MiB
        return 8 * MiB + 128 * 1024

    @property
    def bf16(self) -> bool:
        return self.device == "cpu" or (self.sm is not None and self.sm >= (8, 0))


CPU = Target("cpu")


def cuda_target(card_name: str | None) -> Target:
    return Target("cuda", CARD_ARCH.get(card_name, GENERIC_ARCH) if card_name else GENERIC_ARCH)


def optimizer_impl(requested: str, target: Target) -> str:
    """The AdamW implementation the Trainer runs on the target for the requested `optimizer_impl`."""
    if requested == "auto":
        return "fused" if target.device == "cuda" else "foreach"
    return requested


def policy_for(precision: str, target: Target):
    """The Trainer's precision policy on the target, made to run on the fake CPU device.

    The policy comes from ditbench.train.precision itself (asked for "cuda", with bf16 support as
    the target has it), so a change there changes the trace; only its device type is the fake one.
    """
    from ditbench.train import precision as precision_module

    if target.device == "cpu":
        return precision_module.get_precision_policy(precision, "cpu")
    with mock.patch.object(torch.cuda, "is_bf16_supported", lambda *a, **k: target.bf16):
        policy = precision_module.get_precision_policy(precision, "cuda")
    return dataclasses.replace(policy, device_type="cpu")


@contextlib.contextmanager
def emulate(target: Target):
    """Patch, for the duration of a trace, what the fake CPU step must do as the target would."""
    original_to = nn.Module.to

    def to(self, *args, **kwargs):
        dev = args[0] if args else kwargs.get("device")
        if (
            len(args) + len(kwargs) == 1
            and isinstance(dev, (str, torch.device))
            and all(t.device == torch.device(dev) for t in (*self.parameters(), *self.buffers()))
        ):
            return self
        return original_to(self, *args, **kwargs)

    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(nn.Module, "to", to))
        if target.device == "cuda":
            import ditbench.train.step as step_module

            stack.enter_context(
                mock.patch.object(
                    step_module, "get_precision_policy", lambda name, device=None: policy_for(name, target)
                )
            )
        yield


class FakeDeepcopy(TorchFunctionMode):
    """`copy.deepcopy` of a fake tensor (the EMA's copy of the model): a clone in the same fake mode."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.Tensor.__deepcopy__ and isinstance(args[0], FakeTensor):
            tensor, memo = args
            if id(tensor) not in memo:
                with torch.no_grad():
                    new = tensor.clone(memory_format=torch.preserve_format)
                if isinstance(tensor, nn.Parameter):
                    new = nn.Parameter(new, requires_grad=tensor.requires_grad)
                memo[id(tensor)] = new
            return memo[id(tensor)]
        return func(*args, **(kwargs or {}))
