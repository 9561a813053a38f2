"""One rank of a multi-process cell, started by torchrun.

    python -m torch.distributed.run ... -m ditbench.bench.rank_worker SPEC.json REPORT_DIR

Every rank joins the process group (NCCL on GPUs, gloo on CPU), builds the cell's Trainer with
the model wrapped for data parallelism (`strategy`: ddp or fsdp), and runs the same measured
window as a one-GPU cell (the runner's `measure_window`), with a per-rank batch of `batch_size`
(global batch = batch_size x world size). All ranks must run the same number of steps, or a
collective would wait forever: the window is `measure` steps, and if that was shorter than
`min_seconds` every rank adds the largest number of extra steps any rank needs.

Each rank writes `REPORT_DIR/rank<R>.json` (its metrics, or its error with the time it failed);
every node's local rank 0 also writes every rank's metrics (gathered) into `REPORT_DIR/ranks.json`. The parent
(`ditbench.bench.torchrun`) turns those into the cell's record.

Fault injection: the runner's DITBENCH_INJECT_FAULT applies; with DITBENCH_INJECT_FAULT_RANK=R
only rank R gets the fault (to test that one failing rank fails the cell cleanly).
"""

from __future__ import annotations

import json
import math
import os
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

FAULT_RANK_ENV = "DITBENCH_INJECT_FAULT_RANK"


def _watch_parent(poll_s: float = 0.5) -> None:
    """Exit when torchrun dies (e.g. SIGKILLed on a timeout): a rank must never outlive its launcher."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(poll_s)
            if os.getppid() != parent:
                os._exit(3)

    threading.Thread(target=watch, name="ditbench-parent-watch", daemon=True).start()


def _write_json(path: Path, data: dict[str, Any]) -> None:
    from ditbench.bench.worker import write_result

    write_result(path, data)


def build_trainer(config: dict[str, Any], ctx, strategy: str):
    """The cell's Trainer on this rank's device, its model wrapped for data parallelism."""
    from ditbench import dist
    from ditbench.bench.spec import CellSpec
    from ditbench.train import TrainConfig, Trainer

    knobs = CellSpec.from_record_config(config).knobs
    # Same model init on every rank (DDP also broadcasts rank 0's), but each rank its own data.
    cfg = TrainConfig.from_knobs(knobs, device=str(ctx.device), data_seed=knobs.seed + 1000 * ctx.rank)
    return Trainer(cfg, wrap_model=lambda m: dist.wrap_model(m, strategy, ctx))


def measured_window(trainer, step, ctx, steps: dict[str, Any]) -> dict[str, Any]:
    """`measure` steps, then (if under min_seconds) the same number of extra steps on every rank."""
    import torch
    import torch.distributed as tdist

    from ditbench.bench.worker import measure_window

    device = ctx.device.type
    first = measure_window(trainer, step, device, int(steps["warmup"]), int(steps["measure"]), 0.0)
    extra = 0
    min_s = float(steps.get("min_seconds") or 0.0)
    if first["wall_s"] < min_s and first["steps"]:
        per_step = first["wall_s"] / first["steps"]
        extra = math.ceil((min_s - first["wall_s"]) / max(per_step, 1e-9))
    if ctx.distributed:
        t = torch.tensor([extra], dtype=torch.long, device=ctx.device)
        tdist.all_reduce(t, op=tdist.ReduceOp.MAX)
        extra = int(t.item())
    if extra <= 0:
        return first
    # measure_window resets the CUDA peak counters: keep the first part's peaks to merge them.
    peaks = (
        (torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()) if device == "cuda" else None
    )
    more = measure_window(trainer, step, device, 0, extra, 0.0)
    return {
        "steps": first["steps"] + more["steps"],
        "wall_s": first["wall_s"] + more["wall_s"],
        "step_ms": first["step_ms"] + more["step_ms"],
        "last_loss": more["last_loss"],
        "earlier_peaks": peaks,
    }


def rank_metrics(config: dict[str, Any], ctx, trainer, window: dict[str, Any], gpu_name: str | None) -> dict:
    import torch

    from ditbench.bench.measure import mfu, model_flops_per_image, step_stats
    from ditbench.bench.worker import memory_metrics

    steps_per_s = window["steps"] / window["wall_s"]
    images_per_s = steps_per_s * int(config["batch_size"])  # this rank's share; the parent sums
    flops = model_flops_per_image(
        config["model"], config["image_size"], config["impl"], config.get("num_classes", 1000)
    )
    tflops = flops * images_per_s / 1e12 if flops else None
    metrics = {
        "params": int(trainer.num_params),
        "steps_per_s": steps_per_s,
        "images_per_s": images_per_s,
        "step_ms": step_stats(window["step_ms"]),
        "measured_steps": window["steps"],
        "window_s": window["wall_s"],
        "timing": "cuda_events" if ctx.device.type == "cuda" else "perf_counter",
        "device": ctx.device.type,
        "model_flops_per_image": flops,
        "tflops_per_s": tflops,
        "mfu": mfu(tflops, gpu_name, config["precision"]),
        "loss_last": window["last_loss"],
        "world_size": ctx.world_size,
        "strategy": config.get("strategy", "ddp"),
        "backend": ctx.backend,
        "threads_per_rank": torch.get_num_threads(),
    }
    metrics.update(memory_metrics(ctx.device.type, config.get("gpu_memory_gb")))
    if window.get("earlier_peaks"):
        alloc, reserved = (round(x / 2**30, 4) for x in window["earlier_peaks"])
        metrics["peak_mem_allocated_gib"] = max(metrics["peak_mem_allocated_gib"] or 0.0, alloc)
        metrics["peak_mem_reserved_gib"] = max(metrics["peak_mem_reserved_gib"] or 0.0, reserved)
    return metrics


def run_rank(spec: dict[str, Any], report_dir: Path) -> int:
    import torch

    from ditbench import dist
    from ditbench.bench.envinfo import collect_env
    from ditbench.bench.worker import (
        FAULT_ENV,
        FaultyStep,
        NonFiniteLoss,
        apply_memory_cap,
        parse_faults,
        smoke_run,
    )
    from ditbench.errors import UnsupportedError, UserError

    config, cell_name = spec["config"], spec["cell_name"]
    rank = int(os.environ.get("RANK", "0"))
    report: dict[str, Any] = {"rank": rank, "status": "error", "reason": None, "metrics": None}
    ctx = None
    try:
        device = config.get("device", "auto")
        ctx = dist.init(device)
        report["world_size"] = ctx.world_size
        env = collect_env() if ctx.local_rank == 0 else None
        fault_rank = os.environ.get(FAULT_RANK_ENV)
        fault = parse_faults(os.environ.get(FAULT_ENV), cell_name)
        if fault_rank not in (None, "") and int(fault_rank) != ctx.rank:
            fault = None
        extra: dict[str, Any] = {}
        if ctx.device.type == "cuda":
            extra.update(apply_memory_cap(config.get("gpu_memory_gb")))
        strategy = config.get("strategy", "ddp")
        trainer = build_trainer(config, ctx, strategy)
        step = FaultyStep(trainer, fault)
        window = measured_window(trainer, step, ctx, config["steps"])
        gpu_name = torch.cuda.get_device_name(ctx.device) if ctx.device.type == "cuda" else None
        metrics = rank_metrics(config, ctx, trainer, window, gpu_name)
        metrics.update(extra)
        smoke = None
        if config.get("smoke_steps"):
            del trainer, step
            trainer = build_trainer(config, ctx, strategy)
            smoke = smoke_run(trainer, FaultyStep(trainer, None), int(config["smoke_steps"]), 0)
        report.update(status="ok", metrics=metrics)
        _write_json(report_dir / f"rank{ctx.rank}.json", report)
        gathered = dist.all_gather_objects(ctx, metrics)
        # Every node's local rank 0 writes the gathered metrics: c10d rendezvous gives global rank 0
        # to whichever node arrives first, and the node that records the cell is --node-rank 0.
        if ctx.local_rank == 0:
            _write_json(
                report_dir / "ranks.json",
                {
                    "world_size": ctx.world_size,
                    "nodes": ctx.nodes,
                    "metrics": gathered,
                    "smoke": smoke,
                    "env": env,
                },
            )
        dist.barrier(ctx)
        dist.shutdown()
        return 0
    except NonFiniteLoss as err:
        report.update(status="nan_loss", reason=str(err))
    except torch.OutOfMemoryError as err:
        report.update(status="oom", reason="out of memory: " + " ".join(str(err).split())[:300])
    except UnsupportedError as err:
        report.update(status="unsupported", reason=" ".join(str(err).split()))
    except UserError as err:
        report.update(status="error", reason=" ".join(str(err).split()))
    except Exception as err:  # noqa: BLE001 - this rank's failure becomes the cell's reason
        report.update(
            status="error", reason=f"{type(err).__name__}: {err}", traceback=traceback.format_exc()[-4000:]
        )
    report["failed_at"] = time.time()  # the first rank to fail is the cause; its peers fail after it
    if ctx is not None:
        report["world_size"] = ctx.world_size
    _write_json(report_dir / f"rank{report['rank']}.json", report)
    print(
        f"ditbench rank {report['rank']}: {report['status']}: {report['reason']}", file=sys.stderr, flush=True
    )
    if report.get("traceback"):
        print(report["traceback"], file=sys.stderr, flush=True)
    # No process-group teardown: peers may be stuck in a collective, and torchrun stops them.
    os._exit(1)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: torchrun ... -m ditbench.bench.rank_worker SPEC.json REPORT_DIR", file=sys.stderr)
        return 2
    _watch_parent()
    spec = json.loads(Path(argv[0]).read_text())
    report_dir = Path(argv[1])
    report_dir.mkdir(parents=True, exist_ok=True)
    return run_rank(spec, report_dir)


if __name__ == "__main__":
    sys.exit(main())
