"""The reference side of an evaluation: statistics files read checked, cached by content, prepared once.

Precomputed statistics (ADM's `mu`/`sigma`/`mu_s`/`sigma_s`, a ditbench file's `pool3`) take precedence;
what a metric needs beyond them comes from the reference's images, via the on-disk cache. Headers are
checked before data is read (a 2 KB file cannot ask for 80 GB), object arrays are never unpickled; cache
entries are keyed by the reference's content, the network's hash and the precision; writes are atomic.
"""

from __future__ import annotations

import hashlib
import json
import time
import zipfile
from pathlib import Path
from typing import NamedTuple

import numpy as np

import ditbench
from ditbench.core.errors import UserError, shorten
from ditbench.files.fileio import atomic_write, read_regular, write_json_atomic
from ditbench.metrics.fid import feature_statistics
from ditbench.metrics.npz_io import (
    IMAGE_KEY,
    ZIP_ERRORS,
    ArrayImages,
    FolderImages,
    ImageSource,
    NpzImages,
    describe_keys,
    open_member,
    open_zip,
    read_npy_header,
    reason,
)
from ditbench.metrics.registry import default_cache_dir
from ditbench.metrics.spec import POOL3_DIM, REFERENCE_KEYS, SPATIAL_DIM, Metric, Need
from ditbench.metrics.weights import FeatureExtractor

SHAPES = {  # None: any number of rows
    "mu": (POOL3_DIM,),
    "sigma": (POOL3_DIM,) * 2,
    "mu_s": (SPATIAL_DIM,),
    "sigma_s": (SPATIAL_DIM,) * 2,
    "pool3": (None, POOL3_DIM),  # per-image features
}
META_KEY = "meta"
MAX_META_CHARS = 1 << 16
CACHE_VERSION = 1  # bump when the cached content or its meaning changes


def _read_member(zf: zipfile.ZipFile, key: str, where: str, expected) -> np.ndarray:
    """One numeric array, its header checked against `expected` (None in a shape: any size)."""
    with open_member(zf, key + ".npy", where) as f:
        shape, _, dtype, _ = read_npy_header(f, where)
    if dtype.hasobject:
        raise UserError(f"{where} is an object array (pickled Python objects), which ditbench never loads.")
    if dtype.kind not in "fiu":
        raise UserError(f"{where} has dtype {shorten(str(dtype), quote=False)}; expected float numbers.")
    if len(shape) != len(expected) or any(e not in (None, s) for s, e in zip(shape, expected, strict=True)):
        want = " x ".join("N" if e is None else str(e) for e in expected)
        raise UserError(
            f"{where} has shape {shorten(shape)}; expected {want} (Inception "
            f"{'spatial' if SPATIAL_DIM in expected else 'pool3'} features)."
        )
    if 0 in shape:
        raise UserError(f"{where} has shape {shape}: it is empty.")
    try:
        with open_member(zf, key + ".npy", where) as f:
            return np.lib.format.read_array(f, allow_pickle=False)
    except ZIP_ERRORS as err:
        raise UserError(
            f"{where} could not be read ({reason(err)}); the file is truncated or corrupt."
        ) from None


def _read_meta(zf: zipfile.ZipFile, where: str) -> dict:
    """The JSON metadata ditbench writes into its own files; anything else there is ignored."""
    try:
        with open_member(zf, META_KEY + ".npy", where) as f:
            shape, _, dtype, _ = read_npy_header(f, where)
        if shape != () or dtype.kind != "U" or dtype.itemsize > 4 * MAX_META_CHARS:
            return {}
        with open_member(zf, META_KEY + ".npy", where) as f:
            meta = json.loads(str(np.lib.format.read_array(f, allow_pickle=False)))
        return meta if isinstance(meta, dict) else {}
    except (UserError, *ZIP_ERRORS, RecursionError):
        return {}


def _check(key: str, a: np.ndarray, where: str) -> np.ndarray:
    a = a.astype(np.float32 if key == "pool3" else np.float64)
    if not np.isfinite(a).all():
        bad = int((~np.isfinite(a)).sum())
        raise UserError(f"{where} holds {bad} NaN or infinite value(s); recompute the statistics.")
    if key.startswith("sigma"):
        scale = max(float(np.abs(a).max()), 1e-300)
        if float(np.abs(a - a.T).max()) > 1e-6 * scale:
            raise UserError(f"{where} is not symmetric, so it is not a covariance matrix; recompute it.")
        if float(np.diag(a).min()) < -1e-9 * scale:
            raise UserError(
                f"{where} has a negative variance on its diagonal, so it is not a covariance matrix."
            )
    return a


def read_statistics(path: Path, zf: zipfile.ZipFile) -> tuple[dict[str, np.ndarray], dict]:
    """(statistics, metadata) of an open .npz: whichever keys of SHAPES it holds, checked."""
    names = set(zf.namelist())
    out = {}
    for key, expected in SHAPES.items():
        if key + ".npy" in names:
            where = f"{path} (key `{key}`)"
            out[key] = _check(key, _read_member(zf, key, where, expected), where)
    for m, s in (("mu", "sigma"), ("mu_s", "sigma_s")):
        if (m in out) != (s in out):
            raise UserError(
                f"{path} has `{m if m in out else s}` without `{s if m in out else m}`; precomputed "
                f"statistics need both the mean and the covariance (its keys: {describe_keys(zf)})."
            )
    meta = _read_meta(zf, str(path)) if META_KEY + ".npy" in names else {}
    return out, meta


class ReferenceCache:
    def __init__(self, root: str | Path | None = None):
        self.root = Path(root).expanduser() if root else default_cache_dir()

    def file_hash(self, path: Path) -> str:
        """sha256 of a file's bytes, remembered per (absolute path, size, mtime)."""
        path = path.resolve()
        st = path.stat()
        memo = self.root / "hashes" / (hashlib.sha1(str(path).encode()).hexdigest() + ".json")
        stamp = {"path": str(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
        try:
            saved = json.loads(read_regular(memo))
            if {k: saved.get(k) for k in stamp} == stamp:
                return saved["sha256"]
        except (OSError, ValueError, KeyError):
            pass
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while block := f.read(1 << 22):
                h.update(block)
        digest = h.hexdigest()
        try:
            write_json_atomic(memo, {**stamp, "sha256": digest})
        except OSError:
            pass  # a read-only cache only costs a re-hash next time
        return digest

    def content_hash(self, src: Path | FolderImages | ArrayImages) -> str:
        """A hash of what a reference holds: a file's bytes, or a folder's or an array's images."""
        h = hashlib.sha256()
        if isinstance(src, str | Path):
            h.update(b"file:" + self.file_hash(Path(src)).encode())
        elif isinstance(src, FolderImages):
            for p in src.files:
                h.update(f"{p.name}:{self.file_hash(p)};".encode())
        elif isinstance(src, ArrayImages):
            arr = src.images
            h.update(f"array:{arr.shape}:{arr.dtype};".encode())
            for i in range(0, arr.shape[0], 256):
                h.update(np.ascontiguousarray(arr[i : i + 256]).data)
        else:
            raise TypeError(f"cannot hash a {type(src).__name__}")
        return h.hexdigest()

    @staticmethod
    def key(content_hash: str, weights_sha256: str, precision: str) -> str:
        raw = f"v{CACHE_VERSION}|{content_hash}|{weights_sha256}|{precision}"
        return hashlib.sha256(raw.encode()).hexdigest()[:32]

    def path_for(self, key: str) -> Path:
        return self.root / "refs" / f"{key}.npz"

    def load(self, key: str, warn=None) -> dict[str, np.ndarray] | None:
        """The entry, checked like any statistics file; None (and a warning) when it is unusable."""
        path = self.path_for(key)
        if not path.is_file():
            return None
        try:
            with open_zip(path) as zf:
                entry, _ = read_statistics(path, zf)
            if missing := [k for k in REFERENCE_KEYS if k not in entry]:
                raise UserError(f"{path} lacks {missing}")
        except UserError as err:
            if warn is not None:
                warn(f"ignoring the unusable cache entry {path} ({err}); it is rebuilt")
            return None
        return entry

    def save(self, key: str, entry: dict[str, np.ndarray], meta: dict) -> Path:
        path = self.path_for(key)
        arrays = {k: np.asarray(entry[k]) for k in REFERENCE_KEYS}
        arrays["meta"] = np.array(json.dumps(meta))
        atomic_write(path, lambda f: np.savez(f, **arrays))
        return path


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
    h, w = meta.get("height"), meta.get("width")  # the images' size, in a file ditbench wrote
    size = (h, w) if all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (h, w)) else None
    return Reference(path, NpzImages(path) if has_images else None, stats, size)


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
