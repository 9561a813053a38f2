"""Issue 34, class 6: malformed values deep in records. A wrong type anywhere in a record's metrics,
smoke, env or quality field is refused where the record is read (records.model): `report`, `export`
and `compare` exit 2 naming the file, line and key path; `plan --results/--calibrate` and a resumed
run skip the line with a warning naming it; `ab` refuses a side whose result is not a record. Never
a traceback."""

from __future__ import annotations

import copy
import json
import re
import shutil
from pathlib import Path

import pytest
from synthetic_records import CPU_ENV, make_record, write_jsonl

from ditbench.cli import main

ROOT = Path(__file__).resolve().parents[2]


def _set(path: str, value):
    def change(record):
        *parents, last = path.split(".")
        node = record
        for p in parents:
            node = node[int(p)] if p.isdigit() else node[p]
        node[int(last) if last.isdigit() else last] = value

    return change


# (change, the key path the message names); quality cases edit the committed CPU quality run
CASES = {
    "quality.evaluations a string": (_set("quality.evaluations", "x"), "quality.evaluations"),
    "quality fid a string": (
        _set("quality.evaluations.1.metrics.fid", "low"),
        "quality.evaluations[1].metrics.fid",
    ),
    "quality grid a number": (_set("quality.evaluations.0.grid", 5), "quality.evaluations[0].grid"),
    "quality step text": (_set("quality.evaluations.0.step", "0"), "quality.evaluations[0].step"),
    "quality train_loss text": (_set("quality.train_loss", "x"), "quality.train_loss"),
    "quality interval text": (
        _set("quality.evaluations.0.interval", {"fid": "x"}),
        "quality.evaluations[0].interval.fid",
    ),
    "quality sampler text": (_set("quality.sampler", "ddim"), "quality.sampler"),
    "quality official text": (_set("quality.inception.official", "yes"), "quality.inception.official"),
    "step_ms a string": (_set("metrics.step_ms", "fast"), "metrics.step_ms"),
    "step sample a string": (_set("metrics.step_ms.samples.3", "x"), "metrics.step_ms.samples[3]"),
    "mfu a number": (_set("metrics.mfu", 0.5), "metrics.mfu"),
    "peak memory text": (_set("metrics.peak_mem_allocated_gib", "12"), "metrics.peak_mem_allocated_gib"),
    "emulation text": (_set("metrics.emulation", "x"), "metrics.emulation"),
    "repeats text": (_set("metrics.repeats", "x"), "metrics.repeats"),
    "params text": (_set("metrics.params", "big"), "metrics.params"),
    "smoke loss text": (_set("smoke.loss", "x"), "smoke.loss"),
    "smoke steps text": (_set("smoke.steps", "x"), "smoke.steps"),
    "gpu_name a list": (_set("env.gpu_name", ["H200"]), "env.gpu_name"),
    "gpu_count text": (_set("env.gpu_count", "one"), "env.gpu_count"),
    "gpu memory text": (_set("env.gpu_memory_gib", "80"), "env.gpu_memory_gib"),
    "torch a number": (_set("env.torch", 2), "env.torch"),
}
QUALITY_RUN = ROOT / "reports" / "cpu_quality"


def _bad_run(tmp_path: Path, case: str) -> tuple[Path, dict]:
    """A run folder whose results.jsonl holds one record broken as `case` says (line 1)."""
    change, _ = CASES[case]
    run = tmp_path / "run"
    if case.startswith("quality"):
        shutil.copytree(QUALITY_RUN, run)
        record = json.loads((run / "results.jsonl").read_text())
    else:
        run.mkdir()
        record = make_record(smoke_steps=20)
    good = copy.deepcopy(record)
    change(record)
    write_jsonl(run / "results.jsonl", [record])
    return run / "results.jsonl", good


def _clean_exit_2(code: int, err: str, *needles: str) -> None:
    text = " ".join(err.split())
    assert code == 2 and "Traceback" not in err and text.startswith("ditbench: error: "), err
    for needle in needles:
        assert needle in text, (needle, text)


@pytest.mark.parametrize("case", sorted(CASES))
def test_report_refuses_naming_file_line_and_key(tmp_path, capsys, case):
    path, _ = _bad_run(tmp_path, case)
    code = main(["report", str(path), "--out", str(tmp_path / "report")])
    _clean_exit_2(
        code, capsys.readouterr().err, f"{path} line 1", CASES[case][1], "not a valid result record"
    )
    assert not (tmp_path / "report").exists()


@pytest.mark.parametrize("case", sorted(CASES))
def test_export_refuses_naming_file_line_and_key(tmp_path, capsys, case):
    pytest.importorskip("tensorboard")
    path, _ = _bad_run(tmp_path, case)
    code = main(["export", str(path), "--no-report", "--to", "tensorboard", str(tmp_path / "tb")])
    _clean_exit_2(code, capsys.readouterr().err, f"{path} line 1", CASES[case][1])
    assert not (tmp_path / "tb").exists() or not any((tmp_path / "tb").iterdir())


@pytest.mark.parametrize("case", sorted(CASES))
def test_compare_refuses_naming_the_side_file_line_cell_and_key(tmp_path, capsys, monkeypatch, case):
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    path, good = _bad_run(tmp_path, case)
    base = tmp_path / "base.jsonl"
    write_jsonl(base, [good])
    code = main(["compare", str(base), str(path)])
    out, err = capsys.readouterr()
    _clean_exit_2(code, err, f"NEW {path} line 1", f"cell `{good['cell_name']}`", CASES[case][1])
    assert "no regression" not in out


@pytest.mark.parametrize(
    "case", ["gpu_name a list", "peak memory text", "mfu a number", "quality fid a string"]
)
def test_plan_skips_a_malformed_record_with_a_note_naming_its_line_and_key(tmp_path, capsys, case):
    path, good = _bad_run(tmp_path, case)
    cpu = make_record(device="cpu", env=CPU_ENV)  # a record that calibrates nothing: no GPU of the table
    write_jsonl(path, [json.loads(path.read_text()), cpu])
    with pytest.warns(UserWarning, match=f"skipped 1 line .*line 1: {re.escape(CASES[case][1])}"):
        code = main(["plan", "--calibrate", str(path), "--card", "A100"])
    _clean_exit_2(code, capsys.readouterr().err, "no record can calibrate", "record 1: not run on a GPU")
    write_jsonl(path, [json.loads(path.read_text().splitlines()[0])])
    with pytest.warns(UserWarning, match="skipped 1 line"):
        code = main(["plan", "--calibrate", str(path), "--card", "A100"])
    _clean_exit_2(code, capsys.readouterr().err, f"--calibrate {path}: no result records in it")
