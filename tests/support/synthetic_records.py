"""Realistic result records (schema ditbench.result/1) for report and gate tests, without a GPU.

Speed and memory follow a small model of DiT training fitted to the H200 anchors in DESIGN.md:
static memory is 20 bytes per parameter (fp32 weights, grads, two Adam moments, EMA) whatever the
autocast precision, activations scale with tokens x width x depth and shrink with 16-bit autocast
and much more with checkpointing. Every number can be overridden, so a test can state the exact
values it then expects to see in a report or a gate decision.
"""

from __future__ import annotations

import json
import math
from datetime import datetime, timedelta, timezone
from typing import Any

import numpy as np

from ditbench.bench.cell import memory
from ditbench.bench.cell.window import noise as window_noise
from ditbench.hardware.cards import find_card
from ditbench.spec.cell import CellSpec
from ditbench.spec.cell import cell_id as spec_cell_id
from ditbench.spec.knobs import KNOBS, Knobs

# name -> (depth, width, patch, params)
MODELS = {
    "DiT-S/8": (12, 384, 8, 33_150_000),
    "DiT-S/2": (12, 384, 2, 32_960_000),
    "DiT-B/8": (12, 768, 8, 130_900_000),
    "DiT-B/4": (12, 768, 4, 130_480_000),
    "DiT-L/4": (24, 1024, 4, 458_050_000),
    "DiT-XL/2": (28, 1152, 2, 675_129_632),
}
GIB = 2**30
CONTEXT_GIB = 0.55  # the CUDA context an emulated cell measures (and NVML counts beyond reserved)

H200_ENV = {
    "host": "gpu-runner-1",
    "platform": "Linux-6.8.0-x86_64-with-glibc2.39",
    "cpu": "Intel Xeon Platinum 8480+",
    "cpu_count": 16,
    "torch_threads": 16,
    "gpu_name": "NVIDIA H200",
    "gpu_count": 1,
    "gpu_memory_gib": 139.8,
    "driver": "570.86.15",
    "cuda": "12.8",
    "torch": "2.14.1",
    "python": "3.11.9",
    "ditbench": "0.1.0",
    "git_sha": "b079167",
}
CPU_ENV = {
    "host": "laptop",
    "platform": "Linux-6.1.0-x86_64-with-glibc2.36",
    "cpu": "AMD EPYC 7B13",
    "cpu_count": 2,
    "torch_threads": 2,
    "gpu_name": None,
    "gpu_count": 0,
    "gpu_memory_gib": None,
    "driver": None,
    "cuda": None,
    "torch": "2.14.1",
    "python": "3.11.2",
    "ditbench": "0.1.0",
    "git_sha": "b079167",
}
PRECISION_SPEED = {"fp32": 1.0, "tf32": 3.0, "bf16": 5.1, "fp16": 5.0}
PRECISION_ACT = {"fp32": 1.0, "tf32": 1.0, "bf16": 0.67, "fp16": 0.67}


def tokens(model: str, image_size: int = 256) -> int:
    return (image_size // 8 // MODELS[model][2]) ** 2


def gflop_per_image(model: str, image_size: int = 256) -> float:
    depth, width, _, _ = MODELS[model]
    t = tokens(model, image_size)
    macs = depth * (12 * t * width**2 + 2 * t**2 * width)  # attention + MLP, forward
    return 3 * 2 * macs / 1e9


def modelled(model: str, precision: str, grad_ckpt: str, batch_size: int, image_size: int = 256):
    """(images/s, peak allocated GiB) of the toy performance model."""
    depth, width, _, params = MODELS[model]
    occupancy = batch_size / (batch_size + 4)  # small batches leave the GPU idle
    img_s = 38_000 / gflop_per_image(model, image_size) * occupancy * PRECISION_SPEED[precision]
    if grad_ckpt == "full":
        img_s *= 0.72
    act_per_image = 0.63 * tokens(model, image_size) * width * depth / (256 * 1152 * 28)
    act = act_per_image * batch_size * PRECISION_ACT[precision] * (0.13 if grad_ckpt == "full" else 1.0)
    return img_s, params * 20 / GIB + act


def cell_config(model="DiT-S/8", precision="fp32", grad_ckpt="none", batch_size=8, **extra) -> dict[str, Any]:
    """The record's `config` as the runner writes it (`CellSpec`'s JSON), validated.

    `extra` holds other knobs and the measurement keys (`steps`, `smoke_steps`, `device`,
    `gpu_memory_gib`, `card`); a card given by name alone gets its usable memory, as a suite does.
    """
    config: dict[str, Any] = {
        "model": model,
        "precision": precision,
        "grad_ckpt": grad_ckpt,
        "batch_size": batch_size,
        "steps": {"warmup": 5, "measure": 20, "min_seconds": 5.0},
        "smoke_steps": 0,
        "device": "cuda",
        "gpu_memory_gib": None,
        "card": None,
    }
    config.update(extra)
    if config["card"] is not None and config["gpu_memory_gib"] is None:
        config["gpu_memory_gib"] = find_card(config["card"]).usable_gib
    knobs = Knobs(**{k: v for k, v in config.items() if k in KNOBS})
    return CellSpec(knobs=knobs, **{k: v for k, v in config.items() if k not in KNOBS}).model_dump(
        mode="json"
    )


def cell_id(config: dict[str, Any]) -> str:
    """The id the runner gives the cell of this config (`ditbench.spec.cell.cell_id`)."""
    return spec_cell_id(CellSpec.read(config, "synthetic cell config"))


def step_samples(median_ms: float, n: int, noise: float = 0.01, seed: int = 0) -> list[float]:
    """n per-step times around median_ms with relative spread `noise`."""
    rng = np.random.default_rng(seed)
    return [float(x) for x in median_ms * (1 + noise * rng.standard_normal(n))]


def smoke_curve(steps: int, seed: int = 0, start: float = 1.0, end: float = 0.18) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    x = np.arange(steps)
    loss = end + (start - end) * np.exp(-x / (steps / 6)) + 0.02 * rng.standard_normal(steps)
    window = max(1, steps // 10)
    return {
        "steps": steps,
        "loss": [float(v) for v in loss],
        "first_mean": float(loss[:window].mean()),
        "last_mean": float(loss[-window:].mean()),
        "nonfinite_steps": 0,
        "first_nonfinite_step": None,
        "scaler_skips": 0,
        "status": "ok",
        "reason": None,
    }


def make_record(
    model: str = "DiT-S/8",
    precision: str = "fp32",
    grad_ckpt: str = "none",
    batch_size: int = 8,
    status: str = "ok",
    *,
    images_per_s: float | None = None,
    peak_alloc: float | None = None,
    peak_reserved: float | None = None,
    device_mem: float | None = None,
    samples: list[float] | None = None,
    n_samples: int = 20,
    noise: float = 0.01,
    sample_seed: int = 0,
    smoke_steps: int = 0,
    env: dict[str, Any] | None = None,
    started_at: datetime | str | None = None,
    suite: str = "synthetic",
    run_id: str = "run-a",
    suite_baseline: dict[str, Any] | None = None,
    reason: str | None = None,
    config: dict[str, Any] | None = None,
    **config_extra: Any,
) -> dict[str, Any]:
    """One result record as the runner writes it. Metrics default to the toy model; pass numbers to pin them.

    A cell with `gpu_memory_gib` or `card` ran on the env's GPU capped to that card (CONTEXT_GIB of
    CUDA context measured), as the runner emulates a card: `metrics.emulation`, and `fits_budget`
    True when it completed, False when it ran out of memory.
    """
    cfg = config or cell_config(
        model, precision, grad_ckpt, batch_size, smoke_steps=smoke_steps, **config_extra
    )
    env = dict(H200_ENV if env is None else env)
    device = cfg["device"]
    on_gpu = device == "cuda"
    if started_at is None:
        started_at = datetime(2026, 11, 29, 12, 0, tzinfo=timezone.utc)
    if isinstance(started_at, datetime):
        started_at = started_at.isoformat().replace("+00:00", "Z")
    record: dict[str, Any] = {
        "schema": "ditbench.result/1",
        "suite": suite,
        "run_id": run_id,
        "cell_id": cell_id(cfg),
        "cell_name": f"{cfg['model']} {cfg['precision']} ckpt={cfg['grad_ckpt']} bs={cfg['batch_size']}",
        "suite_baseline": {"precision": "fp32", "grad_ckpt": "none"}
        if suite_baseline is None
        else suite_baseline,
        "suite_overrides": {},
        "config": cfg,
        "status": status,
        "reason": reason,
        "metrics": None,
        "smoke": None,
        "env": env,
        "started_at": started_at,
        "duration_s": 12.5,
    }
    emulation = _emulation(cfg, env) if on_gpu else None
    if status != "ok":
        if reason is None:
            record["reason"] = {
                "oom": "out of memory: CUDA out of memory. Tried to allocate 2.00 GiB",
                "unsupported": "fp16 autocast needs CUDA",
                "skipped": "larger batch already ran out of memory",
                "error": "RuntimeError: boom",
                "timeout": "no result after 1800 s",
                "nan_loss": "loss is nan at step 3",
            }.get(status, status)
        # What the runner leaves on failed cells: a traceback on errors, memory at the time of an OOM.
        if status == "error":
            record["traceback"] = "Traceback (most recent call last):\n  ...\nRuntimeError: boom"
        if status == "oom" and on_gpu:
            reserved = 71.0 if emulation is None else emulation["allocator_cap_gib"]
            record["metrics"] = {
                "emulation": emulation,
                "peak_mem_allocated_gib": reserved - 0.8,
                "peak_mem_reserved_gib": reserved,
                "device_mem_gib": reserved + CONTEXT_GIB,
                "cpu_peak_rss_gib": 2.1,
                "alloc_retries": 1,
                **memory.fits(emulation, status),
            }
        return record
    m_img_s, m_alloc = modelled(
        cfg["model"], cfg["precision"], cfg["grad_ckpt"], cfg["batch_size"], cfg["image_size"]
    )
    img_s = m_img_s if images_per_s is None else images_per_s
    global_batch = cfg["global_batch"]
    median_ms = 1000.0 * global_batch / img_s
    if samples is None:
        samples = step_samples(median_ms, n_samples, noise, sample_seed) if n_samples else []
    if samples:
        median_ms = float(np.median(samples))
    gflop = gflop_per_image(cfg["model"], cfg["image_size"])
    alloc = (m_alloc if peak_alloc is None else peak_alloc) if on_gpu else None
    reserved = peak_reserved if peak_reserved is not None else (alloc * 1.04 if alloc is not None else None)
    nvml = (
        device_mem
        if device_mem is not None
        else (reserved + CONTEXT_GIB if reserved is not None and on_gpu else None)
    )
    tflops = img_s * gflop / 1000
    metrics: dict[str, Any] = {
        "emulation": emulation,
        "params": MODELS[cfg["model"]][3],
        "attention_kernel": "flash" if on_gpu else "math",
        "optimizer_kernel": "fused" if on_gpu else "foreach",
        "steps_per_s": img_s / global_batch,
        "images_per_s": img_s,
        "images_per_s_per_gpu": img_s / cfg["gpus"],
        "step_ms": {
            "median": median_ms,
            "p10": float(np.percentile(samples, 10)) if samples else None,
            "p90": float(np.percentile(samples, 90)) if samples else None,
            "samples": samples,
        },
        "measured_steps": len(samples),
        "window_s": sum(samples) / 1000.0,
        "timing": "cuda_events" if on_gpu else "perf_counter",
        "device": device,
        "model_flops_per_image": gflop * 1e9,
        "tflops_per_s": tflops,
        "mfu": {"value": tflops / 989.0, "peak_tflops": 989.0, "peak_basis": "datasheet"} if on_gpu else None,
        "scaling_efficiency": None,
        "loss_last": 0.52,
    }
    if samples:
        metrics.update(window_noise(samples, img_s, global_batch))
    metrics.update(
        peak_mem_allocated_gib=alloc,
        peak_mem_reserved_gib=reserved,
        device_mem_gib=nvml,
        cpu_peak_rss_gib=2.1,
    )
    if on_gpu:
        metrics["alloc_retries"] = 0
    else:
        metrics["cpu_peak_alloc_gib"] = m_alloc if peak_alloc is None else peak_alloc
        metrics["cpu_peak_alloc_basis"] = "CPU allocator peak of a fresh trainer's second step"
    metrics.update(memory.fits(emulation, status))
    record["metrics"] = metrics
    if cfg["smoke_steps"]:
        record["smoke"] = smoke_curve(cfg["smoke_steps"], seed=sample_seed)
    return record


def _emulation(cfg: dict[str, Any], env: dict[str, Any]) -> dict[str, Any] | None:
    """`metrics.emulation` of a cell run on the env's GPU capped to the config's card (None: no card)."""
    budget = cfg["gpu_memory_gib"]
    if budget is None:
        return None
    return {
        "card": cfg["card"],
        "budget_gib": budget,
        "context_gib": CONTEXT_GIB,
        "allocator_cap_gib": round(budget - CONTEXT_GIB, 4),
        "real_gpu": env.get("gpu_name") or "NVIDIA H200",
        "real_total_gib": env.get("gpu_memory_gib") or 139.8,
        "note": memory.NOTE,
    }


def make_matrix(
    models=("DiT-B/8", "DiT-L/4"),
    precisions=("fp32", "bf16", "fp16"),
    ckpts=("none", "full"),
    batches=(8, 16, 32),
    *,
    card_gib: float = 139.8,
    gpu_memory_gib: float | None = None,
    smoke_steps: int = 50,
    device: str = "cuda",
    env: dict[str, Any] | None = None,
    start: datetime | None = None,
    **kw: Any,
) -> list[dict[str, Any]]:
    """A full suite: cells that would not fit the card (`card_gib`, or the emulated `gpu_memory_gib`)
    are `oom`, fp16 on CPU is `unsupported`."""
    records = []
    start = start or datetime(2026, 11, 29, 12, 0, tzinfo=timezone.utc)
    limit = gpu_memory_gib if gpu_memory_gib is not None else card_gib
    for i, (model, precision, ckpt, bs) in enumerate(
        (m, p, c, b) for m in models for p in precisions for c in ckpts for b in batches
    ):
        is_baseline = precision == "fp32" and ckpt == "none"
        common = dict(
            smoke_steps=smoke_steps if is_baseline else 0,
            device=device,
            gpu_memory_gib=gpu_memory_gib,
            env=env if env is not None else (CPU_ENV if device == "cpu" else None),
            started_at=start + timedelta(seconds=15 * i),
            sample_seed=i,
        )
        common.update(kw)
        if device == "cpu" and precision == "fp16":
            records.append(make_record(model, precision, ckpt, bs, "unsupported", **common))
            continue
        _, alloc = modelled(model, precision, ckpt, bs)
        if device == "cuda" and alloc * 1.04 + CONTEXT_GIB > limit:
            records.append(make_record(model, precision, ckpt, bs, "oom", **common))
            continue
        records.append(make_record(model, precision, ckpt, bs, **common))
    return records


def write_jsonl(path, records, torn_tail: str | None = None) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, allow_nan=False) + "\n")
        if torn_tail:
            f.write(torn_tail)


def isclose(a: float, b: float, rel: float = 1e-9) -> bool:
    return math.isclose(a, b, rel_tol=rel)
