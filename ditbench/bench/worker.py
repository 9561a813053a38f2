"""One cell, in its own fresh process: build the trainer, warm up, measure a window, optionally smoke-train.

Run by the runner as `python -m ditbench.bench.worker SPEC.json RESULT.json`. The result (status,
reason, metrics, smoke, env) is written atomically to RESULT.json; anything the worker cannot
report itself (a hang, a segfault, the kernel's OOM killer) the runner records from the outside.

Fault injection for tests and for trying a suite's failure handling:
`DITBENCH_INJECT_FAULT="<cell-name substring>=<kind>[@step][,...]"` with kind one of
  raise  the step raises RuntimeError            -> status error
  hang   the step sleeps forever                  -> status timeout (the runner kills it)
  oom    the step raises torch.OutOfMemoryError   -> status oom
  nan    the model's weights are set to NaN, so the real forward pass gives a non-finite loss
                                                  -> status nan_loss
`@step` is the 1-based training step (warm-up, measured and smoke steps counted together) at which
the fault fires; default 1. Example: DITBENCH_INJECT_FAULT="bs=16=oom,ckpt=full=nan@3".
"""

from __future__ import annotations

import gc
import json
import math
import os
import resource
import sys
import time
import traceback
from pathlib import Path
from typing import Any

FAULT_ENV = "DITBENCH_INJECT_FAULT"
FAULT_KINDS = ("raise", "hang", "oom", "nan")


class NonFiniteLoss(Exception):
    def __init__(self, step: int, phase: str, value: float):
        super().__init__(f"loss became non-finite ({value}) at {phase} step {step}")
        self.step, self.phase, self.value = step, phase, value
        self.curve: list[float] = []


def parse_faults(text: str | None, cell_name: str) -> tuple[str, int] | None:
    """The fault for this cell from DITBENCH_INJECT_FAULT, as (kind, step), or None."""
    if not text:
        return None
    for item in text.split(","):
        if not item.strip():
            continue
        substring, sep, action = item.rpartition("=")
        kind, _, at = action.partition("@")
        if not sep or kind not in FAULT_KINDS:
            raise ValueError(
                f"{FAULT_ENV} item {item!r}: expected '<cell-name substring>=<kind>[@step]' with "
                f"kind one of {', '.join(FAULT_KINDS)}"
            )
        if substring in cell_name:
            return kind, int(at) if at else 1
    return None


class FaultyStep:
    """Wraps trainer.step so an injected fault happens inside a real training step."""

    def __init__(self, trainer, fault: tuple[str, int] | None):
        self.trainer, self.fault, self.count = trainer, fault, 0

    def __call__(self, batch):
        import torch

        self.count += 1
        if self.fault and self.count == self.fault[1]:
            kind = self.fault[0]
            if kind == "raise":
                raise RuntimeError(f"injected fault ({FAULT_ENV}): raise at step {self.count}")
            if kind == "hang":
                while True:
                    time.sleep(1)
            if kind == "oom":
                raise torch.OutOfMemoryError(
                    f"CUDA out of memory (injected by {FAULT_ENV} at step {self.count})"
                )
            if kind == "nan":
                with torch.no_grad():
                    for p in self.trainer.model.parameters():
                        p.fill_(math.nan)
        return self.trainer.step(batch)


# ---------------------------------------------------------------------------------------------


def build_trainer(config: dict[str, Any], device: str):
    from ditbench.bench.spec import CellSpec
    from ditbench.train import TrainConfig, Trainer

    knobs = CellSpec.from_record_config(config).knobs
    return Trainer(TrainConfig.from_knobs(knobs, device=device))


def _sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def _check_finite(losses: list, first_step: int, phase: str) -> None:
    import torch

    if not losses:
        return
    values = torch.stack([x.detach().float().reshape(()) for x in losses]).cpu()
    bad = (~torch.isfinite(values)).nonzero()
    if len(bad):
        i = int(bad[0])
        raise NonFiniteLoss(first_step + i, phase, float(values[i]))


def measure_window(
    trainer, step, device: str, warmup: int, measure: int, min_seconds: float
) -> dict[str, Any]:
    """Warm-up, then at least `measure` steps and at least `min_seconds`: per-step times and a wall window."""
    import torch

    cuda = device == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    losses = []
    for _ in range(warmup):
        losses.append(step(trainer.next_batch()))
    _sync(device)
    _check_finite(losses, 1, "warm-up")

    losses, step_ms, events = [], [], []
    gc.collect()
    gc.disable()  # a collection inside the window is a stall that belongs to no step
    try:
        start = time.perf_counter()
        n = 0
        while n < measure or time.perf_counter() - start < min_seconds:
            if cuda:
                begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                begin.record()
                losses.append(step(trainer.next_batch()))
                end.record()
                events.append((begin, end))
            else:
                t0 = time.perf_counter()
                losses.append(step(trainer.next_batch()))
                step_ms.append((time.perf_counter() - t0) * 1e3)
            n += 1
        _sync(device)  # one synchronisation for the whole window
        wall = time.perf_counter() - start
    finally:
        gc.enable()
    if cuda:
        step_ms = [b.elapsed_time(e) for b, e in events]
    _check_finite(losses, warmup + 1, "measured")
    return {"steps": n, "wall_s": wall, "step_ms": step_ms, "last_loss": float(losses[-1])}


def smoke_run(trainer, step, steps: int) -> dict[str, Any]:
    """N steps with the loss read every step; stops at the first non-finite loss."""
    curve: list[float] = []
    for i in range(steps):
        value = float(step(trainer.next_batch()))
        if not math.isfinite(value):
            err = NonFiniteLoss(i + 1, "smoke", value)
            err.curve = curve  # the record keeps the curve up to the failure
            raise err
        curve.append(value)
    window = min(50, len(curve))
    return {
        "steps": steps,
        "loss": [round(x, 6) for x in curve],
        "first_mean": sum(curve[:window]) / window if window else None,
        "last_mean": sum(curve[-window:]) / window if window else None,
        "nonfinite_steps": 0,
        "first_nonfinite_step": None,
        "scaler_skips": int(getattr(trainer, "scaler_skips", 0) or 0),
    }


# ---------------------------------------------------------------------------------------------
# Memory
# ---------------------------------------------------------------------------------------------


def cpu_peak_rss_gib() -> float:
    # ru_maxrss is KiB on Linux (bytes on macOS); the process is fresh, so this is the cell's own peak
    scale = 1 if sys.platform == "darwin" else 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 2**30


def nvml_process_mem_gib() -> float | None:
    """This process's device memory as NVML sees it (includes the CUDA context); None if unavailable."""
    try:
        import pynvml
        import torch

        pynvml.nvmlInit()
        uuid = str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)
        handle = pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else "GPU-" + uuid)
        for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if proc.pid == os.getpid() and proc.usedGpuMemory is not None:
                return proc.usedGpuMemory / 2**30
    except Exception:  # noqa: BLE001 - NVML is optional (package, driver, container pid namespace)
        return None
    return None


def memory_metrics(device: str, budget_gib: float | None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "peak_mem_allocated_gib": None,
        "peak_mem_reserved_gib": None,
        "device_mem_gib": None,
        "cpu_peak_rss_gib": round(cpu_peak_rss_gib(), 4),
        "fits_budget": None,
    }
    if device == "cuda":
        import torch

        stats = torch.cuda.memory_stats()
        out["peak_mem_allocated_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 4)
        out["peak_mem_reserved_gib"] = round(torch.cuda.max_memory_reserved() / 2**30, 4)
        out["alloc_retries"] = stats.get("num_alloc_retries", 0)
        nvml = nvml_process_mem_gib()
        out["device_mem_gib"] = round(nvml, 4) if nvml is not None else None
        if budget_gib is not None:
            used = max(out["peak_mem_reserved_gib"], nvml or 0.0)
            out["fits_budget"] = used <= budget_gib
    return out


def apply_memory_cap(budget_gib: float | None) -> dict[str, Any]:
    """Cap the caching allocator to emulate a smaller card; say what was applied."""
    import torch

    if budget_gib is None:
        return {}
    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    fraction = budget_gib * 2**30 / total
    if fraction >= 1.0:
        return {"memory_cap": f"none: the card ({total / 2**30:.1f} GiB) is not larger than {budget_gib} GiB"}
    torch.cuda.set_per_process_memory_fraction(fraction)
    return {"memory_cap": f"allocator capped at {budget_gib} GiB ({fraction:.4f} of {total / 2**30:.1f} GiB)"}


# ---------------------------------------------------------------------------------------------


def run_cell(config: dict[str, Any], cell_name: str) -> dict[str, Any]:
    """Everything the worker measures for one cell; never raises (failures become a status)."""
    import torch

    from ditbench.bench.envinfo import collect_env
    from ditbench.bench.measure import mfu, model_flops_per_image, step_stats
    from ditbench.device import resolve_device
    from ditbench.errors import UnsupportedError, UserError

    result: dict[str, Any] = {"status": "error", "reason": None, "metrics": None, "smoke": None, "env": None}
    metrics: dict[str, Any] = {}
    device = "cpu"
    try:
        result["env"] = collect_env()
        fault = parse_faults(os.environ.get(FAULT_ENV), cell_name)
        device = resolve_device(config["device"]).type
        if config["gpus"] * config["nodes"] > 1:
            raise UnsupportedError("multi-GPU cells need the torchrun launcher, which this version lacks")
        if device == "cuda":
            torch.cuda.set_device(0)
            metrics.update(apply_memory_cap(config.get("gpu_memory_gb")))
        trainer = build_trainer(config, device)
        step = FaultyStep(trainer, fault)
        metrics["params"] = int(trainer.num_params)
        steps = config["steps"]
        window = measure_window(
            trainer, step, device, steps["warmup"], steps["measure"], steps["min_seconds"]
        )
        steps_per_s = window["steps"] / window["wall_s"]
        images_per_s = steps_per_s * config["global_batch"]
        gpus = config["gpus"] * config["nodes"]
        flops = model_flops_per_image(
            config["model"], config["image_size"], config["impl"], config.get("num_classes", 1000)
        )
        tflops = flops * images_per_s / 1e12 if flops else None
        gpu_name = result["env"]["gpu_name"] if device == "cuda" else None
        metrics.update(
            {
                "steps_per_s": steps_per_s,
                "images_per_s": images_per_s,
                "images_per_s_per_gpu": images_per_s / gpus,
                "step_ms": step_stats(window["step_ms"]),
                "measured_steps": window["steps"],
                "window_s": window["wall_s"],
                "timing": "cuda_events" if device == "cuda" else "perf_counter",
                "device": device,
                "model_flops_per_image": flops,
                "tflops_per_s": tflops,
                "mfu": mfu(tflops / gpus if tflops else None, gpu_name, config["precision"]),
                "scaling_efficiency": None,
                "loss_last": window["last_loss"],
            }
        )
        metrics.update(memory_metrics(device, config.get("gpu_memory_gb")))
        if config.get("smoke_steps"):
            del trainer, step
            gc.collect()
            if device == "cuda":
                torch.cuda.empty_cache()
            trainer = build_trainer(config, device)  # fresh weights: the curve starts at step 1
            fault_left = None
            if fault and fault[1] > steps["warmup"] + window["steps"]:
                fault_left = (fault[0], fault[1] - steps["warmup"] - window["steps"])
            result["smoke"] = smoke_run(trainer, FaultyStep(trainer, fault_left), config["smoke_steps"])
        result["status"] = "ok"
    except NonFiniteLoss as err:
        result["status"], result["reason"] = "nan_loss", str(err)
        if err.phase == "smoke":
            result["smoke"] = {
                "steps": config.get("smoke_steps"),
                "loss": [round(x, 6) for x in err.curve],
                "nonfinite_steps": 1,
                "first_nonfinite_step": err.step,
            }
    except torch.OutOfMemoryError as err:
        result["status"] = "oom"
        result["reason"] = "out of memory: " + " ".join(str(err).split())[:300]
        if config.get("gpu_memory_gb") is not None:
            metrics["fits_budget"] = False
    except UnsupportedError as err:
        result["status"], result["reason"] = "unsupported", " ".join(str(err).split())
    except UserError as err:
        result["status"], result["reason"] = "error", " ".join(str(err).split())
    except Exception as err:  # noqa: BLE001 - any other failure is this cell's error, not the suite's
        result["status"] = "error"
        result["reason"] = f"{type(err).__name__}: {err}"
        result["traceback"] = traceback.format_exc()[-4000:]
    if result["status"] != "ok" and device == "cuda":
        try:
            metrics.update({k: v for k, v in memory_metrics(device, None).items() if k != "fits_budget"})
        except Exception:  # noqa: BLE001
            pass
    result["metrics"] = metrics or None
    return result


def write_result(path: str | Path, data: dict[str, Any]) -> None:
    """A cell's (or rank's) result file, whole or not at all; NaN/inf written as null."""
    from ditbench.fileio import write_json_atomic

    write_json_atomic(path, _clean(data), default=str, allow_nan=False)


def _clean(data: Any) -> Any:
    """NaN/inf are not JSON: write them as null."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {k: _clean(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_clean(v) for v in data]
    return data


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m ditbench.bench.worker SPEC.json RESULT.json", file=sys.stderr)
        return 2
    spec = json.loads(Path(argv[0]).read_text())
    result = run_cell(spec["config"], spec["cell_name"])
    write_result(argv[1], result)
    if result.get("traceback"):
        print(result["traceback"], file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
