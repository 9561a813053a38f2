"""What a report gives a reader who must decide: speed against memory, time to a target, emulated
cards and noisy cells said plainly, several runs told apart, and a CSV / DataFrame that keeps types."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import LineCollection, PathCollection
from report_support import RTX4090_ENV, cell, emulated, noisy, on_card
from synthetic_records import cell_id as synthetic_cell_id
from synthetic_records import make_matrix, make_record, write_jsonl

from ditbench.core.errors import UserError
from ditbench.report import analysis
from ditbench.report.analysis import duration_text, gpu_hours_per_million_images, target_steps, time_text
from ditbench.report.load import load_results
from ditbench.report.memory import cell_budget, fit_memory, fits
from ditbench.report.plots import _pareto, memory_figure, speed_memory_figure, throughput_figure
from ditbench.report.render import build_report, results_table, to_markdown, write_report

ROOT = Path(__file__).resolve().parents[2]


def frame(tmp_path, records, name="results.jsonl", keep="latest"):
    write_jsonl(tmp_path / name, records)
    return load_results(tmp_path / name, keep=keep)


def capped_run():
    return [
        emulated(cell("DiT-L/4", "fp32", "none", 16, reserved=11.0, steps_per_s=13.6)),  # 11.5 GiB
        emulated(cell("DiT-L/4", "fp16", "none", 16, reserved=11.1, steps_per_s=12.5)),  # 11.6
        noisy(emulated(cell("DiT-L/4", "fp16", "full", 16, reserved=10.8, steps_per_s=8.1))),  # 11.3
        emulated(cell("DiT-L/4", "fp16", "none", 32, status="oom")),
        emulated(cell("DiT-B/8", "fp32", "none", 16, reserved=3.0, steps_per_s=60.0)),
    ]


# --------------------------------------------------------------------------------- memory and fit


def test_budget_and_fit_memory_of_new_and_old_records(tmp_path):
    df = frame(tmp_path, capped_run())
    row = df.iloc[0]
    budget = cell_budget(row)
    assert budget.emulated and budget.gib == 23.99 and budget.card == "RTX 4090"
    assert budget.ran_on() == "NVIDIA H200 (139.8 GiB) capped to 23.99 GiB"
    assert fit_memory(row) == (pytest.approx(11.5), "peak reserved + CUDA context")
    assert fits(row, 23.99) is True and fits(row, 11.0) is False
    assert fits(df.iloc[3], 23.99) is False and fits(df.iloc[3], 47.99) is None  # OOM under the cap
    # a real RTX 4090: no emulation, and the card's own verdict
    real = frame(tmp_path, [on_card(make_record("DiT-L/4", device_mem=20.0), RTX4090_ENV)], "real.jsonl")
    assert cell_budget(real.iloc[0]) is None and fit_memory(real.iloc[0]) == (20.0, "NVML device memory")


def test_the_report_says_which_card_really_ran_emulated_cells(tmp_path):
    df = frame(tmp_path, capped_run())
    blocks, _ = build_report(df)
    md = to_markdown(blocks)
    assert (
        "**Emulated card:** 5 cell(s) were meant for RTX 4090 (23.99 GiB) and ran on NVIDIA H200 (139.8 GiB) "
        "capped to 23.99 GiB. Memory and whether a cell fits are the RTX 4090's; speeds, times to a target "
        "and MFU are the NVIDIA H200's, not the RTX 4090's."
    ) in md
    assert (
        "on RTX 4090 (23.99 GiB), emulated on NVIDIA H200 (139.8 GiB) capped to 23.99 GiB (speeds are" in md
    )
    assert "| ran on |" in md and "NVIDIA H200 (139.8 GiB) capped to 23.99 GiB (emulating RTX 4090)" in md
    assert "| fits RTX 4090 (23.99 GiB) |" in md


def test_noisy_cells_are_marked(tmp_path):
    md = to_markdown(build_report(frame(tmp_path, capped_run()))[0])
    assert "**Noisy cells:** 1 cell(s) had unsteady step times" in md
    assert "| DiT-L/4 fp16 ckpt=full bs=16 | ok (noisy) |" in md
    assert "noisy: step-time spread 0.12 (bound 0.05), throughput gap 0.08 (bound 0.05)" in md
    assert "129.6 img/s · 10.50 GiB (noisy)" in md  # the matrix too


# --------------------------------------------------------------------------------- time to target


def test_time_to_target_and_gpu_hours():
    assert duration_text(30 * 60) == "30 min" and duration_text(47 * 3600) == "47.0 h"
    assert duration_text(3 * 86400) == "3.0 days"
    # 0.5 steps/s at batch 16 on one GPU: 400,000 steps = 800,000 s = 9.3 days; 8 images/s
    row = {
        "metrics.steps_per_s": 0.5,
        "metrics.images_per_s": 8.0,
        "config.global_batch": 16,
        "config.gpus": 1,
    }
    assert time_text(row, 400_000) == "9.3 days on 1 GPU (global batch 16, not the paper's 256)"
    assert gpu_hours_per_million_images(row) == pytest.approx(1e6 / 8 / 3600)  # 34.7
    # the paper's own batch on 8 GPUs: nothing to warn about
    dist = {
        "metrics.steps_per_s": 2.0,
        "metrics.images_per_s": 512.0,
        "config.global_batch": 256,
        "config.gpus": 8,
    }
    assert time_text(dist, 400_000) == "2.3 days on 8 GPUs"  # 200,000 s
    assert gpu_hours_per_million_images(dist) == pytest.approx(8 * 1e6 / 512 / 3600)


def test_target_steps_from_the_option_the_records_or_the_paper(tmp_path):
    df = frame(tmp_path, capped_run())
    assert target_steps(df) == (400_000, "default: the DiT paper's checkpoint for its model table")
    assert target_steps(df, 7_000_000)[0] == 7_000_000
    records = capped_run()
    for r in records:
        r["target_steps"] = 100_000
    assert target_steps(frame(tmp_path, records, "t.jsonl")) == (100_000, "the suite's target_steps")
    records[0]["target_steps"] = 50_000
    with pytest.raises(UserError, match="different target_steps"):
        target_steps(frame(tmp_path, records, "t2.jsonl"))
    md = to_markdown(build_report(df, steps=1_000_000)[0])
    assert "time to 1M steps" in md and "the paper's 1M steps at batch 256 are 256.0 million images" in md


# ------------------------------------------------------------------------------------------ plots


def test_pareto_front():
    mem = pd.Series({"a": 10.0, "b": 12.0, "c": 11.0, "d": 20.0, "e": 10.0})
    img = pd.Series({"a": 100.0, "b": 300.0, "c": 90.0, "d": 250.0, "e": 120.0})
    # e beats a (same memory, faster); c is beaten by e; d by b
    assert _pareto(mem, img) == ["e", "b"]


def test_speed_memory_figure(tmp_path):
    df = frame(tmp_path, capped_run())
    fig = speed_memory_figure(df)
    l4, b8 = fig.axes[:2]
    assert l4.get_title() == "DiT-L/4" and b8.get_title() == "DiT-B/8"
    dots = [c for c in l4.collections if isinstance(c, PathCollection)]
    assert len(dots) == 3 + 1  # three ok cells, one noisy ring
    assert sum(isinstance(c, LineCollection) for c in l4.collections) == 3  # each cell's p10-p90 bar
    # the budget is drawn on the same memory measure as the points: reserved + context, at 23.99
    budget = [ln for ln in l4.get_lines() if ln.get_label().startswith("budget")]
    assert budget and budget[0].get_xdata()[0] == 23.99
    assert l4.get_xlabel() == "peak reserved + CUDA context (GiB)"
    points = sorted(tuple(c.get_offsets()[0]) for c in dots if c.get_sizes()[0] < 100)
    flat = [v for p in points for v in p]
    assert flat == pytest.approx([11.3, 129.6, 11.5, 217.6, 11.6, 200.0])
    front = next(ln for ln in l4.get_lines() if ln.get_label() == "Pareto front")
    assert list(front.get_xdata()) == pytest.approx([11.3, 11.5])
    assert [t.get_text() for t in l4.texts] == ["16", "16", "16", "32"]  # batch labels; 32 is the OOM
    # one legend, below every panel: it cannot cover a point
    (legend,) = fig.legends
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    box = legend.get_window_extent(renderer)
    assert all(box.y1 <= ax.get_window_extent(renderer).y0 for ax in fig.axes if ax.get_visible())
    labels = [t.get_text() for t in legend.get_texts()]
    assert "budget: RTX 4090 (23.99 GiB)" in labels and "noisy (unsteady step times)" in labels


def test_equal_lines_stay_visible(tmp_path):
    """bf16 and fp16 often measure the same: their points are nudged apart and drawn with other markers."""
    records = [
        make_record("DiT-B/4", p, "none", bs, images_per_s=500.0, peak_alloc=8.0)
        for p in ("bf16", "fp16")
        for bs in (16, 32)
    ]
    fig = throughput_figure(frame(tmp_path, records))
    bf16, fp16 = [ln for ln in fig.axes[0].get_lines() if not ln.get_label().startswith("_")]  # not bar caps
    assert bf16.get_marker() != fp16.get_marker()
    assert all(a < b for a, b in zip(bf16.get_xdata(), fp16.get_xdata(), strict=True))
    mem = memory_figure(frame(tmp_path, records, "m.jsonl"))
    a, b = mem.axes[0].get_lines()[:2]
    assert list(a.get_ydata()) == list(b.get_ydata()) and list(a.get_xdata()) != list(b.get_xdata())


def test_line_names_are_the_same_in_every_panel(tmp_path):
    # DiT-B/8 varies only precision, DiT-XL/2 only checkpointing: lines are still named by both
    records = [
        make_record("DiT-B/8", "fp32", "none", 16),
        make_record("DiT-B/8", "fp16", "none", 16),
        make_record("DiT-XL/2", "fp16", "none", 16),
        make_record("DiT-XL/2", "fp16", "full", 16),
    ]
    fig = throughput_figure(frame(tmp_path, records))
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels == ["fp32 ckpt=none", "fp16 ckpt=none", "fp16 ckpt=full", "p10–p90 of step times"]


# ------------------------------------------------------------------------------------ several runs


def test_keep_all_tells_the_runs_apart(tmp_path):
    a = make_record("DiT-S/8", images_per_s=100.0, run_id="run-1", started_at="2026-11-29T10:00:00Z")
    b = make_record("DiT-S/8", images_per_s=120.0, run_id="run-2", started_at="2026-11-29T12:00:00Z")
    base_a = make_record(
        "DiT-S/8", "bf16", images_per_s=200.0, run_id="run-1", started_at="2026-11-29T10:01:00Z"
    )
    base_b = make_record(
        "DiT-S/8", "bf16", images_per_s=360.0, run_id="run-2", started_at="2026-11-29T12:01:00Z"
    )
    df = frame(tmp_path, [a, base_a, b, base_b], keep="all")
    md = to_markdown(build_report(df)[0])
    assert "**Several runs:**" in md and "| run |" in md
    assert "run-1 (2026-11-29 10:00)" in md and "run-2 (2026-11-29 12:00)" in md
    # one grid row per run (its label, else its run id), not per start minute
    assert "| fp32 · run run-1 |" in md and "| bf16 · run run-2 |" in md
    # each bf16 cell is compared with the fp32 baseline of its own run
    cmp = analysis.baseline_comparison(df)
    speedups = dict(zip(df["run_id"] + df["config.precision"], cmp["speedup"], strict=True))
    assert speedups["run-1bf16"] == pytest.approx(2.0) and speedups["run-2bf16"] == pytest.approx(3.0)


# ------------------------------------------------------------------------------------ csv and load


def test_csv_has_no_empty_placeholders_and_keeps_integers(tmp_path):
    records = make_matrix(models=("DiT-S/8",), precisions=("fp32", "fp16"), batches=(2,), device="cpu")
    df = frame(tmp_path, records)
    assert df["metrics.params"].dtype == "Int64" and df["config.batch_size"].dtype == "Int64"
    assert df["config.compile"].dtype == bool and df["metrics.params"].isna().sum() == 2  # fp16: no metrics
    assert "smoke" not in df and "metrics" not in df and "metrics.mfu" in df  # mfu is null on every CPU row
    path = tmp_path / "r.csv"
    path.write_text(results_table(df).to_csv(index=False))
    header = path.read_text().splitlines()[0].split(",")
    assert "smoke" not in header and "metrics" not in header
    csv = pd.read_csv(path)
    assert csv["metrics.params"].dropna().map(float.is_integer).all()
    assert ",33150000," in path.read_text()  # written as an integer, not 33150000.0


def test_load_results_is_importable_from_the_package_without_pandas_or_torch(tmp_path):
    write_jsonl(tmp_path / "results.jsonl", capped_run())
    code = (
        "import sys, ditbench\n"
        "assert 'pandas' not in sys.modules and 'torch' not in sys.modules\n"
        f"df = ditbench.load_results({str(tmp_path / 'results.jsonl')!r})\n"
        "print(len(df), type(df).__name__)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["5", "DataFrame"]


def test_a_report_of_the_capped_run_is_written(tmp_path):
    df = frame(tmp_path, capped_run())
    written = write_report(df, tmp_path / "r")
    assert "speed_memory" in written and (tmp_path / "r" / "speed_memory.png").stat().st_size > 10_000
    html = (tmp_path / "r" / "report.html").read_text()
    assert 'id="plot-speed_memory"' in html and "Emulated card" in html
    assert json.loads(json.dumps(list(written)))  # names only, no surprises


def test_hand_edited_emulation_fields_do_not_break_a_report(tmp_path):
    bad = [emulated(cell("DiT-L/4", "fp16", "none", 16, reserved=10.0, steps_per_s=1.0)) for _ in range(5)]
    bad[0]["metrics"]["emulation"] = None  # no object
    bad[1]["metrics"]["emulation"]["budget_gib"] = -3
    bad[2]["metrics"]["emulation"]["context_gib"] = None
    bad[3]["metrics"]["emulation"]["real_gpu"] = None
    bad[4]["metrics"]["noise"] = {"step_spread": None}
    bad[4]["metrics"]["noisy"] = True
    for i, r in enumerate(bad):
        r["config"]["seed"] = i  # distinct cells, each with its config's id (else the loader refuses it)
        r["cell_id"] = synthetic_cell_id(r["config"])
    path = tmp_path / "results.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in bad) + "\n")  # an Infinity is refused: test_report
    df = load_results(path)
    md = to_markdown(build_report(df)[0])
    assert "noisy" in md and "Infinity" not in md
    budgets = [cell_budget(row) for _, row in df.iterrows()]
    assert budgets[3].real_gpu == "NVIDIA H200"  # from env
    assert fit_memory(df.iloc[2])[1] == "peak reserved"  # no usable context, no NVML figure
    assert cell_budget(df.iloc[0]).gib == 23.99  # from config.gpu_memory_gib when emulation is null
    assert cell_budget(df.iloc[1]).gib == 23.99  # a negative budget is ignored
    # A value of the wrong type is no record: the loader names it (issue 34, class 6)
    for key, value in (("emulation", "capped"), ("noise", {"step_spread": "wide"})):
        path.write_text(json.dumps({**bad[0], "metrics": {**bad[0]["metrics"], key: value}}) + "\n")
        with pytest.raises(UserError, match=f"line 1 .*is not a valid result record: metrics.{key}"):
            load_results(path)
