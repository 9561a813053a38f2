"""report/gate/inputs.py checked function by function (issue 27, mutation testing).

Every value the gate reads comes with the reason it cannot be used; the expected messages are written
out here in full from the stated format (the field, the value as shorten() quotes it, what is valid).
"""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from ditbench.core.errors import UserError
from ditbench.records.metrics import MFU
from ditbench.records.model import Record, check
from ditbench.report.gate.inputs import (
    MAX_NAMED,
    GateRefusal,
    IncomparableError,
    Problem,
    Problems,
    Row,
    load_run,
    noisy,
    number,
    rows,
    run_samples,
    step_samples,
)

# ------------------------------------------------------------------------------------------ rows


def raw(**top):
    """A result record's JSON with these top-level values."""
    from synthetic_records import make_record

    return {**make_record("DiT-S/8", "fp32", "none", 8, images_per_s=400.0), **top}


def record(**top) -> Record:
    """A result record (the model the gate reads) with these top-level values."""
    return Record.model_validate(raw(**top))


def refused(**top) -> str | None:
    """What the record model says of a record with these top-level values (the gate never sees it)."""
    got, why = check(raw(**top))
    assert got is None
    return why


def test_a_row_names_its_side_source_and_cell():
    r = Row("BASE", "runs/a.jsonl line 3", record(cell_id="ab12", cell_name="DiT-S/8 fp32"))
    assert r.cell == "cell `DiT-S/8 fp32` (ab12)"
    assert r.where == "BASE runs/a.jsonl line 3, cell `DiT-S/8 fp32` (ab12)"


def test_a_row_without_a_name_says_so_and_a_record_without_a_name_or_id_is_refused_before():
    assert Row("NEW", "x line 1", record(cell_id="ab12", cell_name="")).cell == "cell `` (ab12)"
    assert refused(cell_name=None) == "cell_name is None, not a string"
    assert refused(cell_id=7) == "cell_id is 7, not a string"
    assert refused(cell_id="") == "cell_id is '', not a non-empty string"


def test_a_long_cell_name_is_cut_at_100_and_a_long_id_at_40():
    name, cid = "n" * 150, "i" * 50
    r = Row("NEW", "x line 1", record(cell_id=cid, cell_name=name))
    assert r.cell == f"cell `{'n' * 99}… (150 characters)` ({'i' * 39}… (50 characters))"
    r = Row("NEW", "x line 1", record(cell_id="i" * 40, cell_name="n" * 100))
    assert r.cell == f"cell `{'n' * 100}` ({'i' * 40})"


def test_rows_are_keyed_by_cell_id_with_path_and_line():
    r1, r2, r3 = record(cell_id="a"), record(cell_id="b"), record(cell_id="c")
    df = pd.DataFrame({"record": [r1, r2, r3], "source": ["runs/a.jsonl:3", "noline", "C:/x/b.jsonl:12"]})
    assert rows(df, "NEW") == {
        "a": Row("NEW", "runs/a.jsonl line 3", r1),
        "b": Row("NEW", "noline", r2),
        "c": Row("NEW", "C:/x/b.jsonl line 12", r3),
    }


def test_a_run_directory_is_read_through_its_results_file(tmp_path):
    from synthetic_records import make_record

    record = make_record("DiT-S/8", "fp32", "none", 8, images_per_s=400.0)
    record["metrics"]["tflops_per_s"] = math.inf  # left to the gate to name by cell (judge_metrics)
    (tmp_path / "results.jsonl").write_text(json.dumps(record, allow_nan=True) + "\n")
    for given in (tmp_path, str(tmp_path / "results.jsonl")):
        df = load_run(given)
        assert list(df["source"]) == [f"{tmp_path / 'results.jsonl'}:1"]
        assert df["record"].iloc[0].metrics.tflops_per_s == math.inf


def test_a_directory_without_a_results_file_is_named_itself(tmp_path):
    for _ in range(2):  # empty, then holding a folder called results.jsonl (not a results file)
        with pytest.raises(UserError) as err:
            load_run(tmp_path)
        assert str(err.value).startswith(f"{tmp_path} is a directory without a results.jsonl;")
        (tmp_path / "results.jsonl").mkdir(exist_ok=True)


# ------------------------------------------------------------------------------------------ values


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, (None, None)),
        (3, (3.0, None)),
        (-2.5, (-2.5, None)),
        (0, (0.0, None)),
        (math.nan, (None, "is nan, not a finite number")),
        (-math.inf, (None, "is -inf, not a finite number")),
    ],
)
def test_a_number_is_a_finite_int_or_float(value, expected):
    got = number(value)
    assert got == expected or (got[0] is None and expected[0] is None and got[1] == expected[1])
    if got[0] is not None:
        assert type(got[0]) is float


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (True, "is True, not a number"),
        (False, "is False, not a number"),
        ("3", "is '3', not a number"),
        ([1], "is [1], not a number"),
        (10**400, "is an integer too large for a number"),
    ],
)
def test_a_value_that_is_no_number_never_reaches_the_gate(value, why):
    assert refused(metrics={"images_per_s": value}) == f"metrics.images_per_s {why}"


@pytest.mark.parametrize(
    ("metrics", "expected"),
    [
        ({"mfu": {"value": 3}}, (3.0, None)),
        ({"mfu": {"peak_tflops": 3}}, (None, None)),
        ({"mfu": None}, (None, None)),
        (None, (None, None)),
        ({"mfu": {"value": math.inf}}, (None, "is inf, not a finite number")),
    ],
)
def test_a_number_is_read_at_its_metrics_path(metrics, expected):
    assert number(MFU.of(record(metrics=metrics))) == expected


@pytest.mark.parametrize(
    ("metrics", "why"),
    [
        ({"mfu": 5}, "metrics.mfu is 5, not an object"),
        ({"mfu": {"value": "x"}}, "metrics.mfu.value is 'x', not a number"),
        ([1], "metrics is [1], not an object"),
    ],
)
def test_a_path_through_something_that_is_no_object_never_reaches_the_gate(metrics, why):
    assert refused(metrics=metrics) == why


STEP_RULE = "(per-step times must be finite numbers of ms)"
REPEAT_RULE = "(per-repeat step times must be positive ms)"


@pytest.mark.parametrize(
    ("metrics", "expected"),
    [
        (None, ([], None)),
        ({}, ([], None)),
        ({"step_ms": {"median": 5}}, ([], None)),
        ({"step_ms": {"samples": [1, 2.5, 0.5]}}, ([1.0, 2.5, 0.5], None)),
        ({"step_ms": {"samples": []}}, ([], None)),
        (
            {"step_ms": {"samples": [1, 0]}},
            ([], f"metrics.step_ms.samples[1] is not a positive time {STEP_RULE}"),
        ),
        (
            {"step_ms": {"samples": [-1, 2]}},
            ([], f"metrics.step_ms.samples[0] is not a positive time {STEP_RULE}"),
        ),
        (
            {"step_ms": {"samples": [1, None]}},
            ([], f"metrics.step_ms.samples[1] is null {STEP_RULE}"),
        ),
        (
            {"step_ms": {"samples": [math.nan, -1]}},
            ([], f"metrics.step_ms.samples[0] is nan, not a finite number {STEP_RULE}"),
        ),
    ],
)
def test_step_samples_are_positive_finite_times(metrics, expected):
    got = step_samples(record(metrics=metrics))
    assert got == expected
    assert all(type(v) is float for v in got[0])


@pytest.mark.parametrize(
    ("metrics", "why"),
    [
        ({"step_ms": 5}, "metrics.step_ms is 5, not an object"),
        ({"step_ms": {"samples": "x"}}, "metrics.step_ms.samples is 'x', not a list"),
        ({"step_ms": {"samples": [2, True]}}, "metrics.step_ms.samples[1] is True, not a number"),
        ({"repeats": "x"}, "metrics.repeats is 'x', not an object"),
        ({"repeats": {"step_ms": 10}}, "metrics.repeats.step_ms is 10, not a list"),
        ({"repeats": {"step_ms": ["a"]}}, "metrics.repeats.step_ms[0] is 'a', not a number"),
    ],
)
def test_samples_that_are_no_list_of_numbers_never_reach_the_gate(metrics, why):
    assert refused(metrics=metrics) == why


@pytest.mark.parametrize(
    ("metrics", "expected"),
    [
        (None, ([], None)),
        ({"repeats": None}, ([], None)),
        ({"repeats": {"step_ms": [10, 12.5]}}, ([10.0, 12.5], None)),
        (
            {"repeats": {"images_per_s": [10]}},
            ([], "metrics.repeats.step_ms is None, not a list of per-repeat step times"),
        ),
        (
            {"repeats": {"step_ms": [10, -1]}},
            ([], f"metrics.repeats.step_ms[1] is not a positive time {REPEAT_RULE}"),
        ),
        (
            {"repeats": {"step_ms": [math.inf]}},
            ([], f"metrics.repeats.step_ms[0] is inf, not a finite number {REPEAT_RULE}"),
        ),
    ],
)
def test_run_samples_are_the_repeats_positive_times(metrics, expected):
    assert run_samples(record(metrics=metrics)) == expected


NOISY = "noisy measurement window"
LOAD_ADVICE = (
    "other processes used 80% of the CPUs during the window: rerun on a quiet machine (a cell with more "
    "than one thread also gains from threads=1)"
)


@pytest.mark.parametrize(
    ("metrics", "expected"),
    [
        (None, None),
        ({}, None),
        ({"noisy": False, "noise": {"step_spread": 9.0, "spread_bound": 1.0}}, None),
        ({"noisy": None}, None),
        ({"noisy": True}, NOISY),
        ({"noisy": True, "noise": None}, NOISY),
        ({"noisy": True, "noise": {}}, NOISY),
        (
            {
                "noisy": True,
                "noise": {
                    "step_spread": 1.234567,
                    "spread_bound": 1.15,
                    "throughput_gap": 0.05,
                    "gap_bound": 0.03,
                },
            },
            f"{NOISY}: step spread p90/p10 1.23 (bound 1.15), throughput gap 0.05 (bound 0.03)",
        ),
        (
            {"noisy": True, "noise": {"step_spread": 2, "spread_bound": None, "throughput_gap": None}},
            f"{NOISY}: step spread p90/p10 2",
        ),
        (
            {
                "noisy": True,
                "noise": {"step_spread": math.nan, "throughput_gap": 0.125, "gap_bound": math.inf},
            },
            f"{NOISY}: throughput gap 0.125",
        ),
        (
            {
                "noisy": True,
                "noise": {"throughput_gap": math.nan, "other_cpu_share": 0.8, "load_bound": 0.25},
            },
            f"{NOISY}: {LOAD_ADVICE}",
        ),
        (
            {
                "noisy": True,
                "noise": {"step_spread": 1.5, "spread_bound": 1, "other_cpu_share": 0.8, "load_bound": 0.25},
            },
            f"{NOISY}: step spread p90/p10 1.5 (bound 1), {LOAD_ADVICE}",
        ),
    ],
)
def test_a_noisy_window_says_why(metrics, expected):
    assert noisy(record(metrics=metrics)) == expected


@pytest.mark.parametrize(
    ("metrics", "why"),
    [
        ({"noisy": "yes"}, "metrics.noisy is 'yes', not true or false"),
        ({"noisy": 1}, "metrics.noisy is 1, not true or false"),
        ({"noisy": True, "noise": "x"}, "metrics.noise is 'x', not an object"),
        ({"noisy": True, "noise": [1]}, "metrics.noise is [1], not an object"),
        ({"noisy": True, "noise": {"spread_bound": "x"}}, "metrics.noise.spread_bound is 'x', not a number"),
    ],
)
def test_a_malformed_noisy_flag_or_noise_never_reaches_the_gate(metrics, why):
    assert refused(metrics=metrics) == why


# ------------------------------------------------------------------------------------------ problems


def row(side, source, cell_id="c1"):
    return Row(side, source, record(cell_id=cell_id, cell_name="DiT-S/8 fp32"))


HEAD = "A gate cannot pass what it cannot compare, so it refuses (exit 2)."
TAIL = "Re-run the cell or fix the record."


def test_no_problem_raises_nothing_and_a_problem_is_kept_as_given():
    p = Problems()
    p.raise_any()
    assert p.found == []
    r = row("BASE", "a line 1")
    p.add(r, "metrics.x is 'a', not a number", "x")
    p.add(r, "cell_id is missing")
    assert p.found == [
        Problem(r, "metrics.x is 'a', not a number", "x"),
        Problem(r, "cell_id is missing", None),
    ]
    with pytest.raises(IncomparableError) as err:
        p.raise_any()
    assert err.value.problems == p.found


def test_one_problem_of_a_record_names_the_record_and_no_policy_key():
    err = IncomparableError([Problem(row("NEW", "n.jsonl line 2"), "cell_id is missing", None)])
    assert str(err) == f"NEW n.jsonl line 2, cell `DiT-S/8 fp32` (c1): cell_id is missing. {HEAD} {TAIL}"
    assert err.exit_code == 2
    assert err.markdown() == (
        "## ⛔ ditbench compare: refused, values that cannot be compared\n\n"
        f"NEW n.jsonl line 2, cell `DiT-S/8 fp32` (c1): cell_id is missing. {HEAD} {TAIL}\n"
    )


def test_one_problem_of_a_metric_names_the_policy_key_that_allows_it():
    err = IncomparableError(
        [Problem(row("BASE", "b line 1"), "metrics.mfu.value is 'x', not a number", "mfu")]
    )
    assert str(err) == (
        f"BASE b line 1, cell `DiT-S/8 fp32` (c1): metrics.mfu.value is 'x', not a number. {HEAD} {TAIL} If "
        "this is expected, list `mfu` under `allow_incomparable` in the policy to report it as not compared "
        "instead."
    )


def problems(n):
    # problems 0, 1 in one record of BASE, the rest each in its own record of NEW
    out = [Problem(row("BASE", "b line 1"), "p0", None), Problem(row("BASE", "b line 1"), "p1", "fid")]
    out += [Problem(row("NEW", f"n line {i}"), f"p{i}", None) for i in range(2, n)]
    return out


def test_up_to_five_problems_are_named_one_by_one():
    assert MAX_NAMED == 5
    err = IncomparableError(problems(5))  # 4 records: b line 1 and n lines 2-4
    also = (
        "5 problems in 4 record(s); also BASE b line 1: p1; NEW n line 2: p2; NEW n line 3: p3; NEW n line "
        "4: p4."
    )
    assert str(err) == f"BASE b line 1, cell `DiT-S/8 fp32` (c1): p0. {HEAD} {also} {TAIL}"


def test_beyond_five_problems_the_rest_are_counted():
    also = "also BASE b line 1: p1; NEW n line 2: p2; NEW n line 3: p3; NEW n line 4: p4"
    assert f"6 problems in 5 record(s); {also}; and 1 more. {TAIL}" in str(IncomparableError(problems(6)))
    assert f"8 problems in 7 record(s); {also}; and 3 more. {TAIL}" in str(IncomparableError(problems(8)))


def test_two_problems_name_the_second():
    err = IncomparableError(problems(2))
    assert str(err) == (
        f"BASE b line 1, cell `DiT-S/8 fp32` (c1): p0. {HEAD} 2 problems in 1 record(s); also BASE b line 1: "
        f"p1. {TAIL}"
    )


def test_a_refusal_is_a_user_error_whose_markdown_is_one_paragraph():
    err = GateRefusal("a  b\n   c")
    assert isinstance(err, UserError)
    assert err.title == "refused"
    assert err.markdown() == "## ⛔ ditbench compare: refused\n\na b c\n"
