"""`key=value` overrides after the suite: `ditbench run single_24gb model=DiT-L/4 batch_size=[16,32]`.

A value is a YAML flow value read as suite files are, set in the suite's mapping before the suite's model
validates it, so the verdict is the same as in the file (docs/suites-and-knobs.md has the rules).
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Any

from ditbench.errors import UserError, shorten
from ditbench.spec.base import number
from ditbench.spec.knobs import KNOBS
from ditbench.validation import unknown_key
from ditbench.yamlio import parse_yaml_text

MAX_OVERRIDES = 256
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
DEFAULTS_KEYS = ("steps", "smoke", "timeout_s")  # the non-knob keys of `defaults` a bare key means


@dataclass(frozen=True)
class Override:
    text: str  # as typed, e.g. "batch_size=[16,32]"
    key: str  # "batch_size" or a dotted path
    value: Any


def parse_overrides(items: list[str], suite_keys: tuple[str, ...]) -> list[Override]:
    """Each `key=value` parsed (a key is a knob or one of `suite_keys`); a malformed one is an error."""
    if len(items) > MAX_OVERRIDES:
        raise UserError(f"{len(items)} overrides given; at most {MAX_OVERRIDES} are read.")
    valid = tuple(dict.fromkeys((*KNOBS, *DEFAULTS_KEYS, *suite_keys)))
    parsed: list[Override] = []
    seen: dict[str, str] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not _KEY.fullmatch(key):
            raise UserError(
                f"override {shorten(item)} is not `key=value` (e.g. `batch_size=[16,32]`, "
                "`model=DiT-L/4`, `steps.measure=10`); keys are knob or suite key names, dotted for "
                "nested sections."
            )
        head = key.split(".")[0]
        if head not in valid:
            raise UserError(f"override {shorten(item)}: {unknown_key(head, valid)}")
        if key in seen:
            raise UserError(
                f"overrides {shorten(seen[key])} and {shorten(item)} both set `{key}`; give it once."
            )
        if not text.strip():
            raise UserError(
                f"override {shorten(item)} has no value; write one after `=` (`null` removes a setting)."
            )
        seen[key] = item
        parsed.append(Override(item, key, parse_yaml_text(text, f"override {shorten(item)}")))
    return parsed


def as_record(overrides: list[Override]) -> dict[str, Any]:
    """The record's `suite_overrides`: key -> value as parsed, numbers as the models read them."""
    return {
        o.key: [number(v) for v in o.value] if isinstance(o.value, list) else number(o.value)
        for o in overrides
    }


def apply_overrides(raw: Any, overrides: list[Override], where: str) -> tuple[Any, dict[str, str]]:
    """The suite mapping with the overrides applied, and keypath -> override text for error messages."""
    if not overrides or not isinstance(raw, dict):
        return raw, {}  # a file that is not a mapping: the suite says what is wrong with it
    raw = copy.deepcopy(raw)
    origin: dict[str, str] = {}
    for o in overrides:
        parts = o.key.split(".")
        if parts[0] in KNOBS and len(parts) == 1:
            origin[_knob(raw, o.key, o.value, o.text)] = o.text
            continue
        if parts[0] in DEFAULTS_KEYS:
            parts = ["defaults", *parts]
        _set(raw, parts, o.value, o.text, where)
        if parts == ["card"]:
            raw.pop("gpu_memory_gib", None)
        elif parts == ["gpu_memory_gib"]:
            raw.pop("card", None)
        origin[".".join(parts)] = o.text
    return raw, origin


def _knob(raw: dict, key: str, value: Any, text: str) -> str:
    """Place a knob override in the matrix or the defaults; returns the keypath it went to."""
    matrix = raw.get("matrix")
    defaults = raw.get("defaults")
    if isinstance(value, list) or (isinstance(matrix, dict) and key in matrix):
        if not isinstance(matrix, dict):
            raise UserError(f"override {shorten(text)}: the suite's `matrix` is not a mapping to put it in.")
        matrix[key] = value if isinstance(value, list) else [value]
        if isinstance(defaults, dict):
            defaults.pop(key, None)
        return f"matrix.{key}"
    if defaults is None:
        raw["defaults"] = defaults = {}
    if not isinstance(defaults, dict):
        raise UserError(f"override {shorten(text)}: the suite's `defaults` is not a mapping to put it in.")
    defaults[key] = value
    return f"defaults.{key}"


def _set(raw: dict, parts: list[str], value: Any, text: str, where: str) -> None:
    node = raw
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            node[part] = child = {}
        if not isinstance(child, dict):
            raise UserError(
                f"override {shorten(text)}: `{'.'.join(parts[: i + 1])}` in suite {where} is "
                f"{shorten(child)}, not a mapping, so `{'.'.join(parts)}` cannot be set; override "
                f"`{'.'.join(parts[: i + 1])}` as a whole instead."
            )
        node = child
    node[parts[-1]] = value
