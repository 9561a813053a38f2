"""Reference statistics in an .npz: what ADM reference batches and ditbench's cache entries hold.

Keys: `mu`/`sigma` (pool3, 2048-d), `mu_s`/`sigma_s` (spatial, 2023-d), `pool3` (N x 2048
features of the reference images) and, in files ditbench writes, `meta` (a JSON string). Each
member's .npy header is checked before a byte of its data is read (dtype, shape, so a 2 KB file
cannot ask for 80 GB), object arrays are refused (nothing is unpickled), and the values must be
finite, the covariances square and symmetric: a bad file is named with its key, never used.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np

from ditbench.errors import UserError, shorten
from ditbench.metrics.npz_io import ZIP_ERRORS, describe_keys, open_member, read_npy_header, reason
from ditbench.metrics.spec import POOL3_DIM, SPATIAL_DIM

STAT_SHAPES = {
    "mu": (POOL3_DIM,),
    "sigma": (POOL3_DIM,) * 2,
    "mu_s": (SPATIAL_DIM,),
    "sigma_s": (SPATIAL_DIM,) * 2,
}
FEATURE_KEY = "pool3"  # per-image features, N x POOL3_DIM
META_KEY = "meta"
MAX_META_CHARS = 1 << 16
PAIRS = (("mu", "sigma"), ("mu_s", "sigma_s"))


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
    a = a.astype(np.float32 if key == FEATURE_KEY else np.float64)
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
    """(statistics, metadata) of an open .npz: whichever of STAT_SHAPES and `pool3` it holds, checked."""
    names = set(zf.namelist())
    out = {}
    for key, expected in (*STAT_SHAPES.items(), (FEATURE_KEY, (None, POOL3_DIM))):
        if key + ".npy" in names:
            where = f"{path} (key `{key}`)"
            out[key] = _check(key, _read_member(zf, key, where, expected), where)
    for m, s in PAIRS:
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
