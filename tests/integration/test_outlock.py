"""One writer per output folder: the lock names its holder, dies with it, and has a no-flock fallback."""

import errno
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ditbench.core.errors import UserError
from ditbench.files.outlock import HELD_NAME, LOCK_NAME, OutputLock

REPO = Path(__file__).resolve().parents[2]

HOLDER = textwrap.dedent(
    """
    import sys, time
    from ditbench.files.outlock import OutputLock
    lock = OutputLock(sys.argv[1], command="holder for a test").acquire()
    print("held", flush=True)
    time.sleep(600)
    """
)


def start_holder(folder: Path) -> subprocess.Popen:
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(folder)], env=env, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "held"  # waits for the lock, however slow the machine
    return proc


def test_a_second_holder_is_refused_with_the_first_ones_pid_and_host(tmp_path):
    with OutputLock(tmp_path, command="ditbench run a.yaml"):
        record = json.loads((tmp_path / LOCK_NAME).read_text())
        assert record["pid"] == os.getpid() and record["host"] == socket.gethostname()
        with pytest.raises(UserError) as err:
            OutputLock(tmp_path).acquire()
        text = str(err.value)
        assert f"PID {os.getpid()}" in text and socket.gethostname() in text and "ditbench run a.yaml" in text
    assert (tmp_path / LOCK_NAME).read_text() == ""  # released: no holder named
    with OutputLock(tmp_path) as lock:  # free again
        assert lock.stale is None


def test_a_killed_holder_releases_the_lock_and_its_record_is_reported_stale(tmp_path):
    proc = start_holder(tmp_path)
    try:
        with pytest.raises(UserError, match=f"PID {proc.pid}"):
            OutputLock(tmp_path).acquire()
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    with OutputLock(tmp_path) as lock:  # the kernel dropped the dead holder's flock
        assert lock.stale is not None and lock.stale["pid"] == proc.pid


def test_an_unwritable_folder_is_a_clean_error(tmp_path):
    with pytest.raises(UserError, match="cannot create its lock file"):
        OutputLock(tmp_path / "missing" / "deeper").acquire()


@pytest.fixture
def no_flock(monkeypatch):
    def refuse(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", refuse)


def test_without_flock_the_record_file_is_the_lock(tmp_path, no_flock):
    with OutputLock(tmp_path, command="first"):
        held = json.loads((tmp_path / HELD_NAME).read_text())
        assert held["pid"] == os.getpid()
        with pytest.raises(UserError, match=f"PID {os.getpid()}.*first"):
            OutputLock(tmp_path).acquire()
    assert not (tmp_path / HELD_NAME).exists()


def test_without_flock_a_dead_holders_record_is_taken_over(tmp_path, no_flock):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = {"pid": dead.pid, "host": socket.gethostname(), "process_start": 1.0, "command": "killed"}
    (tmp_path / HELD_NAME).write_text(json.dumps(stale))
    with OutputLock(tmp_path) as lock:
        assert lock.stale == stale
        assert json.loads((tmp_path / HELD_NAME).read_text())["pid"] == os.getpid()


def test_without_flock_a_reused_pid_is_stale_and_another_hosts_holder_is_not(tmp_path, no_flock):
    # our own PID, but another process start time: the PID was reused, the holder is gone
    reused = {"pid": os.getpid(), "host": socket.gethostname(), "process_start": 1.0}
    (tmp_path / HELD_NAME).write_text(json.dumps(reused))
    with OutputLock(tmp_path) as lock:
        assert lock.stale == reused
    remote = {"pid": 4242, "host": "node-elsewhere", "process_start": 1.0}
    (tmp_path / HELD_NAME).write_text(json.dumps(remote))
    with pytest.raises(UserError) as err:
        OutputLock(tmp_path).acquire()
    assert "PID 4242 on host node-elsewhere" in str(err.value) and "delete" in str(err.value)


# ---------------------------------------------------------------- links and non-files as the lock (issue 21)


def test_a_link_planted_as_the_lock_file_is_refused_and_its_target_untouched(tmp_path):
    outside = tmp_path / "precious.txt"
    outside.write_text("keep me")
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK_NAME).symlink_to(outside)
    with pytest.raises(UserError, match="symbolic link"):
        OutputLock(out).acquire()
    assert outside.read_text() == "keep me"  # not truncated, not overwritten with a holder record


def test_a_dangling_link_as_the_lock_file_creates_nothing_at_its_target(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK_NAME).symlink_to(tmp_path / "created-elsewhere")
    with pytest.raises(UserError, match="symbolic link"):
        OutputLock(out).acquire()
    assert not (tmp_path / "created-elsewhere").exists()


def test_a_fifo_as_the_lock_file_is_refused_without_blocking(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    os.mkfifo(out / LOCK_NAME)
    with pytest.raises(UserError, match="not a regular file"):
        OutputLock(out).acquire()


def test_without_flock_a_link_planted_as_the_held_record_is_refused(tmp_path, no_flock):
    outside = tmp_path / "precious.txt"
    outside.write_text("keep me")
    out = tmp_path / "out"
    out.mkdir()
    (out / HELD_NAME).symlink_to(outside)
    with pytest.raises(UserError, match="symbolic link"):
        OutputLock(out).acquire()
    assert outside.read_text() == "keep me"
