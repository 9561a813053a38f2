"""The numbers the gate and the records rest on, pinned to references written out here: the gate's
significance level, the recorded step-time percentiles, and the Inception Score splits and the
precision/recall k as they reach the metric through its options."""

from __future__ import annotations

import numpy as np
import pytest
from metrics_support import FakeExtractor
from scipy.stats import mannwhitneyu
from synthetic_records import make_record, write_jsonl

from ditbench.bench.cell.window import noise, step_stats
from ditbench.metrics.evaluate import as_source, evaluate
from ditbench.report.gate.decide import compare_files
from ditbench.report.gate.policy import load_policy

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# ---- the gate's alpha ------------------------------------------------------------------------


def _ranked(n: int, shift_ranks: int) -> tuple[list[float], list[float]]:
    """Base and new step times (ms): n evenly spaced values each, the new ones `shift_ranks` places
    slower, so the Mann-Whitney p-value depends on n and the shift only."""
    base = [20.0 + 0.01 * i for i in range(n)]
    return base, [b + 0.01 * shift_ranks + 0.005 for b in base]


def _gate(tmp_path, base_s, new_s, policy=None):
    def rec(img_s, samples, run):
        return make_record("DiT-S/8", "fp32", "none", 8, images_per_s=img_s, samples=samples, run_id=run)

    b, n = tmp_path / "base.jsonl", tmp_path / "new.jsonl"
    write_jsonl(b, [rec(400.0, base_s, "a")])
    write_jsonl(n, [rec(360.0, new_s, "b")])  # -10%: past the 5% threshold, so the test decides
    result = compare_files(b, n, policy, False)
    (cell,) = result.cells
    return result, next(d for d in cell.metrics if d.metric == "images_per_s")


@pytest.mark.parametrize(
    "n,shift,p_range,verdict,exit_code",
    [
        # alpha 0.01 < p < 0.05: not significant at the policy's alpha, so not a regression; the change's
        # interval lies wholly beyond the threshold, so it is not a pass either (inconclusive, exit 3)
        (20, 4, (0.03, 0.035), "inconclusive", 3),
        (20, 5, (0.0105, 0.011), "inconclusive", 3),  # just above alpha
        (19, 5, (0.009, 0.0099), "regression", 1),  # just below alpha
    ],
)
def test_the_gate_uses_the_policys_alpha(tmp_path, n, shift, p_range, verdict, exit_code):
    base_s, new_s = _ranked(n, shift)
    p = mannwhitneyu(new_s, base_s, alternative="two-sided").pvalue
    assert p_range[0] < p < p_range[1]  # the reference p-value of these samples
    result, d = _gate(tmp_path, base_s, new_s)
    assert d.p_value == pytest.approx(p, rel=1e-12)
    assert d.verdict == verdict and result.exit_code == exit_code


def test_a_policy_alpha_of_0_05_makes_p_0_03_a_regression(tmp_path):
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text("alpha: 0.05\n")
    result, d = _gate(tmp_path, *_ranked(20, 4), load_policy(policy_file))
    assert 0.03 < d.p_value < 0.035 and d.verdict == "regression" and result.exit_code == 1
    # and 0.011 is not significant at alpha 0.005
    policy_file.write_text("alpha: 0.005\n")
    result, d = _gate(tmp_path, *_ranked(20, 5), load_policy(policy_file))
    assert d.verdict == "inconclusive" and result.exit_code == 3


# ---- the recorded percentiles ----------------------------------------------------------------

FIXED_SAMPLES = [
    [12.5],
    [30.0, 10.0],
    [5.0, 1.0, 4.0, 2.0, 3.0],
    [7.0, 7.0, 1.5, 9.25, 7.0, 3.0, 11.0],
    list(np.random.default_rng(7).lognormal(3.0, 0.4, size=37)),
    list(np.random.default_rng(8).gamma(2.0, 10.0, size=200)),
]


@pytest.mark.parametrize("samples", FIXED_SAMPLES, ids=lambda s: f"n={len(s)}")
def test_step_percentiles_equal_numpy(samples):
    stats = step_stats(samples)
    assert stats["p10"] == pytest.approx(np.percentile(samples, 10), rel=1e-12)
    assert stats["median"] == pytest.approx(np.percentile(samples, 50), rel=1e-12)
    assert stats["p90"] == pytest.approx(np.percentile(samples, 90), rel=1e-12)
    assert stats["samples"] == [round(x, 4) for x in samples]  # kept in the order they were timed


@pytest.mark.parametrize("samples", FIXED_SAMPLES[2:], ids=lambda s: f"n={len(s)}")
def test_noise_spread_is_p90_over_p10(samples):
    batch = 8
    from_median = batch / (np.median(samples) / 1e3)
    out = noise(samples, rate=from_median * 1.05, batch=batch)
    spread = np.percentile(samples, 90) / np.percentile(samples, 10)
    assert out["noise"]["step_spread"] == pytest.approx(spread, rel=1e-12)
    assert out["noise"]["throughput_gap"] == pytest.approx(0.05, rel=1e-9)
    assert out["noisy"] == (spread > out["noise"]["spread_bound"])


def test_noise_bounds_are_inclusive():
    # p90 / p10 exactly at the bound and a gap exactly at its bound are not noisy; a hair above is.
    samples = [10.0] * 5 + [15.0] * 5  # p10 = 10, p90 = 15: spread 1.5
    median = np.median(samples)
    at_gap = 8 / (median / 1e3)
    assert noise(samples, at_gap, 8)["noisy"] is False
    assert noise(samples, at_gap * 1.10, 8)["noise"]["throughput_gap"] == pytest.approx(0.10)
    assert noise(samples + [15.0, 15.0, 15.1], at_gap, 8)["noisy"] is True


# ---- IS splits and precision/recall k, through the options -----------------------------------


def _is_reference(logits: np.ndarray, bounds: list[tuple[int, int]]) -> tuple[float, float]:
    """exp(mean KL(p(y|x) || p(y))) per split [lo, hi), then their mean and std (ddof 0)."""
    scores = []
    for lo, hi in bounds:
        z = logits[lo:hi].astype(np.float64)
        p = np.exp(z - z.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        py = p.mean(0, keepdims=True)
        scores.append(np.exp(np.mean(np.sum(p * (np.log(p) - np.log(py)), axis=1))))
    return float(np.mean(scores)), float(np.std(scores))


def _pr_reference(samples: np.ndarray, refs: np.ndarray, k: int) -> tuple[float, float]:
    """Radius: squared distance to the k-th nearest other point; a point is covered when it lies in
    some ball of the other set (boundary included)."""
    s, r = samples.astype(np.float64), refs.astype(np.float64)

    def d2(a, b):
        return ((a[:, None, :] - b[None, :, :]) ** 2).sum(-1)

    def radii(a):
        return np.sort(d2(a, a), axis=1)[:, k]  # column 0 is the point itself

    precision = (d2(s, r) <= radii(r)[None, :]).any(1).mean()
    recall = (d2(r, s) <= radii(s)[None, :]).any(1).mean()
    return float(precision), float(recall)


@pytest.fixture(scope="module")
def images():
    rng = np.random.default_rng(0)
    samples = rng.integers(0, 256, (60, 16, 16, 3), dtype=np.uint8)
    samples[:20] //= 2  # three groups, so the splits and the neighbourhoods differ
    refs = rng.integers(0, 256, (50, 16, 16, 3), dtype=np.uint8)
    feats = FakeExtractor().extract(as_source(samples), want=("logits_unbiased", "pool3"))
    ref_feats = FakeExtractor().extract(as_source(refs), want=("pool3",))
    return samples, refs, feats, ref_feats


@pytest.mark.parametrize("splits", [1, 3, 7])
def test_is_splits_reach_the_score(images, splits):
    samples, refs, feats, _ = images
    out = evaluate(
        samples, refs, metrics="is", extractor=FakeExtractor(), is_splits=splits, cache=False, progress=False
    )
    n = len(samples)
    bounds = [(i * n // splits, (i + 1) * n // splits) for i in range(splits)]
    mean, std = _is_reference(feats["logits_unbiased"].numpy(), bounds)
    assert out["metrics"]["inception_score"] == pytest.approx(mean, rel=1e-9)
    assert out["metrics"]["inception_score_std"] == pytest.approx(std, rel=1e-7, abs=1e-12)
    assert out["settings"]["is_splits"] == splits


@pytest.mark.parametrize("k", [1, 3, 5])
def test_pr_k_reaches_precision_and_recall(images, k):
    samples, refs, feats, ref_feats = images
    out = evaluate(
        samples, refs, metrics="pr", extractor=FakeExtractor(), pr_k=k, cache=False, progress=False
    )
    want = _pr_reference(feats["pool3"].numpy(), ref_feats["pool3"].numpy(), k)
    assert (out["metrics"]["precision"], out["metrics"]["recall"]) == pytest.approx(want, abs=1e-12)
    assert out["settings"]["pr_k"] == k


def test_pr_k_changes_the_answer(images):
    _, _, feats, ref_feats = images
    a, b = feats["pool3"].numpy(), ref_feats["pool3"].numpy()
    assert len({_pr_reference(a, b, k) for k in (1, 3, 5)}) == 3  # so the test above can tell k apart


# ---- the gate's timing maths: the exact test's floor, the change interval, the crossing --------


def test_p_min_is_two_over_the_number_of_rankings():
    from math import comb

    from ditbench.report.gate.timing import p_min

    # the most extreme split of n + m ranks: 1 of C(n + m, min(n, m)) arrangements, two-sided
    assert p_min(5, 5) == pytest.approx(2 / 252) and p_min(3, 7) == pytest.approx(2 / 120)
    assert p_min(7, 3) == p_min(3, 7)
    assert p_min(1, 1) == 1.0 and p_min(1, 2) == pytest.approx(2 / 3)
    assert p_min(0, 5) == 1.0  # one arrangement: 2 / 1, capped at 1
    assert p_min(400, 400) == pytest.approx(2 / comb(800, 400)) and p_min(400, 400) > 0


def test_step_test_needs_min_samples_and_a_reachable_p():
    from ditbench.report.gate.policy import Policy
    from ditbench.report.gate.timing import StepTest

    policy = Policy(alpha=0.01, min_samples=5)
    five = [1.0, 2.0, 3.0, 4.0, 5.0]
    short = StepTest(five[:4], five, policy)
    assert not short.enough and not short.testable and short.why_not() == "n=4/5 < 5"
    assert short.ratio() is None
    at = StepTest(five, five, policy)  # p_min(5, 5) = 0.0079 < 0.01
    assert at.enough and at.testable
    loose = StepTest(five, five, Policy(alpha=0.005, min_samples=5))  # 0.0079 cannot reach 0.005
    assert loose.enough and not loose.testable and loose.why_not() == "n=5/5 cannot reach p<0.005"
    assert StepTest(five, five, Policy(alpha=2 / 252, min_samples=5)).testable is False  # strict <


def test_step_test_ratio_and_run_values():
    from ditbench.report.gate.policy import Policy
    from ditbench.report.gate.timing import StepTest

    base = [10.0, 11.0, 12.0, 13.0, 14.0, 15.0]
    new = [x * 1.5 for x in base]
    test = StepTest(base, new, Policy(alpha=0.01, min_samples=5))
    point, low, high = test.ratio()
    assert point == pytest.approx(1.5) and low <= 1.5 <= high
    assert test.ratio() == (point, low, high)
    p, shift = test.run()
    assert p == pytest.approx(mannwhitneyu(new, base, alternative="two-sided").pvalue)
    assert shift == pytest.approx(np.median(new) - np.median(base)) and shift > 0
    zero = StepTest([0.0] * 5 + [1.0], new, Policy(alpha=0.01, min_samples=5))
    assert zero.ratio() is None  # a median of 0: no ratio
    assert StepTest(new, [0.0] * 6, Policy(alpha=0.01, min_samples=5)).ratio() is None
    same = StepTest([5.0] * 6, [5.0] * 6, Policy(alpha=0.01, min_samples=5))
    assert same.run() == (1.0, 0.0)  # identical samples: p = 1
    nan = StepTest([float("nan")] + base[1:], new, Policy(alpha=0.01, min_samples=5))
    assert nan.run()[0] == 1.0  # scipy's nan p-value (a nan sample) counts as no evidence, never as p = 0


def test_change_interval_scales_the_recorded_change_by_the_ratio_interval():
    from ditbench.records.metrics import HIGHER, LOWER, TIMING, Metric
    from ditbench.report.gate.timing import _worse, change_interval

    rate = Metric("r", "r", HIGHER, "r", TIMING)
    time_ = Metric("t", "t", LOWER, "t", TIMING)
    # step time 1.1x (interval 1.0x to 1.2x): a step time of 20 -> 22 moves +10% (0% to +20%) ...
    assert change_interval(time_, 20.0, 22.0, (1.1, 1.0, 1.2)) == pytest.approx((0.0, 20.0))
    # ... and a rate 400 -> 400 / 1.1 moves by 1 / factor: 1.1 / 1.2 and 1.1 / 1.0 times the new rate
    lo, hi = change_interval(rate, 400.0, 400 / 1.1, (1.1, 1.0, 1.2))
    assert lo == pytest.approx((1 / 1.2 - 1) * 100) and hi == pytest.approx(0.0, abs=1e-12)
    assert _worse(rate, (-16.7, 0.0)) == (-0.0, 16.7) and _worse(time_, (-2.0, 3.0)) == (-2.0, 3.0)


@pytest.mark.parametrize(
    "direction,base,new,pct,min_abs,expected",
    [
        ("higher", 100.0, 94.0, 5.0, 0.0, (-6.0, "worse", True)),
        ("higher", 100.0, 95.0, 5.0, 0.0, (-5.0, "worse", False)),  # at the threshold: not beyond
        ("higher", 100.0, 106.0, 5.0, 0.0, (6.0, "better", True)),
        ("lower", 100.0, 106.0, 5.0, 0.0, (6.0, "worse", True)),
        ("lower", 100.0, 106.0, 5.0, 6.0, (6.0, "worse", True)),  # |delta| == min_abs still counts
        ("lower", 100.0, 106.0, 5.0, 6.5, (6.0, "worse", False)),
        ("lower", -50.0, -47.0, 5.0, 0.0, (6.0, "worse", True)),  # percent of |base|
        ("lower", 0.0, 0.5, 5.0, 0.0, (None, "worse", True)),  # from 0: any move is beyond a percent
        ("lower", 0.0, 0.5, 5.0, 1.0, (None, "worse", False)),
        ("lower", 3.0, 3.0, 5.0, 0.0, (0.0, "same", False)),
        ("lower", 0.0, 0.0, 5.0, 0.0, (0.0, "same", False)),
        ("lower", 5e-324, 1.0, 5.0, 0.0, (None, "worse", True)),  # the percentage overflows
    ],
)
def test_crossing_values(direction, base, new, pct, min_abs, expected):
    from ditbench.records.metrics import TIMING, Metric
    from ditbench.report.gate.result import crossing

    c = crossing(Metric("m", "m", direction, "m", TIMING), base, new, pct, min_abs)
    change, where, crossed = expected
    assert (c.direction, c.crossed) == (where, crossed)
    assert c.change_pct == (None if change is None else pytest.approx(change))


def test_crossing_verdicts_and_value_ranges():
    from ditbench.records.metrics import ANY, NONNEGATIVE, POSITIVE, TIMING, Metric, limit, limits
    from ditbench.report.gate.result import Crossing

    assert Crossing(1.0, "worse", False).verdict(True) == "unchanged"
    assert Crossing(9.0, "worse", True).verdict(False) == "noise"
    assert Crossing(9.0, "worse", True).verdict(True) == "regression"
    assert Crossing(-9.0, "better", True).verdict(True) == "improvement"
    m = {v: Metric("m", "m", "lower", "m", TIMING, v) for v in (POSITIVE, NONNEGATIVE, ANY)}
    assert [m[POSITIVE].out_of_range(v) for v in (-1.0, 0.0, 1e-9)] == [True, True, False]
    assert [m[NONNEGATIVE].out_of_range(v) for v in (-1e-9, 0.0, 2.0)] == [True, False, False]
    assert [m[ANY].out_of_range(v) for v in (-5.0, 0.0)] == [False, False]
    assert limit("images_per_s", 5.0) == "-5%" and limit("peak_mem_allocated_gib", 2.5) == "+2.5%"
    assert limits({"images_per_s": 5.0, "step_ms": 3.0}) == "images/s -5%, step ms (median) +3%"
