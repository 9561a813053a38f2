"""ADM batch I/O: streaming reads, and a clear message for every kind of bad input."""

import zipfile

import numpy as np
import pytest
from PIL import Image

from ditbench.cli import main
from ditbench.core.errors import UserError
from ditbench.metrics.npz_io import ArrayImages, FolderImages, NpzImages, open_images
from ditbench.metrics.reference import open_reference


def _images(n=5, h=8, w=6, seed=0):
    return np.random.default_rng(seed).integers(0, 256, size=(n, h, w, 3), dtype=np.uint8)


@pytest.mark.parametrize("compressed", [False, True])
def test_npz_streams_in_chunks(tmp_path, compressed):
    imgs = _images(11)
    path = tmp_path / "s.npz"
    (np.savez_compressed if compressed else np.savez)(path, arr_0=imgs, arr_1=np.arange(11))
    src = open_images(path)
    assert isinstance(src, NpzImages) and (src.count, src.height, src.width) == (11, 8, 6)
    chunks = list(src.batches(4))
    assert [len(c) for c in chunks] == [4, 4, 3]
    np.testing.assert_array_equal(np.concatenate(chunks), imgs)


def test_folder_reads_sorted_rgb(tmp_path):
    imgs = _images(3)
    for i, img in enumerate(imgs):
        Image.fromarray(img).save(tmp_path / f"{i:02d}.png")
    Image.fromarray(imgs[0]).convert("P").save(tmp_path / "03.png")  # palette without alpha: fine
    (tmp_path / "notes.txt").write_text("ignored")
    src = open_images(tmp_path)
    assert isinstance(src, FolderImages) and src.count == 4
    got = np.concatenate(list(src.batches(2)))
    np.testing.assert_array_equal(got[:3], imgs)


def test_reference_with_precomputed_statistics(tmp_path):
    path = tmp_path / "ref.npz"
    np.savez(
        path,
        arr_0=_images(4),
        mu=np.zeros(2048, np.float32),
        sigma=np.eye(2048, dtype=np.float32),
        mu_s=np.ones(2023),
        sigma_s=np.eye(2023),
    )
    ref = open_reference(path)
    assert ref.images.count == 4
    assert set(ref.stats) == {"mu", "sigma", "mu_s", "sigma_s"} and ref.stats["sigma"].dtype == np.float64
    stats_only = tmp_path / "stats.npz"
    np.savez(stats_only, mu=np.zeros(2048), sigma=np.eye(2048))
    assert open_reference(stats_only).images is None


# ---- bad input: each gets its own message ---------------------------------------------------


def _npz(tmp_path, **arrays):
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    return path


BAD_ARRAYS = {
    "float_minus1_1": (
        lambda: np.random.default_rng(0).uniform(-1, 1, (4, 8, 8, 3)).astype(np.float32),
        r"looks like model output in \[-1, 1\].*\(x \+ 1\) \* 127.5",
    ),
    "float_0_1": (lambda: np.random.default_rng(0).uniform(0, 1, (4, 8, 8, 3)), r"i\.e\. \[0, 1\]"),
    "channels_first": (lambda: np.zeros((4, 3, 8, 8), np.uint8), r"channels-first.*transpose\(0, 2, 3, 1\)"),
    "grey_3d": (lambda: np.zeros((4, 8, 8), np.uint8), r"grey images N x H x W"),
    "grey_1ch": (lambda: np.zeros((4, 8, 8, 1), np.uint8), r"grey images with one channel"),
    "rgba": (lambda: np.zeros((4, 8, 8, 4), np.uint8), r"RGBA images.*x\[\.\.\., :3\]"),
    "uint16": (lambda: np.zeros((4, 8, 8, 3), np.uint16), r"dtype uint16"),
    "empty": (lambda: np.zeros((0, 8, 8, 3), np.uint8), r"holds no images"),
}


@pytest.mark.parametrize("case", sorted(BAD_ARRAYS))
def test_bad_arrays_are_named(tmp_path, case):
    make, pattern = BAD_ARRAYS[case]
    path = _npz(tmp_path, arr_0=make())
    with pytest.raises(UserError, match=pattern) as err:
        open_images(path)
    assert str(path) in str(err.value)
    with pytest.raises(UserError, match=pattern):  # in-memory arrays get the same checks
        ArrayImages(make())


def test_missing_file(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        open_images(tmp_path / "nope.npz")
    with pytest.raises(UserError, match="does not exist"):
        open_reference(tmp_path / "nope.npz")


def test_npz_without_arr_0(tmp_path):
    path = _npz(tmp_path, images=_images())
    with pytest.raises(UserError, match=r"no `arr_0` array \(its keys: images\)"):
        open_images(path)
    with pytest.raises(UserError, match="neither `arr_0` images nor `mu`/`sigma`"):
        open_reference(path)


def test_truncated_npz(tmp_path):
    path = _npz(tmp_path, arr_0=_images(50, 16, 16))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(UserError, match="truncated or corrupt"):
        open_images(path)


def test_corrupt_npz_member_fails_checksum(tmp_path):
    path = _npz(tmp_path, arr_0=_images(50, 16, 16))
    data = bytearray(path.read_bytes())
    data[2000] ^= 0xFF  # inside the image rows of the stored member
    path.write_bytes(bytes(data))
    src = open_images(path)  # the header is intact
    with pytest.raises(UserError, match="checksum|corrupt"):
        list(src.batches(16))


def test_not_a_zip(tmp_path):
    path = tmp_path / "x.npz"
    path.write_bytes(b"hello, not a zip")
    with pytest.raises(UserError, match="not a readable .npz"):
        open_images(path)


def test_member_size_mismatch(tmp_path):
    # a well-formed zip whose .npy member lacks rows (e.g. a copy cut short before zipping)
    import io

    buf = io.BytesIO()
    np.lib.format.write_array(buf, _images(10))
    raw = buf.getvalue()[:-100]
    path = tmp_path / "short.npz"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("arr_0.npy", raw)
    with pytest.raises(UserError, match="declares 10 images"):
        open_images(path)


def test_folder_problems(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(UserError, match="holds no .png"):
        open_images(empty)

    sizes = tmp_path / "sizes"
    sizes.mkdir()
    Image.fromarray(_images(1, 8, 8)[0]).save(sizes / "a.png")
    Image.fromarray(_images(1, 8, 9)[0]).save(sizes / "b.png")
    with pytest.raises(UserError, match=r"differ in size: a.png is 8x8 but b.png is 9x8"):
        open_images(sizes)

    grey = tmp_path / "grey"
    grey.mkdir()
    Image.fromarray(np.zeros((8, 8), np.uint8)).save(grey / "g.png")
    with pytest.raises(UserError, match="grey image"):
        open_images(grey)

    rgba = tmp_path / "rgba"
    rgba.mkdir()
    Image.fromarray(np.zeros((8, 8, 4), np.uint8)).save(rgba / "a.png")
    with pytest.raises(UserError, match="alpha channel"):
        open_images(rgba)

    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "x.png").write_bytes(b"\x89PNG\r\n\x1a\n garbage")
    with pytest.raises(UserError, match="not a readable image"):
        open_images(broken)


def test_cli_reports_bad_input_without_traceback(tmp_path, capsys):
    bad = _npz(tmp_path, arr_0=np.zeros((4, 3, 8, 8), np.uint8))
    ref = tmp_path / "ref.npz"
    np.savez(ref, arr_0=_images(4))
    code = main(["fid", "--samples", str(bad), "--ref", str(ref), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2
    assert "channels-first" in err and "Traceback" not in err


def test_too_few_samples_for_an_asked_metric(tmp_path, capsys):
    samples, ref = tmp_path / "s.npz", tmp_path / "r.npz"
    np.savez(samples, arr_0=_images(5))
    np.savez(ref, arr_0=_images(5, seed=1))
    # decided from the counts alone, before the network is even looked for
    code = main(
        [
            "fid",
            "--samples",
            str(samples),
            "--ref",
            str(ref),
            "--metrics",
            "is,kid",
            "--is-splits",
            "10",
            "--inception-weights",
            str(tmp_path / "absent.pth"),
        ]
    )
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2
    assert "Cannot compute is: Inception Score needs at least 10 samples (10 splits" in err
    assert "holds 5; lower --is-splits" in err
    assert "Cannot compute kid: KID needs at least 1000 reference images (subsets of 1000)" in err
    code = main(["fid", "--samples", str(samples), "--ref", str(ref), "--metrics", "fid,psnr"])
    assert code == 2 and "unknown metric" in capsys.readouterr().err


def test_streamed_npz_writer_round_trips(tmp_path):
    from ditbench.metrics.npz_io import write_npz_images

    imgs = _images(9, 5, 7)
    path = write_npz_images(tmp_path / "w.npz", (imgs[i : i + 4] for i in range(0, 9, 4)), 9, 5, 7)
    np.testing.assert_array_equal(np.load(path)["arr_0"], imgs)
    np.testing.assert_array_equal(np.concatenate(list(open_images(path).batches(2))), imgs)
    with pytest.raises(ValueError, match="8 images written, 9 declared"):
        write_npz_images(tmp_path / "short.npz", [imgs[:8]], 9, 5, 7)
    assert not (tmp_path / "short.npz").exists() and len(list(tmp_path.iterdir())) == 1
