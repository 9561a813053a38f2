"""Every knob of a training cell in one model: name, type, default, bounds, help, and the combinations
that cannot run.

`Knobs` holds one normalised value of each (`grad_ckpt: on` and `full` are one cell); `PartialKnobs`
some of them (`include`, `exclude`, `baseline`, a claim's selector). Adding a knob: a field here and the
Trainer line that applies it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, WithJsonSchema, model_validator

from ditbench.core.errors import UserError, shorten
from ditbench.core.validation import refuse, rule
from ditbench.hardware.precision import PRECISIONS
from ditbench.models.configs import (
    ATTENTION_BACKENDS,
    GRAD_CKPT_EVERY,
    GRAD_CKPT_OFF,
    GRAD_CKPT_ON,
    IMPLS,
    MODEL_NAMES,
    canonical_name,
    get_config,
    grad_ckpt_name,
    impl_problem,
    latent_size,
)
from ditbench.spec.base import Choice, Flag, Int, Real, SpecModel, checked_by

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
MAX_THREADS = 4096
PROCESS_KNOBS = ("gpus", "nodes", "strategy", "threads")  # how the cell's processes start
THREADS_HELP = (
    "torch threads per process: an integer, or auto (torch's own choice: OMP_NUM_THREADS if set, else "
    "all cores for one process and the per-rank share of the cores for torchrun/srun ranks); unset: 1 on "
    "a CPU cell (steady and comparable on a shared machine), torch's default on a CUDA cell"
)
COLOURS = ("grey", "rgb")  # how pixel data fills the latent (ditbench.models.pixels)
DATA_HELP = (
    "`synthetic`, {latents: PATH}, {images: PATH, vae: PATH|ema|mse|random} or "
    "{pixels: NPZ|builtin:NAME, colour: grey|rgb}"
)


def _path(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > 4096:
        raise refuse(f"data.{what} must be a path, got {shorten(value)}")
    return value


def _data(value: Any) -> Any:
    if value == "synthetic":
        return value
    if isinstance(value, dict):
        keys = set(value)
        if keys == {"latents"}:
            return {"latents": _path(value["latents"], "latents")}
        if "pixels" in keys and keys <= {"pixels", "colour"}:
            colour = value.get("colour", "grey")
            if colour not in COLOURS:
                raise refuse(f"data.colour must be grey or rgb, got {shorten(colour)}")
            out = {"pixels": _path(value["pixels"], "pixels")}
            return out if colour == "grey" else {**out, "colour": colour}  # grey: the id it always had
        if "images" in keys and keys <= {"images", "vae"}:
            return {
                "images": _path(value["images"], "images"),
                "vae": _path(value.get("vae", "random"), "vae"),
            }
    raise refuse(f"data must be {DATA_HELP}; got {shorten(value)}")


def _paths(*keys: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    path = {"type": "string", "minLength": 1, "maxLength": 4096}
    props = {**dict.fromkeys(keys, path), **(extra or {})}
    return {"type": "object", "properties": props, "required": [keys[0]], "additionalProperties": False}


Model = Annotated[  # DiT-XL-2: the file spelling
    Literal[(*MODEL_NAMES, *(n.replace("/", "-") for n in MODEL_NAMES))] | None,
    checked_by(lambda v: v if v is None else canonical_name(v if isinstance(v, str) else repr(v))),
]
GradCkpt = Annotated[
    str,
    checked_by(lambda v: grad_ckpt_name(v if isinstance(v, (str, bool)) else repr(v))),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "boolean"},
                {"enum": [*GRAD_CKPT_OFF, *GRAD_CKPT_ON]},
                {"pattern": f"^{GRAD_CKPT_EVERY}$"},
            ]
        }
    ),
]
Threads = Annotated[
    Annotated[int, Field(strict=True, ge=1, le=MAX_THREADS)] | Literal["auto"] | None,
    rule(f"threads must be an integer from 1 to {MAX_THREADS:,} or auto, got {{got}}"),
]
Data = Annotated[
    Any,
    checked_by(_data),
    WithJsonSchema(
        {
            "anyOf": [
                {"const": "synthetic"},
                _paths("latents"),
                _paths("pixels", extra={"colour": {"enum": list(COLOURS)}}),
                _paths("images", "vae"),
            ]
        }
    ),
]


class PartialKnobs(SpecModel):
    """Some knobs of a cell (a partial cell), each checked alone; the others at their defaults."""

    model: Model = Field(None, description="DiT configuration, e.g. DiT-XL/2")  # no default: a suite names it
    impl: Choice(*IMPLS) = Field("ditbench", description="ditbench's DiT or diffusers' DiTTransformer2DModel")
    image_size: Int(1, MAX_IMAGE_SIZE) = Field(256, description="image side in pixels")
    precision: Choice(*PRECISIONS) = Field("fp32", description=", ".join(PRECISIONS))
    grad_ckpt: GradCkpt = Field("none", description="none, full or every_K")
    batch_size: Int(1, MAX_BATCH_SIZE) = Field(32, description="images per GPU per micro-batch")
    grad_accum: Int(1, MAX_GRAD_ACCUM) = Field(
        1, description="micro-batches per optimizer step (gradient accumulation)"
    )
    gpus: Int(1, MAX_PROCESSES) = Field(1, description="processes per node")
    nodes: Int(1, MAX_PROCESSES) = Field(1, description="machines")
    strategy: Choice(*STRATEGIES) = Field("ddp", description="data parallelism")
    # set in the cell's process before the trainer is built (bench/cell/threads.py)
    threads: Threads = Field(None, description=THREADS_HELP)
    compile: Flag = Field(False, description="torch.compile the model")
    compile_mode: Choice(*COMPILE_MODES) = Field(
        "default", description="torch.compile mode (with compile: true)"
    )
    attention: Choice(*ATTENTION_BACKENDS) = Field(
        "sdpa", description="math, sdpa (torch picks), or a forced flash|efficient|cudnn"
    )
    optimizer: Choice(*OPTIMIZERS) = Field("adamw", description="the optimizer")
    optimizer_impl: Choice(*OPTIMIZER_IMPLS) = Field("auto", description="AdamW kernel")
    zero_grad: Choice(*ZERO_GRAD_ORDERS) = Field(
        "before_forward",
        description="free the previous gradients before the forward, or after it (official train.py's order)",
    )
    data: Data = Field("synthetic", description=DATA_HELP)
    seed: Int(0, SEED_MAX) = Field(0, description="model init, timesteps, noise and data")
    lr: Real(0.0, 1.0, low_open=True) = Field(1e-4, description="AdamW learning rate")
    weight_decay: Real(0.0, 1.0) = Field(0.0, description="AdamW weight decay")
    ema_decay: Real(0.0, 1.0, high_open=True) = Field(0.9999, description="EMA decay")
    num_classes: Int(1, MAX_CLASSES) = Field(1000, description="class labels")

    def given(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.model_fields_set}


class Knobs(PartialKnobs):
    """One value of every knob, validated and normalised as it is built (UserError otherwise)."""

    @model_validator(mode="after")
    def _runnable(self) -> Knobs:
        if self.model is None:
            raise refuse(f"no model given; valid models are {', '.join(MODEL_NAMES)}.")
        if problem := self.conflict():
            raise refuse(problem)
        return self

    def conflict(self) -> str | None:
        """What makes this combination of valid values unrunnable anywhere, or None."""
        try:
            latent_size(self.image_size, get_config(self.model).patch_size)
        except UserError as err:
            return f"{self.model}: {err}"
        if self.strategy != KNOB_DEFAULTS["strategy"] and self.gpus * self.nodes == 1:
            return f"strategy {self.strategy} shards across processes; it needs gpus x nodes > 1"
        if self.compile_mode != KNOB_DEFAULTS["compile_mode"] and not self.compile:
            return f"compile_mode {self.compile_mode} shapes a compiled model only; set compile: true with it"
        return impl_problem(self.impl, self.grad_ckpt)

    @property
    def rank_batch(self) -> int:
        return self.batch_size * self.grad_accum

    @property
    def global_batch(self) -> int:
        return self.rank_batch * self.gpus * self.nodes

    def non_defaults(self) -> dict[str, Any]:
        """The knobs set to something else than their default: what identifies the cell."""
        return {k: v for k, v in self if v != KNOB_DEFAULTS[k]}

    def train_knobs(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in TRAIN_KNOBS}


KNOB_DEFAULTS: dict[str, Any] = {name: f.default for name, f in PartialKnobs.model_fields.items()}
KNOBS = tuple(KNOB_DEFAULTS)
TRAIN_KNOBS = tuple(k for k in KNOBS if k not in PROCESS_KNOBS)


def Cells(*names: str) -> Any:  # noqa: N802 - a type
    """One of `names`, or a list of partial cells (which cells a setting applies to)."""
    valid = f"expected one of {', '.join(names)} or a list of partial cells, got {{value}}"
    return Annotated[
        Annotated[Literal[names], rule(valid), Tag("")] | Annotated[list[PartialKnobs], Tag(" ")],
        Discriminator(lambda v: " " if isinstance(v, list) else ""),  # blank tags: no key in a message
    ]


def matches(knobs: dict[str, Any], partial: dict[str, Any]) -> bool:
    return all(knobs.get(k) == v for k, v in partial.items())


def selects(cells: Any, knobs: dict[str, Any], baseline: dict | None) -> bool:
    """Whether a Cells value (`all`, `none`, `baseline` or partial cells) names this cell (its knobs)."""
    if cells in ("all", "none"):
        return cells == "all"
    partials = [baseline or {}] if cells == "baseline" else [p.given() for p in cells]
    return any(matches(knobs, p) for p in partials)
