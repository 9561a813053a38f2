"""How many threads torch runs with in a cell's process: the `threads` knob, resolved and applied.
On a shared CPU one thread per process is steady and comparable (all cores swing step times by 10x),
so it is the CPU default; a CUDA cell's host threads only launch kernels: torch's default stays.
"""

from __future__ import annotations

from typing import Any


def pinned(threads: Any, device: str) -> int | None:
    """The thread count the knob pins a process on `device` to; None: torch's own choice (auto)."""
    if threads == "auto":
        return None
    if threads is None:
        return 1 if device == "cpu" else None
    return int(threads)


def apply(threads: Any, device: str) -> None:
    """Set torch's intra-op (and, where still allowed, inter-op) threads before anything runs."""
    n = pinned(threads, device)
    if n is None:
        return
    import torch

    torch.set_num_threads(n)
    try:
        torch.set_num_interop_threads(n)
    except RuntimeError:  # allowed only before the process's first inter-op work (a test process did it)
        pass
