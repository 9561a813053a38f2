"""The sample grid: the same noise and class labels in every cell, so settings compare image by image.

Every grid is sampled from one fixed seed (`GRID_SEED`, apart from the scoring seeds) with fixed
labels (for 1,000 classes those the DiT paper's sampling script shows, else 0, 1, 2, ...), so a
difference between two grids of one model shape is the training setting's.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ditbench.fileio import atomic_write

GRID_SEED = 1_000_003  # a prime far from the scoring seeds (0, 1, ...)
COLUMNS = 8
MIN_SIDE = 128  # small images are enlarged (nearest neighbour) so that a reader can see them: 32 px x 4
PAD = 2
DIT_PAPER_CLASSES = (207, 360, 387, 974, 88, 979, 417, 279)  # DiT's sample.py: retriever, otter, panda, ...


def grid_labels(n: int, num_classes: int) -> np.ndarray:
    if num_classes == 1000:
        return np.resize(np.array(DIT_PAPER_CLASSES, dtype=np.int64), n)
    return np.arange(n, dtype=np.int64) % num_classes


def tile(images: np.ndarray, columns: int = COLUMNS) -> np.ndarray:
    """uint8 N x H x W x 3 -> one uint8 image: rows of `columns`, white padding, small images enlarged."""
    n, h, w, _ = images.shape
    scale = max(1, -(-MIN_SIDE // max(h, w)))
    if scale > 1:
        images = images.repeat(scale, axis=1).repeat(scale, axis=2)
        h, w = h * scale, w * scale
    columns = max(1, min(columns, n))
    rows = -(-n // columns)
    out = np.full((rows * (h + PAD) + PAD, columns * (w + PAD) + PAD, 3), 255, dtype=np.uint8)
    for i, image in enumerate(images):
        r, c = divmod(i, columns)
        out[PAD + r * (h + PAD) : PAD + r * (h + PAD) + h, PAD + c * (w + PAD) : PAD + c * (w + PAD) + w] = (
            image
        )
    return out


def grid_path(cell_id: str, step: int) -> str:
    """Where an evaluation's grid goes, relative to the run's output directory (the record says it)."""
    return f"grids/{cell_id}/step{step:07d}.png"


def write_grid(out_dir: str | Path, relative: str, images: np.ndarray) -> Path:
    from PIL import Image

    def save(f):
        Image.fromarray(tile(images)).save(f, format="PNG")

    return atomic_write(Path(out_dir) / relative, save)
