"""Precision policies and the one TF32 switch: both torch APIs agree, so every getter can be read."""

import pytest
import torch

from ditbench.core.errors import UnsupportedError, UserError
from ditbench.hardware.precision import (
    PRECISIONS,
    check_precision,
    get_precision_policy,
    set_tf32,
    tf32_mode,
)


@pytest.fixture(autouse=True)
def _restore_flags():
    with tf32_mode(False):  # whatever a test sets is undone afterwards
        yield


def _every_getter() -> dict:
    """Read each legacy getter and the new per-op API; a mix of the two makes the legacy ones raise."""
    state = {
        "matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
    }
    if hasattr(torch.backends.cuda.matmul, "fp32_precision"):  # the new per-op API (torch >= 2.9)
        ops = {
            "matmul": torch.backends.cuda.matmul,
            "conv": torch.backends.cudnn.conv,
            "rnn": torch.backends.cudnn.rnn,
        }
        state.update((f"{name}.fp32_precision", op.fp32_precision) for name, op in ops.items())
    assert set(state) >= {"matmul.allow_tf32", "float32_matmul_precision", "cudnn.allow_tf32"}
    return state


@pytest.mark.parametrize("name", PRECISIONS)
def test_each_cuda_policy_leaves_every_tf32_getter_readable(name, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    policy = get_precision_policy(name, "cuda")  # building a policy needs no GPU; its flags are global
    policy.apply_backend_flags()
    state = _every_getter()
    assert state["matmul.allow_tf32"] is (name != "fp32")
    assert state["cudnn.allow_tf32"] is (name != "fp32")
    assert state["float32_matmul_precision"] == ("highest" if name == "fp32" else "high")
    if "matmul.fp32_precision" in state:
        want = "ieee" if name == "fp32" else "tf32"
        assert (state["matmul.fp32_precision"], state["conv.fp32_precision"]) == (want, want)
    # every other reader of the flags in ditbench works after it: the FID extractor and the peak measure
    from ditbench.hardware.precision import tf32_mode
    from ditbench.hardware.walltime import measure_matmul_tflops

    with tf32_mode(False, cudnn_benchmark=True):  # what FID feature extraction uses
        pass
    assert measure_matmul_tflops("cpu", "fp32", n=64, seconds=0.01) > 0
    _every_getter()


def test_new_api_alone_breaks_the_legacy_getters_and_set_tf32_repairs_them():
    if not hasattr(torch.backends.cuda.matmul, "fp32_precision"):
        pytest.skip("this torch has only the legacy TF32 flags")
    torch.backends.cuda.matmul.fp32_precision = "tf32"  # what set_tf32 alone used to do
    with pytest.raises(RuntimeError, match="mix of the legacy and new APIs"):
        torch.backends.cuda.matmul.allow_tf32  # noqa: B018 - reading is the check
    set_tf32(True)
    assert _every_getter()["matmul.allow_tf32"] is True


def test_tf32_mode_restores_the_previous_settings():
    set_tf32(False)
    before = _every_getter()
    with tf32_mode(True, cudnn_benchmark=True):
        assert _every_getter()["matmul.allow_tf32"] is True
        assert torch.backends.cudnn.benchmark is True
    assert _every_getter() == before
    assert torch.backends.cudnn.benchmark is False


def test_cpu_policies_and_names():
    assert get_precision_policy("bf16", "cpu").autocast_dtype == torch.bfloat16
    assert get_precision_policy("fp32", "cpu").autocast_dtype is None
    assert get_precision_policy("fp16", "cuda").use_scaler
    for name in ("tf32", "fp16"):
        with pytest.raises(UnsupportedError, match="CUDA"):
            get_precision_policy(name, "cpu")
    for bad in ("fp8", "BF16", " bf16", None, 16):
        with pytest.raises(UserError, match="fp32, tf32, fp16, bf16"):
            check_precision(bad)


def test_the_precision_names_are_listed_in_one_module():
    """A tuple, list or set of precision names is written in ditbench/hardware/precision.py only: every other
    module imports PRECISIONS, LOW_PRECISIONS, BY_SPEED or asks `supported_on`/`uses_scaler`."""
    import re
    from pathlib import Path

    import ditbench

    names = "|".join(PRECISIONS)
    listed = re.compile(rf"""[(\[{{]\s*["']({names})["']\s*,\s*["']({names})["']""")
    root = Path(ditbench.__file__).parent
    found = [
        f"{path.relative_to(root)}:{number}"
        for path in sorted(root.rglob("*.py"))
        if path != root / "hardware" / "precision.py"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if listed.search(line)
    ]
    assert found == []
    assert listed.search('x = ("fp16", "bf16")') and listed.search("{'tf32', 'fp32'}")
    assert not listed.search('{"fp32": 0, "tf32": 1}')  # a table keyed by precision is no list of them
