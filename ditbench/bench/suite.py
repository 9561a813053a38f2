"""Suite files: load a YAML suite, validate every key before anything runs, expand it into cells.

A suite is `defaults` (one value per knob) x `matrix` (a list of values per knob), minus the
`exclude` partial cells, plus the `include` partial cells (completed from the defaults). Every
cell carries the full set of knobs, so a record says everything that shaped it, and a stable
`cell_id` (a short hash of that normalised config) lets a rerun recognise finished cells.
"""

from __future__ import annotations

import difflib
import hashlib
import itertools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ditbench.device import device_type
from ditbench.errors import UserError
from ditbench.yamlio import load_yaml_file

PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
GRAD_CKPT = ("none", "full")
DEVICES = ("cuda", "cpu", "auto")
IMPLS = ("ditbench", "diffusers")
STRATEGIES = ("ddp", "fsdp")
OPTIMIZERS = ("adamw",)
OPTIMIZER_IMPLS = ("auto", "fused", "foreach", "for-loop")  # AdamW kernels: fused is CUDA only
ATTENTION = ("sdpa",)
SMOKE_CELLS = ("baseline", "all", "none")
VAE_SCALE = 8  # the SD VAE downsamples by 8: a 256 px image is a 32x32 latent

# Knob -> built-in default. A suite's `defaults` overrides these; `matrix` varies them.
KNOB_DEFAULTS: dict[str, Any] = {
    "model": None,  # required: in defaults, matrix or every include
    "impl": "ditbench",
    "image_size": 256,
    "precision": "fp32",
    "grad_ckpt": "none",
    "batch_size": 32,
    "gpus": 1,
    "nodes": 1,
    "strategy": "ddp",
    "compile": False,
    "attention": "sdpa",
    "optimizer": "adamw",
    "optimizer_impl": "auto",
    "data": "synthetic",
    "seed": 0,
    "lr": 1e-4,
    "weight_decay": 0.0,
    "ema_decay": 0.9999,
    "num_classes": 1000,
}
# Settings that are not matrix knobs: how a cell is measured.
STEPS_DEFAULTS = {"warmup": 5, "measure": 20, "min_seconds": 5.0}
SMOKE_DEFAULTS: dict[str, Any] = {"steps": 500, "cells": "none"}
TIMEOUT_DEFAULT_S = 1800.0

TOP_KEYS = (
    "name",
    "description",
    "device",
    "gpu_memory_gb",
    "defaults",
    "matrix",
    "exclude",
    "include",
    "baseline",
)
DEFAULTS_EXTRA_KEYS = ("steps", "smoke", "timeout_s")


@dataclass(frozen=True)
class Cell:
    """One point of the matrix: every knob plus how it is measured."""

    config: dict[str, Any]  # the knobs, steps, smoke_steps, device, gpu_memory_gb (see README record)
    cell_id: str
    cell_name: str
    timeout_s: float

    @property
    def series_key(self) -> str:
        """The cell without its batch size: cells of one series differ only in batch."""
        rest = {
            k: v for k, v in self.config.items() if k not in ("batch_size", "global_batch", "smoke_steps")
        }
        return json.dumps(rest, sort_keys=True)


@dataclass
class Suite:
    name: str
    description: str
    path: str
    device: str
    gpu_memory_gb: float | None
    cells: list[Cell]
    baseline: dict[str, Any] | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)


def model_names() -> tuple[str, ...]:
    from ditbench.models.configs import MODEL_NAMES

    return tuple(MODEL_NAMES)


def patch_size(model: str) -> int:
    match = re.search(r"/(\d+)$", model)
    return int(match.group(1)) if match else 1


class _Validator:
    """Collects the file name so every error says where it is: file, key path, what is valid."""

    def __init__(self, path: str):
        self.path = path

    def fail(self, keypath: str, message: str) -> UserError:
        where = f" at `{keypath}`" if keypath else ""
        return UserError(f"suite {self.path}{where}: {message}")

    def unknown_key(self, keypath: str, key: Any, valid: tuple[str, ...] | list[str]) -> UserError:
        close = difflib.get_close_matches(str(key), list(valid), n=1, cutoff=0.5)
        hint = f" Did you mean `{close[0]}`?" if close else ""
        return self.fail(
            _join(keypath, str(key)), f"unknown key `{key}`.{hint} Valid keys here: {', '.join(valid)}."
        )

    def mapping(self, keypath: str, value: Any) -> dict:
        if not isinstance(value, dict):
            raise self.fail(keypath, f"expected a mapping (key: value), got {_type(value)} {value!r}.")
        return value

    def check_keys(self, keypath: str, value: dict, valid: tuple[str, ...] | list[str]) -> None:
        for key in value:
            if key not in valid:
                raise self.unknown_key(keypath, key, valid)

    def knob(self, keypath: str, name: str, value: Any) -> Any:
        """Validate one knob value; return it normalised (e.g. 16.0 -> 16 for integers)."""
        if name == "model":
            names = model_names()
            if not isinstance(value, str) or value not in names:
                close = difflib.get_close_matches(str(value), names, n=1, cutoff=0.6)
                hint = f" Did you mean `{close[0]}`?" if close else ""
                raise self.fail(keypath, f"unknown model {value!r}.{hint} Known models: {', '.join(names)}.")
            return value
        if name == "grad_ckpt":
            # YAML reads `no`/`yes` as booleans; every_K checkpoints every K-th block
            if isinstance(value, bool):
                value = "full" if value else "none"
            if value in GRAD_CKPT or (isinstance(value, str) and re.fullmatch(r"every_[1-9]\d*", value)):
                return value
            raise self.fail(
                keypath,
                f"unknown grad_ckpt {value!r}; valid: none, full, every_K (every K-th block, e.g. every_2).",
            )
        choices = {
            "precision": PRECISIONS,
            "impl": IMPLS,
            "strategy": STRATEGIES,
            "optimizer": OPTIMIZERS,
            "optimizer_impl": OPTIMIZER_IMPLS,
            "attention": ATTENTION,
        }
        if name in choices:
            if value not in choices[name]:
                raise self.fail(keypath, f"unknown {name} {value!r}; valid: {', '.join(choices[name])}.")
            return value
        if name in ("batch_size", "gpus", "nodes", "image_size", "num_classes"):
            if isinstance(value, bool) or not isinstance(value, int):
                raise self.fail(keypath, f"{name} must be a positive integer, got {_type(value)} {value!r}.")
            if value <= 0:
                raise self.fail(keypath, f"{name} must be a positive integer, got {value}.")
            if name == "image_size" and value % VAE_SCALE:
                raise self.fail(
                    keypath,
                    f"image_size must be a multiple of {VAE_SCALE} (the VAE's downsampling), got {value}.",
                )
            return value
        if name == "seed":
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise self.fail(keypath, f"seed must be a non-negative integer, got {value!r}.")
            return value
        if name == "compile":
            if not isinstance(value, bool):
                raise self.fail(keypath, f"compile must be true or false, got {_type(value)} {value!r}.")
            return value
        if name in ("lr", "weight_decay", "ema_decay"):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise self.fail(keypath, f"{name} must be a non-negative number, got {value!r}.")
            return float(value)
        if name == "data":
            return self.data(keypath, value)
        raise self.unknown_key(keypath.rsplit(".", 1)[0], name, tuple(KNOB_DEFAULTS))

    def data(self, keypath: str, value: Any) -> Any:
        if value == "synthetic":
            return value
        if isinstance(value, dict):
            self.check_keys(keypath, value, ("latents", "images", "vae"))
            if "latents" in value and "images" not in value and "vae" not in value:
                return {"latents": str(value["latents"])}
            if "images" in value and "latents" not in value:
                return {"images": str(value["images"]), "vae": str(value.get("vae", "random"))}
        raise self.fail(
            keypath,
            "data must be `synthetic`, {latents: PATH} or {images: PATH, vae: PATH|random}; "
            f"got {value!r}.",
        )

    def partial_cell(self, keypath: str, value: Any) -> dict[str, Any]:
        value = self.mapping(keypath, value)
        out = {}
        for key, v in value.items():
            if key not in KNOB_DEFAULTS:
                raise self.unknown_key(keypath, key, tuple(KNOB_DEFAULTS))
            out[key] = self.knob(_join(keypath, key), key, v)
        return out

    def partial_list(self, keypath: str, value: Any) -> list[dict[str, Any]]:
        if value is None:
            return []
        if not isinstance(value, list):
            raise self.fail(keypath, f"expected a list of partial cells, got {_type(value)}.")
        return [self.partial_cell(f"{keypath}[{i}]", v) for i, v in enumerate(value)]

    def int_at_least(self, keypath: str, value: Any, low: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise self.fail(keypath, f"expected an integer >= {low}, got {value!r}.")
        return value

    def number_at_least(self, keypath: str, value: Any, low: float, strict: bool = False) -> float:
        bad = isinstance(value, bool) or not isinstance(value, (int, float))
        if bad or value < low or (strict and value == low):
            rel = ">" if strict else ">="
            raise self.fail(keypath, f"expected a number {rel} {low}, got {value!r}.")
        return float(value)


def _join(keypath: str, key: str) -> str:
    return f"{keypath}.{key}" if keypath else key


def _type(value: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean", type(None): "nothing"}.get(
        type(value), f"a {type(value).__name__}"
    )


def matches(config: dict[str, Any], partial: dict[str, Any]) -> bool:
    return all(config.get(k) == v for k, v in partial.items())


def load_suite(path: str | Path) -> Suite:
    """Read and validate a suite file; raise UserError naming the file and key on any mistake."""
    path = Path(path)
    if not path.exists():
        raise UserError(
            f"suite file {path} does not exist (ready suites are in suites/, e.g. suites/cpu_smoke.yaml)."
        )
    return parse_suite(load_yaml_file(path, "suite"), str(path))


def parse_suite(raw: Any, path: str = "<suite>") -> Suite:
    v = _Validator(path)
    if raw is None:
        raise v.fail("", "the file is empty; a suite needs at least `name` and `matrix`.")
    raw = v.mapping("", raw)
    v.check_keys("", raw, TOP_KEYS)

    name = raw.get("name")
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name or ""):
        raise v.fail(
            "name",
            f"a suite needs a `name` made of letters, digits, `_`, `-`, `.` (it names the "
            f"output directory), got {name!r}.",
        )
    description = raw.get("description", "") or ""
    if not isinstance(description, str):
        raise v.fail("description", f"expected text, got {_type(description)}.")
    device = raw.get("device", "auto")
    if device not in DEVICES:
        raise v.fail("device", f"unknown device {device!r}; valid: {', '.join(DEVICES)}.")
    gpu_memory_gb = raw.get("gpu_memory_gb")
    if gpu_memory_gb is not None:
        gpu_memory_gb = v.number_at_least("gpu_memory_gb", gpu_memory_gb, 0, strict=True)

    # defaults: knobs plus steps / smoke / timeout_s
    defaults_raw = v.mapping("defaults", raw.get("defaults") or {})
    v.check_keys("defaults", defaults_raw, tuple(KNOB_DEFAULTS) + DEFAULTS_EXTRA_KEYS)
    knobs = dict(KNOB_DEFAULTS)
    for key, value in defaults_raw.items():
        if key in KNOB_DEFAULTS:
            knobs[key] = v.knob(f"defaults.{key}", key, value)
    steps = dict(STEPS_DEFAULTS)
    steps_raw = v.mapping("defaults.steps", defaults_raw.get("steps") or {})
    v.check_keys("defaults.steps", steps_raw, tuple(STEPS_DEFAULTS))
    if "warmup" in steps_raw:
        steps["warmup"] = v.int_at_least("defaults.steps.warmup", steps_raw["warmup"], 0)
    if "measure" in steps_raw:
        steps["measure"] = v.int_at_least("defaults.steps.measure", steps_raw["measure"], 1)
    if "min_seconds" in steps_raw:
        steps["min_seconds"] = v.number_at_least("defaults.steps.min_seconds", steps_raw["min_seconds"], 0)
    smoke_raw = v.mapping("defaults.smoke", defaults_raw.get("smoke") or {})
    v.check_keys("defaults.smoke", smoke_raw, tuple(SMOKE_DEFAULTS))
    smoke_steps = v.int_at_least("defaults.smoke.steps", smoke_raw.get("steps", SMOKE_DEFAULTS["steps"]), 0)
    smoke_cells = smoke_raw.get("cells", SMOKE_DEFAULTS["cells"])
    if isinstance(smoke_cells, list):
        smoke_cells = v.partial_list("defaults.smoke.cells", smoke_cells)
    elif smoke_cells not in SMOKE_CELLS:
        raise v.fail(
            "defaults.smoke.cells",
            f"expected one of {', '.join(SMOKE_CELLS)} or a list of partial cells, got {smoke_cells!r}.",
        )
    timeout_s = v.number_at_least(
        "defaults.timeout_s", defaults_raw.get("timeout_s", TIMEOUT_DEFAULT_S), 0, strict=True
    )

    # matrix: knob -> list of values (a single value is a one-element list)
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
        if key not in KNOB_DEFAULTS:
            raise v.unknown_key("matrix", key, tuple(KNOB_DEFAULTS))
        if not isinstance(values, list):
            values = [values]
        if not values:
            raise v.fail(f"matrix.{key}", "an empty list leaves no cells; give at least one value.")
        axes[key] = [v.knob(f"matrix.{key}[{i}]", key, x) for i, x in enumerate(values)]

    exclude = v.partial_list("exclude", raw.get("exclude"))
    include = v.partial_list("include", raw.get("include"))
    baseline = v.partial_cell("baseline", raw["baseline"]) if raw.get("baseline") is not None else None
    if smoke_cells == "baseline" and smoke_steps > 0 and baseline is None:
        raise v.fail(
            "defaults.smoke.cells",
            "smoke cells are `baseline` but the suite has no `baseline`; add "
            "one (e.g. `baseline: {precision: fp32}`) or list the cells.",
        )

    # Expansion: cartesian product - excludes + includes (completed from the defaults).
    configs: list[tuple[str, dict[str, Any]]] = []
    for combo in itertools.product(*axes.values()):
        knob_values = {**knobs, **dict(zip(axes, combo, strict=True))}
        if not any(matches(knob_values, ex) for ex in exclude):
            configs.append(("matrix", knob_values))
    for i, partial in enumerate(include):
        configs.append((f"include[{i}]", {**knobs, **partial}))
    if not configs:
        raise v.fail("exclude", "every cell of the matrix is excluded; nothing would run.")

    # `auto` is resolved here, so a cell's id says where it ran: a CPU result never stands in for a GPU one
    resolved_device = device_type(device)
    varying = [k for k in KNOB_DEFAULTS if len({json.dumps(c[k], sort_keys=True) for _, c in configs}) > 1]
    cells: list[Cell] = []
    seen: dict[str, str] = {}
    for where, knob_values in configs:
        if knob_values["model"] is None:
            raise v.fail(
                where,
                "no model given; set `defaults.model` or `matrix.model` (known models: "
                f"{', '.join(model_names())}).",
            )
        latent = knob_values["image_size"] // VAE_SCALE
        p = patch_size(knob_values["model"])
        if latent % p:
            raise v.fail(
                where,
                f"{knob_values['model']} has patch size {p}, which does not divide the "
                f"{latent}x{latent} latent of image_size {knob_values['image_size']}; use an "
                f"image_size that is a multiple of {VAE_SCALE * p}.",
            )
        if smoke_cells == "all":
            smoke = smoke_steps
        elif smoke_cells == "baseline":
            smoke = smoke_steps if matches(knob_values, baseline or {}) else 0
        elif smoke_cells == "none":
            smoke = 0
        else:
            smoke = smoke_steps if any(matches(knob_values, s) for s in smoke_cells) else 0
        config = {
            **knob_values,
            "global_batch": knob_values["batch_size"] * knob_values["gpus"] * knob_values["nodes"],
            "steps": dict(steps),
            "smoke_steps": smoke,
            "device": resolved_device,
            "gpu_memory_gb": gpu_memory_gb,
        }
        cid = cell_id(config)
        if cid in seen:  # an include repeating a matrix cell: run it once
            continue
        seen[cid] = where
        cells.append(
            Cell(config=config, cell_id=cid, cell_name=cell_name(config, varying), timeout_s=timeout_s)
        )
    return Suite(
        name=name,
        description=description,
        path=path,
        device=device,
        gpu_memory_gb=gpu_memory_gb,
        cells=cells,
        baseline=baseline,
        raw=raw,
    )


def cell_id(config: dict[str, Any]) -> str:
    """Short stable hash of the normalised config (key order and int/float spelling do not matter)."""
    text = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def cell_name(config: dict[str, Any], varying: list[str] | tuple[str, ...] = ()) -> str:
    """Readable name: the headline knobs, then any other knob that varies within the suite."""
    parts = [
        config["model"],
        config["precision"],
        f"ckpt={config['grad_ckpt']}",
        f"bs={config['batch_size']}",
    ]
    shown = {"model", "precision", "grad_ckpt", "batch_size"}
    for key in varying:
        if key in shown or key in ("gpus", "nodes"):
            continue
        value = config[key]
        if key == "compile":
            parts.append("compile" if value else "eager")
        elif key == "image_size":
            parts.append(f"{value}px")
        else:
            parts.append(f"{key}={json.dumps(value) if isinstance(value, dict) else value}")
    for key in ("gpus", "nodes"):  # shown only when more than one, whether or not it varies
        if config[key] > 1:
            parts.append(f"{key}={config[key]}")
    return " ".join(parts)
