"""What each traced operation costs, for the time model (speed.py): one row per kernel launched.

A row: the category, the dtype its math runs in (the first floating-point input's), its FLOPs (matmuls
and attention only: elementwise work is memory bound), the bytes it moves, and whether it runs in the
backward. FLOPs and bytes split into a batch-independent and a per-sample part as allocations do.
"""

from __future__ import annotations

import torch
from torch.utils import flop_counter

CUBLAS = "mm addmm bmm baddbmm addbmm mv addmv dot _addmm_activation".split()  # the matmuls cuBLAS runs
_MATMUL = frozenset(CUBLAS + ["convolution", "_convolution", "convolution_backward"])
# Ops that only describe memory (no kernel), in addition to every view op.
_NO_KERNEL = frozenset(
    "empty empty_strided empty_like new_empty new_empty_strided _local_scalar_dense detach lift_fresh "
    "set_ resize_ alias _unsafe_view".split()
)
_DTYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64"}


def _name(func) -> str:
    return func._schema.name.split("::", 1)[-1]


def category(name: str) -> str:
    if name in _MATMUL:
        return "matmul"
    if "scaled_dot_product" in name or "flash_attention" in name or "efficient_attention" in name:
        return "attention"
    if name.startswith(("_foreach_", "_fused_adam", "_amp_foreach", "_amp_update_scale")):
        return "optimizer"
    return "elementwise"


def tensors(x):
    """The tensors of an argument or an output, nested tuples and lists flattened, in order."""
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (tuple, list)):
        for item in x:
            yield from tensors(item)


def _flops(name: str, func, args, kwargs, out) -> int:
    if name.startswith("_scaled_dot_product_flash_attention_for_cpu"):
        # The CPU kernel the fake device runs in place of CUDA's flash/efficient kernels: same math.
        if name.endswith("_backward"):
            grad_out, q, k, v = args[:4]
            return flop_counter.sdpa_backward_flop_count(grad_out.shape, q.shape, k.shape, v.shape)
        q, k, v = args[:3]
        return flop_counter.sdpa_flop_count(q.shape, k.shape, v.shape)
    count = flop_counter.flop_registry.get(func.overloadpacket)
    if count is None:
        return 0
    return int(count(*args, **kwargs, out_val=out))


def _split(value: int, batch: int) -> tuple[int, int]:
    """(batch-independent, per-sample) parts of a quantity measured at the (prime) batch `batch`."""
    if batch > 1 and value and value % batch == 0:
        return 0, value // batch
    return value, 0


def op_row(func, args, kwargs, out, batch: int, backward: bool) -> tuple | None:
    """(category, dtype, backward, flops/bytes const and per sample), or None when no kernel launches."""
    name = _name(func)
    if func.is_view or name in _NO_KERNEL:
        return None
    inputs = list(tensors(list(args) + list(kwargs.values())))
    outputs = list(tensors(out))
    if not outputs and func._schema.is_mutable:  # in-place foreach ops return nothing: they write back
        outputs = [
            t
            for arg, value in zip(func._schema.arguments, args, strict=False)
            if arg.alias_info is not None and arg.alias_info.is_write
            for t in tensors(value)
        ]
    if not inputs and not outputs:
        return None
    cat = category(name)
    floating = next((t for t in inputs if t.is_floating_point()), None)
    dtype = _DTYPES.get(floating.dtype, "fp32") if floating is not None else "fp32"
    flops = _flops(name, func, args, kwargs, out) if cat in ("matmul", "attention") else 0
    b_const = b_per = 0
    for t in inputs + outputs:
        c, p = _split(t.numel() * t.element_size(), batch)
        b_const += c
        b_per += p
    f_const, f_per = _split(flops, batch)
    return (cat, dtype, backward, f_const, f_per, b_const, b_per)
