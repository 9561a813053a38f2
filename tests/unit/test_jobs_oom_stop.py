"""Which queued SLURM jobs an out-of-memory stops (`bench.jobs.stop_queued`): the larger batches of
the OOM'd cell's series that have not started, with the local runner's skip reason. The live cluster
does it end to end (tests/integration/test_cluster_live.py)."""

from __future__ import annotations

import os
import stat
import textwrap

from ditbench.bench import inflight, jobs
from ditbench.bench.jobs import Pending, ended_result, stop_queued
from ditbench.bench.launch import executors
from ditbench.bench.launch.executors import JobRef
from ditbench.bench.launch.srun import started_path
from ditbench.bench.runner import RunOptions, SuiteRun, Visible
from ditbench.spec.suite import load_suite


def suite(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text(
        textwrap.dedent(
            """
            name: t
            device: cpu
            defaults: {model: DiT-T/8, image_size: 64, steps: {warmup: 1, measure: 2, min_seconds: 0}}
            matrix: {grad_ckpt: [none, full], batch_size: [1, 2, 3, 4]}
            """
        )
    )
    return load_suite(path)


def waiting(tmp_path, s, oom_skip=True):
    """A run that waits for every cell's job; ckpt=none bs=2 has just run out of memory."""
    run = SuiteRun(
        s, RunOptions(out=tmp_path, oom_skip=oom_skip), "r1", None, Visible(False, 0), tmp_path, {}
    )
    by_name = {c.cell_name: c for c in s.cells}
    run.note(by_name["DiT-T/8 fp32 ckpt=none bs=2"], {"status": "oom", "cell_id": "x"})
    pending = []
    for i, cell in enumerate(s.cells):
        ticket = inflight.Ticket(tmp_path, f"{cell.cell_id}.r1")
        pending.append(Pending(ticket, JobRef("slurm", f"7_{i}", str(tmp_path)), cell))
    return run, {p.cell.cell_name: p for p in pending}


def test_an_oom_stops_the_larger_batches_of_its_series_that_have_not_started(tmp_path):
    s = suite(tmp_path)
    run, by_name = waiting(tmp_path, s)
    started = by_name["DiT-T/8 fp32 ckpt=none bs=4"].ticket.result_path
    started_path(started).write_text('{"started_unix": 1}')  # its job runs: it goes on to its own record
    stopped = stop_queued(list(by_name.values()), run.decide)
    assert [(p.cell.cell_name, reason) for p, reason in stopped] == [
        (
            "DiT-T/8 fp32 ckpt=none bs=3",
            "DiT-T/8 fp32 ckpt=none bs=2 ran out of memory at batch 2; this larger batch of the same "
            "series would too",
        )
    ]
    # once stopped it is not stopped again; a job of a cell this suite no longer has is left alone
    stopped[0][0].stopped = stopped[0][1]
    orphan = Pending(inflight.Ticket(tmp_path, "gone.r0"), JobRef("slurm", "9", str(tmp_path)), None)
    assert stop_queued([*by_name.values(), orphan], run.decide) == []


def test_without_the_oom_skip_nothing_is_stopped(tmp_path):
    run, by_name = waiting(tmp_path, suite(tmp_path), oom_skip=False)
    assert stop_queued(list(by_name.values()), run.decide) == []


def test_a_cancelled_job_is_skipped_if_it_never_started_and_an_error_naming_the_cancel_if_it_had(
    tmp_path, monkeypatch
):
    ticket = inflight.Ticket(tmp_path, "abc.r1")
    pending = Pending(ticket, JobRef("slurm", "7_3", str(tmp_path)), None, stopped="bs=2 ran out of memory")
    monkeypatch.setattr(jobs.executors, "state", lambda ref, handle=None: "CANCELLED")
    assert ended_result(pending) == {
        "status": "skipped",
        "reason": "bs=2 ran out of memory; ditbench cancelled its queued SLURM job 7_3",
    }
    started_path(ticket.result_path).write_text('{"started_unix": 1}')  # it started as it was cancelled
    result = ended_result(pending)
    assert result["status"] == "error" and result["reason"] == (
        "SLURM job 7_3 ended (CANCELLED) without writing a result: ditbench cancelled it as it started, "
        "because bs=2 ran out of memory"
    )


def test_only_a_job_squeue_lists_as_pending_is_cancelled_and_by_its_own_id(tmp_path, monkeypatch):
    """Plain `scancel ID`: `scancel --state=PENDING ID` cancels every queued task of an array."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    for command, text in (("squeue", "$STATE"), ("scancel", "")):
        path = bin_dir / command
        path.write_text(f'#!/bin/sh\necho "$@" >> {bin_dir}/{command}.args\necho "{text}"\n')
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    ref = JobRef("slurm", "7_3", str(tmp_path))
    monkeypatch.setenv("STATE", "RUNNING")
    assert executors.cancel_if_queued(ref) is False
    assert not (bin_dir / "scancel.args").exists()
    monkeypatch.setenv("STATE", "PENDING")
    assert executors.cancel_if_queued(ref) is True
    assert (bin_dir / "scancel.args").read_text() == "7_3\n"
    assert (bin_dir / "squeue.args").read_text().splitlines()[-1] == "-h -j 7_3 -o %T"


def test_a_failed_repeat_stops_the_queued_later_repeats_of_its_cell(tmp_path):
    s = suite(tmp_path)
    run = SuiteRun(s, RunOptions(out=tmp_path), "r1", None, Visible(False, 0), tmp_path, {}, repeats=2)
    failed, other = s.cells[0], s.cells[1]
    run.note(failed, {"status": "error", "cell_id": failed.cell_id, "repeat": 1})
    ref = JobRef("slurm", "8_1", str(tmp_path))
    pending = [Pending(inflight.Ticket(tmp_path, f"{c.cell_id}-r2.r1"), ref, c) for c in (failed, other)]
    assert [(p.cell, reason) for p, reason in stop_queued(pending, run.decide)] == [
        (failed, "repeat 1 of this cell ended error; its other repeats are not run")
    ]
