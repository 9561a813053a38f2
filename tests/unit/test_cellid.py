"""Cell ids: stable when knobs are added, and the records of ditbench 0.1.0 still recognised on resume."""

import json
import shutil
from pathlib import Path

from ditbench.bench.cellid import legacy_cell_id, record_ids
from ditbench.bench.runner import RunOptions, run_suite
from ditbench.bench.suite import load_suite

OLD = Path(__file__).parents[1] / "data" / "cpu_smoke_v0_1_0"  # suites/cpu_smoke.yaml and its results, v0.1.0


def _old_records():
    return [json.loads(line) for line in (OLD / "results.jsonl").read_text().splitlines()]


def test_legacy_ids_reproduce_the_old_ids_and_new_ids_differ():
    suite = load_suite(OLD / "suite.yaml")
    old = {r["cell_id"] for r in _old_records()}
    assert len(old) == len(suite.cells) == 24
    assert {c.legacy_id for c in suite.cells} == old
    assert not old & {c.cell_id for c in suite.cells}  # the new ids hash only non-defaults
    assert all(legacy_cell_id(c.spec) == c.legacy_id for c in suite.cells)


def test_a_new_record_answers_to_its_old_id_too():
    cell = load_suite(OLD / "suite.yaml").cells[0]
    record = {"cell_id": cell.cell_id, "config": cell.config}
    assert record_ids(record) == (cell.cell_id, cell.legacy_id)
    assert record_ids({"cell_id": "abc", "config": {"gpu_memory_gb": None}}) == ("abc",)
    assert record_ids({"cell_id": ["x"]}) == ()


def test_resume_over_an_old_results_file_recognises_its_finished_cells(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    shutil.copy(OLD / "results.jsonl", out / "results.jsonl")
    before = (out / "results.jsonl").read_bytes()
    lines: list[str] = []
    records = run_suite(
        load_suite(OLD / "suite.yaml"), RunOptions(out=out, progress=False), echo=lines.append
    )
    assert lines == ["resuming " + str(out) + ": 16 of 24 cells already ok, 8 unsupported here, 0 to run"]
    assert (out / "results.jsonl").read_bytes() == before  # nothing ran, nothing was appended
    assert [r["cell_id"] for r in records] == [r["cell_id"] for r in _old_records()]
    assert "| DiT-T/4 fp32 ckpt=none bs=4 | ok |" in (out / "summary.md").read_text()
