"""`ditbench suites --schema`: the JSON Schema an editor checks a suite with, made from the knob table."""

from __future__ import annotations

import copy
import json

import jsonschema
import pytest

from ditbench.cli import main
from ditbench.files.yamlio import load_yaml_file
from ditbench.spec.knobs import KNOBS, MAX_BATCH_SIZE, Knobs
from ditbench.spec.suite import shipped_suites, suite_schema

SUITE = {
    "name": "tiny",
    "defaults": {"model": "DiT-S/8", "steps": {"warmup": 1}},
    "matrix": {"batch_size": [8, 16]},
}


@pytest.fixture(scope="module")
def validator():
    schema = suite_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def errors(validator, suite) -> list[str]:
    return [e.message for e in validator.iter_errors(suite)]


@pytest.mark.parametrize("name", sorted(shipped_suites()))
def test_every_shipped_suite_validates(validator, name):
    assert errors(validator, load_yaml_file(shipped_suites()[name], "suite")) == []


def test_a_small_suite_validates(validator):
    assert errors(validator, SUITE) == []


@pytest.mark.parametrize(
    ("where", "value"),
    [
        ("matrix", {"batch_sise": [8]}),  # an unknown knob
        ("defaults", {"batch_sise": 8}),
        ("matrix", {"batch_size": [8, MAX_BATCH_SIZE + 1]}),  # out of range
        ("matrix", {"batch_size": [0]}),
        ("defaults", {"batch_size": MAX_BATCH_SIZE + 1}),
        ("defaults", {"precision": "fp8"}),
        ("defaults", {"grad_ckpt": "every_0"}),
        ("defaults", {"lr": 0}),  # the lower bound is open
        ("defaults", {"steps": {"measure": 0}}),
        ("defaults", {"data": {"latents": "a", "pixels": "b"}}),
        ("matrix", {}),
    ],
)
def test_a_wrong_value_fails(validator, where, value):
    suite = copy.deepcopy(SUITE)
    suite[where] = {**suite[where], **value} if value else value
    assert errors(validator, suite)


def test_unknown_top_key_and_missing_matrix_fail(validator):
    assert errors(validator, {**SUITE, "matrx": {}})
    assert errors(validator, {"name": "tiny"})


def test_every_knob_is_in_the_schema_with_its_help():
    knobs = suite_schema()["$defs"]["PartialKnobs"]["properties"]
    assert list(knobs) == list(KNOBS)
    assert knobs["batch_size"]["minimum"] == 1 and knobs["batch_size"]["maximum"] == MAX_BATCH_SIZE
    assert knobs["batch_size"]["description"] == Knobs.model_fields["batch_size"].description


def test_the_command_prints_it(capsys):
    assert main(["suites", "--schema"]) == 0
    assert json.loads(capsys.readouterr().out) == suite_schema()


def test_a_section_left_empty_is_valid_and_an_error_names_the_key_inside(validator):
    empty = dict.fromkeys(("defaults", "exclude", "include", "baseline", "plan", "cluster", "quality"))
    assert errors(validator, {**SUITE, **empty}) == []  # YAML's `include:` with nothing after it
    assert errors(validator, {**SUITE, "include": [{"batch_sise": 8}]}) == [
        "Additional properties are not allowed ('batch_sise' was unexpected)"
    ]


def test_a_matrix_axis_takes_a_knob_typed_optional_without_field_metadata():
    """A knob written `grad_clip: float | None = None` has no field metadata; its matrix axis is still
    a list of its values (a new knob of that form once crashed `ditbench suites` at import)."""
    from pydantic import BaseModel, TypeAdapter

    from ditbench.spec.suite import _axis_type

    class Knob(BaseModel):
        grad_clip: float | None = None

    axis = TypeAdapter(_axis_type(Knob.model_fields["grad_clip"]))
    assert axis.validate_python([0.5, None]) == [0.5, None]
    assert axis.validate_python(0.5) == [0.5]
