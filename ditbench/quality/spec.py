"""The suite's `quality:` section: what to score, how to sample, when, with which seeds, for which cells.

    quality:
      reference: refs/VIRTUAL_imagenet256_labeled.npz  # ADM npz, image folder, statistics, builtin:NAME
      samples: 5000            # per evaluation and seed
      sampler: {name: ddpm, steps: 250, cfg_scale: 1.5, precision: fp32}
      at: [smoke_end]          # or training steps of a quality run, e.g. [0, 1000, 4000]
      seeds: 2                 # sample seeds per evaluation (or a list), for the noise estimate
      cells: smoke             # smoke (default: the smoke cells), all, baseline, or partial cells
      inception: test          # optional: the test network, or a weight file (default: the official)
      vae: ema                 # the VAE that decodes latent-file data (ema, mse or a path)
      batch_size: 32           # images per sampling forward pass
      grid: 16                 # images in each evaluation's sample grid (0: none)

`QualitySpec` holds one validated section; it travels in the cell's spec (the record's
`config.quality`) to the process that trains the cell, and a cell's id includes it, so adding or
changing a quality section reruns the cells it applies to. `conflict` says why a cell cannot be
evaluated (no smoke run to evaluate, synthetic data, a random VAE) before anything runs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ditbench.errors import shorten
from ditbench.knobs import (
    MAX_PATH_CHARS,
    SEED_MAX,
    InvalidValue,
    Knobs,
    int_in,
    number_in,
    one_of,
    unknown_key_message,
)
from ditbench.precision import PRECISIONS

SMOKE_END = "smoke_end"
SAMPLERS = ("ddpm", "ddim")
CELL_CHOICES = ("smoke", "all", "baseline")
MAX_SAMPLES = 10**7
MAX_SEEDS = 64
MAX_GRID = 256
MAX_DIFFUSION_STEPS = 1000  # the diffusion's steps; sampling respaces them
MAX_TRAIN_STEPS = 10**7
KEYS = ("reference", "samples", "sampler", "at", "seeds", "cells", "inception", "vae", "batch_size", "grid")

Fail = Callable[[str | None, str], Exception]  # (key path in the section or None, message) -> the error


@dataclass(frozen=True)
class Sampler:
    name: str = "ddpm"
    steps: int = 250
    cfg_scale: float = 1.5
    precision: str = "fp32"  # of sampling; the Inception network always runs in fp32

    @classmethod
    def from_mapping(cls, values: Any, fail: Fail) -> Sampler:
        if not isinstance(values, Mapping):
            raise fail(
                "sampler", f"expected a mapping such as {{name: ddpm, steps: 250}}, got {shorten(values)}"
            )
        checks = {
            "name": one_of("sampler.name", SAMPLERS),
            "steps": int_in("sampler.steps", 1, MAX_DIFFUSION_STEPS),
            "cfg_scale": number_in("sampler.cfg_scale", 1.0, 100.0),
            "precision": one_of("sampler.precision", PRECISIONS),
        }
        return cls(**_checked(values, checks, "sampler", fail))


@dataclass(frozen=True)
class QualitySpec:
    reference: str
    samples: int = 5000
    sampler: Sampler = field(default_factory=Sampler)
    at: tuple[int, ...] | None = None  # training steps of a quality run; None: the end of the smoke run
    seeds: tuple[int, ...] = (0, 1)
    inception: str | None = None  # None: the official weights (see metrics.weights); "test"; a file
    vae: str | None = None  # the VAE that decodes latent-file data; others decode as they were encoded
    batch_size: int = 32
    grid: int = 16

    @classmethod
    def from_mapping(cls, values: Any, fail: Fail) -> QualitySpec:
        """Validate the section (without `cells`, which is the suite's business)."""
        if not isinstance(values, Mapping):
            raise fail(None, f"expected a mapping with keys {', '.join(KEYS)}, got {shorten(values)}")
        if "reference" not in values:
            raise fail(
                "reference", "a quality section needs a `reference` (an ADM npz, image folder or statistics)"
            )
        checks = {
            "reference": _text("reference"),
            "samples": int_in("samples", 2, MAX_SAMPLES),
            "sampler": lambda v: Sampler.from_mapping(v, lambda k, m: fail(k, m)),
            "at": _at,
            "seeds": _seeds,
            "inception": _text("inception", optional=True),
            "vae": _text("vae", optional=True),
            "batch_size": int_in("batch_size", 1, 1 << 16),
            "grid": int_in("grid", 0, MAX_GRID),
        }
        spec = cls(**_checked({k: v for k, v in values.items() if k != "cells"}, checks, "", fail))
        from ditbench.expansion import MAX_EVALUATIONS

        evaluations = (1 if spec.at is None else len(spec.at)) * len(spec.seeds)
        if evaluations > MAX_EVALUATIONS:  # counted before any schedule is built: each one samples `samples`
            raise fail(
                "at",
                f"{len(spec.at or ()):,} steps x {len(spec.seeds)} seeds is {evaluations:,} evaluations of "
                f"{spec.samples:,} samples each per cell, above the cap of {MAX_EVALUATIONS:,}; list fewer "
                "steps in `at` or fewer seeds.",
            )
        return spec

    def to_config(self) -> dict[str, Any]:
        """The record's `config.quality`: canonical and readable back by `from_mapping`."""
        out = dataclasses.asdict(self)
        out["at"] = [SMOKE_END] if self.at is None else list(self.at)
        out["seeds"] = list(self.seeds)
        return out

    @property
    def at_smoke_end(self) -> bool:
        return self.at is None

    def sampler_record(self) -> dict[str, Any]:
        return dataclasses.asdict(self.sampler)

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


def _checked(values: Mapping, checks: dict[str, Callable[[Any], Any]], prefix: str, fail: Fail) -> dict:
    out = {}
    for key, value in values.items():
        if key not in checks:
            raise fail(_join(prefix, str(key)), unknown_key_message(key, tuple(checks)))
        try:
            out[key] = checks[key](value)
        except InvalidValue as err:
            raise fail(_join(prefix, str(key)), str(err)) from None
    return out


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _text(name: str, optional: bool = False) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        if value is None and optional:
            return None
        if not isinstance(value, str) or not value.strip() or len(value) > MAX_PATH_CHARS:
            raise InvalidValue(f"{name} must be a path or a name, got {shorten(value)}")
        return value

    return check


def _at(value: Any) -> tuple[int, ...] | None:
    if value == SMOKE_END or value == [SMOKE_END]:
        return None
    steps = value if isinstance(value, list) else None
    if not steps:
        raise InvalidValue(
            f"at must be [{SMOKE_END}] or a list of training steps such as [0, 1000, 4000], "
            f"got {shorten(value)}"
        )
    check = int_in("at[]", 0, MAX_TRAIN_STEPS)
    out = [check(s) for s in steps]
    if len(set(out)) != len(out):
        raise InvalidValue(f"at lists a step twice: {shorten(value)}")
    return tuple(sorted(out))


def _seeds(value: Any) -> tuple[int, ...]:
    if isinstance(value, int) and not isinstance(value, bool):
        return tuple(range(int_in("seeds", 1, MAX_SEEDS)(value)))
    if isinstance(value, list) and value and len(value) <= MAX_SEEDS:
        seeds = [int_in("seeds[]", 0, SEED_MAX)(s) for s in value]
        if len(set(seeds)) == len(seeds):
            return tuple(seeds)
    raise InvalidValue(
        f"seeds must be a count from 1 to {MAX_SEEDS} or a list of distinct seeds, got {shorten(value)}; "
        "two or more give the noise estimate a difference is judged against"
    )


def parse_cells(value: Any, partial_list: Callable[[str, Any], list[dict]], fail: Fail) -> Any:
    """`cells`: smoke (default), all, baseline, or a list of partial cells (checked by the suite)."""
    if value is None:
        return "smoke"
    if isinstance(value, list):
        return partial_list("quality.cells", value)
    if value not in CELL_CHOICES:
        raise fail(
            "cells",
            f"expected one of {', '.join(CELL_CHOICES)} or a list of partial cells, got {shorten(value)}",
        )
    return value


def applies(cells: Any, knobs: dict[str, Any], smoke_steps: int, baseline: dict | None) -> bool:
    """Whether a cell (its knobs) is among the quality section's `cells`."""
    if cells == "all":
        return True
    if cells == "smoke":
        return smoke_steps > 0
    partials = [baseline or {}] if cells == "baseline" else cells
    return any(all(knobs.get(k) == v for k, v in p.items()) for p in partials)
