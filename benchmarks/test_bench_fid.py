"""Benchmarks for `ditbench fid` (pytest-benchmark; figures are recorded, never asserted).

    pytest benchmarks/test_bench_fid.py --benchmark-only
    pytest benchmarks/test_bench_fid.py --benchmark-only -m "not slow"   # without scipy's sqrtm

Targets: the Frechet distance of 2048-d statistics under 2 s on a 2-core machine (scipy's
sqrtm formula, the classical one, takes ~11 s there); a feature-extraction batch as the unit
of the extraction cost (CPU ~8 img/s on 2 cores; GPU figures come from gpu_fid.py).
"""

import numpy as np
import pytest
import torch

from ditbench.metrics.calibrated import build_calibrated_inception, synthetic_images, to_nchw
from ditbench.metrics.fid import feature_statistics, frechet_distance

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
