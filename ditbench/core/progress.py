"""Progress bars for a terminal; where stderr is not one (a CI log would keep tqdm's redraws as one
growing line), a plain line every `DITBENCH_PROGRESS_EVERY_S` seconds (30) and at the end."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable
from typing import Any

EVERY_ENV = "DITBENCH_PROGRESS_EVERY_S"
EVERY_DEFAULT_S = 30.0


def is_terminal(stream=None) -> bool:
    stream = sys.stderr if stream is None else stream
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # a closed or replaced stream
        return False


def progress(
    iterable: Iterable | None = None,
    *,
    total: int | None = None,
    initial: int = 0,
    unit: str = "it",
    desc: str | None = None,
    disable: bool = False,
    plain: bool = True,
    leave: bool = True,
):
    """A tqdm bar on a terminal; otherwise plain lines (`plain`) or nothing, with the same calls."""
    shared = {"total": total, "initial": initial, "unit": unit, "desc": desc}
    if not disable and is_terminal():
        from tqdm.auto import tqdm

        return tqdm(iterable, leave=leave, dynamic_ncols=True, file=sys.stderr, **shared)
    return PlainProgress(iterable, **shared, quiet=disable or not plain)


def duration(seconds: float) -> str:
    """`42 s`, `3 min 05 s`, `1 h 02 min`, `3 days 4 h`."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    if s < 2 * 86400:
        return f"{s // 3600} h {s % 3600 // 60:02d} min"
    return f"{s // 86400:,} days {s % 86400 // 3600} h"


def every_s() -> float:
    """Seconds between plain progress lines: `DITBENCH_PROGRESS_EVERY_S`, 30 when unset or not a number."""
    try:
        value = float(os.environ.get(EVERY_ENV, EVERY_DEFAULT_S))
    except ValueError:
        return EVERY_DEFAULT_S
    return value if value >= 0 else EVERY_DEFAULT_S


class PlainProgress:
    """`desc: 120/1000 img (12%), 3.2 img/s, 38 s, ETA 4 min 35 s, loss=0.31` on stderr, a line at a time."""

    def __init__(self, iterable, total, initial, unit, desc, quiet=False):
        self.iterable, self.total, self.n, self.unit, self.desc = iterable, total, initial, unit, desc
        if total is None and iterable is not None and hasattr(iterable, "__len__"):
            self.total = len(iterable)
        self.quiet, self.postfix, self.closed = quiet, "", False
        self.start_n, self.start = initial, time.monotonic()
        self.every, self.last, self.shown = every_s(), self.start, initial

    def __iter__(self):
        for item in self.iterable:
            yield item
            self.update(1)
        self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.monotonic()
        if now - self.last >= self.every:
            self.last = now
            self._line()

    def set_postfix(self, ordered_dict: dict | None = None, refresh: bool = True, **kwargs: Any) -> None:
        del refresh  # tqdm's signature; a plain line is printed on its own schedule
        items = {**(ordered_dict or {}), **kwargs}
        self.postfix = ", ".join(f"{k}={v}" for k, v in items.items())

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        del refresh  # as in set_postfix
        self.postfix = str(s)

    @staticmethod
    def write(text: str, file=None) -> None:
        print(text, file=file or sys.stdout, flush=True)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self.n != self.shown:  # the last periodic line may already say where it ended
                self._line()

    def _line(self) -> None:
        self.shown = self.n
        if self.quiet:
            return
        elapsed = max(time.monotonic() - self.start, 1e-9)
        done = f"{self.n}/{self.total}" if self.total else f"{self.n}"
        pct = f" ({100 * self.n / self.total:.0f}%)" if self.total else ""
        rate = (self.n - self.start_n) / elapsed
        what = self.desc or "progress"
        text = f"{what}: {done} {self.unit}{pct}, {rate:.3g} {self.unit}/s, {elapsed:.0f} s"
        if self.total and rate > 0 and self.n < self.total:
            text += f", ETA {duration((self.total - self.n) / rate)}"
        print(text + (f", {self.postfix}" if self.postfix else ""), file=sys.stderr, flush=True)
