"""A calibrated random InceptionV3 and structured synthetic images, for tests and timing runs.

A default-initialised Inception gives every image pool3 features of ~1e-8, so every FID is ~0. Here
the BatchNorms are calibrated on varied synthetic images (32 to 256 px) and the pool3 and sFID features
rescaled to a total variance of FEATURE_TRACE (exact: ReLU is positively homogeneous), so FIDs between
unlike sets read in the tens to hundreds (reports/test_inception_scale/). The numbers mean nothing about
image quality; the compute is the real network's (recipe 2, weights.TEST_NETWORK_RECIPE).
"""

from __future__ import annotations

import numpy as np
import torch

from ditbench.metrics.inception import INPUT_SIZE, InceptionV3, resize_tf1_bilinear

FEATURE_TRACE = 100.0  # total variance of pool3 and of the spatial features over the calibration images


def synthetic_images(n: int, size: int = 32, seed: int = 0, style: str = "mixed") -> np.ndarray:
    """n uint8 N x size x size x 3 images with structure: gradients, blobs, stripes, noise. `style` shifts
    the mix ("smooth": gradients and blobs, "noisy": noise) so two sets differ as generated and real do."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float64) / size
    out = np.empty((n, size, size, 3), dtype=np.uint8)
    weights = {"mixed": [1, 1, 1, 1], "smooth": [3, 3, 1, 0.3], "noisy": [0.3, 1, 1, 3]}[style]
    p = np.array(weights, dtype=np.float64) / sum(weights)
    for i in range(n):
        kind = rng.choice(4, p=p)
        colour = rng.uniform(0, 1, size=3)
        if kind == 0:  # linear gradient in a random direction
            a = rng.uniform(0, 2 * np.pi)
            g = (np.cos(a) * xx + np.sin(a) * yy)[..., None]
            img = colour * g + (1 - colour) * (1 - g)
        elif kind == 1:  # a few soft blobs on a background
            img = np.broadcast_to(rng.uniform(0, 1, size=3), (size, size, 3)).copy()
            for _ in range(rng.integers(1, 4)):
                cx, cy, r = rng.uniform(0, 1), rng.uniform(0, 1), rng.uniform(0.1, 0.4)
                m = np.exp(-((xx - cx) ** 2 + (yy - cy) ** 2) / r**2)[..., None]
                img = img * (1 - m) + rng.uniform(0, 1, size=3) * m
        elif kind == 2:  # stripes of a random frequency
            f = rng.uniform(2, 10)
            s = 0.5 + 0.5 * np.sin(2 * np.pi * f * (xx if rng.random() < 0.5 else yy))[..., None]
            img = colour * s + rng.uniform(0, 1, size=3) * (1 - s)
        else:  # coloured noise
            img = np.clip(colour + rng.normal(0, rng.uniform(0.1, 0.4), size=(size, size, 3)), 0, 1)
        img = img + rng.normal(0, 0.02, size=img.shape)
        out[i] = np.clip(np.round(img * 255), 0, 255).astype(np.uint8)
    return out


def to_nchw(images: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(images).permute(0, 3, 1, 2).contiguous()


CALIBRATION_SIZES = (32, 64, 128, 256)


def calibration_images(n: int = 16, seed: int = 1000) -> torch.Tensor:
    """The calibration batch: synthetic images at 32, 64, 128 and 256 px in turn, resized to 299 px, so
    the statistics cover every size (calibrated on 32 px alone, recipe 1 gave ~5x larger features on
    128 px images, which carry more high-frequency energy after the resize)."""
    parts = []
    for k, size in enumerate(CALIBRATION_SIZES):
        count = n // len(CALIBRATION_SIZES) + (k < n % len(CALIBRATION_SIZES))
        x = to_nchw(synthetic_images(count, size, seed=seed + k)).double()
        parts.append(resize_tf1_bilinear(x, INPUT_SIZE).round().clamp(0, 255).to(torch.uint8))
    return torch.cat(parts)


def build_calibrated_inception(seed: int = 0, n_calibration: int = 16) -> InceptionV3:
    """A random InceptionV3 whose BatchNorms are calibrated on synthetic images (float32, CPU, eval mode).
    Reproducible: seeded draws (the global RNG state is kept), and a float64 calibration pass, so the
    machine's rounding stays far below float32 and the weights (and their hash) come out the same."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = InceptionV3()
        bns = [m for m in net.modules() if isinstance(m, torch.nn.BatchNorm2d)]
        with torch.no_grad():
            for bn in bns:
                bn.weight.uniform_(0.5, 1.5)
                bn.bias.normal_(0.0, 0.3)
            # Logits at a scale where softmax is far from uniform, so the Inception Score is not ~1.
            net.fc.weight.normal_(0.0, 0.1)
            net.fc.bias.normal_(0.0, 1.0)
    with torch.no_grad():
        net.double()
        for bn in bns:
            bn.momentum = None  # cumulative average: after one batch, running stats = batch stats
            bn.reset_running_stats()
        net.train()
        feats = net(calibration_images(n_calibration, seed=1000 + seed))
        net.eval()
        for bn in bns:
            bn.momentum = 0.1
        # The features' scale from the calibration pass (batch statistics, which the running ones now
        # equal up to n / (n - 1), n = images x positions >= 1,000).
        pool3, spatial = ((FEATURE_TRACE / _total_variance(feats[k])) ** 0.5 for k in ("pool3", "spatial"))
        rescale_features(net, pool3, spatial)
        net.float()
    return net


def _total_variance(features: torch.Tensor) -> float:
    x = features.double()
    return float(((x - x.mean(0)) ** 2).sum() / (len(x) - 1))


def _scale_bn(bn: torch.nn.BatchNorm2d, s: float) -> None:
    bn.weight.mul_(s)
    bn.bias.mul_(s)


@torch.no_grad()
def rescale_features(net: InceptionV3, pool3: float, spatial: float) -> None:
    """Multiply the pool3 features by `pool3` and the spatial ones by `spatial` (both > 0), in place:
    exact since ReLU(s y) = s ReLU(y), and what reads them (fc, Mixed_6e's first convolutions) is divided
    by the same factor, so the logits and all other activations are unchanged."""
    last = net.Mixed_7c  # the six branches concatenated into pool3 (their ReLU outputs)
    for branch in ("branch1x1", "branch3x3_2a", "branch3x3_2b", "branch3x3dbl_3a", "branch3x3dbl_3b"):
        _scale_bn(getattr(last, branch).bn, pool3)
    _scale_bn(last.branch_pool.bn, pool3)
    net.fc.weight.div_(pool3)
    # The spatial features are Mixed_6d.branch1x1's first 7 channels; all its 192 channels feed
    # Mixed_6e (input channels 0..191 of its four first convolutions, one behind a linear average pool).
    branch = net.Mixed_6d.branch1x1.bn
    _scale_bn(branch, spatial)
    nxt = net.Mixed_6e
    for conv in (nxt.branch1x1, nxt.branch7x7_1, nxt.branch7x7dbl_1, nxt.branch_pool):
        conv.conv.weight[:, : branch.num_features].div_(spatial)
