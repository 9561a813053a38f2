"""A calibrated random InceptionV3 and structured synthetic images, for tests and timing runs.

A randomly initialised Inception is useless as it comes: with PyTorch's default initialisation
its pool3 features are about 1e-8 and nearly the same for every image, so every FID is about 0
and any implementation seems to agree with any other. Here each BatchNorm's running statistics
are set from a pass over varied synthetic images, so activations stay at unit scale through the
network and differ between images. Metric values from such a network mean nothing about image
quality; they exercise the code paths with realistic numbers (tests) and cost the same compute
as the real network (GPU timing runs on machines without the real weights).
"""

from __future__ import annotations

import numpy as np
import torch

from ditbench.metrics.inception import InceptionV3


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
        net(to_nchw(synthetic_images(n_calibration, 32, seed=1000 + seed)))
        net.eval()
        for bn in bns:
            bn.momentum = 0.1
        net.float()
    return net
