"""Issue 34, class 5: the files ditbench reads back as its own state never block it.

A FIFO planted where ditbench keeps a file (the plan cache's entry, a submitit job file, the FID hash
memo, a sample record) is refused with one paragraph naming it (exit 2) without being opened
blocking. (.inflight tickets: test_inflight and test_hostile_outputs.)
"""

from __future__ import annotations

import os

import pytest

from ditbench.cli import main
from ditbench.core.errors import UserError

pytestmark = pytest.mark.usefixtures("no_hang")


def assert_clean(code: int, err: str, *needles: str) -> None:
    assert code == 2, err
    assert err.startswith("ditbench: error: ") and "Traceback" not in err, err
    flat = " ".join(err.split())
    assert all(n in flat for n in needles), (needles, flat)


def test_a_fifo_as_the_plan_cache_entry_is_refused_not_waited_on(tmp_path, monkeypatch):
    from ditbench.plan import cache

    monkeypatch.setenv("DITBENCH_CACHE", str(tmp_path))
    cache.cache_dir().mkdir(parents=True)
    os.mkfifo(cache.cache_dir() / "abc.json")
    with pytest.raises(UserError, match="the plan cache .*abc.json.* FIFO"):
        cache.load("abc")
    (cache.cache_dir() / "garbage.json").write_text("[1, 2")  # garbage is only a miss
    assert cache.load("garbage") is None


def test_a_fifo_as_a_job_file_or_a_hash_memo_is_refused(tmp_path):
    from ditbench.bench.launch.executors import JobRef
    from ditbench.metrics.reference import ReferenceCache

    os.mkfifo(tmp_path / "c.job.json")
    with pytest.raises(UserError, match="FIFO"):
        JobRef.load(tmp_path / "c.job.json")
    (tmp_path / "ref.npz").write_bytes(b"x")
    cache = ReferenceCache(tmp_path / "cache")
    cache.file_hash(tmp_path / "ref.npz")  # writes the memo
    (memo,) = (tmp_path / "cache" / "hashes").iterdir()
    memo.unlink()
    os.mkfifo(memo)
    with pytest.raises(UserError, match="FIFO"):
        cache.file_hash(tmp_path / "ref.npz")


def test_a_fifo_as_samples_record_is_refused_before_any_work(tmp_path, capsys):
    (tmp_path / "s.npz").write_bytes(b"x")
    os.mkfifo(tmp_path / "s.json")  # the record of how s.npz was made
    argv = ["sample", "random", "--vae", "random", "--out", str(tmp_path / "s.npz"), "--device", "cpu"]
    code = main([*argv, "--model", "DiT-T/8", "--image-size", "64", "--num-samples", "2", "--no-progress"])
    assert_clean(code, capsys.readouterr().err, "s.json", "FIFO")
