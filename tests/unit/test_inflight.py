"""In-flight results: appended once, adopted after a kill at any moment, never twice; old temp dirs swept."""

import json
import os
import warnings

import pytest
from synthetic_records import cell_config

from ditbench.bench import inflight
from ditbench.bench.launch.files import write_result
from ditbench.records.jsonl import read_records

OK = {
    "status": "ok",
    "reason": None,
    "metrics": {"images_per_s": 10.0, "step_ms": {"median": 100.0, "p10": 90.0, "p90": 110.0}},
    "smoke": None,
    "env": {"host": "cell-host"},
    "quality": {"fid": 12.5},  # a key the record does not place itself is carried over
}


def context(cell_id="c0ffee000001", run_id="20260101T000000Z-aaaaaa", **kw):
    return {
        "suite": "t",
        "run_id": run_id,
        "cell_id": cell_id,
        "cell_name": f"cell {cell_id}",
        "suite_baseline": {},
        "suite_overrides": {},
        "config": cell_config(device="cpu"),
        "env": {"host": "runner-host"},
        "started_at": "2026-01-01T00:00:00Z",
        **kw,
    }


def finished_ticket(folder, result=OK, **kw):
    ticket = inflight.open_ticket(folder, context(**kw))
    write_result(ticket.result_path, result)
    return ticket


def test_commit_appends_the_record_and_then_removes_the_tickets_files(tmp_path):
    folder, results = tmp_path / ".inflight", tmp_path / "results.jsonl"
    ticket = finished_ticket(folder)
    (folder / f"{ticket.key}.result.ranks").mkdir()  # a multi-process cell's reports and torchrun logs
    (folder / f"{ticket.key}.result.ranks" / "rank0.json").write_text("{}")
    record = inflight.commit(results, ticket, 1.5)
    assert record["status"] == "ok" and record["duration_s"] == 1.5 and record["quality"] == {"fid": 12.5}
    assert record["env"] == {"host": "cell-host"} and "adopted_by" not in record
    assert read_records(results) == [record]
    assert list(folder.iterdir()) == []


def test_a_result_left_by_a_killed_run_is_adopted_once(tmp_path):
    folder, results = tmp_path / ".inflight", tmp_path / "results.jsonl"
    finished_ticket(folder, cell_id="c0ffee000001")
    cut_off = inflight.open_ticket(folder, context(cell_id="c0ffee000002"))  # killed while running
    (folder / f"{cut_off.key}.spec.json").write_text("{}")
    (folder / ".x.result.json.abc.tmp").write_text("half")  # an atomic write cut short
    adopted = inflight.adopt(results, folder, "20260102T000000Z-bbbbbb")
    assert [r["cell_id"] for r in adopted] == ["c0ffee000001"]
    assert adopted[0]["adopted_by"] == "20260102T000000Z-bbbbbb"
    assert adopted[0]["run_id"] == "20260101T000000Z-aaaaaa"  # the run that measured it
    assert read_records(results) == adopted
    assert list(folder.iterdir()) == []  # everything else of the killed run is gone
    assert inflight.adopt(results, folder, "r3") == []


def test_a_kill_between_the_append_and_the_clean_up_appends_nothing_twice(tmp_path):
    folder, results = tmp_path / ".inflight", tmp_path / "results.jsonl"
    ticket = finished_ticket(folder)
    record = inflight.make_record(ticket.read_context(), OK, 1.0)
    inflight.append_record(results, record)  # appended; the kill came before the files were removed
    assert inflight.adopt(results, folder, "r2") == []
    assert len(read_records(results)) == 1 and list(folder.iterdir()) == []


def test_an_appended_line_that_is_not_a_valid_record_still_counts_as_appended(tmp_path):
    folder, results = tmp_path / ".inflight", tmp_path / "results.jsonl"
    bad = dict(OK, metrics={"images_per_s": float("nan"), "step_ms": {"median": 1.0}})
    ticket = finished_ticket(folder, result=bad)
    inflight.append_record(results, inflight.make_record(ticket.read_context(), bad, 1.0))
    with pytest.warns(UserWarning):
        assert read_records(results) == []  # an ok record without a finite images/s is skipped by readers
    assert inflight.adopt(results, folder, "r2") == []
    assert results.read_text().count("\n") == 1


def test_garbage_tickets_and_results_are_removed_or_adopted_never_raised(tmp_path):
    folder, results = tmp_path / ".inflight", tmp_path / "results.jsonl"
    folder.mkdir()
    (folder / "a.ticket.json").write_bytes(b"\xff\xfe not json")
    (folder / "b.ticket.json").write_text('{"suite": "t"}')  # incomplete
    (folder / "c.ticket.json").write_text("[" * 20000 + "]" * 20000)
    ticket = inflight.open_ticket(folder, context())
    ticket.result_path.write_text('"a string, not a result"')
    odd = inflight.open_ticket(folder, context(cell_id="c0ffee000002"))  # a hand-edited start time
    odd.ticket_path.write_text(json.dumps(dict(context(cell_id="c0ffee000002"), started_unix="noon")))
    write_result(odd.result_path, OK)
    with pytest.warns(UserWarning, match="unreadable ticket"):
        (adopted,) = inflight.adopt(results, folder, "r2")
    assert adopted["cell_id"] == "c0ffee000002" and adopted["duration_s"] == 0.0
    assert list(folder.iterdir()) == []


def test_commit_records_an_unreadable_result_as_an_error(tmp_path):
    folder, results = tmp_path / ".inflight", tmp_path / "results.jsonl"
    ticket = inflight.open_ticket(folder, context())
    ticket.result_path.write_bytes(b"\xff\x00")
    record = inflight.commit(results, ticket, 0.5)
    assert record["status"] == "error" and "result file is not UTF-8" in record["reason"], record


def test_ticket_keys_name_the_cell_and_the_run(tmp_path):
    ticket = inflight.open_ticket(tmp_path, context())
    assert ticket.key == "c0ffee000001.20260101T000000Z-aaaaaa"
    assert json.loads(ticket.ticket_path.read_text())["started_unix"] > 0
    with pytest.raises(ValueError, match="config"):
        inflight.open_ticket(tmp_path, {k: v for k, v in context().items() if k != "config"})


# ------------------------------------------------------------------- links in .inflight (issue 21)


def test_adopt_refuses_a_linked_folder_and_empties_nothing(tmp_path):
    from ditbench.core.errors import UserError

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.txt").write_text("keep me")
    (outside / "x.ticket.json").write_text("{}")  # would be read as an unreadable ticket and removed
    link = tmp_path / "out" / inflight.INFLIGHT_DIR
    link.parent.mkdir()
    link.symlink_to(outside)
    with pytest.raises(UserError, match="symbolic link"):
        inflight.adopt(tmp_path / "out" / "results.jsonl", link, "run")
    assert sorted(p.name for p in outside.iterdir()) == ["precious.txt", "x.ticket.json"]


def test_open_ticket_refuses_a_linked_folder(tmp_path):
    from ditbench.core.errors import UserError

    outside = tmp_path / "outside"
    outside.mkdir()
    link = tmp_path / inflight.INFLIGHT_DIR
    link.symlink_to(outside)
    with pytest.raises(UserError, match="symbolic link"):
        inflight.open_ticket(link, context())
    assert list(outside.iterdir()) == []


def test_a_ticket_removes_a_link_among_its_files_but_not_what_it_names(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.txt").write_text("keep me")
    folder = tmp_path / inflight.INFLIGHT_DIR
    ticket = inflight.open_ticket(folder, context())
    (folder / f"{ticket.key}.result.ranks").symlink_to(outside)
    ticket.remove()
    assert not os.path.lexists(folder / f"{ticket.key}.result.ranks")
    assert (outside / "precious.txt").read_text() == "keep me"


# ------------------------------------------- broken tickets: set aside, never fatal (issue 34, class 5)


BROKEN = {
    "not JSON": b"\xff\xfe{",
    "a list": b"[1, 2]",
    "a string naming every key": json.dumps(" ".join(context())).encode(),
    "a number": b"7",
    "run_id a list": json.dumps(context(run_id=["a"])).encode(),
    "cell_id null": json.dumps(context(cell_id=None)).encode(),
    "no config": json.dumps({k: v for k, v in context().items() if k != "config"}).encode(),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_a_broken_ticket_is_moved_aside_with_a_warning_and_never_stops_a_run(case, tmp_path):
    out = tmp_path / "out"
    folder = out / inflight.INFLIGHT_DIR
    folder.mkdir(parents=True)
    (folder / "k.r.ticket.json").write_bytes(BROKEN[case])
    (folder / "k.r.result.json").write_text(json.dumps(OK))
    good = inflight.open_ticket(folder, context(cell_id="c0ffee000002", run_id="r2"))
    write_result(good.result_path, OK)
    with pytest.warns(UserWarning, match=r"k\.r\.ticket\.json: an unreadable ticket .*moved to"):
        adopted = inflight.adopt(out / "results.jsonl", folder, "run3")
    assert [r["cell_id"] for r in adopted] == ["c0ffee000002"]  # the good one is still adopted
    assert list(folder.iterdir()) == []
    aside = sorted(p.name for p in (out / inflight.BROKEN_DIR).iterdir())
    assert aside == ["run3.k.r.result.json", "run3.k.r.ticket.json"]
    assert (out / inflight.BROKEN_DIR / "run3.k.r.ticket.json").read_bytes() == BROKEN[case]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a later run finds nothing to warn about
        assert inflight.adopt(out / "results.jsonl", folder, "run4") == []


def test_a_ticket_whose_record_would_be_invalid_is_moved_aside_not_appended(tmp_path):
    folder, results = tmp_path / inflight.INFLIGHT_DIR, tmp_path / "results.jsonl"
    ticket = inflight.open_ticket(folder, context())
    write_result(ticket.result_path, {"status": "ok", "metrics": None})
    with pytest.warns(UserWarning, match="its record would be invalid"):
        assert inflight.adopt(results, folder, "run2") == []
    assert not results.exists() and len(list((tmp_path / inflight.BROKEN_DIR).iterdir())) == 2
