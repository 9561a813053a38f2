"""Which Inception weights a score is made with, and loading them without running code from a file.

Sources, first match wins: `--inception-weights PATH`, $DITBENCH_INCEPTION_WEIGHTS, torch-fidelity's file
in the torch hub cache (downloaded once). A file is hashed and loaded from the same bytes with
`torch.load(weights_only=True)`; only the published digest is official, any other result says
`official: false` and carries `NOT_OFFICIAL_BANNER`.

`test` is a random InceptionV3 for tests and timing runs. A default-initialised one gives every image
pool3 features of ~1e-8 (every FID ~0), so its BatchNorms are calibrated on varied synthetic images (32
to 256 px) and the pool3 and sFID features rescaled to a total variance of FEATURE_TRACE (exact: ReLU is
positively homogeneous): FIDs between unlike sets read in the tens to hundreds
(reports/test_inception_scale/). The numbers mean nothing about image quality; the compute is real.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import os
import pickle
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ditbench.errors import UserError, shorten
from ditbench.fileio import atomic_write, download_atomic, read_regular, write_json_atomic
from ditbench.metrics.inception import INPUT_SIZE, InceptionV3, resize_tf1_bilinear
from ditbench.metrics.registry import default_cache_dir
from ditbench.outpaths import not_a_file

WEIGHTS_FILE_NAME = "weights-inception-2015-12-05-6726825d.pth"
WEIGHTS_URL = "https://github.com/toshas/torch-fidelity/releases/download/v0.2.0/" + WEIGHTS_FILE_NAME
WEIGHTS_ENV = "DITBENCH_INCEPTION_WEIGHTS"
# torch-fidelity's converted TF graph `inception-2015-12-05` (byte-identical to pytorch-fid's
# pt_inception-2015-12-05-6726825d.pth): torch hub names files by the digest's first 8 hex digits.
OFFICIAL_SHA256 = "6726825d0af5f729cebd5821db510b11b1cfad8faad88a03f1befd49fb9129b2"
OFFICIAL_SIZE = 95_628_359
OFFICIAL_NAME = "inception-2015-12-05"
TEST_NETWORK = "test"
NOT_OFFICIAL_BANNER = "not the official Inception: numbers are not comparable with papers"
MAX_WEIGHTS_BYTES = 1 << 30  # the network is ~96 MB in float32; a larger file is not one


@dataclass(frozen=True)
class InceptionWeights:
    """What a result says about its network: name, SHA-256, whether it is the official one."""

    name: str  # OFFICIAL_NAME, TEST_NETWORK, or the file's name
    sha256: str  # of the file's bytes; for the test network, of its tensors (state_dict_sha256)
    official: bool
    path: Path | None = None
    recipe: int | None = None  # the test network's TEST_NETWORK_RECIPE: which calibration made it

    @property
    def banner(self) -> str | None:
        return None if self.official else NOT_OFFICIAL_BANNER

    def describe(self) -> dict:
        return {
            "name": self.name,
            "official": self.official,
            "sha256": self.sha256,
            "file": self.path.name if self.path else None,
            "path": str(self.path) if self.path else None,
            "recipe": self.recipe,
        }


def _where(path: Path) -> str:
    return f"Inception weights file {shorten(str(path), 300, quote=False)}"


def default_weights_path() -> Path:
    """Where torch-fidelity keeps the file: the torch hub checkpoint cache ($TORCH_HOME/hub/checkpoints)."""
    return Path(torch.hub.get_dir()) / "checkpoints" / WEIGHTS_FILE_NAME


def resolve_weights(path: str | os.PathLike | None = None) -> Path:
    """The Inception weight file: `path`, else $DITBENCH_INCEPTION_WEIGHTS, else the hub cache (the only
    place downloaded into, once, from torch-fidelity's release)."""
    for given, origin in ((path, "--inception-weights"), (os.environ.get(WEIGHTS_ENV) or None, WEIGHTS_ENV)):
        if given is not None:
            p = Path(given).expanduser()
            if not p.exists():
                raise UserError(
                    f"{_where(p)} (from {origin}) does not exist. Give the path of {WEIGHTS_FILE_NAME}, "
                    f"which can be downloaded from {WEIGHTS_URL}, or `{TEST_NETWORK}` for the calibrated "
                    "random test network."
                )
            return p
    p = default_weights_path()
    if p.exists():
        return p
    try:
        download_atomic(WEIGHTS_URL, p)
        return p
    except Exception as err:  # offline, proxy, disk full: all end in the same advice
        reason = shorten(f"{type(err).__name__}: {err}", 300, quote=False)
    raise UserError(
        f"The Inception weights {WEIGHTS_FILE_NAME} are not in {p} and could not be downloaded "
        f"({reason}). Download {WEIGHTS_URL} on a machine with network access and put it at {p} "
        f"(the torch hub cache that torch-fidelity also uses), or pass --inception-weights PATH, "
        f"or set {WEIGHTS_ENV}=PATH. `--inception-weights {TEST_NETWORK}` runs without them on a "
        f"calibrated random network ({NOT_OFFICIAL_BANNER})."
    )


def _read_weight_bytes(path: Path) -> bytes:
    if (why := not_a_file(path)) is not None:  # a folder, a FIFO or a device, named as such
        raise UserError(f"{_where(path)} {why}; give the path of {WEIGHTS_FILE_NAME} itself.")
    st = path.stat()
    if st.st_size > MAX_WEIGHTS_BYTES:
        raise UserError(
            f"{_where(path)} holds {st.st_size / 2**30:.1f} GiB; the FID InceptionV3 is "
            f"{OFFICIAL_SIZE / 1e6:.0f} MB, so this is not its weight file. Use {WEIGHTS_FILE_NAME} from "
            f"{WEIGHTS_URL}."
        )
    try:
        return path.read_bytes()
    except OSError as err:
        raise UserError(f"{_where(path)} cannot be read ({err.strerror}).") from None


def _refusal_reason(err: Exception) -> str:
    """The line of torch's weights-only refusal that names the object (not its advice to unpickle)."""
    text = str(err)
    found = re.search(r"(Unsupported global|unsupported GLOBAL|Unsupported operand)[^\n]*", text)
    lines = text.strip().splitlines()
    return shorten(found.group(0) if found else (lines[-1] if lines else ""), 240, quote=False)


def _safe_load(data: bytes, path: Path) -> dict[str, torch.Tensor]:
    where = _where(path)
    try:
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        raise UserError(
            f"{where} holds Python objects other than tensors ({_refusal_reason(err)}). ditbench loads "
            f"weight files only as tensors (torch.load with weights_only=True) and never runs code from "
            f"a file. Use torch-fidelity's {WEIGHTS_FILE_NAME} from {WEIGHTS_URL}, or re-save a file you "
            "trust as a plain state dict of tensors."
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError, zipfile.BadZipFile) as err:
        raise UserError(
            f"{where} could not be read ({type(err).__name__}: {shorten(str(err), 240, quote=False)}); it is "
            f"truncated or not a PyTorch state dict. Download it again from {WEIGHTS_URL}."
        ) from None
    if not isinstance(state, dict):
        raise UserError(f"{where} holds a {type(state).__name__}, not a state dict of tensors.")
    for key, value in state.items():
        if not isinstance(value, torch.Tensor):
            raise UserError(
                f"{where}: entry {shorten(key)} is not a tensor but a Python {type(value).__name__}; a "
                "state dict holds tensors only."
            )
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            raise UserError(f"{where}: tensor {shorten(key)} holds NaN or infinite values.")
    return state


def _build(state: dict[str, torch.Tensor], path: Path) -> InceptionV3:
    where = _where(path)
    net = InceptionV3()
    try:
        missing, unexpected = net.load_state_dict(state, strict=False)
    except RuntimeError as err:  # shapes that do not fit
        detail = shorten(str(err).splitlines()[-1].strip(), 240, quote=False)
        raise UserError(
            f"{where} does not fit the FID InceptionV3: {detail} "
            f"Use torch-fidelity's {WEIGHTS_FILE_NAME} from {WEIGHTS_URL}."
        ) from None
    missing = [k for k in missing if not k.endswith("num_batches_tracked")]  # unused in eval mode
    if missing or unexpected:
        raise UserError(
            f"{where} does not fit the FID InceptionV3: {len(missing)} missing keys (e.g. "
            f"{shorten(missing[:3], 200)}) and {len(unexpected)} unexpected keys (e.g. "
            f"{shorten(unexpected[:3], 200)}). Use torch-fidelity's {WEIGHTS_FILE_NAME} from {WEIGHTS_URL}."
        )
    return net.eval().requires_grad_(False)


def load_weight_file(path: str | os.PathLike) -> tuple[InceptionV3, InceptionWeights]:
    """The network of a state-dict file and what it is; never unpickles anything but tensors."""
    path = Path(path)
    data = _read_weight_bytes(path)
    digest = hashlib.sha256(data).hexdigest()
    net = _build(_safe_load(data, path), path)
    official = digest == OFFICIAL_SHA256
    return net, InceptionWeights(OFFICIAL_NAME if official else path.name, digest, official, path)


def state_dict_sha256(state: dict[str, torch.Tensor]) -> str:
    """A hash of a state dict's content (names, dtypes, shapes, bytes), independent of file format."""
    h = hashlib.sha256()
    for key in sorted(state):
        t = state[key].detach().cpu().contiguous()
        h.update(f"{key}|{t.dtype}|{tuple(t.shape)};".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


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


# Bump when the calibration recipe changes: cached networks are named by it, records carry it.
# 1: BatchNorms calibrated on 16 synthetic 32 px images. 2: calibrated on 16 images of 32 to 256 px,
# pool3 and the spatial features scaled to a total variance of FEATURE_TRACE over them.
TEST_NETWORK_RECIPE = 2


def _cached_test_state(path: Path) -> tuple[dict[str, torch.Tensor], str] | None:
    """The cached network if it is whole: tensors only, and the content hash it was saved with."""
    try:  # read_regular: a FIFO planted in the cache is refused, not waited on
        digest = json.loads(read_regular(path.with_suffix(".json")))["sha256"]
        state = torch.load(io.BytesIO(read_regular(path)), map_location="cpu", weights_only=True)
    except (OSError, ValueError, KeyError, TypeError, RuntimeError, EOFError, pickle.UnpicklingError):
        return None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        return None
    return (state, digest) if state_dict_sha256(state) == digest else None


@functools.cache
def _test_state() -> tuple[dict[str, torch.Tensor], str]:
    """The test network's tensors and hash: from the on-disk cache (building it takes 10-30 s on 2 CPU
    cores, in every process that scores), else built once and cached."""
    name = f"calibrated-r{TEST_NETWORK_RECIPE}-torch{torch.__version__.split('+')[0]}.pt"
    path = default_cache_dir() / "inception-test" / name
    cached = _cached_test_state(path)
    if cached is not None:
        return cached
    state = build_calibrated_inception().state_dict()
    digest = state_dict_sha256(state)
    try:
        atomic_write(path, lambda f: torch.save(state, f))
        write_json_atomic(path.with_suffix(".json"), {"sha256": digest, "recipe": TEST_NETWORK_RECIPE})
    except OSError:
        pass  # a read-only cache costs a rebuild next time, nothing else
    return state, digest


def load_network(weights: str | os.PathLike | None = None) -> tuple[InceptionV3, InceptionWeights]:
    """The Inception network on the CPU in eval mode, and what it is, from a state-dict file, `"test"`
    (the calibrated random network: runs anywhere, means nothing about image quality), or None:
    $DITBENCH_INCEPTION_WEIGHTS (a path or `test`), else the torch hub cache (downloaded once)."""
    if weights is None:
        weights = os.environ.get(WEIGHTS_ENV) or None
    if isinstance(weights, str) and weights == TEST_NETWORK:  # a file called `test`: ./test
        state, digest = _test_state()
        net = InceptionV3()
        net.load_state_dict(state)
        info = InceptionWeights(TEST_NETWORK, digest, False, None, recipe=TEST_NETWORK_RECIPE)
        return net.eval().requires_grad_(False), info
    return load_weight_file(resolve_weights(weights))
