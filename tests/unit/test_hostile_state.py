"""Issue 34, class 5: the files ditbench reads back as its own state never block it and never stop it
for good.

A FIFO planted where ditbench keeps a file (an .inflight ticket or its result, the plan cache's entry,
a submitit job file, the FID hash memo, a sample record) is refused with one paragraph naming it
(exit 2) without being opened blocking, and the output folder's lock is free again afterwards. A
ticket that is not a ticket (not JSON, not an object, ids that are not text, a record that would be
invalid) is moved to <out>/broken/ with a warning, and the run goes on.
"""

from __future__ import annotations

import json
import os
import signal
import textwrap
import warnings
from pathlib import Path

import pytest

from ditbench.bench import inflight
from ditbench.bench.launch.files import write_result
from ditbench.cli import main
from ditbench.errors import UserError
from ditbench.outlock import OutputLock


@pytest.fixture(autouse=True)
def no_hang():
    def stop(*_):
        raise TimeoutError("blocked on a FIFO")

    old = signal.signal(signal.SIGALRM, stop)
    signal.alarm(30)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def context(cell_id="c0ffee000001", run_id="20260101T000000Z-aaaaaa", **kw):
    return {
        "suite": "t",
        "run_id": run_id,
        "cell_id": cell_id,
        "cell_name": f"cell {cell_id}",
        "suite_baseline": {},
        "suite_overrides": {},
        "config": {"batch_size": 1, "gpus": 1, "nodes": 1},
        "env": {"host": "runner-host"},
        "started_at": "2026-01-01T00:00:00Z",
        **kw,
    }


OK = {"status": "ok", "metrics": {"images_per_s": 10.0, "step_ms": {"median": 100.0}}, "env": {}}


def suite(tmp: Path) -> Path:
    (tmp / "suite.yaml").write_text(
        textwrap.dedent("""
        name: hostile
        device: cpu
        defaults:
          model: DiT-T/8
          image_size: 64
          steps: {warmup: 1, measure: 2, min_seconds: 0}
        matrix: {precision: [fp32]}
        """)
    )
    return tmp / "suite.yaml"


def assert_clean(code: int, err: str, *needles: str) -> None:
    assert code == 2, err
    assert err.startswith("ditbench: error: ") and "Traceback" not in err, err
    flat = " ".join(err.split())
    assert all(n in flat for n in needles), (needles, flat)


@pytest.mark.parametrize("name", ["x.ticket.json", f"{context()['cell_id']}.r.result.json"])
def test_a_fifo_in_inflight_is_refused_quickly_and_the_lock_is_free_afterwards(name, tmp_path, capsys):
    out = tmp_path / "out"
    folder = out / inflight.INFLIGHT_DIR
    if name.endswith("result.json"):  # a ticket whose result file is a FIFO
        ticket = inflight.open_ticket(folder, context(run_id="r"))
        name = ticket.result_path.name
    else:
        folder.mkdir(parents=True)
    os.mkfifo(folder / name)
    code = main(["run", str(suite(tmp_path)), "--out", str(out), "--no-progress"])
    assert_clean(code, capsys.readouterr().err, name, "FIFO")
    with OutputLock(out, "a later run") as lock:  # released when the refusal ended the run
        assert lock.stale is None


def test_a_fifo_as_the_plan_cache_entry_is_refused_not_waited_on(tmp_path, monkeypatch):
    from ditbench.plan import cache

    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path))
    cache.cache_dir().mkdir(parents=True)
    os.mkfifo(cache.cache_dir() / "abc.json")
    with pytest.raises(UserError, match="the plan cache .*abc.json.* FIFO"):
        cache.load("abc")
    (cache.cache_dir() / "garbage.json").write_text("[1, 2")  # garbage is only a miss
    assert cache.load("garbage") is None


def test_a_fifo_as_a_job_file_or_a_hash_memo_is_refused(tmp_path):
    from ditbench.bench.launch.executors import JobRef
    from ditbench.metrics.stats_cache import ReferenceCache

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


# --------------------------------------------------------------------- broken tickets: set aside


BROKEN = {
    "not JSON": b"\xff\xfe{",
    "a list": b"[1, 2]",
    "a string naming every key": json.dumps(" ".join(context())).encode(),
    "a number": b"7",
    "run_id a list": json.dumps(context(run_id=["a"])).encode(),
    "cell_id null": json.dumps(context(cell_id=None)).encode(),
    "no config": json.dumps({k: v for k, v in context().items() if k != "config"}).encode(),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_a_broken_ticket_is_moved_aside_with_a_warning_and_never_stops_a_run(case, tmp_path):
    out = tmp_path / "out"
    folder = out / inflight.INFLIGHT_DIR
    folder.mkdir(parents=True)
    (folder / "k.r.ticket.json").write_bytes(BROKEN[case])
    (folder / "k.r.result.json").write_text(json.dumps(OK))
    good = inflight.open_ticket(folder, context(cell_id="c0ffee000002", run_id="r2"))
    write_result(good.result_path, OK)
    with pytest.warns(UserWarning, match=r"k\.r\.ticket\.json: an unreadable ticket .*moved to"):
        adopted = inflight.adopt(out / "results.jsonl", folder, "run3")
    assert [r["cell_id"] for r in adopted] == ["c0ffee000002"]  # the good one is still adopted
    assert list(folder.iterdir()) == []
    aside = sorted(p.name for p in (out / inflight.BROKEN_DIR).iterdir())
    assert aside == ["run3.k.r.result.json", "run3.k.r.ticket.json"]
    assert (out / inflight.BROKEN_DIR / "run3.k.r.ticket.json").read_bytes() == BROKEN[case]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a later run finds nothing to warn about
        assert inflight.adopt(out / "results.jsonl", folder, "run4") == []


def test_a_ticket_whose_record_would_be_invalid_is_moved_aside_not_appended(tmp_path):
    folder, results = tmp_path / inflight.INFLIGHT_DIR, tmp_path / "results.jsonl"
    ticket = inflight.open_ticket(folder, context())
    write_result(ticket.result_path, {"status": "ok", "metrics": None})
    with pytest.warns(UserWarning, match="its record would be invalid"):
        assert inflight.adopt(results, folder, "run2") == []
    assert not results.exists() and len(list((tmp_path / inflight.BROKEN_DIR).iterdir())) == 2
