"""Timed metrics (speed, step time) of one cell: their interval and significance (memory and loss:
threshold alone). `compare`: a seeded bootstrap interval of the ratio of median step times and a
Mann-Whitney U test; `ab` (paired rounds): the Hodges-Lehmann estimate with the exact Wilcoxon
signed-rank interval, looked at after every round at an O'Brien-Fleming-type level.
docs/gate-in-ci.md ("Statistics") says why.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy.stats import mannwhitneyu, norm

from ditbench.core.intervals import LEVEL, median_ratio_interval
from ditbench.records.metrics import HIGHER, Metric
from ditbench.report.gate.policy import Policy, Rule
from ditbench.report.gate.result import MetricDelta, crossing, direction

POWER = 0.80
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


# ------------------------------------------------------------------------------ paired rounds (ab)


@lru_cache(maxsize=512)
def signed_rank_cdf(n: int) -> np.ndarray:
    """P(T+ <= t), t = 0 .. n(n+1)/2, of the signed-rank statistic of n values under the null."""
    p = np.zeros(n * (n + 1) // 2 + 1)
    p[0] = 1.0
    for k in range(1, n + 1):  # rank k joins the positive sum or not, each with chance 1/2
        p[k:] = (p[k:] + p[:-k]) / 2
        p[:k] /= 2
    return np.cumsum(p)


def excluded(n: int, alpha: float) -> tuple[int, float]:
    """(c, attained): the interval runs from the c-th smallest to the c-th largest Walsh average; its
    two-sided level is `attained` <= alpha. c = 0: no interval reaches alpha with n values."""
    cdf = signed_rank_cdf(n)
    c = int(np.searchsorted(cdf, alpha / 2, side="right"))  # t with P(T+ <= t) <= alpha / 2
    return c, (2 * float(cdf[c - 1]) if c else 0.0)


def hl_interval(x: np.ndarray, alpha: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """(estimate, low, high, attained level) of the centre of x along its last axis (rounds): the
    Hodges-Lehmann estimate and the exact signed-rank interval; low/high are -inf/inf where no
    interval reaches alpha. Works on a stack of samples at once (the simulation tests use that)."""
    x = np.asarray(x, dtype=float)
    n = x.shape[-1]
    i, j = np.triu_indices(n)
    walsh = np.sort((x[..., i] + x[..., j]) / 2, axis=-1)
    estimate = np.median(walsh, axis=-1)
    c, attained = excluded(n, alpha)
    if not c:
        return estimate, np.full_like(estimate, -np.inf), np.full_like(estimate, np.inf), 0.0
    return estimate, walsh[..., c - 1], walsh[..., walsh.shape[-1] - c], attained


def obrien_fleming(t: float, alpha: float) -> float:
    """Alpha spent by information fraction t (0 < t <= 1): 2 - 2 Phi(z_{1-alpha/2} / sqrt(t))."""
    return float(2 * norm.sf(norm.isf(alpha / 2) / math.sqrt(t)))


@lru_cache(maxsize=64)
def _schedule(alpha: float, max_rounds: int) -> tuple[tuple[float, float], ...]:
    """(alpha spent before the look, this look's level) for the looks after rounds 1 .. max_rounds."""
    spent, out = 0.0, []
    for n in range(1, max_rounds + 1):
        level = max(0.0, obrien_fleming(n / max_rounds, alpha) - spent)
        out.append((spent, level))
        spent += excluded(n, level)[1]  # what the exact interval really used
    return tuple(out)


def look_alpha(n: int, max_rounds: int, alpha: float, last: bool = False) -> float:
    """The level of the look after round n; the last look spends all that the earlier ones left."""
    spent, level = _schedule(alpha, max_rounds)[min(n, max_rounds) - 1]
    return max(0.0, alpha - spent) if last or n >= max_rounds else level


def mde(half_width: float, attained: float) -> float:
    """The minimum detectable effect (same unit as half_width) of an interval at level `attained`."""
    if not (attained > 0 and math.isfinite(half_width)):
        return math.inf
    z = norm.isf(attained / 2)
    return half_width / z * (z + norm.ppf(POWER))


def check_mde(delta: MetricDelta, rule: Rule) -> None:
    """Set delta.mde_pct from its interval; a pass that says "no change seen" (unchanged, or worse
    but not significant) whose MDE exceeds the threshold becomes inconclusive."""
    if delta.interval_pct is None or delta.interval_level is None:
        return
    low, high = delta.interval_pct
    delta.mde_pct = mde((high - low) / 2, 1 - delta.interval_level)
    unseen = delta.verdict == "unchanged" or (delta.verdict == "noise" and delta.direction == "worse")
    if unseen and delta.mde_pct > rule.threshold_pct and abs(delta.new - delta.base) >= rule.min_abs:
        delta.verdict = "inconclusive"


def _worse_pct(metric: Metric, log_ratio: float) -> float:
    """How many percent the metric moved the wrong way when the step time moved by exp(log_ratio)."""
    if metric.direction == HIGHER:  # a rate: 1 / step time
        return -math.expm1(-log_ratio) * 100
    return math.expm1(log_ratio) * 100


def judge_paired(metric: Metric, rule: Rule, b: float, n: float, log_ratios: list[float], alpha: float):
    """The verdict on a timed metric from the rounds' log step-time ratios at one look of level alpha."""
    if not log_ratios:  # a side never ran ok alongside the other: nothing paired
        log_ratios, alpha = [0.0], 0.0
    est, low, high, attained = (float(v) for v in hl_interval(np.asarray(log_ratios, dtype=float), alpha))
    worse = sorted(_worse_pct(metric, x) for x in (low, high))
    change = _worse_pct(metric, est)
    sign = -1 if metric.direction == HIGHER else 1  # change_pct is signed the metric's own way
    detectable = (
        _worse_pct(metric, mde((high - low) / 2, attained)) if math.isfinite(high - low) else math.inf
    )
    t = rule.threshold_pct
    if abs(n - b) < rule.min_abs:
        verdict = "unchanged"
    elif worse[0] > t:
        verdict = "regression"
    elif worse[1] < -t:
        verdict = "improvement"
    elif worse[1] <= t and detectable <= t:
        verdict = "unchanged"
    else:
        verdict = "inconclusive"
    interval = sorted(sign * w for w in worse)
    level = (
        f"{1 - attained:.1%} CI {interval[0]:+.1f}% to {interval[1]:+.1f}%" if attained else "no interval yet"
    )
    found = f"paired, {len(log_ratios)} rounds: {level}"
    delta = MetricDelta(
        metric.name, metric.label, b, n, sign * change, t, verdict, found, direction=direction(change)
    )
    if attained:
        delta.interval_pct, delta.interval_level, delta.mde_pct = interval, 1 - attained, detectable
    return delta
