"""Atomic writes: whole or not at all, and with the permissions an ordinary write would give."""

import os
import stat

import pytest

from ditbench.files.fileio import current_umask, write_atomic


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


# ---------------------------------------------------------------- link-safe primitives (issue 21)


def test_rmtree_real_unlinks_a_link_and_leaves_its_target(tmp_path):
    from ditbench.files.fileio import rmtree_real

    target = tmp_path / "target"
    target.mkdir()
    (target / "keep").write_text("x")
    (tmp_path / "link").symlink_to(target)
    rmtree_real(tmp_path / "link")
    assert not os.path.lexists(tmp_path / "link") and (target / "keep").read_text() == "x"


def test_open_log_refuses_a_link_and_truncates_nothing(tmp_path):
    from ditbench.core.errors import UserError
    from ditbench.files.fileio import open_log

    target = tmp_path / "target.txt"
    target.write_text("keep me")
    (tmp_path / "cell.log").symlink_to(target)
    with pytest.raises(UserError, match="symbolic link"):
        open_log(tmp_path / "cell.log")
    assert target.read_text() == "keep me"


def test_an_atomic_write_refuses_a_link_and_neither_replaces_nor_follows_it(tmp_path):
    from ditbench.core.errors import UserError

    target = tmp_path / "target.txt"
    target.write_text("keep me")
    (tmp_path / "report.md").symlink_to(target)
    with pytest.raises(UserError, match="symbolic link"):
        write_atomic(tmp_path / "report.md", "new")
    assert target.read_text() == "keep me" and (tmp_path / "report.md").is_symlink()
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_download_atomic_writes_through_atomic_write_and_a_cut_download_leaves_nothing(tmp_path, monkeypatch):
    import io
    import urllib.request

    from ditbench.files.fileio import download_atomic

    source = tmp_path / "src.bin"
    source.write_bytes(b"weights" * 1000)
    dest = tmp_path / "cache" / "w.pt"
    download_atomic(source.as_uri(), dest)
    assert dest.read_bytes() == source.read_bytes()
    assert sorted(p.name for p in dest.parent.iterdir()) == ["w.pt"]

    class Cut(io.BytesIO):
        headers = {"Content-Length": "100"}

        def read(self, n=-1):
            raise ConnectionResetError("cut")

    monkeypatch.setattr(urllib.request, "urlopen", lambda request: Cut())
    with pytest.raises(ConnectionResetError):
        download_atomic("https://example.invalid/x.pt", tmp_path / "cache" / "x.pt")
    assert sorted(p.name for p in dest.parent.iterdir()) == ["w.pt"]  # no partial file, no temp file
