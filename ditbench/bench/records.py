"""results.jsonl: one JSON line per cell per run, appended so that a crash never costs a finished line.

Writing. Each record is written with one `write` of the whole line on a file opened in append
mode, then flushed and fsync'ed; a SIGKILL can only ever cut the line being written. Before an
append, a last line without its newline is repaired: if it decodes as JSON it is a complete record
and gets its newline; only a tail that does not decode (a writer killed mid-line) is cut, so it
cannot glue itself to the next record. The writer never raises on a value a cell produced: NaN and
infinities become null and are listed under `nonfinite`, objects JSON cannot hold become null and
are listed under `unserializable`, numpy and torch scalars become plain numbers.

Reading. `read_records` never raises on content: a line that does not decode (binary, not JSON,
nested too deep, absurd numbers) or is not a valid record (`record_problem`) is skipped, and one
warning names every skipped line. Skipped lines stay in the file.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ditbench.bench.repeats import REPEATS_MAX
from ditbench.errors import shorten
from ditbench.fileio import open_regular, read_regular

SCHEMA = "ditbench.result/1"
SCHEMA_PREFIX = "ditbench.result/"
STATUSES = ("ok", "oom", "timeout", "nan_loss", "error", "skipped", "unsupported")
# A record nests about five levels (quality.evaluations[].per_seed[].fid); anything far deeper is
# garbage, and recursive readers (flattening, formatting) must never meet it.
MAX_DEPTH = 32
MAX_LISTED = 100  # paths named in `nonfinite` / `unserializable` (a NaN loss curve has thousands)
WARN_LINES = 20  # line numbers one warning names
MAX_INT = 10**300  # larger integers are written as null: no reader could use them as numbers


# ------------------------------------------------------------------------------------------ reading


def decode_line(line: bytes | str) -> tuple[Any, str | None]:
    """(value, None) for a line that decodes as JSON, else (None, why). Never raises."""
    try:
        text = line.decode("utf-8") if isinstance(line, bytes) else line
    except UnicodeDecodeError as err:
        return None, f"not UTF-8 text (byte {err.start})"
    try:
        return json.loads(text), None
    except json.JSONDecodeError as err:
        return None, f"not JSON ({err.msg} at column {err.colno})"
    except RecursionError:
        return None, "nested too deeply to read"
    except ValueError as err:  # e.g. an integer of more than 4,300 digits
        return None, f"not readable JSON ({str(err)[:80]})"


def _depth_exceeds(value: Any, limit: int) -> bool:
    """Whether the nesting of lists and dicts goes deeper than `limit` (iterative: no recursion)."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, dict):
            children = v.values()
        elif isinstance(v, list):
            children = v
        else:
            continue
        if depth > limit:
            return True
        stack.extend((c, depth + 1) for c in children)
    return False


def _finite_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def shape_problem(record: Any) -> str | None:
    """Why `record` does not have the shape every reader relies on, or None.

    schema "ditbench.result/..." (str); cell_id a non-empty str; cell_name a str; status one of
    STATUSES; config a dict; reason str or null; metrics, smoke, env, quality dicts or null; smoke
    window means numbers or null; nesting at most MAX_DEPTH.
    """
    if not isinstance(record, dict):
        return f"a JSON {type(record).__name__}, not a result record (a JSON object)"
    if _depth_exceeds(record, MAX_DEPTH):
        return f"nested more than {MAX_DEPTH} levels deep"
    schema = record.get("schema")
    if not isinstance(schema, str) or not schema.startswith(SCHEMA_PREFIX):
        return f'"schema" is not "{SCHEMA}"'
    cell_id = record.get("cell_id")
    if not isinstance(cell_id, str) or not cell_id:
        return '"cell_id" is missing or not a string'
    if not isinstance(record.get("cell_name"), str):
        return '"cell_name" is missing or not a string'
    status = record.get("status")
    if not isinstance(status, str) or status not in STATUSES:
        return f'"status" is {shorten(status)}, not one of {", ".join(STATUSES)}'
    if not isinstance(record.get("config"), dict):
        return '"config" is missing or not an object'
    if not isinstance(record.get("reason"), (str, type(None))):
        return '"reason" is not a string or null'
    for section in ("metrics", "smoke", "env", "quality"):
        if not isinstance(record.get(section), (dict, type(None))):
            return f'"{section}" is not an object or null'
    if (repeats := _repeats_problem(record)) is not None:
        return repeats
    smoke = record.get("smoke") or {}
    for key in ("first_mean", "last_mean"):
        if smoke.get(key) is not None and not _finite_number(smoke[key]):
            return f'"smoke.{key}" is not a finite number or null'
    return None


def _repeats_problem(record: dict[str, Any]) -> str | None:
    """`repeat` and `repeats` (a run with repeats writes both): whole numbers, 1 <= repeat <= repeats."""
    if "repeat" not in record and "repeats" not in record:
        return None
    repeat, repeats = record.get("repeat"), record.get("repeats")
    whole = all(
        isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= REPEATS_MAX for v in (repeat, repeats)
    )
    if not whole or repeat > repeats:
        return (
            f'"repeat" {shorten(repeat)} of "repeats" {shorten(repeats)} is not a repeat index from 1 to '
            f"repeats (at most {REPEATS_MAX})"
        )
    return None


def record_problem(record: Any) -> str | None:
    """Why `record` is not a valid result record, or None: its shape (shape_problem), and for an ok
    record its measurement (metrics.images_per_s and metrics.step_ms.median finite numbers, p10/p90
    numbers or null). A record that fails here is not a finished cell: a resumed run runs it again.
    """
    problem = shape_problem(record)
    if problem is None and record["status"] == "ok":
        problem = _measurement_problem(record.get("metrics"))
    return problem


def _measurement_problem(metrics: dict[str, Any] | None) -> str | None:
    """What an ok record must have measured, or None."""
    if metrics is None:
        return 'status "ok" without metrics'
    if not _finite_number(metrics.get("images_per_s")):
        return 'status "ok" but "metrics.images_per_s" is not a finite number'
    step = metrics.get("step_ms")
    if not isinstance(step, dict) or not _finite_number(step.get("median")):
        return 'status "ok" but "metrics.step_ms.median" is not a finite number'
    for key in ("p10", "p90"):
        if step.get(key) is not None and not _finite_number(step[key]):
            return f'"metrics.step_ms.{key}" is not a finite number or null'
    return None


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """Every valid record in the file, in order; other lines are skipped with one warning."""
    path = Path(path)
    try:
        data = read_regular(path)  # a FIFO planted here is refused, never waited on
    except FileNotFoundError:
        return []
    lines = data.split(b"\n")
    records, skipped = [], []
    for index, line in enumerate(lines):
        if not line.strip():
            continue
        record, problem = decode_line(line)
        if problem is not None and index == len(lines) - 1:
            continue  # a torn tail (a writer killed mid-line): expected, and cut on the next append
        if problem is None:
            problem = record_problem(record)
        if problem is not None:
            skipped.append((index + 1, problem))
            continue
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
        f"{reasons}). They stay in the file; their cells count as not yet run."
    )


def latest_by_cell(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The last record of each cell_id (later runs supersede earlier ones)."""
    out: dict[str, dict[str, Any]] = {}
    for record in records:
        if isinstance(record, dict) and isinstance(record.get("cell_id"), str):
            out[record["cell_id"]] = record
    return out


# ------------------------------------------------------------------------------------------ writing


class _Sanitizer:
    """A JSON-safe copy of a value, noting every path whose value had to become null.

    `unknown`: what an object that is not JSON (nor a numpy/torch scalar) becomes; None: null, noted.
    """

    def __init__(self, unknown: Callable[[Any], Any] | None = None) -> None:
        self.unknown = unknown
        self.nonfinite: list[str] = []
        self.unserializable: dict[str, str] = {}
        self.noted = 0

    def _room(self) -> bool:
        self.noted += 1
        return self.noted <= MAX_LISTED

    def copy(self, value: Any, path: str = "(record)", depth: int = 0) -> Any:
        if value is None or isinstance(value, (str, bool)):
            return value
        if isinstance(value, int):
            if abs(value) < MAX_INT:
                return value
            if self._room():  # json.dumps itself refuses more than 4,300 digits; readers choke sooner
                self.unserializable[path] = "integer too large"
            return None
        if isinstance(value, float):
            if math.isfinite(value):
                return value
            if self._room():
                self.nonfinite.append(path)
            return None
        if depth >= MAX_DEPTH:
            if self._room():
                self.unserializable[path] = "nested too deep"
            return None
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
        if self._room():
            self.unserializable[path] = type(value).__name__
        return None


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


def append_record(path: str | Path, record: dict[str, Any]) -> dict[str, Any]:
    """Append one record as one line; returns the record as written (see json_safe)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    safe = json_safe(record)
    line = (json.dumps(safe, separators=(",", ":"), allow_nan=False) + "\n").encode()
    # the tail repair truncates: a link, a FIFO or a second hard link here is refused (open_regular)
    fd = open_regular(path, os.O_RDWR | os.O_APPEND | os.O_CREAT)
    try:
        _repair_tail(fd)
        written = os.write(fd, line)
        if written != len(line):  # a short write on a regular file means a full disk
            raise OSError(f"could not append the whole record to {path} ({written} of {len(line)} bytes)")
        os.fsync(fd)
    finally:
        os.close(fd)
    return safe


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
