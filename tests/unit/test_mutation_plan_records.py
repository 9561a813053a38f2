"""Measured records overriding predictions, pinned by value (issue 27, mutation testing of
ditbench/plan/measured.py): which lines are records, which record matches which cell, and
what a measured peak or a measured out-of-memory makes of the prediction, each figure worked out here.
"""

from __future__ import annotations

import json

import pytest
from synthetic_records import make_record

from ditbench.cli.plan import _read_results
from ditbench.plan import measured as mr
from ditbench.plan.predict import Prediction, normalize
from ditbench.records.model import Record

CELL = {"model": "DiT-S/2", "precision": "bf16", "batch_size": 32}


def _pred(memory=24.0, context=0.5, **config):
    cfg = normalize({**CELL, **config})
    return Prediction("DiT-S/2", "bf16", "none", cfg["batch_size"], "cuda", "L4", memory, "fits",
                      peak_allocated_gib=1.0, device_gib=2.0, components={"weights": 0.2, "context": context},
                      config=cfg)  # fmt: skip


def _record(status="ok", metrics=None, env=None, **config):
    raw = make_record(status=status, **{**CELL, **config})
    raw.update(metrics=metrics or {}, env=env or {})
    return Record.model_validate(raw)


def test_the_plan_reads_records_through_the_one_reader_and_skips_what_is_not_one(tmp_path):
    good, oom = make_record(**CELL), make_record(status="oom", **CELL)
    lines = [json.dumps(good).encode(), b"\xff\xfe", b"not json", b"[1, 2]",
             json.dumps({"status": "ok"}).encode(), json.dumps({**good, "config": "DiT-S/2"}).encode(),
             json.dumps(oom).encode()]  # fmt: skip
    path = tmp_path / "results.jsonl"
    path.write_bytes(b"\n".join(lines))
    with pytest.warns(UserWarning, match="skipped 5 lines"):
        assert _read_results(path) == [Record.model_validate(r) for r in (good, oom)]


def test_numbers_are_finite_non_negative_and_not_booleans():
    assert mr._number(0) == 0.0 and isinstance(mr._number(3), float) and mr._number(2.5) == 2.5
    for bad in (True, False, "1", None, float("nan"), -0.5, [1]):
        assert mr._number(bad) is None


def test_a_record_matches_on_every_memory_shaping_knob():
    assert mr._key({"model": "nope"}) is None
    key = mr._key(CELL)
    cell = normalize(CELL)
    assert key == tuple(repr(cell.get(k)) for k in mr._KEYS)
    assert mr._KEYS == ("model", "impl", "image_size", "precision", "grad_ckpt", "batch_size", "compile",
                        "optimizer_impl", "num_classes", "device", "gpus", "nodes")  # fmt: skip
    assert mr._key({**CELL, "seed": 7}) == key  # the seed shapes no memory
    assert mr._key({**CELL, "batch_size": 16}) != key


def test_a_finished_run_replaces_the_peaks_and_decides_the_fit():
    env = {"gpu_name": "NVIDIA L4"}
    pred = _pred()
    metrics = {"peak_mem_allocated_gib": 10.0, "peak_mem_reserved_gib": 12.0, "device_mem_gib": 13.0}
    assert mr._override(pred, _record(metrics=metrics, env=env))
    assert (pred.peak_allocated_gib, pred.peak_reserved_gib, pred.device_gib) == (10.0, 12.0, 13.0)
    assert (pred.components, pred.measured, pred.status) == ({}, True, "fits")
    assert pred.reason == "measured on NVIDIA L4"
    # No NVML figure: reserved + the predicted context, 23.5 + 0.5 = 24.0 <= 24: fits, at the limit.
    pred = _pred()
    mr._override(pred, _record(metrics={"peak_mem_allocated_gib": 20.0, "peak_mem_reserved_gib": 23.5}))
    assert (pred.device_gib, pred.status, pred.reason) == (24.0, "fits", "measured on the measuring machine")
    pred = _pred()
    mr._override(pred, _record(metrics={"peak_mem_allocated_gib": 20.0, "peak_mem_reserved_gib": 23.75}))
    assert (pred.device_gib, pred.status) == (24.25, "oom")
    # Neither: the allocated peak + the context, 23.5 + 0.5 = 24 fits; 23.75 + 0.5 does not.
    pred = _pred()
    mr._override(pred, _record(metrics={"peak_mem_allocated_gib": 23.5}))
    assert (pred.device_gib, pred.peak_reserved_gib, pred.status) == (None, None, "fits")
    pred = _pred()
    mr._override(pred, _record(metrics={"peak_mem_allocated_gib": 23.75}))
    assert pred.status == "oom"
    # No card in the plan: the run is simply measured; no context predicted: none is added.
    pred = _pred(memory=None)
    mr._override(pred, _record(metrics={"peak_mem_allocated_gib": 5.0}))
    assert pred.status == "ok"
    pred = _pred(memory=24.0)
    pred.components = {}
    mr._override(pred, _record(metrics={"peak_mem_allocated_gib": 5.0, "peak_mem_reserved_gib": 6.0}))
    assert pred.device_gib == 6.0
    # Without an allocated peak the record says nothing: the prediction stays.
    pred = _pred()
    assert not mr._override(pred, _record(metrics={"peak_mem_reserved_gib": 6.0}))
    assert not mr._override(pred, _record(metrics=None))
    assert (pred.device_gib, pred.measured, pred.status) == (2.0, False, "fits")


@pytest.mark.parametrize("config_gib, env_gib, memory, replaced", [
    (16.0, None, 16.0, True),  # a card no larger than what ran out
    (16.0, None, 15.0, True),
    (16.0, None, 16.5, False),  # a larger card may fit it
    (None, 16.0, 16.0, True),  # the machine's memory when the cell had no cap
    (16.0, 80.0, 16.0, True),  # the cell's cap wins over the machine's
    (None, None, 16.0, False),  # unknown: nothing to conclude
    (16.0, None, None, False),  # no card in the plan
])  # fmt: skip
def test_a_run_out_of_memory_does_not_fit_a_card_no_larger(config_gib, env_gib, memory, replaced):
    pred = _pred(memory=memory)
    config = {} if config_gib is None else {"gpu_memory_gib": config_gib}
    env = {"gpu_name": "T4"} if env_gib is None else {"gpu_memory_gib": env_gib}
    assert mr._override(pred, _record("oom", env=env, **config)) is replaced
    if replaced:
        had = config_gib or env_gib
        gpu = "T4" if env_gib is None else "the measuring machine"
        assert (pred.status, pred.measured) == ("oom", True)
        assert pred.reason == f"measured: ran out of memory on {gpu} with {had:g} GiB"
    else:
        assert (pred.status, pred.measured, pred.reason) == ("fits", False, None)


def test_the_latest_finished_or_oom_record_of_a_cell_wins():
    metrics = {"peak_mem_allocated_gib": 3.0}
    records = [
        _record(metrics={"peak_mem_allocated_gib": 1.0}),
        _record(metrics=metrics),
        _record("error", metrics={"peak_mem_allocated_gib": 9.0}),
        _record(model="DiT-B/8", metrics={"peak_mem_allocated_gib": 9.0}),
        _record(batch_size=64, metrics={"peak_mem_allocated_gib": 7.0}),
    ]
    preds = [_pred(), _pred(batch_size=16), _pred(batch_size=64)]
    assert mr.apply_measured(preds, records) == 2
    assert [p.peak_allocated_gib for p in preds] == [3.0, 1.0, 7.0]
    assert mr.apply_measured([_pred()], [_record(metrics={})]) == 0


def test_an_out_of_memory_record_is_applied_like_a_finished_one():
    preds = [_pred(memory=16.0)]
    assert mr.apply_measured(preds, [_record("oom", gpu_memory_gib=16.0)]) == 1
    assert (preds[0].status, preds[0].measured) == ("oom", True)
