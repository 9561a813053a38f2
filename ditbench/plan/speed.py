"""Predicted training speed of a traced cell: steps/s, images/s and where a step's time goes.

Each kernel of the steady-state step (kernels.py) takes the longest of its FLOPs at a share of the
card's peak for its dtype, its bytes at a share of the memory bandwidth, and a minimum per kernel.
The host issues kernels at a cost per kernel, per block and per checkpointed block; on a GPU it runs
ahead, so a step takes the longer of device and host ("launch overhead"); on a CPU the two add.
Data-parallel cells add a ring all-reduce of the fp32 gradients, hidden behind the backward but for
the last DDP bucket (FSDP: but for the first block's gather). The efficiencies are fitted on measured
cells (`calibrate`); the band is the largest error of a cell predicted by a fit without it.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ditbench.core.errors import UserError
from ditbench.hardware.cards import DATASHEETS, Datasheet
from ditbench.hardware.precision import LOW_PRECISIONS

SHIPPED = Path(__file__).with_name("speed_calibration.json")
# Fitted parameters, their starting values and bounds.
PARAMS = {
    "matmul_eff": (0.6, 0.02, 1.0),  # share of the dense peak a matmul reaches
    "attention_eff": (0.4, 0.01, 1.0),  # the same for the attention kernels
    "memory_eff": (0.7, 0.05, 1.0),  # share of the memory bandwidth a memory-bound kernel reaches
    "host_us": (10.0, 0.5, 500.0),  # host time to issue one kernel (Python, dispatcher, launch)
    "kernel_us": (3.0, 0.1, 100.0),  # least device time of one kernel
    "block_us": (500.0, 1.0, 20000.0),  # host time per transformer block (Python, module calls)
    "checkpoint_us": (300.0, 1.0, 20000.0),  # host time per checkpointed block (RNG state, re-entry)
    "fused_share": (0.3, 0.02, 1.0),  # share of elementwise launches and bytes left under compile
}
SPLIT = ("matmul", "attention", "elementwise", "optimizer", "launch_overhead", "communication")
DDP_BUCKET_BYTES = 25 * 2**20  # DistributedDataParallel's default bucket_cap_mb
DEFAULT_TARGET_STEPS = 400_000  # the paper's DiT-XL/2 run
DEFAULT_GLOBAL_BATCH = 256  # and its images per step


@dataclass(frozen=True)
class Calibration:
    params: dict[str, float]
    band_pct: float | None  # the largest leave-one-out |error|, None when not computed
    source: str
    cells: int = 0
    loo: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def shipped() -> Calibration:
    data = json.loads(SHIPPED.read_text())
    return Calibration(data["params"], data["band_pct"], data["source"], data["cells"], data.get("loo", []))


def memory_errors_pct() -> list[float]:
    """The memory planner's errors on the H200 anchors (predicted / measured reserved - 1, %)."""
    return json.loads(SHIPPED.read_text()).get("memory_errors_pct", [])


def memory_band_pct() -> float:
    """A predicted memory's band: its largest error on the anchors, rounded up to a whole percent."""
    return float(math.ceil(max(abs(e) for e in memory_errors_pct())))


def band(value: float, pct: float | None) -> tuple[float, float] | None:
    """A predicted figure's interval, value -+ pct% (None without a band): the plan's, the report's."""
    return None if pct is None else (value * (1 - pct / 100), value * (1 + pct / 100))


def cpu_datasheet(peak_gflops: float, memory_gbs: float = 20.0) -> Datasheet:
    """A CPU as a 'card': its measured matmul peak (`ditbench env --measure-peak`) at every dtype."""
    t = peak_gflops / 1000
    return Datasheet(t, t, t, memory_gbs, 0.0, "none")


def datasheet(card: str | None) -> Datasheet | None:
    return DATASHEETS.get(card) if card else None


def _peak(sheet: Datasheet, cat: str, dtype: str, precision: str) -> float:
    """The card's matmul rate for a kernel: measured where the card's sustained rates are known."""
    if dtype in LOW_PRECISIONS:  # fp16, bf16: the sustained rates' third and fourth
        i, peak = 2 + LOW_PRECISIONS.index(dtype), sheet.fp16
    elif cat == "matmul" and precision != "fp32":  # TF32 on but under fp32 (hardware/precision.py): VAE convs
        i, peak = 1, sheet.tf32
    else:
        i, peak = 0, sheet.fp32
    return sheet.sustained[i] if sheet.sustained else peak


@dataclass
class StepTime:
    seconds: float
    split: dict[str, float]  # seconds per SPLIT part; they add up to `seconds`
    kernels: int

    @property
    def steps_per_s(self) -> float:
        return 1.0 / self.seconds


def step_time(
    kernels: dict[tuple, int],
    batch: int,
    sheet: Datasheet,
    precision: str,
    params: dict[str, float],
    *,
    compiled: bool = False,
    gpus: int = 1,
    grad_bytes: int = 0,
    overlap: bool = True,
    blocks: int = 0,
    ckpt_blocks: int = 0,
    accum: int = 1,
    traced_accum: int = 1,
    fsdp: bool = False,
) -> StepTime:
    """One optimizer step's predicted time from a trace's kernel rows (kernels.op_row) at `batch` per GPU
    and micro-batch: `accum` micro-batches where the trace ran `traced_accum` (the optimizer runs once)."""
    work = dict.fromkeys(SPLIT, 0.0)
    launches = 0.0
    backward = 0.0
    for (cat, dtype, in_backward, f0, f1, b0, b1), count in kernels.items():
        scale = 1.0 if cat == "optimizer" else accum / traced_accum
        flops, nbytes, n = f0 + f1 * batch, b0 + b1 * batch, count * scale
        if compiled and cat == "elementwise":  # fused: fewer kernels, each one round trip to memory
            n *= params["fused_share"]
        eff = params["attention_eff"] if cat == "attention" else params["matmul_eff"]
        compute = flops / (eff * _peak(sheet, cat, dtype, precision) * 1e12) if flops else 0.0
        memory = nbytes / (params["memory_eff"] * sheet.memory_gbs * 1e9)
        busy = max(compute, memory)
        # A kernel shorter than the least a kernel takes: the rest is launch latency, not its work.
        latency = n * max(0.0, params["kernel_us"] * 1e-6 - busy)
        work[cat] += n * busy
        work["launch_overhead"] += latency
        launches += n
        if in_backward:
            backward += n * busy + latency
    device = sum(work.values())
    host_us = launches * params["host_us"] + accum * (
        blocks * params["block_us"] + ckpt_blocks * params["checkpoint_us"]
    )
    host = host_us * 1e-6
    work["launch_overhead"] += max(0.0, host - device) if overlap else host
    if gpus > 1 and sheet.link_gbs > 0:
        share = (gpus - 1) / gpus * grad_bytes / (sheet.link_gbs * 1e9)  # one ring pass over the weights
        if fsdp:  # all-gathers in each micro-batch's forward and backward, one reduce-scatter a step,
            ring = (2 * accum + 1) * share  # behind the compute (prefetched) but for the first block's
            work["communication"] = max(ring - device, ring / max(blocks, 1) / (2 * accum + 1))
        else:  # DDP: one all-reduce a step, behind the last micro-batch's backward but for its last bucket
            ring = 2 * share
            last = ring * min(1.0, DDP_BUCKET_BYTES / max(grad_bytes, 1))
            work["communication"] = max(ring - backward / accum, last)
    return StepTime(sum(work.values()), work, round(launches))


def split_shares(split: dict[str, float]) -> dict[str, float]:
    total = sum(split.values()) or 1.0
    return {k: round(100 * v / total, 1) for k, v in split.items()}


def time_to_target(steps_per_s: float, batch: int, gpus: int, target_steps: int | None,
                   target_images: int | None) -> dict[str, float]:  # fmt: skip
    """Days and GPU-hours to `target_steps` optimizer steps, or to `target_images` images seen."""
    steps = target_steps if target_images is None else math.ceil(target_images / (batch * gpus))
    seconds = steps / steps_per_s
    return {"steps": steps, "days": seconds / 86400, "gpu_hours": seconds * gpus / 3600}


@dataclass
class Cell:
    """A measured cell for calibration: its kernel rows and what it ran at."""

    name: str
    kernels: dict[tuple, int]
    batch: int
    sheet: Datasheet
    precision: str
    compiled: bool
    measured_steps_per_s: float
    gpus: int = 1
    grad_bytes: int = 0
    overlap: bool = True
    blocks: int = 0
    ckpt_blocks: int = 0


def blocks(model: str, grad_ckpt: str) -> tuple[int, int]:
    """(transformer blocks, checkpointed blocks) of a cell: every K-th block from block 0 under every_K."""
    from ditbench.models.configs import get_config, parse_grad_ckpt

    depth = get_config(model).depth
    every = parse_grad_ckpt(grad_ckpt)
    return depth, (0 if every == 0 else -(-depth // every))


def predict(cell: Cell, params: dict[str, float]) -> float:
    """The cell's predicted steps/s: its fields are step_time's arguments, but for its name and speed."""
    kw = {k: v for k, v in vars(cell).items() if k not in ("name", "measured_steps_per_s")}
    return step_time(params=params, **kw).steps_per_s


def fit(cells: list[Cell], start: dict[str, float] | None = None) -> dict[str, float]:
    """Least squares on log(predicted / measured) steps/s; parameters no cell informs keep `start`."""
    import numpy as np
    from scipy.optimize import least_squares

    start = dict(start or {k: v[0] for k, v in PARAMS.items()})
    names = [
        k
        for k in PARAMS
        if (k != "fused_share" or any(c.compiled for c in cells))
        and (k != "checkpoint_us" or any(c.ckpt_blocks for c in cells))
    ]
    if len(cells) <= len(names):  # too few cells for every efficiency: one common speed factor
        factor = math.exp(
            -statistics.mean(math.log(predict(c, start) / c.measured_steps_per_s) for c in cells)
        )
        return scaled(start, factor)
    lo = np.log([PARAMS[k][1] for k in names])
    hi = np.log([PARAMS[k][2] for k in names])
    x0 = np.clip(np.log([start[k] for k in names]), lo + 1e-9, hi - 1e-9)

    def residuals(x):
        params = {**start, **dict(zip(names, np.exp(x), strict=True))}
        return [math.log(predict(c, params) / c.measured_steps_per_s) for c in cells]

    best = None
    # A few starts: the max() of compute, memory and launch makes the surface piecewise.
    for scale in (0.0, -1.0, 1.0):
        x = np.clip(x0 + scale, lo + 1e-9, hi - 1e-9)
        res = least_squares(residuals, x, bounds=(lo, hi), method="trf", diff_step=1e-3)
        if best is None or res.cost < best.cost:
            best = res
    return {**start, **{k: float(v) for k, v in zip(names, np.exp(best.x), strict=True)}}


def scaled(params: dict[str, float], factor: float) -> dict[str, float]:
    """Parameters whose predictions run `factor` times as fast (every time term divided by it)."""
    out = dict(params)
    for k in ("matmul_eff", "attention_eff", "memory_eff"):
        out[k] = params[k] * factor
    for k in ("host_us", "kernel_us", "block_us", "checkpoint_us"):
        out[k] = params[k] / factor
    return out


def calibrate(cells: list[Cell], source: str, start: dict[str, float] | None = None) -> Calibration:
    """Fit on all cells; the band is the largest error of each cell predicted by a fit on the others."""
    if not cells:
        raise UserError("no measured cells to calibrate the speed model on")
    params = fit(cells, start)
    loo = []
    if len(cells) >= 3:
        for i, cell in enumerate(cells):
            others = fit(cells[:i] + cells[i + 1 :], start)
            predicted = predict(cell, others)
            loo.append(
                {"cell": cell.name, "measured_steps_per_s": cell.measured_steps_per_s,
                 "predicted_steps_per_s": predicted,
                 "error_pct": 100 * (predicted / cell.measured_steps_per_s - 1)}
            )  # fmt: skip
    band = max((abs(r["error_pct"]) for r in loo), default=None)
    return Calibration(params, None if band is None else round(band, 1), source, len(cells), loo)
