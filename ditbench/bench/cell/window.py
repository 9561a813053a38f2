"""The measured window and the smoke run: which steps are timed, how, and what their times say.
On CUDA each step is bracketed by two events with one synchronisation at the end (docs/measurement.md).
"""

from __future__ import annotations

import gc
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ditbench.bench.cell.load import LOAD_BOUND
from ditbench.core.faults import NonFiniteLoss, check_finite

# A steady training loop repeats its step to within a few percent. Beyond these bounds something
# outside the step (another process, clock throttling, a GC pause, a compile) shaped the figures,
# and the record says the cell is noisy. Seen on a shared CPU: p10-p90 100-2846 ms at batch 4.
SPREAD_BOUND = 1.5  # p90 / p10 of the per-step times
GAP_BOUND = 0.10  # |window images/s - batch / median step time| / (batch / median step time)
SMOKE_MEAN_STEPS = 50  # the first/last window means of a smoke curve


def step_stats(step_ms: list[float]) -> dict[str, Any]:
    p10, p90 = np.percentile(step_ms, (10, 90))  # linear interpolation
    return {
        "median": statistics.median(step_ms),
        "p10": float(p10),
        "p90": float(p90),
        "samples": [round(x, 4) for x in step_ms],
    }


def noise(
    step_ms: list[float],
    rate: float,
    batch: int,
    other_cpu_share: float | None = None,
    gpu_throttle: list[str] | None = None,
) -> dict[str, Any]:
    """{noisy, noise: {step_spread, throughput_gap, spread_bound, gap_bound[, other_cpu_share,
    load_bound][, gpu_throttle]}} of a window at `rate` images/s; `batch`: the images of one synchronised
    step. The optional fields are recorded only where measured (None: not measured)."""
    p10, p90 = (float(p) for p in np.percentile(step_ms, (10, 90)))
    median = statistics.median(step_ms)
    spread = p90 / p10 if p10 > 0 else math.inf
    from_median = batch / (median / 1e3) if median > 0 else math.inf
    gap = abs(rate - from_median) / from_median if math.isfinite(from_median) else math.inf
    figures = {
        "step_spread": spread,
        "throughput_gap": gap,
        "spread_bound": SPREAD_BOUND,
        "gap_bound": GAP_BOUND,
    }
    steady = spread <= SPREAD_BOUND and gap <= GAP_BOUND
    if other_cpu_share is not None:
        figures.update(other_cpu_share=other_cpu_share, load_bound=LOAD_BOUND)
        steady = steady and other_cpu_share <= LOAD_BOUND
    if gpu_throttle is not None:
        figures["gpu_throttle"] = list(gpu_throttle)
        steady = steady and not gpu_throttle
    return {"noisy": not steady, "noise": figures}


def noise_advice(noise: Any, exact: bool = True) -> str | None:
    """What to change when the machine disturbed the window (load, throttling), else None. exact=False
    names the bound, not the share: the same text for every cell it applies to."""
    if not isinstance(noise, dict):
        return None
    said = []
    share, bound = noise.get("other_cpu_share"), noise.get("load_bound")
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (share, bound))
    if numbers and share > bound:
        used = f"{100 * share:.0f}%" if exact else f"more than {100 * bound:.0f}%"
        said.append(
            f"other processes used {used} of the CPUs during the window: rerun on a quiet "
            "machine (a cell with more than one thread also gains from threads=1)"
        )
    throttle = noise.get("gpu_throttle")
    if isinstance(throttle, list) and throttle:
        names = ", ".join(str(x) for x in throttle)
        said.append(
            f"the GPU lowered its clocks ({names}) during the window, so it measured a slowed card: check "
            "its cooling and power limit (nvidia-smi -q -d PERFORMANCE) and rerun"
        )
    return "; ".join(said) or None


def _sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def measure_window(
    trainer,
    step,
    device: str,
    warmup: int,
    measure: int,
    min_seconds: float,
    *,
    agree: Callable[[int], int] | None = None,
    after_warmup: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Warm-up, then at least `measure` steps and `min_seconds`: {steps, wall_s, step_ms, last_loss}.
    With `agree` every rank runs the same count: `measure` steps, then agree(the extra steps estimated
    to reach `min_seconds`). `after_warmup` runs between (it resets the peak memory counters).
    """
    losses = [step(trainer.next_batch()) for _ in range(warmup)]
    _sync(device)
    check_finite(losses, 1, "warm-up")
    if after_warmup is not None:
        after_warmup()
    timer = _StepTimer(device)
    gc.collect()
    gc.disable()  # a collection inside the window is a stall that belongs to no step
    try:
        start = time.perf_counter()
        while timer.count < measure or (agree is None and time.perf_counter() - start < min_seconds):
            timer.step(step, trainer)
        if agree is not None:
            elapsed = time.perf_counter() - start  # no sync yet: an estimate is enough to pick a count
            extra = 0
            if elapsed < min_seconds:
                extra = math.ceil((min_seconds - elapsed) / max(elapsed / timer.count, 1e-9))
            for _ in range(agree(extra)):
                timer.step(step, trainer)
        _sync(device)  # one synchronisation for the whole window
        wall = time.perf_counter() - start
    finally:
        gc.enable()
    check_finite(timer.losses, warmup + 1, "measured")
    return {
        "steps": timer.count,
        "wall_s": wall,
        "step_ms": timer.milliseconds(),
        "last_loss": float(timer.losses[-1]),
    }


class _StepTimer:
    """Times each step: CUDA events on a GPU (no host synchronisation), perf_counter on a CPU."""

    def __init__(self, device: str):
        self.cuda = device == "cuda"
        self.losses: list = []
        self.events: list = []
        self.cpu_ms: list[float] = []

    @property
    def count(self) -> int:
        return len(self.losses)

    def step(self, step, trainer) -> None:
        if self.cuda:
            import torch

            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            self.losses.append(step(trainer.next_batch()))
            end.record()
            self.events.append((begin, end))
        else:
            t0 = time.perf_counter()
            self.losses.append(step(trainer.next_batch()))
            self.cpu_ms.append((time.perf_counter() - t0) * 1e3)

    def milliseconds(self) -> list[float]:
        return [b.elapsed_time(e) for b, e in self.events] if self.cuda else self.cpu_ms


def smoke_run(trainer, step, steps: int, agree_stop: Callable[[bool], bool] | None = None) -> dict[str, Any]:
    """N steps, the loss read every step; stops at the first non-finite loss (NonFiniteLoss), every rank
    together with `agree_stop(bad) -> any rank bad`."""
    curve: list[float] = []
    for i in range(steps):
        value = float(step(trainer.next_batch()))
        bad = not math.isfinite(value)
        if agree_stop is not None:
            bad = agree_stop(bad)
        if bad:
            raise NonFiniteLoss(i + 1, "smoke", value, curve)  # the record keeps the curve up to here
        curve.append(value)
    skips = int(getattr(trainer, "scaler_skips", 0) or 0)
    return _smoke_field(steps, curve, None, scaler_skips=skips, status="ok", reason=None)


def failed_smoke(steps: int, outcome: dict, err: BaseException) -> dict[str, Any]:
    """The smoke field of a smoke run that failed: the cell keeps its measurement and stays ok."""
    nonfinite = isinstance(err, NonFiniteLoss)
    curve, step = (err.curve, err.step) if nonfinite else ([], None)
    return _smoke_field(steps, curve, step, status=outcome["status"], reason=outcome["reason"])


def _smoke_field(steps: int, curve: list[float], nonfinite_at: int | None, **more: Any) -> dict[str, Any]:
    """The smoke field: the curve, its first and last means, where it turned non-finite, then `more`."""
    window = min(SMOKE_MEAN_STEPS, len(curve))
    means = (sum(curve[:window]) / window, sum(curve[-window:]) / window) if window else (None, None)
    return {
        "steps": steps,
        "loss": [round(x, 6) for x in curve],
        "first_mean": means[0],
        "last_mean": means[1],
        "nonfinite_steps": int(nonfinite_at is not None),
        "first_nonfinite_step": nonfinite_at,
        **more,
    }
