"""results.jsonl as its lines were written, and a record's shape for comparing two executors' runs."""

import json
from pathlib import Path


def written(out: Path) -> list[dict]:
    """The records as their JSON lines hold them (the keys a writer wrote, not the model's fields)."""
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines() if line.strip()]


def shape(record: dict, ignore: tuple[str, ...] = ("adopted_by",)) -> tuple:
    """What two runs of one cell share: id, status, the keys written and the metric names."""
    keys = sorted(k for k in record if k not in ignore)
    return record["cell_id"], record["status"], tuple(keys), tuple(sorted(record.get("metrics") or {}))
