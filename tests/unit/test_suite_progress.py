"""The runner's heartbeat, start lines (--verbose) and ETA (bench.suite_progress), without a cell or clock."""

from types import SimpleNamespace

from ditbench.bench.suite_progress import SuiteProgress, duration


def cells(*names):
    return [SimpleNamespace(cell_name=n) for n in names]


def test_durations_read_in_the_unit_that_fits():
    assert [duration(s) for s in (0, 42.4, 60, 185, 3600, 3720)] == [
        "0 s", "42 s", "1 min 00 s", "3 min 05 s", "1 h 00 min", "1 h 02 min",
    ]  # fmt: skip


def test_the_eta_is_the_mean_of_the_cells_run_and_start_lines_are_for_verbose_only():
    lines = []
    watch = SuiteProgress(cells("a", "b", "c", "d"), heartbeat=False, write=lines.append, starts=True)
    assert watch.eta(1) == "ETA after the first cell"
    watch.ran_s = [30.0, 90.0]  # two cells run: mean 60 s
    assert watch.eta(3) == "ETA 2 min 00 s (mean 1 min 00 s over 2 cells run)"  # c and d
    assert watch.eta(3, elapsed_in_cell=45) == "ETA 1 min 15 s (mean 1 min 00 s over 2 cells run)"
    assert watch.eta(4, elapsed_in_cell=500) == "ETA 0 s (mean 1 min 00 s over 2 cells run)"
    watch.start(3, cells("c")[0])
    watch.end("skipped")  # decided unrun (the planner, an OOM): not a duration
    assert watch.ran_s == [30.0, 90.0]
    assert lines == ["cell 3/4: c; suite ETA 2 min 00 s (mean 1 min 00 s over 2 cells run)"]
    quiet = SuiteProgress(cells("a"), heartbeat=False, write=lines.append)
    quiet.start(1, cells("a")[0])
    quiet.end("ok")
    assert len(lines) == 1 and len(quiet.ran_s) == 1  # without --verbose the result line is the cell's only


def test_a_job_run_says_when_each_job_starts_and_beats_while_it_waits(monkeypatch):
    from ditbench.bench import suite_progress

    clock = [100.0]
    monkeypatch.setattr(suite_progress.time, "monotonic", lambda: clock[0])
    lines: list[str] = []
    watch = suite_progress.JobWatch(3, heartbeat=True, every_s=30, write=lines.append, starts=True)
    queued = [("a", "DiT-T/4 bs=4", "101", None), ("b", "DiT-T/4 bs=8", "102", None)]
    watch.poll(queued, recorded=1)
    assert lines == []  # nothing started, and no beat before every_s
    started = {"hostnames": ["node1", "node2"], "job_id": "101"}
    clock[0] += 31
    watch.poll([("a", "DiT-T/4 bs=4", "101", started), queued[1]], recorded=1)
    assert lines == [
        "cell started (1 of 3): DiT-T/4 bs=4, job 101 on node1, node2",
        "waiting for 2 job(s): 1 running, 1 queued; 1 of 3 cells recorded, 31 s so far",
    ]
    clock[0] += 5
    watch.poll([("a", "DiT-T/4 bs=4", "101", started)], recorded=2)
    assert len(lines) == 2  # a start line once per job; the next beat 30 s after the last
    quiet = suite_progress.JobWatch(1, heartbeat=False, every_s=30, write=lines.append, starts=True)
    clock[0] += 100
    quiet.poll([("c", "x", "7", {})], recorded=0)  # started without hosts; a terminal gets no beat
    assert lines[2:] == ["cell started (1 of 1): x, job 7 on its node"]
    plain = suite_progress.JobWatch(1, heartbeat=False, every_s=30, write=lines.append)
    plain.poll([("c", "x", "7", {})], recorded=0)  # without --verbose: no start line
    assert len(lines) == 3
