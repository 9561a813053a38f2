"""The JSON Schema (draft 2020-12) of a suite file, generated from the knob table and the suite's keys.

`ditbench suites --schema` prints it, so an editor completes and checks a suite (VS Code's YAML
extension: `# yaml-language-server: $schema=suite.schema.json`). Nothing here restates a rule: each
knob's schema is carried by its check in `ditbench.knobs`, the other bounds by the checks
`bench/suite.py` applies. The loader stays the judge (it also checks combinations a schema cannot,
such as a model's patch size against image_size); the schema is what an editor can check as you type.
"""

from __future__ import annotations

from typing import Any

from ditbench.bench.cluster import CLUSTER_KEYS
from ditbench.bench.plan_option import PLAN_KEYS
from ditbench.bench.suite import REPEATS_CHECK, SMOKE_CELLS, SMOKE_STEPS_CHECK, TIMEOUT_CHECK
from ditbench.cards import CARDS
from ditbench.cellspec import STEP_CHECKS
from ditbench.device import DEVICE_CHOICES
from ditbench.knobs import FIELDS
from ditbench.quality.spec import KEYS as QUALITY_KEYS


def _closed(properties: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """An object that takes only these keys (an unknown key is a mistake, as the loader says)."""
    return {"type": "object", "properties": properties, "additionalProperties": False, **extra}


def _or_null(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema`, or null (a key left empty in YAML): the loader takes it as absent. A type list
    rather than anyOf, so an error names the wrong key inside, not "no alternative matched"."""
    return {**schema, "type": [schema["type"], "null"]}


def _knob(name: str) -> dict[str, Any]:
    spec = FIELDS[name]
    out = {"description": spec.metadata["help"], **spec.metadata["check"].schema}
    if spec.default is not None:
        out["default"] = spec.default
    return out


def _keys(keys: tuple[str, ...], what: str) -> dict[str, Any]:
    return _closed({key: {} for key in keys}, description=what)


def suite_schema() -> dict[str, Any]:
    knobs = {name: _knob(name) for name in FIELDS}
    partial = _closed(knobs, description="a partial cell: some of the knobs")
    axes = {
        name: {"anyOf": [{"type": "array", "items": schema, "minItems": 1}, schema]}
        for name, schema in knobs.items()
    }
    cells = {"type": "array", "items": {"$ref": "#/$defs/partial_cell"}}
    defaults = _closed(
        {
            **knobs,
            "steps": _closed(
                {key: check.schema for key, check in STEP_CHECKS.items()},
                description="the measured window: warmup steps, then at least measure steps and min_seconds",
            ),
            "smoke": _closed(
                {
                    "steps": SMOKE_STEPS_CHECK.schema,
                    "cells": {"anyOf": [{"enum": list(SMOKE_CELLS)}, cells]},
                },
                description="a longer run after the window, on the cells named",
            ),
            "timeout_s": TIMEOUT_CHECK.schema,
        },
        description="one value per knob for every cell, plus steps, smoke and timeout_s",
    )
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "ditbench suite",
        "description": "a benchmark suite: defaults x matrix - exclude + include (README, Suites)",
        "$defs": {"partial_cell": partial},
        **_closed(
            {
                "name": {
                    "type": "string",
                    "pattern": "^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$",
                    "description": "names the output directory",
                },
                "description": {"type": ["string", "null"]},
                "device": {"enum": list(DEVICE_CHOICES), "default": "auto"},
                "card": {
                    "type": "string",
                    "description": "emulate this card's memory (not with gpu_memory_gib)",
                    "examples": [card.name for card in CARDS],
                },
                "gpu_memory_gib": {
                    "type": "number",
                    "exclusiveMinimum": 0,
                    "description": "emulate a card with this much memory (not with card)",
                },
                "defaults": _or_null(defaults),
                "matrix": _closed(
                    axes, minProperties=1, description="knob: list of values; the cells are their product"
                ),
                "exclude": _or_null({**cells, "description": "partial cells left out of the matrix"}),
                "include": _or_null({**cells, "description": "partial cells added to the matrix"}),
                "baseline": _or_null(partial),
                "plan": _or_null(_keys(PLAN_KEYS, "planner options")),
                "cluster": _or_null(_keys(CLUSTER_KEYS, "where --executor slurm runs the cells")),
                "quality": _or_null(_keys(QUALITY_KEYS, "evaluate the trained cells")),
                "repeats": {
                    **REPEATS_CHECK.schema,
                    "default": 1,
                    "description": "measure each cell this many times, each in a fresh process, "
                    "round-robin across cells; speeds are the median of the per-process medians",
                },
            },
            required=["name", "matrix"],
        ),
    }
