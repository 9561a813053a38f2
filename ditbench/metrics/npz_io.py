"""Image batches in the ADM format (`.npz` with uint8 N x H x W x 3 `arr_0`) and image folders.

50,000 images at 256 px are 9.8 GB, so `arr_0` is streamed out of its zip member and folders are decoded
a batch at a time. Every source is validated when opened, before any compute.
"""

from __future__ import annotations

import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from PIL import Image

from ditbench.core.errors import UserError, shorten
from ditbench.files.fileio import atomic_write
from ditbench.files.imageload import PHOTO_PIXELS, PIXELS_ENV, load_rgb, max_pixels, open_image
from ditbench.files.outpaths import not_a_file

IMAGE_KEY = "arr_0"
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg")
# What reading a zip member can raise on a damaged or unusual file (RuntimeError: encrypted, or its
# subclass NotImplementedError: a compression method zipfile lacks).
ZIP_ERRORS = (zipfile.BadZipFile, zlib.error, OSError, EOFError, RuntimeError, ValueError)

_ADM_FORMAT = "an ADM batch: `arr_0` of uint8 images N x H x W x 3 in [0, 255]"
_NOT_RGB = {  # channels (None: N x H x W) -> what the images are, and how to make them RGB
    None: ("grey images N x H x W", "repeat the channel with `np.repeat(x[..., None], 3, axis=-1)`"),
    1: ("grey images with one channel", "repeat the channel with `np.repeat(x, 3, axis=-1)`"),
    4: ("RGBA images", "drop the alpha channel with `x[..., :3]`"),
}


def _float_hint(sample: np.ndarray) -> str:
    lo, hi = float(np.nanmin(sample)), float(np.nanmax(sample))
    span, to_uint8 = f"Its values span [{lo:.3g}, {hi:.3g}]", ".round().clip(0, 255).astype(np.uint8)`"
    if lo < 0:
        return f"{span}, which looks like model output in [-1, 1]; convert with `((x + 1) * 127.5){to_uint8}"
    if hi <= 1.0:
        return f"{span}, i.e. [0, 1]; convert with `(x * 255){to_uint8}"
    return f"{span}; convert with `x{to_uint8}"


def validate_image_array_layout(shape: tuple, dtype: np.dtype, where: str, peek=None) -> None:
    """Raise a UserError unless (shape, dtype) is uint8 N x H x W x 3. `peek()` returns a few rows."""
    dtype = np.dtype(dtype)
    if dtype.hasobject:
        raise UserError(
            f"{where} holds Python objects (a pickled object array), which ditbench never loads; it "
            f"reads {_ADM_FORMAT}."
        )
    if dtype.kind == "f":
        hint = _float_hint(peek()) if peek is not None and (shape[0] if shape else 0) else ""
        raise UserError(f"{where} holds {dtype} values; ditbench fid reads {_ADM_FORMAT}. {hint}".strip())
    if dtype != np.uint8:
        raise UserError(
            f"{where} has dtype {shorten(str(dtype), quote=False)}; ditbench fid reads {_ADM_FORMAT}."
        )
    if any(d < 0 for d in shape):
        raise UserError(
            f"{where} declares shape {shorten(shape)}, with a negative size; the file is corrupt."
        )
    channels = shape[-1] if len(shape) == 4 else None
    if len(shape) == 3 or channels in (1, 4):
        what, fix = _NOT_RGB[channels]
        raise UserError(f"{where} has shape {shape}: {what}. ditbench fid needs RGB, {_ADM_FORMAT}; {fix}.")
    if len(shape) != 4:
        raise UserError(f"{where} has shape {shorten(shape)}; ditbench fid reads {_ADM_FORMAT}.")
    n, h, w, c = shape
    if c != 3 and shape[1] in (1, 3, 4):
        raise UserError(
            f"{where} has shape {shape}, which is channels-first (N x C x H x W); ditbench fid reads "
            f"{_ADM_FORMAT}. Transpose with `x.transpose(0, 2, 3, 1)`."
        )
    if c != 3:
        raise UserError(f"{where} has shape {shape}; ditbench fid reads {_ADM_FORMAT}.")
    if n == 0 or h == 0 or w == 0:
        raise UserError(f"{where} has shape {shape}: it holds no images.")
    if h * w > (cap := max_pixels(PHOTO_PIXELS)):  # FID resizes to 299 x 299; 100 such images: 27 GB
        raise UserError(
            f"{where} holds images of {h}x{w} pixels, more than {cap:,} per image; FID images are "
            f"resized to 299x299, so resize them first (or set ${PIXELS_ENV})."
        )


class ImageSource:
    """uint8 N x H x W x 3 images, read in batches."""

    path: Path | None
    count: int
    height: int
    width: int

    def batches(self, batch_size: int) -> Iterator[np.ndarray]:
        raise NotImplementedError

    def describe(self) -> dict:
        return {
            "path": str(self.path) if self.path else None,
            "count": self.count,
            "height": self.height,
            "width": self.width,
            "kind": type(self).__name__,
        }


class ArrayImages(ImageSource):
    """Images already in memory (a numpy array or memmap); used by tests and benchmarks."""

    def __init__(self, images: np.ndarray, name: str = "array"):
        validate_image_array_layout(images.shape, images.dtype, f"the {name}", peek=lambda: images[:8])
        self.images, self.name, self.path = images, name, None
        self.count, self.height, self.width = images.shape[0], images.shape[1], images.shape[2]

    def batches(self, batch_size: int) -> Iterator[np.ndarray]:
        for i in range(0, self.count, batch_size):
            yield np.ascontiguousarray(self.images[i : i + batch_size])


def reason(err: BaseException) -> str:
    """An exception as a bounded clause for a message: what the library said, not a traceback."""
    return shorten(f"{type(err).__name__}: {err}", 200, quote=False)


def describe_keys(zf: zipfile.ZipFile) -> str:
    """The array names of an npz, bounded for a message."""
    names = [n[:-4] if n.endswith(".npy") else n for n in zf.namelist()]
    return shorten(", ".join(names), 200, quote=False) if names else "none"


def open_zip(path: Path) -> zipfile.ZipFile:
    """An .npz opened as the zip it is; UserError for anything that is not a readable regular file."""
    if (why := not_a_file(path)) is not None:  # a FIFO or a device is named as such, never opened
        raise UserError(
            f"{path} {why}. Give an ADM-format .npz ({_ADM_FORMAT}) or a folder of PNG/JPEG images."
        )
    try:
        return zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as err:
        raise UserError(
            f"{path} is not a readable .npz ({reason(err)}); the file is truncated or "
            "corrupt (an .npz is a zip of .npy arrays). Write it again with `np.savez(path, arr_0=images)`."
        ) from None


def open_member(zf: zipfile.ZipFile, name: str, where: str):
    """A zip member opened for reading; encrypted or oddly compressed members are named errors."""
    try:
        return zf.open(name)
    except ZIP_ERRORS as err:
        raise UserError(
            f"{where} cannot be read ({reason(err)}); write the "
            "file again with numpy (`np.savez`), unencrypted."
        ) from None


def read_npy_header(f, where: str):
    """(shape, fortran order, dtype, data offset) of an .npy stream, from its header alone."""
    try:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
        else:  # 2.0 and 3.0 (a UTF-8 header) share the layout
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
    except (*ZIP_ERRORS, SyntaxError, TypeError) as err:
        raise UserError(
            f"{where} has an unreadable .npy header ({reason(err)}); the file is truncated or corrupt."
        ) from None
    return shape, fortran, np.dtype(dtype), f.tell()


class NpzImages(ImageSource):
    """`arr_0` of an ADM `.npz`, streamed row-chunk by row-chunk out of the zip member."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.where = f"{self.path} (key `{IMAGE_KEY}`)"
        with open_zip(self.path) as zf:
            member = IMAGE_KEY + ".npy"
            if member not in zf.namelist():
                raise UserError(
                    f"{self.path} has no `{IMAGE_KEY}` array (its keys: {describe_keys(zf)}); ditbench fid "
                    f"reads {_ADM_FORMAT}. Save images with `np.savez(path, arr_0=images)`."
                )
            info = zf.getinfo(member)
            with open_member(zf, member, self.where) as f:
                shape, fortran, dtype, self._offset = read_npy_header(f, self.where)
                peek = lambda: self._peek(f, shape, dtype)  # noqa: E731
                validate_image_array_layout(shape, dtype, self.where, peek=peek)
        if fortran:
            raise UserError(
                f"{self.where} is stored in Fortran order; save a C-ordered array "
                "(`np.ascontiguousarray(x)`)."
            )
        self.count, self.height, self.width = int(shape[0]), int(shape[1]), int(shape[2])
        self.row_bytes = self.height * self.width * 3
        expected = self._offset + self.count * self.row_bytes
        if info.file_size != expected:
            raise UserError(
                f"{self.where} declares {self.count} images of {self.height}x{self.width} "
                f"({expected} bytes) but the member holds {info.file_size} bytes; the file is truncated "
                "or corrupt."
            )

    @staticmethod
    def _peek(f, shape, dtype):
        rows = min(int(shape[0]), 4)
        n = rows * int(np.prod(shape[1:], dtype=np.int64)) if len(shape) > 1 else rows
        return np.frombuffer(f.read(n * dtype.itemsize), dtype=dtype)

    def batches(self, batch_size: int) -> Iterator[np.ndarray]:
        with open_zip(self.path) as zf, open_member(zf, IMAGE_KEY + ".npy", self.where) as f:
            f.seek(self._offset) if f.seekable() else f.read(self._offset)
            done = 0
            while done < self.count:
                rows = min(batch_size, self.count - done)
                try:
                    buf = f.read(rows * self.row_bytes)
                except ZIP_ERRORS as err:
                    raise UserError(
                        f"{self.where} could not be read past image {done} ({reason(err)}); "
                        "the file is truncated or corrupt."
                    ) from None
                if len(buf) != rows * self.row_bytes:
                    raise UserError(
                        f"{self.where} ends after {done + len(buf) // self.row_bytes} of {self.count} "
                        "images; the file is truncated or corrupt."
                    )
                # bytearray: a writable array (torch.from_numpy warns on read-only memory)
                yield np.frombuffer(bytearray(buf), dtype=np.uint8).reshape(rows, self.height, self.width, 3)
                done += rows
            try:  # reading to the end lets zipfile check the CRC
                f.read(1)
            except zipfile.BadZipFile as err:
                raise UserError(f"{self.where} failed its checksum ({err}); the file is corrupt.") from None


_GREY_MODES = {"1", "L", "I", "I;16", "I;16B", "I;16L", "F"}
_ALPHA_MODES = {"RGBA", "LA", "PA", "RGBa", "La"}


def _image_mode_problem(img: Image.Image) -> str | None:
    mode = img.mode
    if mode in _GREY_MODES:
        return f"a grey image (PIL mode {mode}); convert it to RGB (e.g. `Image.open(p).convert('RGB')`)"
    if mode in _ALPHA_MODES or (mode == "P" and "transparency" in img.info):
        return f"an image with an alpha channel (PIL mode {mode}); save it as RGB without transparency"
    return None


class FolderImages(ImageSource):
    """PNG/JPEG files directly in a folder (not its subfolders), in sorted name order."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.is_dir():
            raise UserError(f"{self.path} does not exist or is not a folder.")
        try:
            self.files = sorted(
                p for p in self.path.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS
            )
        except OSError as err:
            raise UserError(f"The folder {self.path} cannot be listed ({reason(err)}).") from None
        if not self.files:
            raise UserError(
                f"{self.path} holds no .png, .jpg or .jpeg files (subfolders are not searched). Give a "
                f"folder of RGB images or an ADM-format .npz ({_ADM_FORMAT})."
            )
        first_size = None
        for p in self.files:  # headers only: cheap, and all problems surface before any compute
            with open_image(p, PHOTO_PIXELS, "FID (resized to 299x299)") as img:
                size, problem = img.size, _image_mode_problem(img)
            if problem:
                raise UserError(f"{p} is {problem}. ditbench fid needs RGB images.")
            if first_size is None:
                first_size, first_file = size, p
            elif size != first_size:
                raise UserError(
                    f"Images in {self.path} differ in size: {first_file.name} is {first_size[0]}x"
                    f"{first_size[1]} but {p.name} is {size[0]}x{size[1]} (width x height). Resize them "
                    "to one size first, the way the reference images were."
                )
        self.count, (self.width, self.height) = len(self.files), first_size

    def load(self, p: Path) -> np.ndarray:
        return np.asarray(load_rgb(p, PHOTO_PIXELS, "FID (resized to 299x299)"))

    def batches(self, batch_size: int, pool=None) -> Iterator[np.ndarray]:
        load = pool.map if pool is not None else map  # PIL decodes without the GIL: threads help
        for i in range(0, self.count, batch_size):
            yield np.stack(list(load(self.load, self.files[i : i + batch_size])))


def open_images(path: str | Path) -> ImageSource:
    """An `.npz` (its `arr_0`) or a folder of images."""
    # a missing or special file is refused when it is opened
    return FolderImages(path) if Path(path).is_dir() else NpzImages(path)


def write_npz_images(path: str | Path, batches, count: int, height: int, width: int) -> Path:
    """Stream uint8 N x H x W x 3 batches into an ADM `.npz` (`arr_0`, stored uncompressed), atomically:
    the array never exists in memory whole, and a crash leaves no half-written file."""
    header = {
        "descr": np.lib.format.dtype_to_descr(np.dtype(np.uint8)),
        "fortran_order": False,
        "shape": (count, height, width, 3),
    }

    def write(file) -> None:
        written = 0
        with (
            zipfile.ZipFile(file, "w", zipfile.ZIP_STORED, allowZip64=True) as zf,
            zf.open(IMAGE_KEY + ".npy", "w", force_zip64=True) as f,
        ):
            np.lib.format.write_array_header_1_0(f, header)
            for batch in batches:
                batch = np.ascontiguousarray(batch, dtype=np.uint8)
                if batch.shape[1:] != (height, width, 3):
                    raise ValueError(
                        f"batch of shape {batch.shape} in a batch file of {height}x{width}x3 images"
                    )
                f.write(batch.tobytes())
                written += len(batch)
        if written != count:
            raise ValueError(f"{written} images written, {count} declared")

    return atomic_write(path, write)
