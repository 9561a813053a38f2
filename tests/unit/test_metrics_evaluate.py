"""End to end: `evaluate` and `ditbench fid` against torch-fidelity, precomputed statistics, the cache."""

import json
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
from metrics_support import calibrated_weights_file, synthetic_images, to_nchw
from PIL import Image

from ditbench.cli import main
from ditbench.metrics.evaluate import evaluate
from ditbench.metrics.fid import FewSamplesWarning
from ditbench.metrics.weights import FeatureExtractor

pytestmark = pytest.mark.slow  # each test runs the 299 x 299 network on a few dozen images on CPU

N = 6  # images per set: few, the 299 x 299 network is slow on CPU
KID = {"kid_subsets": 10, "kid_subset_size": 4}
IS_SPLITS = 2  # 10 splits of 6 samples would hold 0 or 1 sample each, and IS = 1 exactly


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("fid")
    sets = {
        "samples": synthetic_images(N, 32, seed=101, style="smooth"),
        "ref": synthetic_images(N, 32, seed=202, style="noisy"),
    }
    for name, imgs in sets.items():
        (root / name).mkdir()
        for i, img in enumerate(imgs):
            Image.fromarray(img).save(root / name / f"{i:03d}.png")
        np.savez(root / f"{name}.npz", arr_0=imgs)
    return root, sets


@pytest.fixture(scope="module")
def extractor():
    return FeatureExtractor(calibrated_weights_file(), device="cpu", progress=False)


@pytest.fixture(scope="module")
def ours(data, extractor, tmp_path_factory):
    root, _ = data
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = evaluate(
            root / "samples",
            root / "ref",
            extractor=extractor,
            cache_dir=tmp_path_factory.mktemp("cache"),
            is_splits=IS_SPLITS,
            **KID,
        )
    result["_caught"] = caught
    return result


@pytest.fixture(scope="module")
def torch_fidelity_metrics(data):
    from torch_fidelity import calculate_metrics

    root, _ = data
    return calculate_metrics(
        input1=str(root / "samples"),
        input2=str(root / "ref"),
        cuda=False,
        batch_size=64,
        fid=True,
        isc=True,
        kid=True,
        prc=True,
        feature_extractor="inception-v3-compat",
        feature_extractor_weights_path=str(calibrated_weights_file()),
        cache=False,
        verbose=False,
        samples_shuffle=False,
        save_cpu_ram=True,
        isc_splits=IS_SPLITS,
        **KID,
    )


def test_metrics_equal_torch_fidelity(ours, torch_fidelity_metrics):
    m, tf = ours["metrics"], torch_fidelity_metrics
    assert set(m) == {
        "fid",
        "sfid",
        "inception_score",
        "inception_score_std",
        "precision",
        "recall",
        "kid",
        "kid_std",
    }
    assert m["fid"] > 1 and m["inception_score"] > 1.05  # the calibrated network tells the sets apart
    # FID: torch-fidelity sums sqrt(eigvals(S1 S2)) over all 2048 eigenvalues; with 6 samples per set
    # 2043 of them are rounding noise (~1e-10), whose square roots add up to ~1e-5 of the value. Ours
    # is exact here (next test), and equals torch-fidelity's formula to 1e-8 on full-rank statistics
    # (test_metrics_formulas.py); the features and statistics are identical (test_metrics_inception.py).
    assert m["fid"] == pytest.approx(tf["frechet_inception_distance"], rel=2e-5)
    assert m["inception_score"] == pytest.approx(tf["inception_score_mean"], rel=1e-7)
    assert m["inception_score_std"] == pytest.approx(tf["inception_score_std"], rel=1e-5, abs=1e-9)
    assert m["precision"] == pytest.approx(tf["precision"], abs=1e-6)
    assert m["recall"] == pytest.approx(tf["recall"], abs=1e-6)
    # KID: the same subsets (same seed and drawing order); theirs has float32 kernels
    assert m["kid"] == pytest.approx(tf["kernel_inception_distance_mean"], rel=1e-4)


def test_fid_is_exact_for_few_samples(ours, data, extractor):
    """With N < 2048 the covariances are low rank: tr sqrt(S1 S2) = nuclear norm of F1 F2^T."""
    root, sets = data
    net = extractor.net
    with torch.no_grad():
        x = net(to_nchw(sets["samples"]))["pool3"].double().numpy()
        y = net(to_nchw(sets["ref"]))["pool3"].double().numpy()
    f1, f2 = (x - x.mean(0)) / np.sqrt(N - 1), (y - y.mean(0)) / np.sqrt(N - 1)
    diff = x.mean(0) - y.mean(0)
    exact = diff @ diff + (f1**2).sum() + (f2**2).sum() - 2 * np.linalg.svd(f1 @ f2.T, compute_uv=False).sum()
    assert ours["metrics"]["fid"] == pytest.approx(exact, rel=1e-9)


def test_result_records_settings_and_warnings(ours):
    s = ours["settings"]
    assert s["precision"] == "fp32" and s["tf32"] is False and s["device"] == "cpu"
    assert s["inception_weights"]["file"] == calibrated_weights_file().name
    assert len(s["inception_weights"]["sha256"]) == 64
    assert ours["samples"]["count"] == N and ours["reference"]["count"] == N
    assert ours["reference"]["fid_statistics"] == "images"
    assert any("singular" in w for w in ours["warnings"])
    assert any(issubclass(w.category, FewSamplesWarning) for w in ours["_caught"])
    assert {"sample_features", "reference_features", "fid", "total"} <= set(ours["timings_s"])


def _spatial_and_pool3_torch_fidelity(imgs):
    """Reference statistics the way an ADM reference batch carries them, from torch-fidelity's network."""
    from torch_fidelity.feature_extractor_inceptionv3 import FeatureExtractorInceptionV3

    net = FeatureExtractorInceptionV3(
        "inception-v3-compat", ["2048"], feature_extractor_weights_path=str(calibrated_weights_file())
    )
    grab = {}
    net.Mixed_6d.branch1x1.register_forward_hook(lambda m, i, o: grab.__setitem__("s", o))
    with torch.no_grad():
        (pool3,) = net(to_nchw(imgs))
    spatial = grab["s"][:, :7].permute(0, 2, 3, 1).reshape(len(imgs), -1)
    p, s = pool3.double().numpy(), spatial.double().numpy()
    return {
        "mu": p.mean(0),
        "sigma": np.cov(p, rowvar=False),
        "mu_s": s.mean(0),
        "sigma_s": np.cov(s, rowvar=False),
    }


def test_precomputed_reference_statistics_give_the_same_fid(ours, data, tmp_path):
    root, sets = data
    stats = _spatial_and_pool3_torch_fidelity(sets["ref"])
    adm_ref = tmp_path / "VIRTUAL_ref.npz"
    np.savez(adm_ref, arr_0=sets["ref"], **stats)
    ex = FeatureExtractor(calibrated_weights_file(), "cpu", progress=False)
    got = evaluate(root / "samples.npz", adm_ref, metrics="fid,sfid", extractor=ex, cache=False)
    assert got["reference"]["fid_statistics"] == "precomputed"
    assert ex.images_processed == N  # the reference images were not run through the network
    assert got["metrics"]["fid"] == pytest.approx(ours["metrics"]["fid"], rel=1e-9)
    assert got["metrics"]["sfid"] == pytest.approx(ours["metrics"]["sfid"], rel=1e-9)

    # The statistics are what counts for FID, the images only for P/R: other images, same FID.
    mixed = tmp_path / "mixed.npz"
    np.savez(mixed, arr_0=sets["samples"], **stats)
    got2 = evaluate(root / "samples.npz", mixed, metrics="fid,pr", extractor=ex, cache=False)
    assert got2["metrics"]["fid"] == pytest.approx(ours["metrics"]["fid"], rel=1e-9)
    assert got2["metrics"]["precision"] == 1.0 and got2["metrics"]["recall"] == 1.0  # samples vs themselves


def test_second_evaluation_hits_the_reference_cache(data, tmp_path):
    root, _ = data
    ex = FeatureExtractor(calibrated_weights_file(), "cpu", progress=False)
    first = evaluate(
        root / "samples.npz", root / "ref.npz", metrics="fid,pr", extractor=ex, cache_dir=tmp_path
    )
    assert ex.images_processed == 2 * N and first["reference"]["cache"]["hit"] is False
    second = evaluate(
        root / "samples.npz", root / "ref.npz", metrics="fid,pr", extractor=ex, cache_dir=tmp_path
    )
    assert ex.images_processed == 3 * N  # only the samples this time
    assert second["reference"]["cache"]["hit"] is True
    assert second["metrics"] == first["metrics"]
    # the cache entry is itself a valid reference (a ditbench statistics file)
    entry = second["reference"]["cache"]["path"]
    third = evaluate(root / "samples.npz", entry, metrics="fid,pr", extractor=ex, cache=False)
    assert third["metrics"] == pytest.approx(first["metrics"], rel=1e-12)
    # other reference content -> another key (hashing needs no network)
    from ditbench.metrics.reference import ReferenceCache

    np.savez(tmp_path / "ref2.npz", arr_0=np.load(root / "ref.npz")["arr_0"][::-1])
    store = ReferenceCache(tmp_path)
    h1, h2 = (store.content_hash(p) for p in (root / "ref.npz", tmp_path / "ref2.npz"))
    assert h1 != h2 and h1 == store.content_hash(root / "ref.npz")
    assert store.key(h1, "w", "fp32") != store.key(h1, "w", "tf32") != store.key(h1, "v", "tf32")


def test_cli_end_to_end_json(data, tmp_path):
    root, _ = data
    samples = tmp_path / "samples.npz"
    samples.write_bytes((root / "samples.npz").read_bytes())
    cmd = [
        sys.executable,
        "-m",
        "ditbench",
        "fid",
        "--samples",
        str(samples),
        "--ref",
        str(root / "ref"),
        "--inception-weights",
        str(calibrated_weights_file()),
        "--json",
        "--cache-dir",
        str(tmp_path / "c"),
        "--metrics",
        "fid,is,pr",
        "--batch-size",
        "4",
        "--is-splits",
        "2",
        "--no-progress",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ), timeout=600)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert set(result["metrics"]) == {"fid", "inception_score", "inception_score_std", "precision", "recall"}
    assert result["settings"]["batch_size"] == 4
    written = tmp_path / "samples.metrics.json"  # next to the samples by default
    assert json.loads(written.read_text()) == result
    assert "singular" in proc.stderr  # the few-samples warning reaches the user

    # the readable table, from the cache this time
    out = tmp_path / "m.json"
    code = main(
        [
            "fid",
            "--samples",
            str(samples),
            "--ref",
            str(root / "ref"),
            "--inception-weights",
            str(calibrated_weights_file()),
            "--cache-dir",
            str(tmp_path / "c"),
            "--metrics",
            "fid",
            "--out",
            str(out),
            "--no-progress",
        ]
    )
    assert code == 0
    again = json.loads(out.read_text())
    assert again["reference"]["cache"]["hit"] is True
    assert again["metrics"]["fid"] == pytest.approx(result["metrics"]["fid"], rel=1e-9)


def test_the_test_network_needs_no_weights_and_says_it_is_not_official(
    ours, data, tmp_path, capsys, monkeypatch
):
    from ditbench.metrics.weights import NOT_OFFICIAL_BANNER, WEIGHTS_ENV

    root, _ = data
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "no-weights-here"))
    monkeypatch.delenv(WEIGHTS_ENV, raising=False)
    out = tmp_path / "m.json"
    args = ["fid", "--samples", str(root / "samples.npz"), "--ref", str(root / "ref.npz"), "--metrics", "fid"]
    code = main([*args, "--inception-weights", "test", "--out", str(out), "--cache-dir", str(tmp_path / "c")])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    result = json.loads(out.read_text())
    assert result["inception"]["name"] == "test" and result["inception"]["official"] is False
    assert len(result["inception"]["sha256"]) == 64 and result["banner"] == NOT_OFFICIAL_BANNER
    assert result["inception"]["recipe"] == 2 and "calibrated random network recipe 2" in captured.out
    assert captured.out.startswith(f"*** {NOT_OFFICIAL_BANNER} ***") and "test (NOT official" in captured.out
    assert NOT_OFFICIAL_BANNER in captured.err
    # the cache entry made with it carries the banner too
    with np.load(result["reference"]["cache"]["path"], allow_pickle=False) as entry:
        assert json.loads(str(entry["meta"]))["banner"] == NOT_OFFICIAL_BANNER
    # it is the network the calibrated weight file holds: the same FID as the file gives
    assert result["metrics"]["fid"] == pytest.approx(ours["metrics"]["fid"], rel=1e-9)
