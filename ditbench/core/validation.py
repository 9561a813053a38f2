"""A pydantic model's verdict on a user's input, as ditbench's one-paragraph error: the key path, what
is wrong and what is valid (a field's `description`, a model's `title`), never pydantic's own wording.
A validator says better with `refuse(text)`; `rule(template)` gives a type its own sentence.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError, WrapValidator
from pydantic_core import PydanticCustomError

from ditbench.core.errors import UserError, did_you_mean, shorten

M = TypeVar("M", bound=BaseModel)
_KINDS = {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean"}  # what a user gave, in words


def refuse(text: str, at: str = "") -> PydanticCustomError:
    """A validator's own message about the value it checks (or its key `at`)."""
    return PydanticCustomError("ditbench", "{text}", {"text": text, "at": at})


def described(value: Any) -> str:
    """A value for a message: a number as it is, anything else with its kind ("a string '16'")."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return shorten(value)
    if value is None:
        return "nothing"
    return f"{_KINDS.get(type(value), f'a {type(value).__name__}')} {shorten(value)}"


def rule(template: str) -> WrapValidator:
    """The type's checks before it, any failure said as `template` ({name}: the key, {value}: the value,
    {got}: the value with its kind); a validator's own `refuse` message inside is kept."""

    def check(value: Any, handler: Any, info: Any) -> Any:
        try:
            return handler(value)
        except ValidationError as err:
            own = next((e["ctx"]["text"] for e in err.errors() if e["type"] == "ditbench"), None)
            text = own or template.format(name=info.field_name, value=shorten(value), got=described(value))
            raise refuse(text) from None

    return WrapValidator(check)


def unknown_key(key: Any, valid: Iterable[str]) -> str:
    valid = list(valid)
    hint = did_you_mean(key, valid)
    return f"unknown key `{shorten(key, quote=False)}`.{hint} Valid keys here: {', '.join(valid)}."


def where(loc: tuple[str | int, ...] | list[str | int]) -> str:
    """('overrides', 0, 'match') -> 'overrides[0].match'; blank parts (a union's tags) are no keys."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif str(part).strip():
            out += f".{part}" if out and not str(part).startswith("[") else str(part)
    return out


def problem(
    model: type[BaseModel], errors: list[dict[str, Any]], verb: str = "expected"
) -> tuple[tuple, str]:
    """(the key path at fault, what is wrong there and what is valid) for the first error."""
    # An unknown key first: a misspelt key also leaves its right spelling "missing".
    first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    loc, kind, value = tuple(first["loc"]), first["type"], first.get("input")
    if kind == "ditbench":
        at = first["ctx"]["at"]
        return ((*loc, at) if at else loc), first["ctx"]["text"].replace("{where}", where(loc))
    if kind == "extra_forbidden":
        return loc, unknown_key(loc[-1], _keys(model, loc[:-1]))
    if kind == "missing":
        title = _model_at(model, loc[:-1]).model_config.get("title")
        needs = f"{title} needs" if title else "needs"
        return loc[:-1], f"{needs} `{loc[-1]}`: {_description(model, loc)}."
    valid = _description(model, loc)
    if kind in ("model_type", "model_attributes_type", "dict_type") and "mapping" not in valid:
        return loc, f"{verb} a mapping (key: value), got {described(value)}."
    return loc, f"{verb} {valid}, got {shorten(value)}."


def located(label: str, loc: tuple, text: str) -> str:
    return f"{label}{f' at `{where(loc)}`' if loc else ''}: {text}"


def validate(model: type[M], raw: Any, say: Callable[[tuple, str], str], *, json: bool = False) -> M:
    """`raw` (with json=True: its JSON text) validated by `model`; else UserError(say(key path, text))."""
    try:
        return model.model_validate_json(raw) if json else model.model_validate(raw)
    except ValidationError as err:
        raise UserError(say(*problem(model, err.errors()))) from None


def check(model: type[M], raw: Any, label: str, *, where_first: bool = False) -> M:
    """`raw` validated by `model`; else UserError naming `label`, the key path and what is valid."""
    if where_first:
        return validate(model, raw, lambda loc, text: located(label, loc, text))
    try:
        return model.model_validate(raw)
    except ValidationError as err:
        errors = err.errors()
    extra = [e["loc"] for e in errors if e["type"] == "extra_forbidden"]
    if extra:  # the policy's style: every unknown key of the mapping at once
        parent = tuple(extra[0][:-1])
        keys = [str(e[-1]) for e in extra if tuple(e[:-1]) == parent]
        valid = _keys(model, parent)
        text = f"{'has ' if parent else ''}unknown key(s) {shorten(', '.join(keys), quote=False)}."
        text += f"{did_you_mean(keys[0], valid)} Valid keys: {', '.join(valid)}."
        raise UserError(f"{label}: `{where(parent)}` {text}" if parent else f"{label}: {text}")
    loc, text = problem(model, errors, "must be")
    if errors[0]["type"] == "ditbench" or not loc:
        raise UserError(f"{label}: {text}")
    raise UserError(f"{label}: `{where(loc)}` {text}")


def _keys(model: type[BaseModel], loc: tuple) -> list[str]:
    return [f.alias or name for name, f in _model_at(model, loc).model_fields.items()]


def _model_at(model: type[BaseModel], loc: tuple) -> Any:
    """The model that validates the mapping at `loc` (None where the path leaves the models)."""
    current: Any = model
    for part in loc:
        if isinstance(part, int) or current is None:
            continue  # a list's item, or a mapping's value: the same annotation's argument
        field = current.model_fields.get(part)
        current = _inner_model(field.annotation) if field is not None else current
    return current


def _inner_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next(filter(None, map(_inner_model, getattr(annotation, "__args__", ()))), None)


def _description(model: type[BaseModel], loc: tuple) -> str:
    """The description of the field that holds the value at `loc` (a list's item: the list's)."""
    for end in range(len(loc), 0, -1):
        at, name = _model_at(model, loc[: end - 1]), loc[end - 1]
        if isinstance(name, str):
            field = at.model_fields.get(name) if at is not None else None
            return (field.description if field is not None else None) or "a valid value"
    return "a valid value"
