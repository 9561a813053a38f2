"""The `threads` knob pins a cell's torch threads; the machine's load during the window is recorded,
makes the window noisy beyond its bound, and compare names a thread-count difference."""

from __future__ import annotations

from collections import namedtuple

import pytest
from synthetic_records import CPU_ENV, make_record, write_jsonl

from ditbench.bench.cell import load, threads
from ditbench.bench.cell.window import noise
from ditbench.bench.launch import base
from ditbench.bench.summary import noise_note
from ditbench.records.model import Record
from ditbench.report.gate.decide import compare_files
from ditbench.report.gate.env import EnvMismatchError
from ditbench.report.gate.inputs import noisy
from ditbench.report.gate.summary import summary_markdown
from ditbench.spec.cell import CellSpec
from ditbench.spec.knobs import Knobs


@pytest.mark.parametrize(
    "knob, device, pinned",
    [(None, "cpu", 1), (None, "cuda", None), ("auto", "cpu", None), (3, "cpu", 3), (2, "cuda", 2)],
)
def test_the_knob_pins_one_thread_on_cpu_by_default_and_auto_leaves_torch_alone(knob, device, pinned):
    assert threads.pinned(knob, device) == pinned


def _spec(device="cpu", **knobs):
    return CellSpec(Knobs(model="DiT-T/4", image_size=32, gpus=4, **knobs), device)


def test_ranks_get_the_knob_and_auto_keeps_the_share_of_the_cores(monkeypatch):
    monkeypatch.setattr(base.os, "cpu_count", lambda: 16)
    for knobs, outer, want in (
        ({}, {"OMP_NUM_THREADS": "8"}, {"OMP_NUM_THREADS": "1"}),  # the knob's default wins
        ({"threads": 2}, {}, {"OMP_NUM_THREADS": "2"}),
        ({"threads": "auto"}, {}, {"OMP_NUM_THREADS": "4"}),  # 16 cores / 4 ranks
        ({"threads": "auto"}, {"OMP_NUM_THREADS": "8"}, {}),  # the user's own setting stands
    ):
        env: dict[str, str] = {}
        base.share_cores(env, _spec(**knobs), 4, outer)
        assert env == want, knobs


CpuTimes = namedtuple("CpuTimes", "user nice system idle iowait irq softirq steal guest guest_nice")
ProcTimes = namedtuple("ProcTimes", "user system")


class FakeProcess:
    def __init__(self, clock):
        self.clock = clock

    def children(self, recursive=False):
        return [FakeChild(self.clock)]

    def cpu_times(self):
        return ProcTimes(self.clock["own"] * 0.75, self.clock["own"] * 0.25 - 1.0)


class FakeChild(FakeProcess):
    def cpu_times(self):
        return ProcTimes(0.5, 0.5)  # 1 s, unchanged over the window


def test_the_other_processes_share_from_stubbed_psutil_numbers(monkeypatch):
    # 4 cores, a 10 s window: the machine was busy 28 CPU-s, this cell's tree 12 -> others 16 / 40
    clock = {"busy": 100.0, "own": 5.0, "now": 50.0, "load": 1.5}
    fake = load.psutil
    monkeypatch.setattr(
        fake, "cpu_times", lambda: CpuTimes(clock["busy"] - 3.0, 1.0, 2.0, 900.0, 4.0, 0, 0, 0, 0, 0)
    )
    monkeypatch.setattr(fake, "Process", lambda pid: FakeProcess(clock))
    monkeypatch.setattr(fake, "getloadavg", lambda: (clock["load"], 0.0, 0.0))
    monkeypatch.setattr(fake, "cpu_count", lambda: 4)
    monkeypatch.setattr(load.time, "perf_counter", lambda: clock["now"])
    meter = load.LoadMeter(root=123)
    meter.start()
    clock.update(busy=128.0, own=17.0, now=60.0, load=3.25)
    assert meter.stop() == {"load_1m_start": 1.5, "load_1m_end": 3.25, "other_cpu_share": 0.4, "cpus": 4}
    assert load.other_share(10.0, 12.0, 10.0, 4) == 0.0  # own time counted beyond the system's: none
    assert load.other_share(100.0, 0.0, 10.0, 4) == 1.0


def test_a_window_under_load_is_noisy_with_the_reason_and_what_to_change():
    steady = [100.0, 101.0, 99.0, 100.0]
    quiet = noise(steady, rate=100.0, batch=10, other_cpu_share=0.25)
    assert quiet["noisy"] is False and quiet["noise"]["load_bound"] == load.LOAD_BOUND == 0.25
    loaded = noise(steady, rate=100.0, batch=10, other_cpu_share=0.46)
    assert loaded["noisy"] is True and loaded["noise"]["other_cpu_share"] == 0.46
    advice = (
        "other processes used 46% of the CPUs during the window: rerun on a quiet machine (a cell with "
        "more than one thread also gains from threads=1)"
    )
    assert noise_note(loaded) == f"noisy ({advice})"
    spread = noise([100.0, 100.0, 2846.0, 100.0, 2846.0], rate=4 / 0.374, batch=4, other_cpu_share=0.46)
    assert noise_note(spread).startswith(f"noisy ({advice}, p90/p10")  # first: a table cell is cut short
    record = Record.model_validate({**make_record(), "metrics": loaded})
    assert noisy(record) == (
        "noisy measurement window: step spread p90/p10 1.01 (bound 1.5), throughput gap 0 (bound 0.1), "
        + advice
    )


def _cpu_cell(seed, threads_now):
    return make_record(
        "DiT-S/8",
        "fp32",
        "none",
        8,
        images_per_s=40.0,
        sample_seed=seed,
        env=dict(CPU_ENV, torch_threads=threads_now),
        device="cpu",
    )


def test_compare_names_a_thread_count_difference(tmp_path):
    b, n = tmp_path / "base.jsonl", tmp_path / "new.jsonl"
    write_jsonl(b, [_cpu_cell(1, 1)])
    write_jsonl(n, [_cpu_cell(2, 2)])
    with pytest.raises(EnvMismatchError) as err:
        compare_files(b, n, None, False)
    assert "torch_threads: 1 (base) vs 2 (new)" in str(err.value)
    assert "set the `threads` knob" in str(err.value) and "`threads` knob" in err.value.markdown()
    allowed = summary_markdown(compare_files(b, n, None, True))  # compared anyway: the summary names it
    assert "torch_threads: 1 → 2" in allowed
    write_jsonl(n, [_cpu_cell(2, 1)])
    assert compare_files(b, n, None, False).cells  # the same count compares


def test_an_unset_threads_knob_leaves_the_cell_id_alone():
    plain = CellSpec(Knobs(model="DiT-T/4", image_size=32), "cpu")
    assert plain.identity() == CellSpec(Knobs(model="DiT-T/4", image_size=32, threads=None), "cpu").identity()
    assert "threads" not in plain.identity()
    assert CellSpec(Knobs(model="DiT-T/4", image_size=32, threads=1), "cpu").identity()["threads"] == 1
