"""Shared helpers for the metrics tests: the calibrated random Inception, saved once per session."""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

import torch

from ditbench.metrics.calibrated import build_calibrated_inception, synthetic_images, to_nchw

__all__ = ["calibrated_weights_file", "synthetic_images", "to_nchw"]


@functools.cache
def calibrated_weights_file() -> Path:
    """Build the calibrated network once per test session and save its state dict."""
    folder = tempfile.mkdtemp(prefix="ditbench-inception-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)  # ~95 MB: do not leave it behind
    path = Path(folder) / "inception-calibrated.pth"
    torch.save(build_calibrated_inception().state_dict(), path)
    return path
