"""Repeats in fresh processes (issue 22, point 2): the suite key and flag, the round-robin order, one
record per repeat, resume after a kill, the combined figure with its interval, and the gate comparing
run-level samples; and the `slow:F` fault that point 4's benchmark injects."""

from __future__ import annotations

import textwrap
from types import SimpleNamespace

import pytest
from synthetic_records import make_record, write_jsonl

from ditbench.bench import runner
from ditbench.bench.launch.files import write_result
from ditbench.bench.repeats import cell_groups, combine
from ditbench.bench.runner import RunOptions, run_suite
from ditbench.core import faults
from ditbench.core.errors import UserError
from ditbench.core.faults import Fault, FaultyStep, parse_fault_spec
from ditbench.core.intervals import median_interval
from ditbench.records.jsonl import read_records
from ditbench.records.model import Record, check
from ditbench.report.gate.decide import compare_files
from ditbench.report.load import load_results
from ditbench.spec.suite import load_suite, suite_schema


def suite_file(tmp_path, extra: str = "", batches=(1, 2)):
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
        + extra
    )
    return path


# ------------------------------------------------------------------------------------------ the suite


def test_repeats_is_a_suite_key_and_not_part_of_a_cell_id(tmp_path):
    once = load_suite(suite_file(tmp_path))
    assert once.repeats == 1
    thrice = load_suite(suite_file(tmp_path, "repeats: 3\n"))
    assert thrice.repeats == 3
    assert [c.cell_id for c in thrice.cells] == [c.cell_id for c in once.cells]
    assert load_suite(suite_file(tmp_path), ["repeats=4"]).repeats == 4
    schema = suite_schema()["properties"]["repeats"]
    assert (schema["type"], schema["minimum"], schema["maximum"], schema["default"]) == ("integer", 1, 100, 1)


@pytest.mark.parametrize("value", ["0", "101", "2.5", "'three'", "true"])
def test_bad_repeats_names_the_key_and_the_valid_range(tmp_path, value):
    with pytest.raises(UserError, match=r"at `repeats`.*repeats must be an integer"):
        load_suite(suite_file(tmp_path, f"repeats: {value}\n"))


def test_run_refuses_repeats_out_of_range(tmp_path):
    with pytest.raises(UserError, match="--repeats must be a whole number of runs from 1 to 100, got 0"):
        runner.check_options(RunOptions(out=tmp_path, repeats=0))


def test_dry_run_says_how_often(tmp_path, capsys):
    from ditbench.cli import main

    path = suite_file(tmp_path, "repeats: 3\n")
    assert main(["run", str(path), "--dry-run", "--out", str(tmp_path / "o")]) == 0
    assert "2 cells, each 3 times in fresh processes, round-robin ->" in capsys.readouterr().out


# ------------------------------------------------------------------------------------------ the runner

OK_MS = {1: 20.0, 2: 22.0, 3: 18.0}  # the stand-in's median step time per repeat


def ok(ms: float) -> dict:
    return {
        "status": "ok",
        "reason": None,
        "metrics": {
            "images_per_s": 1000.0 / ms,
            "steps_per_s": 1000.0 / ms,
            "step_ms": {"median": ms, "p10": ms, "p90": ms, "samples": [ms, ms, ms]},
        },
    }


@pytest.fixture
def cells(monkeypatch):
    """The stand-in cell process: records (batch, repeat) it ran; `fail` maps one to a status."""

    class Cells:
        ran: list[tuple[int, int]] = []
        fail: dict[tuple[int, int], str] = {}
        kill_at: int | None = None  # a KeyboardInterrupt when this many cells have started
        after_result = False  # ... after the cell wrote its result (a kill before the append)

    def launch(spec, about, timeout_s, spec_path, result_path, log_path):
        batch = int(about["cell_name"].rsplit("bs=", 1)[1])
        key = result_path.name.split(".")[0]  # the ticket key names the repeat: <cell_id>-r<K>
        repeat = int(key.rsplit("-r", 1)[1]) if "-r" in key else 1
        Cells.ran.append((batch, repeat))
        if Cells.kill_at is not None and len(Cells.ran) == Cells.kill_at and not Cells.after_result:
            raise KeyboardInterrupt
        status = Cells.fail.get((batch, repeat))
        write_result(result_path, ok(OK_MS[repeat]) if status is None else {"status": status, "reason": "x"})
        if Cells.kill_at is not None and len(Cells.ran) == Cells.kill_at:
            raise KeyboardInterrupt

    Cells.ran, Cells.fail, Cells.kill_at, Cells.after_result = [], {}, None, False
    monkeypatch.setattr(runner, "launcher_for", lambda spec: SimpleNamespace(launch=launch))
    return Cells


def run(tmp_path, **kw):
    lines: list[str] = []
    records = run_suite(
        load_suite(suite_file(tmp_path)), RunOptions(out=tmp_path / "out", progress=False, **kw), lines.append
    )
    return records, lines


def test_repeats_run_round_robin_each_its_own_record(tmp_path, cells):
    records, lines = run(tmp_path, repeats=3)
    assert cells.ran == [(1, 1), (2, 1), (1, 2), (2, 2), (1, 3), (2, 3)]
    written = read_records(tmp_path / "out" / "results.jsonl")
    assert [(r["config"]["batch_size"], r["repeat"], r["repeats"]) for r in written] == [
        (1, 1, 3), (2, 1, 3), (1, 2, 3), (2, 2, 3), (1, 3, 3), (2, 3, 3)
    ]  # fmt: skip
    assert len({r["cell_id"] for r in written}) == 2 and len({r["run_id"] for r in written}) == 1
    assert lines[0].startswith("[1/6] repeat 1/3 ")
    # one record per cell comes back: the median of the repeats' medians, with every repeat's figure
    assert [r["metrics"]["step_ms"]["median"] for r in records] == [20.0, 20.0]
    rep = records[0]["metrics"]["repeats"]
    assert rep["step_ms"] == [20.0, 22.0, 18.0] and rep["count"] == 3 and rep["of"] == 3
    assert rep["step_ms_ci"] == list(median_interval([20.0, 22.0, 18.0]))
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "50.0 (95% CI 45.5-55.6, 3 runs)" in summary


def test_a_run_without_repeats_writes_records_as_before(tmp_path, cells):
    records, lines = run(tmp_path)
    assert cells.ran == [(1, 1), (2, 1)]
    written = read_records(tmp_path / "out" / "results.jsonl")
    assert all("repeat" not in r and "repeats" not in r for r in written)
    assert all("repeats" not in r["metrics"] for r in records)
    assert lines[0].startswith("[1/2] DiT-T/8")


def test_resume_after_a_kill_redoes_only_the_missing_repeats(tmp_path, cells):
    cells.kill_at = 4  # killed while (2, 2) runs
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, repeats=3)
    assert len(read_records(tmp_path / "out" / "results.jsonl")) == 3
    cells.ran, cells.kill_at = [], None
    _, lines = run(tmp_path, repeats=3)
    assert cells.ran == [(2, 2), (1, 3), (2, 3)]
    assert lines[0] == "resuming " + str(tmp_path / "out") + ": 3 of 6 cell repeats already ok, 3 to run"
    written = read_records(tmp_path / "out" / "results.jsonl")
    assert sorted((r["config"]["batch_size"], r["repeat"]) for r in written) == [
        (1, 1), (1, 2), (1, 3), (2, 1), (2, 2), (2, 3)
    ]  # fmt: skip


def test_a_repeat_killed_before_its_append_is_adopted_as_that_repeat(tmp_path, cells):
    cells.kill_at, cells.after_result = 4, True  # (2, 2) wrote its result; the run died before appending
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, repeats=3)
    cells.ran, cells.kill_at = [], None
    _, lines = run(tmp_path, repeats=3)
    assert lines[0].startswith("adopted the finished result of a killed run: DiT-T/8 fp32 ckpt=none bs=2")
    assert cells.ran == [(1, 3), (2, 3)]
    written = read_records(tmp_path / "out" / "results.jsonl")
    keys = [(r["config"]["batch_size"], r["repeat"]) for r in written]
    assert sorted(keys) == [(1, 1), (1, 2), (1, 3), (2, 1), (2, 2), (2, 3)]
    assert written[3]["repeat"] == 2 and "adopted_by" in written[3]


def test_a_failed_repeat_stops_the_cells_later_repeats(tmp_path, cells):
    cells.fail = {(1, 1): "error"}  # (an oom would skip the larger batch 2 too)
    records, _ = run(tmp_path, repeats=3)
    assert cells.ran == [(1, 1), (2, 1), (2, 2), (2, 3)]
    by_batch = {r["config"]["batch_size"]: r for r in records}
    assert by_batch[1]["status"] == "error"  # the failure, not the skipped repeats after it
    written = [r for r in read_records(tmp_path / "out" / "results.jsonl") if r["config"]["batch_size"] == 1]
    assert [r["status"] for r in written] == ["error", "skipped", "skipped"]
    assert written[1]["reason"] == "repeat 1 of this cell ended error; its other repeats are not run"


# ------------------------------------------------------------------------------------------ combining


def rec(repeat, repeats, ms, run_id="r1", status="ok"):
    r = make_record(status=status, images_per_s=8000.0 / ms, samples=[ms] * 5, run_id=run_id)
    r["repeat"], r["repeats"] = repeat, repeats
    return r


def records(*raw):
    return [Record.model_validate(r) for r in raw]


def test_combine_takes_medians_of_the_per_process_medians():
    group = records(rec(1, 4, 20.0), rec(2, 4, 25.0), rec(3, 4, 22.0), rec(4, 4, 21.0))
    out = combine(group)
    assert out["metrics"]["step_ms"]["median"] == 21.5  # median of 20, 25, 22, 21
    assert out["metrics"]["images_per_s"] == (8000 / 21 + 8000 / 22) / 2
    assert out["metrics"]["repeats"]["images_per_s_ci"] == list(
        median_interval([8000 / m for m in (20, 25, 22, 21)])
    )
    assert "repeat" not in out and out["repeats"] == 4
    (once,) = records({k: v for k, v in rec(1, 1, 20.0).items() if k not in ("repeat", "repeats")})
    assert combine([once]) is once


def test_a_cells_repeats_are_the_latest_of_each_index_up_to_the_latest_k():
    old = [rec(i, 5, 30.0, "old") for i in range(1, 6)]
    new = [rec(i, 3, 20.0, "new") for i in range(1, 4)]
    (group,) = cell_groups(records(*old, *new)).values()
    assert [(r["run_id"], r["repeat"]) for r in group] == [("new", 1), ("new", 2), ("new", 3)]


def test_load_results_combines_a_cells_repeats_into_one_row(tmp_path):
    path = tmp_path / "results.jsonl"
    write_jsonl(path, [rec(1, 3, 20.0), rec(2, 3, 22.0), rec(3, 3, 18.0)])
    df = load_results(path)
    assert len(df) == 1
    assert df.loc[0, "source"] == f"{path}:1,2,3"
    assert df.loc[0, "metrics.step_ms.median"] == 20.0
    assert len(load_results(path, keep="all")) == 3


def test_the_report_shows_a_cells_median_with_its_interval(tmp_path):
    from ditbench.report.render import build_report

    path = tmp_path / "results.jsonl"
    write_jsonl(path, [rec(1, 3, 20.0), rec(2, 3, 25.0), rec(3, 3, 16.0)])
    blocks, _ = build_report(load_results(path), None, None, None, None)
    assert "400 (95% CI 320–500, 3 runs)"  # ± 90: no decimal in repr(blocks)


@pytest.mark.parametrize(("repeat", "repeats"), [(0, 3), (4, 3), (1, None), ("1", 3), (True, 3), (1, 101)])
def test_a_record_with_a_bad_repeat_index_is_not_valid(repeat, repeats):
    r = rec(1, 3, 20.0)
    r["repeat"], r["repeats"] = repeat, repeats
    assert "is not a repeat index from 1 to repeats" in check(r)[1]


# ------------------------------------------------------------------------------------------ the gate


def run_file(tmp_path, name, step_ms: list[float]):
    path = tmp_path / f"{name}.jsonl"
    k = len(step_ms)
    records = (
        [rec(i + 1, k, ms, run_id=name) for i, ms in enumerate(step_ms)]
        if k > 1
        else [make_record(images_per_s=8000.0 / step_ms[0], samples=[step_ms[0]] * 30, run_id=name)]
    )
    write_jsonl(path, records)
    return path


def images(result):
    return next(m for m in result.cells[0].metrics if m.metric == "images_per_s")


def test_the_gate_compares_run_level_samples_when_both_runs_have_repeats(tmp_path):
    base = run_file(tmp_path, "base", [20.0, 20.2, 19.8, 20.1, 19.9])
    slower = run_file(tmp_path, "slow", [22.0, 22.2, 21.8, 22.1, 21.9])  # +10% a step: -9.1% images/s
    result = compare_files(base, slower)
    delta = images(result)
    assert result.cells[0].verdict == "regression"
    assert delta.significance.startswith("p=0.0079 over 5/5 runs")
    same = compare_files(base, run_file(tmp_path, "same", [20.1, 19.9, 20.0, 20.2, 19.8]))
    assert same.cells[0].verdict == "pass"


def test_the_gate_is_inconclusive_when_the_repeats_spread_across_the_threshold(tmp_path):
    base = run_file(tmp_path, "base", [20.0, 18.0, 23.0, 19.0, 22.0])
    new = run_file(tmp_path, "new", [21.0, 19.0, 24.0, 20.0, 23.0])
    assert compare_files(base, new).cells[0].verdict == "inconclusive"


def test_an_apparent_improvement_whose_interval_reaches_a_slowdown_is_inconclusive(tmp_path):
    # the +5% case of reports/gate_power/ round 1: images/s +12% by the medians, interval -25%..+56%
    base = run_file(tmp_path, "base", [54.2, 49.2, 66.8, 38.8, 75.3])
    new = run_file(tmp_path, "new", [45.8, 47.8, 47.9, 72.0, 59.6])
    delta = images(compare_files(base, new, load_policy_text(tmp_path, "metrics: {images_per_s: 2}")))
    assert delta.direction == "better" and delta.verdict == "inconclusive"


def test_a_slowdown_beyond_the_threshold_by_its_interval_but_not_significant_is_inconclusive(tmp_path):
    # like gate_power round 6, +5% at a 2% threshold: images/s -13.1%, interval -40.4%..-3.6%, p=0.032
    base = run_file(tmp_path, "base", [18.63, 19.94, 19.88, 20.50, 19.94])
    new = run_file(tmp_path, "new", [32.81, 23.46, 20.70, 20.88, 22.52])
    delta = images(compare_files(base, new, load_policy_text(tmp_path, "metrics: {images_per_s: 2}")))
    assert delta.direction == "worse" and delta.p_value >= 0.01
    assert max(delta.interval_pct) < -2.0 and delta.verdict == "inconclusive"


def load_policy_text(tmp_path, text):
    from ditbench.report.gate.policy import load_policy

    path = tmp_path / "policy.yaml"
    path.write_text(text + "\n")
    return load_policy(path)


def test_too_few_repeats_to_test_say_so(tmp_path):
    base = run_file(tmp_path, "base", [20.0, 20.2, 19.8])
    new = run_file(tmp_path, "new", [22.0, 22.2, 21.8])
    delta = images(compare_files(base, new))
    assert delta.significance == "not tested (n=3/3 runs < 5; threshold decides)"


def test_one_side_without_repeats_keeps_the_per_step_test(tmp_path):
    base = run_file(tmp_path, "base", [20.0])
    new = run_file(tmp_path, "new", [20.1, 19.9, 20.0, 20.2, 19.8])
    assert "runs" not in images(compare_files(base, new)).significance


# ------------------------------------------------------------------------------------------ slow:F


def test_slow_fault_grammar():
    assert parse_fault_spec("bs=8=slow:0.10,bs=16=oom@3,x=slow:1e-1@4") == [
        ("bs=8", Fault("slow", 1, 0.1)),
        ("bs=16", Fault("oom", 3)),
        ("x", Fault("slow", 4, 0.1)),
    ]


@pytest.mark.parametrize(
    "bad", ["a=slow", "a=slow:0", "a=slow:-0.1", "a=slow:10.5", "a=slow:nan", "a=oom:0.1"]
)
def test_slow_fault_needs_a_fraction_and_only_slow_takes_one(bad):
    with pytest.raises(UserError, match=r"slow as slow:F, F a fraction above 0 and at most 10"):
        parse_fault_spec(bad)


def test_slow_fault_spins_its_fraction_of_each_steps_own_time(monkeypatch):
    """Busy work on the same core, never a sleep (waking from one costs more than F on a loaded machine)."""
    now = [10.0]

    def clock() -> float:
        now[0] += 0.001  # every reading costs a millisecond of the spin
        return now[0]

    def work(seconds):
        def step(batch):
            now[0] += seconds
            return batch * 2

        return step

    monkeypatch.setattr(faults.time, "perf_counter", clock)
    monkeypatch.setattr(faults.time, "sleep", lambda s: pytest.fail("slow:F must not sleep"))
    trainer = SimpleNamespace(step=work(0.5))
    step = FaultyStep(trainer, Fault("slow", 2, 0.10))
    assert step(1) == 2 and now[0] == pytest.approx(10.5)  # step 1 is before the fault's step: not slowed
    start = now[0]
    assert step(2) == 4
    # the step (0.5 s, read as 0.501 s between its two clock readings) and 10% of that spun
    assert now[0] - start == pytest.approx(0.5 + 0.002 + 0.0501, abs=0.0011)
    trainer.step = work(0.25)
    start = now[0]
    assert step(3) == 6
    assert now[0] - start == pytest.approx(0.25 + 0.002 + 0.0251, abs=0.0011)
