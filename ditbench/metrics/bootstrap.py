"""Bootstrap intervals of the quality metrics over the samples: how much a score would move with
another draw of N samples from the same model.

Each resample draws N sample indices with replacement (one draw shared by every metric, seeded, so
the JSON is the same on every run); the reference stays fixed. Every metric is recomputed from the
resampled features with its own function (or its spec's `resampler`, the same figure computed
faster), and the interval is the normal bootstrap interval:

    estimate +- z(level) x the standard deviation of the B recomputed values (the bootstrap SE)

Normal rather than percentile ends because each resample of FID costs a 2048 x 2048 covariance and
an eigendecomposition, so B is tens, not the ~1,000 percentile ends need; the standard error is
stable at tens. Centred on the estimate because resampling with replacement repeats samples, which
shifts FID up by about its own small-N bias: the replicates' spread is what the bootstrap measures
well, their location is not.

Cost: a metric's resampler prepares once what does not change between resamples. FID/sFID below
N = d = 2048: an n x n matrix a resample; from N = d up they rerun (an N x d^2 covariance and a
d x d eigenvalue problem a resample). Precision/recall: every sample's nearest neighbours and the
(reference, sample) pairs they could cover once (one computation of the metric), then O(N) a
resample. KID: the samples' kernel once (N^2 float64, up to N of about 16,000; beyond, KID
reruns), then one T x N by N x N product a resample. IS reruns (cheap). benchmarks/bootstrap_cost.py
measures the costs (docs/metrics.md).
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
    active: Sequence[Metric],
    inputs: MetricInputs,
    options: Mapping[str, Any],
    values: Mapping[str, float],
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
