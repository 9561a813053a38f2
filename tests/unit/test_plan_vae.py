"""Image-folder cells: the VAE encodes every batch inside the traced step (plan/trace.py VaeImages)."""

from __future__ import annotations

import pytest

from ditbench.cli import main
from ditbench.plan.predict import predict_cell

pytest.importorskip("diffusers")
TINY = {"model": "DiT-T/2", "image_size": 64, "precision": "bf16", "batch_size": 8}
IMAGES = {"images": "photos/", "vae": "ema"}


def test_the_vae_in_the_loop_holds_its_weights_and_costs_its_encoder():
    from diffusers import AutoencoderKL

    from ditbench.models import vae

    latents = predict_cell(TINY, "H200")
    images = predict_cell({**TINY, "data": IMAGES}, "H200")
    assert latents.components["vae"] == 0 and images.status == "fits"
    vae_bytes = 4 * sum(p.numel() for p in AutoencoderKL(**vae.SD_VAE_CONFIG).parameters())
    assert images.components["vae"] * 2**30 == pytest.approx(vae_bytes, rel=0.01)  # 83.7 M float32
    assert images.peak_allocated_gib > latents.peak_allocated_gib + vae_bytes / 2**30 * 0.99
    assert images.predicted_images_per_s < latents.predicted_images_per_s
    assert images.step_split_pct["matmul"] > latents.step_split_pct["matmul"]  # the encoder's convolutions


def test_the_answer_says_what_extracting_latents_saves(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("DITBENCH_CACHE", str(tmp_path))
    argv = ["--card", "L4", "--models", "DiT-T/2", "--image-size", "64", "--precisions", "bf16"]
    assert main(["plan", *argv, "--grad-ckpt", "none", "--global-batch", "8", "--images"]) == 0
    out = capsys.readouterr().out
    assert (
        "Images go through the VAE every step; on latents extracted once (`ditbench extract-latents`):" in out
    )
    saving = out.split("  DiT-T/2 +")[1].split("\n")[0]  # e.g. "35% img/s, -0.45 GiB"
    assert int(saving.split("%")[0]) > 0 and float(saving.split(", ")[1].split()[0]) < -0.31  # its weights
    assert main(["plan", "suite.yaml", "--images"]) == 2
