"""Benchmarks for `ditbench fid` (pytest-benchmark; figures are recorded, never asserted).

    pytest benchmarks/test_bench_fid.py --benchmark-only
    pytest benchmarks/test_bench_fid.py --benchmark-only -m "not slow"   # without scipy's sqrtm

Targets: the Frechet distance of 2048-d statistics under 2 s on a 2-core machine (scipy's
sqrtm formula, the classical one, takes ~11 s there); a feature-extraction batch as the unit
of the extraction cost (CPU ~8 img/s on 2 cores; GPU figures come from gpu_fid.py); and
`ditbench fid --inception-weights test` end to end on 1,000 vs 1,000 64-px images (slow: the
whole command, network build included, as a user without the official weights runs it).
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from ditbench.metrics.fid import feature_statistics, frechet_distance
from ditbench.metrics.inception import build_calibrated_inception, synthetic_images, to_nchw

D = 2048


@pytest.fixture(scope="module")
def stats_2048():
    """Full-rank 2048-d statistics shaped like pool3's: ReLU'd correlated Gaussians, 2.5 x D samples."""
    rng = np.random.default_rng(0)
    out = []
    for shift in (0.0, 0.05):
        mix = rng.normal(size=(D, D)) / np.sqrt(D)
        x = np.maximum(rng.normal(size=(5 * D // 2, D)) @ mix + shift, 0)
        out += list(feature_statistics(torch.from_numpy(x)))
    return out


def test_bench_frechet_distance_2048(benchmark, stats_2048):
    torch.set_num_threads(2)
    value = benchmark.pedantic(frechet_distance, args=tuple(stats_2048), rounds=3, iterations=1)
    benchmark.extra_info["fid"] = value
    assert np.isfinite(value) and value > 0


@pytest.mark.slow
def test_bench_scipy_sqrtm_2048_for_comparison(benchmark, stats_2048):
    """The classical formula (TTUR / pytorch-fid / ADM evaluator), measured once."""
    import scipy.linalg

    mu1, s1, mu2, s2 = stats_2048

    def classical():
        covmean = scipy.linalg.sqrtm(s1 @ s2)
        diff = mu1 - mu2
        return float(diff @ diff + np.trace(s1) + np.trace(s2) - 2 * np.trace(covmean).real)

    value = benchmark.pedantic(classical, rounds=1, iterations=1)
    benchmark.extra_info["fid"] = value
    assert value == pytest.approx(frechet_distance(*stats_2048), rel=1e-8)


def test_bench_feature_extraction_batch(benchmark):
    torch.set_num_threads(2)
    net = build_calibrated_inception()
    batch = to_nchw(synthetic_images(8, 64, seed=3))

    def run():
        with torch.no_grad():
            return net(batch)

    feats = benchmark.pedantic(run, rounds=2, iterations=1, warmup_rounds=1)
    benchmark.extra_info["images_per_batch"] = len(batch)
    assert feats["pool3"].shape == (8, 2048)


@pytest.mark.slow
def test_bench_fid_command_test_network_1000_vs_1000_64px(benchmark, tmp_path):
    n, size = 1000, 64
    np.savez(tmp_path / "samples.npz", arr_0=synthetic_images(n, size, seed=1, style="smooth"))
    np.savez(tmp_path / "ref.npz", arr_0=synthetic_images(n, size, seed=2, style="noisy"))
    cmd = [sys.executable, "-m", "ditbench", "fid", "--samples", str(tmp_path / "samples.npz")]
    cmd += ["--ref", str(tmp_path / "ref.npz"), "--inception-weights", "test", "--device", "cpu"]
    cmd += ["--no-progress", "--cache-dir", str(tmp_path / "cache"), "--out", str(tmp_path / "m.json")]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}

    def run():
        t = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=7200)
        assert proc.returncode == 0, proc.stderr
        return time.perf_counter() - t

    wall = benchmark.pedantic(run, rounds=1, iterations=1)
    result = json.loads((tmp_path / "m.json").read_text())
    t = result["timings_s"]
    benchmark.extra_info.update(
        wall_s=round(wall, 1),
        timings_s=t,
        images_per_s=round(2 * n / (t["reference_features"] + t["sample_features"]), 2),
        load_avg_1min=os.getloadavg()[0],
        metrics=result["metrics"],
    )
    assert result["inception"]["official"] is False and set(result["metrics"]) >= {"fid", "kid"}
