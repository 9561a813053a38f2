"""Image files for the hostile batteries."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path


def png_header_only(path: Path, width: int, height: int) -> Path:
    """A PNG that declares width x height and holds no pixels (a decompression bomb's header): PIL
    reads the size from it, and decoding it fails as truncated."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IEND", b""))
    return path
