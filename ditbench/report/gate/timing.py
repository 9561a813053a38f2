"""Speed, memory and loss metrics of one cell; for timed ones a seeded bootstrap interval of the ratio
of median step times (per-step samples, or with repeats on both sides the repeats' per-process
medians) and a Mann-Whitney U test. Interval wholly beyond threshold T and significant: regression;
straddling T, or a pass whose MDE exceeds T: inconclusive; too few samples: T alone decides.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.stats import mannwhitneyu

from ditbench.intervals import LEVEL, median_ratio_interval
from ditbench.records.metrics import HIGHER, Metric
from ditbench.report.gate.paired import check_mde
from ditbench.report.gate.policy import Policy, Rule
from ditbench.report.gate.result import MetricDelta, crossing

# per side and cell; more are thinned evenly (200,000 steps cost the bootstrap 3 GB and 50 s)
MAX_SAMPLES = 5_000


def p_min(n: int, m: int) -> float:
    """Smallest two-sided p-value an exact Mann-Whitney U test can give for sample sizes n and m."""
    return min(1.0, 2 / math.comb(n + m, min(n, m)))  # int / int: no float overflow for long windows


@dataclass
class StepTest:
    """The samples of both runs (per-step times, or the repeats' medians), tested once, on demand."""

    base: list[float]
    new: list[float]
    policy: Policy
    unit: str = "steps"  # "runs": one sample per repeat (bench.repeats)
    _result: tuple[float, float] | None = None
    _ratio: tuple[float, float, float] | None = None
    thinned: str = ""  # what was left out, for the output: "" when nothing

    def __post_init__(self) -> None:
        sizes = (len(self.base), len(self.new))
        if max(sizes) > MAX_SAMPLES:
            self.base, self.new = _evenly(self.base), _evenly(self.new)
            kept = f"{len(self.base):,}/{len(self.new):,}"
            self.thinned = f"{kept} of {sizes[0]:,}/{sizes[1]:,} {self.unit}, evenly spaced"

    @property
    def enough(self) -> bool:
        return len(self.base) >= self.policy.min_samples and len(self.new) >= self.policy.min_samples

    @property
    def testable(self) -> bool:
        return self.enough and p_min(len(self.base), len(self.new)) < self.policy.alpha

    def why_not(self) -> str:
        n = f"n={len(self.base)}/{len(self.new)}" + (" runs" if self.unit == "runs" else "")
        if not self.enough:
            return f"{n} < {self.policy.min_samples}"
        return f"{n} cannot reach p<{self.policy.alpha:g}"

    def ratio(self) -> tuple[float, float, float] | None:
        """The bootstrap interval of median(new) / median(base) step time, computed once; None when
        the medians are not positive."""
        if self._ratio is None and self.enough:
            if np.median(self.base) > 0 and np.median(self.new) > 0:
                self._ratio = median_ratio_interval(self.base, self.new)
        return self._ratio

    def run(self) -> tuple[float, float]:
        """(p-value, shift of the median step time; > 0: steps got slower)."""
        if self._result is None:
            p = float(mannwhitneyu(self.new, self.base, alternative="two-sided").pvalue)
            self._result = (p if math.isfinite(p) else 1.0, float(np.median(self.new) - np.median(self.base)))
        return self._result


def _evenly(samples: list[float]) -> list[float]:
    if len(samples) <= MAX_SAMPLES:
        return samples
    return [samples[i] for i in np.linspace(0, len(samples) - 1, MAX_SAMPLES).round().astype(int)]


def change_interval(
    metric: Metric, b: float, n: float, ratio: tuple[float, float, float]
) -> tuple[float, float]:
    """The interval of the metric's change in percent: the recorded change, widened by the step-time
    ratio's interval relative to its point (a rate moves as 1 / step time)."""
    point, low, high = ratio
    factors = [low / point, high / point]
    if metric.direction == HIGHER:
        factors = [1 / f for f in factors]
    ends = sorted((n / b * f - 1) * 100 for f in factors)
    return ends[0], ends[1]


def _interval_text(ci: tuple[float, float]) -> str:
    return f"{LEVEL:.0%} CI {ci[0]:+.1f}% to {ci[1]:+.1f}%"


def _worse(metric: Metric, interval: tuple[float, float]) -> tuple[float, float]:
    """The change interval as percent moved the wrong way (> 0: worse), low to high."""
    ends = [-x for x in interval] if metric.direction == HIGHER else list(interval)
    return min(ends), max(ends)


def judge(
    metric: Metric, rule: Rule, b: float, n: float, test: StepTest, weak_reason: str | None
) -> tuple[MetricDelta, bool]:
    """The verdict on one metric of a cell, and whether a crossing went without the test."""
    c = crossing(metric, b, n, rule.threshold_pct, rule.min_abs)
    p_value, untested, interval, verdict = None, False, None, None  # verdict None: the crossing decides
    ratio = test.ratio() if metric.timed and test.testable and c.change_pct is not None else None
    if ratio is not None:
        interval = change_interval(metric, b, n, ratio)
    significant = False
    if not metric.timed:
        significance, significant = "no per-step samples (threshold decides)", True
    elif not c.crossed and interval is None:
        significance = "within threshold (not tested)"
    elif not c.crossed:
        low, high = _worse(metric, interval)
        significance = f"within threshold; {_interval_text(interval)}"
        if high > rule.threshold_pct and abs(n - b) >= rule.min_abs:
            verdict = "inconclusive"  # the data allow a change beyond the threshold
    elif test.testable:
        p_value, shift = test.run()
        significance = f"p={p_value:.2g}" + (
            f" over {len(test.base)}/{len(test.new)} runs" if test.unit == "runs" else ""
        )
        significance += f" ({test.thinned})" if test.thinned else ""
        # Slower steps mean lower throughput and higher step time alike.
        slower = c.direction == "worse"
        significant = p_value < test.policy.alpha and (shift > 0 if slower else shift < 0)
        if interval is not None:
            significance += f"; {_interval_text(interval)}"
            low, high = _worse(metric, interval)
            if low <= rule.threshold_pct < high or (slower and low <= rule.threshold_pct):
                # a change within the threshold and one beyond it fit the data alike (an apparent
                # improvement whose interval reaches a slowdown beyond the threshold included)
                verdict = "inconclusive"
            elif not slower and high >= -rule.threshold_pct:
                verdict = "noise"  # an improvement the interval does not show
            elif slower and p_value >= test.policy.alpha:
                # wholly beyond T by the interval, not shown by the rank test: never a pass (a shift
                # the test finds the other way contradicts the rate, and stays noise)
                verdict = "inconclusive"
    else:
        significance, significant, untested = f"not tested ({test.why_not()}; threshold decides)", True, True
    weak = metric.timed and weak_reason is not None
    delta = MetricDelta.judged(
        metric,
        rule,
        b,
        n,
        c,
        significant,
        significance,
        p_value=p_value,
        weak=weak,
        weak_reason=weak_reason if weak else None,
        interval_pct=list(interval) if interval is not None else None,
        interval_level=LEVEL if interval is not None else None,
    )
    if verdict is not None:
        delta.verdict = verdict
    check_mde(delta, rule)
    return delta, untested
