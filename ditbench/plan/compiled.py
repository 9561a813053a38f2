"""torch.compile in a trace: inductor's partition of forward and backward, run op by op.

The trace compiles through AOTAutograd with inductor's decompositions and min-cut partitioner (which
decide what the forward saves and the backward recomputes) but runs the graphs unfused, each op
allocating its output: a compiled cell errs high by what one fused group holds at the peak. Dynamo
does not compile under a TorchDispatchMode, so a call to the compiled model steps the recorder off
the mode stack and the compiled graphs put it back while they run.
"""

from __future__ import annotations

import contextlib
import functools
import threading

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode, _pop_mode_temporarily

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
