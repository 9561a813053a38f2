"""The numbers the gate and the records rest on, pinned to references written out here: the gate's
significance level, the recorded step-time percentiles, and the Inception Score splits and the
precision/recall k as they reach the metric through its options."""

from __future__ import annotations

import numpy as np
import pytest
from metrics_support import FakeExtractor
from scipy.stats import mannwhitneyu
from synthetic_records import make_record, write_jsonl

from ditbench.bench.window import noise, step_stats
from ditbench.metrics.evaluate import as_source, evaluate
from ditbench.report.gate import compare_files, load_policy

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
    out = noise(samples, images_per_s=from_median * 1.05, batch=batch)
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
