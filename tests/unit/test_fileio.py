"""Atomic writes: whole or not at all, and with the permissions an ordinary write would give."""

import os
import stat

import pytest

from ditbench.fileio import current_umask, write_atomic


@pytest.fixture
def umask_027():
    old = os.umask(0o027)
    yield
    os.umask(old)


def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_new_files_follow_the_umask(tmp_path, umask_027):
    assert current_umask() == 0o027
    path = write_atomic(tmp_path / "summary.md", "x")
    assert _mode(path) == 0o640  # mkstemp alone gives 0600 whatever the umask
    plain = tmp_path / "plain.txt"
    plain.write_text("x")
    assert _mode(plain) == _mode(path)


def test_a_replaced_file_keeps_its_permissions_and_no_temp_file_is_left(tmp_path, umask_027):
    path = tmp_path / "report.html"
    path.write_text("old")
    path.chmod(0o604)
    write_atomic(path, "new")
    assert path.read_text() == "new" and _mode(path) == 0o604
    assert [p.name for p in tmp_path.iterdir()] == ["report.html"]
