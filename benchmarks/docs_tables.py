"""The tables of docs/suites-and-knobs.md, generated from the spec's pydantic models.

    python benchmarks/docs_tables.py          # rewrite every generated table in docs/

A table sits between `<!-- generated:NAME -->` and `<!-- /generated -->`; its rows come from the model
(each field's name, default, JSON-schema bounds and description), so a knob added, renamed or given
other bounds changes the page when this runs, and tests/unit/test_docs.py fails until it has.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
MARKER = re.compile(r"(<!-- generated:(?P<name>[a-z_]+) -->\n)(?P<body>.*?)(<!-- /generated -->)", re.S)


# What a field is for, where its model gives no description (a model's own description wins). Only the
# words live here: names, defaults and bounds come from the model.
NOTES = {
    "SuiteFile.name": "names the suite and its default output folder (runs/NAME)",
    "SuiteFile.device": "where cells run: auto is a GPU where one is visible",
    "SuiteFile.defaults": "one value per knob for every cell, plus how each is measured",
    "SuiteFile.matrix": "knob: list of values; the cells are their product",
    "SuiteFile.baseline": "the cell the reports compare the others with",
    "SuiteFile.plan": "the planner's prediction in every record; predicted OOMs skipped if asked",
    "Defaults.timeout_s": "seconds a cell may take before it is stopped and recorded timeout",
    "Steps.warmup": "steps run before timing starts",
    "Steps.measure": "at least this many timed steps",
    "Steps.min_seconds": "and at least this many seconds of them",
    "Smoke.steps": "steps of the smoke run (loss every step)",
    "Smoke.cells": "which cells get one: none, all, baseline or a list of partial cells",
    "PlanOption.skip_predicted_oom": "record cells predicted not to fit as skipped, without running them",
    "QualitySection.reference": "ADM npz, image folder, cached statistics or builtin:NAME",
    "QualitySection.samples": "samples per evaluation and seed",
    "QualitySection.at": "smoke_end, or training steps of a fresh quality run: [0, 1000, 4000]",
    "QualitySection.seeds": "a count or a list of sample seeds: two or more give the noise estimate",
    "QualitySection.inception": "unset: the official weights; test: the calibrated test network; a path",
    "QualitySection.vae": "decodes a latent file's samples: ema, mse or a path",
    "QualitySection.batch_size": "samples per sampling batch",
    "QualitySection.grid": "images in the cell's sample grid (0: none)",
    "QualitySection.cells": "smoke (the cells with a smoke run), all, baseline, or a list of partial cells",
    "Sampler.name": "the sampler",
    "Sampler.steps": "sampling steps (respaced)",
    "Sampler.cfg_scale": "classifier-free guidance scale, 1 to 100 (1: none)",
    "Sampler.precision": "of sampling; the Inception network always runs in fp32",
    "ClusterOptions.partition": "sbatch --partition",
    "ClusterOptions.account": "sbatch --account",
    "ClusterOptions.qos": "sbatch --qos",
    "ClusterOptions.constraint": "sbatch --constraint",
    "ClusterOptions.time_limit_min": "job time limit; unset: the cell's timeout_s plus 10% (at least 5 min)",
    "ClusterOptions.sbatch": "any other sbatch option, without the -- ({cpus-per-task: 16, mem: 0})",
}


def _number(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.0f}" if value.is_integer() and value >= 1e4 else f"{value:g}"
    return str(value)


def _valid(schema: dict[str, Any]) -> str | None:
    """What a field accepts, in words; "" when its schema says it too intricately for a table cell,
    None for an alternative that adds nothing to say (null: the default column says unset; a number
    spelt in exponent form, which the page explains once)."""
    if "anyOf" in schema or "oneOf" in schema:
        parts = [_valid(s) for s in schema.get("anyOf", schema.get("oneOf"))]
        said = [p for p in parts if p is not None]
        return " or ".join(said) if all(said) else ""
    if "$ref" in schema:
        return "a partial cell" if schema["$ref"].endswith("/PartialKnobs") else "a mapping (below)"
    if "enum" in schema:
        values = [str(v) for v in schema["enum"]]
        slashed = {v for v in values if "/" in v}  # DiT-XL-2 spells DiT-XL/2: name each model once
        return ", ".join(v for v in values if not any(s.replace("/", "-") == v for s in slashed))
    if "const" in schema:
        return str(schema["const"])
    kind = schema.get("type")
    if kind == "null" or schema.get("pattern", "").startswith("^[-+]?"):
        return None
    if kind == "boolean":
        return "true, false"
    if kind == "array":
        item = _valid(schema.get("items", {}))
        return (
            "a list of partial cells"
            if item == "a partial cell"
            else f"a list ({item})"
            if item
            else "a list"
        )
    if kind == "object":
        keys = ", ".join(schema.get("properties", ()))
        return f"{{{keys}}}" if keys else "a mapping"
    if kind == "string":
        pattern = schema.get("pattern")
        return "text" if pattern in (None, r"\S") else f"text matching `{pattern}`"
    if kind in ("integer", "number"):
        low = schema.get("minimum", schema.get("exclusiveMinimum"))
        high = schema.get("maximum", schema.get("exclusiveMaximum"))
        if kind == "integer":
            return f"integer {_number(low)} to {_number(high)}"
        if high is None:
            return f"number {'>' if 'exclusiveMinimum' in schema else '>='} {_number(low)}"
        return (
            f"number in {'(' if 'exclusiveMinimum' in schema else '['}{_number(low)}, "
            f"{_number(high)}{')' if 'exclusiveMaximum' in schema else ']'}"
        )
    return ""


def _default(value: Any) -> str:
    if value is None:
        return "unset"
    if value == "":
        return '""'
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_default(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_default(v) for v in value) + "]"
    return _number(value)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def table(model: type, keys: list[str] | None = None) -> str:
    """A markdown table of `model`'s fields (or `keys` of them): name, default, valid values, and what
    each is for (its description, else NOTES)."""
    props = model.model_json_schema()["properties"]
    rows = ["| key | default | valid values | what it sets |", "|---|---|---|---|"]
    for key in keys or list(props):
        prop = props[key]
        field = model.model_fields[key]
        # a None default validated like a value is no default at all: the key must be given
        required = field.default is None and field.validate_default
        cells = [
            f"`{key}`",
            "required" if required else f"`{_default(prop.get('default'))}`",
            _valid(prop) or "see the text",
            prop.get("description") or NOTES.get(f"{model.__name__}.{key}", ""),
        ]
        rows.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(rows) + "\n"


def tables() -> dict[str, str]:
    """Each generated table of the docs, by name."""
    from ditbench.spec.cell import Steps
    from ditbench.spec.cluster import ClusterOptions
    from ditbench.spec.knobs import PartialKnobs
    from ditbench.spec.quality import Sampler
    from ditbench.spec.suite import Defaults, PlanOption, QualitySection, Smoke, SuiteFile

    knobs = set(PartialKnobs.model_fields)
    return {
        "knobs": table(PartialKnobs),
        "suite": table(SuiteFile),
        "defaults": table(Defaults, [k for k in Defaults.model_fields if k not in knobs]),
        "steps": table(Steps),
        "smoke": table(Smoke),
        "plan": table(PlanOption),
        "quality": table(QualitySection),
        "sampler": table(Sampler),
        "cluster": table(ClusterOptions),
    }


def rewrite(path: Path, generated: dict[str, str]) -> list[str]:
    """Replace each generated block of `path` with its table; the names it marks that do not exist."""
    unknown: list[str] = []

    def sub(m: re.Match) -> str:
        if m["name"] not in generated:
            unknown.append(m["name"])
            return m[0]
        return m[1] + generated[m["name"]] + m[4]

    text = path.read_text()
    new = MARKER.sub(sub, text)
    if new != text:
        path.write_text(new)
    return unknown


def main() -> int:
    generated = tables()
    unknown = [f"{p.name}: {name}" for p in sorted(DOCS.glob("*.md")) for name in rewrite(p, generated)]
    if unknown:
        print("no such generated table: " + ", ".join(unknown), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
