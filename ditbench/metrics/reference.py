"""The reference side of an evaluation, prepared once and then shared by every sample batch.

A reference offers precomputed statistics (an ADM reference batch's `mu`/`sigma`/`mu_s`/`sigma_s`,
a ditbench statistics file's `pool3` features) and/or images. What a metric needs and the
reference does not hold precomputed comes from its images: from the on-disk cache (keyed by the
reference's content, the network's hash and the precision), else from one pass through the
network, which is then cached. Precomputed statistics always take precedence over computed ones.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import ditbench
from ditbench.errors import UserError
from ditbench.metrics.features import FeatureExtractor
from ditbench.metrics.fid import feature_statistics
from ditbench.metrics.npz_io import (
    IMAGE_KEY,
    ArrayImages,
    FolderImages,
    ImageSource,
    NpzImages,
    describe_keys,
    open_zip,
)
from ditbench.metrics.spec import Metric, Need
from ditbench.metrics.stats_cache import ReferenceCache
from ditbench.metrics.stats_file import image_size_from_meta, read_statistics


@dataclass
class Reference:
    """What a reference path offers: images (for features) and/or precomputed statistics."""

    path: Path | None
    images: ImageSource | None
    stats: dict[str, np.ndarray]  # any of mu, sigma, mu_s, sigma_s (float64) and pool3 (float32)
    image_size: tuple[int, int] | None = None  # (height, width) from a statistics file's metadata


def open_reference(path: str | Path) -> Reference:
    """An ADM reference batch (images + optional mu/sigma/mu_s/sigma_s), a folder or npz of real
    images, or a statistics file (mu/sigma, optionally mu_s/sigma_s and pool3). Checked, not computed."""
    path = Path(path)
    if path.is_dir():
        return Reference(path, FolderImages(path), {})
    with open_zip(path) as zf:
        has_images = IMAGE_KEY + ".npy" in zf.namelist()
        stats, meta = read_statistics(path, zf)
        if not has_images and "mu" not in stats and "pool3" not in stats:
            raise UserError(
                f"{path} has neither `{IMAGE_KEY}` images nor `mu`/`sigma` statistics (its keys: "
                f"{describe_keys(zf)}). A reference is an ADM batch (`arr_0`: uint8 images N x H x W x 3, "
                "optionally with precomputed mu, sigma, mu_s, sigma_s), a folder of images, or a statistics "
                "file written by ditbench."
            )
    images = NpzImages(path) if has_images else None
    return Reference(path, images, stats, image_size_from_meta(meta))


def as_reference(x) -> Reference:
    """A Reference from a path (npz, folder, statistics file), an ImageSource or a uint8 array."""
    if isinstance(x, Reference):
        return x
    if isinstance(x, ImageSource):
        return Reference(x.path, x, {})
    if isinstance(x, np.ndarray):
        return Reference(None, ArrayImages(x, "reference array"), {})
    return open_reference(x)


class PreparedReference:
    """A reference and the statistics/features gathered for it so far (read and computed once)."""

    def __init__(self, ref, cache: bool = True, cache_dir=None):
        self.source = as_reference(ref)
        self.stats: dict[str, np.ndarray] = dict(self.source.stats)
        self.from_images: set[str] = set()
        self.store = ReferenceCache(cache_dir) if cache else None
        self.cache_info: dict = {"used": False, "hit": False}
        images = self.source.images
        pool3 = self.stats.get("pool3")
        # images, or rows of precomputed per-image features; None for statistics only
        self.count = images.count if images is not None else (len(pool3) if pool3 is not None else None)

    @property
    def name(self) -> str:
        return str(self.source.path) if self.source.path else "the reference array"

    @property
    def image_size(self) -> tuple[int, int] | None:
        """(height, width) of the reference images, when known (from its images or its metadata)."""
        if self.source.images is not None:
            return self.source.images.height, self.source.images.width
        return self.source.image_size

    def problem(self, metric: Metric, need: Need) -> str | None:
        """Why this reference cannot serve `metric` (None if it can), decided without any compute."""
        for key in metric.reference_keys:
            if key not in self.stats and self.source.images is None:
                held = "only statistics" if key == "pool3" else "no images"
                return f"the reference {self.name} holds {held} and no precomputed `{key}`."
        # Rows of the reference are used when a statistic comes from its images, or per-image features.
        uses_rows = any(k == "pool3" or k not in self.stats for k in metric.reference_keys)
        if uses_rows and self.count < need.reference:
            hint = f"; {need.hint}" if need.hint else ""
            return (
                f"{metric.title} needs at least {need.reference} reference images ({need.why}); "
                f"{self.name} holds {self.count}{hint}."
            )
        return None

    def missing(self, keys) -> set[str]:
        return {k for k in keys if k not in self.stats}

    def ensure(self, keys, extractor: FeatureExtractor, warn) -> float:
        """Make `keys` available (cache or one feature pass); returns the seconds it took."""
        if not self.missing(keys):
            return 0.0
        t = time.perf_counter()
        entry, key = None, None
        if self.store is not None:
            images = self.source.images
            content = images if isinstance(images, FolderImages | ArrayImages) else self.source.path
            key = self.store.key(
                self.store.content_hash(content), extractor.weights.sha256, extractor.precision
            )
            entry = self.store.load(key, warn)
            self.cache_info = {
                "used": True,
                "hit": entry is not None,
                "key": key,
                "path": str(self.store.path_for(key)),
            }
        if entry is None:
            feats = extractor.extract(
                self.source.images, want=("pool3", "spatial"), desc="reference features"
            )
            mu, sigma = feature_statistics(feats["pool3"].to(extractor.device))
            mu_s, sigma_s = feature_statistics(feats["spatial"].to(extractor.device))
            entry = {
                "mu": mu,
                "sigma": sigma,
                "mu_s": mu_s,
                "sigma_s": sigma_s,
                "pool3": feats["pool3"].numpy(),
            }
            if self.store is not None:
                self._save(key, entry, extractor, warn)
        for k, v in entry.items():
            if k not in self.stats:  # precomputed statistics in the reference take precedence
                self.stats[k] = v
                self.from_images.add(k)
        return time.perf_counter() - t

    def _save(self, key: str, entry: dict, extractor: FeatureExtractor, warn) -> None:
        images = self.source.images
        meta = {
            "reference": self.name,
            "count": images.count,
            "height": images.height,
            "width": images.width,
            "inception": extractor.weights_info(),
            "precision": extractor.precision,
            "ditbench": ditbench.__version__,
        }
        if extractor.weights.banner:
            meta["banner"] = extractor.weights.banner
        try:
            self.store.save(key, entry, meta)
        except OSError as err:
            warn(f"could not write the reference cache entry {self.store.path_for(key)}: {err}")

    def describe(self) -> dict:
        def origin(mu_key):
            if mu_key not in self.stats:
                return None
            return "images" if mu_key in self.from_images else "precomputed"

        desc = {
            "path": str(self.source.path) if self.source.path else None,
            "count": self.count,
            "fid_statistics": origin("mu"),
            "sfid_statistics": origin("mu_s"),
            "cache": self.cache_info,
        }
        if self.source.images is not None:
            desc.update(height=self.source.images.height, width=self.source.images.width)
        return desc
