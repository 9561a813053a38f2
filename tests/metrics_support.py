"""Shared helpers for the metrics tests: the calibrated random Inception, saved once per session."""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

import torch

from ditbench.metrics.calibrated import synthetic_images, to_nchw
from ditbench.metrics.weights import load_network

__all__ = ["calibrated_weights_file", "synthetic_images", "to_nchw"]


@functools.cache
def calibrated_weights_file() -> Path:
    """The calibrated test network (built once per session) saved as a weight file."""
    folder = tempfile.mkdtemp(prefix="ditbench-inception-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)  # ~95 MB: do not leave it behind
    path = Path(folder) / "inception-calibrated.pth"
    torch.save(load_network("test")[0].state_dict(), path)
    return path
