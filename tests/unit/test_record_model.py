"""The result record as a model and the one metric table (issue 35, point 3): every committed record
loads and writes back unchanged, a wrong type at any depth is named by its key path, each metric is
declared once and its name is a literal nowhere else in ditbench/."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from synthetic_records import make_matrix, make_record

from ditbench.records import metrics as table_module
from ditbench.records.metrics import (
    IMAGES_PER_S,
    MFU,
    PEAK_ALLOCATED,
    RECORD_METRICS,
    SMOKE_LOSS,
    STEP_MS,
    default_thresholds,
    limits,
    table,
)
from ditbench.records.model import Metrics, Record, check

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = {
    "baselines/cpu_smoke/results.jsonl": 12,
    "reports/cpu_quality/results.jsonl": 1,
    "reports/cpu_smoke/results.jsonl": 24,
    "reports/dit_resource_guide_cpu/results.jsonl": 6,
    "reports/plan_vs_cpu/results.jsonl": 16,
}
# Names a record's metrics section carries that only the table may spell (whole words: a prediction's
# `predicted_images_per_s` is another name). `steps_per_s` and `step_ms` are left out: the speed
# model and the measured window use them as their own variables.
TABLE_ONLY = (
    "images_per_s",
    "images_per_s_per_gpu",
    "tflops_per_s",
    "peak_mem_allocated_gib",
    "peak_mem_reserved_gib",
    "device_mem_gib",
    "cpu_peak_alloc_gib",
    "cpu_peak_rss_gib",
    "energy_j_per_image",
    "energy_j_per_step",
)


# ------------------------------------------------------------------------------------------ the model


def test_every_committed_record_loads_and_dumps_back_as_it_was_written():
    for name, count in COMMITTED.items():
        lines = [json.loads(line) for line in (ROOT / name).read_text().splitlines() if line.strip()]
        assert len(lines) == count, name
        for raw in lines:
            record, why = check(raw)
            assert why is None, (name, why)
            assert record.dump() == raw


def test_synthetic_records_are_records():
    for raw in make_matrix(smoke_steps=20) + make_matrix(device="cpu"):
        assert check(raw)[0].dump() == raw


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (lambda r: r["metrics"].update(images_per_s="400"), "metrics.images_per_s is '400', not a number"),
        (lambda r: r["metrics"].update(params=True), "metrics.params is True, not an integer"),
        (lambda r: r["metrics"]["step_ms"].update(samples="x"), "metrics.step_ms.samples is 'x', not a list"),
        (lambda r: r["metrics"].update(emulation="H200"), "metrics.emulation is 'H200', not an object"),
        (
            lambda r: r["metrics"].update(repeats={"count": "3"}),
            "metrics.repeats.count is '3', not an integer",
        ),
        (lambda r: r["smoke"].update(loss=[0.5, "x"]), "smoke.loss[1] is 'x', not a number"),
        (lambda r: r["smoke"].update(last_mean=float("inf")), "smoke.last_mean is inf, not a finite number"),
        (lambda r: r["env"].update(gpu_name=["H200"]), "env.gpu_name is ['H200'], not a string"),
        (lambda r: r["env"].update(gpu_count="one"), "env.gpu_count is 'one', not an integer"),
        (lambda r: r.update(label=["x"]), "label is ['x'], not a string"),
        (lambda r: r.update(duration_s="long"), "duration_s is 'long', not a number"),
        (lambda r: r.update(status="fast"), "status is 'fast', not one of ok, oom, timeout, nan_loss"),
        (lambda r: r.pop("cell_id"), "cell_id is missing"),
        (lambda r: r.update(cell_id=""), "cell_id is '', not a non-empty string"),
        (
            lambda r: r.update(schema="ditbench.result/2"),
            "schema is 'ditbench.result/2', which this ditbench",
        ),
        (
            lambda r: r["config"].update(batch_size=0),
            "field config.batch_size: batch_size must be an integer",
        ),
        (lambda r: r.update(repeat=2), "repeat 2 of repeats None is not a repeat index from 1 to repeats"),
    ],
)
def test_a_wrong_value_is_named_by_its_key_path(change, why):
    raw = make_record(smoke_steps=20)
    change(raw)
    record, problem = check(raw)
    assert record is None and problem.startswith(why)


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (lambda q: q.update(evaluations="x"), "quality.evaluations is 'x', not a list"),
        (
            lambda q: q["evaluations"][0].update(step=-1),
            "quality.evaluations[0].step is -1, not a number >= 0",
        ),
        (
            lambda q: q["evaluations"][1]["metrics"].update(fid="low"),
            "quality.evaluations[1].metrics.fid is 'low'",
        ),
        (lambda q: q["evaluations"][0].update(grid=5), "quality.evaluations[0].grid is 5, not a string"),
        (lambda q: q.update(train_loss="x"), "quality.train_loss is 'x', not a list"),
        (
            lambda q: q["inception"].update(official="yes"),
            "quality.inception.official is 'yes', not true or false",
        ),
        (lambda q: q.update(seeds=3), "quality.seeds is 3, not a list"),
        (lambda q: q.update(sampler="ddim"), "quality.sampler is 'ddim', not an object"),
    ],
)
def test_a_wrong_value_in_the_quality_field_is_named_by_its_key_path(change, why):
    raw = json.loads((ROOT / "reports/cpu_quality/results.jsonl").read_text())
    change(raw["quality"])
    record, problem = check(raw)
    assert record is None and problem.startswith(why), problem


def test_what_is_not_an_object_is_not_a_record():
    assert check([1, 2]) == (None, "a JSON list, not a result record (a JSON object)")


def test_older_keys_are_kept_and_a_combined_record_keeps_repeats_alone():
    raw = dict(make_record(), slurm_job="123", repeats=3)  # a key this ditbench does not type
    record = Record.model_validate(raw)
    assert (record.repeat_index, record.repeat_count) == (1, 3) and record.dump() == raw


def test_readers_use_attributes_and_json_callers_get_json():
    record = Record.model_validate(make_record(smoke_steps=20))
    assert record.config.knobs.model == "DiT-S/8" and record.smoke.steps == 20
    assert isinstance(record.metrics.step_ms.median, float)
    assert record["config"] == make_record(smoke_steps=20)["config"]  # the config as JSON
    assert record["metrics"]["step_ms"] == record.dump()["metrics"]["step_ms"]
    assert record.get("label", "none") == "none" and "label" not in record and "env" in record
    with pytest.raises(KeyError):
        record["label"]


def test_an_ok_record_without_its_measurement_is_unfinished():
    ok = Record.model_validate(make_record())
    assert ok.unfinished() is None
    for change, why in [
        (dict(metrics=None), 'status "ok" without metrics'),
        (
            dict(metrics={"step_ms": {"median": 2.0}}),
            'status "ok" but "metrics.images_per_s" is not a finite',
        ),
        (dict(metrics={"images_per_s": 1.0}), 'status "ok" but "metrics.step_ms.median" is not a finite'),
    ]:
        assert Record.model_validate({**make_record(), **change}).unfinished().startswith(why)
    assert Record.model_validate(make_record(status="oom")).unfinished() is None


# ------------------------------------------------------------------------------------------ the table


def test_the_table_names_paths_directions_and_default_thresholds():
    assert [m.name for m in RECORD_METRICS] == [
        "images_per_s",
        "images_per_s_per_gpu",
        "steps_per_s",
        "step_ms",
        "tflops_per_s",
        "mfu",
        "peak_mem_allocated_gib",
        "peak_mem_reserved_gib",
        "device_mem_gib",
        "cpu_peak_alloc_gib",
        "cpu_peak_rss_gib",
        "smoke_last_loss",
        "energy_j_per_image",
        "energy_j_per_step",
    ]
    assert list(table())[len(RECORD_METRICS) :] == [
        "fid",
        "sfid",
        "inception_score",
        "precision",
        "recall",
        "kid",
    ]
    assert default_thresholds() == {
        "images_per_s": 5.0,
        "peak_mem_allocated_gib": 2.0,
        "peak_mem_reserved_gib": 5.0,
        "fid": 2.0,
        "inception_score": 2.0,
    }
    assert limits({"images_per_s": 5.0, "peak_mem_allocated_gib": 2.0}) == "images/s -5%, peak allocated +2%"
    assert (STEP_MS.path, STEP_MS.key, STEP_MS.direction, STEP_MS.unit) == (
        "metrics.step_ms.median",
        "step_ms",
        "lower",
        "ms",
    )
    assert (MFU.key, MFU.show(0.4321), IMAGES_PER_S.show(1234.56), PEAK_ALLOCATED.show(3.14159)) == (
        "mfu",
        "43.2%",
        "1234.6",
        "3.14",
    )
    assert (PEAK_ALLOCATED.unit, SMOKE_LOSS.path, SMOKE_LOSS.valid) == ("GiB", "smoke.last_mean", "any")
    assert {m.key: m.ranks for m in RECORD_METRICS if m.ranks} == {
        "images_per_s": "sum",
        "steps_per_s": "min",
        "tflops_per_s": "sum",
        "peak_mem_allocated_gib": "max",
        "peak_mem_reserved_gib": "max",
        "device_mem_gib": "max",
        "cpu_peak_rss_gib": "max",
        "energy_j_per_image": "mean",
        "energy_j_per_step": "sum",
    }


def test_a_metric_reads_its_value_from_a_record_or_its_json():
    raw = make_record(images_per_s=400.0)
    record = Record.model_validate(raw)
    assert IMAGES_PER_S.of(record) == 400.0 == IMAGES_PER_S.of(raw)
    assert STEP_MS.of(record) == raw["metrics"]["step_ms"]["median"]
    assert MFU.of(Record.model_validate(make_record(device="cpu"))) is None  # a CPU cell has no MFU
    assert SMOKE_LOSS.of(record) is None  # no smoke run


def test_the_metrics_section_has_a_number_for_each_metric_of_the_table():
    fields = Metrics.model_fields
    for m in RECORD_METRICS:
        if m.path == f"metrics.{m.key}":
            assert fields[m.key].annotation == float | None, m.name


def test_metric_names_are_literals_in_the_table_only():
    table_file = Path(table_module.__file__).resolve()
    found = []
    for path in (ROOT / "ditbench").rglob("*"):
        if path.suffix not in (".py", ".yaml", ".json") or path.resolve() == table_file:
            continue
        text = path.read_text(encoding="utf-8")
        found += [f"{path.relative_to(ROOT)}: {n}" for n in TABLE_ONLY if re.search(rf"\b{n}\b", text)]
    assert found == []
    assert all(re.search(rf"\b{n}\b", table_file.read_text()) for n in TABLE_ONLY)
