"""One writer per output folder: `OutputLock(folder, command)` flocks `<folder>/.ditbench.lock` through
filelock (released by the kernel however its holder dies) and writes its holder's PID, host, process
start and command into it, so a second process is told who holds the folder. Where flock is refused
(Lustre without `flock`, some NFS) the lock is that record itself, created atomically (`os.link`) as
`.ditbench.lock.held`; a dead holder's on this host is taken over.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

from ditbench.core.errors import UserError, shorten
from ditbench.files.fileio import check_target, link_refusal, open_regular, read_regular

LOCK_NAME = ".ditbench.lock"
HELD_NAME = ".ditbench.lock.held"  # the lock itself where flock is not supported
_NO_FLOCK = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}
_CANNOT_CREATE = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOENT, errno.ENOTDIR, errno.ENOSPC}
_TAKEOVER_TRIES = 3


def process_start(pid: int) -> float | None:
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def holder_record(command: str) -> dict[str, Any]:
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "process_start": process_start(os.getpid()),
        "command": command,
        "since": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z"),
    }


def holder_alive(holder: dict[str, Any]) -> bool | None:
    """Whether the process a record names still runs: None when it is on another host (unknowable)."""
    if holder.get("host") != socket.gethostname():
        return None
    pid = holder.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    start = process_start(pid)
    if start is None:
        return False
    recorded = holder.get("process_start")
    return not isinstance(recorded, (int, float)) or abs(start - recorded) < 1.0  # else: a reused PID


def _parse(data: bytes) -> dict[str, Any] | None:
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None


def describe(holder: dict[str, Any] | None) -> str:
    if not holder:
        return "another process (it has not written its PID yet)"
    text = f"PID {shorten(holder.get('pid'), quote=False)} on host {shorten(holder.get('host'), quote=False)}"
    if holder.get("since"):
        text += f", since {shorten(holder['since'], quote=False)}"
    if holder.get("command"):
        text += f" (`{shorten(holder['command'], 120, quote=False)}`)"
    return text


class OutputLock:
    """Context manager: hold `folder` exclusively or raise UserError naming the holder."""

    def __init__(self, folder: str | Path, command: str | None = None, what: str = "--out", hint: str = ""):
        self.folder = Path(folder)
        self.command = command or " ".join(["ditbench", *sys.argv[1:]])[:500]
        self.what = what
        self.hint = hint  # appended to the message a second process gets
        self._lock: Any = None  # the filelock.FileLock held
        self._held_file: Path | None = None
        self.stale: dict[str, Any] | None = None  # the record of a killed holder this lock replaced

    def acquire(self) -> OutputLock:
        from filelock import FileLock, Timeout

        path = self.folder / LOCK_NAME
        if not self.folder.is_dir():  # filelock would create the folders; the caller makes (and checks) them
            raise UserError(
                f"{self.what} {shorten(str(self.folder))}: cannot create its lock file {LOCK_NAME} (no such "
                "folder); give a folder you can write in."
            )
        check_target(path, self.what, in_place=True)  # a link, FIFO, device or second hard link planted
        previous: list[dict[str, Any] | None] = []
        record = json.dumps(holder_record(self.command)).encode()

        def write_holder(fd: int) -> None:  # filelock hands the locked descriptor over: our record in it
            # a hard link planted meanwhile: UserError, which filelock raises after releasing the lock
            check_target(path, self.what, in_place=True, st=os.fstat(fd))
            try:
                previous.append(_parse(os.pread(fd, 64_000, 0)))
            except OSError:
                previous.append(None)
            os.ftruncate(fd, 0)
            os.pwrite(fd, record, 0)

        # filelock opens with O_NOFOLLOW (a planted link is ELOOP, its target untouched) and O_NONBLOCK;
        # on_acquired turns its own soft fallback off, so a file system without flock comes back as an
        # OSError and gets ours below, whose record names the command too.
        lock = FileLock(str(path), timeout=0, thread_local=False, on_acquired=write_holder)
        try:
            lock.acquire()
        except Timeout:
            try:  # who holds it, read without following a link or blocking on a FIFO
                holder = _parse(read_regular(path))
            except (OSError, UserError):
                holder = None
            raise self._busy(holder) from None
        except OSError as err:
            if err.errno == errno.ELOOP:
                raise UserError(link_refusal(path, self.what)) from None
            if err.errno in _NO_FLOCK:
                return self._acquire_held_file()
            if err.errno in _CANNOT_CREATE:
                raise UserError(
                    f"{self.what} {shorten(str(self.folder))}: cannot create its lock file {LOCK_NAME} "
                    f"({err.strerror or err}); give a folder you can write in."
                ) from None
            raise UserError(
                f"{self.what} {shorten(str(self.folder))}: cannot lock {LOCK_NAME} ({err.strerror or err})."
            ) from None
        held = previous[0] if previous else None
        if held and held.get("pid") is not None:
            self.stale = held  # a holder that died without clearing its record (SIGKILL)
        self._lock = lock
        return self

    def _busy(self, holder: dict[str, Any] | None, held: Path | None = None) -> UserError:
        """Who holds the folder; `held`: the record file that is the lock where flock is refused."""
        folder = shorten(str(self.folder))
        alive = holder_alive(holder) if holder else True
        if alive is False:  # the lock is held, but not by the process its record names
            text = (
                f"{self.what} {folder} is in use: the lock file names {describe(holder)}, which no longer "
                "runs: a process it started, or one that is taking the lock right now, holds it "
                f"(`fuser {folder}/{LOCK_NAME}` shows it). Wait for it, or give another {self.what}."
            )
        else:
            text = (
                f"{self.what} {folder} is in use by another ditbench process, {describe(holder)}. Two runs "
                "writing one folder would each run every cell; wait for it to finish, or give another "
                f"{self.what}."
            )
            if held is not None and alive is None:
                gone = "If that run is gone (its host cannot be checked from here), delete"
                text += f" {gone} {shorten(str(held))}."
        return UserError(f"{text} {self.hint}" if self.hint else text)

    def _acquire_held_file(self) -> OutputLock:
        held = self.folder / HELD_NAME
        check_target(held, self.what)  # read and deleted below: never through a link, never a FIFO
        record = json.dumps(holder_record(self.command)).encode()
        for _ in range(_TAKEOVER_TRIES):
            tmp = self.folder / f"{HELD_NAME}.{os.getpid()}.tmp"
            tmp.unlink(missing_ok=True)  # O_EXCL below: never written through a planted link
            fd = open_regular(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, what=self.what)
            with os.fdopen(fd, "wb") as f:
                f.write(record)
            try:
                os.link(tmp, held)  # atomic: exactly one contender creates it
                self._held_file = held
                return self
            except FileExistsError:
                pass
            finally:
                tmp.unlink(missing_ok=True)
            try:
                holder = _parse(read_regular(held, self.what))
            except FileNotFoundError:
                continue  # released meanwhile
            alive = holder_alive(holder) if holder else None
            if alive is not False:
                raise self._busy(holder, held)
            self._take_over(held, holder)
        raise self._busy(None, held)

    def _take_over(self, held: Path, holder: dict[str, Any] | None) -> None:
        """Move a dead holder's record aside; if a live contender's record was moved instead, put it back."""
        aside = held.with_name(f"{HELD_NAME}.stale.{os.getpid()}")
        try:
            os.rename(held, aside)
        except FileNotFoundError:
            return
        if _parse(read_regular(aside, self.what)) == holder:
            self.stale = holder
            aside.unlink(missing_ok=True)
            return
        with contextlib.suppress(FileExistsError):  # not the stale record: someone took the lock meanwhile
            os.link(aside, held)
        aside.unlink(missing_ok=True)

    def release(self) -> None:
        if self._lock is not None:
            with contextlib.suppress(OSError, UserError):  # still held: clear our record (empty: no holder)
                os.close(open_regular(self.folder / LOCK_NAME, os.O_WRONLY | os.O_TRUNC))
            self._lock.release()
            self._lock = None
        if self._held_file is not None:
            self._held_file.unlink(missing_ok=True)
            self._held_file = None

    def __enter__(self) -> OutputLock:
        return self.acquire() if self._lock is None and self._held_file is None else self

    def __exit__(self, *exc: object) -> None:
        self.release()
