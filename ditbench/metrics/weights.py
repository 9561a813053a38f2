"""Which Inception weights a score is made with, loading them without running code from a file, and
running the network over images.

A file is hashed and loaded from the same bytes with `torch.load(weights_only=True)`; only the published
digest is official, anything else says `official: false` and carries `NOT_OFFICIAL_BANNER`. Features
are true fp32 unless TF32 is asked for (TF32 changes them; cuDNN uses it by default on Ampere+).
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
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ditbench.core.errors import UserError, shorten
from ditbench.files.fileio import atomic_write, download_atomic, read_regular, write_json_atomic
from ditbench.files.outpaths import not_a_file
from ditbench.hardware.device import resolve_device
from ditbench.hardware.precision import tf32_mode
from ditbench.metrics.inception import InceptionV3, build_calibrated_inception
from ditbench.metrics.npz_io import FolderImages, ImageSource
from ditbench.metrics.registry import DEFAULTS, default_cache_dir
from ditbench.metrics.spec import FEATURE_DIMS

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


# Bump when the calibration recipe changes: cached networks are named by it, records carry it.
# 1: BatchNorms calibrated on 16 synthetic 32 px images. 2: calibrated on 16 images of 32 to 256 px,
# pool3 and the spatial features scaled to a total variance of inception.FEATURE_TRACE over them.
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
    if (cached := _cached_test_state(path)) is not None:
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
    (the calibrated random network) or None (`resolve_weights`; the variable may also say `test`)."""
    if weights is None:
        weights = os.environ.get(WEIGHTS_ENV) or None
    if isinstance(weights, str) and weights == TEST_NETWORK:  # a file called `test`: ./test
        state, digest = _test_state()
        net = InceptionV3()
        net.load_state_dict(state)
        info = InceptionWeights(TEST_NETWORK, digest, False, None, recipe=TEST_NETWORK_RECIPE)
        return net.eval().requires_grad_(False), info
    return load_weight_file(resolve_weights(weights))


def _prefetch(source: ImageSource, batch_size: int, num_workers: int, depth: int = 3):
    """Yield the source's batches, read `depth` ahead in a background thread (errors re-raised here)."""
    pool = ThreadPoolExecutor(num_workers) if isinstance(source, FolderImages) and num_workers > 1 else None
    batches = source.batches(batch_size, pool=pool) if pool else source.batches(batch_size)
    end = object()
    reader = ThreadPoolExecutor(1, thread_name_prefix="ditbench-image-reader")  # one at a time, in order
    ahead = deque(reader.submit(next, batches, end) for _ in range(depth))
    try:
        while (batch := ahead.popleft().result()) is not end:
            ahead.append(reader.submit(next, batches, end))
            yield batch
    finally:
        reader.shutdown(wait=True, cancel_futures=True)  # the batch being read, then nothing more
        if pool:
            pool.shutdown(wait=False, cancel_futures=True)


class FeatureExtractor:
    """The FID Inception on a device, turning image sources into float32 CPU feature tensors."""

    weights: InceptionWeights

    def __init__(
        self,
        weights: str | Path | None = None,
        device: str | torch.device | None = None,
        tf32: bool = DEFAULTS["tf32"],
        batch_size: int = DEFAULTS["batch_size"],
        num_workers: int = DEFAULTS["num_workers"],
        progress: bool = True,
    ):
        if batch_size < 1:
            raise UserError(f"--batch-size {batch_size} must be at least 1.")
        self.device = resolve_device(str(device) if device is not None else DEFAULTS["device"])
        self.tf32, self.batch_size = bool(tf32), batch_size
        self.num_workers, self.progress = num_workers, progress
        self.net, self.weights = load_network(weights)
        self.net = self.net.to(self.device)
        if self.device.type == "cuda":
            self.net = self.net.to(memory_format=torch.channels_last)
        self.images_processed = 0  # counts work done, so callers (and tests) can see a cache hit

    @property
    def precision(self) -> str:
        return "tf32" if self.tf32 else "fp32"

    @torch.no_grad()
    def extract(
        self, source: ImageSource, want=("pool3", "logits_unbiased", "spatial"), desc: str = "features"
    ) -> dict[str, torch.Tensor]:
        from ditbench.core.progress import progress

        # Features collect on the device (no per-batch sync on a GPU) and move to the CPU once.
        out = {
            k: torch.empty(source.count, FEATURE_DIMS[k], dtype=torch.float32, device=self.device)
            for k in want
        }
        cuda = self.device.type == "cuda"
        bar = progress(total=source.count, desc=desc, unit="img", disable=not self.progress, leave=False)
        row = 0
        with tf32_mode(self.tf32, cudnn_benchmark=True), bar:
            for batch in _prefetch(source, self.batch_size, self.num_workers):
                x = torch.from_numpy(np.ascontiguousarray(batch)).permute(0, 3, 1, 2)
                if cuda:
                    x = x.pin_memory().to(self.device, non_blocking=True)
                feats = self.net(x)
                n = x.shape[0]
                for k in want:
                    out[k][row : row + n].copy_(feats[k])
                row += n
                bar.update(n)
        self.images_processed += row
        return {k: v.cpu() for k, v in out.items()}
