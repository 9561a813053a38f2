"""The traced step: what it records, that its shortcuts are exact, and that it follows the model."""

from __future__ import annotations

import pytest
import torch

from ditbench.plan.emulation import CPU, cuda_target
from ditbench.plan.trace import probe_batch, trace_series, trace_training
from ditbench.spec.knobs import Knobs

GPU = cuda_target("H200")
TINY = {"model": "DiT-T/2", "image_size": 64, "optimizer_impl": "fused"}


def canonical(events: list[int]) -> list[int]:
    """Releases that happen together (no allocation between) in a fixed order: their order cannot matter."""
    out, run = [], []
    for e in events:
        if e < 0:
            run.append(e)
        else:
            out += sorted(run) + [e]
            run = []
    return out + sorted(run)


@pytest.mark.parametrize(
    "kwargs, target",
    [
        ({**TINY, "precision": "fp16"}, GPU),
        ({**TINY, "precision": "bf16", "grad_ckpt": "every_2"}, GPU),
        ({**TINY, "precision": "bf16", "grad_ckpt": "full", "optimizer_impl": "foreach"}, CPU),
    ],
)
def test_memoized_dispatch_records_what_the_fake_mode_records(kwargs, target):
    plain = trace_training(Knobs(**kwargs), target, 3, memo=False)
    fast = trace_training(Knobs(**kwargs), target, 3, memo=True)
    assert fast.sizes == plain.sizes
    assert canonical(fast.events) == canonical(plain.events)
    assert (fast.labels, fast.marks, fast.modeled) == (plain.labels, plain.marks, plain.modeled)


@pytest.mark.parametrize("precision, ckpt", [("fp16", "none"), ("bf16", "every_2"), ("fp32", "full")])
def test_one_trace_gives_every_batch_size_exactly(precision, ckpt):
    kwargs = {**TINY, "precision": precision, "grad_ckpt": ckpt}
    series = trace_series(Knobs(**kwargs), GPU)
    assert series.probe == probe_batch(Knobs(**kwargs)) and series.probe > 4096
    for batch in (2, 3, 8):
        direct = trace_training(Knobs(**kwargs), GPU, batch)
        assert series.sizes(batch) == [
            s if aid not in direct.modeled else series.sizes(batch)[aid] for aid, s in enumerate(direct.sizes)
        ]
        assert canonical(series.trace.events) == canonical(direct.events)


def test_state_is_labelled_with_its_owner():
    from ditbench.models.build import build_model

    trace = trace_training(Knobs(**{**TINY, "precision": "bf16"}), GPU, 4)
    params = trace.params
    with torch.device("meta"):
        model = build_model("DiT-T/2", image_size=64)
    trainable = [p.numel() for p in model.parameters() if p.requires_grad]  # not the frozen pos_embed
    end = trace.marks["end"]
    live = set()
    for e in trace.events[:end]:
        live.add(e - 1) if e > 0 else live.discard(-e - 1)
    by_label: dict[str, int] = {}
    for aid in live:
        label = trace.labels.get(aid, "activations")
        by_label[label] = by_label.get(label, 0) + trace.sizes[aid]
    assert by_label["weights"] == 4 * params  # fp32 weights in every policy
    assert by_label["ema"] == 4 * params  # of every parameter, frozen or not
    assert by_label["gradients"] == 4 * sum(trainable)
    # Adam's two moments, plus fused AdamW's one step counter (a 0-d float32) per trainable tensor
    assert by_label["optimizer"] == 8 * sum(trainable) + 4 * len(trainable)
    assert sum(1 for m in trace.modeled.values() if m[0] == "cublas") == 2  # caller's and autograd's thread


def test_cpu_trace_has_no_gpu_workspaces_and_auto_is_the_trainers_kernel():
    from ditbench.plan.emulation import optimizer_impl
    from ditbench.train.optim import AUTO_IMPL

    assert optimizer_impl("auto", CPU) == AUTO_IMPL["cpu"] and optimizer_impl("auto", GPU) == "fused"
    trace = trace_training(Knobs(**{**TINY, "precision": "fp32", "optimizer_impl": "foreach"}), CPU, 4)
    assert not trace.modeled


def _peak(config: dict, **kw) -> float:
    from ditbench.plan import predict_cell

    return predict_cell(config, **kw).peak_allocated_gib


def test_a_change_to_the_model_changes_the_prediction(monkeypatch):
    """An Mlp that keeps one more activation per block: the prediction grows by at least that much."""
    from ditbench.models import dit
    from ditbench.plan import predict
    from ditbench.plan.memo import _ENTRIES

    config = {"model": "DiT-T/2", "image_size": 64, "precision": "fp32", "batch_size": 16}
    before = _peak(config)
    original = dit.Mlp.forward

    def heavier(self, x):
        y = original(self, x)
        return y * torch.ones_like(y)  # autograd keeps the ones for the backward pass

    monkeypatch.setattr(dit.Mlp, "forward", heavier)
    monkeypatch.setattr(predict, "_CACHE", type(predict._CACHE)())
    _ENTRIES.clear()
    after = _peak(config)
    tokens, width, depth = (64 // 8 // 2) ** 2, 64, 4
    assert (after - before) * 2**30 >= depth * 16 * tokens * width * 4


def test_checkpointing_orders_the_predictions():
    config = {"model": "DiT-T/2", "image_size": 128, "precision": "bf16", "batch_size": 32}
    none, every2, full = (_peak({**config, "grad_ckpt": c}) for c in ("none", "every_2", "full"))
    assert full < every2 < none


def test_cuda_autocast_rules_on_the_cpu():
    """Ops CUDA autocast runs in fp32 do so in the trace; CPU autocast is itself again afterwards."""
    from ditbench.plan.emulation import cuda_autocast

    x = torch.randn(4, 8, dtype=torch.bfloat16)
    with cuda_autocast(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.nn.functional.layer_norm(x, (8,)).dtype == torch.float32
        assert torch.softmax(x, dim=-1).dtype == torch.float32
        assert x.sum().dtype == torch.float32 and x.exp().dtype == torch.float32
        assert torch.nn.functional.linear(x.float(), torch.randn(3, 8)).dtype == torch.bfloat16
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.nn.functional.layer_norm(x, (8,)).dtype == torch.bfloat16


def test_diffusers_step_needs_the_cuda_rules_and_gets_them(monkeypatch):
    """diffusers' DiT normalises bf16 activations: without CUDA's rule the trace says so."""
    import contextlib

    kwargs = {**TINY, "precision": "bf16", "impl": "diffusers"}
    assert trace_training(Knobs(**kwargs), GPU, 2).notes == []
    monkeypatch.setattr("ditbench.plan.trace.cuda_autocast", contextlib.nullcontext)
    notes = trace_training(Knobs(**kwargs), GPU, 2).notes
    assert any("native_layer_norm" in n and "float32" in n for n in notes)


@pytest.mark.slow  # dynamo compiles the model: ~12 s of CPU
def test_a_compiled_step_is_traced_through_its_graphs():
    """torch.compile: dynamo compiles (no dispatch mode in its way) and the graphs' ops are recorded."""
    from ditbench.plan import emulation as compiled

    calls = []
    original = compiled._recorded

    def spy(fn):
        calls.append(fn)
        return original(fn)

    kwargs = {**TINY, "precision": "bf16"}
    eager = trace_training(Knobs(**kwargs), GPU, 8)
    import unittest.mock as mock

    with mock.patch.object(compiled, "_recorded", spy):
        traced = trace_training(Knobs(**{**kwargs, "compile": True}), GPU, 8)
    assert len(calls) >= 2  # a forward and a backward graph
    assert traced.notes == []
    labels = {
        label: sum(traced.sizes[a] for a, lab in traced.labels.items() if lab == label)
        for label in ("weights",)
    }
    assert labels["weights"] == 4 * traced.params
    window = lambda t: sum(t.sizes[e - 1] for e in t.events[t.marks["step2"] : t.marks["end"]] if e > 0)  # noqa: E731
    assert window(traced) > 0.5 * window(eager)  # the step's allocations are there, not only the state


def test_a_step_the_fake_tensors_cannot_follow_is_an_error_not_a_crash(monkeypatch):
    from ditbench.models import dit
    from ditbench.plan import predict, predict_cell

    original = dit.Mlp.forward

    def data_dependent(self, x):
        y = original(self, x)
        return y[y > 0].sum() + y  # a shape that depends on values

    monkeypatch.setattr(dit.Mlp, "forward", data_dependent)
    monkeypatch.setattr(predict, "_CACHE", type(predict._CACHE)())
    p = predict_cell({"model": "DiT-T/4", "image_size": 64, "batch_size": 2}, "L4")
    assert p.status == "error" and p.fits is None
    assert p.reason.startswith("the planner could not trace this cell") and "nonzero" in p.reason


def test_the_planner_follows_the_zero_grad_order():
    """The official order holds the last step's gradients through the forward: a higher peak, by at
    most the gradients (the planner traces the Trainer's step, so the knob needs no planner code)."""
    from ditbench.plan import predict_cell

    cell = {"model": "DiT-T/2", "image_size": 64, "batch_size": 8, "device": "cpu"}
    early = predict_cell({**cell, "zero_grad": "before_forward"})
    late = predict_cell({**cell, "zero_grad": "after_forward"})
    grads = early.components["weights"]  # fp32 gradients are the size of the fp32 weights
    assert early.peak_allocated_gib < late.peak_allocated_gib <= early.peak_allocated_gib + grads * 1.001
    assert late.components["gradients"] > early.components["gradients"]
