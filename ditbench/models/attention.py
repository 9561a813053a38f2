"""The kernel behind the `attention` knob: softmax(Q K^T / sqrt(d)) V over (N, heads, T, d) tensors.

`resolve_kernel` decides before training whether a backend runs on this device, dtype and head size and
names the kernel that will (the record's `metrics.attention_kernel`); one that cannot is an
UnsupportedError with torch's reason.
"""

from __future__ import annotations

import contextlib
import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from ditbench.core.errors import UnsupportedError
from ditbench.core.faults import one_line

FORCED = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
}
CUDA_ONLY = ("efficient", "cudnn")  # torch has a CPU flash kernel, and none of these two
_NAMES = {"efficient": "memory-efficient", "cudnn": "cuDNN"}
# torch._fused_sdp_choice's answer by SDPBackend value; its math fallback is `sdpa_math` (ours is `math`).
_CHOICE_NAMES = {0: "sdpa_math", 1: "flash", 2: "efficient", 3: "cudnn", 4: "overrideable"}
_NO_KERNEL = ("No available kernel", "No viable backend")  # what torch raises when no kernel can run
# The probe's longest sequence (XL/2 at 512 px): a probe stays milliseconds, and `attend` still turns a
# refusal at a longer real length into UnsupportedError.
PROBE_MAX_TOKENS = 1024


def math_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    scores = (q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1)  # (N, heads, T, T)
    return scores.softmax(dim=-1) @ v


def kernel_context(backend: str):
    return sdpa_kernel(FORCED[backend]) if backend in FORCED else contextlib.nullcontext()


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backend: str) -> torch.Tensor:
    if backend == "math":
        return math_attention(q, k, v)
    if backend == "sdpa":
        return F.scaled_dot_product_attention(q, k, v)
    try:
        with sdpa_kernel(FORCED[backend]):
            return F.scaled_dot_product_attention(q, k, v)
    except RuntimeError as err:  # shapes the up-front probe did not see
        refusal = refused(err, backend, f"inputs {tuple(q.shape)} of {q.dtype} on {q.device.type}")
        if refusal is not None:
            raise refusal from err
        raise


def refused(err: RuntimeError, backend: str, inputs: str) -> UnsupportedError | None:
    """torch's refusal to run a forced kernel, as the UnsupportedError a cell is recorded with."""
    if backend in FORCED and any(text in str(err) for text in _NO_KERNEL):
        return UnsupportedError(
            f"attention {backend}: torch has no {backend} kernel for {inputs}: {one_line(str(err))}"
        )
    return None


def resolve_kernel(
    backend: str, device: torch.device | str, dtype: torch.dtype, heads: int, head_dim: int, tokens: int
) -> str:
    """The kernel `backend` runs for (N, heads, tokens, head_dim) inputs of `dtype` (the autocast's, else
    the parameters') on `device`, from one small forward and backward; UnsupportedError if none can.
    `backend` is one of ATTENTION_BACKENDS (the knob's validator checks it)."""
    if backend == "math":
        return "math"
    device = torch.device(device)
    if backend in CUDA_ONLY and device.type != "cuda":
        raise UnsupportedError(
            f"attention {backend}: torch implements the {_NAMES[backend]} attention kernel for CUDA devices "
            f"only; this cell runs on {device.type} (math, sdpa and flash run there)"
        )
    q = torch.randn(1, heads, min(tokens, PROBE_MAX_TOKENS), head_dim, device=device, dtype=dtype)
    q.requires_grad_(True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with kernel_context(backend):
                F.scaled_dot_product_attention(q, q, q).sum().backward()
                choice = _dispatcher_choice(q)
        except RuntimeError as err:
            if not any(text in str(err) for text in _NO_KERNEL):
                raise
            reasons = torch_reasons([str(w.message) for w in caught], backend) or [one_line(str(err))]
            raise UnsupportedError(
                f"attention {backend} cannot run on {device.type} with {str(dtype).replace('torch.', '')} "
                f"inputs of head size {head_dim} ({heads} heads, {tokens} tokens); torch says: "
                + " ".join(reasons)[:600]
            ) from None
    return backend if backend in FORCED else choice


# When no kernel can run, torch warns per kernel a header, then a line per failed check.
_HEADERS = {
    "efficient": "Memory efficient kernel not used because:",
    "flash": "Flash attention kernel not used because:",
    "cudnn": "cuDNN attention kernel not used because:",
}


def torch_reasons(messages: list[str], backend: str) -> list[str]:
    """The lines of torch's warnings that say why `backend`'s kernel cannot run."""
    lines = [one_line(m) for m in messages if "runtime disabled" not in m]
    mine, inside = [], False
    for line in lines:
        if line in _HEADERS.values():
            inside = line == _HEADERS.get(backend)
        elif inside:
            mine.append(line)
    return mine or [line for line in lines if line not in _HEADERS.values()]


def _dispatcher_choice(q: torch.Tensor) -> str:
    """The kernel plain F.scaled_dot_product_attention dispatches these inputs to (torch's own answer)."""
    choose = getattr(torch, "_fused_sdp_choice", None)  # private, present since torch 2.0
    return _CHOICE_NAMES.get(int(choose(q, q, q)), "unknown") if choose is not None else "unknown"
