"""The planner against the H200 anchors, from a cold cache, in the official step's order.

The anchors (benchmarks/h200_official_dit_anchor.jsonl) measured the official facebookresearch/DiT
train.py, which zeroes the gradients after the forward: they are predicted with `zero_grad:
after_forward`. A change to the step or the planner that moves these predictions off the
measurements fails here, before a committed table (reports/plan_vs_h200/) can go stale; and the
three ways to ask (the CLI on a one-cell suite, `predict_cell`, a warm cache) must agree.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ditbench.cli import main

ROOT = Path(__file__).resolve().parents[2]
ANCHORS = ROOT / "benchmarks" / "h200_official_dit_anchor.jsonl"
TABLE = ROOT / "reports" / "plan_vs_h200" / "rows.json"  # the committed table
REGENERATE = "python benchmarks/plan_vs_h200.py --report reports/plan_vs_h200"
# Cheap anchor cells (model, precision, batch): no checkpointing, eager, torch's default foreach AdamW.
CELLS = [("DiT-B/8", "fp32", 32), ("DiT-B/4", "bf16", 64), ("DiT-S/2", "bf16", 64)]
OFFICIAL = {"zero_grad": "after_forward", "optimizer_impl": "foreach", "grad_ckpt": "none"}


def measured(model: str, precision: str, batch: int) -> float:
    """The anchor file's peak allocated GiB of the official step's eager cell."""
    for line in ANCHORS.read_text().splitlines():
        row = json.loads(line)
        if (
            row.get("kind") == "dit_train"
            and row.get("impl") == "official"
            and (row["model"], row["precision"], row["batch"]) == (model, precision, batch)
            and not row["ckpt"]
            and not row["compile"]
        ):
            return row["peak_alloc_gib"]
    raise AssertionError(f"no anchor for {model} {precision} b{batch}")


def committed(model: str, precision: str, batch: int) -> float:
    """The committed table's prediction for the cell."""
    for row in json.loads(TABLE.read_text())["anchors"]:
        if (row["model"], row["precision"], row["batch_size"], row["grad_ckpt"], row["compile"]) == (
            model, precision, batch, "none", False
        ) and row["optimizer_impl"] == "foreach":  # fmt: skip
            return row["predicted_alloc_gib"]
    raise AssertionError(f"{TABLE} has no row for {model} {precision} b{batch}; regenerate: {REGENERATE}")


def within_target(predicted: float, truth: float) -> bool:
    return abs(predicted - truth) <= max(0.10 * truth, 0.5)


@pytest.fixture
def cold(monkeypatch, tmp_path):
    """No trace in this process's memory, an empty cache on disk."""
    from ditbench.plan import predict

    monkeypatch.setenv("DITBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(predict, "_CACHE", type(predict._CACHE)())
    return predict


def config(model: str, precision: str, batch: int) -> dict:
    return {"model": model, "precision": precision, "batch_size": batch, **OFFICIAL}


@pytest.mark.slow
@pytest.mark.parametrize("model, precision, batch", CELLS)
def test_anchor_cells_are_predicted_within_target_from_a_cold_cache(cold, model, precision, batch):
    pred = cold.predict_cell(config(model, precision, batch), "H200")
    truth = measured(model, precision, batch)
    assert pred.status == "fits"
    assert within_target(pred.peak_allocated_gib, truth), (pred.peak_allocated_gib, truth)
    # The committed table still describes the code (it is printed to 0.01 GiB).
    assert abs(pred.peak_allocated_gib - committed(model, precision, batch)) < 0.005, (
        f"reports/plan_vs_h200 is stale for {model} {precision} b{batch}; regenerate: {REGENERATE}"
    )


def _cli(capsys, suite: Path) -> float:
    code = main(["plan", str(suite), "--card", "H200", "--json", "--no-tree"])
    out, _ = capsys.readouterr()
    assert code == 0
    (cell,) = json.loads(out)["cells"]
    return cell["peak_allocated_gib"]


@pytest.mark.slow
def test_the_cli_predict_cell_and_a_warm_cache_give_the_same_number(cold, capsys, tmp_path):
    model, precision, batch = CELLS[0]
    suite = tmp_path / "one.yaml"
    knobs = ", ".join(f"{k}: [{v}]" for k, v in config(model, precision, batch).items())
    suite.write_text(f"name: one\nmatrix: {{{knobs}}}\n")
    direct = cold.predict_cell(config(model, precision, batch), "H200").peak_allocated_gib
    cold._CACHE.clear()
    from_cli = _cli(capsys, suite)  # traces afresh and writes the disk cache
    assert len(list((tmp_path / "cache" / "plan").glob("*.json"))) == 1
    cold._CACHE.clear()
    from_disk = _cli(capsys, suite)  # read back from the disk cache
    warm = cold.predict_cell(config(model, precision, batch), "H200").peak_allocated_gib  # in memory
    assert from_cli == direct == from_disk == warm
    assert within_target(direct, measured(model, precision, batch))
