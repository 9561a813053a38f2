"""AdamW as DiT trains (lr 1e-4, no weight decay) and the EMA of the weights (decay 0.9999)."""

from __future__ import annotations

import copy

import torch
from torch import nn

from ditbench.spec.knobs import PartialKnobs

# The AdamW kernel `optimizer_impl: auto` picks, as measured. CPU (DiT-S/8, one thread, fastest of 6):
# fused 88 ms per step, foreach 347 ms, for-loop (the official loop's) 322 ms. CUDA: fused is one launch.
AUTO_IMPL = {"cuda": "fused", "cpu": "fused"}


def make_optimizer(
    model: nn.Module,
    lr: float = 1e-4,
    weight_decay: float = 0.0,
    impl: str = "auto",
    device: str | torch.device | None = None,
    name: str = "adamw",
) -> torch.optim.AdamW:
    """AdamW (the optimizer knob's one value, DiT's) over the trainable parameters; impl auto: AUTO_IMPL.
    `opt.ditbench_impl` names the kernel that runs (the record's `metrics.optimizer_kernel`)."""
    PartialKnobs(optimizer=name, optimizer_impl=impl, lr=lr, weight_decay=weight_decay)  # UserError if bad
    params = [p for p in model.parameters() if p.requires_grad]
    dev = (
        torch.device(device) if device is not None else (params[0].device if params else torch.device("cpu"))
    )
    if impl == "auto":
        impl = AUTO_IMPL.get(dev.type, "foreach")
    kwargs = {"fused": {"fused": True}, "foreach": {"foreach": True}}.get(impl, {"foreach": False})
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, **kwargs)
    opt.ditbench_impl = impl  # what actually ran, for the result record
    return opt


class EMA:
    """Exponential moving average of every parameter (frozen pos_embed included, as official).

    A plain model gets a full copy (`ema.model`). A model whose parameters FSDP2 has sharded cannot be
    deep-copied: its EMA is a sharded copy of each parameter and `ema.model` is None.
    """

    def __init__(self, model: nn.Module, decay: float = 0.9999):
        PartialKnobs(ema_decay=decay)  # UserError if not valid
        self.decay = decay
        self._names = [name for name, _ in model.named_parameters()]
        self._src = [p for p in model.parameters()]
        if any(_is_sharded(p) for p in self._src):
            self.model = None
            with torch.no_grad():
                self._ema = [p.detach().clone() for p in self._src]
        else:
            self.model = copy.deepcopy(model).eval()
            self.model.requires_grad_(False)
            self._ema = [p for p in self.model.parameters()]

    @torch.no_grad()
    def update(self) -> None:
        torch._foreach_lerp_(self._ema, [p.detach() for p in self._src], 1.0 - self.decay)

    def state_dict(self) -> dict:
        if self.model is None:
            return dict(zip(self._names, self._ema, strict=True))
        return self.model.state_dict()

    def load_state_dict(self, state: dict) -> None:
        if self.model is None:
            with torch.no_grad():
                for name, t in zip(self._names, self._ema, strict=True):
                    t.copy_(state[name])
            return
        self.model.load_state_dict(state)


def _is_sharded(p: torch.Tensor) -> bool:
    """A DTensor parameter (FSDP2's fully_shard), without importing torch.distributed eagerly."""
    return type(p).__name__ == "DTensor"
