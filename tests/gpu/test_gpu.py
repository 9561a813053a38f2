"""CUDA-only checks (skipped where no GPU is visible): every precision policy, fused AdamW,
checkpointing memory measured by the CUDA allocator."""

import pytest
import torch

from ditbench.spec.knobs import Knobs
from ditbench.train.step import Trainer

pytestmark = pytest.mark.gpu


def cfg(**kw):
    base = dict(model="DiT-S/8", image_size=256, batch_size=8)
    base.update(kw)
    return Knobs(**base)


@pytest.mark.parametrize("precision", ["fp32", "tf32", "fp16", "bf16"])
def test_every_precision_steps_on_cuda(precision):
    trainer = Trainer(cfg(precision=precision), device="cuda")
    losses = torch.stack([trainer.step(trainer.next_batch()) for _ in range(3)])
    assert torch.isfinite(losses).all()
    assert trainer.optimizer.ditbench_impl == "fused"
    if precision == "fp16":
        assert trainer.scaler is not None and 0 <= trainer.scaler_skips <= 3
    tf32 = torch.backends.cuda.matmul.fp32_precision == "tf32"
    assert tf32 == (precision != "fp32")


def _peak(mode):
    torch.cuda.empty_cache()
    trainer = Trainer(cfg(model="DiT-B/4", batch_size=32, precision="bf16", grad_ckpt=mode), device="cuda")
    trainer.step(trainer.next_batch())
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    trainer.step(trainer.next_batch())
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    del trainer
    return peak


def test_grad_ckpt_lowers_cuda_peak_memory():
    none, every2, full = _peak("none"), _peak("every_2"), _peak("full")
    assert full < every2 < none
