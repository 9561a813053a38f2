"""`ditbench report`: loading results, baseline comparison, recommendations, advice checks, files."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pandas as pd
import pytest
from PIL import Image
from synthetic_records import CPU_ENV, make_matrix, make_record, write_jsonl

from ditbench.core.errors import UserError
from ditbench.records.model import Record
from ditbench.report import advice, analysis
from ditbench.report.load import load_results
from ditbench.report.plots import render_plots
from ditbench.report.render import write_report

ROOT = Path(__file__).resolve().parents[2]


def frame(tmp_path, records, name="results.jsonl"):
    path = tmp_path / name
    write_jsonl(path, records)
    return load_results(path)


def good_advice_records():
    """Numbers chosen so that every advice check holds, with known ratios."""
    return [
        # DiT-L/4 at batch 32: the baseline, fp16, fp16 + checkpointing
        make_record(
            "DiT-L/4",
            "fp32",
            "none",
            32,
            images_per_s=200.0,
            peak_alloc=20.0,
            device_mem=21.0,
            smoke_steps=40,
        ),
        make_record("DiT-L/4", "fp16", "none", 32, images_per_s=500.0, peak_alloc=11.0, device_mem=12.0),
        make_record("DiT-L/4", "fp16", "full", 32, images_per_s=400.0, peak_alloc=5.0, device_mem=6.0),
        make_record("DiT-L/4", "fp32", "none", 64, "oom"),
        # DiT-B/8 fp16 fits 12 GiB at batch 64, not at 128
        make_record("DiT-B/8", "fp32", "none", 64, images_per_s=1000.0, peak_alloc=15.0, device_mem=16.0),
        make_record("DiT-B/8", "fp16", "none", 64, images_per_s=3000.0, peak_alloc=7.0, device_mem=8.0),
        make_record("DiT-B/8", "fp16", "none", 128, images_per_s=3300.0, peak_alloc=12.0, device_mem=13.0),
        # DiT-XL/2 fits 48 GiB, and with checkpointing even 24
        make_record("DiT-XL/2", "bf16", "none", 32, images_per_s=277.0, peak_alloc=26.0, device_mem=27.0),
        make_record("DiT-XL/2", "bf16", "full", 32, images_per_s=230.0, peak_alloc=15.0, device_mem=16.0),
    ]


def bad_advice_records():
    """Numbers chosen so that the advice does not hold (or cannot be judged); DiT-L/4's training state
    is 8.53 GiB (458M parameters x 20 bytes), so its activations are 15-32% of these peaks."""
    cap = dict(gpu_memory_gib=24)
    return [
        make_record(
            "DiT-L/4", "fp32", "none", 16, images_per_s=217.0, peak_alloc=12.5, device_mem=13.5, **cap
        ),
        make_record(
            "DiT-L/4", "fp16", "none", 16, images_per_s=200.0, peak_alloc=10.0, device_mem=11.0, **cap
        ),
        make_record(
            "DiT-L/4", "fp16", "full", 16, images_per_s=130.0, peak_alloc=9.5, device_mem=10.5, **cap
        ),
        make_record("DiT-L/4", "fp16", "full", 32, "oom", **cap),
        make_record(
            "DiT-B/8", "fp16", "none", 256, images_per_s=5000.0, peak_alloc=13.5, device_mem=14.0, **cap
        ),
    ]


# ------------------------------------------------------------------------------------------ load


def test_load_flattens_and_keeps_the_record(tmp_path):
    records = good_advice_records()
    df = frame(tmp_path, records)
    assert len(df) == len(records)
    row = df.iloc[1]
    assert row["config.precision"] == "fp16" and row["config.batch_size"] == 32
    assert row["metrics.images_per_s"] == 500.0 and row["metrics.step_ms.median"] == pytest.approx(
        64.0, rel=0.05
    )
    assert row["metrics.mfu.peak_basis"] == "datasheet" and row["config.steps.warmup"] == 5
    assert row["env.gpu_name"] == "NVIDIA H200"
    assert isinstance(row["record"], Record) and row["record"].dump() == records[1]
    assert row["source"].endswith("results.jsonl:2")
    assert df.iloc[0]["smoke.steps"] == 40 and len(df.iloc[0]["smoke.loss"]) == 40


def test_torn_trailing_line_is_skipped_with_a_warning(tmp_path):
    path = tmp_path / "results.jsonl"
    write_jsonl(path, good_advice_records()[:2], torn_tail='{"schema": "ditbench.result/1", "cell_id": "ab')
    with pytest.warns(UserWarning, match="line 3 is an incomplete record"):
        df = load_results(path)
    assert len(df) == 2


def test_corrupt_middle_line_names_file_and_line(tmp_path):
    path = tmp_path / "results.jsonl"
    lines = [json.dumps(r) for r in good_advice_records()[:2]]
    path.write_text(lines[0] + "\n{not json\n" + lines[1] + "\n")
    with pytest.raises(UserError, match=r"results.jsonl line 2 is not JSON"):
        load_results(path)


@pytest.mark.parametrize(
    "line, needle",
    [
        ('{"model": "DiT-S/8"}', "line 1 is not a ditbench result record"),
        ("[1, 2, 3]", "line 1 is a JSON list, not a result record"),
        ('{"schema": "ditbench.result/9", "cell_id": "x", "config": {}, "status": "ok"}', "does not know"),
        ('{"schema": "ditbench.result/1", "config": {}, "status": "ok"}', "cell_id is missing"),
    ],
)
def test_not_a_result_file(tmp_path, line, needle):
    path = tmp_path / "other.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(UserError) as err:
        load_results(path)
    assert needle in str(err.value) and str(path) in str(err.value)


def test_missing_empty_and_directory_inputs(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        load_results(tmp_path / "nope.jsonl")
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(UserError, match="no result records"):
        load_results(tmp_path / "empty.jsonl")
    with pytest.raises(UserError, match="directory without a results.jsonl"):
        load_results(tmp_path)
    write_jsonl(tmp_path / "results.jsonl", good_advice_records()[:1])
    assert len(load_results(tmp_path)) == 1  # a run directory works too


def test_latest_record_of_a_cell_wins_across_files(tmp_path):
    early = make_record("DiT-S/8", images_per_s=100.0, started_at="2026-11-29T10:00:00Z")
    late = make_record("DiT-S/8", images_per_s=120.0, started_at="2026-11-29T12:00:00Z")
    write_jsonl(tmp_path / "a.jsonl", [late])
    write_jsonl(tmp_path / "b.jsonl", [early])
    df = load_results([tmp_path / "a.jsonl", tmp_path / "b.jsonl"])
    assert len(df) == 1 and df.iloc[0]["metrics.images_per_s"] == 120.0
    both = load_results([tmp_path / "a.jsonl", tmp_path / "b.jsonl"], keep="all")
    assert sorted(both["metrics.images_per_s"]) == [100.0, 120.0]


# -------------------------------------------------------------------------------------- analysis


def test_baseline_speedup_and_memory_saved(tmp_path):
    df = frame(tmp_path, good_advice_records())
    cmp = analysis.baseline_comparison(df)
    by_name = {df.at[i, "cell_name"]: cmp.loc[i] for i in df.index}
    assert by_name["DiT-L/4 fp32 ckpt=none bs=32"]["is_baseline"]
    fp16 = by_name["DiT-L/4 fp16 ckpt=none bs=32"]
    assert fp16["speedup"] == pytest.approx(2.5) and fp16["mem_saved_pct"] == pytest.approx(45.0)
    ckpt = by_name["DiT-L/4 fp16 ckpt=full bs=32"]
    assert ckpt["speedup"] == pytest.approx(2.0) and ckpt["mem_saved_pct"] == pytest.approx(75.0)
    assert ckpt["baseline_cell_id"] == df.iloc[0]["cell_id"]
    # the smoke run only on the baseline cell does not stop the match (smoke_steps is bookkeeping)
    assert df.iloc[0]["config.smoke_steps"] == 40 and df.iloc[1]["config.smoke_steps"] == 0
    # DiT-XL/2 has no fp32 baseline in this run
    assert "did not run ok" in by_name["DiT-XL/2 bf16 ckpt=none bs=32"]["baseline_note"]


def test_no_suite_baseline_is_said(tmp_path):
    df = frame(tmp_path, [make_record("DiT-S/8", suite_baseline={})])
    assert analysis.baseline_comparison(df).iloc[0]["baseline_note"] == "the suite names no baseline"


def test_recommendation_is_the_fastest_cell_that_fits(tmp_path):
    df = frame(tmp_path, good_advice_records())
    recs = analysis.recommend(df)
    best = {r.model: r for r in recs.per_model}
    assert best["DiT-L/4"].cell_name == "DiT-L/4 fp16 ckpt=none bs=32" and best["DiT-L/4"].rate == 500.0
    assert best["DiT-B/8"].cell_name == "DiT-B/8 fp16 ckpt=none bs=128"  # no cap: the card held it
    (largest,) = recs.largest.values()
    assert largest.model == "DiT-XL/2" and largest.budget == "the NVIDIA H200 (139.8 GiB) it ran on"


def test_recommendation_respects_the_suite_budget(tmp_path):
    cap = dict(gpu_memory_gib=12)
    df = frame(
        tmp_path,
        [
            make_record("DiT-L/4", "fp16", "none", 32, "oom", **cap),  # out of memory under the 12 GiB cap
            make_record("DiT-L/4", "fp16", "full", 32, images_per_s=400.0, device_mem=6.0, **cap),
            make_record("DiT-XL/2", "bf16", "none", 32, "oom", **cap),
        ],
    )
    recs = analysis.recommend(df)
    best = {r.model: r for r in recs.per_model}
    assert best["DiT-L/4"].cell_name == "DiT-L/4 fp16 ckpt=full bs=32"
    assert best["DiT-XL/2"].cell_name is None and "1 oom" in best["DiT-XL/2"].note
    (((budget, gpus), largest),) = recs.largest.items()
    assert largest.model == "DiT-L/4" and gpus == 1
    # the cap emulated a 12 GiB card on the H200: the budget says so, and whose speeds they are
    assert (
        budget
        == "12 GiB, emulated on NVIDIA H200 (139.8 GiB) capped to 12 GiB (speeds are the NVIDIA H200's)"
    )


def test_advice_holds_with_the_numbers(tmp_path):
    checks = {c.claim: c for c in advice.advice_checks(frame(tmp_path, good_advice_records()))}
    fp16 = checks["fp16 halves memory"]
    assert fp16.verdict == "held"
    ratios = sorted(n["ratio"] for n in fp16.numbers)
    assert ratios == pytest.approx(sorted([11 / 20, 7 / 15]))
    assert "median ratio 0.51 over 2 pair(s)" in fp16.evidence  # median of 0.55 and 0.467
    ckpt = checks["gradient checkpointing saves about 50% memory for 20-30% more time"]
    assert ckpt.verdict == "held"
    l4_pair, xl_pair = sorted(ckpt.numbers, key=lambda n: n["cell"])
    assert l4_pair["saving"] == pytest.approx(1 - 5 / 11) and l4_pair["extra_time"] == pytest.approx(0.25)
    assert xl_pair["saving"] == pytest.approx(1 - 15 / 26) and xl_pair["extra_time"] == pytest.approx(
        277 / 230 - 1
    )
    # medians of two pairs: saving (54.5% + 42.3%) / 2, extra time (25.0% + 20.4%) / 2
    assert "median memory saved 48%" in ckpt.evidence and "median extra time 23%" in ckpt.evidence
    l4 = checks["on a 24 GB card, DiT-L/4 with fp16 and checkpointing, batch 32"]
    assert l4.verdict == "held" and "6.00 GiB NVML device memory" in l4.evidence
    b8 = checks["12 GB: DiT-B/8 with fp16"]
    assert b8.verdict == "held" and b8.evidence.startswith("DiT-B/8 fp16 ckpt=none bs=64")
    assert "1 of 2 matching cell(s) fit 12 GiB" in b8.evidence
    xl = checks["48 GB and up: DiT-XL/2"]
    assert xl.verdict == "held" and "also fits smaller cards" in xl.evidence and "16.00 GiB" in xl.evidence


def test_advice_fails_with_the_numbers(tmp_path):
    checks = {c.claim: c for c in advice.advice_checks(frame(tmp_path, bad_advice_records()))}
    fp16 = checks["fp16 halves memory"]
    assert fp16.verdict == "not held" and "median ratio 0.80" in fp16.evidence
    ckpt = checks["gradient checkpointing saves about 50% memory for 20-30% more time"]
    assert ckpt.verdict == "not held"
    assert ckpt.numbers[0]["saving"] == pytest.approx(0.05) and ckpt.numbers[0][
        "extra_time"
    ] == pytest.approx(200 / 130 - 1)
    assert "saved less memory" in ckpt.evidence and "cost more time" in ckpt.evidence
    l4 = checks["on a 24 GB card, DiT-L/4 with fp16 and checkpointing, batch 32"]
    assert l4.verdict == "not held" and "oom" in l4.evidence  # out of memory under a 24 GB cap
    b8 = checks["12 GB: DiT-B/8 with fp16"]
    # emulated: peak reserved (13.5 x 1.04) + the measured 0.55 GiB context
    assert b8.verdict == "not held" and "14.59 GiB peak reserved + CUDA context" in b8.evidence
    assert checks["48 GB and up: DiT-XL/2"].verdict == "not measured"


def test_oom_under_a_smaller_cap_says_nothing_about_a_bigger_card(tmp_path):
    df = frame(tmp_path, [make_record("DiT-L/4", "fp16", "full", 32, "oom", gpu_memory_gib=16)])
    check = advice.check_24gb_l4(df)
    assert check.verdict == "not measured"


def test_advice_on_a_cpu_run_is_not_measured(tmp_path):
    records = make_matrix(
        models=("DiT-S/8",), precisions=("fp32", "bf16", "fp16"), batches=(2, 4), device="cpu", smoke_steps=20
    )
    df = frame(tmp_path, records)
    assert df["metrics.peak_mem_allocated_gib"].isna().all() and "metrics.mfu.value" not in df
    assert {c.verdict for c in advice.advice_checks(df)} == {"not measured"}


# ----------------------------------------------------------------------------------------- files


def test_report_files_and_contents(tmp_path):
    df = frame(tmp_path, good_advice_records())
    out = tmp_path / "report"
    written = write_report(df, out, sources=["runs/x/results.jsonl"])
    for name in ("report.md", "report.html", "results.csv", "throughput.png", "memory.png", "smoke_loss.png"):
        assert (out / name).is_file(), name
    assert set(written) == {"markdown", "html", "csv", "speed_memory", "throughput", "memory", "smoke_loss"}
    md = (out / "report.md").read_text()
    # environment
    assert "| gpu_name | NVIDIA H200 |" in md and "| torch | 2.14.1 |" in md
    # the per-model matrix: rows are configurations, columns batch sizes, cells say status
    assert "## DiT-L/4" in md
    assert "| configuration | bs 32 | bs 64 |" in md
    assert "| fp32 ckpt=none | 200.0 img/s · 20.00 GiB (baseline) | OOM |" in md
    assert "| fp16 ckpt=full | 400.0 img/s · 5.00 GiB |  |" in md
    # baseline comparison with the right numbers
    assert "2.50x, +45.0% memory saved" in md and "2.00x, +75.0% memory saved" in md
    # recommendation and the largest model
    # 500 images/s at batch 32 = 15.625 steps/s: 400,000 steps in 25,600 s = 7.1 h
    assert (
        "| DiT-L/4 | DiT-L/4 fp16 ckpt=none bs=32 | 500.0 "
        "| 7.1 h on 1 GPU (global batch 32, not the paper's 256) | 12.00 GiB (NVML device memory) |"
    ) in md
    assert "Largest model that fits on the NVIDIA H200 (139.8 GiB) it ran on: **DiT-XL/2**" in md
    # advice verdicts and the thresholds they used
    assert "| fp16 halves memory | held |" in md
    assert "| 48 GB and up: DiT-XL/2 | held |" in md
    assert "at most 60% of fp32's" in md and "at least 40%" in md and "at most 35% more time" in md
    # plots linked as files
    assert "[![Throughput against batch size](throughput.png)](throughput.png)" in md
    assert "## Speed against memory" in md and "(speed_memory.png)" in md
    html = (out / "report.html").read_text()
    assert html.count("<img ") == 4 and 'src="data:image/png;base64,' in html
    assert "http://" not in html and "https://" not in html  # self-contained
    for name in ("speed_memory.png", "throughput.png", "memory.png", "smoke_loss.png"):
        with Image.open(out / name) as img:
            assert img.format == "PNG" and img.width > 300 and img.height > 200


def test_csv_round_trips_through_pandas(tmp_path):
    records = good_advice_records()
    df = frame(tmp_path, records)
    write_report(df, tmp_path / "r")
    csv = pd.read_csv(tmp_path / "r" / "results.csv")
    assert list(csv["cell_id"]) == list(df["cell_id"])
    assert list(csv["status"]) == list(df["status"])
    assert list(csv["config.batch_size"]) == list(df["config.batch_size"])
    pd.testing.assert_series_equal(
        csv["metrics.images_per_s"], df["metrics.images_per_s"].astype(float), check_names=True
    )
    samples = json.loads(csv.loc[0, "metrics.step_ms.samples"])
    assert samples == records[0]["metrics"]["step_ms"]["samples"]
    assert csv.loc[1, "vs_baseline.speedup"] == pytest.approx(2.5)
    assert pd.to_datetime(csv["started_at"]).notna().all()


def test_report_of_a_cpu_run_with_nulls(tmp_path):
    records = make_matrix(
        models=("DiT-S/8",),
        precisions=("fp32", "bf16", "fp16"),
        batches=(2, 4),
        ckpts=("none", "full"),
        device="cpu",
        smoke_steps=20,
    )
    records.append(make_record("DiT-S/8", "fp32", "none", 8, "skipped", device="cpu", env=CPU_ENV))
    df = frame(tmp_path, records)
    write_report(df, tmp_path / "cpu")
    md = (tmp_path / "cpu" / "report.md").read_text()
    assert "unsupported" in md and "skipped" in md and "CPU allocator peak" in md
    assert "| gpu_name | — |" in md or "gpu_name" in md
    assert (tmp_path / "cpu" / "memory.png").exists()  # the CPU allocator's peak stands in for GPU memory


def test_plots_are_skipped_without_data(tmp_path):
    df = frame(tmp_path, [make_record("DiT-S/8", status="oom"), make_record("DiT-B/8", status="error")])
    assert render_plots(df) == {}
    write_report(df, tmp_path / "r")
    assert not (tmp_path / "r" / "throughput.png").exists()
    assert "nothing fits" in (tmp_path / "r" / "report.md").read_text()


@pytest.mark.slow
def test_report_cli(tmp_path):
    path = tmp_path / "results.jsonl"
    write_jsonl(path, good_advice_records())
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = tmp_path / "reports" / "x"
    proc = subprocess.run(
        [sys.executable, "-m", "ditbench", "report", str(path), "--out", str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "report of 9 cells" in proc.stdout and (out / "report.html").is_file()
    bad = subprocess.run(
        [sys.executable, "-m", "ditbench", "report", str(tmp_path / "nope.jsonl"), "--out", str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert bad.returncode == 2 and "does not exist" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.slow
def test_rewriting_a_report_leaves_no_temp_files(tmp_path):
    df = frame(tmp_path, good_advice_records())
    write_report(df, tmp_path / "r")
    write_report(df, tmp_path / "r")
    assert not [p for p in (tmp_path / "r").iterdir() if p.name.startswith(".")]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Image.open(io.BytesIO((tmp_path / "r" / "memory.png").read_bytes())).verify()


def test_oom_on_a_card_of_known_size_counts_against_smaller_budgets(tmp_path):
    env80 = dict(make_record("DiT-S/8")["env"], gpu_name="NVIDIA A100-SXM4-80GB", gpu_memory_gib=79.1)
    df = frame(tmp_path, [make_record("DiT-L/4", "fp16", "full", 32, "oom", env=env80)])
    check = advice.check_24gb_l4(df)
    assert check.verdict == "not held" and "oom" in check.evidence
    rec = analysis.recommend(frame(tmp_path, [make_record("DiT-S/8", env=env80)], "b.jsonl"))
    assert rec.per_model[0].budget == "the NVIDIA A100-SXM4-80GB (79.1 GiB) it ran on"


def test_empty_columns_are_left_out_of_a_model_table(tmp_path):
    records = make_matrix(
        models=("DiT-S/8",), precisions=("fp32",), batches=(2,), device="cpu", smoke_steps=0
    )
    write_report(frame(tmp_path, records), tmp_path / "r")
    md = (tmp_path / "r" / "report.md").read_text()
    assert "| MFU |" not in md and "| reserved |" not in md and "smoke loss" not in md


def test_lines_without_an_ok_cell_stay_out_of_the_legend(tmp_path):
    from ditbench.report.plots import throughput_figure

    records = make_matrix(models=("DiT-S/8",), precisions=("fp32", "fp16"), batches=(2, 4), device="cpu")
    fig = throughput_figure(frame(tmp_path, records))
    labels = [t.get_text() for t in fig.legends[0].get_texts()]  # one legend, below the panels
    assert labels == ["fp32 ckpt=none", "fp32 ckpt=full", "p10–p90 of step times"]


def test_multi_gpu_cells_show_their_scaling_efficiency(tmp_path):
    one = make_record("DiT-B/4", "bf16", "none", 32, images_per_s=1000.0, peak_alloc=10.0, gpus=1)
    two = make_record("DiT-B/4", "bf16", "none", 32, images_per_s=1800.0, peak_alloc=10.0, gpus=2)
    two["metrics"]["scaling_efficiency"] = 0.9
    df = frame(tmp_path, [one, two])
    write_report(df, tmp_path / "r")
    md = (tmp_path / "r" / "report.md").read_text()
    assert "scaling efficiency" in md
    assert "90.0%" in md


def test_single_gpu_reports_have_no_scaling_column(tmp_path):
    df = frame(tmp_path, [make_record("DiT-B/4", "bf16", "none", 32, images_per_s=1000.0, peak_alloc=10.0)])
    write_report(df, tmp_path / "r")
    assert "scaling efficiency" not in (tmp_path / "r" / "report.md").read_text()


# ------------------------------------------------------- injection into what people open (issue 21)


def _named(name: str, reason: str | None = None, **kw):
    record = make_record("DiT-S/8", **kw)
    record["cell_name"] = name
    if reason is not None:
        record.update(status="error", reason=reason, metrics=None)
    return record


def test_report_md_escapes_a_title_and_names_and_the_csv_writes_no_formula(tmp_path):
    import csv

    from ditbench.report.blocks import to_markdown
    from ditbench.report.render import build_report

    records = [
        _named('=HYPERLINK("http://x","click")'),
        _named("+cmd|' /C calc'!A0", batch_size=16),
        _named("@SUM(1+1)", reason="-2+3 <script>alert(1)</script>", batch_size=32),
    ]
    df = frame(tmp_path, records)
    title = "<img src=x onerror=alert(1)>\n# injected [link](javascript:alert(1))"
    write_report(df, tmp_path / "r", title=title)
    md = (tmp_path / "r" / "report.md").read_text()
    assert "<img" not in md and "<script" not in md and "\n# injected" not in md
    assert "](javascript:" not in md.replace("\\[link](javascript:", "")  # a link needs an unescaped [
    assert md.splitlines()[0].startswith("# &lt;img src=x onerror=alert(1)> # injected \\[link]")
    rows = list(csv.DictReader(io.StringIO((tmp_path / "r" / "results.csv").read_text())))
    names = {r["cell_name"] for r in rows}
    assert names == {'\'=HYPERLINK("http://x","click")', "'+cmd|' /C calc'!A0", "'@SUM(1+1)"}
    assert {r["reason"] for r in rows} >= {"'-2+3 <script>alert(1)</script>"}
    assert all(not v.startswith(("=", "+", "-", "@")) for r in rows for v in r.values() if v)
    blocks, _ = build_report(df, title)
    assert "<script" not in to_markdown(blocks)


def test_the_gate_summary_and_the_run_summary_escape_names(tmp_path, capsys, monkeypatch):
    from types import SimpleNamespace

    from ditbench.bench.summary import write_summary
    from ditbench.cli import main

    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    base = [_named("<b onmouseover=alert(1)>x</b> [a](http://e) | forged col")]
    write_jsonl(tmp_path / "b.jsonl", base)
    write_jsonl(tmp_path / "n.jsonl", base)
    main(
        ["compare", str(tmp_path / "b.jsonl"), str(tmp_path / "n.jsonl"), "--summary", str(tmp_path / "s.md")]
    )
    gate_md = (tmp_path / "s.md").read_text()
    assert "<b " not in gate_md and "\\[a](http" in gate_md and "\\| forged" in gate_md
    suite = SimpleNamespace(name="s", description="<iframe src=//evil>\n# pwned", overrides={})
    write_summary(tmp_path / "summary.md", suite, base)
    run_md = (tmp_path / "summary.md").read_text()
    assert "<iframe" not in run_md and "<b " not in run_md and "\n# pwned" not in run_md


# ------------------------------------------------------- numbers pandas and matplotlib cannot hold (issue 21)


def _report_exit(tmp_path, capsys, text: str, *extra: str) -> tuple[int, str]:
    from ditbench.cli import main

    (tmp_path / "r.jsonl").write_text(text)
    code = main(["report", str(tmp_path / "r.jsonl"), "--out", str(tmp_path / "o"), *extra])
    return code, " ".join(capsys.readouterr().err.split())


def test_infinity_in_a_memory_field_is_an_input_error_not_a_traceback(tmp_path, capsys):
    line = json.dumps(make_record("DiT-S/8")).replace(
        '"peak_mem_reserved_gib": ', '"peak_mem_reserved_gib": 1e999, "x": '
    )
    code, err = _report_exit(tmp_path, capsys, line.replace("1e999", "Infinity") + "\n")
    assert (
        code == 2 and "line 1, field metrics.peak_mem_reserved_gib: is inf" in err and "Traceback" not in err
    )


@pytest.mark.parametrize(
    "field, value, needle",
    [
        ("params", 2**63, "metrics.params: is an integer of 19 digits"),
        ("cpu_peak_rss_gib", -(2**80), "metrics.cpu_peak_rss_gib"),
    ],
)
def test_integers_beyond_64_bits_are_input_errors(tmp_path, capsys, field, value, needle):
    record = make_record("DiT-S/8")
    record["metrics"][field] = value
    code, err = _report_exit(tmp_path, capsys, json.dumps(record) + "\n")
    assert code == 2 and needle in err and "Traceback" not in err


def test_a_list_where_a_knobs_text_belongs_is_an_input_error(tmp_path, capsys):
    record = make_record("DiT-S/8")
    record["config"]["precision"] = ["fp32", "bf16"]
    code, err = _report_exit(tmp_path, capsys, json.dumps(record) + "\n")
    assert code == 2 and "field config.precision: unknown precision" in err and "Traceback" not in err


@pytest.mark.parametrize("value", ["9" * 400, "-" + "9" * 30])
def test_a_claim_value_of_hundreds_of_digits_is_an_input_error(tmp_path, capsys, value):
    claims = tmp_path / "c.yaml"
    claims.write_text(
        'claims:\n  - says: "x"\n    cell: {model: DiT-S/8}\n    metric: peak_memory_gib\n'
        f"    value: {value}\n    tolerance_pct: 25\n"
    )
    code, err = _report_exit(
        tmp_path, capsys, json.dumps(make_record("DiT-S/8")) + "\n", "--claims", str(claims)
    )
    assert code == 2 and "value" in err and "Traceback" not in err
