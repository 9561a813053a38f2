"""The quick loop's DDP check: two gloo ranks, each the DDP-wrapped DiT on its half of a global batch,
end with the gradient a single process gets on the whole batch (the slow test in test_dist.py checks
FSDP2 and whole training steps through torchrun). The ranks are forked from a fork server that has
imported torch but run nothing (a process that has used torch's thread pools is not safe to fork),
so no rank pays a fresh interpreter's start."""

from __future__ import annotations

import multiprocessing
import os
import socket

import pytest
import torch

from ditbench.hardware import dist
from ditbench.models import build_model
from ditbench.models.diffusion import create_diffusion


def _model():
    torch.manual_seed(0)
    model = build_model("DiT-T/2", image_size=32, num_classes=10, class_dropout_prob=0.0)
    with torch.no_grad():  # leave adaLN-Zero's zeros behind, so every weight gets a gradient
        g = torch.Generator().manual_seed(5)
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return model


def _global_batch(n=4):
    g = torch.Generator().manual_seed(1)
    return (
        torch.randn(n, 4, 4, 4, generator=g),
        torch.randint(0, 1000, (n,), generator=g),
        torch.randint(0, 10, (n,), generator=g),
        torch.randn(n, 4, 4, 4, generator=g),
    )


def _rank(rank: int, port: int, out) -> None:
    torch.set_num_threads(1)
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2"
    )
    try:
        ctx = dist.init("cpu", timeout_s=30)
        x, t, y, noise = _global_batch()
        mine = slice(2 * rank, 2 * rank + 2)
        wrapped = dist.wrap_model(_model(), "ddp", ctx)
        loss = create_diffusion().training_losses(
            wrapped, x[mine], t[mine], {"y": y[mine]}, noise=noise[mine]
        )
        loss["loss"].mean().backward()
        model = dist.unwrap_model(wrapped)
        grads = {n: p.grad.numpy().copy() for n, p in model.named_parameters() if p.grad is not None}
        out.put((rank, grads))  # numpy pickles by value; a tensor would be an fd the exiting rank closes
        dist.shutdown()
    except BaseException as err:  # the parent reports it instead of waiting for a rank that is gone
        out.put((rank, repr(err)))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ddp_on_two_gloo_ranks_averages_to_the_whole_batch_gradient():
    mp = multiprocessing.get_context("forkserver")
    mp.set_forkserver_preload(
        ["torch", "ditbench.models", "ditbench.models.diffusion", "ditbench.hardware.dist"]
    )
    out = mp.Queue()
    port = _free_port()
    procs = [mp.Process(target=_rank, args=(r, port, out), daemon=True) for r in (0, 1)]
    for p in procs:
        p.start()
    try:
        got = dict(out.get(timeout=60) for _ in procs)
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    for rank in (0, 1):
        assert isinstance(got[rank], dict), f"rank {rank}: {got[rank]}"

    model = _model()
    x, t, y, noise = _global_batch()
    create_diffusion().training_losses(model, x, t, {"y": y}, noise=noise)["loss"].mean().backward()
    ref = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert len(ref) > 20  # every block's weights take part
    for rank in (0, 1):
        assert set(got[rank]) == set(ref)
        for name, g in ref.items():
            torch.testing.assert_close(
                torch.from_numpy(got[rank][name]), g, rtol=1e-4, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}"
            )
    # Each rank alone would have its half's gradient, not the whole batch's: the all-reduce happened.
    half = _model()
    create_diffusion().training_losses(half, x[:2], t[:2], {"y": y[:2]}, noise=noise[:2])[
        "loss"
    ].mean().backward()
    assert any(
        not torch.allclose(p.grad, ref[n], rtol=1e-3)
        for n, p in half.named_parameters()
        if p.grad is not None
    )


pytestmark = pytest.mark.timeout(120)
