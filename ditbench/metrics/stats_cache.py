"""Reference features and statistics, cached on disk by the content of the reference.

A reference batch is scored against many sample batches; its Inception pass (10,000 images,
or a whole dataset) need run only once. The cache key is a hash of the reference's bytes
together with the Inception weights' hash and the precision (TF32 changes the features), so an
edited reference or other weights never hit a stale entry. Hashing a 2 GB reference takes
seconds; the hash is remembered per (path, size, mtime) so an unchanged file is hashed once.

Entries are `.npz` files with `mu`, `sigma`, `mu_s`, `sigma_s` and `pool3` (the reference's
pool3 features, for precision/recall and KID); such a file can itself be given as `--ref`.
Every write is atomic (temp file + os.replace): an interrupted run never leaves a broken entry.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

from ditbench.errors import UserError
from ditbench.fileio import atomic_write, read_regular
from ditbench.metrics.npz_io import ArrayImages, FolderImages, open_zip
from ditbench.metrics.stats_file import read_statistics

CACHE_ENV = "DITBENCH_CACHE"
CACHE_VERSION = 1  # bump when the cached content or its meaning changes
CACHE_KEYS = ("mu", "sigma", "mu_s", "sigma_s", "pool3")


def default_cache_dir() -> Path:
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "ditbench" / "fid"


def _sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


class ReferenceCache:
    def __init__(self, root: str | Path | None = None):
        self.root = Path(root).expanduser() if root else default_cache_dir()

    # -- content hashes ------------------------------------------------------------------
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
            atomic_write(memo, lambda f: f.write(json.dumps({**stamp, "sha256": digest}).encode()))
        except OSError:
            pass  # a read-only cache only costs a re-hash next time
        return digest

    def content_hash(self, src: Path | FolderImages | ArrayImages | np.ndarray) -> str:
        """A hash of what a reference holds: a file's bytes, or a folder's or an array's images."""
        h = hashlib.sha256()
        if isinstance(src, str | Path):
            h.update(b"file:" + self.file_hash(Path(src)).encode())
        elif isinstance(src, FolderImages):
            for p in src.files:
                h.update(f"{p.name}:{self.file_hash(p)};".encode())
        elif isinstance(src, ArrayImages | np.ndarray):
            arr = src.images if isinstance(src, ArrayImages) else src
            h.update(f"array:{arr.shape}:{arr.dtype};".encode())
            for i in range(0, arr.shape[0], 256):
                h.update(np.ascontiguousarray(arr[i : i + 256]).data)
        else:
            raise TypeError(f"cannot hash a {type(src).__name__}")
        return h.hexdigest()

    # -- entries -----------------------------------------------------------------------------
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
            missing = [k for k in CACHE_KEYS if k not in entry]
            if missing:
                raise UserError(f"{path} lacks {missing}")
        except UserError as err:
            if warn is not None:
                warn(f"ignoring the unusable cache entry {path} ({err}); it is rebuilt")
            return None
        return entry

    def save(self, key: str, entry: dict[str, np.ndarray], meta: dict) -> Path:
        path = self.path_for(key)
        arrays = {k: np.asarray(entry[k]) for k in CACHE_KEYS}
        arrays["meta"] = np.array(json.dumps(meta))
        atomic_write(path, lambda f: np.savez(f, **arrays))
        return path
