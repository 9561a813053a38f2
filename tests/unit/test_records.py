"""results.jsonl: no finished record is ever lost, garbage lines are skipped (never raised on), and the
writer never raises on a value a cell produced."""

from __future__ import annotations

import json
import textwrap
import warnings

import numpy as np
import pytest
import torch
from synthetic_records import make_record

from ditbench.records.jsonl import (
    MAX_DEPTH,
    MAX_LISTED,
    append_record,
    json_safe,
    latest_by_cell,
    read_records,
)
from ditbench.records.model import Record, check


def line(record) -> bytes:
    return (json.dumps(record) + "\n").encode()


def ok(batch_size=8, **kw):
    return make_record("DiT-S/8", batch_size=batch_size, n_samples=5, **kw)


def read_quietly(path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails the test
        return read_records(path)


# ------------------------------------------------------------------------------------ the last line


def test_a_complete_last_record_without_newline_is_kept_on_the_next_append(tmp_path):
    path = tmp_path / "results.jsonl"
    a, b, c = ok(1), ok(2), ok(4)
    path.write_bytes(line(a) + line(b).rstrip(b"\n"))  # b lost only its newline
    assert [r["cell_id"] for r in read_quietly(path)] == [a["cell_id"], b["cell_id"]]
    append_record(path, c)
    assert path.read_bytes().count(b"\n") == 3
    assert [r["cell_id"] for r in read_quietly(path)] == [a["cell_id"], b["cell_id"], c["cell_id"]]


def test_a_torn_tail_is_ignored_and_cut_before_the_next_append(tmp_path):
    path = tmp_path / "results.jsonl"
    a, b, d = ok(1), ok(2), ok(4)
    append_record(path, a)
    append_record(path, b)
    with open(path, "ab") as f:
        f.write(b'{"cell_id": "c", "stat')  # a writer killed mid-line
    assert [r["cell_id"] for r in read_quietly(path)] == [a["cell_id"], b["cell_id"]]  # no warning
    append_record(path, d)
    assert path.read_bytes().count(b"\n") == 3
    assert [r["cell_id"] for r in read_quietly(path)] == [a["cell_id"], b["cell_id"], d["cell_id"]]
    assert latest_by_cell(read_quietly(path))[d["cell_id"]]["status"] == "ok"


# ------------------------------------------------------------------------------------ garbage lines

REAL = ok(16)
GARBAGE = {
    "binary": b"\xff\xfe\x00garbage\x80\x81",
    "not json": b"{not json",
    "cell_id list": line(dict(REAL, cell_id=[1, 2])),
    "no cell_name": line({"cell_id": REAL["cell_id"], "status": "ok"}),
    "deep": b"[" * 20_000 + b"]" * 20_000,
    "deep object": b'{"a":' * 20_000 + b"1" + b"}" * 20_000,
    "parseable but deep": line(dict(REAL, metrics=json.loads("[" * (MAX_DEPTH + 5) + "]" * (MAX_DEPTH + 5)))),
    "huge int": b'{"schema": "ditbench.result/1", "cell_id": ' + b"1" * 5000 + b"}",
    "list": b"[1, 2, 3]",
    "string": b'"ok"',
    "unknown status": line(dict(REAL, status="fast")),
    "status list": line(dict(REAL, status=["ok"])),
    "metrics string": line(dict(REAL, metrics="fast")),
    "ok without metrics": line(dict(REAL, metrics=None)),
    "nan images_per_s": line(REAL).replace(str(REAL["metrics"]["images_per_s"]).encode(), b"NaN", 1),
    "config list": line(dict(REAL, config=[1])),
    "empty cell_id": line(dict(REAL, cell_id="")),
    "other schema": line(dict(REAL, schema="other/1")),
    "env string": line(dict(REAL, env="H200")),
    "smoke mean string": line(dict(REAL, smoke={"first_mean": "x", "last_mean": 0.2})),
    "reason object": line(dict(REAL, status="error", metrics=None, reason={"x": 1})),
}


@pytest.mark.parametrize("kind", sorted(GARBAGE))
def test_a_garbage_line_is_skipped_with_one_warning_naming_it(tmp_path, kind):
    path = tmp_path / "results.jsonl"
    a, b = ok(1), ok(2)
    garbage = GARBAGE[kind].rstrip(b"\n")
    path.write_bytes(line(a) + garbage + b"\n" + line(b))
    with pytest.warns(UserWarning) as caught:
        records = read_records(path)
    assert [r["cell_id"] for r in records] == [a["cell_id"], b["cell_id"]]
    assert len(caught) == 1
    message = str(caught[0].message)
    assert "skipped 1 line" in message and "line 2:" in message and str(path) in message


def test_every_garbage_line_is_named_in_one_warning(tmp_path):
    path = tmp_path / "results.jsonl"
    good = ok(1)
    path.write_bytes(line(good) + b"".join(g.rstrip(b"\n") + b"\n" for g in GARBAGE.values()))
    with pytest.warns(UserWarning) as caught:
        records = read_records(path)
    assert [r["cell_id"] for r in records] == [good["cell_id"]]
    assert len(caught) == 1
    n = len(GARBAGE)
    message = str(caught[0].message)
    assert f"skipped {n} lines" in message and "lines 2, 3, 4" in message and "more" in message
    assert latest_by_cell(records) == {good["cell_id"]: Record.model_validate(good)}
    append_record(path, ok(2))  # garbage stays; the file still takes appends
    with pytest.warns(UserWarning):
        assert len(read_records(path)) == 2


def test_latest_by_cell_keeps_the_last_record_of_each_cell():
    a, b, again = (Record.model_validate(r) for r in (ok(1), ok(2), ok(1, run_id="again")))
    assert latest_by_cell([a, b, again]) == {a.cell_id: again, b.cell_id: b}


@pytest.mark.parametrize(
    "change, needle",
    [
        ({"cell_name": None}, "cell_name"),
        ({"status": "OK"}, "status"),
        ({"quality": []}, "quality"),
        ({"metrics": {"images_per_s": 1.0, "step_ms": {"median": float("inf")}}}, "step_ms.median"),
        ({"metrics": {"images_per_s": 1.0, "step_ms": {"median": 2.0, "p10": "x"}}}, "p10"),
    ],
)
def test_record_problem_names_the_field(change, needle):
    assert problem(ok()) is None
    assert problem(dict(ok(), **change)) is not None and needle in problem(dict(ok(), **change))


def problem(raw):
    """Why `raw` is not a finished record (the model's check, then the measurement's), or None."""
    record, why = check(raw)
    return why or record.unfinished()


def test_failed_records_need_no_metrics():
    failed = make_record("DiT-S/8", status="error")
    assert failed["metrics"] is None and problem(failed) is None


# ------------------------------------------------------------------------------------------ writer


class Opaque:
    pass


def test_the_writer_turns_values_json_cannot_hold_into_null_and_says_why(tmp_path):
    path = tmp_path / "results.jsonl"
    record = ok()
    record["metrics"]["images_per_s"] = float("nan")
    record["metrics"]["peak_mem_allocated_gib"] = float("inf")
    record["metrics"]["step_ms"]["samples"][1] = -float("inf")
    record["metrics"]["params"] = np.int64(33_150_000)
    record["metrics"]["tflops_per_s"] = np.float32(1.5)
    record["metrics"]["loss_last"] = torch.tensor(0.25)
    record["metrics"]["handle"] = Opaque()
    record["metrics"]["array"] = np.zeros(3)
    record["metrics"]["by_rank"] = {7: "int key"}
    record["metrics"]["energy_j"] = 10**5000  # json.dumps alone would raise on it
    written = append_record(path, record)
    (text,) = path.read_text().splitlines()
    back = json.loads(text)  # plain JSON: no NaN, no Infinity
    assert "NaN" not in text and "Infinity" not in text
    assert back == written.dump()
    assert back["metrics"]["images_per_s"] is None and back["metrics"]["peak_mem_allocated_gib"] is None
    assert back["metrics"]["step_ms"]["samples"][1] is None
    assert back["nonfinite"] == [
        "metrics.images_per_s",
        "metrics.step_ms.samples[1]",
        "metrics.peak_mem_allocated_gib",
    ]
    assert back["unserializable"] == {
        "metrics.handle": "Opaque",
        "metrics.array": "ndarray",
        "metrics.energy_j": "integer too large",
    }
    assert back["metrics"]["energy_j"] is None
    assert back["metrics"]["params"] == 33_150_000 and back["metrics"]["tflops_per_s"] == 1.5
    assert back["metrics"]["loss_last"] == 0.25 and back["metrics"]["by_rank"] == {"7": "int key"}
    assert record["metrics"]["handle"] is not None  # the caller's record is not changed
    with pytest.warns(UserWarning, match="images_per_s"):  # an ok record without its measurement
        assert read_records(path) == []
    assert path.read_text() == text + "\n"  # ... stays in the file


def test_a_clean_record_is_written_unchanged(tmp_path):
    record = ok()
    assert json_safe(record) == record and "nonfinite" not in json_safe(record)


def test_the_writer_bounds_what_it_lists_and_how_deep_it_goes():
    record = ok()
    record["smoke"] = {"loss": [float("nan")] * 5000}
    deep: dict = {}
    node = deep
    for _ in range(MAX_DEPTH + 10):
        node["x"] = {}
        node = node["x"]
    record["metrics"]["deep"] = deep
    loop: dict = {}
    loop["self"] = loop  # a cycle: json.dumps would raise "Circular reference detected"
    record["metrics"]["loop"] = loop
    record["metrics"]["tags"] = {"a", "b"}
    safe = json_safe(record)
    assert safe["unserializable"]["metrics.tags"] == "set"
    assert any(v == "nested too deep" for v in safe["unserializable"].values())
    assert len(safe["nonfinite"]) <= MAX_LISTED + 1 and safe["nonfinite"][-1].startswith("... and ")
    assert safe["smoke"]["loss"] == [None] * 5000
    json.dumps(safe, allow_nan=False)  # writable


# ------------------------------------------------------------------------------------ the runner


def test_a_resume_file_full_of_garbage_still_gives_records_and_a_summary(tmp_path):
    from ditbench.bench.runner import RunOptions, run_suite
    from ditbench.spec.suite import load_suite

    suite_file = tmp_path / "t.yaml"
    suite_file.write_text(
        textwrap.dedent(
            """
            name: t
            device: cpu
            defaults: {model: DiT-T/8, image_size: 64, steps: {warmup: 1, measure: 2, min_seconds: 0}}
            matrix: {precision: [fp16], batch_size: [1, 2]}
            """
        )
    )
    suite = load_suite(suite_file)
    out = tmp_path / "out"
    out.mkdir()
    first, second = suite.cells
    # What a hand edit or another tool could leave: the exact lines, and every garbage kind.
    garbage = [
        json.dumps({"cell_id": first.cell_id, "status": "ok"}).encode(),
        json.dumps({"schema": "ditbench.result/1", "cell_id": [1, 2], "status": "ok"}).encode(),
    ] + [g.rstrip(b"\n") for g in GARBAGE.values()]
    kept = dict(make_record("DiT-T/8", status="unsupported"), cell_id="not-in-this-suite")
    (out / "results.jsonl").write_bytes(b"\n".join(garbage) + b"\n" + json.dumps(kept).encode())
    lines: list[str] = []
    with pytest.warns(UserWarning, match="not valid result records"):
        records = run_suite(suite, RunOptions(out=out, progress=False), echo=lines.append)
    assert [r["cell_id"] for r in records] == [first.cell_id, second.cell_id]
    assert {r["status"] for r in records} == {"unsupported"}  # fp16 on a CPU: recorded, not run
    summary = (out / "summary.md").read_text()
    assert first.cell_name in summary and second.cell_name in summary
    data = (out / "results.jsonl").read_bytes()
    assert data.startswith(b"\n".join(garbage))  # nothing the user had was removed
    with pytest.warns(UserWarning):
        ids = [r["cell_id"] for r in read_records(out / "results.jsonl")]
    assert ids == ["not-in-this-suite", first.cell_id, second.cell_id]  # the unterminated record survived


# ------------------------------------------------------------------- a link as results.jsonl (issue 21)


def test_append_refuses_a_link_and_leaves_its_torn_target_whole(tmp_path):
    from ditbench.core.errors import UserError

    outside = tmp_path / "outside.jsonl"
    outside.write_bytes(b'{"keep": 1}\n{"torn')  # the tail repair would cut this line
    (tmp_path / "results.jsonl").symlink_to(outside)
    with pytest.raises(UserError, match="symbolic link"):
        append_record(tmp_path / "results.jsonl", make_record())
    assert outside.read_bytes() == b'{"keep": 1}\n{"torn'


def test_append_refuses_a_dangling_link_and_creates_nothing_at_its_target(tmp_path):
    from ditbench.core.errors import UserError

    (tmp_path / "results.jsonl").symlink_to(tmp_path / "elsewhere.jsonl")
    with pytest.raises(UserError, match="symbolic link"):
        append_record(tmp_path / "results.jsonl", make_record())
    assert not (tmp_path / "elsewhere.jsonl").exists()
