"""Speed, memory and loss metrics of one cell, and the significance test for the timed ones.

A metric regresses when it moves the wrong way by more than its threshold AND, for metrics timed
per step, the per-step times (metrics.step_ms.samples) differ significantly by a two-sided
Mann-Whitney U test (p < alpha, shifted the same way). With fewer than min_samples samples on
either side, or too few for the test to ever reach p < alpha, the threshold alone decides and the
cell says so. The test runs only for a metric that crossed its threshold (elsewhere it could change
nothing). Memory and loss have no per-step samples and are near-deterministic: threshold alone.
A cell measured in a noisy window (metrics.noisy) keeps its timing verdicts, marked weak.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.stats import mannwhitneyu

from ditbench.report.gate.metrics import Metric, crossing
from ditbench.report.gate.policy import Policy, Rule
from ditbench.report.gate.result import MetricDelta


def p_min(n: int, m: int) -> float:
    """Smallest two-sided p-value an exact Mann-Whitney U test can give for sample sizes n and m."""
    return min(1.0, 2 / math.comb(n + m, min(n, m)))  # int / int: no float overflow for long windows


@dataclass
class StepTest:
    """The per-step samples of both runs, tested once, on demand."""

    base: list[float]
    new: list[float]
    policy: Policy
    _result: tuple[float, float] | None = None

    @property
    def enough(self) -> bool:
        return len(self.base) >= self.policy.min_samples and len(self.new) >= self.policy.min_samples

    @property
    def testable(self) -> bool:
        return self.enough and p_min(len(self.base), len(self.new)) < self.policy.alpha

    def why_not(self) -> str:
        n = f"n={len(self.base)}/{len(self.new)}"
        if not self.enough:
            return f"{n} < {self.policy.min_samples}"
        return f"{n} cannot reach p<{self.policy.alpha:g}"

    def run(self) -> tuple[float, float]:
        """(p-value, shift of the median step time; > 0: steps got slower)."""
        if self._result is None:
            p = float(mannwhitneyu(self.new, self.base, alternative="two-sided").pvalue)
            self._result = (p if math.isfinite(p) else 1.0, float(np.median(self.new) - np.median(self.base)))
        return self._result


def judge(
    metric: Metric, rule: Rule, b: float, n: float, test: StepTest, weak_reason: str | None
) -> tuple[MetricDelta, bool]:
    """The verdict on one metric of a cell, and whether a crossing went without the test."""
    c = crossing(metric, b, n, rule.threshold_pct, rule.min_abs)
    p_value, untested = None, False
    if not metric.timed:
        significance, significant = "no per-step samples (threshold decides)", True
    elif not c.crossed:
        # Significance only matters once a threshold is crossed; skipping it keeps big gates fast.
        significance, significant = "within threshold (not tested)", False
    elif test.testable:
        p_value, shift = test.run()
        significance = f"p={p_value:.2g}"
        # Slower steps mean lower throughput and higher step time alike.
        slower = c.direction == "worse"
        significant = p_value < test.policy.alpha and (shift > 0 if slower else shift < 0)
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
        direction=c.direction,
        weak=weak,
        weak_reason=weak_reason if weak else None,
    )
    return delta, untested
