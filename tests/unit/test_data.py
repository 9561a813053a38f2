import numpy as np
import pytest
import torch
from PIL import Image

from ditbench.cli.extract_latents import extract_latents
from ditbench.core.errors import UserError
from ditbench.models.vae import build_vae
from ditbench.train.data import (
    LatentFile,
    SyntheticLatents,
    center_crop_arr,
    data_source_from_config,
    data_spec,
)


@pytest.fixture(scope="module")
def tiny_vae_dir(tmp_path_factory):
    """A small AutoencoderKL saved as a local diffusers folder (downsamples by 8 like sd-vae)."""
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    vae = AutoencoderKL(
        block_out_channels=(8, 8, 16, 16),
        down_block_types=["DownEncoderBlock2D"] * 4,
        up_block_types=["UpDecoderBlock2D"] * 4,
        layers_per_block=1,
        latent_channels=4,
        norm_num_groups=4,
        sample_size=32,
    )
    path = tmp_path_factory.mktemp("vae") / "tiny-vae"
    vae.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def image_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    for cls in ("cat", "dog"):
        (root / cls).mkdir()
        for i in range(5):
            w, h = int(rng.integers(40, 90)), int(rng.integers(40, 90))
            arr = rng.integers(0, 255, (h, w, 3), dtype=np.uint8)
            Image.fromarray(arr).save(root / cls / f"{i}.png")
    return str(root)


def test_synthetic_is_seeded_and_shaped():
    a = SyntheticLatents(4, 8, 10, "cpu", seed=3)
    b = SyntheticLatents(4, 8, 10, "cpu", seed=3)
    (xa, ya), (xb, yb) = a.next_batch(), b.next_batch()
    assert xa.shape == (4, 4, 8, 8) and ya.shape == (4,) and ya.dtype == torch.long
    assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert int(ya.max()) < 10
    assert not torch.equal(a.next_batch()[0], xa)


def _write_latents(path, n=10, size=4, classes=3):
    rng = np.random.default_rng(0)
    np.savez(
        path,
        latents=rng.standard_normal((n, 4, size, size)).astype(np.float32),
        labels=rng.integers(0, classes, n),
    )


def test_latent_file_batches_cover_an_epoch(tmp_path):
    path = tmp_path / "lat.npz"
    _write_latents(path)
    src = data_source_from_config({"latents": str(path)}, batch_size=5, image_size=32, num_classes=3)
    assert isinstance(src, LatentFile)
    seen = torch.cat([src.next_batch()[0] for _ in range(2)])
    with np.load(path) as f:
        ref = torch.from_numpy(f["latents"])
    # two batches of 5 from 10 latents = one permutation of the file
    assert sorted(seen.sum(dim=(1, 2, 3)).tolist()) == pytest.approx(sorted(ref.sum(dim=(1, 2, 3)).tolist()))
    assert src.describe()["count"] == 10


def test_latent_file_pt_and_bare_path(tmp_path):
    path = tmp_path / "lat.pt"
    torch.save({"latents": torch.randn(6, 4, 4, 4), "labels": torch.arange(6) % 2}, path)
    src = data_source_from_config(data_spec(str(path)), batch_size=4, image_size=32, num_classes=2)
    x, y = src.next_batch()
    assert x.shape == (4, 4, 4, 4) and y.shape == (4,)


def test_latent_file_errors(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        data_source_from_config({"latents": str(tmp_path / "none.npz")}, batch_size=2, image_size=32)
    path = tmp_path / "lat.npz"
    _write_latents(path, size=4)
    with pytest.raises(UserError, match=r"\(4, 8, 8\)"):
        data_source_from_config({"latents": str(path)}, batch_size=2, image_size=64)
    with pytest.raises(UserError, match="num_classes"):
        data_source_from_config({"latents": str(path)}, batch_size=2, image_size=32, num_classes=2)
    bad = tmp_path / "bad.npz"
    np.savez(bad, x=np.zeros(3))
    with pytest.raises(UserError, match="'latents'"):
        data_source_from_config({"latents": str(bad)}, batch_size=2, image_size=32)


def test_bad_data_specs(tmp_path):
    for spec in ({"webdataset": "x"}, 42, "imagenet.tar"):
        with pytest.raises(UserError):
            data_source_from_config(spec, batch_size=2, image_size=32)
    with pytest.raises(UserError, match="needs a VAE"):
        data_source_from_config({"images": str(tmp_path)}, batch_size=2, image_size=32)


def test_center_crop_is_adm():
    img = Image.fromarray(np.zeros((300, 700, 3), dtype=np.uint8))
    out = center_crop_arr(img, 64)
    assert out.size == (64, 64)


def test_image_folder_through_vae(image_dir, tiny_vae_dir):
    src = data_source_from_config(
        {"images": image_dir, "vae": tiny_vae_dir}, batch_size=4, image_size=32, num_classes=10
    )
    x, y = src.next_batch()
    assert x.shape == (4, 4, 4, 4) and torch.isfinite(x).all()
    assert set(y.tolist()) <= {0, 1}
    assert "pretrained" in src.describe()["vae"]
    for _ in range(3):  # wraps around the 10 images
        src.next_batch()


def test_vae_path_errors(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        build_vae(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="config.json"):
        build_vae(str(tmp_path / "empty"))
    torch.save({"encoder.nope": torch.zeros(1)}, tmp_path / "w.pt")
    with pytest.raises(UserError, match="do not match"):
        build_vae(str(tmp_path / "w.pt"))


@pytest.mark.slow
def test_random_vae_is_the_sd_architecture():
    vae, desc = build_vae("random")
    assert "random" in desc
    assert sum(p.numel() for p in vae.parameters()) == 83_653_863  # sd-vae-ft-ema's AutoencoderKL


def test_extract_latents_resumes_to_the_same_file(tmp_path, image_dir, tiny_vae_dir):
    kw = dict(image_size=32, batch_size=3, shard_size=4, progress=False)
    full = extract_latents(image_dir, tiny_vae_dir, tmp_path / "full.npz", **kw)
    assert full["done"] and full["shards_encoded"] == 3
    out = tmp_path / "resumed.npz"
    first = extract_latents(image_dir, tiny_vae_dir, out, stop_after_shards=1, **kw)
    assert not first["done"] and not out.exists()
    assert (tmp_path / "resumed.npz.parts" / "progress.json").is_file()
    second = extract_latents(image_dir, tiny_vae_dir, out, **kw)
    assert second["done"] and second["shards_encoded"] == 2  # the first shard was not redone
    assert not (tmp_path / "resumed.npz.parts").exists()
    with np.load(tmp_path / "full.npz") as a, np.load(out) as b:
        assert a["latents"].shape == (10, 4, 4, 4)
        np.testing.assert_array_equal(a["latents"], b["latents"])
        np.testing.assert_array_equal(a["labels"], b["labels"])
        assert list(b["class_names"]) == ["cat", "dog"]
    src = data_source_from_config({"latents": str(out)}, batch_size=4, image_size=32, num_classes=2)
    assert src.next_batch()[0].shape == (4, 4, 4, 4)


def test_extract_refuses_mismatched_progress(tmp_path, image_dir, tiny_vae_dir):
    out = tmp_path / "x.npz"
    extract_latents(
        image_dir, tiny_vae_dir, out, image_size=32, shard_size=4, progress=False, stop_after_shards=1
    )
    with pytest.raises(UserError, match="different extraction"):
        extract_latents(image_dir, tiny_vae_dir, out, image_size=32, shard_size=5, progress=False)


def _cli(*args):
    import os
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=os.getcwd() + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run(
        [sys.executable, "-m", "ditbench", "extract-latents", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


@pytest.mark.slow
def test_extract_cli(tmp_path, image_dir, tiny_vae_dir):
    out = tmp_path / "lat.npz"
    proc = _cli(
        image_dir,
        "--vae",
        tiny_vae_dir,
        "--out",
        str(out),
        "--image-size",
        "32",
        "--no-progress",
        "--device",
        "cpu",
    )
    assert proc.returncode == 0, proc.stderr
    assert "wrote 10 latents" in proc.stdout and out.is_file()
    bad = _cli(str(tmp_path / "nowhere"), "--vae", "random", "--out", str(out), "--device", "cpu")
    assert bad.returncode == 2 and "does not exist" in bad.stderr and "Traceback" not in bad.stderr


def test_staging_buffers_gather_into_a_ring_and_wait_for_the_copy_before_reuse(monkeypatch):
    from ditbench.train.data import StagingBuffers

    log, made = [], []

    class Event:  # stands in for torch.cuda.Event on a machine without CUDA
        def __init__(self):
            self.n = len(made)
            made.append(self)

        def record(self):
            log.append(("record", self.n))

        def synchronize(self):
            log.append(("wait", self.n))

    monkeypatch.setattr(torch.cuda, "Event", Event)
    latents, labels = torch.randn(10, 4, 2, 2), torch.arange(10)
    ring = StagingBuffers((3, 4, 2, 2), (3,), pin=False)
    seen = []
    for idx in ([0, 1, 2], [7, 8, 9], [4, 5, 6]):
        x, y = ring.gather(latents, labels, torch.tensor(idx))
        assert torch.equal(x, latents[idx]) and torch.equal(y, labels[idx])
        seen.append(x.data_ptr())
        ring.copies_issued()
    assert seen[0] == seen[2] != seen[1]  # two slots, reused in turn: no new host tensor per batch
    assert log == [("record", 0), ("record", 1), ("wait", 0), ("record", 0)]  # wait before reuse


@pytest.mark.gpu
def test_latent_batches_reach_the_gpu_from_pinned_memory(tmp_path):
    path = tmp_path / "lat.npz"
    np.savez(path, latents=np.random.randn(6, 4, 4, 4).astype(np.float32), labels=np.arange(6) % 3)
    src = data_source_from_config(
        {"latents": str(path)}, batch_size=4, image_size=32, num_classes=3, device="cuda"
    )
    x, y = src.next_batch()
    assert x.is_cuda and y.is_cuda and all(b.is_pinned() for slot in src.staging.slots for b in slot)
