"""The InceptionV3 that FID is defined with (TF graph `inception-2015-12-05`), in PyTorch.

Layer names follow torch-fidelity's `FeatureExtractorInceptionV3`, so its weight file loads directly.
Unlike torchvision's: average pools ignore padding, the last block's pool branch is a max pool, BatchNorm
eps is 1e-3, and images are resized with TF1's bilinear rule. Per image: `pool3` (2048),
`logits_unbiased` (ADM's IS) and `spatial` (TF's `mixed_6/conv`, Mixed_6d.branch1x1's first 7 channels,
17 x 17 channels-last = 2023: ADM's sFID features). `build_calibrated_inception` is the `test` network,
calibrated since a default-initialised one gives every image features of ~1e-8 (every FID ~0).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ditbench.metrics.spec import LOGITS_DIM, POOL3_DIM, SPATIAL_CHANNELS, SPATIAL_DIM

INPUT_SIZE = 299


def _tf1_source_grid(in_size: int, out_size: int, device: torch.device):
    """Source coordinates of TF1 ResizeBilinear (align_corners=False): src = dst * in / out, formed in
    float32 as torch-fidelity does, so the integer/fraction split (and every output value) agrees."""
    scale = torch.tensor(in_size / out_size, dtype=torch.float32)
    src = torch.arange(out_size, dtype=torch.float32) * scale
    lo = src.long()
    hi = (lo + 1).clamp_max(in_size - 1)
    frac = src - lo.float()
    return lo.to(device), hi.to(device), frac.to(device)


def resize_tf1_bilinear(x: torch.Tensor, size: int = INPUT_SIZE) -> torch.Tensor:
    """Resize float NCHW images to size x size like TensorFlow 1.x `ResizeBilinear`: along x on the two
    source rows, then along y, in torch-fidelity's 'slow' order (bit-exact on CPU for float32)."""
    if not x.is_floating_point() or x.dim() != 4:
        raise ValueError("resize_tf1_bilinear expects a float N x C x H x W tensor")
    _, _, h, w = x.shape
    if h == size and w == size:
        return x  # scale 1: every fraction is 0, the interpolation is the identity
    y_lo, y_hi, fy = _tf1_source_grid(h, size, x.device)
    x_lo, x_hi, fx = _tf1_source_grid(w, size, x.device)
    fx = fx.to(x.dtype).view(1, 1, 1, size)
    fy = fy.to(x.dtype).view(1, 1, size, 1)
    row_lo = x.index_select(2, y_lo)
    row_hi = x.index_select(2, y_hi)
    a = row_lo.index_select(3, x_lo)
    top = a + (row_lo.index_select(3, x_hi) - a) * fx
    b = row_hi.index_select(3, x_lo)
    bottom = b + (row_hi.index_select(3, x_hi) - b) * fx
    return top + (bottom - top) * fy


class BasicConv2d(nn.Module):
    """Convolution without bias, BatchNorm (eps 1e-3, as in the TF graph), ReLU."""

    def __init__(self, cin: int, cout: int, kernel_size, stride=1, padding=0):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel_size, stride=stride, padding=padding, bias=False)
        self.bn = nn.BatchNorm2d(cout, eps=0.001)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)))


def _avg_pool_same(x):
    # TF's SAME average pool divides by the number of real (unpadded) pixels.
    return F.avg_pool2d(x, 3, stride=1, padding=1, count_include_pad=False)


def _max_pool_same(x):
    return F.max_pool2d(x, 3, stride=1, padding=1)


def _max_pool_reduce(x):
    return F.max_pool2d(x, 3, stride=2)


class _Block(nn.Module):
    """An Inception block: parallel branches concatenated along channels."""

    def branches(self, x) -> list[torch.Tensor]:
        raise NotImplementedError

    def forward(self, x):
        return torch.cat(self.branches(x), 1)


class InceptionA(_Block):  # Mixed_5b, 5c, 5d (35 x 35)
    def __init__(self, cin: int, pool_features: int):
        super().__init__()
        self.branch1x1 = BasicConv2d(cin, 64, 1)
        self.branch5x5_1 = BasicConv2d(cin, 48, 1)
        self.branch5x5_2 = BasicConv2d(48, 64, 5, padding=2)
        self.branch3x3dbl_1 = BasicConv2d(cin, 64, 1)
        self.branch3x3dbl_2 = BasicConv2d(64, 96, 3, padding=1)
        self.branch3x3dbl_3 = BasicConv2d(96, 96, 3, padding=1)
        self.branch_pool = BasicConv2d(cin, pool_features, 1)

    def branches(self, x):
        return [
            self.branch1x1(x),
            self.branch5x5_2(self.branch5x5_1(x)),
            self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x))),
            self.branch_pool(_avg_pool_same(x)),
        ]


class InceptionB(_Block):  # Mixed_6a (35 -> 17)
    def __init__(self, cin: int):
        super().__init__()
        self.branch3x3 = BasicConv2d(cin, 384, 3, stride=2)
        self.branch3x3dbl_1 = BasicConv2d(cin, 64, 1)
        self.branch3x3dbl_2 = BasicConv2d(64, 96, 3, padding=1)
        self.branch3x3dbl_3 = BasicConv2d(96, 96, 3, stride=2)

    def branches(self, x):
        return [
            self.branch3x3(x),
            self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x))),
            _max_pool_reduce(x),
        ]


class InceptionC(_Block):  # Mixed_6b..6e (17 x 17), factorised 7x7 convolutions
    def __init__(self, cin: int, c7: int):
        super().__init__()
        row, col = dict(kernel_size=(1, 7), padding=(0, 3)), dict(kernel_size=(7, 1), padding=(3, 0))
        self.branch1x1 = BasicConv2d(cin, 192, 1)
        self.branch7x7_1 = BasicConv2d(cin, c7, 1)
        self.branch7x7_2 = BasicConv2d(c7, c7, **row)
        self.branch7x7_3 = BasicConv2d(c7, 192, **col)
        self.branch7x7dbl_1 = BasicConv2d(cin, c7, 1)
        self.branch7x7dbl_2 = BasicConv2d(c7, c7, **col)
        self.branch7x7dbl_3 = BasicConv2d(c7, c7, **row)
        self.branch7x7dbl_4 = BasicConv2d(c7, c7, **col)
        self.branch7x7dbl_5 = BasicConv2d(c7, 192, **row)
        self.branch_pool = BasicConv2d(cin, 192, 1)

    def branches(self, x):
        d = self.branch7x7dbl_3(self.branch7x7dbl_2(self.branch7x7dbl_1(x)))
        d = self.branch7x7dbl_5(self.branch7x7dbl_4(d))
        return [
            self.branch1x1(x),
            self.branch7x7_3(self.branch7x7_2(self.branch7x7_1(x))),
            d,
            self.branch_pool(_avg_pool_same(x)),
        ]


class InceptionD(_Block):  # Mixed_7a (17 -> 8)
    def __init__(self, cin: int):
        super().__init__()
        self.branch3x3_1 = BasicConv2d(cin, 192, 1)
        self.branch3x3_2 = BasicConv2d(192, 320, 3, stride=2)
        self.branch7x7x3_1 = BasicConv2d(cin, 192, 1)
        self.branch7x7x3_2 = BasicConv2d(192, 192, (1, 7), padding=(0, 3))
        self.branch7x7x3_3 = BasicConv2d(192, 192, (7, 1), padding=(3, 0))
        self.branch7x7x3_4 = BasicConv2d(192, 192, 3, stride=2)

    def branches(self, x):
        s = self.branch7x7x3_1(x)
        s = self.branch7x7x3_4(self.branch7x7x3_3(self.branch7x7x3_2(s)))
        return [self.branch3x3_2(self.branch3x3_1(x)), s, _max_pool_reduce(x)]


class InceptionE(_Block):  # Mixed_7b (average pool branch), Mixed_7c (max pool branch, as in TF)
    def __init__(self, cin: int, pool: str):
        super().__init__()
        self.pool = _avg_pool_same if pool == "avg" else _max_pool_same
        self.branch1x1 = BasicConv2d(cin, 320, 1)
        self.branch3x3_1 = BasicConv2d(cin, 384, 1)
        self.branch3x3_2a = BasicConv2d(384, 384, (1, 3), padding=(0, 1))
        self.branch3x3_2b = BasicConv2d(384, 384, (3, 1), padding=(1, 0))
        self.branch3x3dbl_1 = BasicConv2d(cin, 448, 1)
        self.branch3x3dbl_2 = BasicConv2d(448, 384, 3, padding=1)
        self.branch3x3dbl_3a = BasicConv2d(384, 384, (1, 3), padding=(0, 1))
        self.branch3x3dbl_3b = BasicConv2d(384, 384, (3, 1), padding=(1, 0))
        self.branch_pool = BasicConv2d(cin, 192, 1)

    def branches(self, x):
        t = self.branch3x3_1(x)
        u = self.branch3x3dbl_2(self.branch3x3dbl_1(x))
        return [
            self.branch1x1(x),
            self.branch3x3_2a(t),
            self.branch3x3_2b(t),
            self.branch3x3dbl_3a(u),
            self.branch3x3dbl_3b(u),
            self.branch_pool(self.pool(x)),
        ]


class InceptionV3(nn.Module):
    """The FID Inception network; `forward(uint8 NCHW)` returns a dict of float32 features."""

    def __init__(self):
        super().__init__()
        self.Conv2d_1a_3x3 = BasicConv2d(3, 32, 3, stride=2)
        self.Conv2d_2a_3x3 = BasicConv2d(32, 32, 3)
        self.Conv2d_2b_3x3 = BasicConv2d(32, 64, 3, padding=1)
        self.Conv2d_3b_1x1 = BasicConv2d(64, 80, 1)
        self.Conv2d_4a_3x3 = BasicConv2d(80, 192, 3)
        self.Mixed_5b = InceptionA(192, pool_features=32)
        self.Mixed_5c = InceptionA(256, pool_features=64)
        self.Mixed_5d = InceptionA(288, pool_features=64)
        self.Mixed_6a = InceptionB(288)
        self.Mixed_6b = InceptionC(768, c7=128)
        self.Mixed_6c = InceptionC(768, c7=160)
        self.Mixed_6d = InceptionC(768, c7=160)
        self.Mixed_6e = InceptionC(768, c7=192)
        self.Mixed_7a = InceptionD(768)
        self.Mixed_7b = InceptionE(1280, pool="avg")
        self.Mixed_7c = InceptionE(2048, pool="max")
        self.fc = nn.Linear(POOL3_DIM, LOGITS_DIM)

    def forward(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        if images.dtype != torch.uint8 or images.dim() != 4 or images.shape[1] != 3:
            raise ValueError(f"expected uint8 images N x 3 x H x W, got {images.dtype} {tuple(images.shape)}")
        # The network computes in its parameters' dtype: float32, or float64 while calibrating the
        # test network (below), whose statistics must not depend on the machine's rounding.
        x = resize_tf1_bilinear(images.to(self.fc.weight.dtype))
        x = (x - 128) / 128  # the graph's normalisation to [-1, 1)
        x = self.Conv2d_2b_3x3(self.Conv2d_2a_3x3(self.Conv2d_1a_3x3(x)))
        x = _max_pool_reduce(x)
        x = self.Conv2d_4a_3x3(self.Conv2d_3b_1x1(x))
        x = _max_pool_reduce(x)
        blocks = (self.Mixed_5b, self.Mixed_5c, self.Mixed_5d, self.Mixed_6a, self.Mixed_6b, self.Mixed_6c)
        for block in blocks:
            x = block(x)
        parts = self.Mixed_6d.branches(x)
        # sFID: TF's mixed_6/conv is Mixed_6d.branch1x1; 7 channels, flattened as H, W, C.
        spatial = parts[0][:, :SPATIAL_CHANNELS].permute(0, 2, 3, 1).reshape(x.shape[0], SPATIAL_DIM)
        x = torch.cat(parts, 1)
        for block in (self.Mixed_6e, self.Mixed_7a, self.Mixed_7b, self.Mixed_7c):
            x = block(x)
        pool3 = F.adaptive_avg_pool2d(x, 1).flatten(1)
        logits_unbiased = pool3 @ self.fc.weight.T
        return {
            "pool3": pool3.float(),
            "logits_unbiased": logits_unbiased.float(),
            "spatial": spatial.float(),
        }


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
    the statistics cover every size (larger images carry more high-frequency energy after the resize)."""
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
