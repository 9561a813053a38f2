"""Every image ditbench decodes: its size read from the header and refused beyond a cap (PHOTO_PIXELS,
GRID_PIXELS for sample grids; $DITBENCH_MAX_IMAGE_PIXELS replaces both) before any pixel is decoded (a
PNG of a few hundred bytes can declare 30 GB); a damaged file is one paragraph naming it.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from PIL import Image, UnidentifiedImageError

from ditbench.core.errors import UserError, shorten

PIXELS_ENV = "DITBENCH_MAX_IMAGE_PIXELS"
PHOTO_PIXELS = 89_478_485  # PIL's default MAX_IMAGE_PIXELS
GRID_PIXELS = 4096 * 4096


def max_pixels(default: int) -> int:
    """The cap for one use: `default`, or $DITBENCH_MAX_IMAGE_PIXELS where it is set."""
    text = os.environ.get(PIXELS_ENV, "").strip().replace("_", "").replace(",", "")
    if not text:
        return default
    if not text.isdigit() or int(text) <= 0:
        raise UserError(
            f"${PIXELS_ENV} is {shorten(os.environ[PIXELS_ENV])}; set it to a whole number of pixels per "
            f"image (for example {PHOTO_PIXELS}), or unset it for the defaults."
        )
    cap = int(text)
    if cap > (Image.MAX_IMAGE_PIXELS or 0):  # PIL refuses beyond twice its bound when it opens a file
        Image.MAX_IMAGE_PIXELS = cap
    return cap


@contextmanager
def open_image(path: str | Path, cap: int, use: str) -> Iterator[Image.Image]:
    """PIL's lazily opened image at `path`, refused (UserError) beyond `cap` pixels; `use` names what it
    is for. A decode inside the `with` that fails (a truncated file) is a UserError naming it too."""
    limit = max_pixels(cap)
    where = shorten(str(path), 200, quote=False)
    try:
        with warnings.catch_warnings():  # PIL's bomb warning: the size is checked here, from the header
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path) as img:
                width, height = img.size
                if width * height > limit:
                    raise UserError(
                        f"image {where} declares {width:,} x {height:,} pixels, more than {limit:,}, the "
                        f"most an image decoder should allocate for {use}; it is a decompression bomb or "
                        f"far larger than needed. Resize it, or set ${PIXELS_ENV} to read it anyway."
                    )
                yield img
    except Image.DecompressionBombError as err:
        raise UserError(
            f"image {where} declares more pixels than an image decoder should allocate for {use} ({err}); "
            f"resize it, or set ${PIXELS_ENV} to read it anyway."
        ) from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, EOFError) as err:
        raise UserError(
            f"image {where} is not a readable image ({err}); it is truncated or corrupt."
        ) from None


def load_rgb(path: str | Path, cap: int = PHOTO_PIXELS, use: str = "training") -> Image.Image:
    with open_image(path, cap, use) as img:
        return img.convert("RGB")
