"""One trace per series: every allocation's size as an exact function of the batch size.

A step's allocations are the same sequence at every batch size, each either independent of the batch
(weights, gradients, optimizer state, EMA, workspaces) or proportional to it. So the step is traced
once at a prime batch P above every batch-independent dimension (classes, image side, widths): a size
is divisible by P exactly when it carries the batch dimension, and size(B) = size(P) / P * B (the
tests check this against direct traces, allocation by allocation).
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
