"""One DiT training step, the way the paper trains, under a chosen precision policy.

A step: gradients freed (before the forward, or after it as the official train.py), uniform timesteps,
label dropout 0.1 (in the model), hybrid loss averaged over the batch, backward (GradScaler for fp16),
AdamW, EMA. With `grad_accum: K`, K micro-batches forward and backward, then one AdamW and EMA step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
from torch import nn

from ditbench.hardware.device import resolve_device
from ditbench.hardware.precision import get_precision_policy
from ditbench.models.attention import resolve_kernel
from ditbench.models.build import build_model, count_params
from ditbench.models.checkpoint import save_checkpoint
from ditbench.models.configs import get_config, latent_size
from ditbench.models.diffusion import create_diffusion
from ditbench.spec.knobs import Knobs
from ditbench.train.data import DataSource, data_source_from_config
from ditbench.train.optim import EMA, make_optimizer

Batch = tuple[torch.Tensor, torch.Tensor] | list[tuple[torch.Tensor, torch.Tensor]]


class Trainer:
    """Builds model, diffusion, precision policy, optimizer, EMA and data from a cell's Knobs.

    The other arguments say how this process runs them, never what a step computes. `wrap_model` (e.g.
    DDP) applies after the move to the device, before torch.compile. `policy` and `compiler` are the
    planner's seam: it traces a CUDA step on fake CPU tensors.
    """

    def __init__(
        self,
        knobs: Knobs,
        *,
        device: str = "cpu",
        data_seed: int | None = None,
        data_workers: int = 0,
        class_dropout_prob: float = 0.1,
        wrap_model: Callable[[nn.Module], nn.Module] | None = None,
        data: DataSource | None = None,
        policy=None,
        compiler: Callable[..., nn.Module] | None = None,
    ):
        self.knobs = knobs
        self._run = {
            "device": device,
            "data_seed": data_seed,
            "data_workers": data_workers,
            "class_dropout_prob": class_dropout_prob,
        }
        self.device = resolve_device(device)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self.policy = policy or get_precision_policy(knobs.precision, self.device)
        self.policy.apply_backend_flags()
        # Before the model is built (an attention kernel that cannot run here fails fast) and before the
        # seed (the probe draws random inputs).
        self.attention_kernel = _attention_kernel(knobs, self.device, self.policy.autocast_dtype)

        torch.manual_seed(knobs.seed)  # model init, timesteps, noise and label dropout follow this seed
        # Built directly on the device: initialising a 675M-parameter model on the CPU takes seconds.
        arch = knobs.model_dump(include={"image_size", "num_classes", "grad_ckpt", "impl", "attention"})
        with torch.device(self.device):
            self.base_model = build_model(knobs.model, class_dropout_prob=class_dropout_prob, **arch)
        self.num_params = count_params(self.base_model)
        # Built on the device already but for tensors made outside torch's factories (numpy): moved only
        # then, so a fake-tensor trace (the planner), whose parameters cannot be swapped, needs no .to().
        if any(t.device != self.device for t in (*self.base_model.parameters(), *self.base_model.buffers())):
            self.base_model.to(self.device)
        self.base_model.train()
        model: nn.Module = self.base_model
        self._wrapped: nn.Module | None = None  # the data-parallel wrapper, if any (gradient sync)
        if wrap_model is not None:
            # Before the EMA and the optimizer: FSDP2 replaces the parameters with sharded ones.
            model = self._wrapped = wrap_model(model)
        self.ema = EMA(self.base_model, knobs.ema_decay)
        self.optimizer = make_optimizer(
            self.base_model,
            knobs.lr,
            knobs.weight_decay,
            knobs.optimizer_impl,
            self.device,
            name=knobs.optimizer,
        )
        self.scaler = self.policy.make_scaler()
        self.diffusion = create_diffusion()

        if knobs.compile:
            compile_ = compiler or torch.compile
            model = compile_(model, mode=None if knobs.compile_mode == "default" else knobs.compile_mode)
        self.model = model

        if data is None:
            data = data_source_from_config(
                knobs.data,
                batch_size=knobs.batch_size,
                image_size=knobs.image_size,
                num_classes=knobs.num_classes,
                device=self.device,
                seed=knobs.seed if data_seed is None else data_seed,
                num_workers=data_workers,
            )
        self.data = data
        self.step_count = 0
        self._skips = torch.zeros((), dtype=torch.long, device=self.device) if self.scaler else None

    @property
    def optimizer_kernel(self) -> str:
        return self.optimizer.ditbench_impl

    def next_batch(self) -> Batch:
        """One optimizer step's data: (x, y), or with grad_accum K > 1 a list of K (x, y) micro-batches."""
        if self.knobs.grad_accum == 1:
            return self.data.next_batch()
        return [self.data.next_batch() for _ in range(self.knobs.grad_accum)]

    def step(self, batch: Batch) -> torch.Tensor:
        """One optimizer step over `batch` (see next_batch); returns its mean loss, detached."""
        micro = batch if isinstance(batch, list) else [batch]
        if len(micro) != self.knobs.grad_accum:
            raise ValueError(
                f"grad_accum {self.knobs.grad_accum} needs that many micro-batches, got {len(micro)}"
            )
        sizes = [x.shape[0] for x, _ in micro]
        total = sum(sizes)
        x0 = micro[0][0]
        # The whole step's timesteps and noise in one draw each: K micro-batches of B consume the random
        # stream as one batch of K*B does, so accumulation computes what the larger batch computes.
        t_all = torch.randint(0, self.diffusion.num_timesteps, (total,), device=x0.device)
        noise_all = torch.randn((total, *x0.shape[1:]), device=x0.device, dtype=x0.dtype)
        early = self.knobs.zero_grad == "before_forward"
        if early:
            self.optimizer.zero_grad(set_to_none=True)
        losses = []
        start = 0
        for i, ((x, y), n) in enumerate(zip(micro, sizes, strict=True)):
            t, noise = t_all[start : start + n], noise_all[start : start + n]
            start += n
            with self._grad_sync(last=i == len(micro) - 1):  # DDP decides in forward whether to all-reduce
                with self.policy.autocast():
                    loss = self.diffusion.training_losses(self.model, x, t, {"y": y}, noise=noise)[
                        "loss"
                    ].mean()
                if len(micro) > 1:  # weighted by its share: the gradients add up to the whole batch's mean
                    loss = loss * (n / total)
                if i == 0 and not early:  # the official order: the last gradients lived through the forward
                    self.optimizer.zero_grad(set_to_none=True)
                (self.scaler.scale(loss) if self.scaler is not None else loss).backward()
            losses.append(loss.detach())
        if self.scaler is not None:
            before = self.scaler._scale.clone()  # created by the first scale(); update() is what changes it
            self.scaler.step(self.optimizer)
            self.scaler.update()
            # The scaler lowers its scale exactly when it skipped the step (inf/nan gradients);
            # counted on the device so the step never waits for the GPU.
            self._skips += (self.scaler._scale < before).long()
        else:
            self.optimizer.step()
        self.ema.update()
        self.step_count += 1
        return losses[0] if len(losses) == 1 else torch.stack(losses).sum()

    @contextlib.contextmanager
    def _grad_sync(self, last: bool):
        """No gradient all-reduce for a micro-batch before the last: DDP's no_sync, FSDP2's switch."""
        wrapped = self._wrapped
        if hasattr(wrapped, "no_sync") and not last:  # DistributedDataParallel
            with wrapped.no_sync():
                yield
        elif hasattr(wrapped, "set_requires_gradient_sync") and not last:  # FSDP2 (fully_shard)
            wrapped.set_requires_gradient_sync(False)
            try:
                yield
            finally:
                wrapped.set_requires_gradient_sync(True)
        else:
            yield

    @property
    def scaler_skips(self) -> int:
        return 0 if self._skips is None else int(self._skips.item())

    def state_dict(self) -> dict:
        return {
            "model": self.base_model.state_dict(),
            "ema": self.ema.state_dict(),
            "opt": self.optimizer.state_dict(),
            "step": self.step_count,
            "config": self.config(),
        }

    def save(self, path) -> None:
        save_checkpoint(path, self.base_model, self.ema.model, self.optimizer, self.step_count, self.config())

    def config(self) -> dict:
        """A checkpoint's `config`: the training knobs and how this process ran them."""
        return {**self.knobs.train_knobs(), **self._run}

    def load_state_dict(self, state: dict) -> None:
        """Resume from a ditbench checkpoint dict (model, ema, opt, step)."""
        self.base_model.load_state_dict(state["model"])
        self.ema.load_state_dict(state["ema"])
        if "opt" in state:
            self.optimizer.load_state_dict(state["opt"])
        self.step_count = int(state.get("step", 0))


def _attention_kernel(knobs: Knobs, device: torch.device, autocast_dtype: torch.dtype | None) -> str:
    """The kernel the model's attention runs (UnsupportedError, with torch's reason, if it cannot)."""
    arch = get_config(knobs.model)
    tokens = (latent_size(knobs.image_size, arch.patch_size) // arch.patch_size) ** 2
    dtype = autocast_dtype or torch.float32
    heads = arch.num_heads
    return resolve_kernel(knobs.attention, device, dtype, heads, arch.hidden_size // heads, tokens)
