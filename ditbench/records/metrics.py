"""Every metric a record carries, declared once: where it lives, how it reads, which way is better, how
ranks combine it, the gate's default threshold. Readers name a metric through this table, never by a
literal of their own; `table()` joins the metric registry's quality outputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

HIGHER, LOWER = "higher", "lower"
TIMING, MEMORY, LOSS, QUALITY, ENERGY = "timing", "memory", "loss", "quality", "energy"
POSITIVE, NONNEGATIVE, ANY = "positive", "non-negative", "any"
SUM, MIN, MAX, MEAN = "sum", "min", "max", "mean"  # how a multi-process cell's ranks combine a figure


@dataclass(frozen=True)
class Metric:
    name: str  # what a policy, a claim and a tracker call it
    path: str  # dotted path in the record, or the key of a quality evaluation's metrics
    direction: str  # which way is better
    label: str
    kind: str  # TIMING metrics are derived from the per-step times, so the step samples can test them
    valid: str = POSITIVE  # the values a real measurement can take
    core: bool = False  # every ok record has it: missing on both sides is an input error
    threshold_pct: float | None = None  # the default policy's threshold; None: not gated unless asked
    unit: str = field(default="", compare=False)
    fmt: str = field(default="{:.3g}", compare=False)
    ranks: str | None = field(default=None, compare=False)  # SUM, MIN, MAX (+ a `_sum`), MEAN; None: rank 0's

    @property
    def key(self) -> str:
        """Its key in its section: `step_ms` for metrics.step_ms.median."""
        return self.path.split(".")[1] if "." in self.path else self.path

    @property
    def timed(self) -> bool:
        return self.kind == TIMING

    def out_of_range(self, v: float) -> bool:
        return (self.valid == POSITIVE and v <= 0) or (self.valid == NONNEGATIVE and v < 0)

    def show(self, v: float) -> str:
        return self.fmt.format(v)

    def of(self, record: Any) -> Any:
        """The value at `path` of a record (a model or a mapping); None where any part is absent."""
        node = record
        for part in self.path.split("."):
            node = node.get(part) if isinstance(node, dict) else getattr(node, part, None)
            if node is None:
                return None
        return node


def _record(name: str, direction: str, label: str, kind: str, path: str = "", **more: Any) -> Metric:
    """A metric of the record's `metrics` section (unless `path` says where); memory in GiB."""
    if kind == MEMORY:
        more = {"unit": "GiB", "fmt": "{:.2f}", **more}
    return Metric(name, path or f"metrics.{name}", direction, label, kind, **more)


# Throughput and reserved memory are noisier than allocated memory, which is near-deterministic.
IMG = {"unit": "images/s", "fmt": "{:.1f}"}
IMAGES_PER_S = _record(
    "images_per_s", HIGHER, "images/s", TIMING, core=True, threshold_pct=5.0, ranks=SUM, **IMG
)
PER_GPU = _record("images_per_s_per_gpu", HIGHER, "images/s per GPU", TIMING, **IMG)
STEPS_PER_S = _record("steps_per_s", HIGHER, "steps/s", TIMING, unit="steps/s", ranks=MIN)
STEP_MS = _record(
    "step_ms", LOWER, "step ms (median)", TIMING, "metrics.step_ms.median", core=True, unit="ms"
)
TFLOPS = _record("tflops_per_s", HIGHER, "TFLOP/s", TIMING, unit="TFLOP/s", ranks=SUM)
MFU = _record("mfu", HIGHER, "MFU", TIMING, "metrics.mfu.value", fmt="{:.1%}")
PEAK_ALLOCATED = _record(
    "peak_mem_allocated_gib", LOWER, "peak allocated", MEMORY, threshold_pct=2.0, ranks=MAX
)
PEAK_RESERVED = _record("peak_mem_reserved_gib", LOWER, "peak reserved", MEMORY, threshold_pct=5.0, ranks=MAX)
DEVICE_MEM = _record("device_mem_gib", LOWER, "device memory", MEMORY, ranks=MAX)
# On a CPU: the allocator's peak over a fresh trainer's second step (what settings change), and
# the process's peak resident memory (flat across settings; differs between torch builds).
CPU_ALLOC = _record("cpu_peak_alloc_gib", LOWER, "CPU allocator peak", MEMORY)
CPU_RSS = _record("cpu_peak_rss_gib", LOWER, "CPU peak RSS", MEMORY, ranks=MAX)
SMOKE_LOSS = _record("smoke_last_loss", LOWER, "smoke loss (last window)", LOSS, "smoke.last_mean", valid=ANY)
# From NVML's energy counter over the window (bench.cell.gpu_meter); only GPU records have them.
ENERGY_PER_IMAGE = _record("energy_j_per_image", LOWER, "energy J/image", ENERGY, unit="J", ranks=MEAN)
ENERGY_PER_STEP = _record("energy_j_per_step", LOWER, "energy J/step", ENERGY, unit="J", ranks=SUM)
RECORD_METRICS = (IMAGES_PER_S, PER_GPU, STEPS_PER_S, STEP_MS, TFLOPS, MFU, PEAK_ALLOCATED, PEAK_RESERVED)
RECORD_METRICS += (DEVICE_MEM, CPU_ALLOC, CPU_RSS, SMOKE_LOSS, ENERGY_PER_IMAGE, ENERGY_PER_STEP)
CORE = tuple(m.name for m in RECORD_METRICS if m.core)


def table() -> dict[str, Metric]:
    """Every metric the gate compares, by name: the record's, then the registry's quality outputs."""
    from ditbench.metrics import registry

    quality = (
        Metric(o.key, o.key, o.better, o.label, QUALITY, o.valid, threshold_pct=o.threshold_pct, fmt=o.fmt)
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


def finite(value: Any) -> float | None:
    """A finite number as a float, else None (null, text, true/false, NaN, inf, beyond floats)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        value = float(value)
    except OverflowError:
        return None
    return value if math.isfinite(value) else None
