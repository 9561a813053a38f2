"""Bootstrap intervals over the samples: seeded, centred on the estimate, the SE recomputed exactly,
carried into the quality evaluation and used by the gate (one seed, an interval straddling the
threshold: inconclusive, exit 3)."""

from __future__ import annotations

import dataclasses
import math
import warnings

import numpy as np
import pytest
from metrics_support import SMALL, FakeExtractor, synthetic_images
from test_gate_quality import cell, evaluation, fid_delta, quality, run

from ditbench.metrics import bootstrap, registry
from ditbench.metrics.evaluate import Scorer
from ditbench.metrics.npz_io import ArrayImages
from ditbench.metrics.spec import Metric, Need, Output
from ditbench.quality.evaluation import _bootstrap


def _score(ref, metrics="fid,is,pr", **kw):
    scorer = Scorer(ref, extractor=FakeExtractor(), cache=False, metrics=metrics, **{**SMALL, **kw})
    return scorer.score(synthetic_images(8, 16, seed=2))


def test_the_normal_interval_is_the_estimate_plus_minus_z_standard_errors():
    ends, se = bootstrap.interval(10.0, [1.0, 2.0, 3.0])  # sample SD 1
    assert se == 1.0 and ends == [10.0 - 1.959963984540054, 10.0 + 1.959963984540054]
    assert bootstrap.draws(5, 3, 7).tolist() == np.random.default_rng(7).integers(0, 5, (3, 5)).tolist()


def test_intervals_are_seeded_contain_the_estimate_and_are_recorded(ref_npz):
    a, b = _score(ref_npz, bootstrap=4), _score(ref_npz, bootstrap=4)
    assert a["intervals"] == b["intervals"] and a["bootstrap"] == b["bootstrap"]  # same seed, same JSON
    assert set(a["intervals"]) == {"fid", "inception_score", "precision", "recall"}  # not the std outputs
    for key, (low, high) in a["intervals"].items():
        assert low <= a["metrics"][key] <= high
        assert high - low == pytest.approx(2 * bootstrap.Z * a["bootstrap"]["se"][key])
    assert a["settings"]["bootstrap"] == 4 and a["settings"]["bootstrap_seed"] == 0
    assert a["bootstrap"]["rule"] == bootstrap.RULE and "bootstrap" in a["timings_s"]
    other = _score(ref_npz, bootstrap=4, bootstrap_seed=1)
    assert other["intervals"]["fid"] != a["intervals"]["fid"]
    assert other["metrics"] == a["metrics"]  # the estimates never depend on the bootstrap


def test_bootstrap_zero_records_no_interval(ref_npz):
    result = _score(ref_npz, bootstrap=0)
    assert "intervals" not in result and "bootstrap" not in result and "bootstrap" not in result["timings_s"]
    assert result["settings"]["bootstrap"] == 0


def test_each_resample_recomputes_the_metric_on_the_drawn_samples(ref_npz):
    """A made-up metric (the mean of feature 0): its SE is the SD of the means over the same draws."""

    def mean0(inputs, options):
        return {"mean0": float(inputs.samples["pool3"][:, 0].double().mean())}

    metric = Metric(
        "mean0",
        "mean0",
        ("pool3",),
        (),
        (Output("mean0", "mean0", "{:.4f}", "higher"),),
        lambda o: Need(2, 0, "a mean"),
        mean0,
    )
    registry.register(metric)
    try:
        result = _score(ref_npz, metrics="mean0", bootstrap=5, bootstrap_seed=3)
    finally:
        registry.register(remove="mean0")
    images = ArrayImages(synthetic_images(8, 16, seed=2), "samples")
    x = FakeExtractor().extract(images, want=("pool3",))["pool3"][:, 0].double().numpy()
    means = [x[idx].mean() for idx in bootstrap.draws(8, 5, 3)]
    assert result["bootstrap"]["se"]["mean0"] == pytest.approx(np.std(means, ddof=1), rel=1e-12)


def test_an_evaluation_carries_one_seeds_se_and_the_interval_of_its_mean():
    per_seed = [
        {"seed": 0, "fid": 10.0, "bootstrap_se": {"fid": 3.0}},
        {"seed": 1, "fid": 12.0, "bootstrap_se": {"fid": 4.0}},
    ]
    out = _bootstrap(per_seed, ["fid"])
    se = math.sqrt((9 + 16) / 2)
    assert out["bootstrap_se"] == {"fid": se}
    half = bootstrap.Z * se / math.sqrt(2)
    assert out["interval"]["fid"] == pytest.approx([11.0 - half, 11.0 + half], rel=1e-15)
    assert _bootstrap([{"seed": 0, "fid": 10.0}], ["fid"]) == {}  # no bootstrap, no field


def _one_seed(step, fid, se):
    e = evaluation(step, fid, 50.0, seeds=(0,))
    e["bootstrap_se"] = {k: se for k in e["metrics"]}
    return e


def test_the_gate_judges_one_seed_by_its_bootstrap_se(tmp_path):
    # FID 20 -> 21 (+5% > 2%); bootstrap SE 0.5 a side: bound 2 x 0.71 = 1.41 > 1, interval -2% to +12%.
    straddles = run(
        tmp_path, cell(quality(_one_seed(500, 20.0, 0.5))), cell(quality(_one_seed(500, 21.0, 0.5)), seed=2)
    )
    d = fid_delta(straddles)
    assert d.verdict == "inconclusive" and straddles.exit_code == 3 and not d.weak
    assert d.noise == pytest.approx(2 * math.hypot(0.5, 0.5))
    # SE 0.1 a side: the bound 0.28 leaves the change +3.6% to +6.4%, wholly beyond 2%.
    clear = run(
        tmp_path, cell(quality(_one_seed(500, 20.0, 0.1))), cell(quality(_one_seed(500, 21.0, 0.1)), seed=2)
    )
    assert fid_delta(clear).verdict == "regression" and clear.exit_code == 1


def test_the_larger_of_seed_spread_and_bootstrap_se_is_the_noise(tmp_path):
    base, new = evaluation(500, 20.0, 50.0, fid_sd=0.1), evaluation(500, 21.0, 50.0, fid_sd=0.1)
    for e in (base, new):
        e["bootstrap_se"] = {"fid": 0.5}
    d = fid_delta(run(tmp_path, cell(quality(base)), cell(quality(new), seed=2)))
    assert d.noise == pytest.approx(2 * math.hypot(0.5, 0.5)) and d.verdict == "inconclusive"


def test_a_negative_bootstrap_se_is_an_input_error(tmp_path):
    from ditbench.report.gate.inputs import IncomparableError

    bad = _one_seed(500, 21.0, 0.5)
    bad["bootstrap_se"]["fid"] = -1.0
    with pytest.raises(IncomparableError, match=r"bootstrap_se\.fid is -1, not a spread"):
        run(tmp_path, cell(quality(_one_seed(500, 20.0, 0.5))), cell(quality(bad), seed=2))


@pytest.mark.parametrize("n", [5, 12, 40])  # fewer samples than dimensions (the low-rank route), and more
def test_the_frechet_resampler_equals_the_metric_on_the_drawn_samples(n):
    import torch

    from ditbench.metrics.fid import FID, feature_statistics
    from ditbench.metrics.spec import MetricInputs

    g = torch.Generator().manual_seed(0)
    x = torch.rand(n, 16, generator=g, dtype=torch.float64).float()
    mu, sigma = feature_statistics(torch.rand(30, 16, generator=g, dtype=torch.float64) * 2)
    inputs = MetricInputs(
        {"pool3": x}, {"mu": mu, "sigma": sigma}, frozenset(), None, torch.device("cpu"), print
    )
    one = FID.resampler(inputs, {})
    if n >= 16:
        assert one is None  # from N = d up the metric's own function reruns: nothing to save
        return
    for idx in bootstrap.draws(n, 3, 1):
        drawn = dataclasses.replace(inputs, samples={"pool3": x[torch.from_numpy(idx)]})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # fewer samples than the 2048 dims FID warns about
            expected = FID.compute(drawn, {})["fid"]
        assert one(idx)["fid"] == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("neighbours", [32, 2])  # 2: fewer than k=3 kept, every radius found the slow way
def test_the_precision_recall_resampler_equals_the_metric_on_the_drawn_samples(neighbours, monkeypatch):
    import torch

    from ditbench.metrics import prdc
    from ditbench.metrics.spec import MetricInputs

    monkeypatch.setattr(prdc, "NEIGHBOURS", neighbours)
    g = torch.Generator().manual_seed(0)
    x = torch.rand(60, 8, generator=g)
    ref = (torch.rand(50, 8, generator=g) * 1.2).numpy()
    inputs = MetricInputs({"pool3": x}, {"pool3": ref}, frozenset(), 50, torch.device("cpu"), print)
    options = {"pr_k": 3, "pr_block_size": 16}
    one = prdc.PR.resampler(inputs, options)
    for idx in bootstrap.draws(60, 4, 2):
        drawn = dataclasses.replace(inputs, samples={"pool3": x[torch.from_numpy(idx)]})
        assert one(idx) == prdc.PR.compute(drawn, options)


def test_the_kid_resampler_equals_the_metric_on_the_drawn_samples(monkeypatch):
    import torch

    from ditbench.metrics import kid
    from ditbench.metrics.spec import MetricInputs

    g = torch.Generator().manual_seed(0)
    x = torch.rand(30, 8, generator=g)
    ref = (torch.rand(25, 8, generator=g) * 1.1).numpy()
    inputs = MetricInputs({"pool3": x}, {"pool3": ref}, frozenset(), 25, torch.device("cpu"), print)
    options = {"kid_subsets": 6, "kid_subset_size": 10, "kid_seed": 5, "kid_degree": 3, "kid_coef0": 1.0}
    one = kid.KID.resampler(inputs, options)
    for idx in bootstrap.draws(30, 4, 2):
        drawn = dataclasses.replace(inputs, samples={"pool3": x[torch.from_numpy(idx)]})
        assert one(idx) == pytest.approx(kid.KID.compute(drawn, options), rel=1e-9, abs=1e-12)
    monkeypatch.setattr(kid, "KERNEL_CACHE_BYTES", 8 * 30 * 30 - 1)  # the 30 x 30 sample kernel: too big
    assert kid.KID.resampler(inputs, options) is None  # the bootstrap reruns KID instead


def test_the_report_shows_and_judges_one_seed_by_its_bootstrap_se():
    from ditbench.report.quality import _metric_cells, compare_fid

    e = _one_seed(500, 20.0, 0.5)
    assert _metric_cells(e)[0] == "20.00 ± 0.50"  # FID: no seeds' spread, the bootstrap SE (to its 2 digits)
    verdict = compare_fid(quality(e), quality(_one_seed(500, 21.0, 0.5)))  # |1| < 2 x 0.71
    assert verdict.text == "within noise" and "seeds' or bootstrap's" in verdict.detail
