"""A calibrated random InceptionV3 and structured synthetic images, for tests and timing runs.

A randomly initialised Inception is useless as it comes: with PyTorch's default initialisation
its pool3 features are about 1e-8 and nearly the same for every image, so every FID is about 0
and any implementation seems to agree with any other. Here each BatchNorm's running statistics
are set from a pass over varied synthetic images, so activations stay at unit scale through the
network and differ between images. Metric values from such a network mean nothing about image
quality; they exercise the code paths with realistic numbers (tests) and cost the same compute
as the real network (GPU timing runs on machines without the real weights).

Its scale (recipe 2, weights.TEST_NETWORK_RECIPE): the calibration images span 32 to 256 px
(calibration_images), and after the calibration pass the BatchNorms whose ReLU outputs are the
features (the six output branches of Mixed_7c for pool3, Mixed_6d.branch1x1 for the sFID spatial
features) are rescaled so that over the calibration images the features' total variance (the trace
of their covariance, which FID's trace terms add up) is FEATURE_TRACE. ReLU is positively
homogeneous, so the features scale exactly; what reads them is compensated (fc's weight for the
logits, Mixed_6e's first convolutions), so the logits and all other activations are as before.
FID and sFID between unlike image sets then read in the tens to hundreds
(reports/test_inception_scale/ has the measured table).
"""

from __future__ import annotations

import numpy as np
import torch

from ditbench.metrics.inception import INPUT_SIZE, InceptionV3, resize_tf1_bilinear

FEATURE_TRACE = 100.0  # total variance of pool3 and of the spatial features over the calibration images


def synthetic_images(n: int, size: int = 32, seed: int = 0, style: str = "mixed") -> np.ndarray:
    """n uint8 N x size x size x 3 images with structure: gradients, blobs, stripes, noise.

    `style` shifts the mix ("smooth" favours gradients and blobs, "noisy" high-frequency noise)
    so that two sets differ in distribution, as generated and real images do.
    """
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
    """The calibration batch: synthetic images at 32, 64, 128 and 256 px in turn, resized to 299 px.

    One batch at the network's input size, so every BatchNorm's statistics cover all sizes at once:
    a larger image carries more high-frequency energy after the resize (as a photograph does than a
    32 px crop), and a network calibrated on 32 px images alone gave ~5x larger features (FID ~200x)
    on 128 px ones (recipe 1; reports/test_inception_scale/).
    """
    parts = []
    for k, size in enumerate(CALIBRATION_SIZES):
        count = n // len(CALIBRATION_SIZES) + (k < n % len(CALIBRATION_SIZES))
        x = to_nchw(synthetic_images(count, size, seed=seed + k)).double()
        parts.append(resize_tf1_bilinear(x, INPUT_SIZE).round().clamp(0, 255).to(torch.uint8))
    return torch.cat(parts)


def build_calibrated_inception(seed: int = 0, n_calibration: int = 16) -> InceptionV3:
    """A random InceptionV3 whose BatchNorms are calibrated on synthetic images (float32, CPU, eval mode).

    Reproducible: the random draws come from a seeded generator (the caller's global RNG state is
    left as it was), and the calibration pass runs in float64, so rounding differences between
    machines stay far below the float32 the statistics are stored in and the weights (and their
    hash) come out the same.
    """
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
        _set_feature_scale(net, feats)
        net.float()
    return net


def _total_variance(features: torch.Tensor) -> float:
    x = features.double()
    return float(((x - x.mean(0)) ** 2).sum() / (len(x) - 1))


def _scale_bn(bn: torch.nn.BatchNorm2d, s: float) -> None:
    bn.weight.mul_(s)
    bn.bias.mul_(s)


def _set_feature_scale(net: InceptionV3, feats: dict[str, torch.Tensor]) -> None:
    """Scale pool3 and the spatial features to a total variance of FEATURE_TRACE.

    `feats`: the features of the calibration pass (train mode: batch statistics, which the running
    statistics now equal up to the n/(n-1) of the unbiased variance, n = images x positions >= 1,000).
    """
    rescale_features(
        net,
        pool3=(FEATURE_TRACE / _total_variance(feats["pool3"])) ** 0.5,
        spatial=(FEATURE_TRACE / _total_variance(feats["spatial"])) ** 0.5,
    )


@torch.no_grad()
def rescale_features(net: InceptionV3, pool3: float, spatial: float) -> None:
    """Multiply the pool3 features by `pool3` and the spatial ones by `spatial` (both > 0), in place.

    Exact because ReLU(s y) = s ReLU(y) for s > 0; what reads the features (fc, Mixed_6e's first
    convolutions) is divided by the same factor, so the logits and all other activations are unchanged.
    """
    last = net.Mixed_7c  # the six branches concatenated into pool3 (their ReLU outputs)
    for conv in (
        last.branch1x1,
        last.branch3x3_2a,
        last.branch3x3_2b,
        last.branch3x3dbl_3a,
        last.branch3x3dbl_3b,
        last.branch_pool,
    ):
        _scale_bn(conv.bn, pool3)
    net.fc.weight.div_(pool3)
    # The spatial features are Mixed_6d.branch1x1's first 7 channels; all its 192 channels feed
    # Mixed_6e (input channels 0..191 of its four first convolutions, one behind a linear average pool).
    branch = net.Mixed_6d.branch1x1.bn
    _scale_bn(branch, spatial)
    nxt = net.Mixed_6e
    for conv in (nxt.branch1x1, nxt.branch7x7_1, nxt.branch7x7dbl_1, nxt.branch_pool):
        conv.conv.weight[:, : branch.num_features].div_(spatial)
