"""Data-parallel cells per rank (plan/parallel.py): DDP's replica and buckets, FSDP2's shards and
buffers, checked by value and against real two-rank runs on this CPU (gloo)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from ditbench.cli import main
from ditbench.plan import parallel
from ditbench.plan.emulation import CPU
from ditbench.plan.trace import Trace

MiB = 1 << 20
XL = {"model": "DiT-XL/2", "image_size": 256, "num_classes": 1000, "gpus": 2, "nodes": 1}


def test_fsdp_shards_every_parameter_by_its_first_dimension_and_gathers_blocks_whole():
    share, block, root = parallel.sizes({**XL, "strategy": "fsdp"})
    # A block: qkv 3D^2+3D, proj D^2+D, fc1 4D^2+4D, fc2 4D^2+D, adaLN 6D^2+6D at D = 1152, in float32.
    assert block == 4 * (18 * 1152**2 + 15 * 1152) == 95_620_608
    assert root == 4 * 675_129_632 - 28 * block == 23_141_504  # embedders, final layer, pos_embed
    assert 0.5 < share < 0.5003  # pos_embed (1, 256, 1152) cannot split its first dimension: padded
    assert parallel._numel((1, 256, 1152), 2) == 256 * 1152 and parallel._numel((1001, 1152), 2) == 501 * 1152
    sizes = parallel.state_bytes({**XL, "strategy": "fsdp"})
    assert sizes["optimizer"] == 2 * sizes["weights"] == 2 * 4 * 675_129_632 * share
    assert parallel.state_bytes({**XL, "strategy": "ddp"})["weights"] == 4 * 675_129_632


def _trace():
    """Weights (1000 B), gradients (30 MiB, live at the end) and an activation in step 2."""
    return Trace(target=CPU, batch_size=4099, sizes=[1000, 30 * MiB, 5 * MiB],
                 events=[1, 2, 3, -3], labels={0: "weights", 1: "gradients"},
                 marks={"build": 0, "step1": 1, "step2": 2, "end": 4})  # fmt: skip


def test_ddp_adds_the_gradient_buckets_from_the_wrapping_on_and_fsdp_its_buffers_to_the_step():
    trace = _trace()
    one = parallel.per_rank(trace, trace.sizes, {**XL, "gpus": 1, "strategy": "ddp"})
    assert (one.events, one.sizes, one.window) == (trace.events, trace.sizes, (2, 4))
    ddp = parallel.per_rank(trace, trace.sizes, {**XL, "strategy": "ddp"})
    assert ddp.sizes[3:] == [MiB, 25 * MiB, 4 * MiB] and ddp.events == [4, 5, 6, 1, 2, 3, -3]
    assert ddp.window == (5, 7) and [ddp.labels[a] for a in (3, 4, 5)] == ["buffers"] * 3
    fsdp = parallel.per_rank(trace, trace.sizes, {**XL, "strategy": "fsdp"})
    share, block, root = parallel.sizes({**XL, "strategy": "fsdp"})
    assert fsdp.sizes == [-(-1000 * share // 1), -(-30 * MiB * share // 1), 5 * MiB, root + 5 * block]
    assert fsdp.events == [1, 2, 4, 3, -3] and fsdp.window == (2, 5)


def test_a_suites_multi_gpu_cells_are_planned_per_rank(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("DITBENCH_CACHE", str(tmp_path / "cache"))
    suite = tmp_path / "multi.yaml"
    suite.write_text(
        "name: multi\ndevice: cpu\ndefaults: {model: DiT-T/4, image_size: 64, batch_size: 4}\n"
        "matrix: {gpus: [1, 2]}\ninclude:\n  - {gpus: 2, strategy: fsdp}\n"
    )
    assert main(["plan", str(suite), "--json"]) == 0
    cells = {
        (c["config"]["gpus"], c["config"]["strategy"]): c
        for c in json.loads(capsys.readouterr().out)["cells"]
    }
    one, ddp, fsdp = cells[(1, "ddp")], cells[(2, "ddp")], cells[(2, "fsdp")]
    assert {c["status"] for c in (one, ddp, fsdp)} == {"predicted"}
    assert ddp["components"]["weights"] == one["components"]["weights"] > fsdp["components"]["weights"]
    assert ddp["components"]["buffers"] > 0 and ddp["peak_allocated_gib"] > one["peak_allocated_gib"]
    code = main(["plan", str(suite), "--shard", "fsdp"])
    assert code == 2 and "`ditbench plan" in capsys.readouterr().err
    assert main(["plan", "--card", "H200", "--shard", "fsdp"]) == 2
    assert "give --gpus N" in capsys.readouterr().err


@pytest.mark.slow  # two gloo ranks per strategy: about a minute on 2 cores
def test_per_rank_sizes_equal_a_real_two_rank_run():
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from plan_vs_fsdp import CELL, measure, predict

    for strategy in ("ddp", "fsdp"):
        cell = {**CELL, "model": "DiT-S/4", "strategy": strategy}
        measured, predicted = measure(cell), predict(cell)
        for part in ("weights", "gradients", "optimizer", "ema"):
            assert predicted[part] == pytest.approx(measured[0][part], rel=0.02), (strategy, part)
        if strategy == "ddp":
            assert predicted["peak"] == pytest.approx(measured[0]["peak"], rel=0.1)
