"""Every file ditbench writes, or reads back as its own, goes through here: atomically (`atomic_write`),
and only a regular file (`check_target`: never through a link, never a FIFO, device or folder; a file changed
in place has no second hard link). Text is UTF-8 with a lone surrogate escaped.
"""

from __future__ import annotations

import contextlib
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

from ditbench.core.errors import UserError, shorten

_UMASK_LOCK = threading.Lock()
_CHANGES = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_TRUNC
_KINDS = {stat.S_IFLNK: "a symbolic link", stat.S_IFDIR: "a folder", stat.S_IFIFO: "a FIFO (a named pipe)"}
_KINDS.update({stat.S_IFCHR: "a device", stat.S_IFBLK: "a device", stat.S_IFSOCK: "a socket"})


def file_kind(mode: int) -> str | None:
    """What a path that is not a regular file is, in words ("a folder"), or None for a regular file."""
    return _KINDS.get(stat.S_IFMT(mode))


def link_refusal(path: str | Path, what: str = "") -> str:
    """The one-paragraph refusal of a symbolic link found where ditbench writes or keeps a file."""
    try:
        target = os.readlink(path)
    except OSError:
        target = "?"
    return (
        f"{what + ': ' if what else ''}{shorten(str(path), 240)} is a symbolic link "
        f"(to {shorten(target, 240)}); ditbench never writes, repairs, locks, empties or deletes anything "
        "through a link. Give the path it points to, remove the link (or move what it names into its "
        "place), or give another path."
    )


def check_target(
    path: str | Path, what: str = "", *, in_place: bool = False, st: os.stat_result | None = None
) -> None:
    """UserError when what is at `path` (lstat'd, or fstat'd as `st`) is not a regular file ditbench may
    replace or read back, or (`in_place`: appended to, repaired, truncated) change in place; nothing there
    is fine."""
    try:
        st = os.lstat(path) if st is None else st
    except (FileNotFoundError, NotADirectoryError):
        return
    if stat.S_ISLNK(st.st_mode):
        raise UserError(link_refusal(path, what))
    where = f"{what + ' ' if what else ''}{shorten(str(path), 240)}"
    if not stat.S_ISREG(st.st_mode):
        kind = file_kind(st.st_mode) or "not a regular file"
        raise UserError(
            f"{where} is {kind}, not a regular file; ditbench writes, replaces and reads back regular files "
            "only (a FIFO would block it, a device would be destroyed). Move it away, or give the path of "
            "a regular file (or of one to create)."
        )
    if in_place and st.st_nlink > 1:
        raise UserError(
            f"{where} has {st.st_nlink} hard links: ditbench changes it in place (appends to it, repairs "
            "or truncates it), which would change the other names' file too. Remove the other links (or "
            "copy the file into its place), or give another path."
        )


def refuse_link(path: str | Path, what: str = "") -> None:
    if os.path.islink(path):
        raise UserError(link_refusal(path, what))


def open_regular(path: str | Path, flags: int = os.O_RDONLY, mode: int = 0o644, what: str = "") -> int:
    """os.open through `check_target`, checked on the path (lstat: a FIFO or device is never opened) and again
    on the descriptor (O_NOFOLLOW | O_NONBLOCK: something planted meanwhile); O_TRUNC only after both."""
    in_place = bool(flags & _CHANGES)
    check_target(path, what, in_place=in_place)
    try:
        fd = os.open(path, (flags & ~os.O_TRUNC) | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.EMLINK, errno.ENXIO):  # a link, or a FIFO, planted meanwhile
            check_target(path, what, in_place=in_place)
        raise
    try:
        check_target(path, what, in_place=in_place, st=os.fstat(fd))
        if flags & os.O_TRUNC:
            os.ftruncate(fd, 0)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(path: str | Path, what: str = "") -> bytes:
    """The bytes of a file ditbench reads back (a ticket, a cache entry, results.jsonl)."""
    with os.fdopen(open_regular(path, os.O_RDONLY, what=what), "rb") as f:
        return f.read()


def open_log(path: str | Path, append: bool = False, what: str = "") -> IO[bytes]:
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
    return os.fdopen(open_regular(path, flags, what=what), "ab" if append else "wb")


def append_text(path: str | Path, text: str, what: str = "") -> None:
    """Append text to a regular file another program also appends to."""
    with open_log(path, append=True, what=what) as f:
        f.write(text.encode("utf-8", "backslashreplace"))


def rmtree_real(path: str | Path) -> None:
    """Delete a folder and what it holds, never following a link (a link at `path` is only unlinked)."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
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
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status") as f:
        for line in f:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    with _UMASK_LOCK:
        old = os.umask(0o077)
        os.umask(old)
        return old


def atomic_write(path: str | Path, write: Callable[[IO[bytes]], Any], what: str = "") -> Path:
    """Call write(binary_file) on a temporary file next to `path`, then rename it into place; only a
    regular file (or nothing) at `path` is replaced (checked before and again just before the rename)."""
    path = Path(path)
    check_target(path, what)
    try:
        mode = stat.S_IMODE(path.stat().st_mode)  # replacing a file keeps its permissions
    except OSError:
        mode = 0o666 & ~current_umask()  # what open(path, "w") would have made
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        check_target(path, what)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def write_atomic(path: str | Path, data: bytes | str, what: str = "") -> Path:
    payload = data.encode("utf-8", "backslashreplace") if isinstance(data, str) else data
    return atomic_write(path, lambda f: f.write(payload), what)


def write_json_atomic(path: str | Path, obj: Any, **dumps_kwargs: Any) -> Path:
    return write_atomic(path, json.dumps(obj, **dumps_kwargs))


def download_atomic(url: str, dest: Path) -> None:
    """Download `url` to `dest` through atomic_write: a cut download leaves no partial file."""
    import urllib.request

    from ditbench.core.progress import progress

    def fetch(f: IO[bytes]) -> None:
        with urllib.request.urlopen(urllib.request.Request(url, headers={"User-Agent": "ditbench"})) as got:
            size = int(got.headers.get("Content-Length") or 0) or None
            with progress(total=size, unit="B", desc=f"downloading {dest.name}") as bar:
                while chunk := got.read(1 << 20):
                    f.write(chunk)
                    bar.update(len(chunk))

    atomic_write(dest, fetch)
