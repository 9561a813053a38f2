"""One rule for a value wherever it enters (issue 34, class 9): a knob's value written in a suite
file, given as a `key=value` override (`ditbench run` and `ditbench plan` alike) or as a flag of
`ditbench train` is accepted or refused the same way, with the same result. The common spelling of a
float (`2e-4`, which YAML 1.1 reads as text) works everywhere; text that is no number does not."""

from __future__ import annotations

import pytest

from ditbench.core.errors import UserError
from ditbench.spec.base import from_flags
from ditbench.spec.knobs import KNOBS, TRAIN_KNOBS, Knobs
from ditbench.spec.suite import load_suite

VALUES = [
    "2e-4", "1E+2", "5e-1", "0.5", "'0.5'", "'2e-4'", "1", "2.0", "-1", "0", "128", "true", "off", "null",
    "abc", ".nan", "-.inf", "'16'", "fp16", "every_2", "auto", "DiT-T/4", "DiT-T-4", "diffusers", "ddp",
    "fsdp", "default", "math", "adamw", "for-loop", "after_forward", "{latents: x.npz}",
    "{pixels: builtin:mpl-gray16, colour: rgb}", "99999999999999999999", "[2]",
]  # fmt: skip


def _base(knob: str) -> dict[str, str]:
    """The suite around the knob under test: a tiny CPU cell, a matrix axis of another knob."""
    defaults = {k: v for k, v in {"model": "DiT-T/8", "image_size": "64"}.items() if k != knob}
    return {"defaults": defaults, "axis": "num_classes" if knob == "seed" else "seed"}


def _suite(tmp_path, knob: str, text: str | None) -> str:
    base = _base(knob)
    defaults = dict(base["defaults"])
    matrix = {base["axis"]: "[0, 1]" if base["axis"] == "seed" else "[10]"}
    if text is not None:  # a list is an axis in a file as in an override; a single value a default
        (matrix if text.startswith("[") else defaults)[knob] = text
    path = tmp_path / f"{knob}.yaml"
    inner = lambda d: ", ".join(f"{k}: {v}" for k, v in d.items())  # noqa: E731
    path.write_text(f"name: t\ndevice: cpu\ndefaults: {{{inner(defaults)}}}\nmatrix: {{{inner(matrix)}}}\n")
    return str(path)


def _verdict(load) -> tuple:
    try:
        return ("accepted", load())
    except UserError:
        return ("refused",)


@pytest.mark.parametrize("knob", KNOBS)
def test_every_knob_takes_every_value_the_same_way_in_a_file_an_override_and_a_flag(tmp_path, knob):
    accepted = 0
    for i, text in enumerate(VALUES):  # _verdict calls each lambda at once, in this iteration
        where = tmp_path / str(i)
        where.mkdir()
        in_file = _verdict(lambda: [c.config[knob] for c in load_suite(_suite(where, knob, text)).cells])  # noqa: B023
        override = _verdict(
            lambda: [c.config[knob] for c in load_suite(_suite(where, knob, None), [f"{knob}={text}"]).cells]  # noqa: B023
        )
        assert in_file == override, (knob, text)
        if knob in TRAIN_KNOBS and not text.startswith("["):  # `ditbench train --KNOB TEXT`
            flag = _verdict(lambda: getattr(from_flags(Knobs, {**_base(knob)["defaults"], knob: text}), knob))  # noqa: B023
            assert flag[0] == in_file[0], (knob, text)
            assert flag[0] == "refused" or all(v == flag[1] for v in in_file[1]), (knob, text)
        accepted += in_file[0] == "accepted"
    assert accepted, knob  # every knob takes some of the values


@pytest.mark.parametrize(
    "text, value", [("2e-4", 2e-4), ("1E-3", 1e-3), ("5e-1", 0.5), ("0.25", 0.25), ("1", 1.0)]
)
def test_the_common_spelling_of_a_float_works_in_a_file_and_an_override(tmp_path, text, value):
    assert {c.config["lr"] for c in load_suite(_suite(tmp_path, "lr", text)).cells} == {value}
    assert {c.config["lr"] for c in load_suite(_suite(tmp_path, "lr", None), [f"lr={text}"]).cells} == {value}


@pytest.mark.parametrize("text", ["'0.1'", "abc", "1e", "e-4", "2e-4x", "0x10", ".nan", "1e999"])
def test_text_that_is_no_float_is_refused_in_both(tmp_path, text):
    with pytest.raises(UserError, match="lr"):
        load_suite(_suite(tmp_path, "lr", text))
    with pytest.raises(UserError, match="lr"):
        load_suite(_suite(tmp_path, "lr", None), [f"lr={text}"])


def test_integers_stay_strict(tmp_path):
    for text in ("2e1", "2.0", "'16'", "true"):
        with pytest.raises(UserError, match="batch_size must be an integer"):
            load_suite(_suite(tmp_path, "batch_size", text))
        with pytest.raises(UserError, match="batch_size must be an integer"):
            load_suite(_suite(tmp_path, "batch_size", None), [f"batch_size={text}"])


def test_plan_reads_an_override_as_run_does(capsys):
    from ditbench.cli import main

    assert main(["plan", "cpu_smoke", "lr=abc", "--no-tree"]) == 2
    err = " ".join(capsys.readouterr().err.split())  # the paragraph is wrapped where the path ends
    assert "lr must be a finite number in (0, 1], got a string 'abc'" in err
    suite = load_suite("cpu_smoke", ["lr=2e-4"])  # what plan and run both call with SUITE KEY=VALUE
    assert {c.config["lr"] for c in suite.cells} == {2e-4}
