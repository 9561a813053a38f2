"""Model FLOPs (counter vs closed form), the MFU peak table, step statistics, and the worker's loops."""

import math

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from ditbench.bench.cell.mfu import (
    count_train_flops_per_image,
    gpu_table_key,
    mfu,
    peak_entry,
)
from ditbench.bench.cell.window import measure_window, smoke_run, step_stats
from ditbench.core.errors import UserError
from ditbench.core.faults import Fault, FaultyStep, NonFiniteLoss, fault_for
from ditbench.models import build_model, get_config
from ditbench.spec.knobs import Knobs
from ditbench.train.step import Trainer


def test_xl2_forward_is_the_papers_118_6_gmacs():
    # DiT paper: DiT-XL/2 at 256 px is 118.6 "Gflops" (multiply-accumulates) per forward pass.
    # A training image is about 3 forward passes; the patch embedding and first timestep layer need
    # no input gradient, which the counter sees and `3 x forward` would not.
    counted = count_train_flops_per_image("DiT-XL/2", 256)
    assert round(counted / 3 / 2 / 1e9, 1) == 118.6


def test_checkpoint_recomputation_is_not_model_flops():
    # Counting a checkpointed model would include the recomputed forward: more FLOPs than the model's.
    # (on the meta device, like the counter: CPU's fused attention kernel has no FLOP formula)
    counts = {}
    for ckpt in ("none", "full"):
        with torch.device("meta"):
            net = build_model("DiT-T/4", image_size=64, grad_ckpt=ckpt).train()
            x, t, y = torch.randn(2, 4, 8, 8), torch.randint(0, 1000, (2,)), torch.randint(0, 1000, (2,))
        with FlopCounterMode(display=False) as counter:
            net(x, t, y).pow(2).mean().backward()
        counts[ckpt] = counter.get_total_flops()
    assert counts["full"] > counts["none"]
    assert counts["none"] == 2 * count_train_flops_per_image("DiT-T/4", 64)


def test_peak_table_matches_names_and_refuses_to_guess():
    assert gpu_table_key("NVIDIA H200") == "NVIDIA H200"
    assert gpu_table_key("NVIDIA H100 80GB HBM3") == "NVIDIA H100 SXM"
    assert gpu_table_key("NVIDIA A100-SXM4-80GB") == "NVIDIA A100"
    assert gpu_table_key("NVIDIA A100-PCIE-40GB") == "NVIDIA A100"
    for unknown in (
        "NVIDIA H100 PCIe",
        "NVIDIA H100 NVL",
        "NVIDIA H200 NVL",
        "NVIDIA H20",
        "NVIDIA H800",
        "NVIDIA GeForce RTX 4090",
        "Tesla T4",
        "",
        None,
    ):
        assert gpu_table_key(unknown) is None, unknown
    assert peak_entry("NVIDIA H200", "bf16")["peak_tflops"] == 989.0
    assert peak_entry("NVIDIA H200", "fp32")["peak_tflops"] == 67.0
    assert peak_entry("NVIDIA A100-SXM4-40GB", "tf32")["peak_tflops"] == 156.0
    assert "datasheet" in peak_entry("NVIDIA H200", "tf32")["peak_basis"]


def test_mfu_value_and_null_without_a_known_peak():
    entry = mfu(494.5, "NVIDIA H200", "bf16")
    assert entry["value"] == pytest.approx(0.5) and entry["peak_tflops"] == 989.0 and entry["peak_basis"]
    assert mfu(1.0, None, "fp32") is None  # a CPU
    assert mfu(1.0, "NVIDIA GeForce RTX 4090", "bf16") is None
    assert mfu(None, "NVIDIA H200", "bf16") is None


def test_step_stats_interpolate_their_percentiles():
    values = [5.0, 1.0, 9.0, 3.0, 7.0, 2.0, 8.0]  # sorted 1 2 3 5 7 8 9: p10 at 0.6, p90 at 5.4
    stats = step_stats(values)
    assert stats["median"] == 5.0 and stats["samples"] == values
    assert stats["p10"] == pytest.approx(1.6) and stats["p90"] == pytest.approx(8.4)
    assert type(stats["p10"]) is float


def tiny_trainer(**kw):
    cfg = dict(model="DiT-T/8", image_size=64, batch_size=2, seed=0)
    cfg.update(kw)
    return Trainer(Knobs(**cfg))


def test_measure_window_takes_at_least_k_steps_and_t_seconds():
    trainer = tiny_trainer()
    window = measure_window(trainer, trainer.step, "cpu", warmup=1, measure=2, min_seconds=0.3)
    assert window["steps"] >= 2 and window["wall_s"] >= 0.3
    assert len(window["step_ms"]) == window["steps"]
    assert all(ms > 0 for ms in window["step_ms"])
    assert sum(window["step_ms"]) / 1e3 <= window["wall_s"]
    assert trainer.step_count == 1 + window["steps"]


def test_injected_nan_really_makes_the_loss_non_finite():
    trainer = tiny_trainer()
    step = FaultyStep(trainer, Fault("nan", 3))
    with pytest.raises(NonFiniteLoss) as info:
        measure_window(trainer, step, "cpu", warmup=1, measure=4, min_seconds=0)
    assert info.value.step == 3 and info.value.phase == "measured"
    assert not math.isfinite(info.value.value)


@pytest.mark.slow
def test_smoke_run_curve_and_first_nonfinite_step():
    trainer = tiny_trainer(seed=1)
    smoke = smoke_run(trainer, trainer.step, steps=6)
    assert len(smoke["loss"]) == 6 and all(math.isfinite(x) for x in smoke["loss"])
    assert smoke["first_mean"] == pytest.approx(sum(smoke["loss"]) / 6, abs=1e-5)
    assert smoke["scaler_skips"] == 0
    trainer = tiny_trainer(seed=1)
    with pytest.raises(NonFiniteLoss) as info:
        smoke_run(trainer, FaultyStep(trainer, Fault("nan", 4)), steps=6)
    assert info.value.step == 4 and info.value.phase == "smoke" and len(info.value.curve) == 3


def test_injected_oom_is_a_real_out_of_memory_error():
    trainer = tiny_trainer()
    with pytest.raises(torch.OutOfMemoryError):
        FaultyStep(trainer, Fault("oom", 1))(trainer.next_batch())


def test_parse_faults():
    assert fault_for("x", None) is None
    assert fault_for("DiT-T/8 fp32 ckpt=none bs=2", "bs=2=oom") == Fault("oom", 1)
    assert fault_for("DiT-T/8 fp32 ckpt=full bs=2", "bs=4=oom,ckpt=full=nan@3") == Fault("nan", 3)
    assert fault_for("DiT-T/8 fp32 ckpt=full bs=2", "bs=4=oom") is None
    assert fault_for("bs=2", "bs=2=raise", rank=1, rank_text="0") is None
    for bad in ("bs=2=explode", "bs=2=oom@0", "bs=2=oom@x", "oom"):
        with pytest.raises(UserError, match="DITBENCH_INJECT_FAULT"):
            fault_for("bs=2", bad)
    with pytest.raises(UserError, match="DITBENCH_INJECT_FAULT_RANK"):
        fault_for("bs=2", "bs=2=oom", rank_text="one")


def test_measured_matmul_peak_runs_on_cpu():
    from ditbench.hardware.walltime import measure_matmul_tflops

    assert measure_matmul_tflops("cpu", "fp32", n=128, seconds=0.05) > 0


def test_env_has_the_record_keys_and_the_command_names_the_peak(capsys):
    from ditbench.cli import main
    from ditbench.hardware.environment import collect_env

    env = collect_env()
    expected = {
        "host",
        "platform",
        "cpu",
        "gpu_name",
        "gpu_count",
        "driver",
        "cuda",
        "torch",
        "python",
        "ditbench",
        "git_sha",
    }
    assert set(env) >= expected
    assert env["torch"] == torch.__version__
    assert main(["env"]) == 0
    out = capsys.readouterr().out
    assert "torch" in out and "mfu peak" in out
    if not torch.cuda.is_available():
        assert "mfu null" in out


@pytest.mark.parametrize(
    "model,image_size",
    [
        ("DiT-T/2", 64),
        ("DiT-T/8", 64),
        ("DiT-S/8", 256),
        ("DiT-B/4", 512),
        ("DiT-L/4", 256),
        ("DiT-XL/2", 256),
    ],
)
def test_counted_flops_vs_the_papers_6x_forward_convention(model, image_size):
    # ditbench.models.flops counts 6 x forward MACs (the paper's convention). The counter sees that the
    # patch embedding and the first timestep linear need no input gradient: exactly their forward FLOPs less.
    from ditbench.models.flops import train_flops_per_image

    cfg = get_config(model)
    tokens = (image_size // 8 // cfg.patch_size) ** 2
    skipped_macs = tokens * cfg.hidden_size * 4 * cfg.patch_size**2 + 256 * cfg.hidden_size
    assert (
        count_train_flops_per_image(model, image_size)
        == train_flops_per_image(model, image_size) - 2 * skipped_macs
    )
