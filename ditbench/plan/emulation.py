"""What a traced step borrows from the target device: CUDA behaviour on the fake CPU device (trace.py).

The precision policy, the `auto` AdamW kernel, cuBLAS workspaces (PyTorch's defaults), CUDA autocast's
float32 ops, a deepcopy that stays in the trace's fake mode (torch's makes a new one), and torch.compile
as AOTAutograd graphs run unfused (a compiled cell errs high by what one fused group holds). Dynamo does
not compile under a dispatch mode: a call steps the recorder off the mode stack, the graphs put it back.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading
import warnings
from dataclasses import dataclass

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import _get_current_dispatch_mode, _pop_mode_temporarily

from ditbench.hardware.cards import CARDS
from ditbench.hardware.precision import BF16_CAPABILITY

MiB = 1 << 20

CARD_ARCH = {c.name: c.arch for c in CARDS}  # decides bf16, flash attention, the cuBLAS workspace
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
    def family(self) -> tuple:
        """What sizes the GPU-dependent allocations of a trace: GPUs of one family replay alike."""
        return (self.device, self.cublas_workspace_bytes, self.sm is not None and self.sm >= (8, 0))

    @property
    def bf16(self) -> bool:
        return self.device == "cpu" or (self.sm is not None and self.sm >= BF16_CAPABILITY)


CPU = Target("cpu")


def cuda_target(card_name: str | None) -> Target:
    return Target("cuda", CARD_ARCH.get(card_name, GENERIC_ARCH) if card_name else GENERIC_ARCH)


def traced_on(target: Target) -> Target:
    """What a series for `target` is traced on: the CPU, or a GPU that runs every policy (bf16 too), so
    one trace serves every GPU."""
    return CPU if target.device == "cpu" else cuda_target(None)


def optimizer_impl(requested: str, target: Target) -> str:
    """The AdamW implementation the Trainer runs on the target for the requested `optimizer_impl`."""
    if requested == "auto":
        from ditbench.train.optim import AUTO_IMPL

        return AUTO_IMPL[target.device]
    return requested


def policy_for(precision: str, target: Target):
    """The Trainer's precision policy on the target (hardware/precision.py's own, asked for "cuda" with the
    target's bf16 support), its device type made the fake CPU device."""
    from ditbench.hardware.precision import get_precision_policy

    if target.device == "cpu":
        return get_precision_policy(precision, "cpu")
    policy = get_precision_policy(precision, "cuda", bf16_supported=target.bf16)
    return dataclasses.replace(policy, device_type="cpu")


# CUDA autocast's float32 ops (c10's autocast_mode.cpp, "fp32") that CPU autocast leaves alone:
# low-precision inputs are cast up. The "set_opt_dtype" ones instead compute in (and return) float32.
_FP32_OPS = (
    "layer_norm native_layer_norm group_norm native_group_norm exp expm1 log log2 log10 log1p "
    "pow.Tensor_Scalar pow.Tensor_Tensor rsqrt reciprocal acos asin cosh sinh tan erfinv softplus"
).split()
_FP32_DTYPE_OPS = "softmax.int log_softmax.int sum sum.dim_IntList cumsum cumprod prod prod.dim_int".split()
LOW_DTYPES = (torch.float16, torch.bfloat16)
_AUTOCAST_CPU = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)


def _fp32_kernel(op):
    def kernel(*args, **kwargs):
        with torch._C._ExcludeDispatchKeyGuard(_AUTOCAST_CPU):
            args = [a.float() if isinstance(a, torch.Tensor) and a.dtype in LOW_DTYPES else a for a in args]
            return op(*args, **kwargs)

    return kernel


def _fp32_dtype_kernel(op):
    names = [a.name for a in op._schema.arguments]
    at = names.index("dtype")

    def kernel(*args, **kwargs):
        with torch._C._ExcludeDispatchKeyGuard(_AUTOCAST_CPU):
            given = args[at] if len(args) > at else kwargs.get("dtype")
            if given is None and args[0].dtype in LOW_DTYPES:
                if len(args) > at:
                    args = (*args[:at], torch.float32, *args[at + 1 :])
                else:
                    kwargs = {**kwargs, "dtype": torch.float32}
            return op(*args, **kwargs)

    return kernel


@contextlib.contextmanager
def cuda_autocast():
    """CPU autocast with CUDA's rule for the ops CUDA autocast runs in float32 (see the module doc)."""
    lib = torch.library.Library("aten", "IMPL")
    try:
        with warnings.catch_warnings():
            # Replacing CPU autocast's own kernel for an op is the point; torch's warning about it (from
            # C++, once per process) says nothing a plan's user can act on.
            warnings.filterwarnings("ignore", message=r"(?s).*Overriding a previously registered kernel")
            for name in _FP32_OPS + _FP32_DTYPE_OPS:
                packet, _, overload = name.partition(".")
                op = getattr(getattr(torch.ops.aten, packet), overload or "default")
                make = _fp32_dtype_kernel if name in _FP32_DTYPE_OPS else _fp32_kernel
                lib.impl(name, make(op), "AutocastCPU")
        yield
    finally:
        lib._destroy()


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


_state = threading.local()


def _recorded(fn):
    """A compiled graph that runs under the recorder the compiled model's call stepped off the stack."""

    def run(args):
        recorder = getattr(_state, "recorder", None)
        if recorder is None or _get_current_dispatch_mode() is recorder:
            return fn(args)
        with recorder:
            return fn(args)

    run._boxed_call = True
    return run


def _backend():
    from functorch.compile import make_boxed_func, min_cut_rematerialization_partition
    from torch._dynamo.backends.common import aot_autograd
    from torch._inductor.decomposition import select_decomp_table

    def run_as_is(gm, _example_inputs):
        return _recorded(make_boxed_func(gm.forward))

    return aot_autograd(
        fw_compiler=run_as_is,
        bw_compiler=run_as_is,
        partition_fn=functools.partial(min_cut_rematerialization_partition, compiler="inductor"),
        decompositions=select_decomp_table(),
    )


@contextlib.contextmanager
def traced_compiler():
    """A function in torch.compile's place (the Trainer's `compiler`) whose compiled models run as graphs
    the trace can follow (inductor's options do not apply); dynamo's caches are reset around it."""
    backend = _backend()

    def compile_(model, **_options):
        compiled = torch.compile(model, backend=backend, dynamic=False)
        inner = compiled.forward

        def forward(*args, **kw):
            if _get_current_dispatch_mode() is None:
                return inner(*args, **kw)
            with _pop_mode_temporarily() as recorder:
                _state.recorder = recorder
                try:
                    return inner(*args, **kw)
                finally:
                    _state.recorder = None

        compiled.forward = forward
        return compiled

    torch._dynamo.reset()
    try:
        yield compile_
    finally:
        torch._dynamo.reset()
