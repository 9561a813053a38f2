"""ditbench's step computes what the official train.py loop computes (the recipe that
benchmarks/bench_vs_official.py times it against): the same loss, AdamW update and EMA,
within float rounding."""

import pytest
import torch
from benchmark_scripts import load_benchmark

from ditbench.models.diffusion import create_diffusion


def _load():
    return load_benchmark("bench_vs_official")


bench = _load()


def test_reference_loss_equals_ditbench_loss():
    torch.manual_seed(0)
    x0 = torch.randn(6, 4, 8, 8)
    out = torch.randn(6, 8, 8, 8)
    t = torch.tensor([0, 1, 10, 500, 998, 999])
    noise = torch.randn_like(x0)
    ours = create_diffusion().training_losses(lambda x, t, y: out, x0, t, {"y": None}, noise=noise)
    ref = bench.OfficialHybridLoss().training_losses(lambda x, t, y: out, x0, t, {"y": None}, noise=noise)
    for key in ("loss", "mse", "vb"):
        torch.testing.assert_close(ours[key], ref[key], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("precision,grad_ckpt", [("fp32", "none"), ("bf16", "none"), ("fp32", "full")])
def test_step_equals_the_official_loop(precision, grad_ckpt):
    cell = bench.BenchCell("DiT-T/8", precision, grad_ckpt)
    trainer, reference = bench.build_pair(cell, image_size=64, batch=4)
    with torch.no_grad():  # leave adaLN-Zero's zeros behind, so every weight gets a gradient and moves
        for a, b in zip(trainer.base_model.parameters(), reference.model.parameters(), strict=True):
            if a.requires_grad:
                a.add_(0.05 * torch.randn_like(a))
                b.copy_(a)
    trainer.ema.load_state_dict(trainer.base_model.state_dict())
    reference.ema.load_state_dict(reference.model.state_dict())
    start = [p.detach().clone() for p in reference.model.parameters()]
    g = torch.Generator().manual_seed(3)
    for i in range(3):
        batch = (torch.randn(4, 4, 8, 8, generator=g), torch.randint(0, 1000, (4,), generator=g))
        torch.manual_seed(100 + i)  # the same timesteps, noise and label dropout on both sides
        ours = trainer.step(batch)
        torch.manual_seed(100 + i)
        ref = reference.step(batch)
        torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-6)
    for p0, a, b in zip(start, trainer.base_model.parameters(), reference.model.parameters(), strict=True):
        # The updates themselves agree: lr 1e-4 moves a weight by up to 3e-4 in three steps. Fused AdamW
        # orders its arithmetic differently from the for-loop; where a gradient is near Adam's eps (1e-8)
        # the normalised update is sensitive to its last bits, so a few updates differ by up to ~0.1%.
        torch.testing.assert_close(a - p0, b - p0, rtol=1e-3, atol=1e-6)
    moved = sum(int((a != p0).any()) for p0, a in zip(start, trainer.base_model.parameters(), strict=True))
    assert moved >= sum(p.requires_grad for p in trainer.base_model.parameters()) - 1
    for a, b in zip(trainer.ema.model.parameters(), reference.ema.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_select_names_cells_and_refuses_unknown_ones():
    assert [c.key for c in bench.select("quick")] == ["S8-fp32"]
    assert len(bench.select("all")) == 9
    assert [c.label for c in bench.select("B8-bf16,S4-fp32-ckpt")] == [
        "DiT-B/8 bf16",
        "DiT-S/4 fp32 ckpt=full",
    ]
    with pytest.raises(SystemExit, match="valid: S8-fp32"):
        bench.select("S2-fp32")
