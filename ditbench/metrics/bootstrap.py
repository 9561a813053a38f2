"""Bootstrap intervals of the quality metrics: how much a score would move with another draw of N samples.

The interval is normal (estimate +- z x SD of the B resamples): B is tens, since a FID resample costs an
eigendecomposition, where the SE is stable but percentile ends are not. It is centred on the estimate
since resamples shift FID up by about its small-N bias (docs/metrics.md).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ditbench.metrics.spec import Metric, MetricInputs, Option

RESAMPLES = 20  # default B: the SE to within ~16% (1 / sqrt(2 B)); 0 turns the bootstrap off
SEED = 0
LEVEL = 0.95
Z = 1.959963984540054  # the standard normal's 97.5% point: two-sided 95%
RULE = "normal: estimate +- 1.96 x the SD of B resamples of the samples (with replacement, reference fixed)"

OPTIONS = (
    Option(
        "bootstrap",
        RESAMPLES,
        "resamples of the samples for the metrics' 95%% intervals (0: none); their cost: docs/metrics.md",
        minimum=0,
    ),
    Option("bootstrap_seed", SEED, "seed of the bootstrap's draws", minimum=0, maximum=2**32 - 1),
)


@dataclasses.dataclass(frozen=True)
class Intervals:
    intervals: dict[str, list[float]]  # output key -> [low, high]
    se: dict[str, float]  # output key -> bootstrap standard error
    seconds: float


def draws(n: int, resamples: int, seed: int) -> np.ndarray:
    """resamples x n sample indices, drawn with replacement: the same for the same (n, B, seed)."""
    return np.random.default_rng(seed).integers(0, n, size=(resamples, n))


def interval(estimate: float, replicates: Sequence[float]) -> tuple[list[float], float]:
    """([low, high], SE) of the normal bootstrap interval around `estimate`."""
    se = float(statistics.stdev(replicates))
    return [estimate - Z * se, estimate + Z * se], se


def sample_intervals(
    active: Sequence[Metric], inputs: MetricInputs, options: Mapping[str, Any], values: Mapping[str, float]
) -> Intervals | None:
    """Intervals of every quality output in `values` (the estimates); None when B < 2 (off)."""
    import torch

    resamples = int(options["bootstrap"])
    if resamples < 2:
        return None
    t = time.perf_counter()
    n = len(next(iter(inputs.samples.values())))
    replicates: dict[str, list[float]] = {}
    quiet = dataclasses.replace(inputs, warn=lambda _text: None)  # the estimate already warned
    fast = {m.name: m.resampler(inputs, options) for m in active if m.resampler is not None}
    fast = {name: f for name, f in fast.items() if f is not None}
    for idx in draws(n, resamples, int(options["bootstrap_seed"])):
        if len(fast) < len(active):  # a metric without a resampler reruns on the drawn features
            index = torch.from_numpy(idx)
            quiet.samples = {name: x[index] for name, x in inputs.samples.items()}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for metric in active:
                out = fast[metric.name](idx) if metric.name in fast else metric.compute(quiet, options)
                for o in metric.outputs:
                    if o.quality and o.key in values:
                        replicates.setdefault(o.key, []).append(float(out[o.key]))
    intervals, se = {}, {}
    for key, reps in replicates.items():
        if np.isfinite(reps).all():  # a value that cannot be recomputed gets no interval, not a NaN one
            intervals[key], se[key] = interval(values[key], reps)
    return Intervals(intervals, se, time.perf_counter() - t)
