"""A pydantic model's verdict on a user's file, as ditbench's one-paragraph error.

The models (the gate's policy, the claims file) declare types, bounds and required keys; each
field's `description` says what a valid value is, a model's `title` what it is ("a claim").
`check` validates and turns the first problem into one paragraph naming the file, the key path
and the valid values, never pydantic's own wording ("Input should be a valid number"), which names
neither. Two house styles: "<label>: `<key>` must be <valid>, got <value>." (policy files) and
"<label> at `<key>`: expected <valid>, got <value>." (claims files, like suite files). A validator
that knows better says it with `refuse(text)`; `{where}` in the text stands for the key path, and
`at` names a key below the one refused.
"""

from __future__ import annotations

import difflib
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticCustomError

from ditbench.errors import UserError, shorten

M = TypeVar("M", bound=BaseModel)


def refuse(text: str, at: str = "") -> PydanticCustomError:
    """A validator's own message about the value it checks (or its key `at`)."""
    return PydanticCustomError("ditbench", "{text}", {"text": text, "at": at})


def where(loc: tuple[str | int, ...] | list[str | int]) -> str:
    """('overrides', 0, 'match') -> 'overrides[0].match'."""
    out = ""
    for part in loc:
        if isinstance(part, int) or str(part).startswith("["):
            out += f"[{part}]" if isinstance(part, int) else str(part)
        else:
            out += f".{part}" if out else str(part)
    return out


def check(model: type[M], raw: Any, label: str, *, where_first: bool = False) -> M:
    """`raw` validated by `model`; else UserError naming `label`, the key path and what is valid."""
    try:
        return model.model_validate(raw)
    except ValidationError as err:
        raise UserError(_Message(model, label, where_first).of(err.errors())) from None


class _Message:
    def __init__(self, model: type[BaseModel], label: str, where_first: bool):
        self.model, self.label, self.where_first = model, label, where_first
        self.verb = "expected" if where_first else "must be"

    def place(self, loc: tuple, text: str) -> str:
        key = where(loc)
        if self.where_first:
            return f"{self.label}{f' at `{key}`' if key else ''}: {text}"
        return f"{self.label}: `{key}` {text}" if key else f"{self.label}: {text}"

    def of(self, errors: list[dict[str, Any]]) -> str:
        # An unknown key first: a misspelt key also leaves its right spelling "missing".
        first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
        loc, kind, value = tuple(first["loc"]), first["type"], first.get("input")
        if kind == "ditbench":
            text = first["ctx"]["text"].replace("{where}", where(loc))
            at = first["ctx"]["at"]
            if not self.where_first:
                return f"{self.label}: {text}"
            return self.place((*loc, at) if at else loc, text)
        if kind == "extra_forbidden":
            parent = loc[:-1]
            extra = [
                str(e["loc"][-1]) for e in errors if e["type"] == kind and tuple(e["loc"][:-1]) == parent
            ]
            valid = [f.alias or name for name, f in _model_at(self.model, parent).model_fields.items()]
            close = difflib.get_close_matches(extra[0], valid, n=1, cutoff=0.5)
            hint = f" Did you mean `{close[0]}`?" if close else ""
            if self.where_first:
                text = f"unknown key {shorten(extra[0])}.{hint} Valid keys here: {', '.join(valid)}."
                return self.place(loc, text)
            has = "has " if parent else ""
            keys = shorten(", ".join(extra), quote=False)
            return self.place(parent, f"{has}unknown key(s) {keys}.{hint} Valid keys: {', '.join(valid)}.")
        if kind == "missing":
            title = _model_at(self.model, loc[:-1]).model_config.get("title")
            needs = f"{title} needs" if title else "needs"
            return self.place(loc[:-1], f"{needs} `{loc[-1]}`: {_description(self.model, loc)}.")
        return self.place(loc, f"{self.verb} {_description(self.model, loc)}, got {shorten(value)}.")


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
    for arg in getattr(annotation, "__args__", ()):
        found = _inner_model(arg)
        if found is not None:
            return found
    return None


def _description(model: type[BaseModel], loc: tuple) -> str:
    """The description of the field that holds the value at `loc` (a list's item: the list's)."""
    for end in range(len(loc), 0, -1):
        at, name = _model_at(model, loc[: end - 1]), loc[end - 1]
        if isinstance(name, str):
            field = at.model_fields.get(name) if at is not None else None
            return (field.description if field is not None else None) or "a valid value"
    return "a valid value"
