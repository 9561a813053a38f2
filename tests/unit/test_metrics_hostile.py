"""`ditbench fid` against hostile input: every case exits 2 with one paragraph naming the file, key
or flag (or, where the input is usable, exits 0 with the stated warning), and never a traceback.

The network is a stand-in (metrics_support.FakeExtractor): each case is decided before or
around the network, and an error case must leave it uncalled. Weight files are covered in
test_metrics_weights.py.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import zipfile

import numpy as np
import pytest
from images import png_header_only
from metrics_support import FakeExtractor, synthetic_images
from PIL import Image

import ditbench.metrics.evaluate as evaluate_module
from ditbench.cli import main

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


class Payload:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('code ran')",))


def _images(n, size=16, seed=0):
    return synthetic_images(n, size, seed=seed)


def _npy(header: bytes, version=(1, 0), data: bytes = b"") -> bytes:
    pad = 64 - (10 + len(header) + 1) % 64
    header = header + b" " * pad + b"\n"
    size = len(header).to_bytes(2 if version == (1, 0) else 4, "little")
    return b"\x93NUMPY" + bytes(version) + size + header + data


def _zip(path, members: dict[str, bytes]):
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


def _patch_zip(path, *, flags=None, method=None):
    """Rewrite the general-purpose flags / compression method of every entry (local and central)."""
    data = bytearray(path.read_bytes())
    for sig, flag_at, method_at in ((b"PK\x03\x04", 6, 8), (b"PK\x01\x02", 8, 10)):
        i = data.find(sig)
        while i >= 0:
            if flags is not None:
                data[i + flag_at : i + flag_at + 2] = struct.pack("<H", flags)
            if method is not None:
                data[i + method_at : i + method_at + 2] = struct.pack("<H", method)
            i = data.find(sig, i + 4)
    path.write_bytes(bytes(data))
    return path


def _stats(n=40, seed=0, **override):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 2048))
    s = rng.normal(size=(n, 2023))
    stats = {
        "mu": x.mean(0),
        "sigma": np.cov(x, rowvar=False),
        "mu_s": s.mean(0),
        "sigma_s": np.cov(s, rowvar=False),
    }
    stats.update(override)
    return {k: v for k, v in stats.items() if v is not None}


def _sigma_with(value):
    sigma = _stats()["sigma"]
    sigma[3, 5] = value
    return sigma


# Each case builds its inputs in `tmp` and returns (argv extras, text the message must contain,
# the file/key/flag the message must name). `samples`/`ref` default to valid 8-image batches.
def _samples(tmp, arr):
    np.savez(tmp / "s.npz", arr_0=arr)
    return tmp / "s.npz"


def _ref_stats(tmp, **override):
    np.savez(tmp / "r.npz", **_stats(**override))
    return tmp / "r.npz"


CASES = {
    # ---- samples ----
    "one_image": lambda t: (
        ["--samples", _samples(t, _images(1))],
        "FID needs at least 2 samples",
        "s.npz holds 1",
    ),
    "object_array": lambda t: (
        ["--samples", _samples(t, np.array([Payload(t / "MARKER")], dtype=object))],
        "holds Python objects",
        "s.npz (key `arr_0`)",
    ),
    "float_images": lambda t: (
        ["--samples", _samples(t, _images(4).astype(np.float32))],
        "holds float32 values",
        "s.npz",
    ),
    "zero_images": lambda t: (
        ["--samples", _samples(t, np.zeros((0, 16, 16, 3), np.uint8))],
        "holds no images",
        "s.npz",
    ),
    "zero_width": lambda t: (
        ["--samples", _samples(t, np.zeros((4, 16, 0, 3), np.uint8))],
        "holds no images",
        "s.npz",
    ),
    "non_utf8_npy_header": lambda t: (
        ["--samples", _zip(t / "s.npz", {"arr_0.npy": _npy(b"{'descr': '|u1', '\xff\xfe': 1}", (3, 0))})],
        "unreadable .npy header",
        "s.npz (key `arr_0`)",
    ),
    "negative_shape": lambda t: (
        [
            "--samples",
            _zip(
                t / "s.npz",
                {"arr_0.npy": _npy(b"{'descr': '|u1', 'fortran_order': False, 'shape': (-4, 16, 16, 3), }")},
            ),
        ],
        "negative size",
        "s.npz",
    ),
    "huge_images_declared": lambda t: (
        [
            "--samples",
            _zip(
                t / "s.npz",
                {
                    "arr_0.npy": _npy(
                        b"{'descr': '|u1', 'fortran_order': False, 'shape': (1, 99999, 99999, 3), }"
                    )
                },
            ),
        ],
        "more than 89,478,485 per image",
        "s.npz",
    ),
    "encrypted_member": lambda t: (
        ["--samples", _patch_zip(_samples(t, _images(4)), flags=1)],
        "cannot be read",
        "s.npz (key `arr_0`)",
    ),
    "unknown_compression": lambda t: (
        ["--samples", _patch_zip(_samples(t, _images(4)), method=99)],
        "NotImplementedError",
        "s.npz (key `arr_0`)",
    ),
    "not_a_zip": lambda t: (
        ["--samples", _write(t / "s.npz", b"\xff\xfe not a zip")],
        "not a readable .npz",
        "s.npz",
    ),
    "fifo": lambda t: (["--samples", _fifo(t / "s.npz")], "is a FIFO", "s.npz"),
    "folder_of_non_images": lambda t: (
        ["--samples", _folder(t / "imgs", {"a.txt": b"x", "b.csv": b"y"})],
        "holds no .png",
        "imgs",
    ),
    "png_that_is_not_an_image": lambda t: (
        ["--samples", _folder(t / "imgs", {"a.png": b"GIF89a..."})],
        "not a readable image",
        "a.png",
    ),
    "decompression_bomb_png": lambda t: (
        ["--samples", png_header_only(_folder(t / "imgs", {}) / "bomb.png", 30000, 30000).parent],
        "declares more pixels than an image decoder should allocate",
        "bomb.png",
    ),
    "large_png": lambda t: (
        ["--samples", png_header_only(_folder(t / "imgs", {}) / "big.png", 10000, 9000).parent],
        "more than 89,478,485",
        "big.png",
    ),
    # ---- reference ----
    "ref_empty_folder": lambda t: (["--ref", _folder(t / "refimgs", {})], "holds no .png", "refimgs"),
    "ref_nan_sigma": lambda t: (
        ["--ref", _ref_stats(t, sigma=_sigma_with(np.nan))],
        "NaN or infinite",
        "r.npz (key `sigma`)",
    ),
    "ref_inf_mu": lambda t: (
        ["--ref", _ref_stats(t, mu=np.full(2048, np.inf))],
        "2048 NaN or infinite",
        "r.npz (key `mu`)",
    ),
    "ref_object_sigma": lambda t: (
        ["--ref", _ref_stats(t, sigma=np.array([Payload(t / "MARKER")], dtype=object))],
        "object array",
        "r.npz (key `sigma`)",
    ),
    "ref_string_mu": lambda t: (
        ["--ref", _ref_stats(t, mu=np.array(["a"] * 2048))],
        "has dtype <U1",
        "r.npz (key `mu`)",
    ),
    "ref_complex_mu": lambda t: (
        ["--ref", _ref_stats(t, mu=np.zeros(2048, complex))],
        "has dtype complex128",
        "(key `mu`)",
    ),
    "ref_wrong_dims": lambda t: (
        ["--ref", _ref_stats(t, mu=np.zeros(10), sigma=np.eye(10))],
        "has shape (10,); expected 2048",
        "r.npz (key `mu`)",
    ),
    "ref_asymmetric_sigma": lambda t: (
        ["--ref", _ref_stats(t, sigma=_sigma_with(7.0))],
        "not symmetric",
        "(key `sigma`)",
    ),
    "ref_mu_without_sigma": lambda t: (
        ["--ref", _ref_stats(t, sigma=None)],
        "has `mu` without `sigma`",
        "r.npz",
    ),
    "ref_empty_pool3": lambda t: (
        ["--ref", _ref_stats(t, pool3=np.zeros((0, 2048)))],
        "it is empty",
        "(key `pool3`)",
    ),
    "ref_huge_sigma_declared": lambda t: (
        [
            "--ref",
            _zip(
                t / "r.npz",
                {
                    "mu.npy": _npy(
                        b"{'descr': '<f8', 'fortran_order': False, 'shape': (2048,), }", data=bytes(8 * 2048)
                    ),
                    "sigma.npy": _npy(
                        b"{'descr': '<f8', 'fortran_order': False, 'shape': (100000, 100000), }"
                    ),
                },
            ),
        ],
        "has shape (100000, 100000); expected 2048 x 2048",
        "r.npz (key `sigma`)",
    ),
    "ref_without_images_or_stats": lambda t: (
        ["--ref", _npz_of(t / "r.npz", labels=np.arange(3))],
        "neither `arr_0`",
        "r.npz",
    ),
    "ref_is_a_directory_npz": lambda t: (["--ref", _folder(t / "r.npz", {})], "holds no .png", "r.npz"),
    # ---- output and options ----
    "out_is_a_directory": lambda t: (["--out", _folder(t / "out", {})], "is a folder", "out"),
    "out_under_a_file": lambda t: (
        ["--out", _write(t / "file", b"x") / "m.json"],
        "is a file, not a folder",
        "file",
    ),
    "out_names_another_format": lambda t: (["--out", t / "m.npz"], "ending in .json (e.g. m.json)", "m.npz"),
    "out_would_overwrite_the_samples": lambda t: (
        ["--samples", _samples(t, _images(8)).rename(t / "s.json"), "--out", t / "s.json"],
        "is the input --samples",
        "s.json",
    ),
    "kid_coef0_nan": lambda t: (["--kid-coef0", "nan"], "must be a finite number", "--kid-coef0"),
    "is_splits_negative": lambda t: (["--is-splits", "-1"], "must be >= 0", "--is-splits"),
    "batch_size_zero": lambda t: (["--batch-size", "0"], "must be a positive integer", "--batch-size"),
    "unknown_metric": lambda t: (["--metrics", "fid,psnr"], "unknown metric(s) ['psnr']", "--metrics"),
}


def _write(path, data: bytes):
    path.write_bytes(data)
    return path


def _fifo(path):
    os.mkfifo(path)
    return path


def _folder(path, files: dict[str, bytes]):
    path.mkdir()
    for name, data in files.items():
        (path / name).write_bytes(data)
    return path


def _npz_of(path, **arrays):
    np.savez(path, **arrays)
    return path


@pytest.fixture
def fake_network(monkeypatch):
    made = []

    def factory(**kwargs):
        made.append(FakeExtractor())
        return made[-1]

    monkeypatch.setattr(evaluate_module, "FeatureExtractor", factory)
    return made


def _run(tmp_path, extra, capsys):
    """`ditbench fid` in-process on valid 8-image defaults, with the case's arguments over them."""
    np.savez(tmp_path / "default_s.npz", arr_0=_images(8, seed=1))
    np.savez(tmp_path / "default_r.npz", arr_0=_images(8, seed=2))
    argv = {
        "--samples": tmp_path / "default_s.npz",
        "--ref": tmp_path / "default_r.npz",
        "--out": tmp_path / "m.json",
        "--cache-dir": tmp_path / "cache",
        "--is-splits": 2,
        "--kid-subset-size": 4,
    }
    argv.update(zip(extra[::2], extra[1::2], strict=True))
    code = main(["fid", "--no-progress", *(str(x) for kv in argv.items() for x in kv)])
    captured = capsys.readouterr()
    return code, captured.out, " ".join(captured.err.split())


@pytest.mark.parametrize("case", list(CASES))
def test_hostile_input_is_a_clean_error(case, tmp_path, capsys, fake_network):
    extra, expected, named = CASES[case](tmp_path)
    code, out, err = _run(tmp_path, [str(x) for x in extra], capsys)
    assert code == 2, (out, err)
    assert err.startswith("ditbench: error: ") and "Traceback" not in err
    assert expected in err, err
    assert named in err, err
    assert fake_network == [] or fake_network[0].calls == []  # refused before any image was featurised
    assert not (tmp_path / "MARKER").exists()
    assert len(err) < 1500  # one paragraph, bounded whatever the input


def test_battery_size():
    assert len(CASES) >= 30


# ---- usable input: exit 0 with the stated warning ---------------------------------------------------


def test_samples_and_reference_of_different_sizes_warn(tmp_path, capsys, fake_network):
    np.savez(tmp_path / "ref.npz", arr_0=_images(8, size=16, seed=2))
    code, out, err = _run(
        tmp_path, ["--samples", str(_samples(tmp_path, _images(8, 24))), "--metrics", "fid"], capsys
    )
    assert code == 0, err
    assert "warning: the samples are 24x24 (height x width) but the reference" in err and "is 16x16" in err
    assert json.loads((tmp_path / "m.json").read_text())["metrics"]["fid"] > 0


def test_a_cache_dir_that_is_a_file_warns_and_scores(tmp_path, capsys, fake_network):
    (tmp_path / "cachefile").write_text("x")
    code, out, err = _run(tmp_path, ["--cache-dir", str(tmp_path / "cachefile"), "--metrics", "fid"], capsys)
    assert code == 0, err
    assert "warning: could not write the reference cache entry" in err and "cachefile" in err


def test_a_damaged_cache_entry_is_rebuilt_with_a_warning(tmp_path, capsys, fake_network):
    code, _, err = _run(tmp_path, ["--metrics", "fid"], capsys)
    entry = json.loads((tmp_path / "m.json").read_text())["reference"]["cache"]["path"]
    np.savez(entry, mu=np.array([Payload(tmp_path / "MARKER")], dtype=object))  # planted in the cache
    code, _, err = _run(tmp_path, ["--metrics", "fid"], capsys)
    assert code == 0 and "ignoring the unusable cache entry" in err and "object array" in err
    assert not (tmp_path / "MARKER").exists()
    result = json.loads((tmp_path / "m.json").read_text())
    assert result["reference"]["cache"]["hit"] is False
    code, _, err = _run(tmp_path, ["--metrics", "fid"], capsys)  # rebuilt: a hit again
    assert json.loads((tmp_path / "m.json").read_text())["reference"]["cache"]["hit"] is True


@pytest.mark.slow
def test_a_non_utf8_folder_name_is_one_paragraph(tmp_path):
    """A path that is not valid UTF-8 is refused before any work with one paragraph naming it (every
    argument goes into UTF-8 records and JSON), not a crash in an encoder."""
    folder = os.fsdecode(bytes(tmp_path) + b"/imgs-\xff")
    os.mkdir(folder)
    for i, img in enumerate(_images(3)):
        Image.fromarray(img).save(os.path.join(folder, f"{i}.png"))
    env = {**os.environ, "PYTHONIOENCODING": "utf-8"}
    proc = subprocess.run(
        [sys.executable, "-m", "ditbench", "fid", "--samples", folder, "--ref", folder, "--metrics", "fid"]
        + ["--no-progress", "--no-cache", "--out", str(tmp_path / "m.json")],
        capture_output=True,
        env=env,
        timeout=300,
    )
    err = proc.stderr.decode(errors="replace")
    assert proc.returncode == 2, err
    assert "imgs-\\xff" in err and "not UTF-8" in err and "Traceback" not in err
    assert not (tmp_path / "m.json").exists()


def test_the_object_payload_is_live(tmp_path):
    """Guard: the object arrays above really would run code if unpickled."""
    import pickle

    pickle.loads(pickle.dumps(Payload(tmp_path / "proof")))
    assert (tmp_path / "proof").exists()


# --------------------------------------------------------------- degenerate samples (issue 21)

DEGENERATE = {
    "twelve identical samples (mode collapse, the issue's example)": (
        lambda: np.full((12, 32, 32, 3), 128, np.uint8),
        lambda: _images(12, seed=2),
    ),
    "an identical reference": (lambda: _images(12, seed=1), lambda: np.full((12, 32, 32, 3), 7, np.uint8)),
    "both sets one and the same image": (
        lambda: np.zeros((12, 32, 32, 3), np.uint8),
        lambda: np.zeros((12, 32, 32, 3), np.uint8),
    ),
    "all black against all white": (
        lambda: np.zeros((12, 32, 32, 3), np.uint8),
        lambda: np.full((12, 32, 32, 3), 255, np.uint8),
    ),
}


@pytest.mark.parametrize("case", list(DEGENERATE))
def test_degenerate_samples_give_defined_values_not_a_traceback(case, tmp_path, capsys, fake_network):
    samples, ref = DEGENERATE[case]
    np.savez(tmp_path / "s.npz", arr_0=samples())
    np.savez(tmp_path / "r.npz", arr_0=ref())
    code, out, err = _run(tmp_path, ["--samples", tmp_path / "s.npz", "--ref", tmp_path / "r.npz"], capsys)
    assert code == 0, err
    metrics = json.loads((tmp_path / "m.json").read_text())["metrics"]
    for name in ("fid", "sfid", "inception_score", "precision", "recall"):
        assert metrics[name] is None or np.isfinite(metrics[name]), (name, metrics)
    assert metrics["fid"] >= 0 and metrics["sfid"] >= 0
    if case.startswith("both"):
        assert metrics["fid"] == 0.0 and metrics["sfid"] == 0.0


def test_the_frechet_distance_of_a_collapsed_set_is_its_closed_form():
    """sigma1 = 0: FID = |mu1 - mu2|^2 + tr(sigma2), exactly (tr sqrt(0 . sigma2) = 0)."""
    from ditbench.metrics.fid import frechet_distance, trace_sqrt_product

    rng = np.random.default_rng(0)
    ref = rng.standard_normal((20, 6))
    mu2, sigma2 = ref.mean(0), np.cov(ref, rowvar=False)
    collapsed = np.ones((12, 6))
    factor = (collapsed - collapsed.mean(0)) / np.sqrt(11)  # all zeros
    assert trace_sqrt_product(np.zeros((6, 6)), sigma2, factor1=factor) == 0.0
    assert trace_sqrt_product(np.zeros((6, 6)), sigma2) == 0.0  # the eigh path
    expected = float((1 - mu2) @ (1 - mu2) + np.trace(sigma2))
    assert frechet_distance(np.ones(6), np.zeros((6, 6)), mu2, sigma2, factor1=factor) == pytest.approx(
        expected, rel=1e-12
    )
