"""grad_accum: K micro-batches of B per optimizer step are one step on a batch of K*B."""

import os
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from fixed_rows import Rows

from ditbench.bench.cell.core import window_metrics
from ditbench.core.errors import UserError
from ditbench.hardware.dist import DistContext
from ditbench.spec.cell import CellSpec
from ditbench.spec.knobs import Knobs
from ditbench.train.step import Trainer

REPO = Path(__file__).resolve().parents[2]


def _trainer(batch, accum, **kw):
    cfg = Knobs(model="DiT-T/8", image_size=64, batch_size=batch, grad_accum=accum, num_classes=10, **kw)
    trainer = Trainer(cfg, data=Rows(batch))
    with torch.no_grad():  # leave adaLN-Zero's zeros behind, so every weight gets a gradient
        g = torch.Generator().manual_seed(5)
        for p in trainer.base_model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    trainer.ema.load_state_dict(trainer.base_model.state_dict())
    return trainer


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_k_micro_batches_update_like_one_batch_of_k_times_b(precision):
    # The step draws the whole step's timesteps and noise at once, and label dropout is drawn per
    # sample in order, so both runs see the same samples, timesteps, noise and dropped labels:
    # the comparison is exact up to the order of float sums, not only equal in expectation.
    runs = {}
    for batch, accum in ((6, 1), (2, 3), (3, 2)):
        trainer = _trainer(batch, accum, precision=precision)
        start = [p.detach().clone() for p in trainer.base_model.parameters()]
        batches = [trainer.next_batch() for _ in range(3)]
        assert isinstance(batches[0], list if accum > 1 else tuple)
        losses = [trainer.step(batches[0])]
        grads = [p.grad.clone() for p in trainer.base_model.parameters() if p.grad is not None]
        losses += [trainer.step(b) for b in batches[1:]]
        moved = [p.detach() - p0 for p, p0 in zip(trainer.base_model.parameters(), start, strict=True)]
        runs[(batch, accum)] = (torch.stack(losses), grads, moved)
        assert trainer.step_count == 3
    tol = {"fp32": 1e-5, "bf16": 2e-2}[precision]
    ref_losses, ref_grads, ref_moved = runs[(6, 1)]
    for key in ((2, 3), (3, 2)):
        losses, grads, moved = runs[key]
        torch.testing.assert_close(losses, ref_losses, rtol=tol, atol=tol / 10)
        assert len(grads) == len(ref_grads) > 20
        for a, b in zip(grads, ref_grads, strict=True):  # the accumulated gradient is the big batch's
            assert (a - b).abs().max() <= tol * b.abs().max() + 1e-9
        # Three AdamW steps (lr 1e-4) move a weight by up to 3e-4. Adam normalises each gradient, so
        # where one is near zero the last bits of the sums show: in fp32 a few updates differ by ~1%;
        # in bf16 (8 mantissa bits) a few near-zero gradients change sign, so compare the whole update.
        for a, b in zip(moved, ref_moved, strict=True):
            if precision == "fp32":
                torch.testing.assert_close(a, b, rtol=0.02, atol=3e-6)
            else:
                assert (a - b).abs().mean() <= 0.02 * b.abs().mean() + 1e-9


def test_a_step_needs_its_k_micro_batches():
    trainer = _trainer(2, 2)
    with pytest.raises(ValueError, match="grad_accum 2 needs that many micro-batches, got 1"):
        trainer.step(trainer.data.next_batch())


def test_grad_accum_and_compile_mode_are_checked():
    with pytest.raises(UserError, match="grad_accum must be an integer from 1"):
        Knobs(**{"model": "DiT-T/8", "grad_accum": 0})
    with pytest.raises(
        UserError, match="compile_mode max-autotune-no-cudagraphs shapes a compiled model only"
    ):
        Knobs(**{"model": "DiT-T/8", "compile_mode": "max-autotune-no-cudagraphs"})
    with pytest.raises(UserError, match="unknown compile_mode"):
        Knobs(**{"model": "DiT-T/8", "compile": True, "compile_mode": "fast"})
    ok = Knobs(**{"model": "DiT-T/8", "compile": True, "compile_mode": "max-autotune-no-cudagraphs"})
    assert ok.non_defaults() == {
        "model": "DiT-T/8",
        "compile": True,
        "compile_mode": "max-autotune-no-cudagraphs",
    }


def test_the_record_states_the_global_batch_and_counts_every_micro_batch_image():
    knobs = Knobs(**{"model": "DiT-T/8", "batch_size": 4, "grad_accum": 3, "gpus": 2})
    spec = CellSpec(knobs, "cpu")
    config = spec.model_dump(mode="json")
    assert config["global_batch"] == 4 * 2 * 3 and config["grad_accum"] == 3
    assert CellSpec.read(config, "config") == spec
    with pytest.raises(UserError, match="x grad_accum"):
        CellSpec.read({**config, "global_batch": 8}, "config")
    window = {"steps": 10, "wall_s": 5.0, "step_ms": [500.0] * 10, "last_loss": 1.0}
    m = window_metrics(spec, window, DistContext(), None)  # one rank's share: 2 steps/s x 4 x 3
    assert m["steps_per_s"] == 2.0 and m["images_per_s"] == 24.0 and not m["noisy"]


# --------------------------------------------------------------------------------------------
# Two processes (torchrun + gloo): DDP skips the all-reduce on all but the last micro-batch

RANKS_SCRIPT = textwrap.dedent("""
    import sys
    import torch
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from ditbench.hardware import dist
    from ditbench.bench.cell import core as cell_core
    from ditbench.spec.cell import CellSpec, Steps
    from ditbench.spec.knobs import Knobs
    from ditbench.train.step import Trainer
    from fixed_rows import Rows

    def run(ctx, strategy, batch, accum):
        cfg = Knobs(model="DiT-T/8", image_size=64, batch_size=batch, grad_accum=accum, num_classes=10)
        data = Rows(batch)
        data.at = 100 * ctx.rank  # each rank its own rows
        trainer = Trainer(cfg, wrap_model=lambda m: dist.wrap_model(m, strategy, ctx), data=data)
        with torch.no_grad():  # leave adaLN-Zero's zeros behind (the same on both ranks)
            g = torch.Generator().manual_seed(5)
            for p in trainer.base_model.parameters():
                full = p.full_tensor() if hasattr(p, "full_tensor") else p
                noise = 0.05 * torch.randn(full.shape, generator=g)
                if hasattr(p, "full_tensor"):
                    from torch.distributed.tensor import distribute_tensor
                    noise = distribute_tensor(noise, p.device_mesh, p.placements)
                p.add_(noise)
        calls = []
        if strategy == "ddp":
            def counting(state, bucket):
                calls.append(1)
                return allreduce_hook(state, bucket)
            trainer._wrapped.register_comm_hook(None, counting)
        losses = [float(trainer.step(trainer.next_batch())) for _ in range(2)]
        full = lambda t: t.full_tensor() if hasattr(t, "full_tensor") else t
        params = [full(p.detach()).clone() for p in trainer.base_model.parameters()]
        return {"losses": losses, "params": params, "allreduce_calls": len(calls)}

    if __name__ == "__main__":
        ctx = dist.init("cpu")
        out = {s + f"_{b}x{k}": run(ctx, s, b, k) for s in ("ddp", "fsdp") for b, k in ((4, 1), (2, 2))}
        # A multi-process cell measured the way the runner's ranks measure it.
        knobs = Knobs(model="DiT-T/8", image_size=64, batch_size=2, grad_accum=2, gpus=2, num_classes=10)
        spec = CellSpec(knobs, "cpu", Steps(warmup=1, measure=2, min_seconds=0.0))
        result = cell_core.measure(spec, "DiT-T/8 grad_accum=2 gpus=2", lambda: ctx).result
        out["cell"] = {"status": result["status"], "reason": result["reason"], "metrics": result["metrics"]}
        if ctx.is_main:
            torch.save(out, sys.argv[1])
        dist.barrier(ctx)
        dist.shutdown()
""")


@pytest.mark.slow
def test_two_ranks_accumulate_without_all_reducing_each_micro_batch(tmp_path):
    from ditbench.bench.launch import torchrun

    script = tmp_path / "ranks.py"
    script.write_text(RANKS_SCRIPT)
    out = tmp_path / "ranks.pt"
    env = dict(os.environ)
    here = str(REPO / "tests" / "support")  # the ranks import fixed_rows.Rows
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), here, env.get("PYTHONPATH", "")])
    env.pop("DITBENCH_INJECT_FAULT", None)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        str(script),
        str(out),
    ]
    res = torchrun.launch(cmd, tmp_path / "launch", timeout_s=300, env=env)
    assert res.returncode == 0, res.output_tail
    got = torch.load(out, weights_only=True)
    for strategy in ("ddp", "fsdp"):
        big, accum = got[f"{strategy}_4x1"], got[f"{strategy}_2x2"]
        assert accum["losses"] == pytest.approx(big["losses"], rel=1e-5)
        for a, b in zip(accum["params"], big["params"], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=3e-6)
    # DDP all-reduces each gradient bucket once per optimizer step, not once per micro-batch.
    assert got["ddp_2x2"]["allreduce_calls"] == got["ddp_4x1"]["allreduce_calls"] > 0
    cell = got["cell"]
    assert cell["status"] == "ok", cell["reason"]
    m = cell["metrics"]  # one rank's share: 2 images x 2 micro-batches a step
    assert m["images_per_s"] == pytest.approx(4 * m["steps_per_s"]) and m["world_size"] == 2


@pytest.mark.slow
def test_a_two_process_cell_records_the_global_batch_of_every_micro_batch(tmp_path):
    from ditbench.bench.runner import RunOptions, run_suite
    from ditbench.spec.suite import load_suite

    path = tmp_path / "accum.yaml"
    path.write_text(
        "name: accum\ndevice: cpu\n"
        "defaults: {image_size: 64, batch_size: 2, num_classes: 10, timeout_s: 300,\n"
        "           steps: {warmup: 1, measure: 2, min_seconds: 0}}\n"
        "matrix: {model: [DiT-T/8], gpus: [2], grad_accum: [3]}\n"
    )
    (record,) = run_suite(load_suite(str(path)), RunOptions(out=tmp_path / "out", progress=False), echo=print)
    assert record["status"] == "ok", record["reason"]
    m = record["metrics"]
    assert record["config"]["global_batch"] == m["global_batch"] == 2 * 2 * 3
    assert m["images_per_s"] == pytest.approx(sum(r["images_per_s"] for r in m["per_rank"]))
    assert m["per_rank"][0]["images_per_s"] == pytest.approx(6 * m["per_rank"][0]["steps_per_s"])
    assert "grad_accum=3" in record["cell_name"]
