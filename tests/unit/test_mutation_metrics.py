"""The metric maths on cases small enough to write out (issue 27, mutation testing of ditbench/metrics/).

Every expected value is computed here from the published definition, not read from the code:
FID the Frechet distance |mu1 - mu2|^2 + tr S1 + tr S2 - 2 tr sqrt(S1 S2) (diagonal covariances: the
square root is elementwise); KID the unbiased MMD^2 of Binkowski et al. with k(x, y) = (x.y / d + c)^p
over subsets drawn as torch-fidelity draws them; precision/recall the k-NN balls of Kynkaanniemi et
al.; the Inception Score exp(mean KL(p(y|x) || p(y))) over ADM's consecutive splits. Shapes are chosen
so that rows, columns, subsets and splits all differ, and every error message is matched whole.
"""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest
import torch

from ditbench.core.errors import UserError
from ditbench.metrics import fid, inception_score, kid, prdc
from ditbench.metrics.spec import MetricInputs, Need


def _inputs(samples, reference=None, from_images=frozenset(), count=None, warn=None):
    return MetricInputs(
        samples, reference or {}, frozenset(from_images), count, torch.device("cpu"), warn or (lambda m: None)
    )


def _exact(err, message):
    """pytest.raises' match, but the whole message."""
    return pytest.raises(err, match="^" + re.escape(message) + "$")


# --- Inception Score --------------------------------------------------------------------------------


def _is_reference(logits, bounds):
    """exp(mean_x sum_y p(y|x) (log p(y|x) - log p(y))) per split, p(y) the split's mean.

    Returns the mean and the standard deviation (ddof 0) over the splits."""
    z = np.asarray(logits, dtype=np.float64)
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    scores = []
    for lo, hi in bounds:
        part = p[lo:hi]
        py = part.mean(0)
        scores.append(np.exp(np.mean([sum(q * (np.log(q) - np.log(py))) for q in part])))
    return float(np.mean(scores)), float(np.std(scores))


def test_split_bounds_are_adms_chunks_of_5000_or_k_near_equal_parts():
    assert inception_score.split_bounds(12001) == [(0, 5000), (5000, 10000), (10000, 12001)]
    assert inception_score.split_bounds(3) == [(0, 3)]
    assert inception_score.split_bounds(7, 3) == [(0, 2), (2, 4), (4, 7)]  # i * n // k
    assert inception_score.split_bounds(12000, 1) == [(0, 12000)]  # one split: not ADM's three
    assert inception_score.split_bounds(10, 4) == [(0, 2), (2, 5), (5, 7), (7, 10)]


def test_split_rule_names_the_rule_and_the_count():
    rule = inception_score.split_rule
    assert rule(0, 5000) == "adm: consecutive chunks of 5000 (1 split)"
    assert rule(0, 5001) == "adm: consecutive chunks of 5000 (2 splits)"
    assert rule(0, 10001) == "adm: consecutive chunks of 5000 (3 splits)"
    assert rule(1, 12000) == "1 equal consecutive splits (--is-splits)"
    assert rule(3, 10) == "3 equal consecutive splits (--is-splits)"


def _small_logits(n, classes, seed):
    rng = np.random.default_rng(seed)
    z = rng.normal(0.0, 2.0, size=(n, classes))
    z[: n // 2] *= 0.2  # the first half unsure: splits differ
    return z


@pytest.mark.parametrize("n,classes,splits", [(7, 3, 2), (7, 3, 3), (5, 9, 1), (8, 6, 4)])
def test_inception_score_equals_the_definition_with_k_splits(n, classes, splits):
    z = _small_logits(n, classes, n * classes + splits)
    bounds = [(i * n // splits, (i + 1) * n // splits) for i in range(splits)]
    want = _is_reference(z, bounds)
    for given in (z, torch.from_numpy(z)):
        mean, std = inception_score.inception_score(given, splits)
        assert mean == pytest.approx(want[0], rel=1e-12) and std == pytest.approx(
            want[1], rel=1e-9, abs=1e-15
        )
    if splits > 1:
        assert want[1] > 1e-3  # the splits differ, so the std is checked


def test_inception_score_uses_adms_chunks_beyond_5000_samples():
    z = _small_logits(10003, 3, 1)  # three classes: fast, and fewer than any split
    want = _is_reference(z, [(0, 5000), (5000, 10000), (10000, 10003)])
    mean, std = inception_score.inception_score(z)
    assert (mean, std) == (pytest.approx(want[0], rel=1e-12), pytest.approx(want[1], rel=1e-9))


def test_inception_score_of_one_sample_is_one_and_of_none_an_error():
    assert inception_score.inception_score(np.array([[0.5, 2.0, -1.0]])) == (
        pytest.approx(1.0, abs=1e-15),
        0.0,
    )
    with _exact(UserError, "The Inception Score needs at least one sample; got 0."):
        inception_score.inception_score(np.zeros((0, 4)))
    with _exact(UserError, "The Inception Score with 4 splits needs at least 4 samples; got 3."):
        inception_score.inception_score(np.zeros((3, 8)), 4)


def test_the_is_metric_reads_the_unbiased_logits_and_the_splits_option():
    z = _small_logits(6, 4, 2)
    got = inception_score.IS.compute(_inputs({"logits_unbiased": torch.from_numpy(z)}), {"is_splits": 2})
    mean, std = _is_reference(z, [(0, 3), (3, 6)])
    assert got.keys() == {"inception_score", "inception_score_std"}
    assert got["inception_score"] == pytest.approx(mean, rel=1e-12)
    assert got["inception_score_std"] == pytest.approx(std, rel=1e-9)


# --- KID ----------------------------------------------------------------------------------------------


def _k(u, v, degree=3, coef0=1.0):
    return (sum(a * b for a, b in zip(u, v, strict=True)) / len(u) + coef0) ** degree


def _mmd2(x, y, **kw):
    """Binkowski et al. eq. (the unbiased estimator): pairs i != j within a set, all pairs across."""
    m = len(x)
    within = sum(_k(x[i], x[j], **kw) + _k(y[i], y[j], **kw) for i in range(m) for j in range(m) if i != j)
    cross = sum(_k(x[i], y[j], **kw) for i in range(m) for j in range(m))
    return within / (m * (m - 1)) - 2 * cross / (m * m)


_X = np.array([[0.0, 1.0, 2.0], [1.0, -1.0, 0.5], [2.0, 0.0, 1.0], [0.5, 0.5, -1.0], [3.0, 1.0, 0.0]])
_Y = np.array([[1.0, 1.0, 1.0], [0.0, 2.0, -1.0], [2.0, 2.0, 0.0], [-1.0, 0.0, 1.5]])


def test_the_polynomial_kernel_is_x_dot_y_over_d_plus_c_to_the_p():
    x, y = torch.from_numpy(_X[:2]), torch.from_numpy(_Y)
    got = kid.polynomial_kernel(x, y).numpy()
    assert got.shape == (2, 4)
    np.testing.assert_allclose(got, [[_k(a, b) for b in _Y] for a in _X[:2]], rtol=1e-14)
    got = kid.polynomial_kernel(x, y, degree=2, coef0=0.5).numpy()
    np.testing.assert_allclose(got, [[_k(a, b, 2, 0.5) for b in _Y] for a in _X[:2]], rtol=1e-14)


@pytest.mark.parametrize("kw", [{}, {"degree": 2, "coef0": 0.25}])
def test_mmd2_unbiased_leaves_out_the_diagonal_within_each_set(kw):
    x, y = _X[:4], _Y
    got = kid.mmd2_unbiased(torch.from_numpy(x), torch.from_numpy(y), **kw)
    assert got == pytest.approx(_mmd2(x, y, **kw), rel=1e-12)


def _kid_reference(s, r, subsets, size, seed, **kw):
    rng = np.random.RandomState(seed)  # torch-fidelity's draws: samples then reference, per subset
    values = []
    for _ in range(subsets):
        a = s[rng.choice(len(s), size, replace=False)]
        b = r[rng.choice(len(r), size, replace=False)]
        values.append(_mmd2(a, b, **kw))
    return float(np.mean(values)), float(np.std(values))


def test_kid_averages_the_subsets_drawn_without_replacement():
    s, r = _X, _Y * 1.5
    # a subset as large as the smaller set: allowed, and every draw a permutation (replace=False)
    got = kid.kernel_inception_distance(torch.from_numpy(s).float(), r, subsets=3, subset_size=4, seed=7)
    want = _kid_reference(s.astype(np.float32).astype(np.float64), r, 3, 4, 7)
    assert got == (pytest.approx(want[0], rel=1e-9), pytest.approx(want[1], rel=1e-7))
    assert want[1] > 1e-3  # the subsets differ, so the std is checked
    got = kid.kernel_inception_distance(s, r, subsets=4, subset_size=2, seed=3, degree=2, coef0=0.5)
    want = _kid_reference(s, r, 4, 2, 3, degree=2, coef0=0.5)
    assert got == (pytest.approx(want[0], rel=1e-12), pytest.approx(want[1], rel=1e-9))


def test_kid_refuses_subsets_larger_than_a_set_or_smaller_than_two():
    msg = (
        "KID with subsets of 5 needs at least 5 samples and reference images; got 5 and 4. Lower "
        "--kid-subset-size or leave kid out of --metrics."
    )
    with _exact(UserError, msg):
        kid.kernel_inception_distance(_X, _Y, subsets=1, subset_size=5)
    with _exact(UserError, msg.replace("got 5 and 4", "got 4 and 5")):
        kid.kernel_inception_distance(_Y, _X, subsets=1, subset_size=5)
    with _exact(UserError, "--kid-subset-size must be at least 2; got 1."):
        kid.kernel_inception_distance(_X, _Y, subsets=1, subset_size=1)


_KID_OPTIONS = {"kid_subsets": 3, "kid_subset_size": 3, "kid_seed": 11, "kid_degree": 2, "kid_coef0": 0.5}


def test_the_kid_metric_passes_every_option():
    inputs = _inputs({"pool3": torch.from_numpy(_X).float()}, {"pool3": _Y.astype(np.float32)})
    got = kid.KID.compute(inputs, _KID_OPTIONS)
    want = _kid_reference(_X, _Y, 3, 3, 11, degree=2, coef0=0.5)  # _X, _Y: exact in float32
    assert got.keys() == {"kid", "kid_std"}
    assert (got["kid"], got["kid_std"]) == (
        pytest.approx(want[0], rel=1e-12),
        pytest.approx(want[1], rel=1e-9),
    )


def test_the_kid_resampler_equals_the_definition_on_drawn_samples(monkeypatch):
    """With repeats in the draw, and past the resampler's 1000-row blocks (1003 samples)."""
    rng = np.random.default_rng(4)
    s = rng.normal(size=(1003, 2)).astype(np.float32)
    r = (rng.normal(size=(6, 2)) + 0.5).astype(np.float32)
    inputs = _inputs({"pool3": torch.from_numpy(s)}, {"pool3": r})
    monkeypatch.setattr(kid, "KERNEL_CACHE_BYTES", 8 * 1003 * 1003)  # exactly the kernel: still kept
    one = kid.KID.resampler(inputs, _KID_OPTIONS)
    index = rng.integers(0, 1003, 1003)
    index[:5] = [1001, 1001, 1001, 1002, 1000]  # rows past the first block, one drawn three times
    got = one(index)
    drawn = s[index].astype(np.float64)
    # the subsets `kernel_inception_distance` draws from the drawn set, positions depending only on N
    want = _kid_reference(drawn, r.astype(np.float64), 3, 3, 11, degree=2, coef0=0.5)
    assert got.keys() == {"kid", "kid_std"}
    assert (got["kid"], got["kid_std"]) == (
        pytest.approx(want[0], rel=1e-9),
        pytest.approx(want[1], rel=1e-9),
    )
    monkeypatch.setattr(kid, "KERNEL_CACHE_BYTES", 8 * 1003 * 1003 - 1)
    assert kid.KID.resampler(inputs, _KID_OPTIONS) is None


def test_kid_scores_subsets_on_the_device_asked_for_else_the_samples_device(monkeypatch):
    """Where the kernels are computed: `meta` tensors (no data) stand in for a second device."""
    seen = []

    def spy(x, y, **kernel_args):
        seen.append((x.device.type, y.device.type, x.dtype, y.dtype, x.shape, y.shape, kernel_args))
        return float(len(seen))

    monkeypatch.setattr(kid, "mmd2_unbiased", spy)
    meta = ("meta", "meta", torch.float64, torch.float64, (3, 3), (3, 3))
    assert kid.kernel_inception_distance(_X, _Y, subsets=2, subset_size=3, device="meta") == (1.5, 0.5)
    assert seen == [(*meta, {})] * 2
    seen.clear()
    on_meta = torch.from_numpy(_X).float().to("meta")  # no device given: the samples' device
    kid.kernel_inception_distance(on_meta, torch.from_numpy(_Y).float(), subsets=2, subset_size=3, degree=2)
    assert seen == [(*meta, {"degree": 2})] * 2
    seen.clear()
    inputs = MetricInputs(
        {"pool3": torch.from_numpy(_X).float()}, {"pool3": _Y}, frozenset(), 4, torch.device("meta"), print
    )
    assert kid.KID.compute(inputs, _KID_OPTIONS) == {"kid": 2.0, "kid_std": pytest.approx(np.std([1, 2, 3]))}
    assert seen == [(*meta, {"degree": 2, "coef0": 0.5})] * 3


# --- FID ----------------------------------------------------------------------------------------------


def test_feature_statistics_are_the_mean_and_the_ddof_1_covariance_over_blocks():
    x = np.array([[1.0, 2.0], [3.0, 0.0], [0.0, 1.0], [4.0, 5.0], [2.0, 2.0]])  # 5 rows, 2 columns
    mu_want = [sum(r[0] for r in x) / 5, sum(r[1] for r in x) / 5]
    cov_want = [
        [sum((r[a] - mu_want[a]) * (r[b] - mu_want[b]) for r in x) / 4 for b in (0, 1)] for a in (0, 1)
    ]
    for block in (2, 3, 8192):
        mu, sigma = fid.feature_statistics(torch.from_numpy(x).float(), block=block)
        assert mu.dtype == np.float64 and sigma.dtype == np.float64
        np.testing.assert_allclose(mu, mu_want, rtol=1e-15)
        np.testing.assert_allclose(sigma, cov_want, rtol=1e-14)
    mu, sigma = fid.feature_statistics(x[:2])  # two samples are enough
    np.testing.assert_allclose(sigma, [[2.0, -2.0], [-2.0, 2.0]], rtol=1e-15)
    with _exact(UserError, "A covariance needs at least 2 samples; got 1."):
        fid.feature_statistics(x[:1])


def test_the_covariance_factor_is_the_centred_features_over_sqrt_n_minus_1():
    x = torch.tensor([[1.0, 2.0, 0.0], [3.0, 0.0, 1.0], [2.0, 4.0, 2.0], [0.0, 1.0, 5.0]])
    mu = x.double().mean(0).numpy()
    f = fid.covariance_factor(x, mu).numpy()
    np.testing.assert_allclose(f, (x.double().numpy() - mu) / np.sqrt(3), rtol=1e-15)
    np.testing.assert_allclose(f.T @ f, np.cov(x.double().numpy(), rowvar=False), rtol=1e-14, atol=1e-15)


def test_trace_sqrt_product_of_diagonal_covariances_on_every_route():
    """tr sqrt(S1 S2) = sum sqrt(s1_i s2_i) for diagonal S1, S2; values below 1 catch clamps at 1."""
    s2 = np.diag([0.09, 4.0, 0.25, 1.44])
    full = np.diag([0.16, 0.36, 9.0, 0.04])  # positive definite: Cholesky
    assert fid.trace_sqrt_product(full, s2) == pytest.approx(0.12 + 1.2 + 1.5 + 0.24, rel=1e-13)
    singular = np.diag([0.16, 0.0, 0.49, 0.0])  # eigh route (Cholesky fails at the second pivot)
    assert fid.trace_sqrt_product(singular, s2) == pytest.approx(0.12 + 0.35, rel=1e-12)
    first = np.diag([0.0, 0.36, 0.49, 0.0])  # Cholesky fails at the first pivot (info 1)
    assert fid.trace_sqrt_product(first, s2) == pytest.approx(1.2 + 0.35, rel=1e-12)
    assert fid.trace_sqrt_product([[4.0]], [[9.0]]) == pytest.approx(6.0, rel=1e-15)  # 1 x 1
    # float32 covariances are read as float64 (0.25, 2.25, ... are float32 numbers)
    a32, b32 = np.diag([0.25, 4.0, 2.25, 1.0]).astype(np.float32), np.diag([4.0, 0.25, 1.0, 0.0625])
    for s1_, s2_ in ((a32, b32), (b32, a32), (a32.astype(np.float64), b32.astype(np.float32))):
        assert fid.trace_sqrt_product(s1_, s2_) == pytest.approx(1.0 + 1.0 + 1.5 + 0.25, rel=1e-14)
    # a factor F with F^T F = diag(0.16, 0, 0.49, 0): rows 0.4 e0 and 0.7 e2, numpy or torch
    f = np.array([[0.4, 0.0, 0.0, 0.0], [0.0, 0.0, 0.7, 0.0]])
    for factor in (f, torch.from_numpy(f)):
        assert fid.trace_sqrt_product(None, s2, factor1=factor) == pytest.approx(0.12 + 0.35, rel=1e-12)
    # identical samples: a zero factor, no direction kept, tr sqrt(0 S2) = 0
    assert fid.trace_sqrt_product(None, s2, factor1=np.zeros((3, 4))) == 0.0


def test_on_the_cpu_the_eigenvalues_come_from_numpys_lapack(monkeypatch):
    """The module's CPU choice (numpy's solver, 2-5x faster there than torch's): both routes' solvers."""
    used = []
    for name in ("eigvalsh", "eigh"):
        original = getattr(np.linalg, name)

        def spy(m, _name=name, _original=original):
            used.append(_name)
            return _original(m)

        monkeypatch.setattr(np.linalg, name, spy)
    s2 = np.diag([0.09, 4.0, 0.25, 1.44])
    assert fid.trace_sqrt_product(np.diag([0.16, 0.0, 0.49, 0.0]), s2) == pytest.approx(0.47, rel=1e-12)
    assert used == ["eigh", "eigvalsh"]


def test_the_low_rank_route_drops_the_centred_null_direction_exactly():
    """3 centred points in 4-d span 2 directions: the third singular value is rounding, dropped."""
    x = np.array([[1.0, 0.0, 2.0, 0.0], [0.0, 3.0, 0.0, 1.0], [2.0, 1.0, 1.0, 2.0]])
    f = (x - x.mean(0)) / np.sqrt(2)
    s2 = np.diag([2.0, 0.5, 1.0, 3.0])
    # tr sqrt(F^T F S2) = nuclear norm of F sqrt(S2) (its singular values are the sqrt eigenvalues)
    want = np.linalg.svd(f @ np.sqrt(s2), compute_uv=False)[:2].sum()
    assert fid.trace_sqrt_product(None, s2, factor1=f) == pytest.approx(want, rel=1e-12)


def test_frechet_distance_of_diagonal_gaussians_written_out():
    mu1, mu2 = np.array([1.0, 2.0, -1.0]), np.array([0.5, 0.0, 1.0])
    s1, s2 = np.diag([1.0, 0.25, 4.0]), np.diag([4.0, 1.0, 0.09])
    want = (0.25 + 4.0 + 4.0) + (1.0 + 0.25 + 4.0) + (4.0 + 1.0 + 0.09) - 2 * (2.0 + 0.5 + 0.6)
    assert fid.frechet_distance(mu1, s1, mu2, s2) == pytest.approx(want, rel=1e-13)
    assert fid.frechet_distance(list(mu1), s1.tolist(), mu2, s2, device="cpu") == pytest.approx(
        want, rel=1e-13
    )
    # set 1 given with its factor (3 samples in 4-d: rank 2): the low-rank route
    x = _FEW.astype(np.float64)
    m1, c1 = x.mean(0), np.cov(x, rowvar=False)
    mu2, s2 = np.array([0.5, 1.0, 1.5, 0.0]), np.diag([2.0, 0.5, 1.0, 3.0])
    got = fid.frechet_distance(m1, c1, mu2, s2, factor1=(x - m1) / np.sqrt(2))
    assert got == pytest.approx(_fid_reference(x, mu2, s2), rel=1e-10)


def test_frechet_distance_computes_float32_statistics_in_float64():
    """4097^2 and 2^24 + 1 + 1 are not float32 numbers: summed in float32 they would round."""
    mu1, s1 = np.array([4097.0, 0.0, 0.0]), np.diag([2.0**24, 1.0, 1.0])
    mu2, s2 = np.zeros(3), np.eye(3)
    want = 4097.0**2 + (2.0**24 + 2) + 3 - 2 * (4096 + 1 + 1)  # 33,554,434: exact in float64
    for args in [
        (mu1.astype(np.float32), s1, mu2, s2),
        (mu2, s2, mu1.astype(np.float32), s1),
        (mu1, s1.astype(np.float32), mu2, s2),
        (mu2, s2, mu1, s1.astype(np.float32)),
    ]:
        assert fid.frechet_distance(*args) == pytest.approx(want, rel=1e-15)


def test_frechet_distance_names_what_is_wrong_with_the_statistics():
    mu, s = np.zeros(2), np.eye(2)
    shape_msg = "Feature means differ in shape: {} vs {}; the statistics come from different feature layers."
    with _exact(UserError, shape_msg.format((2,), (3,))):
        fid.frechet_distance(mu, s, np.zeros(3), np.eye(3))
    with _exact(UserError, shape_msg.format((1, 2), (1, 2))):
        fid.frechet_distance(mu[None], s, mu[None], s)
    with _exact(UserError, "Covariances have shapes (3, 3) and (2, 2); expected (2, 2)."):
        fid.frechet_distance(mu, np.eye(3), mu, s)
    with _exact(UserError, "Covariances have shapes (2, 2) and (2, 3); expected (2, 2)."):
        fid.frechet_distance(mu, s, mu, np.ones((2, 3)))
    for where, args in [
        ("mu", (np.array([np.nan, 0.0]), s, mu, s)),
        ("mu", (mu, s, np.array([0.0, np.inf]), s)),
        ("sigma", (mu, np.full((2, 2), np.nan), mu, s)),
        ("sigma", (mu, s, mu, np.array([[1.0, 0.0], [0.0, -np.inf]]))),
    ]:
        with _exact(UserError, f"The statistics' `{where}` holds NaN or infinite values."):
            fid.frechet_distance(*args)


_FEW = np.array([[1.0, 2.0, 0.0, 1.0], [3.0, 0.0, 1.0, 2.0], [0.0, 1.0, 4.0, 0.0]], dtype=np.float32)


def _fid_reference(x, mu2, s2):
    """The distance of samples x against (mu2, diagonal s2), the root of S1 S2 through S1's eigenvectors."""
    x = x.astype(np.float64)
    mu1, s1 = x.mean(0), np.cov(x, rowvar=False)
    root2 = np.sqrt(s2)  # diagonal: exact
    ev = np.clip(np.linalg.eigvalsh(root2 @ s1 @ root2), 0, None)  # similar to S1 S2
    ev[ev < 1e-12] = 0.0
    return float((mu1 - mu2) @ (mu1 - mu2) + np.trace(s1) + np.trace(s2) - 2 * np.sqrt(ev).sum())


@pytest.mark.parametrize(
    "n", [3, 4, 6]
)  # fewer samples than the 4 dims (warned, low-rank route), as many, more
def test_the_frechet_metric_warns_below_dim_samples_and_scores_the_definition(n):
    rng = np.random.default_rng(n)
    x = np.concatenate([_FEW, rng.normal(size=(3, 4)).astype(np.float32)])[:n]
    ref = {"mu": np.array([0.5, 1.0, 1.5, 0.0]), "sigma": np.diag([2.0, 0.5, 1.0, 3.0])}
    told = []
    compute = fid._frechet_metric("fid", "mu", "sigma", "pool3", 4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = compute(_inputs({"pool3": torch.from_numpy(x)}, ref, count=3, warn=told.append), {})
    assert got.keys() == {"fid"}
    assert got["fid"] == pytest.approx(_fid_reference(x, ref["mu"], ref["sigma"]), rel=1e-9)
    if n < 4:
        msg = (
            f"fid: {n} samples for 4-d features: the covariance is singular and the distance is biased "
            "upward (papers use 50,000 samples)."
        )
        assert told == [msg]
        assert [(w.category, str(w.message), w.filename) for w in caught] == [
            (fid.FewSamplesWarning, msg, __file__)  # stacklevel: the caller's line
        ]
    else:
        assert told == [] and caught == []


def test_the_frechet_metric_warns_about_a_small_reference_only_when_built_from_images():
    x = np.concatenate([_FEW, _FEW[::-1] * 2 + 1])  # 6 samples, 4 dims: enough
    ref = {"mu_s": np.zeros(4), "sigma_s": np.eye(4)}
    compute = fid._frechet_metric("sfid", "mu_s", "sigma_s", "spatial", 4)
    for count, from_images, warned in [(3, {"mu_s"}, True), (4, {"mu_s"}, False), (3, {"mu"}, False)]:
        told = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compute(_inputs({"spatial": torch.from_numpy(x)}, ref, from_images, count, told.append), {})
        msg = (
            "sfid: 3 reference images for 4-d features: the covariance is singular and the distance is "
            "biased upward (papers use 50,000 samples)."
        )
        assert told == ([msg] if warned else [])
    told = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compute(_inputs({"spatial": torch.from_numpy(_FEW)}, ref, {"mu_s"}, 2, told.append), {})
    assert told == [
        "sfid: 3 samples and 2 reference images for 4-d features: the covariance is singular and the "
        "distance is biased upward (papers use 50,000 samples)."
    ]


def test_the_frechet_resampler_scores_each_draw_by_the_definition():
    ref = {"mu": np.array([0.5, 1.0, 1.5, 0.0]), "sigma": np.diag([2.0, 0.5, 1.0, 3.0])}
    prepare = fid._frechet_resampler("fid", "mu", "sigma", "pool3")
    assert (
        prepare(_inputs({"pool3": torch.from_numpy(np.concatenate([_FEW, _FEW[:1] + 1]))}, ref), {}) is None
    )
    ref32 = {
        key: value.astype(np.float32) for key, value in ref.items()
    }  # float32 statistics: read as float64
    for given in (ref, ref32):
        one = prepare(_inputs({"pool3": torch.from_numpy(_FEW)}, given), {})
        for index in ([0, 1, 2], [2, 2, 0], [1, 0, 1]):
            got = one(np.array(index))
            assert got.keys() == {"fid"}
            assert got["fid"] == pytest.approx(_fid_reference(_FEW[index], ref["mu"], ref["sigma"]), rel=1e-9)


def test_a_covariance_needs_two_images_on_each_side():
    assert fid._covariance_need({}) == Need(2, 2, "a covariance needs at least 2 images per set")
    assert fid.FID.needs({}) == fid.SFID.needs({}) == fid._covariance_need({})


# --- precision and recall -----------------------------------------------------------------------------


def _sq(a, b):
    return np.array([[sum((u - v) ** 2 for u, v in zip(p, q, strict=True)) for q in b] for p in a])


def _radii(points, k):
    """Squared distance to the k-th nearest other point (the point itself not counted)."""
    d = _sq(points, points)
    return np.array([sorted(np.delete(row, i))[k - 1] for i, row in enumerate(d)])


def _covered(query, points, radii):
    return (_sq(query, points) <= radii[None, :]).any(1)


def test_squared_distances_between_sets_of_different_sizes():
    a, b = _X[:2], _Y
    got = prdc._squared_distances(torch.from_numpy(a), torch.from_numpy(b)).numpy()
    np.testing.assert_allclose(got, _sq(a, b), rtol=1e-14)
    same = prdc._squared_distances(torch.from_numpy(_Y), torch.from_numpy(_Y)).numpy()
    assert (same >= 0).all() and (np.diag(same) < 1e-12).all()  # clamped at 0, not above


# Points on a line, with integer squared distances (exact in float32): 0 1 3 6 10 15 21
_LINE = np.array([[0.0, 0.0], [1.0, 0.0], [3.0, 0.0], [6.0, 0.0], [10.0, 0.0], [15.0, 0.0], [21.0, 0.0]])


@pytest.mark.parametrize("k,block", [(1, 10000), (2, 2), (3, 3), (3, 10000), (6, 4)])
def test_knn_radii_are_the_kth_nearest_other_point(k, block):
    got = prdc.knn_radii(torch.from_numpy(_LINE).float(), k, block).numpy()
    np.testing.assert_array_equal(got, _radii(_LINE, k))


def test_knn_radii_keep_the_features_precision():
    """4097^2 and 4097.5^2 are not float32 numbers: float64 features keep float64 radii."""
    feats = torch.tensor([[0.0], [4097.0], [8194.5]], dtype=torch.float64)
    got = prdc.knn_radii(feats, 1)
    assert got.dtype == torch.float64
    assert got.tolist() == [4097.0**2, 4097.0**2, 4097.5**2]


def test_knn_radii_need_k_plus_one_points():
    assert prdc.knn_radii(torch.from_numpy(_LINE[:4]), 3).tolist() == [36.0, 25.0, 9.0, 36.0]
    with _exact(UserError, "Precision/recall with k=3 needs at least 4 points per set; got 3."):
        prdc.knn_radii(torch.from_numpy(_LINE[:3]), 3)


def test_manifold_coverage_includes_the_boundary_and_every_block():
    points = torch.tensor([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])
    radii = torch.tensor([4.0, 1.0, 9.0])
    query = torch.tensor(
        [[2.0, 0.0], [2.0, 1.0], [9.0, 0.0], [11.0, 1.0], [0.0, 13.0], [0.0, 14.0], [5.0, 5.0]]
    )
    want = [True, False, True, False, True, False, False]  # (2, 0) and (0, 13) exactly on a boundary
    for block in (1, 2, 10000):
        assert prdc.manifold_coverage(query, points, radii, block).tolist() == want


def _pr_reference(s, r, k):
    return float(_covered(s, r, _radii(r, k)).mean()), float(_covered(r, s, _radii(s, k)).mean())


_S = np.array(
    [
        [0.0, 0.0],
        [1.0, 0.0],
        [0.0, 2.0],
        [5.0, 5.0],
        [2.0, 2.0],
        [9.0, 0.0],
        [-20.0, 0.0],
        [14.0, 14.0],
        [15.0, 15.0],
    ]
)
_R = np.array([[0.0, 1.0], [1.0, 1.0], [3.0, 0.0], [8.0, 8.0], [0.0, 6.0], [-8.0, 20.0]])


@pytest.mark.parametrize("k,block", [(1, 10000), (2, 2), (3, 4)])
def test_precision_and_recall_are_the_shares_inside_the_other_sets_balls(k, block):
    want = _pr_reference(_S, _R, k)
    assert 0 < want[0] < 1 and 0 < want[1] < 1  # k = 1, 2, 3: 6/9, 7/9, 8/9 and 4/6, 5/6, 5/6
    got = prdc.precision_recall(torch.from_numpy(_S), _R, k=k, block=block)
    assert got == want
    assert prdc.precision_recall(_S, torch.from_numpy(_R), k, block, "cpu", torch.float64) == want
    inputs = _inputs({"pool3": torch.from_numpy(_S).float()}, {"pool3": _R})
    assert prdc.PR.compute(inputs, {"pr_k": k, "pr_block_size": block}) == {
        "precision": want[0],
        "recall": want[1],
    }


@pytest.mark.parametrize("neighbours", [32, 3, 1])
def test_the_pr_resampler_equals_the_definition_on_drawn_samples(neighbours, monkeypatch):
    """Draws with copies (a sample drawn c times has c - 1 others at distance 0) and without."""
    monkeypatch.setattr(prdc, "NEIGHBOURS", neighbours)
    s = np.concatenate([_S[:6], _S[:3] + 0.5, [[4.0, 4.0]]]).astype(np.float32)  # 10 samples
    r = np.concatenate([_R, [[1.0, 0.5], [5.0, 4.0]]]).astype(np.float32)
    for k, block in ((3, 4), (1, 10000), (2, 3)):
        one = prdc.PR.resampler(
            _inputs({"pool3": torch.from_numpy(s)}, {"pool3": r}), {"pr_k": k, "pr_block_size": block}
        )
        for index in (
            [0, 1, 2, 3, 4, 5, 6, 7, 8, 9],
            [0, 0, 0, 4, 4, 7, 9, 9, 2, 3],
            [5, 5, 5, 5, 1, 1, 8, 8, 8, 6],
        ):
            got = one(np.array(index))
            assert got == dict(zip(("precision", "recall"), _pr_reference(s[index], r, k), strict=True)), (
                k,
                index,
            )


def test_the_pr_metric_passes_k_block_and_the_device_on(monkeypatch):
    seen = []

    def spy(samples, ref, **kw):
        seen.append((samples.dtype, ref.dtype, kw))
        return 0.25, 0.5

    monkeypatch.setattr(prdc, "precision_recall", spy)
    inputs = MetricInputs(
        {"pool3": torch.from_numpy(_S).float()}, {"pool3": _R}, frozenset(), 6, torch.device("meta"), print
    )
    assert prdc.PR.compute(inputs, {"pr_k": 2, "pr_block_size": 5}) == {"precision": 0.25, "recall": 0.5}
    # the reference (float64 here) is read as float32, like the samples
    assert seen == [(torch.float32, torch.float32, {"k": 2, "block": 5, "device": torch.device("meta")})]


def test_the_pr_resampler_blocks_its_distances_and_reads_any_float_reference(monkeypatch):
    """The block size reaches every distance pass; a float64 reference and more dims than samples
    (more neighbours asked for than there are others) score as the definition says."""
    blocks = []
    for name in ("knn_radii", "manifold_coverage"):
        original = getattr(prdc, name)

        def spy(*args, _original=original, **kw):
            blocks.append(args[-1] if len(args) in (3, 4) else kw.get("block"))
            return _original(*args, **kw)

        monkeypatch.setattr(prdc, name, spy)
    rng = np.random.default_rng(5)
    s = rng.integers(0, 4, size=(6, 12)).astype(np.float32)  # 6 samples in 12 dims: 5 others each
    r = rng.integers(0, 4, size=(5, 12)).astype(np.float64)
    one = prdc.PR.resampler(
        _inputs({"pool3": torch.from_numpy(s)}, {"pool3": r}), {"pr_k": 2, "pr_block_size": 3}
    )
    assert blocks == [3, 3]
    for index in ([0, 1, 2, 3, 4, 5], [0, 0, 1, 1, 2, 5]):
        got = one(np.array(index))
        assert got == dict(zip(("precision", "recall"), _pr_reference(s[index], r, 2), strict=True))


def test_precision_recall_compute_where_and_in_the_precision_asked(monkeypatch):
    """`meta` tensors (no data) stand in for a second device; the spies record what each pass gets."""
    calls = []

    def radii(feats, k, block="default"):
        calls.append(("radii", feats.device.type, feats.dtype, feats.shape[0], k, block))
        return f"radii of {feats.shape[0]}"

    def cover(query, points, radii, block="default"):
        calls.append(
            ("cover", query.device.type, points.device.type, query.dtype, points.dtype, radii, block)
        )
        return torch.tensor([True, False, False, False])

    monkeypatch.setattr(prdc, "knn_radii", radii)
    monkeypatch.setattr(prdc, "manifold_coverage", cover)
    assert prdc.precision_recall(_S, _R, k=2, block=5, device="meta") == (0.25, 0.25)
    f32 = torch.float32
    assert calls == [
        ("radii", "meta", f32, 6, 2, 5),
        ("cover", "meta", "meta", f32, f32, "radii of 6", 5),
        ("radii", "meta", f32, 9, 2, 5),
        ("cover", "meta", "meta", f32, f32, "radii of 9", 5),
    ]
    calls.clear()
    on_meta = torch.from_numpy(_S).to("meta")  # no device given: the samples' device
    prdc.precision_recall(on_meta, _R, k=1, block=4, dtype=torch.float64)
    f64 = torch.float64
    assert calls == [
        ("radii", "meta", f64, 6, 1, 4),
        ("cover", "meta", "meta", f64, f64, "radii of 6", 4),
        ("radii", "meta", f64, 9, 1, 4),
        ("cover", "meta", "meta", f64, f64, "radii of 9", 4),
    ]


def test_the_pr_resampler_covers_with_the_first_sample_and_with_copies_at_radius_zero():
    """1-d: sample 0 alone covers reference 1; sample 30 drawn k + 1 = 2 times has radius 0 (its copy),
    so it covers the reference at 30 and not the one at 30.5."""
    s = np.array([[0.0], [10.0], [11.0], [12.0], [30.0]], dtype=np.float32)
    r = np.array([[1.0], [11.0], [30.0], [30.5]], dtype=np.float32)
    one = prdc.PR.resampler(
        _inputs({"pool3": torch.from_numpy(s)}, {"pool3": r}), {"pr_k": 1, "pr_block_size": 2}
    )
    index = np.array([0, 1, 2, 4, 4])
    want = _pr_reference(s[index], r, 1)
    assert want[1] == 0.75
    assert one(index) == {"precision": want[0], "recall": want[1]}


# --- where tensors are made (a CPU stand-in for a second device) ----------------------------------------


class _NewTensorsOnMeta(torch.overrides.TorchFunctionMode):
    """torch's default device set to `meta`, for new tensors only: a factory call, or `as_tensor` of
    non-tensor data, given no device makes a meta tensor. (`torch.device("meta")` itself also moves
    `as_tensor(cpu_tensor)` to meta, so no CPU features could be used under it.) A tensor made without
    the inputs' device then meets the CPU inputs on another device: an error."""

    FACTORIES = frozenset({torch.zeros, torch.ones, torch.empty, torch.full, torch.tensor, torch.as_tensor})

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if (
            func in self.FACTORIES
            and kwargs.get("device") is None
            and not (args and torch.is_tensor(args[0]))
        ):
            kwargs["device"] = "meta"
        return func(*args, **kwargs)


def test_new_tensors_on_meta_places_only_unplaced_new_tensors():
    on_cpu = torch.ones(2)
    with _NewTensorsOnMeta():
        assert torch.zeros(2).device.type == torch.as_tensor(np.ones(2)).device.type == "meta"
        assert torch.zeros(2, device=None).device.type == "meta"
        assert torch.zeros(2, device="cpu").device.type == torch.as_tensor(on_cpu).device.type == "cpu"


def test_feature_statistics_and_the_factor_are_made_on_the_features_device():
    x = np.array([[1.0, 2.0], [3.0, 0.0], [0.0, 1.0], [4.0, 5.0], [2.0, 2.0]])  # as in the test above
    with _NewTensorsOnMeta():
        mu, sigma = fid.feature_statistics(torch.from_numpy(x).float(), block=2)
        f = fid.covariance_factor(torch.from_numpy(x).float(), mu)
    np.testing.assert_allclose(mu, [2.0, 2.0], rtol=1e-15)
    np.testing.assert_allclose(sigma, [[2.5, 1.5], [1.5, 3.5]], rtol=1e-15)
    assert f.device.type == "cpu" and f.dtype == torch.float64
    np.testing.assert_allclose(f.numpy(), (x - 2.0) / 2.0, rtol=1e-15)  # sqrt(n - 1) = 2


def test_the_frechet_distance_is_computed_on_the_device_asked_for():
    """Under torch's default device `meta`, every route still computes on the CPU it is given."""
    s2 = np.diag([0.09, 4.0, 0.25, 1.44])
    f = np.array([[0.4, 0.0, 0.0, 0.0], [0.0, 0.0, 0.7, 0.0]])  # F^T F = diag(0.16, 0, 0.49, 0)
    mu1, mu2 = np.array([1.0, 0.0, 0.0, 2.0]), np.zeros(4)
    with torch.device("meta"):
        assert fid.trace_sqrt_product(np.diag([0.16, 0.36, 9.0, 0.04]), s2) == pytest.approx(3.06, rel=1e-13)
        assert fid.trace_sqrt_product(np.diag([0.16, 0.0, 0.49, 0.0]), s2) == pytest.approx(0.47, rel=1e-12)
        for factor in (f, torch.from_numpy(f)):
            assert fid.trace_sqrt_product(None, s2, factor1=factor) == pytest.approx(0.47, rel=1e-12)
        got = fid.frechet_distance(mu1, np.diag([0.16, 0.0, 0.49, 0.0]), mu2, s2, device="cpu")
    # |mu1 - mu2|^2 + tr S1 + tr S2 - 2 tr sqrt(S1 S2) = 5 + 0.65 + 5.78 - 0.94
    assert got == pytest.approx(5 + 0.65 + 5.78 - 0.94, rel=1e-13)


def test_the_frechet_distance_and_metric_pass_the_device_on(monkeypatch):
    """Spies record the device each step gets; `meta` stands in for a second device."""
    seen = []

    def trace_spy(sigma1, sigma2, device="cpu", factor1=None):
        seen.append(("trace", device))
        return 1.0

    monkeypatch.setattr(fid, "trace_sqrt_product", trace_spy)
    assert (
        fid.frechet_distance(np.zeros(2), np.eye(2), np.ones(2), np.eye(2), device="meta") == 2.0 + 2 + 2 - 2
    )
    assert seen == [("trace", "meta")]
    seen.clear()

    def stats_spy(x):
        seen.append(("stats", x.device.type))
        return np.zeros(4), np.eye(4)

    def factor_spy(x, mu):
        seen.append(("factor", x.device.type))
        return "F"

    def distance_spy(mu1, sigma1, mu2, sigma2, device, factor1):
        seen.append(("distance", device.type, factor1))
        return 7.0

    monkeypatch.setattr(fid, "feature_statistics", stats_spy)
    monkeypatch.setattr(fid, "covariance_factor", factor_spy)
    monkeypatch.setattr(fid, "frechet_distance", distance_spy)
    compute = fid._frechet_metric("fid", "mu", "sigma", "pool3", 4)
    inputs = MetricInputs(
        {"pool3": torch.from_numpy(_FEW)}, {"mu": 0, "sigma": 0}, frozenset(), 5, torch.device("meta"), print
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert compute(inputs, {}) == {"fid": 7.0}
    assert seen == [("stats", "meta"), ("factor", "meta"), ("distance", "meta", "F")]


def test_off_the_cpu_the_eigenvalues_come_from_torchs_solver(monkeypatch):
    """A `meta` matrix (no data) takes the non-CPU branch: torch's solver gets the matrix (spies: torch's
    meta solver itself takes 2 s to load)."""
    m = torch.zeros(3, 3, dtype=torch.float64, device="meta")  # torch.eye on meta: 2 s to load
    got = []
    monkeypatch.setattr(torch.linalg, "eigvalsh", lambda a: got.append(("eigvalsh", a)) or "w")
    monkeypatch.setattr(torch.linalg, "eigh", lambda a: got.append(("eigh", a)) or ("w", "v"))
    assert fid._eig(m) == "w"
    assert fid._eig(m, vectors=True) == ("w", "v")
    assert got == [("eigvalsh", m), ("eigh", m)]


def test_the_frechet_resampler_makes_the_reference_on_the_inputs_device():
    ref = {"mu": np.array([0.5, 1.0, 1.5, 0.0]), "sigma": np.diag([2.0, 0.5, 1.0, 3.0])}
    with torch.device("meta"):
        one = fid._frechet_resampler("fid", "mu", "sigma", "pool3")(
            _inputs({"pool3": torch.from_numpy(_FEW)}, ref), {}
        )
        got = one(np.array([2, 2, 0]))
    assert got == {"fid": pytest.approx(_fid_reference(_FEW[[2, 2, 0]], ref["mu"], ref["sigma"]), rel=1e-9)}


def test_kid_and_pr_make_their_work_tensors_on_the_inputs_device():
    """The KID resampler's membership, counts and ones, the k-NN radii, the coverage flags and the P/R
    resampler's neighbour tables, under torch's default device `meta` (new tensors only)."""
    s32, r32 = _X.astype(np.float32), _Y.astype(np.float32)
    index = np.array([4, 4, 0, 2, 1])
    with _NewTensorsOnMeta():
        one = kid.KID.resampler(_inputs({"pool3": torch.from_numpy(s32)}, {"pool3": r32}), _KID_OPTIONS)
        got_kid = one(index)
        radii = prdc.knn_radii(torch.from_numpy(_LINE).float(), 2, 3)
        inside = prdc.manifold_coverage(
            torch.tensor([[2.0, 0.0], [3.0, 1.0]], device="cpu"),
            torch.from_numpy(_LINE[:2]).float(),
            radii[:2],
            1,
        )
        s = np.concatenate([_S[:6], [[4.0, 4.0]]]).astype(np.float32)
        pr = prdc.PR.resampler(
            _inputs({"pool3": torch.from_numpy(s)}, {"pool3": _R.astype(np.float32)}),
            {"pr_k": 2, "pr_block_size": 3},
        )
        got_pr = pr(np.array([0, 0, 3, 4, 6, 6, 2]))
    want = _kid_reference(_X[index], _Y, 3, 3, 11, degree=2, coef0=0.5)  # exact in float32
    assert got_kid == {"kid": pytest.approx(want[0], rel=1e-9), "kid_std": pytest.approx(want[1], rel=1e-9)}
    assert radii.device.type == "cpu" and radii.tolist() == _radii(_LINE, 2).tolist()
    assert inside.device.type == "cpu" and inside.tolist() == [
        True,
        False,
    ]  # radii 9 at 0, 4 at 1: (3, 1) at 10 and 5
    want = _pr_reference(s[[0, 0, 3, 4, 6, 6, 2]], _R.astype(np.float32), 2)
    assert got_pr == {"precision": want[0], "recall": want[1]}


class _Stop(Exception):
    """Raised by a spy once it has seen what it records: the rest cannot run on `meta` (no data)."""


def test_the_kid_and_pr_resamplers_move_samples_and_reference_to_the_inputs_device(monkeypatch):
    """`inputs.device` = meta with CPU features: the first kernels and the first coverage see meta
    tensors (spies; the resamplers cannot finish on meta, where no number can be read back)."""
    seen = []

    def kernel_spy(x, y, **kernel_args):
        seen.append(("kernel", x.device.type, y.device.type, x.dtype, y.dtype))
        if len(seen) > _KID_OPTIONS["kid_subsets"]:  # past the reference subsets: samples vs reference
            raise _Stop
        return torch.ones(len(x), len(y), dtype=torch.float64)  # on the CPU: float() reads it

    monkeypatch.setattr(kid, "polynomial_kernel", kernel_spy)
    s32, r32 = _X.astype(np.float32), _Y.astype(np.float32)
    on_meta = MetricInputs(
        {"pool3": torch.from_numpy(s32)}, {"pool3": r32}, frozenset(), 4, torch.device("meta"), print
    )
    with pytest.raises(_Stop):
        kid.KID.resampler(on_meta, _KID_OPTIONS)
    f64 = torch.float64
    assert seen == [("kernel", "meta", "meta", f64, f64)] * 4
    seen.clear()

    def radii_spy(feats, k, block):
        seen.append(("radii", feats.device.type, feats.dtype))
        return torch.zeros(len(feats), device=feats.device)

    def cover_spy(query, points, radii, block):
        seen.append(("cover", query.device.type, points.device.type, query.dtype, points.dtype))
        raise _Stop

    monkeypatch.setattr(prdc, "knn_radii", radii_spy)
    monkeypatch.setattr(prdc, "manifold_coverage", cover_spy)
    with pytest.raises(_Stop):
        prdc.PR.resampler(on_meta, {"pr_k": 2, "pr_block_size": 3})
    f32 = torch.float32
    assert seen == [("radii", "meta", f32), ("cover", "meta", "meta", f32, f32)]
