"""One trace per series: every allocation's size as an exact function of the batch size.

Cells of a series differ only in batch size, and a training step's allocations are the same
sequence at every batch size; each one's size is either independent of the batch (weights, their
gradients, optimizer state, the EMA, workspaces) or proportional to it (everything that carries the
batch dimension, alone or flattened with other dimensions). So the step is traced once at a batch
size P that is a prime larger than every batch-independent dimension (class count, timesteps,
image side, widths): a size in elements is then divisible by P exactly when it carries the batch
dimension, and size(B) = size(P) / P * B. The tests check the sequence this gives against direct
traces at other batch sizes, allocation by allocation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ditbench.plan.trace import Trace, trace_training, workspace_bytes


def probe_batch(knobs) -> int:
    """The prime batch size to trace at: above every batch-independent dimension of the cell."""
    # Bytes are elements times 1, 2, 4 or 8, which an odd prime does not divide.
    start = max(4099, knobs.num_classes + 2, knobs.image_size + 1)
    # Bertrand's postulate: a prime lies between start and 2 * start, so the search ends by then.
    for n in range(start, 2 * start):
        if _is_prime(n):
            return n
    raise RuntimeError(f"no prime found in [{start}, {2 * start}): ditbench.plan.batch._is_prime is wrong")


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
    probe = probe_batch(knobs)
    trace = trace_training(knobs, target, probe)
    const, per_sample = [], []
    for size in trace.sizes:
        if size % probe == 0:
            const.append(0)
            per_sample.append(size // probe)
        else:
            const.append(size)
            per_sample.append(0)
    return SeriesTrace(trace=trace, probe=probe, const=const, per_sample=per_sample)
