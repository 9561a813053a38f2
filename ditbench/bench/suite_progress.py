"""What a running suite tells the person watching, on stderr, besides each cell's result line: a
plain line now and then where stderr is not a terminal, so a log never looks hung (docs/measurement.md).
`SuiteProgress`: cells run here one by one, with an ETA; `JobWatch`: jobs.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable

from ditbench.core.progress import EVERY_ENV, duration
from ditbench.core.progress import every_s as default_every

QUIET_EVERY_S = 120.0  # between plain lines without --verbose or DITBENCH_PROGRESS_EVERY_S


class _Watch:
    def __init__(
        self, heartbeat: bool, every_s: float | None, write: Callable[[str], None] | None, starts=False
    ):
        self.heartbeat, self.starts = heartbeat, starts  # starts: a line as each cell starts (--verbose)
        if every_s is None:  # each cell has its result line: unless asked, a beat only in a long wait
            every_s = default_every() if starts or EVERY_ENV in os.environ else QUIET_EVERY_S
        self.every_s = every_s
        self.write = write or stderr_line

    def start(self, index: int, cell) -> None:
        """The loop takes cell `index` (1-based): it is decided, started or submitted."""

    def end(self, status: str) -> None:
        """A cell the loop took was recorded with `status` (or "interrupted")."""

    def poll(self, waiting: list[tuple[str, str, str | None, dict | None]], recorded: int) -> None:
        """The loop polls the jobs it waits for: (key, cell name, job id, its start info or None)."""


class SuiteProgress(_Watch):
    """The heartbeat (and start lines) of a run whose cells run here, one at a time."""

    def __init__(self, cells: list, heartbeat: bool, every_s: float | None = None, write=None, starts=False):
        super().__init__(heartbeat, every_s, write, starts)
        self.cells = cells
        self.ran_s: list[float] = []  # how long each cell that ran took
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._index, self._started = 0, 0.0

    def eta(self, index: int, elapsed_in_cell: float = 0.0) -> str:
        """The suite's time left when cell `index` (1-based) is `elapsed_in_cell` seconds in."""
        if not self.ran_s:
            return "ETA after the first cell"
        mean = sum(self.ran_s) / len(self.ran_s)
        remaining = max((len(self.cells) - index + 1) * mean - elapsed_in_cell, 0.0)
        n = len(self.ran_s)
        return f"ETA {duration(remaining)} (mean {duration(mean)} over {n} cell{'s' * (n != 1)} run)"

    def start(self, index: int, cell) -> None:
        """Cell `index` (1-based) starts: its line (--verbose), and the heartbeat while it runs."""
        self._index, self._started = index, time.monotonic()
        if self.starts:
            self.write(f"cell {index}/{len(self.cells)}: {cell.cell_name}; suite {self.eta(index)}")
        if self.heartbeat and self.every_s > 0:
            self._stop.clear()
            self._thread = threading.Thread(target=self._beat, args=(cell.cell_name,), daemon=True)
            self._thread.start()

    def end(self, status: str) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if status not in ("unsupported", "skipped"):  # those never started a process
            self.ran_s.append(time.monotonic() - self._started)

    def _beat(self, name: str) -> None:
        index, total = self._index, len(self.cells)
        while not self._stop.wait(self.every_s):
            elapsed = time.monotonic() - self._started
            self.write(
                f"cell {index}/{total} running for {duration(elapsed)}: {name}; {index - 1} of {total} "
                f"done, suite {self.eta(index, elapsed)}"
            )


class JobWatch(_Watch):
    """Start lines and the heartbeat of a run whose cells are jobs (`--executor`): a job's start line at
    its first poll with started info, and every `every_s` the jobs running, queued and recorded."""

    def __init__(self, total: int, heartbeat: bool, every_s: float | None = None, write=None, starts=False):
        super().__init__(heartbeat, every_s, write, starts)
        self.total = total
        self.seen: set[str] = set()
        self._began = self._last = time.monotonic()

    def poll(self, waiting: list[tuple[str, str, str | None, dict | None]], recorded: int) -> None:
        for key, name, job_id, started in waiting:
            if started is not None and key not in self.seen:
                self.seen.add(key)
                if not self.starts:
                    continue
                hosts = ", ".join(started.get("hostnames") or []) or "its node"
                self.write(
                    f"cell started ({len(self.seen)} of {self.total}): {name}, job {job_id} on {hosts}"
                )
        now = time.monotonic()
        if self.heartbeat and self.every_s > 0 and now - self._last >= self.every_s:
            self._last = now
            running = sum(started is not None for *_, started in waiting)
            self.write(
                f"waiting for {len(waiting)} job(s): {running} running, {len(waiting) - running} queued; "
                f"{recorded} of {self.total} cells recorded, {duration(now - self._began)} so far"
            )


def stderr_line(text: str) -> None:
    """A line of progress: stderr, above a terminal's bar; stdout keeps the command's result (--json)."""
    from tqdm import tqdm

    tqdm.write(text, file=sys.stderr)
    sys.stderr.flush()
