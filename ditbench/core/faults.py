"""How a cell fails: injected faults (tests, trying a suite's failure handling) and the one mapping from
what a cell raised to the record's status.

`DITBENCH_INJECT_FAULT="<cell-name substring>=<kind>[@step][,...]"`: raise (-> error), hang (-> timeout),
oom, nan (NaN weights -> nan_loss), slow:F (each step followed by F in (0, 10] times its own time of busy
work); `@step`: the 1-based step (warm-up included), default 1. DITBENCH_INJECT_FAULT_RANK=R: rank R only.
"""

from __future__ import annotations

import math
import re
import time
import traceback
from dataclasses import dataclass

from ditbench.core.errors import UnsupportedError, UserError, shorten
from ditbench.core.units import bytes_as_gib

FAULT_ENV = "DITBENCH_INJECT_FAULT"
FAULT_RANK_ENV = "DITBENCH_INJECT_FAULT_RANK"
FAULT_KINDS = ("raise", "hang", "oom", "nan", "slow")
SLOW_MAX = 10.0  # a step slowed more than 11-fold is a hang by another name
TRACEBACK_CHARS = 4000  # the end of a traceback kept in a result; the record keeps its last lines
REASON_CHARS = 300  # an out-of-memory message's first characters (the allocator's summary)
_CPU_OOM = ("DefaultCPUAllocator: can't allocate memory", "DefaultCPUAllocator: not enough memory")
_ITEM = re.compile(
    r"(?P<substring>.+)=(?P<kind>[a-z]+)(?::(?P<fraction>[0-9.eE+-]{1,20}))?(?:@(?P<step>[1-9]\d{0,8}))?"
)


@dataclass(frozen=True)
class Fault:
    kind: str
    step: int = 1  # 1-based
    fraction: float = 0.0  # slow: each step adds this share of its own time


def parse_fault_spec(text: str | None) -> list[tuple[str, Fault]]:
    """(cell-name substring, fault) for each item; UserError naming the item on a syntax error."""
    out: list[tuple[str, Fault]] = []
    for item in filter(str.strip, (text or "").split(",")):
        m = _ITEM.fullmatch(item.strip())
        kind = m["kind"] if m is not None else None
        fraction = _fraction(m["fraction"]) if kind == "slow" else 0.0  # slow without F: None
        if kind not in FAULT_KINDS or fraction is None or (kind != "slow" and m["fraction"] is not None):
            raise UserError(
                f"{FAULT_ENV} item {shorten(item)} is not valid: expected "
                f"'<cell-name substring>=<kind>[@step]' with kind one of {', '.join(FAULT_KINDS)} "
                f"(slow as slow:F, F a fraction above 0 and at most {SLOW_MAX:g}: each step adds F "
                "times its own time) and step a positive integer, e.g. 'bs=16=oom@3' or 'bs=8=slow:0.10'."
            )
        out.append((m["substring"], Fault(kind, int(m["step"] or 1), fraction)))
    return out


def _fraction(text: str | None) -> float | None:
    """slow's F as a float in (0, SLOW_MAX], else None."""
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) and 0 < value <= SLOW_MAX else None


def check_fault_rank(text: str | None) -> int | None:
    if text in (None, ""):
        return None
    if not re.fullmatch(r"\d{1,6}", text):
        raise UserError(f"{FAULT_RANK_ENV} {shorten(text)} must be a rank number (0, 1, ...).")
    return int(text)


def fault_for(cell_name: str, text: str | None, rank: int = 0, rank_text: str | None = None) -> Fault | None:
    only = check_fault_rank(rank_text)
    if only is not None and only != rank:
        return None
    return next((fault for substring, fault in parse_fault_spec(text) if substring in cell_name), None)


class FaultyStep:
    """Wraps trainer.step so an injected fault happens inside a real training step."""

    def __init__(self, trainer, fault: Fault | None):
        self.trainer, self.fault, self.count = trainer, fault, 0

    def __call__(self, batch):
        import torch

        self.count += 1
        if self.fault is not None and self.fault.kind == "slow" and self.count >= self.fault.step:
            return self._slowed(batch)
        if self.fault is not None and self.count == self.fault.step:
            kind = self.fault.kind
            if kind == "raise":
                raise RuntimeError(f"injected fault ({FAULT_ENV}): raise at step {self.count}")
            if kind == "hang":
                while True:
                    time.sleep(1)
            if kind == "oom":
                raise torch.OutOfMemoryError(
                    f"CUDA out of memory (injected by {FAULT_ENV} at step {self.count})"
                )
            if kind == "nan":
                with torch.no_grad():
                    for p in self.trainer.model.parameters():
                        p.fill_(math.nan)
        return self.trainer.step(batch)

    def _slowed(self, batch):
        """The step (synchronised on CUDA), then `fraction` times its time spinning on this core: a sleep
        would add the wake-up's wait for a core too."""
        import torch

        start = time.perf_counter()
        loss = self.trainer.step(batch)
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
        end = time.perf_counter()
        deadline = end + (end - start) * self.fault.fraction
        while time.perf_counter() < deadline:
            pass
        return loss


class NonFiniteLoss(Exception):
    def __init__(self, step: int, phase: str, value: float, curve: list[float] | None = None):
        super().__init__(f"loss became non-finite ({value}) at {phase} step {step}")
        self.step, self.phase, self.value = step, phase, value
        self.curve = curve or []  # a smoke run's losses up to the failure


def check_finite(losses: list, first_step: int, phase: str) -> None:
    """NonFiniteLoss at the first of `losses` (0-d tensors, the first at `first_step`) that is not finite."""
    import torch

    if not losses:
        return
    values = torch.stack([x.detach().float().reshape(()) for x in losses]).cpu()
    bad = (~torch.isfinite(values)).nonzero()
    if len(bad):
        i = int(bad[0])
        raise NonFiniteLoss(first_step + i, phase, float(values[i]))


def is_out_of_memory(err: BaseException) -> bool:
    """A CUDA out-of-memory, or the CPU allocator's (a CPU batch too large is `oom` too, not `error`)."""
    import torch

    if isinstance(err, (torch.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(err, RuntimeError) and any(text in str(err) for text in _CPU_OOM)


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def failure(err: BaseException) -> dict:
    """{status, reason[, traceback]} for what a cell (or its smoke run) raised."""
    if isinstance(err, NonFiniteLoss):
        return {"status": "nan_loss", "reason": str(err)}
    if is_out_of_memory(err):
        return {"status": "oom", "reason": "out of memory: " + bytes_as_gib(one_line(err))[:REASON_CHARS]}
    if isinstance(err, UnsupportedError):
        return {"status": "unsupported", "reason": one_line(err)}
    if isinstance(err, UserError):
        return {"status": "error", "reason": one_line(err)}
    return {
        "status": "error",
        "reason": f"{type(err).__name__}: {err}",
        "traceback": "".join(traceback.format_exception(err))[-TRACEBACK_CHARS:],
    }
