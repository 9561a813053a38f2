"""results.jsonl: one JSON line per cell per run, appended so that a crash never costs a finished line.

Each record is written with one `write` of the whole line on a file opened in append mode, then
flushed and fsync'ed; a SIGKILL can only ever cut the line being written. A torn last line (no
newline, or not JSON) is ignored on read and cut off before the next append, so it can never glue
itself to the next record.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any

SCHEMA = "ditbench.result/1"


def append_record(path: str | Path, record: dict[str, Any]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(record, separators=(",", ":"), allow_nan=False, default=str) + "\n").encode()
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        _cut_torn_tail(fd)
        written = os.write(fd, line)
        if written != len(line):  # a short write on a regular file means a full disk
            raise OSError(f"could not append the whole record to {path} ({written} of {len(line)} bytes)")
        os.fsync(fd)
    finally:
        os.close(fd)


def _cut_torn_tail(fd: int) -> None:
    """If the file does not end in a newline, drop the partial line a killed writer left."""
    size = os.fstat(fd).st_size
    if size == 0:
        return
    if os.pread(fd, 1, size - 1) == b"\n":
        return
    data = os.pread(fd, size, 0)  # records are small (kilobytes); the whole file is cheap to read
    os.ftruncate(fd, data.rfind(b"\n") + 1)


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """Every complete record in the file, in order; a torn or corrupt line is skipped with a warning."""
    path = Path(path)
    if not path.exists():
        return []
    records = []
    data = path.read_bytes()
    lines = data.split(b"\n")
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if i != len(lines) - 1:  # a bad line in the middle is worth saying; a torn tail is expected
                warnings.warn(f"{path}: line {i + 1} is not valid JSON; skipped", stacklevel=2)
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def latest_by_cell(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The last record of each cell_id (later runs supersede earlier ones)."""
    out: dict[str, dict[str, Any]] = {}
    for record in records:
        if "cell_id" in record:
            out[record["cell_id"]] = record
    return out
