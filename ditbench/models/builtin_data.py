"""Small real-image datasets cut from pictures an installed package ships (matplotlib's, scikit-image's):
no download. Built once into `$DITBENCH_CACHE/datasets` as an ADM npz named by recipe version, count and
seed, so a changed recipe never serves a stale file."""

from __future__ import annotations

import gzip
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ditbench.core.errors import UserError, shorten
from ditbench.files.fileio import atomic_write
from ditbench.files.pretrained import cache_root

PREFIX = "builtin:"
RECIPE_VERSION = 1  # bump when the crops change: the cached files are named by it


@dataclass(frozen=True)
class Dataset:
    count: int
    seed: int
    rgb: bool  # RGB images (what the Inception network reads); else grey
    about: str
    photos: str = "mpl"  # which package's photographs: a key of PHOTOS
    side: int = 16


DATASETS = {
    "mpl-gray16": Dataset(4096, 1, False, "training: 4,096 grey 16x16 crops, 2 classes (photo, MRI)"),
    # 256 images: enough for FID to separate noise from crops, and featurised in about a minute on a CPU
    "mpl-gray16-ref": Dataset(256, 2, True, "FID reference: 256 crops of the same photographs, RGB"),
    "photos-rgb32": Dataset(
        4096,
        3,
        True,
        "training: 4,096 RGB 32x32 crops, 2 classes (cat, coffee); needs scikit-image",
        "skimage",
        32,
    ),
    "photos-rgb32-ref": Dataset(
        256, 4, True, "FID reference: 256 RGB 32x32 crops of the same photographs", "skimage", 32
    ),
}
# package -> (sample-data file, smallest and largest crop side in its pixels) per class
PHOTOS = {
    "mpl": (("grace_hopper.jpg", 48, 160), ("s1045.ima.gz", 32, 96)),
    "skimage": (("chelsea.png", 64, 224), ("coffee.png", 96, 320)),
}


def is_builtin(spec) -> bool:
    return isinstance(spec, str) and spec.startswith(PREFIX)


def names() -> list[str]:
    return [PREFIX + name for name in DATASETS]


def resolve(spec: str) -> Path:
    """The npz of a built-in dataset, built into the cache on first use; UserError naming the valid ones."""
    name = spec[len(PREFIX) :]
    if name not in DATASETS:
        listing = "; ".join(f"{PREFIX}{n} ({d.about})" for n, d in DATASETS.items())
        raise UserError(f"unknown built-in dataset {shorten(spec)}; valid: {listing}.")
    d = DATASETS[name]
    path = cache_root() / "datasets" / f"{name}-v{RECIPE_VERSION}-n{d.count}-s{d.seed}.npz"
    if not path.is_file():
        images, labels = crops(d)
        atomic_write(path, lambda f: np.savez(f, arr_0=images, arr_1=labels))
    return path


def _photographs(photos: str = "mpl") -> list[np.ndarray]:
    """The source photographs as uint8 arrays: matplotlib's grey, or scikit-image's RGB."""
    if photos == "skimage":
        return _skimage_photographs()
    import matplotlib.cbook as cbook
    from PIL import Image

    try:
        (hopper_file, _, _), (mri_file, _, _) = PHOTOS["mpl"]
        hopper = np.asarray(Image.open(cbook.get_sample_data(hopper_file)).convert("L"))
        with cbook.get_sample_data(mri_file) as f:
            raw = f.read()
    except (OSError, ValueError) as err:
        raise UserError(
            f"the built-in datasets are cut from matplotlib's sample images, which could not be read "
            f"({err}); reinstall matplotlib (`pip install --force-reinstall matplotlib`)."
        ) from None
    if raw[:2] == b"\x1f\x8b":  # older matplotlib hands the file still compressed
        raw = gzip.decompress(raw)
    mri = np.frombuffer(raw, dtype="<u2").reshape(256, 256).astype(np.float64)
    mri = np.clip(mri / np.percentile(mri, 99.5) * 255.0, 0, 255).round().astype(np.uint8)
    return [hopper, mri]


def _skimage_photographs() -> list[np.ndarray]:
    """scikit-image's colour photographs, read as files (importing skimage itself takes seconds)."""
    import importlib.util

    from PIL import Image

    found = importlib.util.find_spec("skimage")
    folder = Path(found.submodule_search_locations[0]) / "data" if found else None
    try:
        if folder is None:
            raise OSError("scikit-image is not installed")
        return [np.asarray(Image.open(folder / name).convert("RGB")) for name, _, _ in PHOTOS["skimage"]]
    except OSError as err:
        raise UserError(
            f"the built-in datasets photos-rgb32 and photos-rgb32-ref are cut from scikit-image's sample "
            f"photographs, which could not be read ({err}); install them with `pip install "
            '"ditbench[photos]"` (scikit-image), or use builtin:mpl-gray16 (matplotlib\'s, grey).'
        ) from None


def crops(spec: Dataset) -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 N x side x side (x 3 when rgb), labels int64 N): class i % 2 from photograph i % 2."""
    from PIL import Image

    rng = np.random.default_rng(spec.seed)
    photos, sources = _photographs(spec.photos), PHOTOS[spec.photos]
    labels = np.arange(spec.count, dtype=np.int64) % len(photos)
    out = np.empty((spec.count, spec.side, spec.side, *photos[0].shape[2:]), dtype=np.uint8)
    for i, label in enumerate(labels):
        photo, (_, low, high) = photos[label], sources[label]
        side = int(rng.integers(low, high + 1))
        top = int(rng.integers(0, photo.shape[0] - side + 1))
        left = int(rng.integers(0, photo.shape[1] - side + 1))
        crop = Image.fromarray(photo[top : top + side, left : left + side])
        pixels = np.asarray(crop.resize((spec.side, spec.side), Image.BOX))
        out[i] = pixels[:, ::-1] if rng.random() < 0.5 else pixels
    if spec.rgb and out.ndim == 3:
        return np.repeat(out[..., None], 3, axis=-1), labels
    return out, labels
