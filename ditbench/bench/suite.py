"""Suite files: load a YAML suite, validate every key before anything runs, expand it into cells.

A suite is `defaults` (one value per knob) x `matrix` (a list of values per knob), minus the
`exclude` partial cells, plus the `include` partial cells (completed from the defaults). The knobs
and their validation are `ditbench.knobs`; every cell carries the full set of knobs, so a record
says everything that shaped it, and a stable `cell_id` (`bench.cellid`) lets a rerun recognise
finished cells.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ditbench.bench.cellid import cell_id
from ditbench.bench.cluster import ClusterOptions, parse_cluster
from ditbench.bench.plan_option import PlanOption, parse_plan_option
from ditbench.bench.repeats import REPEATS_MAX
from ditbench.cards import check_gib, find_card
from ditbench.cellspec import MAX_SECONDS as TIMEOUT_MAX_S
from ditbench.cellspec import MAX_STEPS, CellSpec, Steps
from ditbench.device import DEVICE_CHOICES, device_type
from ditbench.errors import UserError, shorten, type_name
from ditbench.expansion import factors, matrix_count, over_cap
from ditbench.knobs import FIELDS, InvalidValue, Knobs, check_knob, int_in, number_in
from ditbench.knobs import unknown_key_message as _unknown
from ditbench.quality import spec as quality_spec
from ditbench.yamlio import load_yaml_file

SMOKE_CELLS = ("baseline", "all", "none")
SMOKE_STEPS_DEFAULT = 500
TIMEOUT_DEFAULT_S = 1800.0
SMOKE_STEPS_CHECK = int_in("steps", 0, MAX_STEPS)
TIMEOUT_CHECK = number_in("timeout_s", 0.0, TIMEOUT_MAX_S, low_open=True)
REPEATS_CHECK = int_in("repeats", 1, REPEATS_MAX)

TOP_KEYS = (
    "name",
    "description",
    "device",
    "gpu_memory_gib",
    "card",
    "defaults",
    "matrix",
    "exclude",
    "include",
    "baseline",
    "plan",
    "cluster",
    "quality",
    "repeats",
)
DEFAULTS_EXTRA_KEYS = ("steps", "smoke", "timeout_s")


@dataclass(frozen=True)
class SuiteCell:
    """One point of the matrix: its spec (knobs + how it is measured) and how it is named."""

    spec: CellSpec
    cell_id: str
    cell_name: str
    timeout_s: float

    @property
    def config(self) -> dict[str, Any]:
        """The record's `config`: every knob, steps, smoke_steps, device and the emulated card."""
        return self.spec.record_config()

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
    quality: quality_spec.QualitySpec | None = None  # the `quality` section, on the cells it applies to
    overrides: dict[str, Any] = field(default_factory=dict)  # `key=value`s from the command line
    repeats: int = 1  # each cell this many times, each in a fresh process, round-robin (bench.repeats)


class _Validator:
    """Collects the file name so every error says where it is: file, key path, what is valid."""

    def __init__(self, path: str, origin: dict[str, str] | None = None):
        self.path = path
        self.origin = origin or {}  # keypath -> the command-line override that set it

    def fail(self, keypath: str, message: str) -> UserError:
        where = f" at `{keypath}`" if keypath else ""
        by = [
            text
            for key, text in self.origin.items()
            if keypath == key or keypath.startswith((f"{key}.", f"{key}["))
        ]
        if by:
            where += f" (set by the override `{shorten(by[0], quote=False)}`)"
        elif self.origin:
            message += (
                " (The suite was changed by the overrides "
                + ", ".join(f"`{shorten(t, quote=False)}`" for t in self.origin.values())
                + ".)"
            )
        return UserError(f"suite {self.path}{where}: {message}")

    def at(self, keypath: str):
        """A `fail(key, message)` for the keys of the mapping at `keypath`."""
        return lambda key, message: self.fail(_join(keypath, key) if key is not None else keypath, message)

    def mapping(self, keypath: str, value: Any) -> dict:
        if not isinstance(value, dict):
            raise self.fail(
                keypath, f"expected a mapping (key: value), got {type_name(value)} {shorten(value)}."
            )
        return value

    def check_keys(self, keypath: str, value: dict, valid: tuple[str, ...]) -> None:
        for key in value:
            if key not in valid:
                raise self.fail(_join(keypath, str(key)), _unknown(key, valid))

    def knob(self, keypath: str, name: Any, value: Any) -> Any:
        """The normalised value of knob `name` found at `keypath`."""
        if name not in FIELDS:
            raise self.fail(keypath, _unknown(name, tuple(FIELDS)))
        try:
            return check_knob(name, value)
        except InvalidValue as err:
            raise self.fail(keypath, f"{err}.") from None

    def number(self, keypath: str, value: Any, check) -> Any:
        try:
            return check(value)
        except InvalidValue as err:
            raise self.fail(keypath, f"{err}.") from None

    def partial_cell(self, keypath: str, value: Any) -> dict[str, Any]:
        value = self.mapping(keypath, value)
        return {key: self.knob(_join(keypath, str(key)), key, v) for key, v in value.items()}

    def partial_list(self, keypath: str, value: Any) -> list[dict[str, Any]]:
        if value is None:
            return []
        if not isinstance(value, list):
            raise self.fail(keypath, f"expected a list of partial cells, got {type_name(value)}.")
        return [self.partial_cell(f"{keypath}[{i}]", v) for i, v in enumerate(value)]


def _join(keypath: str, key: str) -> str:
    return f"{keypath}.{key}" if keypath else key


def _refuse_non_finite(v: _Validator, raw: Any) -> None:
    """NaN and inf are valid YAML (`.nan`, `.inf`) but never a valid setting: refuse them anywhere."""
    stack: list[tuple[str, Any]] = [("", raw)]
    while stack:
        keypath, value = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            raise v.fail(keypath, f"{value} is not a finite number; every number in a suite must be finite.")
        if isinstance(value, dict):
            stack.extend((_join(keypath, str(k)), x) for k, x in value.items())
        elif isinstance(value, list):
            stack.extend((f"{keypath}[{i}]", x) for i, x in enumerate(value))


def matches(config: dict[str, Any], partial: dict[str, Any]) -> bool:
    return all(config.get(k) == v for k, v in partial.items())


def load_suite(
    path: str | Path, overrides: list[str] | tuple[str, ...] = (), max_cells: int | None = None
) -> Suite:
    """Read and validate a suite (a file, or a shipped suite's name) with its `key=value` overrides;
    raise UserError naming the file, key or override on any mistake."""
    from ditbench.bench.catalog import resolve_suite
    from ditbench.bench.overrides import parse_overrides

    path = resolve_suite(path)
    parsed = parse_overrides(list(overrides), (*DEFAULTS_EXTRA_KEYS, *TOP_KEYS))
    return parse_suite(load_yaml_file(path, "suite"), str(path), parsed, max_cells)


def _emulation(v: _Validator, raw: dict) -> tuple[float | None, str | None]:
    """(budget in GiB, card name) from `gpu_memory_gib` or `card`; (None, None) for the real card."""
    if "gpu_memory_gib" in raw and "card" in raw:
        raise v.fail("card", "give either `card` or `gpu_memory_gib`, not both (a card has a fixed memory).")
    if raw.get("card") is not None:
        try:
            card = find_card(raw["card"])
        except UserError as err:
            raise v.fail("card", str(err)) from None
        return card.usable_gib, card.name
    if raw.get("gpu_memory_gib") is not None:
        try:
            return check_gib(raw["gpu_memory_gib"], "gpu_memory_gib"), None
        except UserError as err:
            raise v.fail("gpu_memory_gib", str(err)) from None
    return None, None


def _smoke(v: _Validator, defaults_raw: dict) -> tuple[int, Any]:
    smoke_raw = v.mapping("defaults.smoke", defaults_raw.get("smoke") or {})
    v.check_keys("defaults.smoke", smoke_raw, ("steps", "cells"))
    steps = v.number("defaults.smoke.steps", smoke_raw.get("steps", SMOKE_STEPS_DEFAULT), SMOKE_STEPS_CHECK)
    cells = smoke_raw.get("cells", "none")
    if isinstance(cells, list):
        cells = v.partial_list("defaults.smoke.cells", cells)
    elif cells not in SMOKE_CELLS:
        raise v.fail(
            "defaults.smoke.cells",
            f"expected one of {', '.join(SMOKE_CELLS)} or a list of partial cells, got {shorten(cells)}.",
        )
    return steps, cells


def _axes(v: _Validator, raw: dict) -> dict[str, list[Any]]:
    """matrix: knob -> list of values (a single value is a one-element list)."""
    if "matrix" not in raw:
        raise v.fail(
            "matrix", "a suite needs a `matrix` (e.g. `matrix: {model: [DiT-S/8], batch_size: [8, 16]}`)."
        )
    matrix_raw = v.mapping("matrix", raw["matrix"] if raw["matrix"] is not None else {})
    if not matrix_raw:
        raise v.fail(
            "matrix",
            "the matrix is empty; give at least one knob with a list of values, e.g. `batch_size: [8, 16]`.",
        )
    axes: dict[str, list[Any]] = {}
    for key, values in matrix_raw.items():
        if key not in FIELDS:
            raise v.fail(_join("matrix", str(key)), _unknown(key, tuple(FIELDS)))
        values = values if isinstance(values, list) else [values]
        if not values:
            raise v.fail(f"matrix.{key}", "an empty list leaves no cells; give at least one value.")
        axes[key] = [v.knob(f"matrix.{key}[{i}]", key, x) for i, x in enumerate(values)]
    return axes


def _quality(v: _Validator, raw: dict) -> tuple[quality_spec.QualitySpec | None, Any]:
    """(the quality section, which cells it applies to); (None, None) without one."""
    section = raw.get("quality")
    if section is None:
        return None, None
    fail = v.at("quality")
    spec = quality_spec.QualitySpec.from_mapping(section, fail)
    return spec, quality_spec.parse_cells(section.get("cells"), v.partial_list, fail)


def _smoke_steps(smoke_steps: int, smoke_cells: Any, knobs: dict, baseline: dict | None) -> int:
    if smoke_cells == "all":
        return smoke_steps
    if smoke_cells == "baseline":
        return smoke_steps if matches(knobs, baseline or {}) else 0
    if smoke_cells == "none":
        return 0
    return smoke_steps if any(matches(knobs, s) for s in smoke_cells) else 0


def parse_suite(
    raw: Any, path: str = "<suite>", overrides: list | None = None, max_cells: int | None = None
) -> Suite:
    from ditbench.bench.overrides import apply_overrides, as_record

    raw, origin = apply_overrides(raw, overrides or [], path, DEFAULTS_EXTRA_KEYS)
    v = _Validator(path, origin)
    if raw is None:
        raise v.fail("", "the file is empty; a suite needs at least `name` and `matrix`.")
    raw = v.mapping("", raw)
    v.check_keys("", raw, TOP_KEYS)
    _refuse_non_finite(v, raw)

    name = raw.get("name")
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}", name or ""):
        raise v.fail(
            "name",
            f"a suite needs a `name` made of letters, digits, `_`, `-`, `.` (it names the "
            f"output directory), got {shorten(name)}.",
        )
    description = raw.get("description", "") or ""
    if not isinstance(description, str):
        raise v.fail("description", f"expected text, got {type_name(description)}.")
    device = raw.get("device", "auto")
    if device not in DEVICE_CHOICES:
        raise v.fail("device", f"unknown device {shorten(device)}; valid: {', '.join(DEVICE_CHOICES)}.")
    budget, card = _emulation(v, raw)
    plan = parse_plan_option(raw.get("plan"), v.at("plan"))
    cluster = parse_cluster(raw.get("cluster"), v.at("cluster"))
    repeats = v.number("repeats", raw["repeats"], REPEATS_CHECK) if raw.get("repeats") is not None else 1

    # defaults: knobs plus steps / smoke / timeout_s
    defaults_raw = v.mapping("defaults", raw.get("defaults") or {})
    v.check_keys("defaults", defaults_raw, (*FIELDS, *DEFAULTS_EXTRA_KEYS))
    knobs = {k: v.knob(f"defaults.{k}", k, x) for k, x in defaults_raw.items() if k in FIELDS}
    steps = Steps.from_mapping(
        v.mapping("defaults.steps", defaults_raw.get("steps") or {}), v.at("defaults.steps")
    )
    smoke_steps, smoke_cells = _smoke(v, defaults_raw)
    timeout_s = v.number(
        "defaults.timeout_s", defaults_raw.get("timeout_s", TIMEOUT_DEFAULT_S), TIMEOUT_CHECK
    )
    axes = _axes(v, raw)
    exclude = v.partial_list("exclude", raw.get("exclude"))
    include = v.partial_list("include", raw.get("include"))
    baseline = v.partial_cell("baseline", raw["baseline"]) if raw.get("baseline") is not None else None
    quality, quality_cells = _quality(v, raw)
    if smoke_cells == "baseline" and smoke_steps > 0 and baseline is None:
        raise v.fail(
            "defaults.smoke.cells",
            "smoke cells are `baseline` but the suite has no `baseline`; add "
            "one (e.g. `baseline: {precision: fp32}`) or list the cells.",
        )

    # Expansion: cartesian product - excludes + includes (completed from the defaults), counted first.
    count = matrix_count(axes, len(include))
    too_many = over_cap(count, max_cells, "the matrix", factors(axes, len(include)))
    if too_many:
        raise v.fail("matrix", too_many)
    configs: list[tuple[str, dict[str, Any]]] = []
    for combo in itertools.product(*axes.values()):
        values = {**knobs, **dict(zip(axes, combo, strict=True))}
        if not any(matches(values, ex) for ex in exclude):
            configs.append(("matrix", values))
    configs += [(f"include[{i}]", {**knobs, **partial}) for i, partial in enumerate(include)]
    if not configs:
        raise v.fail("exclude", "every cell of the matrix is excluded; nothing would run.")

    # `auto` is resolved here, so a cell's id says where it ran: a CPU result never stands in for a GPU one
    resolved = device_type(device)
    if budget is not None and resolved != "cuda":
        raise v.fail(
            "card" if card else "gpu_memory_gib",
            f"emulating a card caps CUDA's allocator, but this suite runs on the {resolved} "
            f"(device: {device}); use device: cuda on a machine with a GPU, or remove it.",
        )
    full = [(where, Knobs.from_mapping(values, v.at(where))) for where, values in configs]
    varying = [k for k in FIELDS if len({json.dumps(getattr(c, k), sort_keys=True) for _, c in full}) > 1]
    cells: list[SuiteCell] = []
    seen: set[str] = set()
    for _, config in full:
        smoke = _smoke_steps(smoke_steps, smoke_cells, config.to_dict(), baseline)
        evaluated = quality is not None and quality_spec.applies(
            quality_cells, config.to_dict(), smoke, baseline
        )
        spec = CellSpec(config, resolved, steps, smoke, budget, card, quality if evaluated else None)
        cid = cell_id(spec)
        if cid in seen:  # an include repeating a matrix cell: run it once
            continue
        seen.add(cid)
        name_ = cell_name(spec.record_config(), varying)
        problem = quality.conflict(config, smoke) if evaluated else None
        if problem:
            raise v.fail("quality", f"cell {name_} cannot be evaluated: {problem}.")
        cells.append(SuiteCell(spec, cid, name_, timeout_s))
    if quality is not None and not any(c.spec.quality for c in cells):
        raise v.fail(
            "quality.cells",
            f"selects no cell ({shorten(quality_cells)}); the default `smoke` needs smoke cells "
            "(defaults.smoke.cells), or give `all`, `baseline` or a list of partial cells.",
        )
    return Suite(
        name,
        description,
        path,
        device,
        cells,
        baseline,
        budget,
        card,
        plan,
        cluster,
        quality,
        as_record(overrides or []),
        repeats,
    )


def cell_name(config: dict[str, Any], varying: list[str] | tuple[str, ...] = ()) -> str:
    """Readable name: the headline knobs, then any other knob that varies within the suite."""
    parts = [
        config["model"],
        config["precision"],
        f"ckpt={config['grad_ckpt']}",
        f"bs={config['batch_size']}",
    ]
    shown = {"model", "precision", "grad_ckpt", "batch_size"}
    always = ("grad_accum", "gpus", "nodes")  # how many images a step is: shown when more than one
    for key in varying:
        if key in shown or key in always:
            continue
        value = config[key]
        if key == "compile":
            parts.append("compile" if value else "eager")
        elif key == "image_size":
            parts.append(f"{value}px")
        else:
            parts.append(f"{key}={json.dumps(value) if isinstance(value, dict) else value}")
    for key in always:  # shown only when more than one, whether or not it varies
        if config.get(key, 1) > 1:
            parts.append(f"{key}={config[key]}")
    return " ".join(parts)
