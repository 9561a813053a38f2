"""ADM's Inception Score splits (guided-diffusion evaluations/evaluator.py): consecutive chunks of
5,000 samples, the last one shorter, their scores averaged, against a reference written out here."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from metrics_support import FakeExtractor

from ditbench.core.errors import UserError
from ditbench.metrics.evaluate import as_source, evaluate
from ditbench.metrics.inception_score import inception_score


def _adm_reference(logits: np.ndarray) -> tuple[float, list[int]]:
    """The ADM rule spelled out: softmax, then for start = 0, 5000, 10000, ... < N the chunk
    [start, start + 5000) (shorter at the end), exp(mean_x sum_y p (log p - log mean p)) each, and
    the mean of those. Returns the score and the chunk sizes."""
    z = logits.astype(np.float64)
    preds = np.exp(z - z.max(axis=1, keepdims=True))
    preds /= preds.sum(axis=1, keepdims=True)
    scores, sizes, start = [], [], 0
    while start < len(preds):
        part = preds[start : start + 5000]
        marginal = part.mean(axis=0, keepdims=True)
        scores.append(np.exp(np.mean(np.sum(part * (np.log(part) - np.log(marginal)), axis=1))))
        sizes.append(len(part))
        start += 5000
    return float(np.mean(scores)), sizes


def _logits(n: int, classes: int = 12, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    z = rng.normal(0.0, 1.5, size=(n, classes))
    z[np.arange(n), rng.integers(0, classes, n)] += 4.0  # confident, varied predictions
    z[: n // 3] *= 0.3  # the first third less confident: chunks differ, so the split rule shows
    return z.astype(np.float32)


@pytest.mark.parametrize(
    "n,sizes", [(200, [200]), (5000, [5000]), (7500, [5000, 2500]), (50_000, [5000] * 10)]
)
def test_default_splits_are_adms_chunks_of_5000(n, sizes):
    logits = _logits(n)
    want, got_sizes = _adm_reference(logits)
    assert got_sizes == sizes
    mean, std = inception_score(torch.from_numpy(logits))
    assert mean == pytest.approx(want, rel=1e-10)
    if len(sizes) == 1:
        assert std == 0.0


def test_7500_samples_are_not_two_equal_halves():
    # The rule matters: 5,000 + 2,500 and 3,750 + 3,750 give different scores on these logits.
    logits = _logits(7500)
    adm, _ = inception_score(torch.from_numpy(logits))
    halves, _ = inception_score(torch.from_numpy(logits), splits=2)
    assert halves == pytest.approx(
        _adm_reference(logits[:3750])[0] / 2 + _adm_reference(logits[3750:])[0] / 2
    )
    assert abs(adm - halves) > 1e-3


def test_explicit_splits_stay_an_alternative():
    logits = _logits(1000)
    ten, _ = inception_score(torch.from_numpy(logits), splits=10)
    per_hundred = [_adm_reference(logits[i : i + 100])[0] for i in range(0, 1000, 100)]
    assert ten == pytest.approx(np.mean(per_hundred), rel=1e-10)
    with pytest.raises(UserError, match="at least 10 samples"):
        inception_score(torch.from_numpy(logits[:9]), splits=10)


def test_the_result_says_which_rule_was_used():
    rng = np.random.default_rng(0)
    samples = rng.integers(0, 256, (30, 16, 16, 3), dtype=np.uint8)
    refs = rng.integers(0, 256, (10, 16, 16, 3), dtype=np.uint8)
    logits = FakeExtractor().extract(as_source(samples), want=("logits_unbiased",))["logits_unbiased"]

    def run(metrics="is", **kw):
        return evaluate(
            samples, refs, metrics=metrics, extractor=FakeExtractor(), cache=False, progress=False, **kw
        )

    adm = run()
    assert adm["settings"]["is_splits"] == 0
    assert adm["settings"]["is_split_rule"] == "adm: consecutive chunks of 5000 (1 split)"
    assert adm["metrics"]["inception_score"] == pytest.approx(_adm_reference(logits.numpy())[0], rel=1e-9)
    three = run(is_splits=3)
    assert three["settings"]["is_split_rule"] == "3 equal consecutive splits (--is-splits)"
    assert "is_split_rule" not in run(metrics="kid", kid_subset_size=5)["settings"]
