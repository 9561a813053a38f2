"""The GPU during a measured window, from NVML: clocks, throttle reasons, temperature, power, energy.
A thread samples the card (NVML calls leave the GIL). Clocks lowered for heat or power make the window
`noisy`; without NVML, or for a reading the card does not support, the record holds no field.
"""

from __future__ import annotations

import statistics
import threading
from typing import Any

from ditbench.records.metrics import ENERGY_PER_IMAGE, ENERGY_PER_STEP

SAMPLE_INTERVAL_S = 0.1
# NVML's clock-event reason bits (nvml.h, nvmlClocksEventReason*; "throttle reasons" before 12.535).
REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
# Reasons that lower the clocks because of heat or power: the window measured a slowed card.
THROTTLING = (
    "sw_power_cap",
    "hw_slowdown",
    "sw_thermal_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
)
NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 1, 2, 0  # nvml.h enum values


def reason_names(mask: int) -> list[str]:
    """The names of the bits set in an NVML clock-event reason mask, in bit order."""
    return [name for bit, name in REASONS.items() if mask & bit]


def _reasons(nvml, handle) -> int:
    read = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)  # nvidia-ml-py >= 12.535
    if read is None:
        read = nvml.nvmlDeviceGetCurrentClocksThrottleReasons
    return int(read(handle))


# (field, reader, scale): a reading the card refuses (NVMLError_NotSupported) is left out.
READINGS = (
    ("sm_clock_mhz", lambda nvml, h: nvml.nvmlDeviceGetClockInfo(h, NVML_CLOCK_SM), 1.0),
    ("mem_clock_mhz", lambda nvml, h: nvml.nvmlDeviceGetClockInfo(h, NVML_CLOCK_MEM), 1.0),
    ("temperature_c", lambda nvml, h: nvml.nvmlDeviceGetTemperature(h, NVML_TEMPERATURE_GPU), 1.0),
    ("power_w", lambda nvml, h: nvml.nvmlDeviceGetPowerUsage(h), 1e-3),  # milliwatts
    ("reasons", _reasons, None),
)


def nvml_handle(device_index: int | None = None):
    """(pynvml, the handle of this process's CUDA device), or None when NVML cannot be used."""
    try:
        import pynvml
        import torch

        pynvml.nvmlInit()
        index = torch.cuda.current_device() if device_index is None else device_index
        uuid = str(torch.cuda.get_device_properties(index).uuid)
        return pynvml, pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else "GPU-" + uuid)
    except Exception:  # noqa: BLE001 - NVML is optional (package, driver, container)
        return None


class GpuMeter:
    """start() at the window's start, stop(steps, images) at its end -> fields of the record's metrics;
    without `nvml` and `handle` (nvml_handle()) it measures nothing and stop() returns {}."""

    def __init__(self, nvml=None, handle=None, interval_s: float = SAMPLE_INTERVAL_S):
        self.nvml, self.handle, self.interval_s = nvml, handle, interval_s
        self.samples: dict[str, list[float]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.energy_mj: int | None = None

    def _energy(self) -> int | None:
        try:
            return int(self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle))
        except Exception:  # noqa: BLE001 - before Volta, or not permitted
            return None

    def _sample(self) -> None:
        for field, read, _ in READINGS:
            try:
                value = read(self.nvml, self.handle)
            except Exception:  # noqa: BLE001 - not supported on this card: never recorded
                continue
            self.samples.setdefault(field, []).append(value)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def start(self) -> None:
        if self.nvml is None:
            return
        self.energy_mj = self._energy()
        self._sample()
        self._thread = threading.Thread(target=self._run, name="ditbench-gpu-meter", daemon=True)
        self._thread.start()

    def stop(self, steps: int, images: int) -> dict[str, Any]:
        """{gpu_window, energy_j, energy per step and per image}, each only if measured."""
        if self.nvml is None:
            return {}
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample()
        end = self._energy()
        out: dict[str, Any] = {}
        window: dict[str, Any] = {}
        for field, _, scale in READINGS:
            values = self.samples.get(field)
            if not values:
                continue
            if scale is None:  # the reasons: the share of samples each one was active in
                seen = [reason_names(m) for m in values]
                names = [n for n in REASONS.values() if any(n in s for s in seen)]
                window["clock_event_reasons"] = {
                    n: round(sum(n in s for s in seen) / len(seen), 3) for n in names
                }
                continue
            xs = [v * scale for v in values]
            window[field] = {
                "min": round(min(xs), 2),
                "median": round(statistics.median(xs), 2),
                "max": round(max(xs), 2),
            }
        if window:
            window["samples"] = max(len(v) for v in self.samples.values())
            window["interval_s"] = self.interval_s
            out["gpu_window"] = window
        if self.energy_mj is not None and end is not None and end >= self.energy_mj:
            joules = (end - self.energy_mj) / 1e3
            out["energy_j"] = round(joules, 3)
            if steps > 0:
                out[ENERGY_PER_STEP.key] = joules / steps
            if images > 0:
                out[ENERGY_PER_IMAGE.key] = joules / images
        return out


def throttling(gpu_window: Any) -> list[str] | None:
    """The heat or power reasons a window's clocks were lowered for ([] when none); None if not measured."""
    if not isinstance(gpu_window, dict) or not isinstance(gpu_window.get("clock_event_reasons"), dict):
        return None
    return [r for r in THROTTLING if r in gpu_window["clock_event_reasons"]]
