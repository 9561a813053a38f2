"""A cell's memory: the peaks it reached, and the smaller card it emulates on a bigger one: the caching
allocator capped at that card's memory less this process's CUDA context. Its speeds are the real GPU's.
"""

from __future__ import annotations

import gc
import os
import resource
import sys
from typing import Any

from ditbench.bench.cell.alloc_meter import measure_training_peak
from ditbench.bench.cell.gpu_meter import nvml_handle
from ditbench.core.errors import UnsupportedError
from ditbench.records.metrics import CPU_ALLOC, CPU_RSS, DEVICE_MEM, PEAK_ALLOCATED, PEAK_RESERVED

GIB = 2**30
NOTE = "speeds are the real GPU's, not the emulated card's"


def peak_rss_gib() -> float:
    # ru_maxrss is KiB on Linux (bytes on macOS); the process is fresh, so this is the cell's own peak
    scale = 1 if sys.platform == "darwin" else 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / GIB


def nvml_process_mem_gib() -> float | None:
    """This process's device memory as NVML sees it (includes the CUDA context); None if unavailable."""
    found = nvml_handle()
    if found is None:
        return None
    nvml, handle = found
    try:
        for proc in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if proc.pid == os.getpid() and proc.usedGpuMemory is not None:
                return proc.usedGpuMemory / GIB
    except Exception:  # noqa: BLE001 - NVML is optional (package, driver, container pid namespace)
        return None
    return None


def cpu_allocator_peak(make_trainer) -> dict[str, Any]:
    """{CPU allocator peak (GiB), its basis}: a fresh trainer's second step under cell.alloc_meter.
    A failure here never fails the cell: the value is null and the basis says why."""
    gc.collect()
    try:
        peak = measure_training_peak(make_trainer, warmup_steps=1, steps=1)
    except Exception as err:  # noqa: BLE001 - a missing figure, not a failed cell
        why = f"not measured: {type(err).__name__}: {err}"[:300]
        return {CPU_ALLOC.key: None, "cpu_peak_alloc_basis": why}
    return {
        CPU_ALLOC.key: round(peak.peak_gib, 6),
        "cpu_peak_alloc_basis": "CPU allocator peak of a fresh trainer's second step (profiler events), "
        "measured after the timed window",
    }


def reset_peaks(device_type: str) -> None:
    if device_type == "cuda":
        import torch

        torch.cuda.reset_peak_memory_stats()


def peak_metrics(device_type: str) -> dict[str, Any]:
    """Peak allocated / reserved (allocator, since the last reset), NVML's view, the CPU's RSS."""
    out: dict[str, Any] = {m.key: None for m in (PEAK_ALLOCATED, PEAK_RESERVED, DEVICE_MEM)}
    out[CPU_RSS.key] = round(peak_rss_gib(), 4)
    if device_type == "cuda":
        import torch

        out[PEAK_ALLOCATED.key] = round(torch.cuda.max_memory_allocated() / GIB, 4)
        out[PEAK_RESERVED.key] = round(torch.cuda.max_memory_reserved() / GIB, 4)
        out["alloc_retries"] = torch.cuda.memory_stats().get("num_alloc_retries", 0)
        nvml = nvml_process_mem_gib()
        out[DEVICE_MEM.key] = round(nvml, 4) if nvml is not None else None
    return out


# -- Card emulation --


def allocator_cap_gib(budget_gib: float, context_gib: float, total_gib: float) -> float:
    """The allocator's share of an emulated card: its memory less the CUDA context this process holds."""
    if budget_gib > total_gib:
        raise UnsupportedError(
            f"cannot emulate a card of {budget_gib:g} GiB on this GPU of {total_gib:.2f} GiB: emulation "
            "caps a bigger card, it cannot add memory"
        )
    cap = budget_gib - context_gib
    if cap <= 0:
        raise UnsupportedError(
            f"the CUDA context alone takes {context_gib:.2f} GiB, the whole emulated {budget_gib:g} GiB"
        )
    return cap


def apply_emulation(budget_gib: float | None, card: str | None, device) -> dict[str, Any] | None:
    """Cap the allocator to emulate the card; the record's `metrics.emulation`, or None (no emulation).
    Call it right after CUDA starts: what the device holds then is this process's context."""
    if budget_gib is None:
        return None
    import torch

    free, total = torch.cuda.mem_get_info(device)
    used_gib = (total - free) / GIB
    own_gib = nvml_process_mem_gib()  # this process alone: another's context is not this card's
    context_gib = own_gib if own_gib is not None and own_gib <= used_gib else used_gib
    cap_gib = allocator_cap_gib(budget_gib, context_gib, total / GIB)
    torch.cuda.set_per_process_memory_fraction(min(1.0, cap_gib * GIB / total), device)
    return {
        "card": card,
        "budget_gib": budget_gib,
        "context_gib": round(context_gib, 4),
        "allocator_cap_gib": round(cap_gib, 4),
        "real_gpu": torch.cuda.get_device_name(device),
        "real_total_gib": round(total / GIB, 4),
        "note": NOTE,
    }


def fits(emulation: dict[str, Any] | None, status: str) -> dict[str, Any]:
    """{fits_budget, fits_basis}: whether the cell completed under the emulated card's cap."""
    if emulation is None:
        return {
            "fits_budget": None,
            "fits_basis": "no card emulated (the suite sets neither card nor gpu_memory_gib)",
        }
    card = emulation["card"] or f"{emulation['budget_gib']:g} GiB card"
    cap = (
        f"the allocator cap of {emulation['allocator_cap_gib']:.2f} GiB (the {card}'s "
        f"{emulation['budget_gib']:g} GiB less the {emulation['context_gib']:.2f} GiB CUDA context)"
    )
    if status == "ok":
        return {"fits_budget": True, "fits_basis": f"completed warm-up and the measured window under {cap}"}
    if status == "oom":
        return {"fits_budget": False, "fits_basis": f"ran out of memory under {cap}"}
    return {
        "fits_budget": None,
        "fits_basis": f"unknown: the cell ended {status}, not by running out of memory",
    }
