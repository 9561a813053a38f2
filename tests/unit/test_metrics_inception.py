"""Our InceptionV3 against torch-fidelity's FeatureExtractorInceptionV3 on the same weights and images.

These are the evidence for keeping the port (docs/metrics.md, "Why ditbench keeps its own InceptionV3"): the
features agree bit for bit, so exactness is not the reason; torch-fidelity's loader is
(test_metrics_weights.py::test_torch_fidelity_runs_code_from_a_weight_file).
"""

import numpy as np
import pytest
import torch
from metrics_support import calibrated_weights_file, synthetic_images, to_nchw
from torch_fidelity.feature_extractor_inceptionv3 import FeatureExtractorInceptionV3
from torch_fidelity.interpolate_compat_tensorflow import interpolate_bilinear_2d_like_tensorflow1x

from ditbench.core.errors import UserError
from ditbench.metrics import weights as inception
from ditbench.metrics.inception import resize_tf1_bilinear
from ditbench.metrics.weights import resolve_weights


def load_inception(path):
    return inception.load_weight_file(path)[0]


@pytest.fixture(scope="module")
def images():
    # two sizes and styles: up-sampling from 32 px and from a non-square 48 x 40
    return [synthetic_images(4, 32, seed=11), synthetic_images(3, 48, seed=12, style="noisy")[:, :, :40]]


@pytest.fixture(scope="module")
def both_features(images):
    weights = calibrated_weights_file()
    ours = load_inception(weights)
    theirs = FeatureExtractorInceptionV3(
        "inception-v3-compat", ["2048", "logits_unbiased"], feature_extractor_weights_path=str(weights)
    )
    captured = {}
    theirs.Mixed_6d.branch1x1.register_forward_hook(lambda m, i, o: captured.__setitem__("b1x1", o))
    out = []
    with torch.no_grad():
        for imgs in images:
            x = to_nchw(imgs)
            f = ours(x)
            pool3, logits = theirs(x)
            spatial = captured["b1x1"][:, :7].permute(0, 2, 3, 1).reshape(len(x), -1)
            out.append((f, {"pool3": pool3, "logits_unbiased": logits, "spatial": spatial}))
    return out


def test_calibrated_network_gives_varied_features(both_features):
    """Guard against the degenerate random network, whose features are ~1e-8 and all alike."""
    for ours, _ in both_features:
        for key in ("pool3", "spatial", "logits_unbiased"):
            f = ours[key].double()
            spread = f.std(0).mean() / f.abs().mean()
            assert f.abs().mean() > 1e-2, key
            assert spread > 0.1, (key, float(spread))
        p = torch.softmax(ours["logits_unbiased"].double(), 1)
        assert p.max(1).values.mean() > 5 / 1008  # predictions far from uniform


def test_features_identical_to_torch_fidelity(both_features):
    for ours, theirs in both_features:
        assert ours["pool3"].shape[1] == 2048 and ours["spatial"].shape[1] == 2023
        assert ours["logits_unbiased"].shape[1] == 1008
        for key in ("pool3", "logits_unbiased", "spatial"):
            torch.testing.assert_close(ours[key], theirs[key], rtol=1e-6, atol=1e-6, msg=key)


def _random_state_dict(seed: int) -> dict[str, torch.Tensor]:
    """Random weights with BatchNorm statistics that keep activations at unit scale (not ~1e-8)."""
    from ditbench.metrics.inception import InceptionV3

    g = torch.Generator().manual_seed(seed)
    state = {}
    for key, v in InceptionV3().state_dict().items():
        if key.endswith("num_batches_tracked"):
            state[key] = v
        elif key.endswith("running_var"):
            state[key] = torch.rand(v.shape, generator=g) * 2 + 0.5
        elif key.endswith("running_mean"):
            state[key] = torch.randn(v.shape, generator=g) * 0.1
        elif key.endswith("bn.weight"):
            state[key] = torch.rand(v.shape, generator=g) + 0.5
        elif key.endswith("bn.bias"):
            state[key] = torch.randn(v.shape, generator=g) * 0.3
        elif key.endswith("conv.weight"):  # He scale: unit-variance outputs before the BatchNorm
            state[key] = torch.randn(v.shape, generator=g) * (2 / v[0].numel()) ** 0.5
        else:  # fc
            state[key] = torch.randn(v.shape, generator=g) * 0.05
    return state


@pytest.mark.slow  # two networks, 2 x 5 images at 299 px
def test_random_weights_give_identical_features_in_both(tmp_path):
    """The same random state dict, saved to a file, read by both: the same pool3, unbiased logits and
    sFID features (torch-fidelity's `Mixed_6d.branch1x1` output hooked, as the port takes it)."""
    path = tmp_path / "random.pth"
    torch.save(_random_state_dict(seed=5), path)
    ours = load_inception(path)  # ditbench's safe path: weights_only=True, SHA-256
    theirs = FeatureExtractorInceptionV3(
        "inception-v3-compat", ["2048", "logits_unbiased"], feature_extractor_weights_path=str(path)
    )
    grab = {}
    theirs.Mixed_6d.branch1x1.register_forward_hook(lambda m, i, o: grab.__setitem__("spatial", o))
    x = to_nchw(synthetic_images(5, 40, seed=3, style="noisy"))
    with torch.no_grad():
        got = ours(x)
        pool3, logits = theirs(x)
    spatial = grab["spatial"][:, :7].permute(0, 2, 3, 1).reshape(len(x), -1)
    for key, expected in (("pool3", pool3), ("logits_unbiased", logits), ("spatial", spatial)):
        assert float(got[key].std(0).mean()) > 1e-2, key  # features that differ between images
        # float32 rounding of values of order 1; measured on CPU (torch 2.14, torch-fidelity 0.4.0): 0.0
        torch.testing.assert_close(got[key], expected, rtol=1e-6, atol=1e-6, msg=key)


@pytest.mark.slow  # 3 passes of 2 images
def test_rescaling_scales_the_features_exactly_and_leaves_the_logits():
    import copy

    from ditbench.metrics.inception import rescale_features

    net = load_inception(calibrated_weights_file())
    scaled = copy.deepcopy(net)
    rescale_features(scaled, pool3=2.0, spatial=0.25)
    x = to_nchw(synthetic_images(2, 32, seed=7))
    with torch.no_grad():
        before, after = net(x), scaled(x)
    torch.testing.assert_close(after["pool3"], 2.0 * before["pool3"], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(after["spatial"], 0.25 * before["spatial"], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(after["logits_unbiased"], before["logits_unbiased"], rtol=1e-5, atol=1e-5)


@pytest.mark.slow  # 16 images
def test_the_test_network_has_its_stated_scale():
    """Over its calibration images (the recipe's 16, seed 1000) the features' total variance is
    FEATURE_TRACE: the sum of the per-dimension sample variances (ddof 1), computed here in numpy."""
    from ditbench.metrics.inception import FEATURE_TRACE, calibration_images

    net = load_inception(calibrated_weights_file())
    with torch.no_grad():
        f = net(calibration_images(16, seed=1000))
    for key in ("pool3", "spatial"):
        total = np.var(f[key].double().numpy(), axis=0, ddof=1).sum()
        # The scale is set from the calibration pass, which normalises by the biased batch variance;
        # eval mode uses the unbiased one, through ~20 BatchNorms in a row: about 1% lower.
        assert total == pytest.approx(FEATURE_TRACE, rel=0.03), key


def test_state_dict_keys_match_torch_fidelity():
    weights = calibrated_weights_file()
    theirs = FeatureExtractorInceptionV3(
        "inception-v3-compat", ["2048"], feature_extractor_weights_path=str(weights)
    )
    ours = load_inception(weights)
    assert {k: v.shape for k, v in ours.state_dict().items()} == {
        k: v.shape for k, v in theirs.state_dict().items()
    }


@pytest.mark.parametrize("size", [(32, 32), (64, 48), (256, 256), (299, 299), (512, 300), (7, 400)])
def test_resize_equals_torch_fidelity_slow_mode(size):
    x = torch.rand(2, 3, *size, generator=torch.Generator().manual_seed(0)) * 255
    expected = interpolate_bilinear_2d_like_tensorflow1x(
        x, size=(299, 299), align_corners=False, method="slow"
    )
    got = resize_tf1_bilinear(x)
    assert got.shape == (2, 3, 299, 299)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-4)
    assert (got - expected).abs().max() <= 1e-4


def test_resize_is_tf1_not_half_pixel():
    # TF1 samples src = dst * in / out: output pixel 0 is input pixel 0 exactly; half-pixel would blend
    x = torch.arange(4.0).view(1, 1, 1, 4).expand(1, 1, 4, 4).contiguous() * 10
    y = resize_tf1_bilinear(x, size=8)
    assert y[0, 0, 0, :3].tolist() == [0.0, 5.0, 10.0]
    assert y[0, 0, 0, -1].item() == 30.0  # clamped at the border


def test_missing_weights_say_where_to_put_them(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.delenv(inception.WEIGHTS_ENV, raising=False)
    calls = []

    def offline(url, dest):
        calls.append(url)
        raise OSError("network is unreachable")

    monkeypatch.setattr(inception, "download_atomic", offline)
    expected = tmp_path / "torch" / "hub" / "checkpoints" / inception.WEIGHTS_FILE_NAME
    with pytest.raises(UserError) as err:
        resolve_weights(None)
    msg = str(err.value)
    assert calls == [inception.WEIGHTS_URL]
    assert str(expected) in msg and inception.WEIGHTS_URL in msg and "--inception-weights" in msg
    assert "network is unreachable" in msg
    # the hub location is found without downloading once the file is there
    expected.parent.mkdir(parents=True)
    expected.write_bytes(b"x")
    assert resolve_weights(None) == expected and len(calls) == 1


def test_weights_from_option_and_environment(monkeypatch, tmp_path):
    f = tmp_path / "w.pth"
    f.write_bytes(b"x")
    monkeypatch.setenv(inception.WEIGHTS_ENV, str(f))
    assert resolve_weights(None) == f
    with pytest.raises(UserError, match=r"from --inception-weights\) does not exist"):
        resolve_weights(tmp_path / "other.pth")
    monkeypatch.setenv(inception.WEIGHTS_ENV, str(tmp_path / "gone.pth"))
    with pytest.raises(UserError, match=inception.WEIGHTS_ENV):
        resolve_weights(None)


@pytest.mark.slow
def test_extractor_batches_agree(tmp_path):
    """Batch size does not change the features on CPU (a batch of 1 vs the whole batch)."""
    from ditbench.metrics.npz_io import ArrayImages
    from ditbench.metrics.weights import FeatureExtractor

    imgs = synthetic_images(2, 24, seed=21)
    a = FeatureExtractor(calibrated_weights_file(), "cpu", batch_size=1, progress=False)
    b = FeatureExtractor(calibrated_weights_file(), "cpu", batch_size=2, progress=False)
    fa = a.extract(ArrayImages(imgs))
    fb = b.extract(ArrayImages(imgs))
    assert a.images_processed == 2
    for k in fa:
        np.testing.assert_allclose(fa[k].numpy(), fb[k].numpy(), rtol=1e-5, atol=1e-5)
