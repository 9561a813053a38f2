"""Issue 34, class 7: no input makes ditbench decode or compute without bound.

Every image is opened through imageload: its size read from the header and refused beyond the cap
of its use (a sample grid: 4,096 x 4,096) before any pixel is decoded; $DITBENCH_MAX_IMAGE_PIXELS
raises it (a bad value is one paragraph, exit 2); PIL's DecompressionBombError and its warning are
one message naming the file. A grid too large for the report or the export is left out with a
warning or a note, never a traceback. compare thins a side of more than timing.MAX_SAMPLES per-step
times to that many, evenly spaced and deterministically, and says so beside the p-value.
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
from images import png_header_only
from PIL import Image
from synthetic_records import make_record, write_jsonl

from ditbench.cli import main
from ditbench.core.errors import UserError
from ditbench.files.imageload import GRID_PIXELS, PIXELS_ENV, load_rgb, open_image

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def quality_run(tmp_path) -> Path:
    shutil.copytree(ROOT / "reports/cpu_quality", tmp_path / "run")
    return tmp_path / "run"


def _first_grid(run: Path) -> Path:
    record = json.loads((run / "results.jsonl").read_text().splitlines()[0])
    return run / record["quality"]["evaluations"][0]["grid"]


def test_a_grid_over_its_cap_is_refused_from_its_header(tmp_path, monkeypatch):
    monkeypatch.delenv(PIXELS_ENV, raising=False)
    path = png_header_only(tmp_path / "g.png", 6000, 6000)
    with pytest.raises(UserError, match=r"6,000 x 6,000 pixels, more than 16,777,216.*a sample grid"):
        load_rgb(path, GRID_PIXELS, "a sample grid")
    Image.fromarray(np.zeros((30, 40, 3), np.uint8)).save(tmp_path / "ok.png")
    assert load_rgb(tmp_path / "ok.png", GRID_PIXELS, "a sample grid").size == (40, 30)
    monkeypatch.setenv(PIXELS_ENV, "1000")  # raisable, and lowerable
    with pytest.raises(UserError, match=r"more than 1,000.*DITBENCH_MAX_IMAGE_PIXELS"):
        load_rgb(tmp_path / "ok.png", GRID_PIXELS, "a sample grid")


@pytest.mark.parametrize("value", ["lots", "-5", "0", "1e9"])
def test_a_bad_pixel_cap_is_one_paragraph_naming_it(value, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(PIXELS_ENV, value)
    folder = tmp_path / "imgs"
    folder.mkdir()
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(folder / "a.png")
    assert main(["fid", "--samples", str(folder), "--ref", str(folder)]) == 2
    err = capsys.readouterr().err
    assert "$DITBENCH_MAX_IMAGE_PIXELS" in err and "Traceback" not in err


def test_pils_bomb_warning_and_error_are_one_message(tmp_path, monkeypatch):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", Image.MAX_IMAGE_PIXELS)  # a raised cap raises PIL's too
    monkeypatch.setenv(PIXELS_ENV, "200000000")  # above PIL's warning (89 Mpx), below its error (179 Mpx)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a DecompressionBombWarning would be raised here
        with pytest.raises(UserError, match="not a readable image"):  # decoded: truncated, no bomb
            load_rgb(png_header_only(tmp_path / "w.png", 10_000, 10_000))
    monkeypatch.delenv(PIXELS_ENV)
    with pytest.raises(UserError, match="declares more pixels than an image decoder should allocate"):
        with open_image(png_header_only(tmp_path / "b.png", 100_000, 100_000), GRID_PIXELS, "a grid"):
            pass


def test_the_report_leaves_out_a_grid_over_its_cap_with_a_warning(quality_run, tmp_path, monkeypatch):
    monkeypatch.delenv(PIXELS_ENV, raising=False)
    png_header_only(_first_grid(quality_run), 6000, 6000)  # 2.7 GB to draw, were it decoded
    with pytest.warns(
        UserWarning, match=r"step0000000.png declares 6,000 x 6,000 pixels, more than 16,777,216"
    ):
        assert main(["report", str(quality_run), "--out", str(tmp_path / "o")]) == 0
    assert (tmp_path / "o" / "report.md").is_file()


def test_the_export_leaves_out_a_bomb_grid_with_a_note(quality_run, monkeypatch):
    from ditbench.export.runs import tracker_runs
    from ditbench.report.load import load_results

    monkeypatch.delenv(PIXELS_ENV, raising=False)
    png_header_only(_first_grid(quality_run), 100_000, 100_000)
    (run,) = tracker_runs(load_results([quality_run]))
    assert len(run.images) == 2  # of 3: the bomb is not among them
    assert any("step0000000.png declares more pixels" in n for n in run.notes), run.notes


def test_export_cli_with_a_bomb_grid_ends_cleanly(quality_run, tmp_path, capsys, monkeypatch):
    pytest.importorskip("tensorboard")
    monkeypatch.delenv(PIXELS_ENV, raising=False)
    png_header_only(_first_grid(quality_run), 100_000, 100_000)
    argv = ["export", str(quality_run), "--no-report", "--to", "tensorboard", str(tmp_path / "tb")]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "ditbench: note:" in err and "step0000000.png" in err and "Traceback" not in err


# --------------------------------------------------------------------- compare: samples per cell


def test_compare_thins_a_long_window_evenly_and_says_so(tmp_path, capsys, monkeypatch):
    from ditbench.report.gate.timing import MAX_SAMPLES, _evenly

    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    kept = _evenly(list(range(12_000)))
    assert len(kept) == MAX_SAMPLES and kept[0] == 0 and kept[-1] == 11_999 and kept == sorted(set(kept))
    base = [make_record(sample_seed=1, n_samples=12_000)]
    new = [make_record(sample_seed=2, n_samples=12_000, images_per_s=300.0)]
    write_jsonl(tmp_path / "b.jsonl", base)
    write_jsonl(tmp_path / "n.jsonl", new)
    argv = ["compare", str(tmp_path / "b.jsonl"), str(tmp_path / "n.jsonl")]
    outputs = []
    for extra in ([], [], ["--json"]):
        assert main([*argv, *extra]) == 1
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1]  # deterministic
    assert f"{MAX_SAMPLES:,}/{MAX_SAMPLES:,} of 12,000/12,000 steps, evenly spaced" in outputs[0]
    assert "evenly spaced" in outputs[2]
