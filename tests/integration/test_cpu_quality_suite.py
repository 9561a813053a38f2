"""suites/cpu_quality.yaml shows the quality loop working: FID at the last evaluation is lower than at
step 0 by more than the noise estimate (the gate's noise_rule over the seeds' spreads), read from the
records. The committed example (reports/cpu_quality/) is checked in milliseconds; the slow test runs
the suite afresh (minutes on 2 CPU cores, both used: nothing else runs beside it). The quick sibling
runs the same check on the quality loop in about a second, with training and Inception stood in."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from ditbench.metrics.fid import FewSamplesWarning
from ditbench.report.gate.policy import DEFAULT_QUALITY_NOISE_K
from ditbench.report.gate.quality import noise_rule

ROOT = Path(__file__).resolve().parents[2]
SUITE = ROOT / "suites" / "cpu_quality.yaml"
EXAMPLE = ROOT / "reports" / "cpu_quality"


def check_fid_falls(run_dir: Path) -> tuple[float, float, float]:
    """(FID at step 0, FID at the last evaluation, the noise bound) of the suite's evaluated cell."""
    records = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines() if line]
    (record,) = [r for r in records if r.get("quality")]
    q = record["quality"]
    assert record["status"] == "ok"
    b, n, bound = fid_falls_beyond_noise(q)
    first, last = q["evaluations"][0], q["evaluations"][-1]
    assert last["train_gpu_s"] > first["train_gpu_s"] == 0
    for e in q["evaluations"]:
        assert (run_dir / e["grid"]).is_file()
    return b, n, bound


def fid_falls_beyond_noise(q: dict) -> tuple[float, float, float]:
    """The record's `quality` field: evaluated from step 0 to its last listed step with two seeds or
    more, and FID lower at the end than at step 0 by more than the gate's noise rule allows."""
    assert q["status"] == "ok", q.get("reason")
    assert q["inception"]["official"] is False and q["banner"].startswith("not the official Inception")
    first, last = q["evaluations"][0], q["evaluations"][-1]
    assert first["step"] == 0 and last["step"] == max(q["at"]) > 0
    assert len(first["seeds"]) >= 2 and last["spread"]["fid"] is not None  # a noise estimate exists
    b, n = first["metrics"]["fid"], last["metrics"]["fid"]
    noise = noise_rule(b, n, first["spread"]["fid"], last["spread"]["fid"], DEFAULT_QUALITY_NOISE_K)
    assert n < b and noise.beyond, f"FID {b:.2f} -> {n:.2f} is within the noise bound {noise.bound:.2f}"
    return b, n, noise.bound


def test_the_committed_example_shows_fid_falling_beyond_noise():
    check_fid_falls(EXAMPLE)
    assert (EXAMPLE / "report.md").is_file() and "## Sample quality" in (EXAMPLE / "report.md").read_text()


# ---- the quick sibling: the same check on the quality loop run here, in about a second ----------
# Data: every latent value N(MU, S^2) independently, so each pixel of the 8 x 8 grey images the pixel
# decoder makes is that value mapped to uint8 (the reference is drawn so, by the formula below).
MU, S, SIDE, N = 0.2, 0.3, 8, 64
ABAR = np.cumprod(1.0 - np.linspace(1e-4, 0.02, 1000))  # DiT's schedule, written out


def _law_images(n: int, seed: int) -> np.ndarray:
    x = np.clip(MU + S * np.random.default_rng(seed).standard_normal((n, SIDE, SIDE)), -1.0, 1.0)
    grey = np.clip(127.5 * x + 128.0, 0, 255).astype(np.uint8)  # [-1, 1] -> [0, 255] as DiT rounds
    return np.repeat(grey[..., None], 3, axis=-1)


class _Model:
    """DiT's call signature. Untrained: eps = 0, what a zero-initialised DiT predicts. Learned: the exact
    E[eps | x_t] = sqrt(1 - a) / (a S^2 + 1 - a) (x_t - sqrt(a) MU) for the data above (a = alpha-bar_t)."""

    learned = False

    def __call__(self, x, t, y):
        a = torch.as_tensor(ABAR[t.cpu().numpy()], dtype=torch.float64).reshape(-1, 1, 1, 1)
        eps = torch.sqrt(1 - a) / (a * S**2 + 1 - a) * (x.double() - torch.sqrt(a) * MU)
        eps = eps if self.learned else torch.zeros_like(eps)
        return torch.cat([eps, torch.zeros_like(eps)], dim=1).float()  # + the (unused) variance channel


class _LearnsInOneStep:
    """A trainer stand-in for the loop: its EMA model is the untrained one until the first step."""

    def __init__(self, spec, ctx):
        self.ema = SimpleNamespace(model=_Model())

    def next_batch(self):
        return None

    def step(self, batch):
        self.ema.model.learned = True
        return torch.tensor(0.5)


@pytest.mark.usefixtures("one_torch_thread")  # linear algebra of 64 x 2048 features: a 2nd thread only waits
def test_the_quality_loop_scores_a_learned_model_lower_beyond_noise(tmp_path, monkeypatch):
    """The quick loop's "FID falls": the real quality loop (run_quality: evaluations at steps 0 and 1,
    the DDIM sampler the suite uses, the pixel decoder, the FID and its noise rule over two seeds) with
    two stand-ins: training (a run cannot learn in a second: 20 real DiT-T/2 steps at lr 3e-3 raised
    this FID) and the feature network (tests/support's FakeExtractor; Inception takes ~1 s an
    image on one core). The trainer stand-in's model goes from eps = 0 (a zero-initialised DiT) to
    the exact noise prediction for Gaussian data, the limit of training.

    What it pins: (1) FID falls beyond the gate's noise bound, the committed example's check
    (measured: 29,596 -> 2,016, bound 90); (2) the learned model's FID is no higher than that of an
    exact draw from the data's law scored the same way (2,016 against 2,306). A sampler or FID that
    does not bring the samples to the data fails (1); samples whose mean is off by 0.1 (2,559 and
    2,439), whose spread is 1.5x (2,469) or 2/3 (2,581) or collapsed (4,088) fail (2). A coefficient
    slip that moves the samples less (DDIM's sqrt(alpha-bar_prev) as sqrt(alpha-bar_t): 2,227) passes
    (2): test_sampler_closed_form.py pins each step for that."""
    from metrics_support import FakeExtractor

    from ditbench.files.pretrained import CACHE_ENV
    from ditbench.hardware.dist import DistContext
    from ditbench.metrics import registry
    from ditbench.metrics.evaluate import Scorer
    from ditbench.quality.loop import run_quality
    from ditbench.spec.cell import CellSpec, Steps
    from ditbench.spec.knobs import Knobs
    from ditbench.spec.quality import QualitySpec, Sampler

    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    # the bootstrap's 20 resamples per score cost ~2 s here; the seeds' spread is the noise estimate
    monkeypatch.setitem(
        registry.OPTIONS, "bootstrap", dataclasses.replace(registry.OPTIONS["bootstrap"], default=0)
    )
    np.savez(tmp_path / "ref.npz", arr_0=_law_images(N, seed=0))
    knobs = Knobs(
        model="DiT-T/2",
        image_size=4 * SIDE,
        batch_size=4,
        num_classes=2,
        data={"pixels": "builtin:mpl-gray16"},
    )
    quality = QualitySpec(
        str(tmp_path / "ref.npz"),
        samples=N,
        sampler=Sampler("ddim", 10, 1.0),
        at=(0, 1),
        seeds=(0, 1),
        grid=0,
        batch_size=N,
    )
    spec = CellSpec(knobs, "cpu", Steps(0, 1, 0.0), 0, quality=quality)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FewSamplesWarning)  # 64 samples: said once per score, expected
        q = run_quality(
            spec, DistContext(device=torch.device("cpu")), _LearnsInOneStep, extractor=FakeExtractor()
        )
        before, after, bound = fid_falls_beyond_noise(q)
        assert before > 10 * after and after < before - 10 * bound
        exact = Scorer(tmp_path / "ref.npz", metrics="fid", extractor=FakeExtractor(), progress=False)
        level = exact.score(_law_images(N, seed=1))["metrics"]["fid"]
    assert q["evaluations"][0]["per_seed"][0]["fid"] != q["evaluations"][0]["per_seed"][1]["fid"]  # own noise
    assert after <= level, f"the learned model's FID {after:.0f} is above an exact draw's {level:.0f}"


@pytest.mark.slow
def test_the_cpu_quality_suite_lowers_fid_beyond_noise(tmp_path):
    # A CPU cell runs one torch thread unless told (steady on a shared machine); pytest runs this test
    # alone, so it takes up to two (DiT-T/2's step here: 0.13 s against 0.20 s on one, idle 2 cores).
    threads = min(2, len(os.sched_getaffinity(0)))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = tmp_path / "run"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "ditbench",
            "run",
            str(SUITE),
            f"threads={threads}",
            "--out",
            str(out),
            "--no-progress",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    check_fid_falls(out)
