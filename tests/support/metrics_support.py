"""Shared helpers for the metrics tests: the calibrated random Inception, saved once per session."""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

import torch

from ditbench.metrics.inception import synthetic_images, to_nchw
from ditbench.metrics.weights import load_network

__all__ = ["SMALL", "calibrated_weights_file", "npz_digest", "synthetic_images", "to_nchw"]

# Metric options small enough for a dozen stand-in images (conftest's `ref_npz`): IS in 2 splits, KID
# on 5 subsets of 4.
SMALL = {"is_splits": 2, "kid_subset_size": 4, "kid_subsets": 5}


def npz_digest(path: str | Path) -> str:
    """sha256 over a sample batch's arrays (not the zip container, whose timestamps vary)."""
    import hashlib

    import numpy as np

    h = hashlib.sha256()
    with np.load(path, allow_pickle=False) as z:
        for key in ("arr_0", "arr_1"):
            h.update(key.encode())
            h.update(np.ascontiguousarray(z[key]).tobytes())
    return h.hexdigest()


@functools.cache
def calibrated_weights_file() -> Path:
    """The calibrated test network (built once per session) saved as a weight file."""
    folder = tempfile.mkdtemp(prefix="ditbench-inception-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)  # ~95 MB: do not leave it behind
    path = Path(folder) / "inception-calibrated.pth"
    torch.save(load_network("test")[0].state_dict(), path)
    return path


class FakeExtractor:
    """A stand-in for the Inception network in tests of the logic around it (milliseconds, not minutes).

    Features are a fixed random projection of 8 x 8 average-pooled pixels, so they differ between
    images and sets as real features do; `calls` records every extraction (description, count).
    """

    def __init__(self, official: bool = False, batch_size: int = 64):
        from ditbench.metrics.spec import FEATURE_DIMS
        from ditbench.metrics.weights import InceptionWeights

        self.device, self.batch_size, self.tf32, self.precision = (
            torch.device("cpu"),
            batch_size,
            False,
            "fp32",
        )
        self.weights = InceptionWeights("fake", "f" * 64, official, None)
        self.calls: list[tuple[str, int]] = []
        g = torch.Generator().manual_seed(0)
        self.projection = {
            k: torch.randn(3 * 8 * 8, d, generator=g, dtype=torch.float64) for k, d in FEATURE_DIMS.items()
        }

    def weights_info(self) -> dict:
        return self.weights.describe()

    def extract(self, source, want=("pool3", "logits_unbiased", "spatial"), desc="features"):
        import numpy as np
        import torch.nn.functional as F

        images = np.concatenate(list(source.batches(self.batch_size)))
        x = torch.from_numpy(images).permute(0, 3, 1, 2).double()
        x = F.adaptive_avg_pool2d(x, 8).flatten(1) / 255
        self.calls.append((desc, len(images)))
        return {k: torch.relu(x @ self.projection[k]).float() for k in want}
