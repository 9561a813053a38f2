"""A data source of fixed latents served in order, for tests that compare training steps exactly."""

from __future__ import annotations

import torch

from ditbench.train.data import DataSource


class Rows(DataSource):
    """`rows` seeded latents and labels, `batch_size` at a time in order (wrapping): K draws of B are
    one draw of K*B."""

    def __init__(self, batch_size: int, rows: int = 24, size: int = 8, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(rows, 4, size, size, generator=g)
        self.y = torch.randint(0, 10, (rows,), generator=g)
        self.batch_size, self.at = batch_size, 0

    def next_batch(self):
        idx = torch.arange(self.at, self.at + self.batch_size) % len(self.x)
        self.at += self.batch_size
        return self.x[idx], self.y[idx]

    def describe(self):
        return {"kind": "rows"}
