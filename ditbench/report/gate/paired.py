"""Paired timing statistics (`ditbench ab`): per round x = log(median step B / median step A), shared
noise cancelling; the Hodges-Lehmann estimate with the exact Wilcoxon signed-rank interval (a bootstrap
at 6-20 rounds covers less than it claims); a look after every round at an O'Brien-Fleming-type level,
the looks adding up to alpha; MDE = (h / z)(z + z_0.80). docs/gate-in-ci.md ("Statistics") says why.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from scipy.stats import norm

from ditbench.records.metrics import HIGHER, Metric
from ditbench.report.gate.policy import Rule
from ditbench.report.gate.result import MetricDelta, direction

POWER = 0.80


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
