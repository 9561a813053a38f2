"""The files between a launcher and its cell processes: the spec it hands them and the results they write."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ditbench.bench.records import jsonable
from ditbench.cellspec import CellSpec
from ditbench.fileio import read_regular, write_json_atomic


def write_spec(path: Path, spec: CellSpec, **about: Any) -> None:
    """SPEC.json: the record config plus what the process needs to know about the cell (id, name, ...)."""
    write_json_atomic(path, {"config": spec.record_config(), **about})


def read_spec(path: str | Path) -> tuple[CellSpec, dict[str, Any]]:
    """(the cell's spec, the whole document: cell_id, cell_name, timeout_s, rendezvous)."""
    doc = json.loads(read_regular(path))
    return CellSpec.from_record_config(doc["config"]), doc


def read_report(path: Path) -> dict | None:
    """A rank's or task's report file, or None while it is missing, half-written or not a mapping."""
    try:
        data = json.loads(read_regular(path))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_result(path: str | Path, data: dict[str, Any]) -> None:
    """A cell's (or rank's) result file, whole or not at all; NaN/inf written as null."""
    write_json_atomic(path, jsonable(data), allow_nan=False)
