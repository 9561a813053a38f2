"""How a memory size reads: GiB from 1 GiB up, MiB below it (a CPU cell's few MiB would read `0.01`
GiB). Records keep GiB (the `*_gib` fields); only what a person reads changes unit.
"""

from __future__ import annotations

import re

MIB_PER_GIB = 1024


def memory_text(gib: float | None, missing: str = "-") -> str:
    """`12.42 GiB`, `1.00 GiB`, `512 MiB`, `8.09 MiB`, `0.50 MiB`; `missing` for None."""
    if gib is None:
        return missing
    if abs(gib) >= 1:
        return f"{gib:.2f} GiB"
    mib = gib * MIB_PER_GIB
    digits = 0 if abs(mib) >= 100 else 1 if abs(mib) >= 10 else 2
    return f"{mib:.{digits}f} MiB"


def bytes_as_gib(message: str) -> str:
    """A message's raw byte counts as a person reads memory (the CPU allocator's out-of-memory error
    says "you tried to allocate 60129542144 bytes"): `56.00 GiB`."""
    return re.sub(r"\b(\d{4,}) bytes\b", lambda m: memory_text(int(m.group(1)) / 2**30), message)
