"""bench/window.py's exact behaviour with a stand-in step and clock (no model): which steps are timed,
the counts `agree` is asked for, the CUDA path's events and synchronisation, the smoke curve's means and
the noise rules at their edges. Written for the mutation run (reports/mutation/window.md)."""

from __future__ import annotations

import gc
import math

import pytest
import torch

from ditbench.bench.cell import window
from ditbench.bench.cell.load import LOAD_BOUND
from ditbench.bench.cell.window import (
    GAP_BOUND,
    SMOKE_MEAN_STEPS,
    SPREAD_BOUND,
    failed_smoke,
    measure_window,
    noise,
    noise_advice,
    smoke_run,
    step_stats,
)
from ditbench.core.faults import NonFiniteLoss


class Clock:
    """perf_counter that advances only when a step says so."""

    def __init__(self):
        self.now = 100.0

    def perf_counter(self):
        return self.now


class Trainer:
    def __init__(self):
        self.batches = 0

    def next_batch(self):
        self.batches += 1
        return self.batches


class Steps:
    """A step whose losses and durations are given per call; records whether gc was on during it."""

    def __init__(self, clock: Clock, losses=None, seconds=0.0):
        self.clock, self.losses, self.seconds = clock, losses, seconds
        self.calls: list = []
        self.gc_enabled: list[bool] = []

    def __call__(self, batch):
        i = len(self.calls)
        self.calls.append(batch)
        self.gc_enabled.append(gc.isenabled())
        self.clock.now += self.seconds[i] if isinstance(self.seconds, list) else self.seconds
        value = self.losses[i] if self.losses is not None else float(i)
        return torch.tensor(value, dtype=torch.float64)


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(window, "time", c)
    return c


def test_window_runs_warmup_then_exactly_measure_steps_and_times_each(clock):
    trainer, events = Trainer(), []
    step = Steps(clock, seconds=[0.5, 0.5, 0.002, 0.004, 0.008])
    out = measure_window(
        trainer,
        step,
        "cpu",
        warmup=2,
        measure=3,
        min_seconds=0.0,
        after_warmup=lambda: events.append(len(step.calls)),
    )
    assert events == [2]  # after the warm-up, before any timed step
    assert step.calls == [1, 2, 3, 4, 5]  # each step gets the trainer's next batch
    assert out["steps"] == 3
    assert out["step_ms"] == pytest.approx([2.0, 4.0, 8.0], abs=1e-9)  # warm-up steps are not timed
    assert out["wall_s"] == pytest.approx(0.014, abs=1e-12)
    assert out["last_loss"] == 4.0 and isinstance(out["last_loss"], float)
    assert step.gc_enabled == [True, True, False, False, False]  # no collection inside the window
    assert gc.isenabled()


def test_window_alone_runs_until_min_seconds(clock):
    step = Steps(clock, seconds=0.25)
    out = measure_window(Trainer(), step, "cpu", warmup=0, measure=1, min_seconds=1.0)
    assert out["steps"] == 4 and out["wall_s"] == pytest.approx(1.0)  # 1 step asked, 4 reach 1 s
    out = measure_window(Trainer(), Steps(clock, seconds=0.25), "cpu", warmup=0, measure=6, min_seconds=1.0)
    assert out["steps"] == 6  # the step count is a minimum too


def test_window_with_agree_asks_for_the_steps_that_reach_min_seconds(clock):
    asked = []

    def agree(extra):
        asked.append(extra)
        return 5  # another rank wanted more: every rank runs the agreed count

    step = Steps(clock, seconds=0.3)
    out = measure_window(Trainer(), step, "cpu", warmup=1, measure=2, min_seconds=2.0, agree=agree)
    # 2 steps in 0.6 s; 1.4 s left at 0.3 s a step: ceil(4.67) = 5 more
    assert asked == [5] and out["steps"] == 7 and len(step.calls) == 8
    assert out["wall_s"] == pytest.approx(2.1)

    asked.clear()
    step = Steps(clock, seconds=0.5)
    out = measure_window(
        Trainer(), step, "cpu", warmup=0, measure=2, min_seconds=1.0, agree=lambda e: asked.append(e) or 0
    )
    assert asked == [0] and out["steps"] == 2  # reached exactly: nothing extra, and no step beyond `measure`
    asked.clear()
    out = measure_window(
        Trainer(),
        Steps(clock, seconds=0.0),
        "cpu",
        warmup=0,
        measure=3,
        min_seconds=0.5,
        agree=lambda e: asked.append(e) or 0,
    )
    assert asked == [math.ceil(0.5 / 1e-9)]  # zero-time steps: the per-step estimate is floored at 1 ns


def test_window_exact_division_needs_no_extra_step(clock):
    asked = []
    step = Steps(clock, seconds=0.25)
    measure_window(
        Trainer(), step, "cpu", warmup=0, measure=2, min_seconds=1.5, agree=lambda e: asked.append(e) or 0
    )
    assert asked == [4]  # 0.5 s in 2 steps, 1.0 s left at 0.25 s a step: exactly 4, not 5


@pytest.mark.parametrize(
    "losses,phase,step_no,value",
    [
        ([1.0, float("nan"), 1.0, 1.0, 1.0], "warm-up", 2, "nan"),
        ([1.0, 1.0, 1.0, 1.0, float("inf")], "measured", 5, "inf"),
        ([1.0, 1.0, float("-inf"), float("nan"), 1.0], "measured", 3, "-inf"),
    ],
)
def test_window_names_the_first_non_finite_step(clock, losses, phase, step_no, value):
    with pytest.raises(NonFiniteLoss) as info:
        measure_window(Trainer(), Steps(clock, losses, 0.1), "cpu", warmup=2, measure=3, min_seconds=0)
    err = info.value
    assert (err.step, err.phase, str(err.value)) == (step_no, phase, value)
    assert gc.isenabled()


def test_window_on_cuda_uses_events_and_synchronises_once_per_phase(clock, monkeypatch):
    created, syncs = [], []

    class Event:
        def __init__(self, enable_timing=False):
            assert enable_timing is True
            self.at = None
            created.append(self)

        def record(self):
            self.at = clock.now

        def elapsed_time(self, end):
            return (end.at - self.at) * 1e3

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: syncs.append(len(created)))
    step = Steps(clock, seconds=[0.1, 0.002, 0.003])
    out = measure_window(Trainer(), step, "cuda", warmup=1, measure=2, min_seconds=0)
    assert step.calls == [1, 2, 3]  # each timed step gets the trainer's next batch
    assert len(created) == 4  # a begin and an end event per timed step, none for the warm-up
    assert syncs == [0, 4]  # after the warm-up, and once after the whole window
    assert out["step_ms"] == pytest.approx([2.0, 3.0])
    assert out["steps"] == 2 and out["last_loss"] == 2.0


def test_cpu_window_never_synchronises_cuda(clock, monkeypatch):
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: pytest.fail("synchronised a CPU window"))
    measure_window(Trainer(), Steps(clock, seconds=0.1), "cpu", warmup=1, measure=1, min_seconds=0)


# ---- percentiles and the noise rules -----------------------------------------------------------


def test_step_stats_values():
    stats = step_stats([4.0, 1.0, 3.0, 2.0, 10.123456])
    # numpy's linear rule written out: p10 at rank 0.4 between 1 and 2, p90 at rank 3.6 between 4 and 10.12
    assert stats["p10"] == pytest.approx(1.4, abs=1e-12)
    assert stats["p90"] == pytest.approx(4.0 + 0.6 * 6.123456, abs=1e-12)
    assert stats["median"] == 3.0 and isinstance(stats["p10"], float) and isinstance(stats["p90"], float)
    assert stats["samples"] == [4.0, 1.0, 3.0, 2.0, 10.1235]
    assert step_stats([2.0, 4.0])["median"] == 3.0  # even count: the mean of the middle two


def test_noise_figures_and_degenerate_windows():
    out = noise([10.0] * 4, rate=100.0, batch=1)  # 1 image / 10 ms = 100 img/s
    assert out == {
        "noisy": False,
        "noise": {
            "step_spread": 1.0,
            "throughput_gap": 0.0,
            "spread_bound": SPREAD_BOUND,
            "gap_bound": GAP_BOUND,
        },
    }
    # a zero p10 (a step below the timer's resolution): the spread cannot be bounded
    zero = noise([0.0, 0.0, 10.0, 10.0, 10.0], rate=100.0, batch=1)
    assert zero["noise"]["step_spread"] == math.inf and zero["noisy"] is True
    # a zero median: no rate to compare with
    flat = noise([0.0] * 5, rate=100.0, batch=1)
    assert flat["noise"]["throughput_gap"] == math.inf and flat["noisy"] is True
    # the gap is relative to the rate from the median, on either side
    assert noise([10.0] * 3, 90.0, 1)["noise"]["throughput_gap"] == pytest.approx(0.1)
    assert noise([10.0] * 3, 120.0, 2)["noise"]["throughput_gap"] == pytest.approx(0.4)
    assert noise([10.0] * 3, 89.0, 1)["noisy"] is True
    at_gap = noise([10.0] * 3, 110.0, 1)  # |110 - 100| / 100: exactly the gap bound, which is inclusive
    assert at_gap["noise"]["throughput_gap"] == GAP_BOUND and at_gap["noisy"] is False
    assert noise([10.0] * 9 + [15.01], 100.0, 1)["noisy"] is False  # p90 = 10.501: spread 1.05


def test_noise_load_bound_is_inclusive_and_only_added_when_measured():
    steady = [10.0] * 4
    at = noise(steady, 100.0, 1, other_cpu_share=LOAD_BOUND)
    assert at["noisy"] is False
    assert at["noise"]["other_cpu_share"] == LOAD_BOUND and at["noise"]["load_bound"] == LOAD_BOUND
    assert noise(steady, 100.0, 1, other_cpu_share=LOAD_BOUND + 1e-9)["noisy"] is True
    assert noise(steady, 100.0, 1, other_cpu_share=0.0)["noisy"] is False
    assert noise(steady, 200.0, 1, other_cpu_share=0.0)["noisy"] is True  # the load does not hide a gap
    assert "load_bound" not in noise(steady, 100.0, 1)["noise"]


@pytest.mark.parametrize(
    "figures",
    [
        None,
        "0.9",
        {},
        {"other_cpu_share": 0.9},
        {"load_bound": 0.25},
        {"other_cpu_share": True, "load_bound": 0.25},
        {"other_cpu_share": 0.9, "load_bound": False},
        {"other_cpu_share": "0.9", "load_bound": 0.25},
        {"other_cpu_share": 0.25, "load_bound": 0.25},  # at the bound: not beyond it
        {"other_cpu_share": 0.1, "load_bound": 0.25},
    ],
)
def test_noise_advice_is_none_unless_a_share_is_beyond_its_bound(figures):
    assert noise_advice(figures) is None


def test_noise_advice_names_the_share_in_percent():
    expected = (
        "other processes used {}% of the CPUs during the window: rerun on a quiet machine (a cell with more "
        "than one thread also gains from threads=1)"
    )
    assert noise_advice({"other_cpu_share": 0.456, "load_bound": 0.25}) == expected.format(46)
    assert noise_advice({"other_cpu_share": 1, "load_bound": 0}) == expected.format(100)  # ints are numbers


# ---- the smoke run ------------------------------------------------------------------------------


class Scaled(Trainer):
    scaler_skips = 3


def test_smoke_run_curve_means_over_the_first_and_last_50(clock):
    losses = [float(i) + 0.1234567 for i in range(60)]
    step = Steps(clock, losses)
    out = smoke_run(Scaled(), step, steps=60)
    assert step.calls == list(range(1, 61))  # each step gets the trainer's next batch
    assert SMOKE_MEAN_STEPS == 50
    assert out["loss"] == [round(x, 6) for x in losses]
    assert out["first_mean"] == pytest.approx(sum(losses[:50]) / 50)  # 24.6234567
    assert out["last_mean"] == pytest.approx(sum(losses[10:]) / 50)
    assert out["steps"] == 60 and out["scaler_skips"] == 3
    assert (out["nonfinite_steps"], out["first_nonfinite_step"], out["status"], out["reason"]) == (
        0,
        None,
        "ok",
        None,
    )
    short = smoke_run(Trainer(), Steps(clock, [1.0, 2.0, 6.0]), steps=3)
    assert short["first_mean"] == short["last_mean"] == 3.0  # fewer than 50: all of them
    assert short["scaler_skips"] == 0  # no scaler attribute
    none = Trainer()
    none.scaler_skips = None
    assert smoke_run(none, Steps(clock, [1.0]), steps=1)["scaler_skips"] == 0


def test_smoke_run_stops_at_the_first_non_finite_loss_with_the_curve(clock):
    with pytest.raises(NonFiniteLoss) as info:
        smoke_run(Trainer(), Steps(clock, [1.0, 2.0, float("inf"), 3.0]), steps=4)
    assert (info.value.step, info.value.phase, info.value.value, info.value.curve) == (
        3,
        "smoke",
        math.inf,
        [1.0, 2.0],
    )


def test_smoke_run_stops_when_any_rank_says_so(clock):
    seen = []

    def agree_stop(bad):
        seen.append(bad)
        return len(seen) == 2  # another rank went non-finite at step 2

    with pytest.raises(NonFiniteLoss) as info:
        smoke_run(Trainer(), Steps(clock, [1.0, 2.0, 3.0]), steps=3, agree_stop=agree_stop)
    assert seen == [False, False] and info.value.step == 2 and info.value.curve == [1.0]
    seen.clear()
    # a rank's own non-finite loss is outvoted by nobody: agree_stop(True) -> True
    with pytest.raises(NonFiniteLoss):
        smoke_run(
            Trainer(), Steps(clock, [float("nan")]), steps=1, agree_stop=lambda bad: seen.append(bad) or bad
        )
    assert seen == [True]


def test_failed_smoke_keeps_the_curve_and_the_outcome():
    err = NonFiniteLoss(4, "smoke", math.nan, [1.0, 2.0, 3.1234567])
    out = failed_smoke(10, {"status": "error", "reason": "why"}, err)
    assert out == {
        "steps": 10,
        "loss": [1.0, 2.0, 3.123457],
        "first_mean": pytest.approx(6.1234567 / 3),
        "last_mean": pytest.approx(6.1234567 / 3),
        "nonfinite_steps": 1,
        "first_nonfinite_step": 4,
        "status": "error",
        "reason": "why",
    }
    other = failed_smoke(10, {"status": "oom", "reason": "out of memory"}, RuntimeError("x"))
    assert other == {
        "steps": 10,
        "loss": [],
        "first_mean": None,
        "last_mean": None,
        "nonfinite_steps": 0,
        "first_nonfinite_step": None,
        "status": "oom",
        "reason": "out of memory",
    }
