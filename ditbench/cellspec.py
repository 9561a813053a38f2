"""The typed cell spec: a cell's contract between the suite, the runner and the process that measures it.

`CellSpec` = the knobs (`Knobs`) + how the cell is measured (warm-up and window, smoke run)
+ where (the resolved device and an emulated card's memory budget). `record_config()` is the
record's `config` field; `from_record_config()` reads it back, refusing any key it does not know,
so nothing is silently dropped between the suite and the training step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ditbench.errors import UserError, shorten
from ditbench.knobs import FIELDS, InvalidValue, Knobs, int_in, number_in, unknown_key_message
from ditbench.quality.spec import QualitySpec

MAX_STEPS = 10**7  # a window or smoke run longer than this is a typo, not a benchmark
MAX_SECONDS = 7 * 24 * 3600.0  # a week: a longer window or timeout is a typo (suite.TIMEOUT_MAX_S)


STEP_CHECKS = {
    "warmup": int_in("warmup", 0, MAX_STEPS),
    "measure": int_in("measure", 1, MAX_STEPS),
    "min_seconds": number_in("min_seconds", 0.0, MAX_SECONDS),
}


@dataclass(frozen=True)
class Steps:
    """The measured window: `warmup` steps, then at least `measure` steps and `min_seconds`."""

    warmup: int = 5
    measure: int = 20
    min_seconds: float = 5.0

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], fail) -> Steps:
        checks = STEP_CHECKS
        out = {}
        for key, value in values.items():
            if key not in checks:
                raise fail(key, unknown_key_message(key, tuple(checks)))
            try:
                out[key] = checks[key](value)
            except InvalidValue as err:
                raise fail(key, str(err)) from None
        return cls(**out)


MEASUREMENT_KEYS = ("global_batch", "steps", "smoke_steps", "device", "gpu_memory_gib", "card")
OPTIONAL_KEYS = ("quality",)  # present only on the cells a suite's quality section applies to
DEVICES = ("cuda", "cpu")


@dataclass(frozen=True)
class CellSpec:
    knobs: Knobs
    device: str  # "cuda" or "cpu": resolved, so a CPU result never stands in for a GPU one
    steps: Steps = field(default_factory=Steps)
    smoke_steps: int = 0
    gpu_memory_gib: float | None = None  # the emulated card's memory budget (GiB), None = the real card
    card: str | None = None  # the emulated card's name (ditbench.cards), when given by name
    quality: QualitySpec | None = None  # sample quality to evaluate (the suite's `quality` section)

    @property
    def world_size(self) -> int:
        return self.knobs.gpus * self.knobs.nodes

    @property
    def rank_batch(self) -> int:
        """Images one process trains on per optimizer step: batch_size x grad_accum."""
        return self.knobs.batch_size * self.knobs.grad_accum

    @property
    def global_batch(self) -> int:
        """Images per optimizer step over the job: batch_size x gpus x nodes x grad_accum."""
        return self.rank_batch * self.world_size

    def record_config(self) -> dict[str, Any]:
        """The record's `config`: every knob, then how and where the cell is measured."""
        out = {
            **self.knobs.to_dict(),
            "global_batch": self.global_batch,
            "steps": dataclasses.asdict(self.steps),
            "smoke_steps": self.smoke_steps,
            "device": self.device,
            "gpu_memory_gib": self.gpu_memory_gib,
            "card": self.card,
        }
        if self.quality is not None:
            out["quality"] = self.quality.to_config()
        return out

    def identity(self) -> dict[str, Any]:
        """What a cell id hashes: the knobs and settings that differ from their defaults, and the device.

        A new knob (or setting) at its default leaves every existing id unchanged.
        """
        out: dict[str, Any] = self.knobs.non_defaults()
        if self.steps != Steps():
            out["steps"] = dataclasses.asdict(self.steps)
        for key in ("smoke_steps", "gpu_memory_gib", "card"):
            value = getattr(self, key)
            if value != CELL_SPEC_DEFAULTS[key]:
                out[key] = value
        if self.quality is not None:
            out["quality"] = self.quality.to_config()
        out["device"] = self.device
        return out

    @classmethod
    def from_record_config(cls, config: Mapping[str, Any], where: str = "cell spec") -> CellSpec:
        """Read back `record_config()`; a missing or unknown key, or a bad value, is a UserError."""

        def fail(key, message):
            return UserError(f"{where}{f' `{key}`' if key is not None else ''}: {message}")

        if not isinstance(config, Mapping):
            raise fail(None, f"expected a mapping, got {shorten(config)}")
        valid = (*FIELDS, *MEASUREMENT_KEYS, *OPTIONAL_KEYS)
        for key in config:
            if key not in valid:
                raise fail(key, unknown_key_message(key, valid))
        missing = [k for k in MEASUREMENT_KEYS if k not in config]
        if missing:
            raise fail(None, f"missing {', '.join(missing)}")
        knobs = Knobs.from_mapping({k: v for k, v in config.items() if k in FIELDS}, fail)
        device = config["device"]
        if device not in DEVICES:
            raise fail("device", f"must be one of {', '.join(DEVICES)}, got {shorten(device)}")
        steps = Steps.from_mapping(_mapping(config["steps"], fail), fail)
        try:
            smoke = int_in("smoke_steps", 0, MAX_STEPS)(config["smoke_steps"])
            budget = config["gpu_memory_gib"]
            if budget is not None:
                budget = number_in("gpu_memory_gib", 0.0, 1e6, low_open=True)(budget)
        except InvalidValue as err:
            raise fail(None, str(err)) from None
        card = config["card"]
        if card is not None and not isinstance(card, str):
            raise fail("card", f"must be a card name or null, got {shorten(card)}")
        quality = None
        if config.get("quality") is not None:
            quality = QualitySpec.from_mapping(
                config["quality"], lambda k, m: fail("quality" if k is None else f"quality.{k}", m)
            )
        spec = cls(knobs, device, steps, smoke, budget, card, quality)
        if config["global_batch"] != spec.global_batch:
            raise fail(
                "global_batch",
                f"{shorten(config['global_batch'])} is not batch_size x gpus x nodes x grad_accum",
            )
        return spec


def _mapping(value: Any, fail) -> Mapping:
    if not isinstance(value, Mapping):
        raise fail("steps", f"expected a mapping, got {shorten(value)}")
    return value


CELL_SPEC_DEFAULTS = {"smoke_steps": 0, "gpu_memory_gib": None, "card": None}
