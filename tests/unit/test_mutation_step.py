"""train/step.py against a training step written out here: timesteps and noise drawn from the seeded
stream, the hybrid loss of a fresh diffusion, torch's own AdamW and the EMA's lerp; the gradient-sync
switches of a wrapped model; the GradScaler's skip count; what a checkpoint's config and a resume carry.
Written for the mutation run (reports/mutation/step.md). DiT-T/8 on 8 x 8 latents: milliseconds a step."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
import torch._dynamo  # noqa: F401 - AdamW imports it on first use (5-10 s of CPU); at collection here
from fixed_rows import Rows as FixedRows
from torch import nn

from ditbench.models.diffusion import create_diffusion
from ditbench.spec.knobs import Knobs
from ditbench.train.step import Trainer

# (torch._dynamo above: mutmut collects once and forks a process per mutant, which would otherwise
# each import it again inside the mutant's time limit)


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny models: a second thread only waits (7x here)


def Rows(batch_size: int) -> FixedRows:
    """16 fixed latents (seed 1), served in order."""
    return FixedRows(batch_size, rows=16, seed=1)


def _knobs(**kw) -> Knobs:
    base = dict(model="DiT-T/8", image_size=64, batch_size=4, num_classes=10)
    return Knobs(**{**base, **kw})


def _perturbed(trainer: Trainer) -> Trainer:
    """adaLN-Zero starts many weights at zero (no gradient for some): move every weight a little."""
    with torch.no_grad():
        g = torch.Generator().manual_seed(5)
        for p in trainer.base_model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    trainer.ema.load_state_dict(trainer.base_model.state_dict())
    return trainer


def test_two_steps_equal_the_written_out_training_step():
    lr, wd, decay = 3e-3, 0.05, 0.9
    trainer = _perturbed(
        Trainer(
            _knobs(lr=lr, weight_decay=wd, ema_decay=decay, optimizer_impl="for-loop"),
            data=Rows(4),
            class_dropout_prob=0.0,
        )
    )
    model = copy.deepcopy(trainer.base_model)
    ema = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=wd, foreach=False)  # the same kernel
    diffusion = create_diffusion()
    for step in (1, 2):
        x, y = trainer.next_batch()
        rng = torch.get_rng_state()
        loss = trainer.step((x, y))
        torch.set_rng_state(rng)
        # The step: t ~ U{0..999}, eps ~ N(0, I), hybrid loss averaged over the batch, AdamW, EMA lerp.
        t = torch.randint(0, 1000, (4,))
        eps = torch.randn(x.shape)
        ref = diffusion.training_losses(model, x, t, {"y": y}, noise=eps)["loss"].mean()
        opt.zero_grad(set_to_none=True)  # the previous step's gradients must not add up
        ref.backward()
        opt.step()
        with torch.no_grad():
            for e, p in zip(ema, model.parameters(), strict=True):
                e.add_((1 - decay) * (p - e))
        assert not loss.requires_grad and loss.shape == ()
        torch.testing.assert_close(loss, ref.detach(), rtol=1e-6, atol=1e-7)
        assert trainer.step_count == step
        for p, q in zip(trainer.base_model.parameters(), model.parameters(), strict=True):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
        for e, q in zip(trainer.ema.model.parameters(), ema, strict=True):
            torch.testing.assert_close(e, q, rtol=1e-5, atol=1e-6)
        assert trainer.optimizer.state_dict()["state"][0]["step"] == step


def test_the_loss_of_accumulated_micro_batches_is_their_weighted_sum():
    trainer = _perturbed(Trainer(_knobs(batch_size=3, grad_accum=2), data=Rows(3), class_dropout_prob=0.0))
    batch = trainer.next_batch()
    assert isinstance(batch, list) and len(batch) == 2 and batch[0][0].shape[0] == 3
    model = copy.deepcopy(trainer.base_model)
    rng = torch.get_rng_state()
    loss = trainer.step(batch)
    torch.set_rng_state(rng)
    t = torch.randint(0, 1000, (6,))  # the whole step's timesteps in one draw, then its noise
    eps = torch.randn(6, 4, 8, 8)
    x = torch.cat([b[0] for b in batch])
    y = torch.cat([b[1] for b in batch])
    ref = create_diffusion().training_losses(model, x, t, {"y": y}, noise=eps)["loss"].mean()
    torch.testing.assert_close(loss, ref.detach(), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="grad_accum 2 needs that many micro-batches, got 3"):
        trainer.step([batch[0]] * 3)


class _Wrapper(nn.Module):
    """A data-parallel stand-in: records in which micro-batches the gradient sync was switched off."""

    def __init__(self, module, kind):
        super().__init__()
        self.module, self.kind, self.log = module, kind, []
        self.syncing = True
        if kind == "ddp":
            self.no_sync = self._no_sync
        elif kind == "fsdp":
            self.set_requires_gradient_sync = self._set

    def forward(self, *args, **kwargs):
        self.log.append(self.syncing)
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def _no_sync(self):
        self.syncing = False
        try:
            yield
        finally:
            self.syncing = True

    def _set(self, on):
        self.syncing = on


@pytest.mark.parametrize("kind", ["ddp", "fsdp"])
def test_only_the_last_micro_batch_synchronises_gradients(kind):
    wrappers = []

    def wrap(m):
        wrappers.append(_Wrapper(m, kind))
        return wrappers[-1]

    trainer = Trainer(_knobs(batch_size=2, grad_accum=3), data=Rows(2), wrap_model=wrap)
    assert trainer.model is wrappers[0] and trainer.base_model is wrappers[0].module
    trainer.step(trainer.next_batch())
    assert wrappers[0].log == [False, False, True] and wrappers[0].syncing
    trainer.step(trainer.next_batch())
    assert wrappers[0].log[3:] == [False, False, True]


def test_a_wrapper_without_a_sync_switch_and_a_single_batch_always_sync():
    wrappers = []
    trainer = Trainer(
        _knobs(batch_size=2, grad_accum=2),
        data=Rows(2),
        wrap_model=lambda m: wrappers.append(_Wrapper(m, "plain")) or wrappers[-1],
    )
    trainer.step(trainer.next_batch())
    assert wrappers[0].log == [True, True]
    single = []
    one = Trainer(
        _knobs(batch_size=2),
        data=Rows(2),
        wrap_model=lambda m: single.append(_Wrapper(m, "ddp")) or single[-1],
    )
    one.step(one.next_batch())
    assert single[0].log == [True]


def test_grad_scaler_skips_are_counted_on_the_device():
    trainer = _perturbed(Trainer(_knobs(), data=Rows(4)))
    assert trainer.scaler is None and trainer.scaler_skips == 0  # fp32: no scaler
    # The fp16 policy is CUDA only; a CPU GradScaler exercises the same bookkeeping.
    trainer.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    trainer._skips = torch.zeros((), dtype=torch.long)
    before = [p.detach().clone() for p in trainer.base_model.parameters()]
    trainer.step(trainer.next_batch())
    assert trainer.scaler_skips == 0 and trainer.scaler.get_scale() == 2.0**10
    assert any(not torch.equal(p, q) for p, q in zip(trainer.base_model.parameters(), before, strict=True))
    # An inf weight makes inf gradients: the scaler skips the update and halves its scale.
    with torch.no_grad():
        trainer.base_model.final_layer.linear.bias[0] = float("inf")
    trainer.step(trainer.next_batch())
    trainer.step(trainer.next_batch())
    assert trainer.scaler_skips == 2 and trainer.scaler.get_scale() == 2.0**8
    assert trainer.step_count == 3


def test_config_and_resume_carry_what_the_process_was_given(tmp_path):
    data = Rows(4)
    trainer = Trainer(
        _knobs(seed=3), device="cpu", data_seed=11, data_workers=0, class_dropout_prob=0.25, data=data
    )
    config = trainer.config()
    assert {k: config[k] for k in ("device", "data_seed", "data_workers", "class_dropout_prob")} == {
        "device": "cpu",
        "data_seed": 11,
        "data_workers": 0,
        "class_dropout_prob": 0.25,
    }
    assert config["seed"] == 3 and config["model"] == "DiT-T/8"
    assert trainer.base_model.y_embedder.dropout_prob == 0.25
    assert trainer.data is data
    trainer.step(trainer.next_batch())
    state = trainer.state_dict()
    assert set(state) == {"model", "ema", "opt", "step", "config"} and state["step"] == 1
    other = Trainer(_knobs(seed=4), data=Rows(4))
    other.load_state_dict({"model": state["model"], "ema": state["ema"]})  # no optimizer, no step: 0
    assert other.step_count == 0 and other.optimizer.state_dict()["state"] == {}
    for p, q in zip(other.base_model.parameters(), trainer.base_model.parameters(), strict=True):
        assert torch.equal(p, q)
    other.load_state_dict(state)
    assert other.step_count == 1 and len(other.optimizer.state_dict()["state"]) > 0


def test_a_trainer_given_nothing_records_its_defaults():
    """What a checkpoint's config says when the caller passed nothing: this process on the CPU, the
    knobs' seed for the data, no loader processes, DiT's label dropout 0.1 (in the model too)."""
    trainer = Trainer(_knobs(), data=Rows(4))
    config = trainer.config()
    assert {k: config[k] for k in ("device", "data_seed", "data_workers", "class_dropout_prob")} == {
        "device": "cpu",
        "data_seed": None,
        "data_workers": 0,
        "class_dropout_prob": 0.1,
    }
    assert trainer.device == torch.device("cpu") and trainer.base_model.y_embedder.dropout_prob == 0.1


def test_the_data_seed_defaults_to_the_knobs_seed():
    def first(**kw):
        return Trainer(_knobs(data="synthetic", seed=kw.pop("seed")), **kw).next_batch()

    a, b, c = first(seed=3), first(seed=5, data_seed=3), first(seed=5)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])


def test_the_steps_draws_follow_the_batch_not_torchs_defaults():
    """t and eps are made on the batch's device in its dtype (on a GPU a CPU default would fail or
    copy each step): with torch's default device set to `meta` and its default dtype to float64 for
    the step, the loss and the weights are those of a step under the usual defaults."""
    runs = []
    for odd_defaults in (False, True):
        trainer = _perturbed(Trainer(_knobs(), data=Rows(4), class_dropout_prob=0.0))
        batch = trainer.next_batch()
        torch.manual_seed(3)
        if odd_defaults:
            dtype = torch.get_default_dtype()
            torch.set_default_dtype(torch.float64)
            try:
                with torch.device("meta"):
                    loss = trainer.step(batch)
            finally:
                torch.set_default_dtype(dtype)
        else:
            loss = trainer.step(batch)
        assert loss.device.type == "cpu" and loss.dtype == torch.float32
        runs.append((loss, [p.detach().clone() for p in trainer.base_model.parameters()]))
    (loss, weights), (odd_loss, odd_weights) = runs
    assert torch.equal(odd_loss, loss)
    assert all(torch.equal(a, b) for a, b in zip(odd_weights, weights, strict=True))


@pytest.mark.parametrize("order,held", [("before_forward", False), ("after_forward", True)])
def test_zero_grad_order_decides_whether_the_last_gradients_live_through_the_forward(order, held):
    """before_forward frees the previous step's gradients before the first forward; after_forward (the
    official train.py's order) frees them after it: seen from the model's forward, at each step after
    the first, and for the first micro-batch only (the later ones accumulate, so gradients exist)."""
    trainer = Trainer(_knobs(zero_grad=order, grad_accum=2, batch_size=2), data=Rows(2))
    seen = []
    trainer.base_model.register_forward_pre_hook(
        lambda module, args: seen.append(any(p.grad is not None for p in module.parameters()))
    )
    grads = []
    for _ in range(3):
        trainer.step(trainer.next_batch())
        grads.append([p.grad for p in trainer.base_model.parameters() if p.grad is not None])
    # step 1: no gradients yet, then micro-batch 1's; steps 2 and 3: the previous step's (or none), then
    # micro-batch 1's
    assert seen == [False, True, held, True, held, True]
    # freed (set to None), not zeroed in place: each step's gradients are new tensors
    assert len(grads[1]) > 20 and not any(a is b for a, b in zip(grads[1], grads[2], strict=True))


def test_a_grad_scaler_step_computes_the_unscaled_step():
    """With a GradScaler the loss is scaled before backward and the gradients unscaled before AdamW:
    the gradients and weights after the step are those of the step without one (fp32 rounding)."""
    runs = []
    for scaled in (False, True):
        trainer = _perturbed(Trainer(_knobs(), data=Rows(4)))
        if scaled:  # the fp16 policy is CUDA only; a CPU GradScaler runs the same code
            trainer.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
            trainer._skips = torch.zeros((), dtype=torch.long)
        torch.manual_seed(4)
        trainer.step(trainer.next_batch())
        params = list(trainer.base_model.parameters())
        runs.append(
            ([p.grad.clone() for p in params if p.grad is not None], [p.detach().clone() for p in params])
        )
    (grads, weights), (scaled_grads, scaled_weights) = runs
    assert len(grads) == len(scaled_grads) > 20
    for a, b in zip(scaled_grads, grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-9)
    for a, b in zip(scaled_weights, weights, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("precision,dtype", [("fp32", torch.float32), ("bf16", torch.bfloat16)])
def test_the_attention_kernel_is_probed_with_the_models_shapes(monkeypatch, precision, dtype):
    """The kernel probe gets the model's attention inputs: DiT-T/2 (hidden 64, 4 heads) at 64 px is a
    8 x 8 latent in 2 x 2 patches, so 16 tokens of 4 heads x 16; the autocast dtype, or fp32 without."""
    import ditbench.train.step as step_module

    calls = []
    real = step_module.resolve_kernel

    def probe(*args):
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(step_module, "resolve_kernel", probe)
    trainer = Trainer(_knobs(model="DiT-T/2", attention="sdpa", precision=precision), data=Rows(4))
    assert calls == [("sdpa", torch.device("cpu"), dtype, 4, 16, 16)]
    assert trainer.attention_kernel == real("sdpa", "cpu", dtype, 4, 16, 16)


def test_a_policy_with_a_scaler_gets_a_skip_counter_on_the_device(monkeypatch):
    """fp16's policy (CUDA only) has a GradScaler; one on the CPU stands in: the constructor makes the
    scaler and a long 0-d skip counter on the device, and the steps count into it."""
    import dataclasses

    import ditbench.train.step as step_module

    real = step_module.get_precision_policy
    monkeypatch.setattr(
        step_module, "get_precision_policy", lambda *a: dataclasses.replace(real(*a), use_scaler=True)
    )
    trainer = _perturbed(Trainer(_knobs(), data=Rows(4)))
    assert isinstance(trainer.scaler, torch.amp.GradScaler)
    assert (
        trainer._skips.shape == ()
        and trainer._skips.dtype == torch.long
        and trainer._skips.device.type == "cpu"
    )
    trainer.step(trainer.next_batch())
    assert trainer.scaler_skips == 0
    with torch.no_grad():
        trainer.base_model.final_layer.linear.bias[0] = float("inf")
    trainer.step(trainer.next_batch())
    assert trainer.scaler_skips == 1


@pytest.mark.parametrize("mode,passed", [("default", None), ("max-autotune", "max-autotune")])
def test_compile_wraps_the_model_with_the_mode_asked(monkeypatch, mode, passed):
    """`compile: true` hands the (wrapped) model to torch.compile with the knob's mode, `default` as
    torch's own default (None); the bare DiT stays `base_model`. torch.compile is stood in (seconds)."""
    calls = []

    def compile_(model, mode=None):
        calls.append((model, mode))
        return "compiled"

    monkeypatch.setattr(torch, "compile", compile_)
    trainer = Trainer(_knobs(compile=True, compile_mode=mode), data=Rows(4))
    assert calls == [(trainer.base_model, passed)] and trainer.model == "compiled"
    assert Trainer(_knobs(), data=Rows(4)).model is not None and len(calls) == 1  # no compile: no call


def test_the_model_is_built_from_the_knobs():
    """The DiT has the knobs' classes (10, and the null class for label dropout: 11 embeddings) and
    num_params counts its parameters (DiT-T/8 at 64 px: 378,176)."""
    trainer = Trainer(_knobs(num_classes=10), data=Rows(4))
    model = trainer.base_model
    assert model.num_classes == 10 and model.y_embedder.embedding_table.num_embeddings == 11
    assert trainer.num_params == sum(p.numel() for p in model.parameters()) == 378_176
