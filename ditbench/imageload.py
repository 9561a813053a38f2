"""Images from a user's folder (extract-latents, training on images): each file checked by its header
before it is decoded, so a decompression bomb or a damaged file is one paragraph naming it.

A PNG can declare 100,000 x 100,000 pixels in a few hundred bytes; decoding it would allocate 30 GB.
PIL refuses beyond twice its MAX_IMAGE_PIXELS with DecompressionBombError (an exception nothing
caught, so a traceback from inside a DataLoader) and only warns between once and twice. Here any
image beyond MAX_PIXELS is refused from its header, before a byte of it is decoded.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from PIL import Image, UnidentifiedImageError

from ditbench.errors import UserError

MAX_PIXELS = Image.MAX_IMAGE_PIXELS or 89_478_485  # PIL's own limit (about 9,459 x 9,459)


def load_rgb(path: str | Path) -> Image.Image:
    """The image at `path` as RGB; UserError (naming the file) for a bomb, a damaged or unknown file."""
    try:
        with warnings.catch_warnings():  # the size is checked below, from the header
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path) as img:
                width, height = img.size
                if width * height > MAX_PIXELS:
                    raise UserError(
                        f"image {path} declares {width:,} x {height:,} pixels, more than an image decoder "
                        f"should allocate ({MAX_PIXELS:,}); it is a decompression bomb or far larger than "
                        "training needs. Resize it, or remove it from the folder."
                    )
                return img.convert("RGB")
    except Image.DecompressionBombError as err:
        raise UserError(f"image {path} declares more pixels than a decoder should allocate ({err})") from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as err:
        raise UserError(f"image {path} is not a readable image ({err}); it is truncated or corrupt") from None
