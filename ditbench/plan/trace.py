"""Trace a cell's real training step on fake tensors: every device allocation and release, in order.

The Trainer is built and stepped as `ditbench run` does, under FakeTensorMode; a dispatch mode below
autograd sees every aten op: a new storage is an allocation, a weak reference reports its release. The
step runs on the fake *CPU* device (autograd asks the CUDA driver for a context before the backward),
CUDA's behaviour substituted where the two differ (emulation.py).

One trace serves a series: it is traced once at a prime batch P above every batch-independent
dimension, so a size is divisible by P exactly when it carries the batch, and size(B) = size(P) / P * B.
"""

from __future__ import annotations

import contextlib
import gc
import math
import weakref
from dataclasses import dataclass, field
from functools import partial

import torch
from torch._subclasses.fake_tensor import DataDependentOutputException, FakeTensor, FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from ditbench.plan.emulation import (
    LOW_DTYPES,
    FakeDeepcopy,
    Target,
    cuda_autocast,
    policy_for,
    traced_compiler,
)
from ditbench.plan.kernels import CUBLAS, op_row, tensors
from ditbench.plan.memo import MISS, DispatchMemo

aten = torch.ops.aten
_DEVICE = torch.ops.prim.device.default
_ITEM = aten._local_scalar_dense.default

# Ops that run on cuBLAS on a GPU: each thread that calls one gets its own handle and workspace.
_CUBLAS_OPS = frozenset(f"aten.{n}.default" for n in CUBLAS)
# Attention backward kernels whose CUDA versions need scratch the meta kernels do not allocate.
_SDPA_BACKWARD = frozenset(
    f"aten::_scaled_dot_product_{kind}_backward"
    for kind in ("flash_attention_for_cpu", "flash_attention", "efficient_attention", "cudnn_attention")
)
# Ops CUDA autocast runs in fp32 (casting low-precision inputs up) where CPU autocast does not.
_CUDA_FP32_ONLY = frozenset(
    "aten::" + name
    for name in (
        "native_layer_norm native_group_norm _softmax _log_softmax exp expm1 log log2 log10 log1p pow "
        "rsqrt reciprocal sum prod cumsum cumprod norm linalg_vector_norm acos asin cosh sinh tan "
        "erfinv softplus"
    ).split()
)

STATE_LABELS = ("weights", "gradients", "optimizer", "ema")  # the model's (the VAE's weights: "vae")


@dataclass
class Trace:
    """The allocation history of building a trainer and running two training steps.

    `events`: `k + 1` when allocation k is made, `-(k + 1)` when it is released; `sizes[k]` its bytes,
    `labels[k]` what it held. `marks`: where build, step1, step2 and end start (step 2 is the steady
    state). GPU-dependent allocations have size 0 and a `modeled` entry (workspace_bytes).
    """

    target: Target
    batch_size: int
    sizes: list[int] = field(default_factory=list)
    events: list[int] = field(default_factory=list)
    labels: dict[int, str] = field(default_factory=dict)
    modeled: dict[int, tuple] = field(default_factory=dict)
    marks: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    params: int = 0
    kernels: dict[tuple, int] = field(default_factory=dict)


class _Recorder(TorchDispatchMode):
    """Records every new storage an aten op returns, and its release through a weak reference."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:  # pragma: no mutate block (torch calls it as the class is built)
        return False  # no dynamo-disabling wrapper around every call in an eager trace (see below)

    def __init__(self, trace: Trace, fake_mode: FakeTensorMode, memo: DispatchMemo | None = None):
        super().__init__()
        self.fake_mode = fake_mode
        self.memo = memo
        self.trace = trace
        self.cuda = trace.target.device == "cuda"
        self.live: dict[int, int] = {}  # storage address -> allocation id
        self.refs: dict[int, weakref.ref] = {}
        self.workspace_threads: set[bool] = set()
        self.open = True
        self.counting = False  # inside step 2: count its kernels

    def allocate(self, nbytes: int, label: str | None = None) -> int:
        aid = len(self.trace.sizes)
        self.trace.sizes.append(nbytes)
        self.trace.events.append(aid + 1)
        if label:
            self.trace.labels[aid] = label
        return aid

    def release(self, aid: int) -> None:
        self.trace.events.append(-(aid + 1))

    def _on_free(self, key: int, aid: int, _ref) -> None:
        if self.live.get(key) == aid:
            del self.live[key]
        self.refs.pop(aid, None)
        if self.open:
            self.release(aid)

    def _track(self, t) -> None:
        if not isinstance(t, FakeTensor) or t.fake_mode is not self.fake_mode:
            return  # a real tensor (host memory), or one of torch.compile's own tracing fakes
        st = t.untyped_storage()
        key = st._cdata
        if key in self.live:
            return
        nbytes = st.nbytes()
        if nbytes == 0:  # neither allocator hands out memory for an empty storage
            return
        aid = self.allocate(nbytes)
        self.live[key] = aid
        self.refs[aid] = weakref.ref(st, partial(self._on_free, key, aid))

    def mark(self, name: str) -> None:
        gc.collect(0)  # cyclic garbage of the phase is released here, not at an arbitrary later op
        self.trace.marks[name] = len(self.trace.events)
        self.counting = name == "step2"

    def label(self, tensors, label: str) -> None:
        for t in tensors:
            if isinstance(t, torch.Tensor) and isinstance(t, FakeTensor):
                aid = self.live.get(t.untyped_storage()._cdata)
                if aid is not None:
                    self.trace.labels[aid] = label

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is _DEVICE:  # asked thousands of times per step; answer without the fake mode
            return args[0].fake_device
        if func is _ITEM:
            try:  # a constant the fake mode follows (AdamW's step count on the host)
                return func(*args, **(kwargs or {}))
            except DataDependentOutputException:
                # GradScaler's found-inf check (foreach/for-loop AdamW): a planned step has finite
                # gradients, so the optimizer steps, as it does in steady state.
                return 0
        kwargs = kwargs or {}
        key = None if self.memo is None else self.memo.key(func, args, kwargs)
        if key is None:
            out = func(*args, **kwargs)
        else:
            out = self.memo.lookup(key, args)
            if out is MISS:
                out = func(*args, **kwargs)
                self.memo.learn(key, func, args, out)
        for t in tensors(out):
            self._track(t)
        if self.counting:
            backward = torch._C._current_autograd_node() is not None
            row = op_row(func, args, kwargs, out, self.trace.batch_size, backward)
            if row is not None:
                self.trace.kernels[row] = self.trace.kernels.get(row, 0) + 1
        if self.cuda:
            self._cuda_extras(func, args)
        return out

    def _cuda_extras(self, func, args) -> None:
        name = func._schema.name
        if name in _SDPA_BACKWARD:
            q = args[1]
            if q.dim() == 4:  # (B, H, T, D); the kernel's scratch, freed when it returns
                aid = self.allocate(0, "workspace")
                self.trace.modeled[aid] = ("attention_backward", *q.shape, q.dtype in LOW_DTYPES)
                self.release(aid)
        elif str(func) in _CUBLAS_OPS:
            # One handle (and workspace) per calling thread: the caller's, and autograd's device
            # thread for backward and checkpoint recomputation.
            in_backward = torch._C._current_autograd_node() is not None
            if in_backward not in self.workspace_threads:
                self.workspace_threads.add(in_backward)
                self.trace.modeled[self.allocate(0, "workspace")] = ("cublas",)
        elif (
            name in _CUDA_FP32_ONLY and "step1" in self.trace.marks and not torch._C._current_autograd_node()
        ):
            # In a step's forward every fp16/bf16 tensor comes from autocast (the weights are fp32).
            low = next((a for a in args if isinstance(a, torch.Tensor) and a.dtype in LOW_DTYPES), None)
            if low is not None:
                note = (
                    f"{name} ran on {low.dtype} inputs under autocast; CUDA autocast computes it in "
                    "float32 (an extra cast this prediction does not include)"
                )
                if note not in self.trace.notes:
                    self.trace.notes.append(note)


class _CompileRecorder(_Recorder):
    """For cells with torch.compile: dynamo must not trace the recorder itself."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:  # pragma: no mutate block (torch calls it as the class is built)
        return True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return super().__torch_dispatch__(func, types, args, kwargs)


def workspace_bytes(model: tuple, batch_size: int, target: Target) -> int:
    """Bytes of a modeled allocation (see Trace.modeled) on `target` at `batch_size`: cuBLAS, the
    handle's workspace; attention backward for q of (B, H, T, D), flash (fp16/bf16, sm80+) a float32 dQ
    accumulator (B, T_128, H, D_32 (_64 above 128)) and row sums (B, H, T_128), memory-efficient
    attention the float32 row sums (B, H, T)."""
    if model[0] == "cublas":
        return target.cublas_workspace_bytes
    _, _, h, t, d, low = model

    def up(x: int, m: int) -> int:
        return -(-x // m) * m

    if low and target.sm is not None and target.sm >= (8, 0):
        t128 = up(t, 128)
        return 4 * batch_size * (t128 * h * up(d, 32 if d <= 128 else 64) + h * t128)
    return 4 * batch_size * h * t


def trace_training(knobs, target: Target, batch_size: int, *, memo: bool = True) -> Trace:
    """Build a Trainer from `knobs` (spec.knobs.Knobs) and trace two steps at `batch_size`, emulating
    `target` (its compute capability decides the precision policy). memo=False: no DispatchMemo."""
    from ditbench.train.step import Trainer

    trace = Trace(target=target, batch_size=batch_size)
    knobs = knobs.replace(batch_size=batch_size)
    gc_was_enabled = gc.isenabled()
    gc.disable()  # released at the marks, deterministically
    try:
        with contextlib.ExitStack() as stack:
            compiler = None
            if knobs.compile:  # dynamo's import takes seconds: only for the cells that compile
                compiler = stack.enter_context(traced_compiler())
            if target.device == "cuda":
                stack.enter_context(cuda_autocast())
            fake_mode = stack.enter_context(FakeTensorMode(allow_non_fake_inputs=True))
            kind = _CompileRecorder if knobs.compile else _Recorder
            recorder = stack.enter_context(kind(trace, fake_mode, DispatchMemo(fake_mode) if memo else None))
            policy = policy_for(knobs.precision, target)
            data = VaeImages(knobs) if isinstance(knobs.data, dict) and "images" in knobs.data else None
            build = lambda: Trainer(knobs, device="cpu", policy=policy, compiler=compiler, data=data)  # noqa: E731
            _run(recorder, trace, build)
    finally:
        if gc_was_enabled:
            gc.enable()
    trace.events = _in_order(trace.events, set(trace.marks.values()))
    return trace


def _in_order(events: list[int], marks: set[int]) -> list[int]:
    """Consecutive releases within a phase in id order: hash maps (autocast's cache) vary their order."""
    out: list[int] = []
    for e in events:
        j = len(out)
        out.append(e)
        while e < 0 and j > 0 and j not in marks and out[j - 1] < 0 and out[j - 1] < out[j]:
            out[j - 1], out[j] = out[j], out[j - 1]  # insertion sort within the run
            j -= 1
    return out


def _run(recorder: _Recorder, trace: Trace, build) -> None:
    """Build and step the trainer; the trainer dies inside, so its release is not recorded."""
    try:
        recorder.mark("build")
        with FakeDeepcopy():
            trainer = build()
        trace.params = trainer.num_params
        recorder.mark("step1")
        trainer.step(trainer.next_batch())
        _label_state(recorder, trainer)
        recorder.mark("step2")
        trainer.step(trainer.next_batch())
        _label_state(recorder, trainer)
        recorder.mark("end")
    finally:
        recorder.open = False


def _label_state(recorder: _Recorder, trainer) -> None:
    model = trainer.base_model
    recorder.label(list(model.parameters()) + list(model.buffers()), "weights")
    recorder.label([p.grad for p in model.parameters() if p.grad is not None], "gradients")
    state = [v for s in trainer.optimizer.state.values() for v in s.values()]
    recorder.label(state, "optimizer")
    recorder.label(list(trainer.ema.state_dict().values()), "ema")
    if isinstance(trainer.data, VaeImages):
        recorder.label(list(trainer.data.vae.parameters()), "vae")


class VaeImages:
    """Image-folder data as a traced step sees it: each batch of host images encoded by the VAE (built
    on the device as a run builds it), in float32, without gradients, outside the step's autocast."""

    def __init__(self, knobs):
        from ditbench.core.extras import require_diffusers
        from ditbench.models import vae

        self.knobs = knobs
        autoencoder = require_diffusers("the VAE of an image-folder cell").AutoencoderKL
        self.vae = autoencoder(**vae.SD_VAE_CONFIG).eval().requires_grad_(False)  # vae.build_vae but .to()

    def next_batch(self):
        from ditbench.models import vae

        k = self.knobs
        images = torch.randn(k.batch_size, 3, k.image_size, k.image_size)
        return vae.encode_images(self.vae, images), torch.randint(0, k.num_classes, (k.batch_size,))


def probe_batch(knobs) -> int:
    """The prime batch size to trace at: above every batch-independent dimension of the cell."""
    # Bytes are elements times 1, 2, 4 or 8, which an odd prime does not divide.
    start = max(4099, knobs.num_classes + 2, knobs.image_size + 1)
    # Bertrand's postulate: a prime lies between start and 2 * start, so the search ends by then.
    for n in range(start, 2 * start):
        if _is_prime(n):
            return n
    raise RuntimeError(f"no prime found in [{start}, {2 * start}): ditbench.plan.trace._is_prime is wrong")


def _is_prime(n: int) -> bool:
    if n < 2 or n % 2 == 0:
        return n == 2
    return all(n % f for f in range(3, math.isqrt(n) + 1, 2))


@dataclass
class SeriesTrace:
    """A trace whose allocation sizes can be evaluated at any batch size."""

    trace: Trace
    probe: int
    const: list[int]
    per_sample: list[int]
    _live: tuple | None = field(default=None, repr=False, compare=False)

    @classmethod
    def of(cls, trace: Trace) -> SeriesTrace:
        """A trace made at a probe batch: each size split into a constant or a per-sample part."""
        p = trace.batch_size
        const = [0 if s % p == 0 else s for s in trace.sizes]
        return cls(trace, p, const, [s // p if s % p == 0 else 0 for s in trace.sizes])

    def live_peak(self, batch_size: int) -> int:
        """The most bytes live at once at `batch_size` (no allocator rounding, no workspaces): a lower
        bound on what the caching allocator holds."""
        import numpy as np

        if self._live is None:
            events = np.array(self.trace.events[: self.trace.marks["end"]])
            aid, sign = np.abs(events) - 1, np.sign(events)
            const, per = np.array(self.const, dtype=np.int64), np.array(self.per_sample, dtype=np.int64)
            self._live = (np.cumsum(sign * const[aid]), np.cumsum(sign * per[aid]))
        const_live, per_live = self._live
        return int((const_live + batch_size * per_live).max())

    def sizes(self, batch_size: int, target=None) -> list[int]:
        """Bytes of every allocation at `batch_size`; modeled ones (GPU workspaces) for `target`."""
        out = [c + s * batch_size for c, s in zip(self.const, self.per_sample, strict=True)]
        for aid, model in self.trace.modeled.items():
            out[aid] = workspace_bytes(model, batch_size, target or self.trace.target)
        return out


def trace_series(knobs, target) -> SeriesTrace:
    """The series of `knobs` (ditbench.spec.knobs.Knobs, any batch size) traced at its probe batch."""
    return SeriesTrace.of(trace_training(knobs, target, probe_batch(knobs)))
