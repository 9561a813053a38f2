"""`run --label`: a report of several runs (`--keep all`) has one row per label, not per start minute."""

from __future__ import annotations

from synthetic_records import make_record, write_jsonl

from ditbench.report import analysis
from ditbench.report.blocks import Table
from ditbench.report.load import load_results
from ditbench.report.sections import model_section


def _runs(label_a, label_b):
    records = []
    for run_id, label, hour, speed in (("run-a", label_a, 10, 100.0), ("run-b", label_b, 12, 120.0)):
        for minute, bs in ((0, 8), (7, 16)):  # the run's two cells start minutes apart
            record = make_record(
                "DiT-S/8",
                "fp32",
                "none",
                bs,
                images_per_s=speed * bs / 8,
                run_id=run_id,
                started_at=f"2026-11-29T{hour}:{minute:02d}:00Z",
            )
            if label:
                record["label"] = label
            records.append(record)
    return records


def _grid(tmp_path, records):
    write_jsonl(tmp_path / "results.jsonl", records)
    df = load_results(tmp_path / "results.jsonl", keep="all")
    blocks = model_section(df, df, analysis.baseline_comparison(df), "DiT-S/8", 1000)
    table = next(b for b in blocks if isinstance(b, Table))
    return {row[0]: row[1:] for row in table.rows}


def test_labelled_runs_give_one_row_per_label(tmp_path):
    grid = _grid(tmp_path, _runs("before-fix", "after-fix"))
    assert sorted(grid) == ["· run after-fix", "· run before-fix"]
    assert [c.split(" img/s")[0] for c in grid["· run before-fix"]] == ["100.0", "200.0"]
    assert [c.split(" img/s")[0] for c in grid["· run after-fix"]] == ["120.0", "240.0"]


def test_unlabelled_runs_give_one_row_per_run_not_per_start_minute(tmp_path):
    grid = _grid(tmp_path, _runs(None, None))
    assert sorted(grid) == ["· run run-a", "· run run-b"]
    assert [c.split(" img/s")[0] for c in grid["· run run-a"]] == ["100.0", "200.0"]
    assert [c.split(" img/s")[0] for c in grid["· run run-b"]] == ["120.0", "240.0"]
