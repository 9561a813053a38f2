"""One device resolution for every command: auto, cpu, cuda, cuda:N, and clean refusals."""

import pytest
import torch

from ditbench.core.errors import UnsupportedError, UserError
from ditbench.hardware.device import device_type, resolve_device


def test_device_type_decides_without_cuda():
    assert device_type("auto", cuda=True) == "cuda" and device_type("auto", cuda=False) == "cpu"
    assert device_type("cuda:3", cuda=False) == "cuda" and device_type("CPU") == "cpu"
    with pytest.raises(UserError, match="auto, cpu, cuda or cuda:N"):
        device_type("tpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusals of a machine without CUDA")
def test_cuda_without_a_gpu_is_unsupported_and_auto_is_the_cpu():
    assert resolve_device("auto") == torch.device("cpu")
    for spec in ("cuda", "cuda:1"):
        with pytest.raises(UnsupportedError, match="no CUDA device is visible"):
            resolve_device(spec)
    with pytest.raises(UserError, match="not valid"):
        resolve_device("cuda:x" * 50)


def test_extract_latents_on_a_missing_gpu_leaves_nothing(tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA")
    from ditbench.cli import main

    images = tmp_path / "img" / "cls"
    images.mkdir(parents=True)
    out = tmp_path / "lat.npz"
    code = main(
        ["extract-latents", str(images.parent), "--vae", "random", "--out", str(out), "--device", "cuda"]
    )
    assert code == 2 and "no CUDA device is visible" in capsys.readouterr().err
    assert not out.exists() and not (tmp_path / "lat.npz.parts").exists()
