"""`key=value` overrides after the suite: `ditbench run single_24gb model=DiT-L/4 batch_size=[16,32]`.

A value is read as a YAML flow value (`16`, `[16, 32]`, `{warmup: 2}`, `bf16`, `true`, `null`),
through the same bounded parser as suite files. Where an override lands in the suite:

- a knob (`model`, `batch_size`, ...): a list becomes that knob's matrix axis; a single value
  replaces the axis with that one value, or sets the default when the knob is not in the matrix.
  Cells of `include` keep the values they name (they are explicit extra cells);
- `steps`, `smoke`, `timeout_s`: the suite's `defaults.<key>`;
- a top-level key (`device`, `card`, `gpu_memory_gib`, `baseline`, `plan`, `name`, `description`);
  `card` and `gpu_memory_gib` replace each other (a card has a fixed memory);
- a dotted key sets a nested value: `steps.measure=10`, `defaults.image_size=64`,
  `plan.skip_predicted_oom=true`.

The suite is then validated as a whole, exactly as a file is, and an error about a value an
override set names the override (`bench.suite._Validator`).
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Any

from ditbench.errors import UserError, shorten
from ditbench.yamlio import parse_yaml_text

MAX_OVERRIDES = 256
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
# YAML 1.1 (PyYAML) reads `2e-4` as text: it needs a dot (`2.0e-4`). On a command line people write 2e-4.
_EXPONENT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


@dataclass(frozen=True)
class Override:
    text: str  # as typed, e.g. "batch_size=[16,32]"
    key: str  # "batch_size" or a dotted path
    value: Any


def parse_overrides(items: list[str], suite_keys: tuple[str, ...]) -> list[Override]:
    """Each `key=value` parsed (a key is a knob or one of `suite_keys`); a malformed one is an error."""
    from ditbench.knobs import FIELDS

    if len(items) > MAX_OVERRIDES:
        raise UserError(f"{len(items)} overrides given; at most {MAX_OVERRIDES} are read.")
    valid = tuple(dict.fromkeys((*FIELDS, *suite_keys)))
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
            from ditbench.knobs import unknown_key_message

            raise UserError(f"override {shorten(item)}: {unknown_key_message(head, valid)}")
        if key in seen:
            raise UserError(
                f"overrides {shorten(seen[key])} and {shorten(item)} both set `{key}`; give it once."
            )
        if not text.strip():
            raise UserError(
                f"override {shorten(item)} has no value; write one after `=` (`null` removes a setting)."
            )
        value = _numbers(parse_yaml_text(text, f"override {shorten(item)}"))
        seen[key] = item
        parsed.append(Override(item, key, value))
    return parsed


def _numbers(value: Any) -> Any:
    """`2e-4` as the number YAML 1.2 and every command line mean, in a list too."""
    if isinstance(value, str) and _EXPONENT.fullmatch(value):
        return float(value)
    if isinstance(value, list):
        return [_numbers(v) for v in value]
    return value


def as_record(overrides: list[Override]) -> dict[str, Any]:
    """The record's `suite_overrides`: key -> value as parsed ({} when none)."""
    return {o.key: o.value for o in overrides}


def apply_overrides(
    raw: Any, overrides: list[Override], where: str, defaults_keys: tuple[str, ...]
) -> tuple[Any, dict[str, str]]:
    """The suite mapping with the overrides applied, and keypath -> override text for error messages;
    `defaults_keys` are the non-knob keys of `defaults` (steps, smoke, timeout_s) a bare key means."""
    from ditbench.knobs import FIELDS

    if not overrides:
        return raw, {}
    if not isinstance(raw, dict):
        return raw, {}  # parse_suite says what is wrong with the file itself
    raw = copy.deepcopy(raw)
    origin: dict[str, str] = {}
    for o in overrides:
        parts = o.key.split(".")
        if parts[0] in FIELDS and len(parts) == 1:
            origin[_knob(raw, o.key, o.value, o.text)] = o.text
            continue
        if parts[0] in defaults_keys:
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
