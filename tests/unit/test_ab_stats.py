"""`ditbench ab`'s paired statistics (report.gate.timing): the exact signed-rank interval, the
alpha-spending schedule, the minimum detectable effect, the verdicts, and the false-alarm rate of
the sequential rule by seeded simulation (exact counts)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import norm, wilcoxon

from ditbench.records.metrics import table
from ditbench.report.gate.policy import Rule
from ditbench.report.gate.timing import (
    excluded,
    hl_interval,
    judge_paired,
    look_alpha,
    mde,
    obrien_fleming,
    signed_rank_cdf,
)

RATE, STEP = table()["images_per_s"], table()["step_ms"]


@pytest.mark.parametrize("n", [1, 3, 6, 10])
def test_the_signed_rank_distribution_counts_every_sign_pattern(n):
    sums = [sum(r + 1 for r in range(n) if mask >> r & 1) for mask in range(2**n)]
    counts = np.bincount(sums, minlength=n * (n + 1) // 2 + 1)
    assert signed_rank_cdf(n) == pytest.approx(np.cumsum(counts) / 2**n, abs=1e-15)


def test_the_interval_drops_what_the_exact_test_allows():
    assert excluded(5, 0.05) == (0, 0.0)  # 2 / 32 = 0.0625: five rounds cannot reach 95%
    assert excluded(6, 0.05) == (1, 2 / 64)  # the extreme Walsh averages themselves
    assert excluded(10, 0.05) == (9, pytest.approx(0.048828125))  # T+ <= 8, the textbook critical value
    x = [0.05, 0.02, -0.01, 0.03, 0.04, 0.01, 0.06, 0.0, 0.02, 0.03]
    est, low, high, attained = hl_interval(np.array(x), 0.05)
    assert (float(est), float(low), float(high)) == pytest.approx((0.025, 0.01, 0.04))
    assert attained == pytest.approx(0.048828125)
    est, low, high, attained = hl_interval(np.array(x[:5]), 0.05)
    assert (low, high, attained) == (-np.inf, np.inf, 0.0)


def test_the_interval_is_the_set_the_signed_rank_test_does_not_reject():
    x = np.random.default_rng(7).normal(0.03, 0.02, 12)
    _, low, high, attained = hl_interval(x, 0.05)
    for end, inward in ((float(low), 1), (float(high), -1)):
        assert wilcoxon(x - (end + inward * 1e-9), method="exact").pvalue > 0.05
        assert wilcoxon(x - (end - inward * 1e-9), method="exact").pvalue == pytest.approx(attained)


def test_spending_adds_up_to_alpha_and_saves_most_for_the_end():
    rounds = 12
    levels = [look_alpha(n, rounds, 0.05) for n in range(1, rounds + 1)]
    used = [excluded(n, a)[1] for n, a in enumerate(levels, 1)]
    assert sum(used) <= 0.05 + 1e-12
    assert max(levels[:2]) < 1e-5 and used[:4] == [0.0] * 4  # the first looks cannot spend
    assert levels[-1] > 0.01
    assert obrien_fleming(1.0, 0.05) == pytest.approx(0.05)
    assert obrien_fleming(0.5, 0.05) == pytest.approx(2 * norm.sf(1.959964 / math.sqrt(0.5)))
    # the last look the clock allows spends what the earlier looks left
    assert look_alpha(8, rounds, 0.05, last=True) == pytest.approx(0.05 - sum(used[:7]))


def test_the_minimum_detectable_effect():
    # half-width h at 95%: the change seen 4 times in 5 is h / 1.96 x (1.96 + 0.8416)
    assert mde(5.0, 0.05) == pytest.approx(5.0 / 1.959964 * (1.959964 + 0.841621), rel=1e-6)
    assert mde(5.0, 0.0) == math.inf and mde(math.inf, 0.05) == math.inf


def _paired(metric, ratios, threshold=5.0, alpha=0.05, b=100.0, n=100.0):
    return judge_paired(metric, Rule(threshold_pct=threshold), b, n, [math.log(r) for r in ratios], alpha)


def test_a_slowdown_wholly_beyond_the_threshold_is_a_regression():
    d = _paired(STEP, [1.10, 1.12, 1.09, 1.11, 1.10, 1.13, 1.08, 1.10, 1.11, 1.12], b=10.0, n=11.0)
    assert d.verdict == "regression" and d.direction == "worse"
    assert d.change_pct == pytest.approx(10.5, abs=0.1) and d.interval_level == pytest.approx(1 - 0.048828125)
    assert d.interval_pct[0] > 5.0
    rate = _paired(RATE, [1.10, 1.12, 1.09, 1.11, 1.10, 1.13, 1.08, 1.10, 1.11, 1.12], b=400.0, n=360.0)
    # images/s: 1 / ratio - 1, -9.5% for a step 10.5% slower
    assert rate.verdict == "regression" and rate.change_pct == pytest.approx(-9.5, abs=0.1)


def test_no_change_passes_only_when_the_mde_is_within_the_threshold():
    steady = [1.0 + d for d in (0.01, -0.01, 0.005, -0.005, 0.0, 0.002, -0.002, 0.01, -0.01, 0.0)]
    d = _paired(STEP, steady)
    assert d.verdict == "unchanged" and d.mde_pct < 5.0
    noisy = [1.0 + d for d in (0.06, -0.05, 0.04, -0.06, 0.0, 0.03, -0.03, 0.05, -0.04, 0.01)]
    d = _paired(STEP, noisy)
    assert d.interval_pct[1] < 5.0 and d.mde_pct > 5.0 and d.verdict == "inconclusive"
    assert d.mde_pct == pytest.approx(5.1243, abs=1e-4) and d.significance == (
        "paired, 10 rounds: 95.1% CI -3.5% to +3.5%"
    )
    d = _paired(STEP, steady[:5])  # five rounds: no interval at 95% yet
    assert d.verdict == "inconclusive" and d.interval_pct is None and d.mde_pct is None


def test_a_speedup_beyond_the_threshold_is_an_improvement():
    d = _paired(RATE, [0.85, 0.86, 0.84, 0.85, 0.87, 0.85, 0.86, 0.84, 0.85, 0.86], b=400.0, n=470.0)
    assert d.verdict == "improvement" and d.direction == "better" and d.change_pct > 15


def test_min_abs_holds_a_small_change_back():
    d = judge_paired(STEP, Rule(threshold_pct=5.0, min_abs=2.0), 10.0, 11.0, [math.log(1.1)] * 10, 0.05)
    assert d.verdict == "unchanged"


# ------------------------------------------------------------------------- the sequential rule


def simulate(effect: float, bound: float, alpha: float, rounds: int, sims: int, seed: int, spend=True):
    """(open, above, below) counts: runs whose interval ended wholly above `bound`, wholly below it,
    or neither, looking after every round; log ratios = effect + 5% x Student t(3) noise (symmetric,
    heavy-tailed: load spikes)."""
    rng = np.random.default_rng(seed)
    x = effect + 0.05 * rng.standard_t(3, size=(sims, rounds))
    out = np.zeros(sims, dtype=int)
    for n in range(1, rounds + 1):
        _, low, high, _ = hl_interval(x[:, :n], look_alpha(n, rounds, alpha) if spend else alpha)
        still = out == 0
        out[still & (low > bound)] = 1
        out[still & (high < bound)] = 2
    return tuple(int(c) for c in np.bincount(out, minlength=3))


def test_the_sequential_rule_keeps_the_false_alarm_rate_at_alpha():
    # A/A, 20 looks: an interval that excludes "no change" at any look is a false alarm.
    assert simulate(0.0, 0.0, 0.05, 20, 4000, seed=1) == (3925, 40, 35)  # 1.9% <= 5%
    # the same looks each at 5% without spending: 16% false alarms, what the spending prevents
    assert simulate(0.0, 0.0, 0.05, 20, 4000, seed=1, spend=False) == (3351, 315, 334)


def test_at_the_threshold_each_wrong_call_stays_below_half_alpha():
    t = math.log(1.05)  # a true slowdown of exactly the threshold
    open_, regression, within = simulate(t, t, 0.05, 20, 4000, seed=2)
    assert (open_, regression, within) == (3947, 30, 23)  # 0.75% and 0.58%, each <= 2.5%
