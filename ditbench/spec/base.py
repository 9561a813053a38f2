"""The spec's building blocks: the model base class and the field types every spec model is made of.

Each type is pydantic's check plus the one sentence a user reads when it fails, the same wherever the
value enters. A float field also takes text in exponent form (`2e-4`: YAML 1.1 reads it as text);
integers stay strict (`2.0`, `'16'`, `true` are not); NaN and infinity are never valid.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar, Literal, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from ditbench.errors import UserError
from ditbench.validation import located, problem, refuse, rule, validate

S = TypeVar("S", bound="SpecModel")
EXPONENT = r"^[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+$"
MAX_PATH_CHARS = 4096  # PATH_MAX on Linux


class SpecModel(BaseModel):
    """Frozen, no unknown keys; built from code by position or name, a bad value raising UserError with
    the field's own sentence."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    def __init__(self, *args: Any, **values: Any) -> None:
        values.update(zip(type(self).model_fields, args, strict=False))
        try:
            super().__init__(**values)
        except ValidationError as err:
            raise UserError(problem(type(self), err.errors())[1]) from None

    # pydantic validates nested models and model_validate input without calling this (it would route
    # them through a custom __init__ and lose the key path of an error): code calls it, pydantic not.
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]

    def replace(self: S, **changes: Any) -> S:
        """This model with `changes`, validated like any other (model_copy would not validate)."""
        return type(self)(**{**dict(self), **changes})

    @classmethod
    def read(cls: type[S], raw: Any, label: str, *, json: bool = False) -> S:
        """`raw` (a mapping, or with json=True the model's JSON) validated once; UserError naming `label`
        and the key path otherwise."""
        return validate(
            cls, raw, lambda loc, text: located(label, [p for p in loc if p not in cls.FLAT], text), json=json
        )

    FLAT: ClassVar[tuple[str, ...]] = ()  # fields whose keys sit one level up in the input (no key path)


def number(value: Any) -> Any:
    """The numeric-string rule: text in exponent form as the float it spells, anything else as it is."""
    return float(value) if isinstance(value, str) and re.fullmatch(EXPONENT, value) else value


def Int(low: int, high: int, *, optional: bool = False) -> Any:  # noqa: N802 - a type
    one = Annotated[int, Field(strict=True, ge=low, le=high)]
    return Annotated[
        one | None if optional else one,
        rule(f"{{name}} must be an integer from {low} to {high:,}, got {{got}}"),
    ]


def Real(low: float, high: float, *, low_open: bool = False, high_open: bool = False, optional: bool = False):  # noqa: N802
    bounds = {"gt" if low_open else "ge": low, "lt" if high_open else "le": high}
    one = (
        Annotated[float, Field(strict=True, allow_inf_nan=False, **bounds)]
        | Annotated[str, Field(pattern=EXPONENT)]  # never reached: BeforeValidator made it a float
    )
    span = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    return Annotated[
        one | None if optional else one,
        BeforeValidator(number),
        rule(f"{{name}} must be a finite number in {span}, got {{got}}"),
    ]


def Choice(*names: Any) -> Any:  # noqa: N802
    return Annotated[Literal[names], rule(f"unknown {{name}} {{value}}; valid: {', '.join(map(str, names))}")]


Flag = Annotated[bool, Field(strict=True), rule("{name} must be true or false, got {got}")]


def Text(valid: str = "a path", *, optional: bool = False) -> Any:  # noqa: N802
    one = Annotated[str, Field(strict=True, max_length=MAX_PATH_CHARS, pattern=r"\S")]
    return Annotated[one | None if optional else one, rule(f"{{name}} must be {valid}, got {{got}}")]


def required(message: str) -> BeforeValidator:
    """A field that must be given, `message` saying what it is (with Field(None, validate_default=True))."""

    def present(value: Any) -> Any:
        if value is None:
            raise refuse(message)
        return value

    return BeforeValidator(present)


def checked_by(function: Any) -> BeforeValidator:
    """`function(value)` normalises a value or raises UserError, whose message is the field's."""

    def call(value: Any) -> Any:
        try:
            return function(value)
        except UserError as err:
            raise refuse(str(err)) from None

    return BeforeValidator(call)


def from_flags(model: type[S], values: dict[str, Any]) -> S:
    """`model` from a command's flags (`--batch-size 8`): each string value read as a YAML value, as a
    suite file's or an override's would be; an error names the flag."""
    from ditbench.yamlio import parse_yaml_text

    raw = {
        k: parse_yaml_text(v, f"--{k.replace('_', '-')}") if isinstance(v, str) else v
        for k, v in values.items()
    }

    def say(loc: tuple, text: str) -> str:
        return text if not loc or text.startswith("--") else f"--{str(loc[0]).replace('_', '-')}: {text}"

    return validate(model, raw, say)
