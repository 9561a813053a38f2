"""The suite's `quality:` section (docs/suites-and-knobs.md): what to score, how to sample, when, with
which seeds, for which cells. It is part of a cell's id (a changed section reruns its cells); `Sampler`
is also `ditbench sample`'s settings: one set of bounds for both.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Field, field_serializer, model_validator

from ditbench.errors import shorten
from ditbench.precision import PRECISIONS
from ditbench.spec.base import Choice, Int, Real, SpecModel, Text, required
from ditbench.spec.knobs import SEED_MAX, Cells, Knobs, selects
from ditbench.validation import refuse

SMOKE_END = "smoke_end"
SAMPLERS = ("ddpm", "ddim")
MAX_SAMPLES = 10**7
MAX_SEEDS = 64
MAX_GRID = 256
MAX_SAMPLING_STEPS = 1000  # the diffusion's steps (diffusion.NUM_TIMESTEPS); sampling respaces them
MAX_CFG_SCALE = 100.0
MAX_SAMPLE_BATCH = 1 << 16
MAX_TRAIN_STEPS = 10**7
MAX_EVALUATIONS = 10_000  # quality evaluations (steps x seeds) of one cell


class Sampler(SpecModel):
    name: Choice(*SAMPLERS) = "ddpm"
    steps: Int(1, MAX_SAMPLING_STEPS) = 250
    cfg_scale: Real(1.0, MAX_CFG_SCALE) = 1.5  # 1: no guidance
    precision: Choice(*PRECISIONS) = "fp32"  # of sampling; the Inception network always runs in fp32


def _at(value: Any) -> Any:
    if value == SMOKE_END or value == [SMOKE_END]:
        return None
    if not isinstance(value, (list, tuple)) or not value:  # a list in a file, a tuple from code
        raise refuse(
            f"at must be [{SMOKE_END}] or a list of training steps such as [0, 1000, 4000], "
            f"got {shorten(value)}"
        )
    return value


def _steps_once(steps: tuple[int, ...] | None) -> tuple[int, ...] | None:
    if steps is not None and len(set(steps)) != len(steps):
        raise refuse(f"at lists a step twice: {shorten(list(steps))}")
    return None if steps is None else tuple(sorted(steps))


SEEDS = (
    f"seeds must be a count from 1 to {MAX_SEEDS} or a list of distinct seeds, got {{}}; two or more "
    "give the noise estimate a difference is judged against"
)


def _seeds(value: Any) -> Any:
    if isinstance(value, int) and not isinstance(value, bool):
        if not 1 <= value <= MAX_SEEDS:
            raise refuse(f"seeds must be an integer from 1 to {MAX_SEEDS}, got {value}")
        return tuple(range(value))
    if not isinstance(value, (list, tuple)) or not 1 <= len(value) <= MAX_SEEDS:
        raise refuse(SEEDS.format(shorten(value)))
    return value


def _distinct(seeds: tuple[int, ...]) -> tuple[int, ...]:
    if len(set(seeds)) != len(seeds):
        raise refuse(SEEDS.format(shorten(list(seeds))))
    return seeds


Step, Seed = Int(0, MAX_TRAIN_STEPS), Int(0, SEED_MAX)


class QualitySpec(SpecModel):
    reference: Annotated[
        Text("a path or a name"),
        required("a quality section needs a `reference` (an ADM npz, image folder or statistics)"),
    ] = Field(None, validate_default=True)
    samples: Int(2, MAX_SAMPLES) = 5000
    sampler: Sampler = Field(Sampler(), description="a mapping such as {name: ddpm, steps: 250}")
    # training steps of a quality run; None: the end of the smoke run
    at: Annotated[
        tuple[Step, ...] | None,
        BeforeValidator(
            _at, json_schema_input_type=Literal[SMOKE_END] | list[Literal[SMOKE_END]] | list[Step]
        ),
        AfterValidator(_steps_once),
    ] = None
    seeds: Annotated[
        tuple[Seed, ...],
        BeforeValidator(_seeds, json_schema_input_type=Int(1, MAX_SEEDS) | list[Seed]),
        AfterValidator(_distinct),
    ] = (0, 1)
    inception: Text("a path or a name", optional=True) = None  # None: the official weights; "test"; a file
    vae: Text("a path or a name", optional=True) = None  # decodes latent-file data; others as encoded
    batch_size: Int(1, MAX_SAMPLE_BATCH) = 32
    grid: Int(0, MAX_GRID) = 16

    @field_serializer("at")
    def _at_as_written(self, at: tuple[int, ...] | None) -> list[Any]:
        return [SMOKE_END] if at is None else list(at)

    @model_validator(mode="after")
    def _bounded(self) -> QualitySpec:
        evaluations = (1 if self.at is None else len(self.at)) * len(self.seeds)
        if evaluations > MAX_EVALUATIONS:  # counted before any schedule is built: each one samples `samples`
            raise refuse(
                f"{len(self.at or ()):,} steps x {len(self.seeds)} seeds is {evaluations:,} evaluations of "
                f"{self.samples:,} samples each per cell, above the cap of {MAX_EVALUATIONS:,}; list fewer "
                "steps in `at` or fewer seeds.",
                "at",
            )
        return self

    @property
    def at_smoke_end(self) -> bool:
        return self.at is None

    def conflict(self, knobs: Knobs, smoke_steps: int) -> str | None:
        """Why this cell cannot be evaluated, or None."""
        data = knobs.data
        if self.at_smoke_end and not smoke_steps:
            return (
                "quality.at is smoke_end but the cell has no smoke run; give it one (defaults.smoke) or "
                "list training steps in quality.at"
            )
        if data == "synthetic":
            return (
                "it trains on synthetic latents, whose samples mean nothing to FID; train it on real data "
                "(data: {pixels: ...}, {latents: ...} or {images: ..., vae: ...}) or leave it out of "
                "quality.cells"
            )
        if "pixels" in data and self.vae is not None:
            return "pixel data decodes without a VAE; remove quality.vae"
        if "images" in data:
            if data["vae"] == "random":
                return "its VAE is random, so decoded samples mean nothing; use vae: ema, mse or a path"
            if self.vae is not None and self.vae != data["vae"]:
                return (
                    f"quality.vae {shorten(self.vae)} is not the VAE it trains with ({shorten(data['vae'])})"
                )
        if "latents" in data and self.vae is None:
            return (
                "it trains on a latent file, which does not say which VAE made it; name it in quality.vae "
                "(ema, mse or a path) so samples can be decoded"
            )
        if "latents" in data and self.vae == "random":
            return "quality.vae random would decode samples into meaningless images; use ema, mse or a path"
        return None

    def decoder(self, knobs: Knobs) -> str:
        """`pixels`, or the VAE (name or path) that decodes this cell's samples."""
        data = knobs.data
        if isinstance(data, dict) and "pixels" in data:
            return "pixels"
        if isinstance(data, dict) and "images" in data:
            return data["vae"]
        return str(self.vae)


class QualitySection(QualitySpec):
    """The suite's section: a QualitySpec and the cells it applies to."""

    cells: Cells("smoke", "all", "baseline") = "smoke"

    def spec(self) -> QualitySpec:
        return QualitySpec.model_construct(**{k: getattr(self, k) for k in QualitySpec.model_fields})

    def applies(self, knobs: dict[str, Any], smoke_steps: int, baseline: dict | None) -> bool:
        return smoke_steps > 0 if self.cells == "smoke" else selects(self.cells, knobs, baseline)
