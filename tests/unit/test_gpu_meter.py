"""GPU noise from NVML, on a CPU: a stand-in `pynvml` module plays the card (clocks, clock-event
reasons, temperature, power, the energy counter); the record holds only what it answered, a window
that throttled for heat or power is noisy with the reason, and energy per image is gateable."""

from __future__ import annotations

import json
import sys
import types

import pytest
from synthetic_records import make_record

from ditbench.bench.cell import gpu_meter
from ditbench.bench.cell.gpu_meter import GpuMeter, nvml_handle, reason_names, throttling
from ditbench.bench.cell.window import noise, noise_advice
from ditbench.report.gate.decide import compare_files
from ditbench.report.gate.policy import load_policy


class NotSupported(Exception):
    """As pynvml's NVMLError_NotSupported: the card cannot answer this reading."""


def fake_nvml(
    clocks=(1980, 1500),
    temps=(60, 70),
    powers=(500_000, 700_000),
    reasons=(0, 0x4, 0x40),
    energy=(1_000_000, 1_250_000),
    unsupported=(),
):
    """A pynvml stand-in whose readings cycle through the given values (power in mW, energy in mJ)."""
    state = {"i": 0, "energy": list(energy)}

    def cycle(values):
        def read(*_):
            return values[state["i"] % len(values)]

        return read

    def refuses(name, read):
        if name in unsupported:

            def fail(*_):
                raise NotSupported(name)

            return fail
        return read

    def sampled_reasons(_h):
        value = reasons[state["i"] % len(reasons)]
        state["i"] += 1  # reasons are read last in a sample: the next sample reads the next values
        return value

    def energy_read(_h):
        return state["energy"].pop(0) if len(state["energy"]) > 1 else state["energy"][0]

    m = types.ModuleType("pynvml")
    m.nvmlInit = lambda: None
    m.nvmlDeviceGetHandleByUUID = lambda uuid: ("handle", uuid)
    m.nvmlDeviceGetClockInfo = refuses("clock", lambda h, kind: clocks[kind - 1])
    m.nvmlDeviceGetTemperature = refuses("temperature", lambda h, _s: cycle(temps)())
    m.nvmlDeviceGetPowerUsage = refuses("power", lambda h: cycle(powers)())
    m.nvmlDeviceGetCurrentClocksEventReasons = refuses("reasons", sampled_reasons)
    m.nvmlDeviceGetTotalEnergyConsumption = refuses("energy", energy_read)
    return m


def measured(nvml, steps=10, images=80, samples=3):
    """A window of exactly `samples` samples (start, one in the middle, stop): no thread timing involved."""
    meter = GpuMeter(nvml, "handle", interval_s=3600)  # the thread never wakes within the test
    meter.start()
    for _ in range(samples - 2):
        meter._sample()
    return meter.stop(steps, images)


def test_a_window_records_clocks_reasons_temperature_power_and_energy():
    out = measured(fake_nvml())
    w = out["gpu_window"]
    assert w["sm_clock_mhz"] == {"min": 1980, "median": 1980, "max": 1980}
    assert w["mem_clock_mhz"] == {"min": 1500, "median": 1500, "max": 1500}
    assert w["temperature_c"] == {"min": 60, "median": 60, "max": 70}  # samples read 60, 70, 60
    assert w["power_w"] == {"min": 500.0, "median": 500.0, "max": 700.0}
    assert w["clock_event_reasons"] == {"sw_power_cap": 0.333, "hw_thermal_slowdown": 0.333}
    assert w["samples"] == 3 and w["interval_s"] == 3600
    # 1,250,000 - 1,000,000 mJ = 250 J over 10 steps of 8 images
    assert (
        out["energy_j"] == 250.0 and out["energy_j_per_step"] == 25.0 and out["energy_j_per_image"] == 3.125
    )
    assert throttling(w) == ["sw_power_cap", "hw_thermal_slowdown"]


def test_what_the_card_does_not_answer_is_not_recorded():
    out = measured(fake_nvml(unsupported=("energy", "power")))
    assert "energy_j" not in out and "energy_j_per_image" not in out and "energy_j_per_step" not in out
    assert "power_w" not in out["gpu_window"] and "sm_clock_mhz" in out["gpu_window"]
    quiet = measured(fake_nvml(reasons=(0, 0x1)))  # samples read 0, idle, 0: idle is not throttling
    assert (
        quiet["gpu_window"]["clock_event_reasons"] == {"gpu_idle": 0.333}
        and throttling(quiet["gpu_window"]) == []
    )
    nothing = measured(fake_nvml(unsupported=("clock", "temperature", "power", "reasons", "energy")))
    assert nothing == {}
    assert GpuMeter().stop(10, 80) == {}  # no NVML: no field at all
    assert throttling(None) is None and throttling({"samples": 3}) is None


def test_a_counter_that_went_backwards_gives_no_energy():
    assert "energy_j" not in measured(fake_nvml(energy=(5_000, 1_000)))


def test_reason_bits_are_nvmls():
    assert reason_names(0x4 | 0x8 | 0x20 | 0x40 | 0x80) == list(gpu_meter.THROTTLING)
    assert reason_names(0x1 | 0x2 | 0x10 | 0x100) == [
        "gpu_idle",
        "applications_clocks_setting",
        "sync_boost",
        "display_clock_setting",
    ]


def test_a_throttled_window_is_noisy_with_the_reason():
    steady = [100.0] * 10
    out = noise(steady, 80.0, 8, gpu_throttle=["hw_thermal_slowdown"])
    assert out["noisy"] is True and out["noise"]["gpu_throttle"] == ["hw_thermal_slowdown"]
    advice = noise_advice(out["noise"])
    assert "the GPU lowered its clocks (hw_thermal_slowdown)" in advice and "nvidia-smi" in advice
    assert noise(steady, 80.0, 8, gpu_throttle=[])["noisy"] is False
    assert "gpu_throttle" not in noise(steady, 80.0, 8)["noise"]  # not measured: not stated
    both = noise_advice({"other_cpu_share": 0.5, "load_bound": 0.25, "gpu_throttle": ["sw_power_cap"]})
    assert both.startswith("other processes used 50% of the CPUs") and "(sw_power_cap)" in both


def test_the_handle_comes_from_pynvml_by_the_devices_uuid(monkeypatch):
    import torch

    nvml = fake_nvml()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: types.SimpleNamespace(uuid=f"abc-{i}"))
    assert nvml_handle(2) == (nvml, ("handle", "GPU-abc-2"))
    monkeypatch.setitem(sys.modules, "pynvml", None)  # nvidia-ml-py not installed
    assert nvml_handle(0) is None


def test_a_rank_that_throttled_makes_the_job_noisy_and_energy_adds_up():
    from ditbench.bench.launch.aggregate import aggregate

    def rank(energy, per_image, reasons):
        m = make_record(images_per_s=400.0, samples=[20.0] * 20, noise=0.0)["metrics"]
        return {
            **m,
            "energy_j": energy,
            "energy_j_per_step": energy / 10,
            "energy_j_per_image": per_image,
            "gpu_window": {"clock_event_reasons": reasons, "samples": 3},
        }

    out = aggregate([rank(100.0, 1.0, {}), rank(120.0, 1.2, {"sw_power_cap": 0.5})], global_batch=16)
    assert out["energy_j"] == 220.0 and out["energy_j_per_step"] == 22.0
    assert out["energy_j_per_image"] == pytest.approx(1.1)
    assert out["noisy"] is True and out["noise"]["gpu_throttle"] == ["sw_power_cap"]


def test_energy_per_image_is_gateable(tmp_path):
    def rec(joules, seed):
        r = make_record(images_per_s=400.0, sample_seed=seed)
        r["metrics"]["energy_j_per_image"] = joules
        return r

    b, n = tmp_path / "base.jsonl", tmp_path / "new.jsonl"
    b.write_text(json.dumps(rec(2.0, 1)) + "\n")
    n.write_text(json.dumps(rec(2.3, 1)) + "\n")  # +15% joules per image
    policy = tmp_path / "policy.yaml"
    policy.write_text("metrics:\n  energy_j_per_image: 5\n")
    result = compare_files(b, n, load_policy(policy))
    d = next(d for c in result.cells for d in c.metrics if d.metric == "energy_j_per_image")
    assert d.verdict == "regression" and d.change_pct == pytest.approx(15.0) and result.exit_code == 1
