"""Reference statistics in an .npz, read checked and cached on disk by the content of the reference.

Keys: `mu`/`sigma` (pool3), `mu_s`/`sigma_s` (spatial), `pool3` (per-image features) and, in
ditbench's files, `meta` (JSON). Headers are checked before data is read (a 2 KB file cannot ask for
80 GB), object arrays refused, values finite, covariances symmetric. Cache entries hold all five keys
(one can be given as `--ref`), keyed by the reference's content, the network's hash and the precision;
file hashes are remembered per (path, size, mtime); writes are atomic.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path

import numpy as np

from ditbench.errors import UserError, shorten
from ditbench.fileio import atomic_write, read_regular, write_json_atomic
from ditbench.metrics.npz_io import (
    ZIP_ERRORS,
    ArrayImages,
    FolderImages,
    describe_keys,
    open_member,
    open_zip,
    read_npy_header,
    reason,
)
from ditbench.metrics.spec import POOL3_DIM, REFERENCE_KEYS, SPATIAL_DIM
from ditbench.pretrained import cache_root

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
    if len(shape) != len(expected) or any(
        e is not None and s != e for s, e in zip(shape, expected, strict=True)
    ):
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


def image_size_from_meta(meta: dict) -> tuple[int, int] | None:
    h, w = meta.get("height"), meta.get("width")
    ok = all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (h, w))
    return (h, w) if ok else None


def default_cache_dir() -> Path:
    return cache_root() / "fid"  # beside checkpoints/, plan/ and datasets/ in the one ditbench cache


def _sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


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
        digest = _sha256_file(path)
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
            missing = [k for k in REFERENCE_KEYS if k not in entry]
            if missing:
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
