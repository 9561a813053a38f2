"""ditbench's step against the official train.py loop (pytest-benchmark wrapper of bench_vs_official.py).

    PYTHONPATH=. pytest benchmarks/test_bench_vs_official.py --benchmark-autosave

Times ditbench's DiT-S/8 fp32 step (128 px, batch 8) and records, in extra_info, the ratio to the
reference recipe measured in alternating rounds in the same process (CPU clock, one torch thread):
the figure reports/speed_cpu.md tabulates for every cell. Nothing here asserts a speed.
"""

import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_vs_official as bvo  # noqa: E402


def test_step_vs_official_s8_fp32(benchmark):
    torch.set_num_threads(1)
    (cell,) = bvo.select("quick")
    row = bvo.measure_cell(cell, rounds=3, steps=2, warmup=2, clock="cpu")
    trainer, _ = bvo.build_pair(cell)
    batch = trainer.next_batch()
    trainer.step(batch)
    loss = benchmark.pedantic(trainer.step, args=(batch,), rounds=3, iterations=1, warmup_rounds=1)
    assert torch.isfinite(loss)
    assert math.isfinite(row["ratio"]) and row["ratio"] > 0
    benchmark.extra_info.update(
        {k: row[k] for k in ("cell", "reference_ms", "ditbench_ms", "ratio", "ratio_min", "ratio_max")}
    )
