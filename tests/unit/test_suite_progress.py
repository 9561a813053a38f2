"""The runner's start lines and ETA (bench.suite_progress), without running a cell or a clock."""

from types import SimpleNamespace

from ditbench.bench.suite_progress import SuiteProgress, duration


def cells(*names):
    return [SimpleNamespace(cell_name=n) for n in names]


def test_durations_read_in_the_unit_that_fits():
    assert [duration(s) for s in (0, 42.4, 60, 185, 3600, 3720)] == [
        "0 s", "42 s", "1 min 00 s", "3 min 05 s", "1 h 00 min", "1 h 02 min",
    ]  # fmt: skip


def test_the_eta_counts_only_cells_that_will_start_from_the_mean_of_those_run():
    lines = []
    watch = SuiteProgress(cells("a", "b", "x", "c"), lambda c: c.cell_name != "x", heartbeat=False,
                          write=lines.append)  # fmt: skip
    assert watch.eta(1) == "ETA after the first cell"
    watch.ran_s = [30.0, 90.0]  # two cells run: mean 60 s
    assert watch.eta(2) == "ETA 2 min 00 s (mean 1 min 00 s over 2 cells run)"  # b and c, not x
    assert watch.eta(2, elapsed_in_cell=45) == "ETA 1 min 15 s (mean 1 min 00 s over 2 cells run)"
    assert watch.eta(4, elapsed_in_cell=500) == "ETA 0 s (mean 1 min 00 s over 2 cells run)"
    watch.start(3, cells("x")[0])
    watch.end("unsupported")  # decided unrun: not a duration
    assert watch.ran_s == [30.0, 90.0]
    assert lines == [
        "cell 3/4 deciding (will not start): x; suite ETA 1 min 00 s (mean 1 min 00 s over 2 cells run)"
    ]
