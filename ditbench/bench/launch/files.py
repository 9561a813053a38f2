"""The files between a launcher and its cell processes: the spec it hands them and the results they write."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ConfigDict

from ditbench.files.fileio import read_regular, write_atomic, write_json_atomic
from ditbench.records.jsonl import jsonable
from ditbench.spec.base import SpecModel
from ditbench.spec.cell import CellSpec


class SpecFile(SpecModel):
    """SPEC.json: the cell's spec (its flat JSON, the record's config) and what the process needs to know
    about the cell (cell_id, cell_name, timeout_s, rendezvous, out_dir)."""

    model_config = ConfigDict(extra="allow")
    FLAT = ("knobs",)
    config: CellSpec


def write_spec(path: Path, spec: CellSpec, **about: Any) -> None:
    write_atomic(path, SpecFile(config=spec, **about).model_dump_json())


def read_spec(path: str | Path) -> tuple[CellSpec, dict[str, Any]]:
    """(the cell's spec, validated once from the file's JSON; the rest of the document)."""
    doc = SpecFile.read(read_regular(path), f"spec file {path}", json=True)
    return doc.config, dict(doc.model_extra or {})


def read_report(path: Path) -> dict | None:
    """A rank's or task's report file, or None while it is missing, half-written or not a mapping."""
    try:
        data = json.loads(read_regular(path))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def no_result(reason: str | None, status: str = "error") -> dict[str, Any]:
    """A cell's result without a measurement: its status and why."""
    return {"status": status, "reason": reason, "metrics": None, "smoke": None, "env": None}


def write_result(path: str | Path, data: dict[str, Any]) -> None:
    """A cell's (or rank's) result file, whole or not at all; NaN/inf written as null."""
    write_json_atomic(path, jsonable(data), allow_nan=False)
