"""Traces kept on disk ($DITBENCH_CACHE/plan, else ~/.cache/ditbench/plan), so a second plan re-traces
nothing, and traces shipped with the package, so the default answer traces nothing at all.

The disk cache's key hashes the trace key, torch's version and every ditbench source file, so edited
code is traced afresh. The shipped traces (benchmarks/plan_traces.py) serve their torch release only.
"""

from __future__ import annotations

import functools
import hashlib
import json
import lzma
from pathlib import Path
from typing import Any

from ditbench.files.pretrained import cache_root
from ditbench.plan.emulation import Target
from ditbench.plan.trace import SeriesTrace, Trace

VERSION = 3  # bump when what a trace records, or how, changes outside the source files
SHIPPED = Path(__file__).with_name("traces.json.xz")


def cache_dir() -> Path:
    return cache_root() / "plan"


@functools.lru_cache(maxsize=1)
def code_fingerprint() -> str:
    import torch

    import ditbench

    h = hashlib.sha256(f"torch {torch.__version__}\n".encode())
    root = Path(ditbench.__file__).resolve().parent
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def key(parts: Any, code: bool = True) -> str:
    text = json.dumps([VERSION, code_fingerprint() if code else None, parts], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def torch_release() -> str:
    import torch

    return ".".join(torch.__version__.split(".")[:2])


def encode(series: SeriesTrace) -> dict[str, Any]:
    """A trace as JSON: an allocation event as 0 (allocations come in order), a release as how many
    allocations back it was made; sizes only (the batch split follows from the probe batch)."""
    t = series.trace
    events, made = [], 0
    for e in t.events:
        if e > 0:
            made += 1
        events.append(0 if e > 0 else made + e + 1)
    labels: dict[str, list[int]] = {}
    for aid, label in sorted(t.labels.items()):
        labels.setdefault(label, []).append(aid)
    return {
        "target": [t.target.device, list(t.target.sm) if t.target.sm else None],
        "probe": series.probe, "sizes": t.sizes, "events": events, "labels": labels, "marks": t.marks,
        "modeled": t.modeled, "notes": t.notes, "params": t.params,
        "kernels": [[*row, count] for row, count in t.kernels.items()],
    }  # fmt: skip


def decode(d: dict[str, Any]) -> SeriesTrace | None:
    try:
        events, made = [], 0
        for e in d["events"]:
            if e == 0:
                made += 1
                events.append(made)
            else:
                events.append(-(made - int(e) + 1))
        trace = Trace(
            target=Target(d["target"][0], tuple(d["target"][1]) if d["target"][1] else None),
            batch_size=int(d["probe"]),
            sizes=[int(x) for x in d["sizes"]],
            events=events,
            labels={int(a): str(label) for label, aids in d["labels"].items() for a in aids},
            marks={str(k): int(v) for k, v in d["marks"].items()},
            modeled={int(k): tuple(v) for k, v in d["modeled"].items()},
            notes=[str(n) for n in d["notes"]],
            params=int(d["params"]),
            kernels={
                (str(r[0]), str(r[1]), bool(r[2]), *(int(x) for x in r[3:7])): int(r[7]) for r in d["kernels"]
            },
        )
        return SeriesTrace.of(trace) if made == len(trace.sizes) else None
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        return None


def load(name: str) -> SeriesTrace | None:
    from ditbench.files.fileio import read_regular  # a FIFO planted as the entry is refused, not waited on

    try:
        return decode(json.loads(read_regular(cache_dir() / f"{name}.json", "the plan cache")))
    except (OSError, ValueError):
        return None


def save(name: str, series: SeriesTrace) -> None:
    from ditbench.files.fileio import write_atomic

    try:
        cache_dir().mkdir(parents=True, exist_ok=True)
        write_atomic(cache_dir() / f"{name}.json", json.dumps(encode(series), separators=(",", ":")))
    except OSError:
        pass


@functools.lru_cache(maxsize=1)
def _shipped() -> dict[str, Any]:
    try:
        return json.loads(lzma.decompress(SHIPPED.read_bytes()))
    except (OSError, ValueError, lzma.LZMAError):
        return {}


def shipped_release() -> str | None:
    """The torch release the shipped traces were made with."""
    return _shipped().get("torch")


def shipped(parts: Any) -> SeriesTrace | None:
    """The shipped trace for a trace key (predict.trace_key), if one was shipped for this torch."""
    if shipped_release() != torch_release():
        return None
    found = _shipped()["traces"].get(key(parts, code=False))
    return None if found is None else decode(found)


def write_shipped(traces: dict[str, SeriesTrace], path: Path = SHIPPED) -> None:
    """Write the shipped traces: {key(parts, code=False): trace} for this torch release."""
    data = {"torch": torch_release(), "traces": {k: encode(s) for k, s in sorted(traces.items())}}
    path.write_bytes(lzma.compress(json.dumps(data, separators=(",", ":")).encode(), preset=9))
