"""Batched Inception feature extraction: images from any source -> pool3, logits, spatial.

Reading (npz rows, PNG decoding) runs in background threads while the network works, so a GPU does
not wait on the disk. The network runs in true fp32 unless TF32 is asked for: TF32 changes the
features, and on Ampere and newer PyTorch lets cuDNN use it by default.
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from ditbench.device import resolve_device
from ditbench.errors import UserError
from ditbench.metrics.npz_io import FolderImages, ImageSource
from ditbench.metrics.registry import DEFAULTS
from ditbench.metrics.spec import FEATURE_DIMS
from ditbench.metrics.weights import InceptionWeights, load_network
from ditbench.precision import tf32_mode


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
    """The FID Inception on a device, turning image sources into feature tensors (float32, CPU);
    `weights` as weights.load_network takes them."""

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
        from ditbench.progress import progress

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
