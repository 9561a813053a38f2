"""One record from the ranks of a multi-process cell: throughput summed, the slowest rank's step,
the largest rank's memory; and the scaling efficiency against the same cell at one GPU."""

from __future__ import annotations

import json

from ditbench.bench.cell.gpu_meter import throttling
from ditbench.bench.cell.window import noise, step_stats
from ditbench.records.metrics import (
    IMAGES_PER_S,
    MAX,
    MEAN,
    MIN,
    PEAK_ALLOCATED,
    PER_GPU,
    RECORD_METRICS,
    STEPS_PER_S,
    SUM,
)

# Config keys that differ between a cell and its one-GPU reference for scaling efficiency.
SCALING_KEYS = ("gpus", "nodes", "global_batch", "strategy")
IMG = IMAGES_PER_S.key


def _numbers(per_rank: list[dict], key: str) -> list[float] | None:
    vals = [m.get(key) for m in per_rank]
    return vals if all(isinstance(v, (int, float)) for v in vals) else None


def _slowest_steps(per_rank: list[dict]) -> dict | None:
    """A synchronised step ends when its slowest rank ends: the per-step max over ranks."""
    samples = [(m.get("step_ms") or {}).get("samples") for m in per_rank]
    if all(isinstance(s, list) and s for s in samples) and len({len(s) for s in samples}) == 1:
        return step_stats([max(vals) for vals in zip(*samples, strict=True)])
    if any(m.get("step_ms") for m in per_rank):
        return max((m.get("step_ms") or {} for m in per_rank), key=lambda s: s.get("median", 0.0))
    return None


def aggregate(per_rank: list[dict], *, global_batch: int) -> dict:
    """One metrics dict from every rank's metrics (rank order); `global_batch`: the spec's."""
    if not per_rank:
        raise ValueError("no rank metrics to aggregate")
    world = len(per_rank)
    out = dict(per_rank[0])  # per-model constants (params, model_flops_per_image) from rank 0
    # energy: every GPU's joules (over all images for the per-image figure); memory: the largest rank's
    ranks = {m.key: m.ranks for m in RECORD_METRICS if m.ranks is not None} | {"energy_j": SUM}
    for key, how in ranks.items():
        if (vals := _numbers(per_rank, key)) is not None:
            out[key] = float({SUM: sum, MIN: min, MAX: max, MEAN: lambda v: sum(v) / world}[how](vals))
            if how == MAX:
                out[key + "_sum"] = float(sum(vals))
    fits = [m.get("fits_budget") for m in per_rank]
    if "fits_budget" in out:  # the job fits only if every rank fits
        out["fits_budget"] = False if False in fits else (None if None in fits else True)
    if isinstance(out.get(IMG), float):
        out[PER_GPU.key] = out[IMG] / world
    if (steps := _slowest_steps(per_rank)) is not None:
        out["step_ms"] = steps
    # MFU of the job = summed FLOP/s over summed peak = mean of the ranks' MFU.
    mfus = [m.get("mfu") for m in per_rank]
    if all(isinstance(x, dict) and isinstance(x.get("value"), (int, float)) for x in mfus):
        out["mfu"] = dict(mfus[0], value=sum(x["value"] for x in mfus) / world)
    out["world_size"] = world
    out["global_batch"] = global_batch
    if isinstance(out.get(IMG), float) and (out.get("step_ms") or {}).get("samples"):
        load = out.get("load") if isinstance(out.get("load"), dict) else {}  # rank 0's machine
        share = load.get("other_cpu_share")
        throttle = [throttling(m.get("gpu_window")) for m in per_rank]  # any rank's GPU slows the step
        seen = None if all(t is None for t in throttle) else sorted({r for t in throttle for r in t or ()})
        out.update(noise(out["step_ms"]["samples"], out[IMG], out["global_batch"], share, seen))
    out["per_rank"] = [
        {
            "rank": i,
            **{k: m.get(k) for k in (IMG, STEPS_PER_S.key, PEAK_ALLOCATED.key)},
            "step_ms_median": (m.get("step_ms") or {}).get("median"),
        }
        for i, m in enumerate(per_rank)
    ]
    return out


def reference_key(config: dict) -> str:
    """The config with the GPU-count knobs removed: equal keys mean 'the same cell at another size'."""
    return json.dumps({k: v for k, v in config.items() if k not in SCALING_KEYS}, sort_keys=True, default=str)


def scaling_efficiency(rate: float, gpus: int, rate_at_1: float | None) -> float | None:
    """images/s at N / (N x images/s of the same cell at 1 GPU); None without a usable reference."""
    if not rate_at_1 or rate_at_1 <= 0 or gpus < 1:
        return None
    return rate / (gpus * rate_at_1)


def add_scaling_efficiency(record: dict, records: list) -> None:
    """Fill record.metrics.scaling_efficiency from the same cell at 1 GPU among `records`, if any."""
    metrics = record.get("metrics") or {}
    config = record["config"]
    gpus = config.get("gpus", 1) * config.get("nodes", 1)
    if record.get("status") != "ok" or gpus <= 1 or not metrics.get(IMG):
        return
    key, ref = reference_key(config), None
    for rec in records:  # the latest ok record of the same cell at one GPU (records, or their JSON)
        cfg = rec.get("config") or {}
        if rec.get("status") == "ok" and int(cfg.get("gpus", 1)) == 1 and reference_key(cfg) == key:
            ref = rec
    if ref is None:
        metrics.setdefault("scaling_efficiency", None)
        return
    ref_rate = IMAGES_PER_S.of(ref)
    metrics["scaling_efficiency"] = scaling_efficiency(metrics[IMG], gpus, ref_rate)
    metrics["scaling_reference"] = {"cell_id": ref.get("cell_id"), "run_id": ref.get("run_id"), IMG: ref_rate}
