"""One cell, in whichever process measures it: the core every launcher runs. `measure` times the
window and turns any failure into a status; `smoke` trains the smoke curve; `quality` scores samples.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ditbench.bench.cell import memory, threads
from ditbench.bench.cell.gpu_meter import GpuMeter, nvml_handle, throttling
from ditbench.bench.cell.load import LoadMeter
from ditbench.bench.cell.mfu import mfu, model_flops_per_image
from ditbench.bench.cell.window import failed_smoke, measure_window, noise, smoke_run, step_stats
from ditbench.core.faults import FAULT_ENV, FAULT_RANK_ENV, Fault, FaultyStep, failure, fault_for
from ditbench.core.progress import progress
from ditbench.hardware.environment import collect_env
from ditbench.records.metrics import IMAGES_PER_S, MFU, PER_GPU, STEP_MS, STEPS_PER_S, TFLOPS
from ditbench.spec.cell import CellSpec

RANK_SEED_STRIDE = 1000  # rank r's data seed is seed + 1000 r: its own batches, the same model init


def log(text: str, ctx=None) -> None:
    """A line of the cell's log: its process's stdout is `<out>/logs/<cell_id>.log` (each rank's too)."""
    rank = f"rank {ctx.rank}: " if ctx is not None and ctx.distributed else ""
    print(f"{time.strftime('%H:%M:%S')} {rank}{text}", flush=True)


def log_failure(what: str, outcome: dict[str, Any], err: BaseException, ctx=None) -> None:
    """The failure's status and reason, then its traceback (the record keeps the reason only for most)."""
    log(f"{what} failed: {outcome['status']}: {outcome['reason']}", ctx)
    traceback.print_exception(err, file=sys.stdout)
    sys.stdout.flush()


@dataclass
class Measured:
    """What `measure` hands on: the result, and the context and steps the smoke run continues from."""

    result: dict[str, Any]
    ctx: Any = None  # the DistContext, once joined
    steps_run: int = 0  # warm-up + measured steps, so an injected fault's step counts on into the smoke run
    fault: Fault | None = None
    smoke_trainer: tuple[Any, float] | None = None  # (trainer, training seconds) for a quality evaluation


def build_trainer(spec: CellSpec, ctx):
    """The cell's Trainer on this process's device; in a job, the model wrapped for data parallelism."""
    from ditbench.hardware import dist
    from ditbench.train.step import Trainer

    knobs = spec.knobs
    if not ctx.distributed:
        return Trainer(knobs, device=str(ctx.device))
    return Trainer(
        knobs,
        device=str(ctx.device),
        data_seed=knobs.seed + RANK_SEED_STRIDE * ctx.rank,
        wrap_model=lambda m: dist.wrap_model(m, knobs.strategy, ctx),
    )


def agree_max(ctx) -> Callable[[int], int] | None:
    """The largest of every rank's value (each rank must run the same number of steps)."""
    if not ctx.distributed:
        return None

    def agree(value: int) -> int:
        import torch
        import torch.distributed as tdist

        t = torch.tensor([value], dtype=torch.long, device=ctx.device)
        tdist.all_reduce(t, op=tdist.ReduceOp.MAX)
        return int(t.item())

    return agree


def window_metrics(
    spec: CellSpec,
    window: dict[str, Any],
    ctx,
    gpu_name: str | None,
    load: dict[str, Any] | None = None,
    gpu: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Throughput, step times, FLOPs and MFU of this process's window (a rank's share in a job), the
    machine's `load` during it (cell.load) and what NVML saw of the GPU (`gpu`: cell.gpu_meter)."""
    knobs = spec.knobs
    steps_per_s = window["steps"] / window["wall_s"]
    # This process's images, every micro-batch's (batch_size x grad_accum a step); a job's parent sums ranks.
    rate = steps_per_s * spec.rank_batch
    flops = model_flops_per_image(knobs.model, knobs.image_size, knobs.impl, knobs.num_classes)
    tflops = flops * rate / 1e12 if flops else None
    out = {
        STEPS_PER_S.key: steps_per_s,
        IMAGES_PER_S.key: rate,
        PER_GPU.key: rate,
        STEP_MS.key: step_stats(window["step_ms"]),
        "measured_steps": window["steps"],
        "window_s": window["wall_s"],
        "timing": "cuda_events" if ctx.device.type == "cuda" else "perf_counter",
        "device": ctx.device.type,
        "model_flops_per_image": flops,
        TFLOPS.key: tflops,
        MFU.key: mfu(tflops, gpu_name, knobs.precision),
        "scaling_efficiency": None,
        "loss_last": window["last_loss"],
        "load": load,
        **(gpu or {}),
        **noise(
            window["step_ms"],
            rate,
            spec.rank_batch,
            (load or {}).get("other_cpu_share"),
            throttling((gpu or {}).get("gpu_window")),
        ),
    }
    if ctx.distributed:
        import torch

        out.update(world_size=ctx.world_size, strategy=knobs.strategy, backend=ctx.backend)
        out["threads_per_rank"] = torch.get_num_threads()
    return out


def measure(spec: CellSpec, cell_name: str, join: Callable[[], Any]) -> Measured:
    """Join (pick the device / the process group), build, warm up, measure. Never raises."""
    out = Measured({"status": "error", "reason": None, "metrics": None, "smoke": None, "env": None})
    metrics: dict[str, Any] = {}
    emulation = None
    try:
        threads.apply(spec.knobs.threads, spec.device)  # before the process group and the trainer
        out.ctx = ctx = join()
        out.result["env"] = collect_env() if ctx.local_rank == 0 else None
        out.fault = fault_for(cell_name, os.environ.get(FAULT_ENV), ctx.rank, os.environ.get(FAULT_RANK_ENV))
        device = ctx.device.type
        log(f"cell {cell_name}: building the trainer on {ctx.device}", ctx)
        if spec.gpu_memory_gib is not None:  # a suite emulates a card only on CUDA (it refuses it on a CPU)
            emulation = memory.apply_emulation(spec.gpu_memory_gib, spec.card, ctx.device)
        metrics["emulation"] = emulation
        trainer = build_trainer(spec, ctx)
        step = FaultyStep(trainer, out.fault)
        metrics["params"] = int(trainer.num_params)
        metrics["attention_kernel"] = trainer.attention_kernel  # what `attention` ran (sdpa: torch's pick)
        metrics["optimizer_kernel"] = trainer.optimizer_kernel  # what `optimizer_impl` ran (auto: by device)
        s = spec.steps
        log(f"{metrics['params']:,} parameters; warm-up: {s.warmup} steps", ctx)

        # a rank's tree is its launcher's (torchrun's agent): its sibling ranks are not "other processes"
        load = LoadMeter(os.getppid() if ctx.distributed else None)
        nvml = nvml_handle(ctx.device.index) if device == "cuda" else None
        gpu_meter = GpuMeter(*(nvml or (None, None)))

        def after_warmup() -> None:
            memory.reset_peaks(device)
            log(f"window: at least {s.measure} steps and {s.min_seconds:g} s", ctx)
            load.start()
            gpu_meter.start()

        window = measure_window(
            trainer,
            step,
            device,
            s.warmup,
            s.measure,
            s.min_seconds,
            agree=agree_max(ctx),
            after_warmup=after_warmup,
        )
        window_load = load.stop()
        window_gpu = gpu_meter.stop(window["steps"], window["steps"] * spec.rank_batch)
        out.steps_run = step.count
        median = step_stats(window["step_ms"])["median"]
        log(
            f"window: {window['steps']} steps in {window['wall_s']:.2f} s, median step {median:.1f} ms, "
            f"last loss {window['last_loss']:.4f}",
            ctx,
        )
        gpu_name = (out.result["env"] or {}).get("gpu_name") if device == "cuda" else None
        if device == "cuda" and gpu_name is None:
            import torch

            gpu_name = torch.cuda.get_device_name(ctx.device)
        metrics.update(window_metrics(spec, window, ctx, gpu_name, window_load, window_gpu))
        metrics.update(memory.peak_metrics(device))
        if device == "cpu" and not ctx.distributed:  # after the window (the profiler slows steps)
            del step, trainer  # gone before the meter starts: it counts what is allocated after
            log("allocator peak: a fresh trainer's second step under the profiler", ctx)
            metrics.update(memory.cpu_allocator_peak(lambda: build_trainer(spec, ctx)))
        out.result["status"] = "ok"
        log(f"measured: {metrics[IMAGES_PER_S.key]:.3g} img/s", ctx)
    except Exception as err:  # noqa: BLE001 - any failure is this cell's status, not the suite's
        out.result.update(failure(err))
        log_failure("the measurement", out.result, err, ctx)
        if out.ctx is not None and out.ctx.device.type == "cuda":
            try:  # how far memory got before the failure
                metrics.update(memory.peak_metrics("cuda"))
            except Exception:  # noqa: BLE001
                pass
    if metrics:
        metrics.update(memory.fits(emulation, out.result["status"]))
    out.result["metrics"] = metrics or None
    return out


def smoke(spec: CellSpec, measured: Measured, agree_stop: Callable[[bool], bool] | None = None) -> dict:
    """A fresh Trainer trained `smoke_steps` steps, loss every step. Its failure (an out-of-memory
    included) is the smoke field's status: the measurement stands, the cell stays ok, its series runs on."""
    import torch

    ctx, steps = measured.ctx, spec.smoke_steps
    gc.collect()
    if ctx.device.type == "cuda":
        torch.cuda.empty_cache()
    if spec.knobs.compile:
        torch._dynamo.reset()  # a second compiled model must not reuse (or be limited by) the first's cache
    fault = measured.fault
    if fault is not None:
        left = fault.step - measured.steps_run
        if fault.kind == "slow":  # lasts: the smoke run is slowed from its first step on, or from `left`
            fault = dataclasses.replace(fault, step=max(1, left))
        else:
            fault = dataclasses.replace(fault, step=left) if left >= 1 else None
    log(f"smoke run: {steps} steps", ctx)
    # the log is not a terminal: a plain line every DITBENCH_PROGRESS_EVERY_S seconds and at the end
    desc = f"rank {ctx.rank}: smoke" if ctx.distributed else "smoke"
    bar = progress(total=steps, unit="step", desc=desc, leave=False)
    try:
        trainer = build_trainer(spec, ctx)
        start = time.perf_counter()
        faulty = FaultyStep(trainer, fault)

        def counted(batch):
            loss = faulty(batch)
            bar.update(1)
            return loss

        curve = smoke_run(trainer, counted, steps, agree_stop)  # reads every loss: synced
        bar.close()
        log(
            f"smoke run: loss {curve['first_mean']:.4f} (first steps) -> {curve['last_mean']:.4f} (last)", ctx
        )
        if spec.quality is not None and spec.quality.at_smoke_end:
            measured.smoke_trainer = (trainer, time.perf_counter() - start)
        return curve
    except Exception as err:  # noqa: BLE001 - recorded in the smoke field
        bar.close()
        outcome = failure(err)
        log_failure("the smoke run", outcome, err, ctx)
        return failed_smoke(steps, outcome, err)


def quality(spec: CellSpec, measured: Measured, about: dict[str, Any]) -> dict:
    """The record's `quality` field, at the end of the smoke run or at each step of a quality run.
    Never raises for the cell's own failures. `about`: the spec's cell_id and out_dir."""
    from ditbench.quality.loop import run_quality

    smoke_trainer, measured.smoke_trainer = measured.smoke_trainer, None
    gc.collect()
    log("quality: sampling and evaluating", measured.ctx)
    return run_quality(
        spec,
        measured.ctx,
        build_trainer,
        smoke=smoke_trainer,
        out_dir=about.get("out_dir"),
        cell_id=str(about.get("cell_id") or "cell"),
    )
