"""The library entry point (Scorer) and the metrics registry, on a stand-in network (fast).

What is checked here is the logic around the network: the reference is read and featurised once
for any number of batches, the cache serves a second scorer, counts are checked before any
compute, and every metric is driven by its registry spec. Real-network numbers are checked in
test_metrics_evaluate.py.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from metrics_support import SMALL, FakeExtractor, synthetic_images

from ditbench.core.errors import UserError
from ditbench.metrics import registry
from ditbench.metrics.evaluate import Scorer, evaluate
from ditbench.metrics.spec import Metric, Need, Option, Output


def _scorer(ref, tmp_path, extractor=None, **kw):
    return Scorer(
        ref, extractor=extractor or FakeExtractor(), cache_dir=tmp_path / "cache", **{**SMALL, **kw}
    )


def test_the_reference_is_featurised_once_for_many_batches(ref_npz, tmp_path):
    ex = FakeExtractor()
    scorer = _scorer(ref_npz, tmp_path, ex)
    first = scorer.score(synthetic_images(8, 16, seed=2))
    second = scorer.score(synthetic_images(8, 16, seed=3, style="smooth"))
    assert [d for d, _ in ex.calls] == ["reference features", "sample features", "sample features"]
    assert set(first["metrics"]) == {o.key for m in registry.METRICS for o in m.outputs}
    assert first["metrics"]["fid"] != second["metrics"]["fid"]
    assert first["reference"]["cache"]["hit"] is False
    # a second scorer (another process, say) is served by the cache: no reference pass at all
    ex2 = FakeExtractor()
    third = _scorer(ref_npz, tmp_path, ex2).score(synthetic_images(8, 16, seed=2))
    assert [d for d, _ in ex2.calls] == ["sample features"]
    assert third["reference"]["cache"]["hit"] is True
    assert third["metrics"] == pytest.approx(first["metrics"], rel=1e-9)
    # and the cache entry is itself a reference (statistics plus pool3 features)
    entry = third["reference"]["cache"]["path"]
    fourth = Scorer(entry, extractor=FakeExtractor(), cache=False, metrics="fid,pr").score(
        synthetic_images(8, 16, seed=2)
    )
    assert fourth["metrics"]["fid"] == pytest.approx(first["metrics"]["fid"], rel=1e-9)
    assert fourth["reference"]["fid_statistics"] == "precomputed"


def test_result_schema_and_the_not_official_banner(ref_npz, tmp_path):
    result = _scorer(ref_npz, tmp_path, metrics="fid").score(synthetic_images(4, 16, seed=2))
    assert result["schema"] == "ditbench.fid/1"
    assert result["inception"] == {
        "name": "fake",
        "official": False,
        "sha256": "f" * 64,
        "file": None,
        "path": None,
        "recipe": None,  # only the test network has a calibration recipe
    }
    assert result["settings"]["inception_weights"] == result["inception"]
    assert result["banner"] == "not the official Inception: numbers are not comparable with papers"
    assert {"is_splits", "pr_k", "pr_block_size", "kid_subsets", "kid_subset_size", "kid_seed"} <= set(
        result["settings"]
    )
    official = _scorer(ref_npz, tmp_path, FakeExtractor(official=True), metrics="fid")
    assert "banner" not in official.score(synthetic_images(4, 16, seed=2))


def test_counts_are_checked_before_any_compute(ref_npz, tmp_path):
    ex = FakeExtractor()
    with pytest.raises(UserError) as err:
        _scorer(ref_npz, tmp_path, ex).score(synthetic_images(1, 16))
    msg = str(err.value)
    assert msg.startswith("Nothing to compute: no metric can be computed from 1 sample(s).")
    for needs in (
        "FID needs at least 2 samples",
        "sFID needs at least 2 samples",
        "Inception Score needs at least 2",
    ):
        assert needs in msg
    assert "KID needs at least 4 samples" in msg and "Precision/recall needs at least 4 samples" in msg
    assert ex.calls == []
    scorer = _scorer(ref_npz, tmp_path, ex, metrics="kid")
    with pytest.raises(UserError, match="Cannot compute kid: KID needs at least 4 samples"):
        scorer.check(3)
    scorer.check(4)
    with pytest.raises(UserError, match="KID needs at least 40 reference images .* holds 12; lower --kid"):
        _scorer(ref_npz, tmp_path, ex, metrics="kid", kid_subset_size=40).check(100)
    assert ex.calls == []


def test_metrics_not_asked_for_are_skipped_with_the_reason(ref_npz, tmp_path):
    result = _scorer(ref_npz, tmp_path, is_splits=10, kid_subset_size=40).score(synthetic_images(5, 16))
    assert set(result["skipped"]) == {"is", "kid"}
    assert "needs at least 10 samples" in result["skipped"]["is"]
    assert {"fid", "sfid", "precision", "recall"} == set(result["metrics"])


def test_statistics_only_reference_serves_fid_not_pr(tmp_path):
    stats = tmp_path / "stats.npz"
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 2048))
    np.savez(stats, mu=x.mean(0), sigma=np.cov(x, rowvar=False))
    result = Scorer(stats, extractor=FakeExtractor(), cache=False, **SMALL).score(synthetic_images(4, 16))
    assert set(result["metrics"]) == {"fid", "inception_score", "inception_score_std"}
    assert "holds only statistics and no precomputed `pool3`" in result["skipped"]["pr"]
    assert "holds no images and no precomputed `mu_s`" in result["skipped"]["sfid"]
    with pytest.raises(UserError, match="Cannot compute pr"):
        Scorer(stats, extractor=FakeExtractor(), metrics="fid,pr").check(100)


def test_samples_of_another_size_than_the_reference_warn(ref_npz, tmp_path):
    result = _scorer(ref_npz, tmp_path, metrics="fid").score(synthetic_images(4, 24, seed=2))
    (warning,) = [w for w in result["warnings"] if "resolution" in w]
    assert "the samples are 24x24" in warning and "is 16x16" in warning and str(ref_npz) in warning
    assert np.isfinite(result["metrics"]["fid"])
    # a cache entry remembers the size of the images it was made from
    entry = result["reference"]["cache"]["path"]
    again = Scorer(entry, extractor=FakeExtractor(), cache=False, metrics="fid").score(
        synthetic_images(4, 24)
    )
    assert any("is 16x16" in w for w in again["warnings"])


def test_evaluate_is_a_one_shot_scorer(ref_npz, tmp_path):
    import torch

    a = evaluate(synthetic_images(6, 16, seed=2), ref_npz, extractor=FakeExtractor(), cache=False, **SMALL)
    b = _scorer(ref_npz, tmp_path).score(synthetic_images(6, 16, seed=2))
    c = _scorer(ref_npz, tmp_path).score(torch.from_numpy(synthetic_images(6, 16, seed=2)))  # a tensor, too
    assert a["metrics"] == pytest.approx(b["metrics"], rel=1e-12) == c["metrics"]


# ---- the registry ------------------------------------------------------------------------------


def test_each_metric_declares_direction_options_and_needs():
    assert registry.ALL_METRICS == ("fid", "sfid", "is", "pr", "kid")
    expected = {"fid": "lower", "sfid": "lower", "inception_score": "higher", "precision": "higher"}
    expected.update(recall="higher", kid="lower", inception_score_std=None, kid_std=None)
    assert {k: o.better for k, o in registry.OUTPUTS.items()} == expected
    assert [o.key for o in registry.quality_outputs()] == [k for k, d in expected.items() if d]
    assert {k: o.threshold_pct for k, o in registry.OUTPUTS.items() if o.threshold_pct} == {
        "fid": 2.0,
        "inception_score": 2.0,
    }
    defaults = registry.resolve_options({})
    for m in registry.METRICS:
        need = m.needs(defaults)
        assert need.samples >= 2 and need.why
    assert defaults["kid_subset_size"] == 1000 and defaults["is_splits"] == 0 and defaults["pr_k"] == 3


@pytest.mark.parametrize(
    "given, message",
    [
        ({"is_splits": -1}, "--is-splits must be >= 0; got -1"),
        ({"kid_subset_size": 1}, "--kid-subset-size must be >= 2"),
        ({"kid_coef0": float("nan")}, "--kid-coef0 must be a finite number"),
        ({"kid_coef0": float("inf")}, "--kid-coef0 must be a finite number"),
        ({"pr_k": 2.5}, "--pr-k must be an integer"),
        ({"pr_k": True}, "--pr-k must be an integer"),
        ({"kid_seed": 2**40}, "--kid-seed must be >= 0 and <= 4294967295"),
        ({"kid_subsets": "many"}, "--kid-subsets must be an integer; got 'many'"),
    ],
)
def test_bad_option_values(given, message):
    with pytest.raises(UserError, match=message):
        registry.resolve_options(given)


def test_unknown_metrics_and_options_are_errors_never_another_metric():
    with pytest.raises(UserError, match=r"unknown metric\(s\) \['psnr'\]; choose from fid,sfid,is,pr,kid"):
        registry.parse_metrics("fid,psnr")
    with pytest.raises(UserError, match="no metric named"):
        registry.parse_metrics(" , ")
    assert [m.name for m in registry.parse_metrics("KID, fid")[0]] == ["fid", "kid"]
    with pytest.raises(TypeError, match="unknown metric option"):
        registry.resolve_options({"kid_subset": 10})


def test_a_new_metric_is_one_spec_in_the_registry(ref_npz, tmp_path, monkeypatch):
    """What adding a metric takes: a spec (its own file) and one entry in registry.METRICS (register)."""

    def mean_shift(inputs, options):
        x = inputs.samples["pool3"].double().mean(0).numpy()
        return {"mean_shift": float(np.abs(x - inputs.reference["mu"]).max() * options["ms_scale"])}

    toy = Metric(
        name="ms",
        title="Mean shift",
        sample_features=("pool3",),
        reference_keys=("mu",),
        outputs=(Output("mean_shift", "Mean shift", "{:.3f}", "lower"),),
        options=(Option("ms_scale", 1.0, "scale (%(default)s)", minimum=None, kind=float),),
        needs=lambda o: Need(1, 2, "a mean"),
        compute=mean_shift,
    )
    for name in ("METRICS", "BY_NAME", "OPTIONS", "OUTPUTS", "ALL_METRICS"):
        monkeypatch.setattr(registry, name, getattr(registry, name))  # restored after the test
    registry.register(toy)
    result = _scorer(ref_npz, tmp_path, metrics="fid,ms", ms_scale=2.0).score(synthetic_images(3, 16))
    assert set(result["metrics"]) == {"fid", "mean_shift"} and result["settings"]["ms_scale"] == 2.0
    assert registry.OUTPUTS["mean_shift"].better == "lower"
    from ditbench.cli.fid import format_table

    assert "Mean shift" in format_table(result)
    # a metric that returns an undeclared key or a NaN is stopped, not written
    nan = dataclasses.replace(toy, compute=lambda i, o: {"mean_shift": float("nan")})
    registry.register(nan, remove="ms")
    with pytest.raises(UserError, match="Mean shift came out nan"):
        _scorer(ref_npz, tmp_path, metrics="ms").score(synthetic_images(3, 16))


def test_the_table_shows_a_value_and_its_interval_to_the_intervals_precision(ref_npz, tmp_path):
    from ditbench.cli.fid import format_table

    result = _scorer(ref_npz, tmp_path, metrics="fid", bootstrap=2).score(synthetic_images(8, 16, seed=2))
    result["metrics"]["fid"] = 72.9574
    result["intervals"]["fid"] = [37.7474, 108.1674]  # ± 35.21: no decimal means anything
    (line,) = [row for row in format_table(result).splitlines() if row.startswith("FID")]
    assert line.split() == ["FID", "73", "(95%", "38", "to", "108)"]


def test_prepare_gathers_the_reference_before_the_first_batch(ref_npz, tmp_path):
    ex = FakeExtractor()
    scorer = _scorer(ref_npz, tmp_path, ex, metrics="fid,kid")
    scorer.prepare()
    assert [d for d, _ in ex.calls] == ["reference features"]
    scorer.score(synthetic_images(4, 16, seed=5))
    assert [d for d, _ in ex.calls] == ["reference features", "sample features"]
    with pytest.raises(UserError, match="Cannot compute kid: KID needs at least 40 reference images"):
        _scorer(ref_npz, tmp_path, ex, metrics="kid", kid_subset_size=40).prepare()
