"""A pydantic model's verdict on a user's file, as ditbench's one-paragraph error.

The models (the gate's policy, ...) declare types, bounds and required keys; each field's
`description` says what a valid value is. `check` validates and turns the first problem into
"<label>: `<key path>` must be <description>, got <value>." — the file, the key path and the
valid values, never pydantic's own wording ("Input should be a valid number"), which names
neither. A validator that knows better says it with `refuse(text)`, where `{where}` stands for
the key path.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticCustomError

from ditbench.errors import UserError, shorten

M = TypeVar("M", bound=BaseModel)


def refuse(text: str) -> PydanticCustomError:
    """A validator's own message; `{where}` is replaced by the key path of the value it refused."""
    return PydanticCustomError("ditbench", "{text}", {"text": text})


def where(loc: tuple[str | int, ...]) -> str:
    """('overrides', 0, 'match') -> 'overrides[0].match'."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def check(model: type[M], raw: Any, label: str) -> M:
    """`raw` validated by `model`; else UserError naming `label`, the key path and what is valid."""
    try:
        return model.model_validate(raw)
    except ValidationError as err:
        raise UserError(f"{label}: {_message(model, err.errors())}") from None


def _message(model: type[BaseModel], errors: list[dict[str, Any]]) -> str:
    # An unknown key first: a misspelt key also leaves its right spelling "missing".
    first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    loc, kind, value = tuple(first["loc"]), first["type"], first.get("input")
    if kind == "ditbench":
        return first["ctx"]["text"].replace("{where}", where(loc))
    if kind == "extra_forbidden":
        extra = [str(e["loc"][-1]) for e in errors if e["type"] == kind and tuple(e["loc"][:-1]) == loc[:-1]]
        valid = ", ".join(_fields_at(model, loc[:-1]))
        keys = shorten(", ".join(extra), quote=False)
        at = f"`{where(loc[:-1])}` has " if loc[:-1] else ""
        return f"{at}unknown key(s) {keys}; valid keys: {valid}."
    description = _description(model, loc)
    if kind == "missing":
        return f"`{where(loc[:-1]) or '(top level)'}` needs `{loc[-1]}`: {description}."
    return f"`{where(loc)}` must be {description}, got {shorten(value)}."


def _model_at(model: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    """The model that validates the mapping at `loc` (None where the path leaves the models)."""
    current: Any = model
    for part in loc:
        if isinstance(part, int) or current is None:
            continue  # a list's item, or a mapping's value: the same annotation's argument
        field = current.model_fields.get(part) if isinstance(current, type) else None
        current = _inner_model(field.annotation) if field is not None else current
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _inner_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _inner_model(arg)
        if found is not None:
            return found
    return None


def _fields_at(model: type[BaseModel], loc: tuple) -> list[str]:
    at = _model_at(model, loc)
    return list(at.model_fields) if at is not None else []


def _description(model: type[BaseModel], loc: tuple) -> str:
    at = _model_at(model, loc[:-1])
    field = at.model_fields.get(loc[-1]) if at is not None and isinstance(loc[-1], str) else None
    return (field.description if field is not None else None) or "a valid value"
