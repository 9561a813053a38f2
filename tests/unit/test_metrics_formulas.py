"""The metric formulas against independent re-derivations (no network involved)."""

import numpy as np
import pytest
import scipy.linalg
import torch
from scipy.special import log_softmax, softmax

from ditbench.core.errors import UserError
from ditbench.metrics.fid import covariance_factor, feature_statistics, frechet_distance, trace_sqrt_product
from ditbench.metrics.inception_score import inception_score
from ditbench.metrics.kid import kernel_inception_distance
from ditbench.metrics.prdc import precision_recall


def _features(n, d, seed, shift=0.0):
    """ReLU'd correlated Gaussians: non-negative, correlated, like pool3 features."""
    rng = np.random.default_rng(seed)
    mix = rng.normal(size=(d, d)) / np.sqrt(d)
    return np.maximum(rng.normal(size=(n, d)) @ mix + shift, 0.0)


def _fid_sqrtm(mu1, s1, mu2, s2):
    """The classical formula (TTUR / pytorch-fid / ADM evaluator): scipy's sqrtm of S1 S2."""
    covmean = scipy.linalg.sqrtm(s1 @ s2)
    diff = mu1 - mu2
    return float(diff @ diff + np.trace(s1) + np.trace(s2) - 2 * np.trace(covmean).real)


@pytest.mark.parametrize("d,shift", [(64, 0.0), (256, 0.3)])
def test_frechet_distance_equals_scipy_sqrtm(d, shift):
    x, y = _features(4 * d, d, 1), _features(4 * d, d, 2, shift)
    mu1, s1 = x.mean(0), np.cov(x, rowvar=False)
    mu2, s2 = y.mean(0), np.cov(y, rowvar=False)
    assert np.linalg.cond(s1) < 1e4 and np.linalg.cond(s2) < 1e4  # well conditioned: sqrtm is accurate
    ours, classical = frechet_distance(mu1, s1, mu2, s2), _fid_sqrtm(mu1, s1, mu2, s2)
    assert ours > 0.01
    assert ours == pytest.approx(classical, rel=1e-8)
    # torch-fidelity's eigenvalue formula agrees where it is accurate (full-rank statistics)
    from torch_fidelity.metric_fid import fid_statistics_to_metric

    tf = fid_statistics_to_metric({"mu": mu1, "sigma": s1}, {"mu": mu2, "sigma": s2}, verbose=False)
    assert ours == pytest.approx(tf["frechet_inception_distance"], rel=1e-8)
    # symmetric in its arguments, zero on identical statistics
    assert frechet_distance(mu2, s2, mu1, s1) == pytest.approx(ours, rel=1e-10)
    assert abs(frechet_distance(mu1, s1, mu1, s1)) < 1e-8 * np.trace(s1)


def test_frechet_eigh_fallback_equals_cholesky_path():
    x, y = _features(300, 64, 3), _features(300, 64, 4, 0.2)
    s1, s2 = np.cov(x, rowvar=False), np.cov(y, rowvar=False)
    fast = trace_sqrt_product(s1, s2)  # Cholesky path (s1 positive definite)
    w, v = np.linalg.eigh(s1)
    root = (v * np.sqrt(np.clip(w, 0, None))) @ v.T
    reference = np.sqrt(np.clip(np.linalg.eigvalsh(root @ s2 @ root), 0, None)).sum()
    assert fast == pytest.approx(reference, rel=1e-10)
    # a singular s1 takes the eigh path: same value as the exact rank-deficient form
    few = x[:20]
    mu_f, s_f = few.mean(0), np.cov(few, rowvar=False)
    exact = trace_sqrt_product(None, s2, factor1=(few - mu_f) / np.sqrt(19))
    assert trace_sqrt_product(s_f, s2) == pytest.approx(exact, rel=1e-6)


def test_low_rank_factor_is_exact_for_few_samples():
    """With n < d, tr sqrt(S1 S2) = nuclear norm of F1 F2^T (S_i = F_i^T F_i): the factor form hits it."""
    d = 512
    x, y = _features(40, d, 5), _features(60, d, 6, 0.1)
    f1 = (x - x.mean(0)) / np.sqrt(39)
    f2 = (y - y.mean(0)) / np.sqrt(59)
    nuclear = np.linalg.svd(f1 @ f2.T, compute_uv=False).sum()
    s2 = f2.T @ f2
    assert trace_sqrt_product(None, s2, factor1=f1) == pytest.approx(nuclear, rel=1e-10)
    mu1, s1 = feature_statistics(torch.from_numpy(x))
    got = covariance_factor(torch.from_numpy(x), mu1).numpy()
    np.testing.assert_allclose(got.T @ got, s1, rtol=1e-10, atol=1e-12)


def test_feature_statistics_equal_numpy():
    x = _features(1000, 32, 7).astype(np.float32) + 3.0  # an offset mean exposes one-pass cancellation
    mu, sigma = feature_statistics(torch.from_numpy(x), block=128)
    np.testing.assert_allclose(mu, x.astype(np.float64).mean(0), rtol=1e-12)
    np.testing.assert_allclose(sigma, np.cov(x.astype(np.float64), rowvar=False), rtol=1e-10, atol=1e-13)


def test_frechet_rejects_mismatched_or_non_finite_statistics():
    mu, s = np.zeros(4), np.eye(4)
    with pytest.raises(UserError, match="differ in shape"):
        frechet_distance(mu, s, np.zeros(5), np.eye(5))
    with pytest.raises(UserError, match="NaN"):
        frechet_distance(mu, s, np.full(4, np.nan), s)


def _is_adm(logits, splits):
    """The ADM evaluator's Inception Score, re-derived: softmax, consecutive splits, exp(mean KL)."""
    preds = softmax(logits.astype(np.float64), axis=1)
    scores = []
    n = len(preds)
    for i in range(splits):
        part = preds[i * n // splits : (i + 1) * n // splits]
        py = part.mean(0, keepdims=True)
        kl = (part * (np.log(part) - np.log(py))).sum(1)
        scores.append(np.exp(kl.mean()))
    return np.mean(scores), np.std(scores)


def test_inception_score_equals_adm_definition():
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 3, size=(1000, 1008)).astype(np.float32)
    logits[:, :10] += 6 * np.eye(10)[rng.integers(0, 10, 1000)]  # some confident classes
    mean, std = inception_score(torch.from_numpy(logits), splits=10)
    ref_mean, ref_std = _is_adm(logits, 10)
    assert mean == pytest.approx(ref_mean, rel=1e-10)
    assert std == pytest.approx(ref_std, rel=1e-8)
    assert mean > 2  # the test data are not trivially uniform
    # torch-fidelity agrees when its shuffling is off (it draws the same consecutive splits)
    from torch_fidelity.metric_isc import isc_features_to_metric

    tf = isc_features_to_metric(torch.from_numpy(logits), splits=10, shuffle=False)
    assert mean == pytest.approx(tf["inception_score_mean"], rel=1e-10)
    # with N not divisible by splits, split boundaries are i * N // splits
    m7, _ = inception_score(torch.from_numpy(logits[:997]), splits=10)
    assert m7 == pytest.approx(_is_adm(logits[:997], 10)[0], rel=1e-10)
    with pytest.raises(UserError, match="at least 10"):
        inception_score(torch.from_numpy(logits[:9]), splits=10)
    assert np.isfinite(log_softmax(logits, axis=1)).all()


def _pr_bruteforce(samples, refs, k):
    """ADM ManifoldEstimator re-derived: squared distances, radius = (k+1)-th smallest incl. self."""

    def sq(a, b):
        return ((a[:, None, :] - b[None, :, :]) ** 2).sum(-1)

    r_ref = np.partition(sq(refs, refs), k, axis=1)[:, k]
    r_smp = np.partition(sq(samples, samples), k, axis=1)[:, k]
    precision = (sq(samples, refs) <= r_ref[None, :]).any(1).mean()
    recall = (sq(refs, samples) <= r_smp[None, :]).any(1).mean()
    return precision, recall


@pytest.mark.parametrize("block", [10000, 7])
def test_precision_recall_equal_adm_definition(block):
    rng = np.random.default_rng(1)
    # clusters: samples cover some reference modes and add one of their own, so P and R are not 0 or 1
    centres = rng.normal(0, 4, size=(6, 16))
    refs = centres[rng.integers(0, 5, 150)] + rng.normal(size=(150, 16))
    samples = centres[rng.choice([0, 1, 5], 120)] + rng.normal(0, 0.8, size=(120, 16))
    p, r = precision_recall(torch.from_numpy(samples), torch.from_numpy(refs), k=3, block=block)
    ref_p, ref_r = _pr_bruteforce(samples, refs, 3)
    assert 0.05 < ref_p < 0.95 and 0.05 < ref_r < 0.95
    assert (p, r) == (pytest.approx(ref_p, abs=1e-12), pytest.approx(ref_r, abs=1e-12))
    # torch-fidelity's fixed convention (input1 = generated) gives the same numbers
    from torch_fidelity.metric_prc import calculate_precision_recall_full

    tp, tr = calculate_precision_recall_full(
        torch.from_numpy(samples).float(), torch.from_numpy(refs).float(), 3
    )
    assert (p, r) == (pytest.approx(tp, abs=1e-6), pytest.approx(tr, abs=1e-6))  # theirs: a float32 mean


def _kid_numpy(x, y, subsets, size, seed):
    """MMD-GAN's unbiased estimator written out with explicit loops over the off-diagonal terms."""
    rng = np.random.RandomState(seed)
    d = x.shape[1]
    out = []
    for _ in range(subsets):
        a = x[rng.choice(len(x), size, replace=False)].astype(np.float64)
        b = y[rng.choice(len(y), size, replace=False)].astype(np.float64)

        def k(u, v):
            return (u @ v.T / d + 1.0) ** 3

        kaa, kbb, kab = k(a, a), k(b, b), k(a, b)
        off = ~np.eye(size, dtype=bool)
        out.append(kaa[off].mean() + kbb[off].mean() - 2 * kab.mean())
    return np.mean(out), np.std(out)


def test_kid_equals_numpy_reference_and_torch_fidelity():
    x, y = _features(300, 32, 8), _features(250, 32, 9, 0.2)
    mean, std = kernel_inception_distance(
        torch.from_numpy(x), torch.from_numpy(y), subsets=20, subset_size=50, seed=123
    )
    ref_mean, ref_std = _kid_numpy(x, y, 20, 50, 123)
    assert mean == pytest.approx(ref_mean, rel=1e-9)
    assert std == pytest.approx(ref_std, rel=1e-8)
    assert mean > 10 * std / np.sqrt(20)  # shifted sets: clearly positive
    from torch_fidelity.metric_kid import kid_features_to_metric

    tf = kid_features_to_metric(
        torch.from_numpy(x).float(),
        torch.from_numpy(y).float(),
        kid_subsets=20,
        kid_subset_size=50,
        rng_seed=123,
        verbose=False,
    )
    ours32 = kernel_inception_distance(
        torch.from_numpy(x).float(), torch.from_numpy(y).float(), subsets=20, subset_size=50, seed=123
    )
    assert ours32[0] == pytest.approx(tf["kernel_inception_distance_mean"], rel=1e-4)  # theirs in float32
    # identical distributions: near zero
    same = kernel_inception_distance(torch.from_numpy(x), torch.from_numpy(x), subsets=20, subset_size=50)
    assert abs(same[0]) < 3 * same[1]
    with pytest.raises(UserError, match="at least 500"):
        kernel_inception_distance(torch.from_numpy(x), torch.from_numpy(y), subset_size=500)


def test_singular_second_covariance_is_handled_without_rounding_noise():
    """Full-rank S1 (Cholesky path) with a rank-deficient S2: exact value = nuclear norm of F2 L."""
    d = 256
    x, y = _features(4 * d, d, 10), _features(30, d, 11, 0.1)
    s1 = np.cov(x, rowvar=False)
    f2 = (y - y.mean(0)) / np.sqrt(29)
    exact = np.linalg.svd(f2 @ np.linalg.cholesky(s1), compute_uv=False).sum()
    assert trace_sqrt_product(s1, f2.T @ f2) == pytest.approx(exact, rel=1e-9)
