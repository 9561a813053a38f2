"""Traces kept on disk, so a second plan (another card, another grid) re-traces nothing.

A series trace depends on the cell's memory-shaping knobs, the precision policy, the device kind,
torch's version and ditbench's own code (the model, the step, the planner). The key hashes all of
them, the code as the bytes of every ditbench source file, so an edited model or step is traced
afresh rather than answered from an old trace. A file that cannot be read back is ignored and
replaced; a cache directory that cannot be written is not an error (the plan just traces).

Location: $DITBENCH_CACHE/plan, else ~/.cache/ditbench/plan.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from ditbench.plan.batch import SeriesTrace
from ditbench.plan.emulation import Target
from ditbench.plan.trace import Trace

CACHE_ENV = "DITBENCH_CACHE"
VERSION = 2  # bump when what a trace records, or how, changes outside the source files


def cache_dir() -> Path:
    env = os.environ.get(CACHE_ENV)
    return (Path(env).expanduser() if env else Path.home() / ".cache" / "ditbench") / "plan"


@functools.lru_cache(maxsize=1)
def code_fingerprint() -> str:
    import torch

    import ditbench

    h = hashlib.sha256(f"torch {torch.__version__}\n".encode())
    root = Path(ditbench.__file__).resolve().parent
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def key(parts: Any) -> str:
    text = json.dumps([VERSION, code_fingerprint(), parts], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def load(name: str) -> SeriesTrace | None:
    from ditbench.fileio import read_regular  # a FIFO planted as the entry is refused, not waited on

    try:
        data = json.loads(read_regular(cache_dir() / f"{name}.json", "the plan cache"))
        t = data["trace"]
        trace = Trace(
            target=Target(t["target"][0], tuple(t["target"][1]) if t["target"][1] else None),
            batch_size=int(t["batch_size"]),
            sizes=[int(x) for x in t["sizes"]],
            events=[int(x) for x in t["events"]],
            labels={int(k): str(v) for k, v in t["labels"].items()},
            marks={str(k): int(v) for k, v in t["marks"].items()},
            modeled={int(k): tuple(v) for k, v in t["modeled"].items()},
            notes=[str(n) for n in t["notes"]],
            ops=int(t["ops"]),
            params=int(t["params"]),
            kernels={
                (str(r[0]), str(r[1]), bool(r[2]), *(int(x) for x in r[3:7])): int(r[7]) for r in t["kernels"]
            },
        )
        series = SeriesTrace(trace, int(data["probe"]), data["const"], data["per_sample"])
        if len(series.const) != len(trace.sizes) or len(series.per_sample) != len(trace.sizes):
            return None
        return series
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None


def save(name: str, series: SeriesTrace) -> None:
    from ditbench.fileio import write_atomic

    t = series.trace
    data = {
        "trace": {
            "target": [t.target.device, list(t.target.sm) if t.target.sm else None],
            "batch_size": t.batch_size,
            "sizes": t.sizes,
            "events": t.events,
            "labels": t.labels,
            "marks": t.marks,
            "modeled": t.modeled,
            "notes": t.notes,
            "ops": t.ops,
            "params": t.params,
            "kernels": [[*row, count] for row, count in t.kernels.items()],
        },
        "probe": series.probe,
        "const": series.const,
        "per_sample": series.per_sample,
    }
    try:
        cache_dir().mkdir(parents=True, exist_ok=True)
        write_atomic(cache_dir() / f"{name}.json", json.dumps(data, separators=(",", ":")))
    except OSError:
        pass
