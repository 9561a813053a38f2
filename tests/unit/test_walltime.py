"""Long work is announced (issue 38): the estimate comes first, and on a CPU work over 30 minutes needs
--yes in a terminal (ditbench.hardware.walltime); progress lines carry an ETA."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ditbench.cli.train import train_step_s
from ditbench.core import progress
from ditbench.core.errors import UserError
from ditbench.hardware import walltime

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def quiet_cpu(monkeypatch):
    """The CPU of reports/plan_vs_cpu: its measured peak (95.5 GFLOP/s, one thread), not this one's now."""
    monkeypatch.setattr(walltime, "measure_matmul_tflops", lambda *a, **k: 0.09552)
    walltime.rate.cache_clear()
    yield
    walltime.rate.cache_clear()


def test_a_training_step_estimate_matches_the_measured_cpu_records(quiet_cpu):
    """The shipped CPU calibration against records it was fitted on (a model, precision and
    checkpointing each; 16 cells in reports/plan_vs_cpu): within 25%."""
    lines = (ROOT / "reports/plan_vs_cpu/results.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines[::5]]
    errors = []
    for r in records:
        step_s = train_step_s(r["config"], "cpu")
        errors.append(abs(1 / step_s / r["metrics"]["steps_per_s"] - 1))
    assert len(errors) == 4 and max(errors) < 0.25, errors


def test_flops_at_the_calibrated_rate(quiet_cpu):
    eff = json.loads((walltime.CALIBRATIONS / "speed_calibration_cpu.json").read_text())["params"][
        "matmul_eff"
    ]
    assert walltime.flops_s(95.52e9, "cpu") == pytest.approx(1 / eff)


def _announce(monkeypatch, seconds, *, terminal=True, yes=False, device="cpu", ci=None):
    monkeypatch.setattr(walltime, "is_terminal", lambda stream=None: terminal)
    monkeypatch.setattr(walltime, "rate", lambda device: (None, None, "a test rate", None))
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    walltime.announce("train", seconds, "100 steps of DiT-XL/2", device, yes, "Fewer steps (--steps 9).")


def test_long_cpu_work_needs_yes_in_a_terminal(monkeypatch, capsys):
    with pytest.raises(UserError) as err:
        _announce(monkeypatch, 3 * 3600)
    text = str(err.value)
    assert "estimated at 3 h 00 min on this CPU" in text and "--steps 9" in text and "--yes" in text
    assert capsys.readouterr().err.startswith("ditbench train: 100 steps of DiT-XL/2: estimated 3 h 00 min")
    _announce(monkeypatch, 3 * 3600, yes=True)  # said, then started
    _announce(monkeypatch, 3 * 3600, terminal=False)  # a log: proceeds, having printed it
    _announce(monkeypatch, 3 * 3600, ci="true")
    _announce(monkeypatch, 3 * 3600, device="cuda:0")  # the gate is for CPUs
    _announce(monkeypatch, 29 * 60)
    assert capsys.readouterr().err.count("estimated") == 5


def test_no_estimate_is_said_too(monkeypatch, capsys):
    walltime.announce("sample", None, "6 images", "cuda:0", False, "")
    assert capsys.readouterr().err == "ditbench sample: no time estimate for 6 images on cuda:0\n"


def test_durations_and_the_eta_of_a_plain_progress_line(monkeypatch, capsys):
    assert [progress.duration(s) for s in (42, 185, 3720, 3 * 86400 + 7200)] == [
        "42 s", "3 min 05 s", "1 h 02 min", "3 days 2 h",
    ]  # fmt: skip
    clock = iter([0.0, 10.0, 10.0])
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    monkeypatch.setenv(progress.EVERY_ENV, "5")
    bar = progress.PlainProgress(None, 100, 0, "img", "sample features")
    bar.update(20)
    assert capsys.readouterr().err == "sample features: 20/100 img (20%), 2 img/s, 10 s, ETA 40 s\n"


def test_a_plain_bar_says_where_it_ended_once(monkeypatch, capsys):
    """Off a terminal the closing line is printed only if the last periodic one did not already say it."""
    monkeypatch.setenv(progress.EVERY_ENV, "0")
    list(progress.PlainProgress(range(3), None, 0, "img", "fid features"))
    assert [line.split(",")[0] for line in capsys.readouterr().err.splitlines()] == [
        "fid features: 1/3 img (33%)", "fid features: 2/3 img (67%)", "fid features: 3/3 img (100%)",
    ]  # fmt: skip
    monkeypatch.setenv(progress.EVERY_ENV, "3600")
    bar = progress.PlainProgress(None, 10, 0, "img", "fid features")
    bar.update(4)
    bar.close()
    bar.close()
    assert capsys.readouterr().err.startswith("fid features: 4/10 img (40%)") and bar.shown == 4


@pytest.mark.slow
def test_the_flop_constants_are_what_torch_counts():
    """INCEPTION_FLOPS and VAE_DECODE_FLOPS_PER_PIXEL, counted on meta tensors."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from ditbench.metrics.inception import InceptionV3
    from ditbench.models.vae import SD_VAE_CONFIG

    diffusers = pytest.importorskip("diffusers")

    def count(fn, x):
        with FlopCounterMode(display=False) as counter:
            fn(x)
        return counter.get_total_flops()

    with torch.device("meta"):
        inception = count(InceptionV3(), torch.empty(1, 3, 64, 48, dtype=torch.uint8))
        decode = count(diffusers.AutoencoderKL(**SD_VAE_CONFIG).decode, torch.empty(1, 4, 32, 32))
    assert inception == pytest.approx(walltime.INCEPTION_FLOPS, rel=1e-3)
    assert decode / 256**2 == pytest.approx(walltime.VAE_DECODE_FLOPS_PER_PIXEL, rel=1e-3)
