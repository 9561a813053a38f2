"""What the report's tables read as, seen in screenshots of the committed reports.

Rows that say "not measured" read once per reason: unsupported or skipped cells sharing a reason
are one row naming them in the per-model table, and unmeasured advice or claims sharing a reason are
one row; measured rows and rows with their own reason stay as they were. A memory saving that rounds
to nothing reads +0.0%, not -0.0%. A CPU recommendation shows the memory the tables show (no GPU
figure exists), and an empty column is left out."""

from __future__ import annotations

from synthetic_records import CPU_ENV, make_matrix, make_record, write_jsonl

from ditbench.core.units import memory_text
from ditbench.report.load import load_results
from ditbench.report.render import write_report
from ditbench.report.sections import collapse_unmeasured


def test_collapse_unmeasured_joins_names_per_reason_in_first_place():
    rows = [
        ("held", "r0", ["a", "held", "r0"], "a"),
        ("not measured", "no such cell", ["b", "not measured", "no such cell"], "b"),
        ("not measured", "no GPU", ["c", "not measured", "no GPU"], "c"),
        ("not measured", "no such cell", ["d", "not measured", "no such cell"], "d"),
        ("not held", "no such cell", ["e", "not held", "no such cell"], "e"),
    ]
    assert collapse_unmeasured(rows) == [
        ("held", ["a", "held", "r0"], 1),
        ("not measured", ["b; d", "not measured", "no such cell"], 2),
        ("not measured", ["c", "not measured", "no GPU"], 1),
        ("not held", ["e", "not held", "no such cell"], 1),
    ]


def test_unsupported_cells_with_one_reason_are_one_row(tmp_path):
    records = make_matrix(models=("DiT-S/8",), precisions=("fp32", "fp16"), batches=(2, 4), device="cpu")
    records.append(
        make_record(
            "DiT-S/8", "bf16", "none", 2, "skipped", env=CPU_ENV, device="cpu", reason="a reason of its own"
        )
    )
    write_jsonl(tmp_path / "results.jsonl", records)
    out = write_report(load_results(tmp_path / "results.jsonl"), tmp_path / "report")
    md = out["markdown"].read_text()
    fp16 = [r for r in records if r["status"] == "unsupported"]
    assert len(fp16) == 4 and len({r["reason"] for r in fp16}) == 1
    every_cell = md.split("### DiT-S/8: every cell")[1]
    lines = [line for line in every_cell.splitlines() if fp16[0]["reason"] in line]
    assert len(lines) == 1
    assert lines[0].startswith("| 4 cells: fp16 ckpt=none bs=2, fp16 ckpt=none bs=4, fp16 ckpt=full bs=2, ")
    (skipped,) = [line for line in every_cell.splitlines() if "a reason of its own" in line]
    assert skipped.startswith("| DiT-S/8 bf16 ckpt=none bs=2 | skipped |")
    ok_rows = [line for line in every_cell.splitlines() if "| ok |" in line or "| ok (noisy) |" in line]
    assert len(ok_rows) == sum(r["status"] == "ok" for r in records)


def test_a_saving_that_rounds_to_nothing_reads_plus_zero():
    from ditbench.report.blocks import saved_text

    assert [saved_text(x) for x in (-0.04, -0.0, 0.04, -0.06, 19.26, None)] == [
        "+0.0%", "+0.0%", "+0.0%", "-0.1%", "+19.3%", "—",
    ]  # fmt: skip


def test_a_cpu_recommendation_shows_the_tables_memory_and_no_empty_column(tmp_path):
    records = make_matrix(models=("DiT-S/8",), precisions=("fp32",), batches=(2, 4), device="cpu")
    write_jsonl(tmp_path / "results.jsonl", records)
    md = write_report(load_results(tmp_path / "results.jsonl"), tmp_path / "report")["markdown"].read_text()
    table = md.split("Fastest configuration that fits")[1].split("Largest model")[0]
    assert "| model | fastest cell that fits | images/s | time to 400K steps | memory |\n" in table
    fastest = max(records, key=lambda r: r["metrics"]["images_per_s"])
    memory = memory_text(fastest["metrics"]["cpu_peak_alloc_gib"])  # MiB below 1 GiB (core/units.py)
    assert memory.endswith(" MiB")
    assert f"| {fastest['cell_name']} |" in table and f"| {memory} (CPU allocator peak) |" in table
