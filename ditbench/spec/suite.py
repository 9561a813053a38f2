"""Suite files: one model of the file (`SuiteFile`), validated whole (after the `key=value` overrides)
before anything runs, and expanded into cells (`defaults x matrix - exclude + include`, each with a
stable id). A suite argument that names an existing file is that file, else a shipped suite's name.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from pydantic import BeforeValidator, ConfigDict, Field, WithJsonSchema, create_model, model_validator
from pydantic.json_schema import GenerateJsonSchema

from ditbench.core.errors import UserError, shorten
from ditbench.core.expansion import factors, matrix_count, over_cap
from ditbench.core.validation import refuse, rule, validate, where
from ditbench.files.yamlio import load_yaml_file
from ditbench.hardware.cards import CARDS, check_gib, find_card
from ditbench.hardware.device import DEVICE_CHOICES, device_type
from ditbench.spec.base import EXPONENT, Choice, Flag, Int, Real, SpecModel, checked_by, number, required
from ditbench.spec.cell import MAX_SECONDS, MAX_STEPS, CellSpec, Steps, cell_id
from ditbench.spec.cluster import ClusterOptions
from ditbench.spec.knobs import Cells, Knobs, PartialKnobs, matches, selects
from ditbench.spec.overrides import apply_overrides, as_record, parse_overrides
from ditbench.spec.quality import QualitySection

REPEATS_MAX = 100  # a cell measured more often than this is a soak test, not a benchmark
TIMEOUT_MAX_S = MAX_SECONDS
NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"
SUITES_DIR = Path(__file__).resolve().parent.parent / "suites"


def shipped_suites(folder: Path = SUITES_DIR) -> dict[str, Path]:
    return {p.stem: p for p in sorted(folder.glob("*.yaml"))}


def resolve_suite(arg: str | Path) -> Path:
    """The suite file `arg` means: an existing path as given, else a shipped suite of that name."""
    return resolve_shipped(arg, SUITES_DIR, "suite", "(`ditbench suites` lists them with their descriptions)")


def resolve_shipped(arg: str | Path, folder: Path, kind: str, listed: str = "") -> Path:
    """An existing path as given, else the YAML of that name (with or without .yaml) in `folder`,
    one of the package's own (suites, claims); UserError naming the shipped ones otherwise."""
    path, text = Path(arg), str(arg)
    name = text[: -len(".yaml")] if text.endswith(".yaml") else text
    shipped = shipped_suites(folder)
    bare = name in shipped and "/" not in text and "\\" not in text
    if path.exists() and not (bare and path.is_dir()):  # a run's --out named like the suite is no suite
        return path
    if bare:
        return shipped[name]
    raise UserError(
        f"{kind} {shorten(text)} does not exist: there is no such file and no shipped {kind} of that "
        f"name; give a path to a {kind} YAML or "
        f"one of the shipped names: {', '.join(shipped) or '(none found in ' + str(folder) + ')'}"
        + (f" {listed}" if listed else "")
        + "."
    )


class Smoke(SpecModel):
    steps: Int(0, MAX_STEPS) = 500
    cells: Cells("baseline", "all", "none") = "none"


class Defaults(PartialKnobs):
    """One value per knob for every cell, plus how each is measured."""

    steps: Steps = Field(
        Steps(), description="the measured window: warmup steps, then at least measure steps and min_seconds"
    )
    smoke: Smoke = Field(Smoke(), description="a longer run after the window, on the cells named")
    timeout_s: Real(0.0, TIMEOUT_MAX_S, low_open=True) = 1800.0


def _axis(value: Any) -> list[Any]:
    if not isinstance(value, list):
        return [value]  # a single value is a one-element axis
    if not value:
        raise refuse("an empty list leaves no cells; give at least one value.")
    return value


def _axis_type(f: Any) -> Any:
    one = Annotated[(f.annotation, *f.metadata)] if f.metadata else f.annotation
    return Annotated[list[one], BeforeValidator(_axis, json_schema_input_type=one | list[one])]


class Matrix(
    create_model(
        "Axes", __base__=SpecModel, **{k: (_axis_type(f), None) for k, f in PartialKnobs.model_fields.items()}
    )
):
    """knob: list of values; the cells are their product."""

    model_config = ConfigDict(title="Matrix", json_schema_extra={"minProperties": 1})

    @model_validator(mode="before")
    @classmethod
    def _not_empty(cls, value: Any) -> Any:
        if value == {}:
            raise refuse(
                "the matrix is empty; give at least one knob with a list of values, e.g. "
                "`batch_size: [8, 16]`."
            )
        return value


class PlanOption(SpecModel):
    """The planner's prediction in every record; skip_predicted_oom skips cells predicted not to fit."""

    skip_predicted_oom: Flag = False


Gib = Annotated[
    float | None,
    checked_by(lambda v: v if v is None else check_gib(number(v), "gpu_memory_gib")),
    WithJsonSchema(
        {"anyOf": [{"type": "number", "exclusiveMinimum": 0}, {"type": "string", "pattern": EXPONENT}]}
    ),
]
Card = Annotated[
    str | None,
    checked_by(lambda v: v if v is None else find_card(v).name),
    Field(json_schema_extra={"examples": [c.name for c in CARDS]}),
]


class SuiteFile(SpecModel):
    """A suite file as written."""

    model_config = ConfigDict(title="ditbench suite")
    name: Annotated[
        str,
        Field(strict=True, pattern=NAME),
        rule(
            "a suite needs a `name` made of letters, digits, `_`, `-`, `.` (it names the output directory), "
            "got {value}."
        ),
    ] = Field(None, validate_default=True)
    description: str | None = Field("", strict=True, description="text")
    device: Choice(*DEVICE_CHOICES) = "auto"
    gpu_memory_gib: Gib = Field(None, description="emulate a card with this much memory (not with card)")
    card: Card = Field(None, description="emulate this card's memory (not with gpu_memory_gib)")
    defaults: Defaults | None = None
    matrix: Annotated[
        Matrix, required("a suite needs a `matrix` (e.g. `matrix: {model: [DiT-S/8], batch_size: [8, 16]}`).")
    ] = Field(None, validate_default=True)
    exclude: list[PartialKnobs] | None = Field(None, description="partial cells left out of the matrix")
    include: list[PartialKnobs] | None = Field(None, description="partial cells added to the matrix")
    baseline: PartialKnobs | None = None
    plan: PlanOption | None = None
    cluster: ClusterOptions | None = Field(None, description="where --executor slurm runs the cells")
    quality: QualitySection | None = Field(None, description="evaluate the trained cells")
    repeats: Int(1, REPEATS_MAX) = Field(
        1,
        description="measure each cell this many times, each in a fresh process, round-robin across cells; "
        "speeds are the median of the per-process medians",
    )

    @model_validator(mode="before")
    @classmethod
    def _one_card(cls, value: Any) -> Any:
        if isinstance(value, dict) and "gpu_memory_gib" in value and "card" in value:
            raise refuse(
                "give either `card` or `gpu_memory_gib`, not both (a card has a fixed memory).", "card"
            )
        return value


@dataclass(frozen=True)
class SuiteCell:
    """One point of the matrix: its spec (knobs + how it is measured) and how it is named."""

    spec: CellSpec
    cell_id: str
    cell_name: str
    timeout_s: float

    @functools.cached_property
    def config(self) -> dict[str, Any]:
        """The record's `config`: every knob, steps, smoke_steps, device and the emulated card."""
        return self.spec.model_dump(mode="json")

    @property
    def series_key(self) -> str:
        """The cell without its batch size: cells of one series differ only in batch."""
        drop = ("batch_size", "global_batch", "smoke_steps", "quality")
        return json.dumps({k: v for k, v in self.config.items() if k not in drop}, sort_keys=True)


@dataclass
class Suite:
    name: str
    description: str
    path: str
    device: str
    cells: list[SuiteCell]
    baseline: dict[str, Any] | None = None
    gpu_memory_gib: float | None = None  # the emulated card's budget, from `gpu_memory_gib` or `card`
    card: str | None = None
    plan: PlanOption | None = None  # the `plan` option: predictions recorded, predicted OOMs skipped
    cluster: ClusterOptions = field(default_factory=ClusterOptions)  # where --executor slurm runs the cells
    quality: QualitySection | None = None  # the `quality` section, on the cells it applies to
    overrides: dict[str, Any] = field(default_factory=dict)  # `key=value`s from the command line
    repeats: int = 1  # each cell this many times, each in a fresh process, round-robin (bench.repeats)


class _Errors:
    """Every error says where it is: the file, the key path, and the override that set it."""

    def __init__(self, path: str, origin: dict[str, str]):
        self.path, self.origin = path, origin  # keypath -> the command-line override that set it

    def fail(self, keypath: str, message: str) -> UserError:
        return UserError(self.say(keypath, message))

    def say(self, keypath: str, message: str) -> str:
        where_ = f" at `{keypath}`" if keypath else ""
        by = [
            text
            for key, text in self.origin.items()
            if keypath == key or keypath.startswith((f"{key}.", f"{key}["))
        ]
        if by:
            where_ += f" (set by the override `{shorten(by[0], quote=False)}`)"
        elif self.origin:
            listed = ", ".join(f"`{shorten(t, quote=False)}`" for t in self.origin.values())
            message += f" (The suite was changed by the overrides {listed}.)"
        return f"suite {self.path}{where_}: {message if message.endswith(('.', '?', ')')) else message + '.'}"

    def model(self, model: type[SpecModel], raw: Any, keypath: str = "") -> Any:
        return validate(
            model, raw, lambda loc, text: self.say(".".join(filter(None, (keypath, where(loc)))), text)
        )


def _refuse_non_finite(errors: _Errors, raw: Any) -> None:
    """NaN and inf are valid YAML (`.nan`, `.inf`) but never a valid setting: refuse them anywhere."""
    stack: list[tuple[str, Any]] = [("", raw)]
    while stack:
        keypath, value = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            raise errors.fail(
                keypath, f"{value} is not a finite number; every number in a suite must be finite."
            )
        if isinstance(value, dict):
            stack.extend((f"{keypath}.{k}" if keypath else str(k), x) for k, x in value.items())
        elif isinstance(value, list):
            stack.extend((f"{keypath}[{i}]", x) for i, x in enumerate(value))


def load_suite(
    path: str | Path, overrides: list[str] | tuple[str, ...] = (), max_cells: int | None = None
) -> Suite:
    """Read and validate a suite (a file or a shipped name) with its overrides; UserError on any mistake."""
    path = resolve_suite(path)
    return parse_suite(load_yaml_file(path, "suite"), str(path), list(overrides), max_cells)


def parse_suite(
    raw: Any, path: str = "<suite>", overrides: list[str] | None = None, max_cells: int | None = None
) -> Suite:
    given = parse_overrides(overrides or [], tuple(SuiteFile.model_fields))
    raw, origin = apply_overrides(raw, given, path)
    errors = _Errors(path, origin)
    if raw is None:
        raise errors.fail("", "the file is empty; a suite needs at least `name` and `matrix`.")
    _refuse_non_finite(errors, raw)
    file = errors.model(SuiteFile, raw)
    defaults = file.defaults or Defaults()
    smoke, quality = defaults.smoke, file.quality
    baseline = file.baseline.given() if file.baseline is not None else None
    if smoke.cells == "baseline" and smoke.steps > 0 and baseline is None:
        raise errors.fail(
            "defaults.smoke.cells",
            "smoke cells are `baseline` but the suite has no `baseline`; add one (e.g. "
            "`baseline: {precision: fp32}`) or list the cells.",
        )
    # Expansion: cartesian product - excludes + includes (completed from the defaults), counted first.
    axes = {k: getattr(file.matrix, k) for k in raw["matrix"]}  # in the file's order
    include = [p.given() for p in file.include or ()]
    exclude = [p.given() for p in file.exclude or ()]
    too_many = over_cap(
        matrix_count(axes, len(include)), max_cells, "the matrix", factors(axes, len(include))
    )
    if too_many:
        raise errors.fail("matrix", too_many)
    common = {k: getattr(defaults, k) for k in defaults.model_fields_set if k in PartialKnobs.model_fields}
    product = (
        {**common, **dict(zip(axes, combo, strict=True))} for combo in itertools.product(*axes.values())
    )
    configs = [("matrix", values) for values in product if not any(matches(values, ex) for ex in exclude)]
    configs += [(f"include[{i}]", {**common, **partial}) for i, partial in enumerate(include)]
    if not configs:
        raise errors.fail("exclude", "every cell of the matrix is excluded; nothing would run.")
    # `auto` is resolved here, so a cell's id says where it ran: a CPU result never stands in for a GPU one
    resolved = device_type(file.device)
    budget = find_card(file.card).usable_gib if file.card else file.gpu_memory_gib
    if budget is not None and resolved != "cuda":
        raise errors.fail(
            "card" if file.card else "gpu_memory_gib",
            f"emulating a card caps CUDA's allocator, but this suite runs on the {resolved} (device: "
            f"{file.device}); use device: cuda on a machine with a GPU, or remove it.",
        )
    full = [errors.model(Knobs, values, keypath) for keypath, values in configs]
    varying = [
        k for k in Knobs.model_fields if len({json.dumps(getattr(c, k), sort_keys=True) for c in full}) > 1
    ]
    cells: list[SuiteCell] = []
    seen: set[str] = set()
    for knobs in full:
        values = dict(knobs)
        steps = smoke.steps if selects(smoke.cells, values, baseline) else 0
        evaluated = quality is not None and quality.applies(values, steps, baseline)
        spec = CellSpec(
            knobs, resolved, defaults.steps, steps, budget, file.card, quality.spec() if evaluated else None
        )
        cid = cell_id(spec)
        if cid in seen:  # an include repeating a matrix cell: run it once
            continue
        seen.add(cid)
        name = cell_name(values, varying)
        if evaluated and (problem_ := quality.conflict(knobs, steps)):
            raise errors.fail("quality", f"cell {name} cannot be evaluated: {problem_}.")
        cells.append(SuiteCell(spec, cid, name, defaults.timeout_s))
    if quality is not None and not any(c.spec.quality for c in cells):
        raise errors.fail(
            "quality.cells",
            f"selects no cell ({shorten(raw['quality'].get('cells', 'smoke'))}); the default `smoke` needs "
            "smoke cells (defaults.smoke.cells), or give `all`, `baseline` or a list of partial cells.",
        )
    return Suite(
        file.name, file.description or "", path, file.device, cells, baseline, budget, file.card, file.plan,
        file.cluster or ClusterOptions(), quality, as_record(given), file.repeats,
    )  # fmt: skip


def cell_name(config: dict[str, Any], varying: list[str] | tuple[str, ...] = ()) -> str:
    """Readable name: the headline knobs, then any other knob that varies within the suite."""
    parts = [
        config["model"],
        config["precision"],
        f"ckpt={config['grad_ckpt']}",
        f"bs={config['batch_size']}",
    ]
    always = ("grad_accum", "gpus", "nodes")  # how many images a step is: shown when more than one
    for key in varying:
        if key in ("model", "precision", "grad_ckpt", "batch_size", *always):
            continue
        value = config[key]
        if key == "compile":
            parts.append("compile" if value else "eager")
        elif key == "image_size":
            parts.append(f"{value}px")
        else:
            parts.append(f"{key}={json.dumps(value) if isinstance(value, dict) else value}")
    # shown only when more than one, whether or not it varies
    return " ".join(parts + [f"{key}={config[key]}" for key in always if config.get(key, 1) > 1])


class _TypeLists(GenerateJsonSchema):
    """`X or null` as a type list where X has one type, so an editor's error names the wrong key inside
    (anyOf would say "no alternative matched")."""

    def nullable_schema(self, schema: Any) -> Any:
        inner = self.generate_inner(schema["schema"])
        if isinstance(inner.get("type"), str):
            return {**inner, "type": [inner["type"], "null"]}
        return super().nullable_schema(schema)


def suite_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a suite file. The loader stays the judge (it also checks
    combinations a schema cannot, such as a model's patch size against image_size)."""
    schema = SuiteFile.model_json_schema(schema_generator=_TypeLists)
    schema["required"] = ["name", "matrix"]
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}
