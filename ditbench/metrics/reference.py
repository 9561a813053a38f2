"""The reference side of an evaluation, prepared once and then shared by every sample batch.

A reference offers precomputed statistics (an ADM reference batch's `mu`/`sigma`/`mu_s`/`sigma_s`, a
ditbench statistics file's `pool3`) and/or images. What a metric needs and is not precomputed comes
from its images: from the on-disk cache, else one pass through the network, then cached.
Precomputed statistics always take precedence over computed ones.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import NamedTuple

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
from ditbench.metrics.stats_cache import ReferenceCache, image_size_from_meta, read_statistics


class Reference(NamedTuple):
    path: Path | None
    images: ImageSource | None
    stats: dict[str, np.ndarray]  # any of mu, sigma, mu_s, sigma_s (float64) and pool3 (float32)
    image_size: tuple[int, int] | None  # (height, width) from a statistics file's metadata


def open_reference(x) -> Reference:
    """What an ADM reference batch, a folder or npz of real images, a statistics file, an ImageSource or a
    uint8 array offers: images and/or precomputed statistics. Checked, not computed."""
    if isinstance(x, ImageSource):
        return Reference(x.path, x, {}, None)
    if isinstance(x, np.ndarray):
        return Reference(None, ArrayImages(x, "reference array"), {}, None)
    path = Path(x)
    if path.is_dir():
        return Reference(path, FolderImages(path), {}, None)
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
    return Reference(path, NpzImages(path) if has_images else None, stats, image_size_from_meta(meta))


class PreparedReference:
    """A reference and the statistics/features gathered for it so far (read and computed once)."""

    def __init__(self, ref, cache: bool = True, cache_dir=None):
        self.path, self.images, stats, self._meta_size = open_reference(ref)
        self.stats: dict[str, np.ndarray] = dict(stats)
        self.from_images: set[str] = set()
        self.store = ReferenceCache(cache_dir) if cache else None
        self.cache_info: dict = {"used": False, "hit": False}
        pool3 = self.stats.get("pool3")
        # images, or rows of precomputed per-image features; None for statistics only
        self.count = self.images.count if self.images is not None else (None if pool3 is None else len(pool3))

    @property
    def name(self) -> str:
        return str(self.path) if self.path else "the reference array"

    @property
    def image_size(self) -> tuple[int, int] | None:
        """(height, width) of the reference images, when known (from its images or its metadata)."""
        if self.images is not None:
            return self.images.height, self.images.width
        return self._meta_size

    def problem(self, metric: Metric, need: Need) -> str | None:
        """Why this reference cannot serve `metric` (None if it can), decided without any compute."""
        for key in metric.reference_keys:
            if key not in self.stats and self.images is None:
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
            content = self.images if isinstance(self.images, FolderImages | ArrayImages) else self.path
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
            feats = extractor.extract(self.images, want=("pool3", "spatial"), desc="reference features")
            entry = {}
            for feature, (mu, sigma) in (("pool3", ("mu", "sigma")), ("spatial", ("mu_s", "sigma_s"))):
                entry[mu], entry[sigma] = feature_statistics(feats[feature].to(extractor.device))
            entry["pool3"] = feats["pool3"].numpy()
            if self.store is not None:
                self._save(key, entry, extractor, warn)
        for k, v in entry.items():
            if k not in self.stats:  # precomputed statistics in the reference take precedence
                self.stats[k] = v
                self.from_images.add(k)
        return time.perf_counter() - t

    def _save(self, key: str, entry: dict, extractor: FeatureExtractor, warn) -> None:
        meta = {
            "reference": self.name,
            "count": self.images.count,
            "height": self.images.height,
            "width": self.images.width,
            "inception": extractor.weights.describe(),
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
            "path": str(self.path) if self.path else None,
            "count": self.count,
            "fid_statistics": origin("mu"),
            "sfid_statistics": origin("mu_s"),
            "cache": self.cache_info,
        }
        if self.images is not None:
            desc.update(height=self.images.height, width=self.images.width)
        return desc
