"""Quick siblings of the runner's slow process tests (test_runner.py, test_runner_recovery.py): the
same guarantees with each cell's process replaced by a stand-in that writes the result file a cell
would, so they run in the quick loop. What they keep real: the suite, the run order, the tickets in
.inflight, the append, adoption after a kill, resume and the OOM series skip."""

from __future__ import annotations

import textwrap
from types import SimpleNamespace

import pytest

from ditbench.bench import inflight, runner
from ditbench.bench.launch.files import write_result
from ditbench.bench.runner import RunOptions, run_suite
from ditbench.records.jsonl import read_records
from ditbench.spec.suite import load_suite

OK = {
    "status": "ok",
    "reason": None,
    "metrics": {
        "images_per_s": 100.0,
        "steps_per_s": 50.0,
        "step_ms": {"median": 20.0, "p10": 19.0, "p90": 21.0, "samples": [19.0, 20.0, 21.0]},
    },
}


def suite(tmp_path, batches=(1, 2, 3)):
    path = tmp_path / "t.yaml"
    path.write_text(
        textwrap.dedent(
            f"""
            name: t
            device: cpu
            defaults: {{model: DiT-T/8, image_size: 64, steps: {{warmup: 1, measure: 2, min_seconds: 0}}}}
            matrix: {{batch_size: {list(batches)}}}
            """
        )
    )
    return load_suite(path)


@pytest.fixture
def cells(monkeypatch):
    """The stand-in cell process: `cells.outcome[batch]` is the status it reports (default ok);
    `cells.ran` lists the batches started, in order."""

    class Cells:
        outcome: dict[int, str] = {}
        ran: list[int] = []

    def run_isolated(spec, about, timeout_s, spec_path, result_path, log_path):
        batch = int(about["cell_name"].rsplit("bs=", 1)[1].split()[0])
        Cells.ran.append(batch)
        status = Cells.outcome.get(batch, "ok")
        write_result(
            result_path, OK if status == "ok" else {"status": status, "reason": f"stand-in {status}"}
        )

    Cells.outcome, Cells.ran = {}, []
    monkeypatch.setattr(runner, "launcher_for", lambda spec: SimpleNamespace(launch=run_isolated))
    return Cells


def run(s, out, **kw):
    lines: list[str] = []
    records = run_suite(s, RunOptions(out=out, progress=False, **kw), echo=lines.append)
    return {r["config"]["batch_size"]: r for r in records}, lines


def test_an_oom_skips_the_larger_batches_of_its_series(tmp_path, cells):
    cells.outcome = {2: "oom"}
    by_batch, _ = run(suite(tmp_path, (3, 1, 2, 4)), tmp_path / "out")
    assert cells.ran == [1, 2]  # smaller batches first; 3 and 4 never start
    assert {b: r["status"] for b, r in by_batch.items()} == {1: "ok", 2: "oom", 3: "skipped", 4: "skipped"}
    assert "bs=2 ran out of memory at batch 2" in by_batch[3]["reason"]
    assert len(read_records(tmp_path / "out" / "results.jsonl")) == 4


def test_a_mixed_suite_runs_what_runs_here_and_says_the_rest_in_one_line(tmp_path, cells):
    s = suite(tmp_path, (1, 2))
    s = load_suite(s.path, ["precision=[fp32, fp16]"])
    records = run_suite(s, RunOptions(out=tmp_path / "out", progress=False), echo=(lines := []).append)
    status = {r["cell_name"]: r["status"] for r in records}
    assert cells.ran == [1, 2] and sorted(status.values()) == ["ok", "ok", "unsupported", "unsupported"]
    assert lines[0] == (
        "2 of 4 cells cannot run here and are recorded without running: [1] fp16 needs a CUDA device (CPU "
        "autocast has no loss-scaled fp16); use bf16 on CPU (the 2 cells with precision=fp16)"
    )
    assert [line.split(" ")[0] for line in lines[1:]] == ["[1/2]", "[2/2]"]  # one line per cell run
    for r in records:  # a cell that never ran states no environment; one that ran, the threads it ran with
        assert r["env"] is None if r["status"] == "unsupported" else r["env"]["torch_threads"] == 1


def test_without_the_oom_skip_every_batch_runs(tmp_path, cells):
    cells.outcome = {2: "oom"}
    by_batch, _ = run(suite(tmp_path), tmp_path / "out", oom_skip=False)
    assert cells.ran == [1, 2, 3] and by_batch[3]["status"] == "ok"


def test_resume_runs_only_what_is_not_ok_and_force_runs_all(tmp_path, cells):
    out = tmp_path / "out"
    cells.outcome = {2: "error"}
    run(suite(tmp_path), out)
    first = read_records(out / "results.jsonl")
    assert [r["status"] for r in first] == ["ok", "error", "ok"]

    cells.outcome, cells.ran = {}, []
    by_batch, lines = run(suite(tmp_path), out)
    assert cells.ran == [2] and lines[0].startswith("resuming") and "2 of 3 cells already ok" in lines[0]
    records = read_records(out / "results.jsonl")
    assert records[:3] == first and len(records) == 4 and records[3]["status"] == "ok"
    assert by_batch[1]["run_id"] == first[0]["run_id"] != by_batch[2]["run_id"]

    cells.ran = []
    run(suite(tmp_path), out)
    assert cells.ran == [] and len(read_records(out / "results.jsonl")) == 4
    run(suite(tmp_path), out, force=True)
    assert cells.ran == [1, 2, 3] and len(read_records(out / "results.jsonl")) == 7


class Killed(BaseException):
    """The runner's death (SIGKILL) at a chosen moment: nothing after it runs in the runner."""


@pytest.mark.parametrize("moment", ["before", "after"])
def test_a_runner_killed_next_to_the_append_loses_and_duplicates_nothing(
    tmp_path, cells, monkeypatch, moment
):
    out = tmp_path / "out"
    real_append = inflight.append_record

    def dies(path, record):
        if moment == "after":
            real_append(path, record)
        raise Killed

    monkeypatch.setattr(inflight, "append_record", dies)
    with pytest.raises(Killed):
        run(suite(tmp_path), out)
    assert cells.ran == [1]
    left = list(inflight.inflight_dir(out).iterdir())
    assert left  # the finished cell's ticket and result wait for the next run
    monkeypatch.setattr(inflight, "append_record", real_append)

    by_batch, lines = run(suite(tmp_path), out)
    assert cells.ran == [1, 2, 3]  # the killed run's cell is not run again
    records = read_records(out / "results.jsonl")
    assert sorted(r["config"]["batch_size"] for r in records) == [1, 2, 3]  # each cell exactly once
    assert all(r["status"] == "ok" for r in records)
    if moment == "before":
        assert any(line.startswith("adopted the finished result of a killed run") for line in lines)
        assert records[0]["config"]["batch_size"] == 1 and "adopted_by" in records[0]
    assert list(inflight.inflight_dir(out).iterdir()) == []


class FakeJobs:
    """An executor that does not wait (as submitit's): `submit` queues, each `poll` finishes one job
    (writing the result a cell would), `cancel` notes what it was asked to cancel."""

    waits, remote, poll_s = False, True, 0.0

    def __init__(self, interrupt_at_poll: int | None = None):
        self.submitted: list[list[str]] = []
        self.cancelled: list[str] = []
        self.polls, self.interrupt_at_poll = 0, interrupt_at_poll

    def verdict(self, cell, visible, rendezvous=None):
        return None

    def start(self, out, say):
        return []

    def submit(self, jobs):
        self.submitted.append([job.ticket.key for job in jobs])
        for job in jobs:
            job.ref = SimpleNamespace(job_id=job.ticket.key)

    def poll(self, jobs):
        self.polls += 1
        if self.polls == self.interrupt_at_poll:
            raise KeyboardInterrupt
        if jobs:
            write_result(jobs[0].ticket.result_path, OK)
        return jobs[:1]

    def cancel(self, jobs, decide=None):
        if decide is None:
            self.cancelled += [job.ticket.key for job in jobs]

    def collect(self, job):
        return {"duration_s": 1.25}


def test_an_executor_that_does_not_wait_gets_every_repeat_at_once_in_round_robin_order(tmp_path):
    fake = FakeJobs()
    lines: list[str] = []
    options = RunOptions(out=tmp_path / "out", progress=False, repeats=2)
    records = run_suite(suite(tmp_path, (1, 2)), options, lines.append, executor=fake)
    (batch,) = fake.submitted  # one submission: a remote executor gets every cell repeat at once
    assert [key.split(".")[0].rsplit("-r", 1)[1] for key in batch] == ["1", "1", "2", "2"]
    written = read_records(tmp_path / "out" / "results.jsonl")
    pairs = sorted((r["config"]["batch_size"], r["repeat"]) for r in written)
    assert pairs == [(1, 1), (1, 2), (2, 1), (2, 2)]
    assert all(r["duration_s"] == 1.25 and r["env"] is None for r in written)  # the executor's, not ours
    assert [line.split(" ")[0] for line in lines] == ["[1/4]", "[2/4]", "[3/4]", "[4/4]"]
    assert [r["status"] for r in records] == ["ok", "ok"] and fake.cancelled == []
    assert not list((tmp_path / "out" / ".jobs").iterdir())


def test_ctrl_c_cancels_what_the_executor_still_runs_and_leaves_no_ticket(tmp_path):
    fake = FakeJobs(interrupt_at_poll=2)
    options = RunOptions(out=tmp_path / "out", progress=False)
    with pytest.raises(KeyboardInterrupt):
        run_suite(suite(tmp_path, (1, 2, 3)), options, lambda line: None, executor=fake)
    assert len(fake.cancelled) == 2  # the first job was recorded; the other two were cancelled
    assert len(read_records(tmp_path / "out" / "results.jsonl")) == 1
    assert not list((tmp_path / "out" / ".jobs").glob("*.ticket.json"))
