"""Process plumbing every launcher shares: no cell outlives its parent, and a log's tail for the record."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil

PR_SET_PDEATHSIG = 1  # prctl option: the signal a process gets when its parent dies (Linux)


def die_with_parent(sig: int) -> Callable[[], None] | None:
    """A preexec_fn so the child gets `sig` when its parent dies (even by SIGKILL); None off Linux."""
    if not sys.platform.startswith("linux"):
        return None

    def preexec() -> None:
        import ctypes

        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, sig)
        except (OSError, AttributeError):
            pass

    return preexec


def watch_parent(poll_s: float = 0.5) -> None:
    """Exit when the parent dies (torchrun SIGKILLed on a timeout): a rank must never outlive its launcher."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(poll_s)
            if os.getppid() != parent:
                os._exit(3)

    threading.Thread(target=watch, name="ditbench-parent-watch", daemon=True).start()


def tail(path: Path, max_bytes: int = 6000) -> str:
    """The last `max_bytes` of a log (decoded leniently); '' when it cannot be read."""
    from ditbench.core.errors import UserError
    from ditbench.files.fileio import open_regular

    try:
        with os.fdopen(open_regular(path), "rb") as f:  # never a FIFO planted as the log
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - max_bytes))
            return f.read().decode("utf-8", "replace")
    except (OSError, UserError):
        return ""


def last_lines(text: str, n: int) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return "\n".join(lines[-n:])


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM stops the process like Ctrl-C (and so the cells it waits for), in the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _interrupt(signum, _frame):
    raise KeyboardInterrupt(f"signal {signum}")


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the process group `proc` leads (started with start_new_session=True), then reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


# Process trees (torchrun puts each worker in a session of its own: one group kill is not enough)


def collect_descendants(proc: psutil.Process, seen: dict[int, psutil.Process]) -> None:
    try:
        for child in proc.children(recursive=True):
            seen.setdefault(child.pid, child)
    except psutil.Error:
        pass


def alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def stop_tree(root: subprocess.Popen, seen: dict[int, psutil.Process], grace_s: float) -> None:
    """SIGTERM the root (torchrun forwards it to its workers) and every process seen, then SIGKILL."""
    try:
        collect_descendants(psutil.Process(root.pid), seen)
    except psutil.Error:
        pass
    if root.poll() is None:
        root.send_signal(signal.SIGTERM)
    for p in list(seen.values()):
        try:
            p.terminate()
        except psutil.Error:
            pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and (root.poll() is None or any(alive(p) for p in seen.values())):
        time.sleep(0.1)
    kill_leftovers(root, seen)


def kill_leftovers(root: subprocess.Popen, seen: dict[int, psutil.Process]) -> None:
    if root.poll() is None:
        root.kill()
    killed = []
    for p in seen.values():
        if alive(p):  # is_running() checks the creation time, so a reused pid is never hit
            try:
                p.kill()
                killed.append(p)
            except psutil.Error:
                pass
    psutil.wait_procs(killed, timeout=5)
    try:
        root.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
