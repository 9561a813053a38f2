"""Issue 34, class 3: `ditbench export` builds no path from a record that leaves its root.

A run folder's name holds the record's run_id and cell id as single safe components (a `/`, `..`, a
NUL or a lone surrogate become `_` and a hash, so two ids never share a folder); a sample grid is read
only when its path, resolved with links followed, stays inside the run's folder, else it is left out
with a note (never copied from outside into a tracker). `export RUN_DIR` (the folder, not its
results.jsonl) keeps the grids. Names a tracker refuses (MLflow: letters, digits, `_-. :/`) are left
out with a note instead of failing the export.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from synthetic_records import make_record, write_jsonl

from ditbench.cli import main
from ditbench.core.errors import UserError
from ditbench.export.runs import tracker_runs
from ditbench.files.outpaths import inside, safe_component
from ditbench.records.model import Record
from ditbench.report.load import load_results

ROOT = Path(__file__).resolve().parents[2]
HOSTILE_IDS = ["../../escape", "/etc/cron.d/x", "a/b", "a_b", "..", ".", "", "a\x00b", "\ud800", "x" * 500]


def test_a_safe_component_is_one_name_and_two_ids_never_share_one():
    names = [safe_component(i) for i in HOSTILE_IDS]
    for name in names:
        assert name and name not in (".", "..") and "/" not in name and "\0" not in name
        name.encode("ascii")  # nothing a file system or a tracker could refuse
        assert len(name) <= 90
    assert len(set(names)) == len(names)
    assert safe_component("20260101T000000Z-aaaaaa") == "20260101T000000Z-aaaaaa"  # ordinary ids as they are


def test_inside_resolves_and_refuses_what_leaves_the_root(tmp_path):
    root = tmp_path / "run"
    (root / "grids").mkdir(parents=True)
    (tmp_path / "outside.png").write_bytes(b"x")
    (root / "grids" / "link.png").symlink_to(tmp_path / "outside.png")
    assert inside(root, "grids/a.png") == (root / "grids" / "a.png").resolve()
    for bad in [
        "../outside.png",
        str(tmp_path / "outside.png"),
        "grids/link.png",
        "a\x00b",
        "\ud800",
        None,
        3,
    ]:
        assert inside(root, bad) is None, bad


def test_run_folders_from_hostile_run_ids_stay_single_distinct_names():
    records = [make_record(run_id=run_id) for run_id in HOSTILE_IDS]
    from ditbench.export.runs import tracker_run

    keys = [tracker_run(Record.model_validate(r), "/x/results.jsonl:1").key for r in records]
    assert len(set(keys)) == len(keys)
    for key in keys:
        assert "/" not in key and "\0" not in key and key not in (".", "..")
        key.encode("ascii")


@pytest.fixture
def quality_run(tmp_path) -> Path:
    """The committed CPU quality run, copied: its records name grids relative to their folder."""
    shutil.copytree(ROOT / "reports/cpu_quality", tmp_path / "run")
    return tmp_path / "run"


def _rewrite_grids(run: Path, grids: list) -> None:
    records = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]
    evaluations = records[0]["quality"]["evaluations"]
    for evaluation, grid in zip(evaluations, grids, strict=False):
        evaluation["grid"] = grid
    (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_grids_outside_the_run_are_left_out_with_a_note_and_never_read(quality_run, tmp_path):
    secret = tmp_path / "secret.png"
    shutil.copy(next((quality_run / "grids").rglob("*.png")), secret)
    (quality_run / "grids" / "out.png").symlink_to(secret)
    _rewrite_grids(quality_run, [str(secret), "../secret.png"])  # the third grid stays as it is
    records = [json.loads(line) for line in (quality_run / "results.jsonl").read_text().splitlines()]
    second = dict(records[0], run_id="again")
    second["quality"] = json.loads(json.dumps(records[0]["quality"]))
    second["quality"]["evaluations"][0]["grid"] = "grids/out.png"
    with (quality_run / "results.jsonl").open("a") as f:
        f.write(json.dumps(second) + "\n")
    runs = tracker_runs(load_results([quality_run / "results.jsonl"], keep="all"))
    images = [path for run in runs for _, _, path in run.images]
    assert images and all(p.resolve().is_relative_to(quality_run.resolve()) for p in images)
    assert secret not in images and not any(p.name in ("secret.png", "out.png") for p in images)
    notes = [n for run in runs for n in run.notes]
    assert len(notes) == 4 and all("is not a file inside the run's folder" in n for n in notes), notes


def test_grid_paths_with_a_nul_or_a_surrogate_are_notes_not_tracebacks(quality_run):
    _rewrite_grids(quality_run, ["grids/a\x00.png", "grids/\ud800.png"])
    runs = tracker_runs(load_results([quality_run / "results.jsonl"]))
    notes = [n for run in runs for n in run.notes]
    assert len(notes) == 2
    for note in notes:
        note.encode("utf-8")  # printable as it is


def test_export_of_the_run_folder_keeps_its_grids(quality_run):
    by_file = tracker_runs(load_results([quality_run / "results.jsonl"]))
    by_folder = tracker_runs(load_results([quality_run]))
    assert [len(r.images) for r in by_folder] == [len(r.images) for r in by_file]
    assert sum(len(r.images) for r in by_folder) > 0


def test_names_a_tracker_refuses_are_left_out_with_a_note():
    record = make_record()
    record["metrics"]["we ird key!"] = 1.0
    record["metrics"]["../up"] = 2.0
    (run,) = tracker_runs(_frame([record]))
    assert not any("ird" in k or "up" in k.split("/") for k in run.metrics)
    assert any("2 metrics left out" in n for n in run.notes)
    record["metrics"]["we\ud800ird key!"] = 1.0  # a key that is not text: the record is refused, named
    with pytest.raises(UserError, match=r"line 1 \(cell .* is not a valid result record: metrics has a key"):
        _frame([record])


def _frame(records):
    import tempfile

    path = Path(tempfile.mkdtemp()) / "results.jsonl"
    write_jsonl(path, records)
    return load_results([path])


def test_export_to_tensorboard_writes_nothing_outside_its_target(tmp_path, capsys):
    pytest.importorskip("tensorboard")
    records = [make_record(run_id=run_id, sample_seed=i) for i, run_id in enumerate(HOSTILE_IDS[:4])]
    records += [make_record(batch_size=16, run_id="a\x00b\ud800")]
    (tmp_path / "r").mkdir()
    write_jsonl(tmp_path / "r" / "results.jsonl", records)
    before = sorted(p for p in tmp_path.rglob("*"))
    code = main(["export", str(tmp_path / "r"), "--keep", "all", "--to", "tensorboard", str(tmp_path / "tb")])
    assert code == 0, capsys.readouterr().err
    made = sorted(set(tmp_path.rglob("*")) - set(before))
    assert made and all(p.is_relative_to(tmp_path / "tb") for p in made)
    folders = [p for p in (tmp_path / "tb").iterdir()]
    assert len(folders) == len(records) + 1  # and the report's
    assert all(p.is_dir() and not p.is_symlink() for p in folders)


def test_a_link_planted_as_a_run_folder_is_refused(tmp_path, capsys):
    pytest.importorskip("tensorboard")
    write_jsonl(tmp_path / "results.jsonl", [make_record()])
    (run,) = tracker_runs(load_results([tmp_path / "results.jsonl"]))
    (tmp_path / "tb").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "tb" / run.key).symlink_to(tmp_path / "elsewhere")
    code = main(
        [
            "export",
            str(tmp_path / "results.jsonl"),
            "--no-report",
            "--to",
            "tensorboard",
            str(tmp_path / "tb"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "symbolic link" in " ".join(err.split()) and "Traceback" not in err
    assert list((tmp_path / "elsewhere").iterdir()) == []
