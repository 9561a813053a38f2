"""Weights by name (the VAE as `ema`/`mse`, released DiT checkpoints by file name): a local cache
resolves them, and offline a missing one is one paragraph saying which file to put where. Nothing
here touches the network: every test sets DITBENCH_OFFLINE."""

import argparse
import json

import pytest
import torch

from ditbench.core.errors import UserError
from ditbench.files import pretrained
from ditbench.models import vae
from ditbench.models.build import build_model
from ditbench.models.checkpoint import load_model_weights
from ditbench.sampling.sampler import check_args

SMALL_VAE = dict(
    in_channels=3,
    out_channels=3,
    down_block_types=["DownEncoderBlock2D"] * 2,
    up_block_types=["UpDecoderBlock2D"] * 2,
    block_out_channels=[8, 8],
    layers_per_block=1,
    latent_channels=4,
    norm_num_groups=4,
    sample_size=32,
)


@pytest.fixture(autouse=True)
def _offline(tmp_path, monkeypatch):
    monkeypatch.setenv("DITBENCH_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setenv("DITBENCH_CACHE", str(tmp_path / "ditbench"))
    monkeypatch.chdir(tmp_path)


def _hf_cache_entry(root, repo: str):
    """A Hugging Face cache holding `repo` as the hub lays it out: refs/main -> snapshots/<commit>/."""
    from diffusers import AutoencoderKL

    commit = "0" * 40
    folder = root / f"models--{repo.replace('/', '--')}"
    snapshot = folder / "snapshots" / commit
    torch.manual_seed(0)
    AutoencoderKL(**SMALL_VAE).save_pretrained(snapshot)
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(commit)
    return snapshot


def test_the_vae_by_name_loads_from_the_hugging_face_cache(tmp_path):
    snapshot = _hf_cache_entry(tmp_path / "hf", "stabilityai/sd-vae-ft-mse")
    model, desc = vae.build_vae("mse")
    assert desc == "pretrained stabilityai/sd-vae-ft-mse (by name `mse`)"
    assert json.loads((snapshot / "config.json").read_text())["block_out_channels"] == [8, 8]
    assert list(model.config.block_out_channels) == [8, 8] and not model.training


def test_a_missing_vae_offline_says_which_files_to_put_where(tmp_path):
    with pytest.raises(UserError) as err:
        vae.build_vae("ema")
    text = str(err.value)
    assert "huggingface-cli download stabilityai/sd-vae-ft-ema" in text
    assert str(tmp_path / "hf" / "models--stabilityai--sd-vae-ft-ema") in text
    assert "config.json and diffusion_pytorch_model.safetensors" in text and "downloading is off" in text


def _official_checkpoint(path):
    """A bare state dict, as the released files are (of a tiny DiT: the name is what is tested)."""
    torch.manual_seed(0)
    model = build_model("DiT-T/2", image_size=64, num_classes=10)
    torch.save(model.state_dict(), path)
    return model


def test_a_released_checkpoint_by_name_resolves_in_the_cache(tmp_path):
    cached = tmp_path / "ditbench" / "checkpoints" / "DiT-XL-2-256x256.pt"
    cached.parent.mkdir(parents=True)
    _official_checkpoint(cached)
    assert pretrained.resolve_checkpoint("DiT-XL-2-256x256.pt") == cached
    model, loaded = load_model_weights("DiT-XL-2-256x256.pt")
    assert loaded.source == "bare" and model.num_classes == 10 and len(model.blocks) == 4
    official = tmp_path / "pretrained_models" / "DiT-XL-2-256x256.pt"  # where the official code keeps it
    official.parent.mkdir()
    official.symlink_to(cached)
    assert pretrained.resolve_checkpoint("DiT-XL-2-256x256.pt") == official.relative_to(tmp_path)


def test_a_missing_checkpoint_offline_says_where_to_put_it(tmp_path):
    with pytest.raises(UserError) as err:
        pretrained.resolve_checkpoint("DiT-XL-2-512x512.pt")
    text = str(err.value)
    assert "https://dl.fbaipublicfiles.com/DiT/models/DiT-XL-2-512x512.pt" in text
    assert str(tmp_path / "ditbench" / "checkpoints" / "DiT-XL-2-512x512.pt") in text
    assert "downloading is off" in text
    # a path, or a name that is not a released checkpoint, is left to the loader
    assert str(pretrained.resolve_checkpoint("other.pt")) == "other.pt"
    assert str(pretrained.resolve_checkpoint("./DiT-XL-2-512x512.pt")) == "DiT-XL-2-512x512.pt"


def test_ditbench_sample_takes_both_names(tmp_path):
    args = argparse.Namespace(
        checkpoint="DiT-XL-2-256x256.pt",
        vae="ema",
        num_samples=8,
        batch_size=4,
        steps=10,
        num_classes=None,
        cfg_scale=1.5,
        out=str(tmp_path / "s.npz"),
    )
    with pytest.raises(UserError, match="DiT-XL-2-256x256.pt is not in pretrained_models/"):
        check_args(args)
    cached = tmp_path / "ditbench" / "checkpoints" / "DiT-XL-2-256x256.pt"
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"")
    check_args(args)  # the VAE name is resolved when the VAE is built
    assert args.checkpoint == str(cached)
