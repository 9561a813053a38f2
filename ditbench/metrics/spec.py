"""What a metric declares about itself (features, options, outputs, gate threshold, function), so that
evaluation, the CLI and reports need no per-metric code. Imports torch only to compute.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from ditbench.core import intervals
from ditbench.core.errors import UserError, shorten

if TYPE_CHECKING:
    import torch

# What a reference can hold: FID and sFID statistics and its images' pool3 features.
REFERENCE_KEYS = ("mu", "sigma", "mu_s", "sigma_s", "pool3")
# The features the Inception network gives per image (its forward()'s keys) and their sizes.
POOL3_DIM = 2048
LOGITS_DIM = 1008
SPATIAL_CHANNELS = 7
SPATIAL_SIZE = 17
SPATIAL_DIM = SPATIAL_CHANNELS * SPATIAL_SIZE * SPATIAL_SIZE  # 2023
FEATURE_DIMS = {"pool3": POOL3_DIM, "logits_unbiased": LOGITS_DIM, "spatial": SPATIAL_DIM}


@dataclass(frozen=True)
class Option:
    """A metric's option: `name` is its key in the result's settings, the API keyword and the flag."""

    name: str  # "kid_subsets" -> --kid-subsets
    default: int | float
    help: str
    minimum: int | float | None = 1
    maximum: int | float | None = None
    kind: type = int

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def check(self, value: Any) -> int | float:
        """The value as this option's type; UserError naming the flag if it is not valid."""
        bad = isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating)
        if bad or (self.kind is int and float(value) != int(value)) or not math.isfinite(float(value)):
            what = "an integer" if self.kind is int else "a finite number"
            raise UserError(f"{self.flag} must be {what}; got {shorten(value)}.")
        value = self.kind(value)
        below = self.minimum is not None and value < self.minimum
        if below or (self.maximum is not None and value > self.maximum):
            lo = "" if self.minimum is None else f" >= {self.minimum}"
            hi = "" if self.maximum is None else f" <= {self.maximum}"
            raise UserError(f"{self.flag} must be{lo}{' and' if lo and hi else ''}{hi}; got {value}.")
        return value


@dataclass(frozen=True)
class Output:
    """One number a metric reports: its key (in `metrics`, a quality evaluation, the gate, the report),
    its label and format, and how a change in it is judged."""

    key: str
    label: str
    fmt: str = "{:.4f}"
    better: Literal["lower", "higher"] | None = None  # None: a spread, not a quality figure
    valid: Literal["positive", "non-negative", "any"] = "non-negative"  # what a real value can be
    threshold_pct: float | None = None  # the gate's default threshold; None: gated only if a policy asks

    @property
    def quality(self) -> bool:
        """A quality figure (it has a direction): evaluated per seed, gated and reported."""
        return self.better is not None

    def plus_minus(self, value: float, spread: float | None) -> str:
        """`73 ± 35`: the value and its spread to the decimals the spread justifies (`intervals`)."""
        return intervals.plus_minus(value, spread, self.fmt)

    def with_ends(self, value: float, low: float, high: float) -> tuple[str, str, str]:
        return intervals.with_ends(value, low, high, self.fmt)


@dataclass(frozen=True)
class Need:
    """Images a metric needs at its options: samples, and reference images if it uses their features."""

    samples: int
    reference: int
    why: str  # "a covariance needs at least 2 images per set"
    hint: str = ""  # what the user can change, e.g. "lower --kid-subset-size"


@dataclass
class MetricInputs:
    """Everything a metric's function reads: features of both sides, and where to compute."""

    samples: dict[str, torch.Tensor]  # name -> N x d float32 (CPU)
    reference: Mapping[str, np.ndarray]  # REFERENCE_KEYS present (mu/sigma float64, pool3 float32)
    reference_from_images: frozenset[str]  # reference keys computed here from its images
    reference_count: int | None  # reference images (or pool3 rows); None for statistics only
    device: torch.device
    warn: Callable[[str], None]  # a warning that belongs in the result (and the warnings module)

    def pool3(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """The samples' and the reference's pool3 features, as `dtype` on the device."""
        import torch

        ref = torch.from_numpy(np.asarray(self.reference["pool3"]))
        return self.samples["pool3"].to(self.device, dtype), ref.to(self.device, dtype)


@dataclass(frozen=True)
class Metric:
    name: str  # as --metrics spells it
    title: str  # in messages
    sample_features: tuple[str, ...]  # from FEATURE_DIMS
    reference_keys: tuple[str, ...]  # from REFERENCE_KEYS
    outputs: tuple[Output, ...]
    needs: Callable[[Mapping[str, Any]], Need]  # at the resolved options
    compute: Callable[[MetricInputs, Mapping[str, Any]], dict[str, float]]
    options: tuple[Option, ...] = ()
    # For the bootstrap: prepare(inputs, options) once, then f(sample indices) -> the drawn samples'
    # outputs; without it (or when prepare returns None) `compute` reruns on each resample.
    resampler: (
        Callable[[MetricInputs, Mapping[str, Any]], Callable[[np.ndarray], dict[str, float]]] | None
    ) = None

    def __post_init__(self):
        unknown = set(self.reference_keys) - set(REFERENCE_KEYS)
        assert not unknown, f"{self.name}: unknown reference keys {unknown}"
        assert all(f in FEATURE_DIMS for f in self.sample_features), f"{self.name}: unknown sample feature"
