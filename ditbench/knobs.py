"""Every knob of a training cell in one table: name, type, default, validation, and where it goes.

A knob is a setting that shapes a training run and may be a suite's matrix axis. `Knobs` holds
one value of each, validated and normalised when it is built (so `grad_ckpt: on` and `full` are one
cell): a suite, an override, `ditbench train`'s flags and a record read back all build one, and
every layer (the Trainer, the planner, the runners, the quality loop) takes it as it is. Knobs
marked `train` are `ditbench train` flags; the others (`gpus`, `nodes`, `strategy`, `threads`) shape how the
cell's processes start.

Adding a knob: a field here (default, check, help) and the code that uses it (for a training knob,
the line of the Trainer that applies it; the planner traces the Trainer, so it follows).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ditbench import vae
from ditbench.errors import UserError, shorten, type_name
from ditbench.models.configs import (
    ATTENTION_BACKENDS,
    GRAD_CKPT_OFF,
    GRAD_CKPT_ON,
    IMPLS,
    MODEL_NAMES,
    canonical_name,
    get_config,
    grad_ckpt_name,
)
from ditbench.precision import PRECISIONS, check_precision

STRATEGIES = ("ddp", "fsdp")
# torch.compile's modes ("default" = mode None); the -no-cudagraphs one autotunes the matmul and
# attention kernels without capturing CUDA graphs, which a training step with an optimizer needs.
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
MAX_GRAD_ACCUM = 4096
OPTIMIZERS = ("adamw",)
OPTIMIZER_IMPLS = ("auto", "fused", "foreach", "for-loop")  # AdamW kernels; auto: train.optim.AUTO_IMPL
# When a step frees the previous step's gradients: before its forward (ditbench's default: they are
# gone while activations pile up) or after it, as the official DiT train.py does (held through it).
ZERO_GRAD_ORDERS = ("before_forward", "after_forward")
SEED_MAX = 2**63 - 1  # torch.manual_seed takes a signed 64-bit integer
# Bounds far above any real cell, so that a typo (an extra zero) is an error and not an allocation.
MAX_BATCH_SIZE = 1 << 20
MAX_IMAGE_SIZE = 8192
MAX_PROCESSES = 4096  # gpus per node, and nodes
MAX_CLASSES = 1 << 20
MAX_PATH_CHARS = 4096  # PATH_MAX on Linux
MAX_THREADS = 4096
THREADS_HELP = (
    "torch threads per process: an integer, or auto (torch's own choice: OMP_NUM_THREADS if set, else "
    "all cores for one process and the per-rank share of the cores for torchrun/srun ranks); unset: 1 on "
    "a CPU cell (steady and comparable on a shared machine), torch's default on a CUDA cell"
)


class InvalidValue(ValueError):
    """A knob value that is not valid; the message names the knob and says what would be."""


def with_schema(check: Callable[[Any], Any], schema: dict[str, Any]) -> Callable[[Any], Any]:
    """`check` carrying the JSON Schema of the values it accepts (read by `ditbench suites --schema`)."""
    check.schema = schema  # type: ignore[attr-defined]
    return check


def int_in(name: str, low: int, high: int) -> Callable[[Any], int]:
    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidValue(f"{name} must be an integer, got {type_name(value)} {shorten(value)}")
        if not low <= value <= high:
            raise InvalidValue(f"{name} must be an integer from {low} to {high:,}, got {shorten(value)}")
        return value

    return with_schema(check, {"type": "integer", "minimum": low, "maximum": high})


def number_in(name: str, low: float, high: float, *, low_open: bool = False, high_open: bool = False):
    def check(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InvalidValue(f"{name} must be a number, got {type_name(value)} {shorten(value)}")
        bad_low = value <= low if low_open else value < low
        bad_high = value >= high if high_open else value > high
        if not math.isfinite(value) or bad_low or bad_high:
            span = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
            raise InvalidValue(f"{name} must be a finite number in {span}, got {shorten(value)}")
        return float(value)

    bounds = {
        "exclusiveMinimum" if low_open else "minimum": low,
        "exclusiveMaximum" if high_open else "maximum": high,
    }
    return with_schema(check, {"type": "number", **bounds})


def one_of(name: str, choices: tuple[str, ...]) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if not isinstance(value, str) or value not in choices:
            raise InvalidValue(f"unknown {name} {shorten(value)}; valid: {', '.join(choices)}")
        return value

    return with_schema(check, {"enum": list(choices)})


def _check_bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise InvalidValue(f"compile must be true or false, got {type_name(value)} {shorten(value)}")
    return value


with_schema(_check_bool, {"type": "boolean"})


def _check_model(value: Any) -> str:
    try:
        return canonical_name(value) if isinstance(value, str) else canonical_name(repr(value))
    except UserError as err:
        raise InvalidValue(str(err)) from None


# the official checkpoints' file spelling (DiT-XL-2) is taken too
with_schema(_check_model, {"enum": [*MODEL_NAMES, *(n.replace("/", "-") for n in MODEL_NAMES)]})


def _check_precision(value: Any) -> str:
    try:
        return check_precision(value)
    except UserError as err:
        raise InvalidValue(str(err)) from None


with_schema(_check_precision, {"enum": list(PRECISIONS)})


def _check_grad_ckpt(value: Any) -> str:
    if not isinstance(value, (str, bool)):
        value = repr(value)  # numbers and lists are refused by the grammar below, with the value shown
    try:
        return grad_ckpt_name(value)
    except UserError as err:
        raise InvalidValue(str(err)) from None


with_schema(
    _check_grad_ckpt,
    {
        "anyOf": [
            {"type": "boolean"},
            {"enum": [*GRAD_CKPT_OFF, *GRAD_CKPT_ON]},
            {"type": "string", "pattern": "^every_[1-9][0-9]{0,3}$"},
        ]
    },
)


def _check_threads(value: Any) -> int | str | None:
    if value is None or value == "auto":
        return value
    valid = f"threads must be an integer from 1 to {MAX_THREADS:,} or auto"
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidValue(f"{valid}, got {type_name(value)} {shorten(value)}")
    if not 1 <= value <= MAX_THREADS:
        raise InvalidValue(f"{valid}, got {value}")
    return value


with_schema(
    _check_threads,
    {
        "anyOf": [
            {"type": "integer", "minimum": 1, "maximum": MAX_THREADS},
            {"const": "auto"},
            {"type": "null"},
        ]
    },
)


def _path(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_PATH_CHARS:
        raise InvalidValue(f"data.{what} must be a path, got {type_name(value)} {shorten(value)}")
    return value


DATA_HELP = (
    "`synthetic`, {latents: PATH}, {images: PATH, vae: PATH|ema|mse|random} or "
    "{pixels: NPZ|builtin:NAME, colour: grey|rgb}"
)


def _check_data(value: Any) -> Any:
    if value == "synthetic":
        return value
    if isinstance(value, dict):
        keys = set(value)
        if keys == {"latents"}:
            return {"latents": _path(value["latents"], "latents")}
        if "pixels" in keys and keys <= {"pixels", "colour"}:
            colour = value.get("colour", "grey")
            if colour not in ("grey", "rgb"):
                raise InvalidValue(f"data.colour must be grey or rgb, got {shorten(colour)}")
            out = {"pixels": _path(value["pixels"], "pixels")}
            return out if colour == "grey" else {**out, "colour": colour}  # grey: the id it always had
        if "images" in keys and keys <= {"images", "vae"}:
            return {
                "images": _path(value["images"], "images"),
                "vae": _path(value.get("vae", "random"), "vae"),
            }
    raise InvalidValue(f"data must be {DATA_HELP}; got {shorten(value)}")


def _paths(*keys: str, required: int = 1, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    path = {"type": "string", "minLength": 1, "maxLength": MAX_PATH_CHARS}
    props = {**dict.fromkeys(keys, path), **(extra or {})}
    return {
        "type": "object",
        "properties": props,
        "required": list(keys[:required]),
        "additionalProperties": False,
    }


with_schema(
    _check_data,
    {
        "anyOf": [
            {"const": "synthetic"},
            _paths("latents"),
            _paths("pixels", extra={"colour": {"enum": ["grey", "rgb"]}}),
            _paths("images", "vae"),
        ]
    },
)


def knob(default: Any, check: Callable[[Any], Any], help: str, train: bool = True) -> Any:
    return field(default=default, metadata={"check": check, "help": help, "train": train})


class InvalidKnobs(UserError):
    """Knobs that cannot be built; `key` names the knob at fault (None: the combination)."""

    def __init__(self, key: str | None, message: str):
        super().__init__(message)
        self.key = key


@dataclass(frozen=True)
class Knobs:
    """One value of every knob, validated and normalised as it is built (InvalidKnobs otherwise).

    `Knobs(model="DiT-S/8", batch_size=8)` from code; `Knobs.from_mapping` from a file's mapping.
    """

    model: str = knob(None, _check_model, "DiT configuration, e.g. DiT-XL/2")  # no default: a suite names it
    impl: str = knob("ditbench", one_of("impl", IMPLS), "ditbench's DiT or diffusers' DiTTransformer2DModel")
    image_size: int = knob(256, int_in("image_size", 1, MAX_IMAGE_SIZE), "image side in pixels")
    precision: str = knob("fp32", _check_precision, "fp32, tf32, fp16 or bf16")
    grad_ckpt: str = knob("none", _check_grad_ckpt, "none, full or every_K")
    batch_size: int = knob(32, int_in("batch_size", 1, MAX_BATCH_SIZE), "images per GPU per micro-batch")
    grad_accum: int = knob(
        1, int_in("grad_accum", 1, MAX_GRAD_ACCUM), "micro-batches per optimizer step (gradient accumulation)"
    )
    gpus: int = knob(1, int_in("gpus", 1, MAX_PROCESSES), "processes per node", train=False)
    nodes: int = knob(1, int_in("nodes", 1, MAX_PROCESSES), "machines", train=False)
    strategy: str = knob("ddp", one_of("strategy", STRATEGIES), "data parallelism", train=False)
    # set in the cell's process before the trainer is built (ditbench.bench.threads)
    threads: int | str | None = knob(None, _check_threads, THREADS_HELP, train=False)
    compile: bool = knob(False, _check_bool, "torch.compile the model")
    compile_mode: str = knob(
        "default", one_of("compile_mode", COMPILE_MODES), "torch.compile mode (with compile: true)"
    )
    attention: str = knob(
        "sdpa",
        one_of("attention", ATTENTION_BACKENDS),
        "math, sdpa (torch picks), or a forced flash|efficient|cudnn",
    )
    optimizer: str = knob("adamw", one_of("optimizer", OPTIMIZERS), "the optimizer")
    optimizer_impl: str = knob("auto", one_of("optimizer_impl", OPTIMIZER_IMPLS), "AdamW kernel")
    zero_grad: str = knob(
        "before_forward",
        one_of("zero_grad", ZERO_GRAD_ORDERS),
        "free the previous gradients before the forward, or after it (the official train.py's order)",
    )
    data: Any = knob("synthetic", _check_data, DATA_HELP)
    seed: int = knob(0, int_in("seed", 0, SEED_MAX), "model init, timesteps, noise and data")
    lr: float = knob(1e-4, number_in("lr", 0.0, 1.0, low_open=True), "AdamW learning rate")
    weight_decay: float = knob(0.0, number_in("weight_decay", 0.0, 1.0), "AdamW weight decay")
    ema_decay: float = knob(0.9999, number_in("ema_decay", 0.0, 1.0, high_open=True), "EMA decay")
    num_classes: int = knob(1000, int_in("num_classes", 1, MAX_CLASSES), "class labels")

    def __post_init__(self) -> None:
        for name, spec in FIELDS.items():
            value = getattr(self, name)
            if name == "model" and value is None:
                raise InvalidKnobs(None, f"no model given; valid models are {', '.join(MODEL_NAMES)}.")
            try:
                object.__setattr__(self, name, spec.metadata["check"](value))
            except InvalidValue as err:
                raise InvalidKnobs(name, str(err)) from None
        problem = self.conflict()
        if problem:
            raise InvalidKnobs(None, problem)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], fail: Fail | None = None) -> Knobs:
        """Knobs from a file's mapping; knobs left out take their defaults.

        fail(key, message) -> Exception builds the error (a suite adds its file and key path);
        by default the message alone, as a UserError. `key` is None for the whole mapping.
        """
        fail = fail or _plain_failure
        for key in values:
            if key not in FIELDS:
                raise fail(key, unknown_key_message(key, tuple(FIELDS)))
        try:
            return cls(**values)
        except InvalidKnobs as err:
            raise fail(err.key, str(err)) from None

    def replace(self, **changes: Any) -> Knobs:
        """These knobs with `changes` (validated like any other)."""
        return dataclasses.replace(self, **changes)

    def conflict(self) -> str | None:
        """What makes this combination of valid values unrunnable anywhere, or None."""
        patch = get_config(self.model).patch_size
        step = vae.DOWNSAMPLE * patch
        if self.image_size % step:
            return (
                f"{self.model} has patch size {patch} and the VAE downsamples by {vae.DOWNSAMPLE}, so its "
                f"image_size must be a multiple of {step} (the latent must tile into patches); got "
                f"{self.image_size}"
            )
        if self.strategy != KNOB_DEFAULTS["strategy"] and self.gpus * self.nodes == 1:
            return f"strategy {self.strategy} shards across processes; it needs gpus x nodes > 1"
        if self.compile_mode != KNOB_DEFAULTS["compile_mode"] and not self.compile:
            return f"compile_mode {self.compile_mode} shapes a compiled model only; set compile: true with it"
        if self.impl == "diffusers" and self.grad_ckpt.startswith("every_"):
            return (
                f"grad_ckpt {self.grad_ckpt} is not available with impl diffusers, which checkpoints every "
                "block or none; use grad_ckpt full or none, or impl ditbench"
            )
        return None

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def non_defaults(self) -> dict[str, Any]:
        """The knobs set to something else than their default: what identifies the cell."""
        return {k: v for k, v in self.to_dict().items() if v != KNOB_DEFAULTS[k]}

    def train_knobs(self) -> dict[str, Any]:
        """The knobs one training process applies (`ditbench train`'s flags), by name."""
        return {k: getattr(self, k) for k in TRAIN_KNOBS}


FIELDS = {f.name: f for f in dataclasses.fields(Knobs)}
KNOB_DEFAULTS: dict[str, Any] = {name: f.default for name, f in FIELDS.items()}
TRAIN_KNOBS = tuple(name for name, f in FIELDS.items() if f.metadata["train"])


Fail = Callable[[Any, str], Exception]


def _plain_failure(key: Any, message: str) -> Exception:
    return UserError(message)


def unknown_key_message(key: Any, valid: tuple[str, ...] | list[str]) -> str:
    close = difflib.get_close_matches(str(key), list(valid), n=1, cutoff=0.5)
    hint = f" Did you mean `{close[0]}`?" if close else ""
    return f"unknown key `{shorten(key, quote=False)}`.{hint} Valid keys here: {', '.join(valid)}."


def check_knob(name: str, value: Any) -> Any:
    """The normalised value of knob `name`; InvalidValue (naming the knob) when it is not valid."""
    return FIELDS[name].metadata["check"](value)
