"""Memory a CPU run can show: the CPU allocator's peak allocated bytes over real training steps.

A CPU process's RSS is flat across settings (the allocator keeps freed pages), so the running sum of
the profiler's allocations and releases stands in. Start the meter before the trainer is built (its
state counts); the profiler slows steps, so never in a timed window.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

_WINDOW = "ditbench::memory_window"


@dataclass(frozen=True)
class CpuPeak:
    peak_bytes: int  # most bytes live at once in the window (everything allocated since the meter started)
    baseline_bytes: int  # bytes live when the window opened
    end_bytes: int  # bytes live when the window closed
    allocations: int  # allocations made in the window

    @property
    def peak_gib(self) -> float:
        return self.peak_bytes / 2**30


class AllocationMeter:
    """Records CPU allocator events between enter and exit; `window()` marks the measured part."""

    def __init__(self):
        self._prof = None
        self._windows = 0

    def __enter__(self) -> AllocationMeter:
        from torch.profiler import ProfilerActivity, profile

        self._prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=False)
        self._prof.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._prof.__exit__(*exc)

    @contextlib.contextmanager
    def window(self):
        from torch.profiler import record_function

        if self._windows:
            raise RuntimeError("AllocationMeter measures one window; start a new meter for another")
        self._windows += 1
        with record_function(_WINDOW):
            yield

    def result(self) -> CpuPeak:
        """The peak over the window (or over everything recorded, when no window was marked)."""
        if self._prof is None:
            raise RuntimeError("AllocationMeter.result() before the meter ran")
        from torch._C._profiler import _EventType

        allocs: list[tuple[int, int]] = []
        window = None
        stack = list(self._prof.profiler.kineto_results.experimental_event_tree())
        while stack:
            event = stack.pop()
            if event.typed[0] == _EventType.Allocation:
                fields = event.typed[1]
                if fields.device.type == "cpu":
                    allocs.append((event.start_time_ns, fields.alloc_size))
            elif event.name == _WINDOW:
                window = (event.start_time_ns, event.end_time_ns)
            stack.extend(event.children)
        allocs.sort(key=lambda a: a[0])  # stable: same-time events keep their recorded order
        start, end = window if window is not None else (-1, float("inf"))
        live = 0
        baseline = peak = None
        count = 0
        for t, size in allocs:
            if baseline is None and t >= start:
                baseline = peak = live
            live += size
            if start <= t <= end:
                count += size > 0
                peak = max(peak, live)
            elif t > end:
                live -= size  # undo: report the state when the window closed
                break
        if baseline is None:
            baseline = peak = live
        return CpuPeak(peak_bytes=peak, baseline_bytes=baseline, end_bytes=live, allocations=count)


def measure_training_peak(
    make_trainer: Callable[[], object], warmup_steps: int = 1, steps: int = 1
) -> CpuPeak:
    """Build a trainer, run `warmup_steps`, measure the next `steps`; the default (1, 1) is the steady
    state: optimizer state exists and the previous step's gradients are live during the forward pass."""
    if warmup_steps < 0 or steps < 1:
        raise ValueError("warmup_steps must be >= 0 and steps >= 1")
    meter = AllocationMeter()
    with meter:
        trainer = make_trainer()
        for _ in range(warmup_steps):
            trainer.step(trainer.next_batch())
        with meter.window():
            for _ in range(steps):
                trainer.step(trainer.next_batch())
        del trainer
    return meter.result()
