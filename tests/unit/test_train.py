import os
import subprocess
import sys

import pytest
import torch

from ditbench.core.errors import UnsupportedError, UserError
from ditbench.hardware.precision import get_precision_policy
from ditbench.spec.knobs import Knobs
from ditbench.train.data import DataSource
from ditbench.train.optim import EMA, make_optimizer
from ditbench.train.step import Trainer


def tiny_cfg(**kw):
    base = dict(model="DiT-T/8", image_size=64, batch_size=4)
    base.update(kw)
    return Knobs(**base)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_steps_run_on_cpu(precision):
    trainer = Trainer(tiny_cfg(precision=precision))
    before = [p.detach().clone() for p in trainer.base_model.parameters()]
    losses = [trainer.step(trainer.next_batch()) for _ in range(3)]
    assert all(loss.ndim == 0 and not loss.requires_grad and torch.isfinite(loss) for loss in losses)
    after = list(trainer.base_model.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))
    assert trainer.step_count == 3 and trainer.scaler_skips == 0
    assert all(p.dtype == torch.float32 for p in trainer.base_model.parameters())


@pytest.mark.parametrize(
    "precision,reason", [("tf32", "mode of CUDA devices"), ("fp16", "needs a CUDA device")]
)
def test_cuda_only_precisions_are_unsupported_on_cpu(precision, reason):
    with pytest.raises(UnsupportedError, match=reason):
        Trainer(tiny_cfg(precision=precision))


def test_unknown_precision_lists_valid():
    with pytest.raises(UserError, match="fp32, tf32, fp16, bf16"):
        get_precision_policy("fp8")


def test_bf16_autocasts_the_model():
    policy = get_precision_policy("bf16", "cpu")
    with policy.autocast():
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
    assert get_precision_policy("fp32", "cpu").autocast_dtype is None


def test_same_seed_same_losses():
    def run(seed):
        trainer = Trainer(tiny_cfg(seed=seed))
        return [trainer.step(trainer.next_batch()).item() for _ in range(4)]

    a, b, c = run(0), run(0), run(1)
    assert a == b
    assert a != c


def test_num_params_counts_pos_embed():
    trainer = Trainer(tiny_cfg())
    total = sum(p.numel() for p in trainer.base_model.parameters())
    assert trainer.num_params == total
    assert trainer.num_params > sum(p.numel() for p in trainer.base_model.parameters() if p.requires_grad)


def test_optimizer_is_fused_adamw_on_cpu():
    trainer = Trainer(tiny_cfg())
    opt = trainer.optimizer
    assert isinstance(opt, torch.optim.AdamW)
    group = opt.param_groups[0]
    assert group["lr"] == 1e-4 and group["weight_decay"] == 0.0 and group["fused"] is True
    assert opt.ditbench_impl == "fused"


def test_every_adamw_kernel_makes_the_same_update():
    """fused, foreach and the for-loop (torch's CPU default, the official loop's) agree to float rounding."""
    results = {}
    for impl in ("fused", "foreach", "for-loop"):
        torch.manual_seed(0)
        model = torch.nn.Linear(64, 32)
        opt = make_optimizer(model, lr=1e-3, weight_decay=0.01, impl=impl, device="cpu")
        for i in range(3):
            g = torch.Generator().manual_seed(i)
            for p in model.parameters():
                p.grad = torch.randn(p.shape, generator=g)
            opt.step()
        results[impl] = [p.detach().clone() for p in model.parameters()]
        assert opt.ditbench_impl == impl
    for impl in ("foreach", "for-loop"):
        for a, b in zip(results["fused"], results[impl], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_ema_update_is_a_lerp_including_pos_embed():
    model = torch.nn.Linear(3, 2)
    model.register_parameter("frozen", torch.nn.Parameter(torch.zeros(2), requires_grad=False))
    ema = EMA(model, decay=0.9)
    old = [p.detach().clone() for p in ema.model.parameters()]
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    ema.update()
    for e, o, p in zip(ema.model.parameters(), old, model.parameters(), strict=True):
        torch.testing.assert_close(e, 0.9 * o + 0.1 * p)
    assert not any(p.requires_grad for p in ema.model.parameters())


def test_trainer_ema_follows_the_model():
    trainer = Trainer(tiny_cfg(ema_decay=0.5))
    ema_before = [p.detach().clone() for p in trainer.ema.model.parameters()]
    trainer.step(trainer.next_batch())
    for e, o, p in zip(
        trainer.ema.model.parameters(), ema_before, trainer.base_model.parameters(), strict=True
    ):
        torch.testing.assert_close(e, 0.5 * o + 0.5 * p)


class FixedSet(DataSource):
    """8 fixed latents of 2 classes, served as shuffled batches: a data set a DiT can fit."""

    def __init__(self, batch_size=16, size=4):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(8, 4, size, size, generator=g).clamp(-2, 2)
        self.y = torch.arange(8) % 2
        self.batch_size = batch_size
        self.g = torch.Generator().manual_seed(1)

    def next_batch(self):
        idx = torch.randint(0, 8, (self.batch_size,), generator=self.g)
        return self.x[idx], self.y[idx]

    def describe(self):
        return {"kind": "fixed"}


@pytest.mark.slow
def test_short_run_drives_the_loss_down():
    cfg = Knobs(model="DiT-T/2", image_size=32, batch_size=16, lr=2e-3, num_classes=2)
    trainer = Trainer(cfg, data=FixedSet())
    losses = torch.stack([trainer.step(trainer.next_batch()) for _ in range(100)])
    assert torch.isfinite(losses).all()
    first, last = losses[:5].mean().item(), losses[-15:].mean().item()
    assert first > 0.85  # a zero-initialised DiT starts near MSE 1
    assert last < 0.45 * first, (first, last)


def test_wrap_model_is_applied_and_base_kept():
    seen = {}

    def wrap(module):
        seen["device"] = next(module.parameters()).device
        return _Wrapper(module)

    trainer = Trainer(tiny_cfg(), wrap_model=wrap)
    assert isinstance(trainer.model, _Wrapper) and trainer.model.module is trainer.base_model
    assert seen["device"].type == "cpu"
    assert torch.isfinite(trainer.step(trainer.next_batch()))


class _Wrapper(torch.nn.Module):
    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)


def test_bad_config_values():
    with pytest.raises(UserError, match="batch_size"):
        Trainer(tiny_cfg(batch_size=0))
    with pytest.raises(UserError, match="valid models"):
        Trainer(tiny_cfg(model="DiT-Z/2"))
    with pytest.raises(UserError, match="every_K"):
        Trainer(tiny_cfg(grad_ckpt="sometimes"))
    with pytest.raises(UnsupportedError):
        Trainer(tiny_cfg(), device="cuda:7" if torch.cuda.is_available() else "cuda")


def test_grad_ckpt_trainer_matches_plain():
    # Trainers draw timesteps, noise and label dropout from the global RNG (seeded by the
    # Trainer, like the official train.py), so run them one after the other.
    def run(mode):
        trainer = Trainer(tiny_cfg(model="DiT-T/2", grad_ckpt=mode))
        return [trainer.step(trainer.next_batch()).item() for _ in range(3)]

    assert run("full") == pytest.approx(run("none"), rel=1e-5)
    assert run("every_2") == pytest.approx(run("none"), rel=1e-5)


def test_diffusers_impl_trains():
    trainer = Trainer(tiny_cfg(model="DiT-T/4", impl="diffusers"))
    assert all(torch.isfinite(trainer.step(trainer.next_batch())) for _ in range(2))


def test_save_and_resume_state(tmp_path):
    from ditbench.models.checkpoint import load_model_weights

    trainer = Trainer(tiny_cfg())
    for _ in range(2):
        trainer.step(trainer.next_batch())
    path = tmp_path / "ckpt.pt"
    trainer.save(path)
    model, info = load_model_weights(path)
    assert info.source == "ema" and info.step == 2 and info.config["model"] == "DiT-T/8"
    for a, b in zip(model.state_dict().values(), trainer.ema.model.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    other = Trainer(tiny_cfg(seed=5))
    other.load_state_dict(torch.load(path, weights_only=True))
    assert other.step_count == 2
    for a, b in zip(other.base_model.parameters(), trainer.base_model.parameters(), strict=True):
        assert torch.equal(a, b)


def _cli(*args):
    env = dict(os.environ, PYTHONPATH=os.getcwd() + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run(
        [sys.executable, "-m", "ditbench", "train", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


@pytest.mark.slow
def test_cli_train_runs(tmp_path):
    ckpt = tmp_path / "c.pt"
    proc = _cli(
        "--model",
        "DiT-T/8",
        "--image-size",
        "64",
        "--steps",
        "4",
        "--batch-size",
        "4",
        "--log-every",
        "2",
        "--no-progress",
        "--device",
        "cpu",
        "--save",
        str(ckpt),
    )
    assert proc.returncode == 0, proc.stderr
    assert "steps/s" in proc.stdout and "loss" in proc.stdout
    assert ckpt.is_file()


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--precision", "fp64"], "fp32, tf32, fp16, bf16"),
        (["--grad-ckpt", "half"], "every_K"),
        (["--image-size", "100"], "multiple of"),
        (["--steps", "0"], "--steps"),
    ],
)
@pytest.mark.slow
def test_cli_train_bad_values(args, needle):
    proc = _cli("--model", "DiT-T/8", "--device", "cpu", *args)
    assert proc.returncode == 2
    assert needle in proc.stderr and "Traceback" not in proc.stderr


def no_cxx_compiler(err: BaseException | None) -> bool:
    """Whether torch's inductor failed for want of a C++ compiler (InvalidCxxCompiler), however wrapped
    (dynamo's BackendCompilerFailed keeps it as inner_exception and as the cause)."""
    from torch._inductor.exc import InvalidCxxCompiler

    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, InvalidCxxCompiler):
            return True
        seen.add(id(err))
        err = getattr(err, "inner_exception", None) or err.__cause__ or err.__context__
    return False


@pytest.mark.slow  # importing dynamo takes seconds; it guards the slow compile test below
def test_only_a_missing_compiler_counts_as_no_compiler():
    from torch._dynamo.exc import BackendCompilerFailed
    from torch._inductor.exc import InvalidCxxCompiler

    missing = InvalidCxxCompiler()
    wrapped = BackendCompilerFailed(lambda *a: None, missing, None)
    assert no_cxx_compiler(missing) and no_cxx_compiler(wrapped)
    try:
        raise RuntimeError("compile step failed") from missing
    except RuntimeError as err:
        assert no_cxx_compiler(err)
    assert not no_cxx_compiler(RuntimeError("a wrong kernel"))
    assert not no_cxx_compiler(BackendCompilerFailed(lambda *a: None, ValueError("bad graph"), None))


@pytest.mark.slow
def test_compile_step_matches_eager():
    try:
        trainer = Trainer(tiny_cfg(model="DiT-T/8", compile=True))
        loss = trainer.step(trainer.next_batch())
    except Exception as err:
        if not no_cxx_compiler(err):
            raise  # anything but "no compiler on this machine" is a failure
        pytest.skip(f"no C++ compiler for inductor on this machine: {str(err)[:200]}")  # pragma: no cover
    eager = Trainer(tiny_cfg(model="DiT-T/8"))
    assert loss.item() == pytest.approx(eager.step(eager.next_batch()).item(), rel=1e-4)


def test_zero_grad_order_changes_memory_not_the_step():
    def run(order):
        trainer = Trainer(tiny_cfg(zero_grad=order, grad_accum=2))
        losses = [trainer.step(trainer.next_batch()) for _ in range(3)]
        return losses, [p.detach().clone() for p in trainer.base_model.parameters()]

    (early, early_params), (late, late_params) = run("before_forward"), run("after_forward")
    assert [x.item() for x in early] == [x.item() for x in late]
    assert all(torch.equal(a, b) for a, b in zip(early_params, late_params, strict=True))
