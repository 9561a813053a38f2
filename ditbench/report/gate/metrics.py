"""What the gate can compare: where each metric lives in a record, which way is better, how it is judged.

Speed, memory, loss and energy metrics are read from the record at `path`; their table is below, with the
default thresholds. Quality metrics are the quality outputs of `ditbench.metrics.registry` (their
spec gives the direction, label, valid values and default threshold), read from one evaluation of
the record's `quality` field (`evaluations[i].metrics[path]`), see quality.py. `table()` joins the
two when it is called, so a metric registered later is gated like the others.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

HIGHER, LOWER = "higher", "lower"
TIMING, MEMORY, LOSS, QUALITY, ENERGY = "timing", "memory", "loss", "quality", "energy"
POSITIVE, NONNEGATIVE, ANY = "positive", "non-negative", "any"


@dataclass(frozen=True)
class Metric:
    name: str
    path: str  # dotted path in the record, or the key of a quality evaluation's metrics
    direction: str  # which way is better
    label: str
    kind: str  # TIMING metrics are derived from the per-step times, so the step samples can test them
    valid: str = POSITIVE  # the values a real measurement can take
    core: bool = False  # every ok record has it: missing on both sides is an input error
    threshold_pct: float | None = None  # the default policy's threshold; None: not gated unless asked

    @property
    def timed(self) -> bool:
        return self.kind == TIMING

    def out_of_range(self, v: float) -> bool:
        return (self.valid == POSITIVE and v <= 0) or (self.valid == NONNEGATIVE and v < 0)


# Throughput and reserved memory are noisier than allocated memory, which is near-deterministic.
RECORD_METRICS: tuple[Metric, ...] = (
    Metric("images_per_s", "metrics.images_per_s", HIGHER, "images/s", TIMING, core=True, threshold_pct=5.0),
    Metric("images_per_s_per_gpu", "metrics.images_per_s_per_gpu", HIGHER, "images/s per GPU", TIMING),
    Metric("steps_per_s", "metrics.steps_per_s", HIGHER, "steps/s", TIMING),
    Metric("step_ms", "metrics.step_ms.median", LOWER, "step ms (median)", TIMING, core=True),
    Metric("tflops_per_s", "metrics.tflops_per_s", HIGHER, "TFLOP/s", TIMING),
    Metric("mfu", "metrics.mfu.value", HIGHER, "MFU", TIMING),
    Metric(
        "peak_mem_allocated_gib",
        "metrics.peak_mem_allocated_gib",
        LOWER,
        "peak allocated",
        MEMORY,
        threshold_pct=2.0,
    ),
    Metric(
        "peak_mem_reserved_gib",
        "metrics.peak_mem_reserved_gib",
        LOWER,
        "peak reserved",
        MEMORY,
        threshold_pct=5.0,
    ),
    Metric("device_mem_gib", "metrics.device_mem_gib", LOWER, "device memory", MEMORY),
    # On a CPU: the allocator's peak over a fresh trainer's second step (what settings change), and
    # the process's peak resident memory (flat across settings; differs between torch builds).
    Metric("cpu_peak_alloc_gib", "metrics.cpu_peak_alloc_gib", LOWER, "CPU allocator peak", MEMORY),
    Metric("cpu_peak_rss_gib", "metrics.cpu_peak_rss_gib", LOWER, "CPU peak RSS", MEMORY),
    Metric("smoke_last_loss", "smoke.last_mean", LOWER, "smoke loss (last window)", LOSS, ANY),
    # From NVML's energy counter over the window (bench.gpu_meter); only GPU records have them.
    Metric("energy_j_per_image", "metrics.energy_j_per_image", LOWER, "energy J/image", ENERGY),
    Metric("energy_j_per_step", "metrics.energy_j_per_step", LOWER, "energy J/step", ENERGY),
)
CORE = tuple(m.name for m in RECORD_METRICS if m.core)


def table() -> dict[str, Metric]:
    """Every metric the gate compares, by name: the record's, then the registry's quality outputs."""
    from ditbench.metrics import registry

    quality = (
        Metric(o.key, o.key, o.better, o.label, QUALITY, o.valid, threshold_pct=o.threshold_pct)
        for o in registry.quality_outputs()
    )
    return {m.name: m for m in (*RECORD_METRICS, *quality)}


def default_thresholds() -> dict[str, float]:
    """The default policy: threshold in percent per metric; a metric not listed is not gated."""
    return {name: m.threshold_pct for name, m in table().items() if m.threshold_pct is not None}


def limit(name: str, threshold_pct: float) -> str:
    """A threshold written the way it bites: -5% for throughput, +2% for memory."""
    return f"{'-' if table()[name].direction == HIGHER else '+'}{threshold_pct:g}%"


def limits(thresholds: dict[str, float]) -> str:
    """Thresholds with their labels: "images/s -5%, peak allocated +2%"."""
    metrics = table()
    return ", ".join(f"{metrics[k].label} {limit(k, pct)}" for k, pct in thresholds.items())


@dataclass(frozen=True)
class Crossing:
    change_pct: float | None  # signed (new - base) / |base|; None when base is 0 (no finite percentage)
    direction: str  # "worse", "better" or "same"
    crossed: bool  # moved beyond the threshold (percent and min_abs) in that direction

    def verdict(self, significant: bool) -> str:
        """regression / improvement for a significant crossing, noise for another, else unchanged."""
        if not self.crossed:
            return "unchanged"
        if not significant:
            return "noise"
        return "regression" if self.direction == "worse" else "improvement"


def crossing(metric: Metric, base: float, new: float, threshold_pct: float, min_abs: float) -> Crossing:
    """How far new moved from base, and whether that crosses the rule. Values must be finite."""
    delta = new - base
    worse = -delta if metric.direction == HIGHER else delta  # > 0: moved the wrong way
    direction = "worse" if worse > 0 else "better" if worse < 0 else "same"
    change = delta / abs(base) * 100 if base != 0 else None
    if change is not None and not math.isfinite(change):
        change = None  # a base near the smallest float: the percentage overflows
    if direction == "same":
        return Crossing(0.0 if change is None else change, direction, False)
    # From a base of 0 any move is infinitely many percent: only min_abs can hold it back.
    pct = abs(change) if change is not None else math.inf
    return Crossing(change, direction, pct > threshold_pct and abs(delta) >= min_abs)
