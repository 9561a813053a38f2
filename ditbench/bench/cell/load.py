"""The machine's load during a measured window: load average, and the CPU share of other processes
(busy CPU time less this cell's tree's, over wall time and cores). Above LOAD_BOUND the window is noisy.
"""

from __future__ import annotations

import os
import time
from typing import Any

import psutil

LOAD_BOUND = 0.25  # other processes' share of the cores above which a window is noisy
IDLE_FIELDS = ("idle", "iowait", "guest", "guest_nice")  # Linux counts guest time in user too


def busy_seconds() -> float:
    """CPU seconds every core of the machine has spent busy since boot."""
    t = psutil.cpu_times()
    return sum(t) - sum(getattr(t, f, 0.0) for f in IDLE_FIELDS)


def tree_seconds(root: int) -> float:
    """CPU seconds (user + system) of process `root` and its living descendants."""
    total = 0.0
    try:
        proc = psutil.Process(root)
        procs = [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return 0.0
    for p in procs:
        try:
            t = p.cpu_times()
        except psutil.Error:  # ended meanwhile
            continue
        total += t.user + t.system
    return total


def other_share(busy_s: float, own_s: float, wall_s: float, cpus: int) -> float:
    """The fraction of the machine's cores other processes kept busy over `wall_s` seconds."""
    if wall_s <= 0 or cpus < 1:
        return 0.0
    return min(1.0, max(0.0, (busy_s - own_s) / (wall_s * cpus)))


class LoadMeter:
    """start() at the window's start, stop() at its end -> the record's metrics.load."""

    def __init__(self, root: int | None = None):
        self.root = os.getpid() if root is None else root  # a rank passes its launcher's process

    def start(self) -> None:
        self.load_start = psutil.getloadavg()[0]
        self.busy, self.own, self.t0 = busy_seconds(), tree_seconds(self.root), time.perf_counter()

    def stop(self) -> dict[str, Any]:
        wall = time.perf_counter() - self.t0
        busy, own = busy_seconds() - self.busy, tree_seconds(self.root) - self.own
        return {
            "load_1m_start": round(self.load_start, 3),
            "load_1m_end": round(psutil.getloadavg()[0], 3),
            "other_cpu_share": round(other_share(busy, own, wall, psutil.cpu_count() or 1), 4),
            "cpus": psutil.cpu_count() or 1,
        }
