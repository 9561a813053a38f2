"""CPU-sized training-step benchmarks (pytest-benchmark).

    PYTHONPATH=. pytest benchmarks/ --benchmark-autosave

Each benchmark times one full training step (forward, hybrid loss, backward, AdamW, EMA) of a
small configuration in fp32 on the CPU, and records images/s in the saved figures' extra_info.
"""

import pytest
import torch

from ditbench.spec.knobs import Knobs
from ditbench.train.step import Trainer

CASES = [  # model, image size, batch, grad_ckpt, rounds
    ("DiT-T/2", 64, 8, "none", 10),
    ("DiT-T/2", 64, 8, "full", 10),
    ("DiT-S/8", 256, 4, "none", 5),
]


@pytest.mark.parametrize(
    "model,image_size,batch,ckpt,rounds", CASES, ids=[f"{m}-{s}px-bs{b}-{c}" for m, s, b, c, _ in CASES]
)
def test_train_step_cpu_fp32(benchmark, model, image_size, batch, ckpt, rounds):
    torch.set_num_threads(2)
    trainer = Trainer(
        Knobs(model=model, image_size=image_size, batch_size=batch, grad_ckpt=ckpt, precision="fp32"),
        device="cpu",
    )
    batch_data = trainer.next_batch()
    for _ in range(2):  # warm-up: allocator, optimizer state
        trainer.step(batch_data)

    loss = benchmark.pedantic(trainer.step, args=(batch_data,), rounds=rounds, iterations=1, warmup_rounds=1)
    assert torch.isfinite(loss)
    benchmark.extra_info.update(
        params=trainer.num_params,
        batch_size=batch,
        images_per_s=batch / benchmark.stats.stats.median,
    )
