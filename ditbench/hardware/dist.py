"""In-process side of distributed runs (the parent side is bench.launch.torchrun): `init()` joins the
torchrun job its environment names (NCCL on CUDA, gloo on CPU); without torchrun every helper here is a
no-op, so one code path serves 1 and N processes."""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as tdist
from torch import nn

from ditbench.core.errors import UserError
from ditbench.hardware.device import resolve_device

DEFAULT_TIMEOUT_S = 600.0  # a collective waits this long for a peer before it fails (torch's default)


@dataclass(frozen=True)
class DistContext:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    backend: str | None = None  # None: no process group (a plain single process)
    device: torch.device = torch.device("cpu")

    @property
    def distributed(self) -> bool:
        return self.backend is not None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def nodes(self) -> int:
        return max(1, self.world_size // max(1, self.local_world_size))


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return default if value in (None, "") else int(value)


def init(device: str = "auto", timeout_s: float = DEFAULT_TIMEOUT_S) -> DistContext:
    """Join the torchrun job this process belongs to, or describe a plain single process."""
    if not {"RANK", "WORLD_SIZE", "LOCAL_RANK"} <= os.environ.keys():  # not under torchrun
        return DistContext(device=resolve_device(device))
    rank, local_rank, world = _env_int("RANK", 0), _env_int("LOCAL_RANK", 0), _env_int("WORLD_SIZE", 1)
    local_world = _env_int("LOCAL_WORLD_SIZE", world)
    dev = resolve_device(device, local_rank)
    backend = "nccl" if dev.type == "cuda" else "gloo"
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if not tdist.is_initialized():  # device_id binds NCCL to this GPU at once (no lazy guess)
        device_id = dev if dev.type == "cuda" else None
        tdist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s), device_id=device_id)
    return DistContext(
        rank=rank,
        local_rank=local_rank,
        world_size=world,
        local_world_size=local_world,
        backend=backend,
        device=dev,
    )


def shutdown() -> None:
    if tdist.is_available() and tdist.is_initialized():
        tdist.destroy_process_group()


def barrier(ctx: DistContext) -> None:
    if ctx.distributed:
        tdist.barrier(device_ids=[ctx.device.index] if ctx.backend == "nccl" else None)


def all_gather_objects(ctx: DistContext, obj):
    """Every rank's `obj` (picklable), in rank order; [obj] without a process group."""
    if not ctx.distributed:
        return [obj]
    out = [None] * ctx.world_size
    tdist.all_gather_object(out, obj)
    return out


def wrap_model(model: nn.Module, strategy: str, ctx: DistContext) -> nn.Module:
    """`model` (on ctx.device) wrapped for data-parallel training by the knobs' `strategy`, unchanged in
    one plain process. ddp: DistributedDataParallel. fsdp: FSDP2 `fully_shard` on every block, then the
    root (build the optimizer after wrapping: it sees DTensors)."""
    if not ctx.distributed:
        return model
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
        # Every DiT parameter takes part in every step (label dropout only swaps the row used),
        # so the extra graph traversal of find_unused_parameters would be pure overhead.
        return DistributedDataParallel(model, device_ids=device_ids, find_unused_parameters=False)
    from torch.distributed.fsdp import fully_shard

    blocks = getattr(model, "blocks", None)
    if blocks is None:
        raise UserError(
            f"strategy 'fsdp' needs a model with a `blocks` list; {type(model).__name__} has none."
        )
    for block in blocks:
        fully_shard(block)
    fully_shard(model)
    return model


def unwrap_model(model: nn.Module) -> nn.Module:
    """The plain module under a DDP wrapper (FSDP2 shards in place, so it is already plain)."""
    return getattr(model, "module", model)
