"""torch.compile in a trace: inductor's partition of forward and backward, run op by op.

Inductor, torch.compile's default backend, lowers each compiled region with inductor's
decompositions, splits the joint forward+backward graph with the min-cut rematerialization
partitioner (which decides what the forward saves for the backward and what the backward
recomputes), and then fuses the pointwise ops of each graph into kernels. A trace keeps the first
two and not the third: it compiles through AOTAutograd with inductor's decompositions and
partitioner, and runs the partitioned graphs as they are, each op allocating its output (FX frees
every value after its last use). The saved activations, most of a training step's memory, are the
ones inductor saves; the intermediates inside a fused kernel are not (inductor never materialises
them), so a compiled cell's prediction errs high by what one fused group holds at the peak.

Dynamo does not compile while a TorchDispatchMode is active, so a call to the compiled model steps
the trace's recorder off the mode stack, and the compiled graphs put it back while they run: the
recorder sees the graphs' operations and nothing of dynamo's own tracing.
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
