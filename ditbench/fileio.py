"""Atomic file writes: a crash at any moment leaves either the old file or the new one, never half.

Every output ditbench writes whole (records' result files, checkpoints, npz batches, caches,
reports) goes through `atomic_write`: a temporary file in the same folder, flushed and fsynced,
then renamed over the target; on failure the temporary file is removed and the error re-raised.
The file gets the permissions an ordinary write would give it: the umask's for a new file (mkstemp
alone makes every file 0600), the old file's when it replaces one.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

_UMASK_LOCK = threading.Lock()


def current_umask() -> int:
    """The process umask; read from /proc where it can be, since os.umask can only read it by setting it."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    with _UMASK_LOCK:
        old = os.umask(0o077)
        os.umask(old)
        return old


def _mode_for(path: Path) -> int:
    try:
        return stat.S_IMODE(path.stat().st_mode)  # replacing a file keeps its permissions
    except OSError:
        return 0o666 & ~current_umask()  # what open(path, "w") would have made


def atomic_write(path: str | Path, write: Callable[[IO[bytes]], Any]) -> Path:
    """Call write(binary_file) on a temporary file next to `path`, then rename it into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, _mode_for(path))
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def write_atomic(path: str | Path, data: bytes | str) -> Path:
    """Write bytes, or text as UTF-8, atomically."""
    payload = data.encode("utf-8") if isinstance(data, str) else data
    return atomic_write(path, lambda f: f.write(payload))


def write_json_atomic(path: str | Path, obj: Any, **dumps_kwargs: Any) -> Path:
    return write_atomic(path, json.dumps(obj, **dumps_kwargs))


def download_atomic(url: str, dest: Path) -> None:
    """Download url to dest through a temporary file beside it: a cut download leaves no partial file."""
    import torch  # only when a download happens

    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=dest.name + ".", suffix=".part")
    os.close(fd)
    try:
        torch.hub.download_url_to_file(url, tmp, progress=True)
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
