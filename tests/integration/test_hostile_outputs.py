"""Issue 34, classes 1, 2 and 5: what is already at an output path is never replaced, followed or changed.

Every command's output option (compare --summary and $GITHUB_STEP_SUMMARY, fid --out, train --save,
sample --out, extract-latents --out, report --out's files, run --out's files) is given a path that
holds a FIFO, a socket, a folder, a device (a copy of /dev/full, as root), a link to a file, or a
link to nowhere: the command ends in one paragraph naming the path (exit 2) before any work, the
thing at the path is still what it was, and a link's target is untouched. Files ditbench changes in
place (results.jsonl, the lock, a cell log, the step summary) with a second hard link are refused the
same way, and the other name's file keeps its bytes; a file ditbench replaces whole may have one (the
rename leaves the other name alone). A FIFO where a run reads its own state (an .inflight ticket or
its result) is refused without blocking, and the folder's lock is free afterwards.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from synthetic_records import make_record, write_jsonl
from test_hostile_inputs import suite

from ditbench.bench import inflight
from ditbench.cli import main
from ditbench.files.outlock import OutputLock

KINDS = ("fifo", "socket", "folder", "device", "link", "dangling")


pytestmark = pytest.mark.usefixtures("no_hang")


def plant(path: Path, kind: str) -> Path:
    """Make `kind` at `path`; a link points at a file holding `keep me` (or at nothing)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        os.mknod(path, 0o600 | stat.S_IFSOCK)
    elif kind == "folder":
        path.mkdir()
    elif kind == "device":  # the node /dev/full is: writes fail with ENOSPC; replacing it would be fatal
        try:
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 7))
        except PermissionError:
            pytest.skip("making a device node needs root (CAP_MKNOD)")
    elif kind == "link":
        target = path.parent / f"target-of-{path.name}"
        target.write_text("keep me")
        path.symlink_to(target)
    else:
        path.symlink_to(path.parent / "nowhere")
    return path


def snapshot(path: Path) -> tuple:
    """What is at `path` (not following a link), and a link's target's bytes."""
    st = os.lstat(path)
    target = None
    if stat.S_ISLNK(st.st_mode):
        resolved = Path(os.path.realpath(path))
        target = (os.readlink(path), resolved.read_bytes() if resolved.is_file() else None)
    return stat.S_IFMT(st.st_mode), st.st_ino, target


def _records(tmp: Path) -> tuple[str, str]:
    write_jsonl(tmp / "base.jsonl", [make_record(sample_seed=1)])
    write_jsonl(tmp / "new.jsonl", [make_record(sample_seed=2)])
    return str(tmp / "base.jsonl"), str(tmp / "new.jsonl")


def _images(tmp: Path) -> str:
    (tmp / "imgs" / "cat").mkdir(parents=True)
    Image.fromarray(np.zeros((40, 40, 3), np.uint8)).save(tmp / "imgs" / "cat" / "a.png")
    return str(tmp / "imgs")


TRAIN = ["--model", "DiT-T/8", "--image-size", "64", "--batch-size", "1", "--device", "cpu"]
# name -> (the output path under tmp, the command line given tmp and that path)
COMMANDS = {
    "compare --summary": ("s.md", lambda t, p: ["compare", *_records(t), "--summary", str(p)]),
    "fid --out": (
        "m.json",
        lambda t, p: ["fid", "--samples", _records(t)[0], "--ref", _records(t)[1], "--out", str(p)],
    ),
    "train --save": ("c.pt", lambda t, p: ["train", *TRAIN, "--steps", "1", "--save", str(p)]),
    "sample --out": (
        "s.npz",
        lambda t, p: ["sample", "random", "--vae", "random", "--out", str(p), "--device", "cpu", *TRAIN[:4]],
    ),
    "extract-latents --out": (
        "lat.npz",
        lambda t, p: ["extract-latents", _images(t), "--vae", "random", "--out", str(p), "--device", "cpu"],
    ),
    "report --out's report.md": (
        "r/report.md",
        lambda t, p: ["report", _records(t)[1], "--out", str(p.parent)],
    ),
    "report --out's results.csv": (
        "r/results.csv",
        lambda t, p: ["report", _records(t)[1], "--out", str(p.parent)],
    ),
    "run --out's summary.md": ("o/summary.md", lambda t, p: ["run", str(suite(t)), "--out", str(p.parent)]),
    "run --out's results.jsonl": (
        "o/results.jsonl",
        lambda t, p: ["run", str(suite(t)), "--out", str(p.parent)],
    ),
    "run --out's lock": ("o/.ditbench.lock", lambda t, p: ["run", str(suite(t)), "--out", str(p.parent)]),
    "run --out's cell log": (
        "o/logs/x.log",
        lambda t, p: ["run", str(suite(t)), "--out", str(p.parent.parent)],
    ),
}
CASES = [(c, k) for c in COMMANDS for k in KINDS if not (k == "folder" and c.startswith("run --out's lock"))]


def assert_clean(code: int, err: str, *needles: str) -> None:
    assert code == 2, err
    assert err.startswith("ditbench: error: ") and "Traceback" not in err and "\n\n" not in err.strip(), err
    flat = " ".join(err.split())
    for needle in needles:
        assert needle in flat, (needle, flat)


@pytest.mark.parametrize(("command", "kind"), CASES)
def test_an_output_path_holding_anything_but_a_regular_file_is_refused_and_left_as_it_was(
    command, kind, tmp_path, capsys, monkeypatch
):
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    name, argv = COMMANDS[command]
    path = plant(tmp_path / name, kind)
    before = snapshot(path)
    code = main(argv(tmp_path, path))
    err = capsys.readouterr().err
    assert_clean(code, err, path.name)
    assert snapshot(path) == before  # not replaced by a file, its link's target not written
    if kind == "device":
        assert "a device" in " ".join(err.split())


@pytest.mark.parametrize("kind", KINDS)
def test_a_step_summary_that_is_not_a_regular_file_is_refused_before_any_work(
    kind, tmp_path, capsys, monkeypatch
):
    path = plant(tmp_path / "step_summary", kind)
    before = snapshot(path)
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(path))
    code = main(["compare", *_records(tmp_path), "--json"])
    out = capsys.readouterr()
    assert_clean(code, out.err, "$GITHUB_STEP_SUMMARY", "step_summary")
    assert out.out == "" and snapshot(path) == before


def test_dev_null_as_the_step_summary_writes_no_summary(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", os.devnull)
    assert main(["compare", *_records(tmp_path)]) == 0
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)


# ------------------------------------------------------------------------------- hard links (class 2)


def linked(tmp: Path, name: str) -> tuple[Path, bytes]:
    """`name` under tmp as a second hard link to an outside file whose last line is torn (what the
    results file's tail repair would cut)."""
    outside = tmp / "outside.txt"
    data = b'{"keep": 1}\n{"torn'
    outside.write_bytes(data)
    path = tmp / name
    path.parent.mkdir(parents=True, exist_ok=True)
    os.link(outside, path)
    return outside, data


@pytest.mark.parametrize("name", ["o/results.jsonl", "o/.ditbench.lock", "o/logs/x.log", "o/summary.md"])
def test_a_hard_link_among_the_files_a_run_keeps_is_refused_and_the_other_file_kept(name, tmp_path, capsys):
    outside, data = linked(tmp_path, name)
    code = main(["run", str(suite(tmp_path)), "--out", str(tmp_path / "o"), "--no-progress"])
    assert_clean(code, capsys.readouterr().err, Path(name).name, "2 hard links")
    assert outside.read_bytes() == data and os.stat(outside).st_nlink == 2


def test_a_hard_linked_step_summary_is_refused_and_its_other_name_kept(tmp_path, capsys, monkeypatch):
    outside, data = linked(tmp_path, "step_summary")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tmp_path / "step_summary"))
    assert_clean(main(["compare", *_records(tmp_path)]), capsys.readouterr().err, "hard links")
    assert outside.read_bytes() == data


def test_a_replaced_output_may_have_a_hard_link_whose_file_keeps_its_bytes(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tmp_path / "step.md"))
    outside, data = linked(tmp_path, "s.md")
    assert main(["compare", *_records(tmp_path), "--summary", str(tmp_path / "s.md")]) == 0
    summary = (tmp_path / "s.md").read_text()
    assert "ditbench compare" in summary and outside.read_bytes() == data  # renamed over: one name moved
    assert (tmp_path / "step.md").read_text() == summary + "\n"  # appended: a regular file of its own


def test_a_planted_hard_link_between_the_check_and_the_open_is_refused_on_the_descriptor(tmp_path):
    from ditbench.core.errors import UserError
    from ditbench.files.fileio import open_log
    from ditbench.records.jsonl import append_record

    outside, data = linked(tmp_path, "results.jsonl")
    with pytest.raises(UserError, match="2 hard links"):
        append_record(tmp_path / "results.jsonl", make_record())
    os.link(outside, tmp_path / "cell.log")
    with pytest.raises(UserError, match="2 hard links|3 hard links"):
        open_log(tmp_path / "cell.log")
    assert outside.read_bytes() == data


@pytest.mark.parametrize("name", ["x.ticket.json", "result"])
def test_a_fifo_in_inflight_is_refused_quickly_and_the_lock_is_free_afterwards(name, tmp_path, capsys):
    out = tmp_path / "o"
    folder = out / inflight.INFLIGHT_DIR
    if name == "result":  # a ticket whose result file is a FIFO
        name = inflight.open_ticket(folder, {"run_id": "r", "cell_id": "c", **TICKET}).result_path.name
    else:
        folder.mkdir(parents=True)
    os.mkfifo(folder / name)
    code = main(["run", str(suite(tmp_path)), "--out", str(out), "--no-progress"])
    assert_clean(code, capsys.readouterr().err, name, "FIFO")
    with OutputLock(out, "a later run") as lock:  # released when the refusal ended the run
        assert lock.stale is None


TICKET = dict.fromkeys(
    ("suite", "cell_name", "suite_baseline", "suite_overrides", "config", "started_at"), "x"
)
