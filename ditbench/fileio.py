"""Atomic file writes: a crash at any moment leaves either the old file or the new one, never half.

Every output ditbench writes whole (records' result files, checkpoints, npz batches, caches,
reports) goes through `atomic_write`: a temporary file in the same folder, flushed and fsynced,
then renamed over the target; on failure the temporary file is removed and the error re-raised.
The file gets the permissions an ordinary write would give it: the umask's for a new file (mkstemp
alone makes every file 0600), the old file's when it replaces one.

Link-safe primitives for the files ditbench keeps in a folder it owns (an output folder's lock,
results.jsonl, cell logs, `.inflight/`): `open_nofollow` opens with O_NOFOLLOW, `rmtree_real`
deletes only a real folder, never what a link points to. A link planted where ditbench keeps its
own file is refused (UserError, exit 2), never followed: a link there could otherwise make a run
truncate, lock or empty a file or folder outside the output folder. An atomic write replaces a
link by a file (rename does not follow it), so it needs no check.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

_UMASK_LOCK = threading.Lock()
O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def link_refusal(path: str | Path, what: str = "") -> str:
    """The one-paragraph refusal of a symbolic link found where ditbench keeps its own file."""
    try:
        target = os.readlink(path)
    except OSError:
        target = "?"
    from ditbench.errors import shorten

    return (
        f"{what + ': ' if what else ''}{shorten(str(path), 240)} is a symbolic link "
        f"(to {shorten(target, 240)}), where "
        "ditbench keeps a file or folder of its own; ditbench never creates, repairs, locks, empties or "
        "deletes anything through a link. Remove the link (or move what it names into its place), or "
        "give another folder."
    )


def refuse_link(path: str | Path, what: str = "") -> None:
    """UserError when `path` itself is a symbolic link (checked with lstat, the link is not followed)."""
    if os.path.islink(path):
        from ditbench.errors import UserError

        raise UserError(link_refusal(path, what))


def open_nofollow(path: str | Path, flags: int, mode: int = 0o644, what: str = "") -> int:
    """os.open with O_NOFOLLOW | O_CLOEXEC; a link at `path` is a UserError, its target is never opened."""
    try:
        return os.open(path, flags | O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as err:
        if err.errno == errno.ELOOP or (err.errno == errno.EMLINK and os.path.islink(path)):
            from ditbench.errors import UserError

            raise UserError(link_refusal(path, what)) from None
        raise


def open_log(path: str | Path, append: bool = False) -> IO[bytes]:
    """A log file for a child's output, opened without following a link planted at `path`."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
    return os.fdopen(open_nofollow(path, flags), "ab" if append else "wb")


def append_text(path: str | Path, text: str) -> None:
    """Append UTF-8 text to a file another program also appends to; never blocks (a FIFO is refused).

    O_NONBLOCK: opening a FIFO nobody reads would otherwise wait forever (ENXIO instead).
    """
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    try:
        mode = os.fstat(fd).st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISCHR(mode)):  # a regular file, or /dev/null
            raise OSError(errno.EINVAL, "not a regular file")
        data = text.encode("utf-8")
        while data:
            data = data[os.write(fd, data) :]
    finally:
        os.close(fd)


def rmtree_real(path: str | Path) -> None:
    """Delete a folder and what it holds, never following a link: a link at `path` is only unlinked.

    shutil.rmtree does not follow links inside the tree (fd-based on Linux); this also covers the top.
    """
    path = Path(path)
    if path.is_symlink():
        path.unlink(missing_ok=True)
        return
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def mkdir_real(path: str | Path, what: str = "") -> Path:
    """Create a folder ditbench keeps its files in (parents included) and refuse a link in its place."""
    path = Path(path)
    refuse_link(path, what)
    path.mkdir(parents=True, exist_ok=True)
    refuse_link(path, what)  # planted meanwhile: mkdir's exist_ok accepts a link to a folder
    return path


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
