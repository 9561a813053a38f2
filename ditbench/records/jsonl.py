"""results.jsonl: one JSON line per cell per run, appended so that a crash never costs a finished line.

Writing: one `write` of the whole line in append mode, then fsync; a last line without its newline is
terminated if it decodes, else cut. Values JSON cannot hold become null, listed under `nonfinite` or
`unserializable`. Reading never raises on content: bad or unfinished lines are skipped with one warning.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ditbench.files.fileio import open_regular, read_regular
from ditbench.records.model import Record, RecordError, check

# A record nests about five levels (quality.evaluations[].per_seed[].fid); anything far deeper is
# garbage, and recursive readers (flattening, formatting) must never meet it.
MAX_DEPTH = 32
MAX_LISTED = 100  # paths named in `nonfinite` / `unserializable` (a NaN loss curve has thousands)
WARN_LINES = 20  # line numbers one warning names
MAX_INT = 10**300  # larger integers are written as null: no reader could use them as numbers
TORN = "torn"  # a last line cut short by a kill


def decode_line(line: bytes | str) -> tuple[Any, str | None]:
    """(value, None) for a line that decodes as JSON, else (None, why). Never raises."""
    try:
        text = line.decode("utf-8") if isinstance(line, bytes) else line
    except UnicodeDecodeError as err:
        return None, f"not UTF-8 text (byte {err.start})"
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        return None, f"not JSON ({err.msg} at column {err.colno})"
    except RecursionError:
        return None, "nested too deeply to read"
    except ValueError as err:  # e.g. an integer of more than 4,300 digits
        return None, f"not readable JSON ({str(err)[:80]})"
    return value, None


def lines(data: bytes | str) -> Iterator[tuple[int, Any, str | None]]:
    """(line number, value, None) for each line that is not blank and decodes as JSON, else (number,
    None, why); a last line that does not (no newline: a writer killed mid-line) says TORN."""
    split = data.split(b"\n" if isinstance(data, bytes) else "\n")
    for index, line in enumerate(split):
        if line.strip():
            value, problem = decode_line(line)
            yield index + 1, value, (TORN if problem and index == len(split) - 1 else problem)


def as_record(value: Any) -> tuple[Record | None, str | None]:
    """(the record, None) for a decoded line that holds one, else (None, why). Never raises."""
    if _depth_exceeds(value, MAX_DEPTH):
        return None, f"nested more than {MAX_DEPTH} levels deep"
    return check(value)


def _depth_exceeds(value: Any, limit: int) -> bool:
    """Whether the nesting of lists and dicts goes deeper than `limit` (iterative: no recursion)."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, dict | list):
            if depth > limit:
                return True
            stack.extend((c, depth + 1) for c in (v.values() if isinstance(v, dict) else v))
    return False


def read_records(path: str | Path) -> list[Record]:
    """Every finished record in the file, in order; other lines are skipped with one warning."""
    path = Path(path)
    try:
        data = read_regular(path)  # a FIFO planted here is refused, never waited on
    except FileNotFoundError:
        return []
    records, skipped = [], []
    for number, value, problem in lines(data):
        if problem == TORN:
            continue  # expected after a kill, and cut on the next append
        record, problem = as_record(value) if problem is None else (None, problem)
        problem = problem or record.unfinished()
        if problem is not None:
            skipped.append((number, problem))
        else:
            records.append(record)
    if skipped:
        warnings.warn(_skipped_message(path, skipped), stacklevel=2)
    return records


def _skipped_message(path: Path, skipped: list[tuple[int, str]]) -> str:
    numbers = ", ".join(str(n) for n, _ in skipped[:WARN_LINES])
    more = f" and {len(skipped) - WARN_LINES} more" if len(skipped) > WARN_LINES else ""
    reasons = "; ".join(f"line {n}: {why}" for n, why in skipped[:3])
    noun = "line" if len(skipped) == 1 else "lines"
    return (
        f"{path}: skipped {len(skipped)} {noun} that are not valid result records ({noun} {numbers}{more}; "
        f"{reasons}). They stay in the file and are read as no record (a run runs their cells again)."
    )


def latest_by_cell(records: list[Record]) -> dict[str, Record]:
    """The last record of each cell_id (later runs supersede earlier ones)."""
    return {record.cell_id: record for record in records}


class _Sanitizer:
    """A JSON-safe copy of a value, noting every path whose value had to become null; `unknown` is what
    an object that is not JSON becomes (None: null, noted)."""

    def __init__(self, unknown: Callable[[Any], Any] | None = None) -> None:
        self.unknown = unknown
        self.nonfinite: list[str] = []
        self.unserializable: dict[str, str] = {}
        self.noted = 0

    def _null(self, path: str, why: str | None = None) -> None:
        """Note that the value at `path` becomes null: not finite (no `why`), or not JSON for `why`."""
        self.noted += 1
        if self.noted <= MAX_LISTED and why is None:
            self.nonfinite.append(path)
        elif self.noted <= MAX_LISTED:
            self.unserializable[path] = why

    def copy(self, value: Any, path: str = "(record)", depth: int = 0) -> Any:
        if value is None or isinstance(value, (str, bool)):
            return value
        if isinstance(value, int):
            if abs(value) < MAX_INT:
                return value
            # json.dumps itself refuses more than 4,300 digits; readers choke sooner
            return self._null(path, "integer too large")
        if isinstance(value, float):
            if math.isfinite(value):
                return value
            return self._null(path)
        if depth >= MAX_DEPTH:
            return self._null(path, "nested too deep")
        if isinstance(value, dict):
            out = {}
            for k, v in value.items():
                key = k if isinstance(k, str) else str(k)
                out[key] = self.copy(v, key if depth == 0 else f"{path}.{key}", depth + 1)
            return out
        if isinstance(value, (list, tuple)):
            return [self.copy(v, f"{path}[{i}]", depth + 1) for i, v in enumerate(value)]
        scalar = _as_scalar(value)
        if scalar is not None:
            return self.copy(scalar, path, depth + 1)
        if self.unknown is not None:
            return self.unknown(value)
        return self._null(path, type(value).__name__)


def _as_scalar(value: Any) -> bool | int | float | None:
    """A numpy scalar, or a numpy / torch array of one element, as a Python number; else None."""
    item = getattr(value, "item", None)
    if not callable(item):
        return None
    try:
        if tuple(value.shape) not in ((), (1,)):
            return None
        scalar = item()
    except Exception:  # no usable shape, or item() wants arguments: not a scalar
        return None
    return scalar if isinstance(scalar, (bool, int, float)) else None


def jsonable(value: Any) -> Any:
    """A JSON-safe copy of a value (NaN/inf as null, numpy scalars as numbers, other objects as text):
    the one rule for what a cell's intermediate files (its result, a rank's report) hold."""
    return _Sanitizer(unknown=str).copy(value)


def json_safe(record: dict[str, Any]) -> dict[str, Any]:
    """The record as it will be written: JSON-safe, with `nonfinite` / `unserializable` when needed."""
    sanitizer = _Sanitizer()
    safe = sanitizer.copy(record)
    if not isinstance(safe, dict):
        safe = {"value": safe}
    if sanitizer.nonfinite:
        safe["nonfinite"] = sanitizer.nonfinite
    if sanitizer.unserializable:
        safe["unserializable"] = sanitizer.unserializable
    if sanitizer.noted > MAX_LISTED:
        more = f"... and {sanitizer.noted - MAX_LISTED:,} more values"
        safe.setdefault("nonfinite", []).append(more)
    return safe


def to_record(raw: dict[str, Any]) -> Record:
    """The record `raw` will be written as (json_safe), validated; RecordError naming the key if none."""
    return _valid(json_safe(raw))


def _valid(safe: dict[str, Any]) -> Record:
    record, problem = as_record(safe)
    if problem is not None:
        raise RecordError(f"not a result record: {problem}")
    return record


def append_record(path: str | Path, raw: dict[str, Any]) -> Record:
    """Append one record as one line, as json_safe makes it, once it is valid; returns it as a model."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    safe = json_safe(raw)
    written = _valid(safe)
    line = (json.dumps(safe, separators=(",", ":"), allow_nan=False) + "\n").encode()
    # the tail repair truncates: a link, a FIFO or a second hard link here is refused (open_regular)
    fd = open_regular(path, os.O_RDWR | os.O_APPEND | os.O_CREAT)
    try:
        _repair_tail(fd)
        size = os.write(fd, line)
        if size != len(line):  # a short write on a regular file means a full disk
            raise OSError(f"could not append the whole record to {path} ({size} of {len(line)} bytes)")
        os.fsync(fd)
    finally:
        os.close(fd)
    return written


def _repair_tail(fd: int) -> None:
    """Make the file end in a newline: terminate a complete last line, cut only a torn one."""
    size = os.fstat(fd).st_size
    if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
        return
    data = os.pread(fd, size, 0)  # records are small (kilobytes); the whole file is cheap to read
    start = data.rfind(b"\n") + 1
    _, problem = decode_line(data[start:])
    if problem is None:
        os.write(fd, b"\n")  # a finished record that lost only its newline: keep it
    else:
        os.ftruncate(fd, start)
