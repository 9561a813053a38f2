"""Pixel data (grey 2x2 blocks as the latent, no VAE) and the built-in datasets of matplotlib images."""

import numpy as np
import pytest
import torch

from ditbench.core.errors import UserError
from ditbench.models import builtin_data, pixels
from ditbench.spec.knobs import Knobs
from ditbench.train.data import data_source_from_config


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DITBENCH_CACHE", str(tmp_path / "cache"))


def test_encode_decode_is_exact_and_the_grey_fills_rgb():
    grey = np.random.default_rng(0).integers(0, 256, size=(3, 16, 16), dtype=np.uint8)
    z = pixels.encode(grey)
    assert z.shape == (3, 4, 8, 8) and z.dtype == torch.float32 and -1 <= z.min() and z.max() <= 1
    # channel c of cell (i, j) is pixel (2i + c // 2, 2j + c % 2)
    assert float(z[1, 3, 2, 5]) == pytest.approx(grey[1, 5, 11] / 127.5 - 1, abs=1e-6)
    x = pixels.decode(z)
    assert x.shape == (3, 3, 16, 16) and torch.equal(x[:, 0], x[:, 2])
    back = torch.round((x[:, 0] + 1) * 127.5).to(torch.uint8).numpy()
    assert np.array_equal(back, grey)
    assert pixels.pixel_side(64) == 16 and pixels.pixel_side(256) == 64


def test_rgb_turns_grey_like_pil():
    from PIL import Image

    rgb = np.random.default_rng(1).integers(0, 256, size=(2, 5, 7, 3), dtype=np.uint8)
    want = np.stack([np.asarray(Image.fromarray(im).convert("L")) for im in rgb])
    assert np.abs(pixels.to_grey(rgb).astype(int) - want).max() <= 1


def test_builtin_datasets_are_real_crops_built_once_and_deterministic(tmp_path):
    path = builtin_data.resolve("builtin:mpl-gray16")
    assert path.parent == tmp_path / "cache" / "datasets"
    with np.load(path) as f:
        images, labels = f["arr_0"], f["arr_1"]
    assert images.shape == (4096, 16, 16) and images.dtype == np.uint8
    assert set(labels) == {0, 1} and (labels == 0).sum() == 2048
    # real pictures: the two classes differ (the MRI has a dark background) and crops vary
    dark = [(images[labels == c] < 10).mean() for c in (0, 1)]
    assert dark[1] > 2 * dark[0] and images.std() > 30
    stamp = path.stat().st_mtime_ns
    assert builtin_data.resolve("builtin:mpl-gray16").stat().st_mtime_ns == stamp  # not rebuilt
    again = builtin_data.crops(builtin_data.DATASETS["mpl-gray16"])
    assert np.array_equal(again[0], images)
    with np.load(builtin_data.resolve("builtin:mpl-gray16-ref")) as f:
        ref = f["arr_0"]
    assert ref.shape == (256, 16, 16, 3) and not np.array_equal(ref[:10, ..., 0], images[:10])


def test_unknown_builtin_name_lists_the_valid_ones():
    with pytest.raises(UserError, match="unknown built-in dataset 'builtin:imagenet'.*builtin:mpl-gray16"):
        builtin_data.resolve("builtin:imagenet")


def test_pixel_data_source_trains_on_the_blocks():
    config = Knobs(
        **{"model": "DiT-T/2", "image_size": 64, "num_classes": 2, "data": {"pixels": "builtin:mpl-gray16"}}
    )
    source = data_source_from_config(
        config.data, batch_size=8, image_size=64, num_classes=2, device="cpu", seed=0
    )
    x, y = source.next_batch()
    assert x.shape == (8, 4, 8, 8) and y.shape == (8,) and set(y.tolist()) <= {0, 1}
    assert source.describe() == {
        "kind": "pixels",
        "path": "builtin:mpl-gray16",
        "colour": "grey",
        "count": 4096,
    }


@pytest.mark.parametrize(
    "arrays, image_size, needle",
    [
        ({"arr_0": np.zeros((4, 8, 8), np.uint8)}, 64, "of 8x8 pixels, but a model of image_size 64"),
        ({"arr_0": np.zeros((4, 16, 16), np.float32)}, 64, "must be uint8"),
        ({"images": np.zeros((4, 16, 16), np.uint8)}, 64, "needs `arr_0`"),
        ({"arr_0": np.zeros((4, 16, 16), np.uint8), "arr_1": np.full(4, 7)}, 64, "outside \\[0, 1\\]"),
        ({"arr_0": np.zeros((4, 16, 16), np.uint8), "arr_1": np.zeros(3, int)}, 64, "one integer label"),
    ],
)
def test_bad_pixel_files_are_named_with_what_would_be_valid(tmp_path, arrays, image_size, needle):
    path = tmp_path / "px.npz"
    np.savez(path, **arrays)
    with pytest.raises(UserError, match=needle):
        pixels.load_pixels(str(path), image_size, num_classes=2)


def test_a_pickled_pixel_file_is_never_loaded(tmp_path):
    path = tmp_path / "px.npz"
    np.savez(path, arr_0=np.array([object()], dtype=object))
    with pytest.raises(UserError, match="without pickled objects"):
        pixels.load_pixels(str(path), 64, num_classes=2)
    with pytest.raises(UserError, match="is not a file"):
        pixels.load_pixels(str(tmp_path), 64, num_classes=2)


def test_rgb_pixels_are_one_pixel_per_latent_cell_and_decode_exactly():
    rgb = np.random.default_rng(2).integers(0, 256, size=(3, 32, 32, 3), dtype=np.uint8)
    z = pixels.encode_rgb(rgb)
    assert z.shape == (3, 4, 32, 32) and z.dtype == torch.float32
    assert float(z[2, 1, 7, 30]) == pytest.approx(rgb[2, 7, 30, 1] / 127.5 - 1, abs=1e-6)
    luma = 0.299 * z[:, 0] + 0.587 * z[:, 1] + 0.114 * z[:, 2]  # ITU-R 601, in [-1, 1]
    assert torch.allclose(z[:, 3], luma, atol=1e-6)
    x = pixels.decode_rgb(z)
    assert x.shape == (3, 3, 32, 32)
    back = torch.round((x.permute(0, 2, 3, 1) + 1) * 127.5).to(torch.uint8).numpy()
    assert np.array_equal(back, rgb)
    assert pixels.pixel_side(256, "rgb") == 32 and pixels.pixel_side(256) == 64


def test_the_colour_key_is_checked_and_grey_keeps_the_id_it_always_had():
    grey = Knobs(**{"model": "DiT-T/2", "data": {"pixels": "builtin:mpl-gray16"}})
    named = Knobs(**{"model": "DiT-T/2", "data": {"pixels": "builtin:mpl-gray16", "colour": "grey"}})
    assert named.data == grey.data == {"pixels": "builtin:mpl-gray16"}
    rgb = Knobs(**{"model": "DiT-T/2", "data": {"pixels": "builtin:photos-rgb32", "colour": "rgb"}})
    assert rgb.data == {"pixels": "builtin:photos-rgb32", "colour": "rgb"}
    with pytest.raises(UserError, match="data.colour must be grey or rgb, got 'cmyk'"):
        Knobs(**{"model": "DiT-T/2", "data": {"pixels": "x.npz", "colour": "cmyk"}})


def test_rgb_photos_are_real_colour_crops_and_train_as_rgb_pixels():
    pytest.importorskip("skimage")
    path = builtin_data.resolve("builtin:photos-rgb32")
    with np.load(path) as f:
        images, labels = f["arr_0"], f["arr_1"]
    assert images.shape == (4096, 32, 32, 3) and set(labels) == {0, 1}
    # real colour: the coffee crops are redder than the cat's, and no crop is grey
    red = [(images[labels == c][..., 0].astype(int) - images[labels == c][..., 2]).mean() for c in (0, 1)]
    assert red[1] > red[0] + 20 and images.std() > 30
    source = data_source_from_config(
        {"pixels": "builtin:photos-rgb32", "colour": "rgb"},
        batch_size=8,
        image_size=256,
        num_classes=2,
        device="cpu",
        seed=0,
    )
    x, _ = source.next_batch()
    assert x.shape == (8, 4, 32, 32) and x[:, 3].std() > 0.1
    with pytest.raises(UserError, match="trains on rgb images of 32x32 .* set image_size to 128"):
        pixels.load_pixels(str(builtin_data.resolve("builtin:mpl-gray16")), 256, num_classes=2, colour="rgb")


def test_without_scikit_image_the_photos_name_the_extra(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "skimage" else real(name, *a)
    )
    with pytest.raises(UserError, match='pip install "ditbench\\[photos\\]"'):
        builtin_data.resolve("builtin:photos-rgb32-ref")
